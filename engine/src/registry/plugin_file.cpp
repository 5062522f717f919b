// Plugin candidate files checked before dlopen (plugin_file.hpp says why).
#include "registry/plugin_file.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "qrecipe/error.hpp"

namespace qrecipe::registry_internal {
namespace {

#if defined(__x86_64__)
constexpr int kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kHostMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr int kHostMachine = EM_PPC64;
#else
constexpr int kHostMachine = -1;  // unknown: the machine is not compared
#endif

constexpr const char* kRemove = "; remove it from the plugin path";

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly `size` bytes at `offset`; false on a short read or an error.
bool read_at(int fd, void* out, std::size_t size, std::uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t got = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    size -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
  return true;
}

std::string bytes_str(std::uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// The ELF checks on an open regular file of `size` bytes.
std::string elf_problem(int fd, std::uint64_t size) {
  Elf64_Ehdr eh{};
  const std::size_t head = size < sizeof eh ? static_cast<std::size_t>(size) : sizeof eh;
  if (!read_at(fd, &eh, head, 0)) return std::string("cannot read its ELF header") + kRemove;
  if (std::memcmp(eh.e_ident, ELFMAG, head < SELFMAG ? head : SELFMAG) != 0)
    return std::string("not an ELF file (no ELF magic number at its start), so not a shared "
                       "library") + kRemove;
  if (size < sizeof(Elf64_Ehdr))
    return "too short for a shared library: the file has " + bytes_str(size) +
           ", an ELF header alone is " + bytes_str(sizeof(Elf64_Ehdr)) +
           " (a truncated copy?)" + kRemove;
  if (eh.e_ident[EI_CLASS] != ELFCLASS64)
    return std::string("a ") + (eh.e_ident[EI_CLASS] == ELFCLASS32 ? "32-bit" : "unknown-class") +
           " ELF file; this process is 64-bit: built for another machine" + kRemove;
  const bool little = eh.e_ident[EI_DATA] == ELFDATA2LSB;
  if (little != (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__))
    return std::string("an ELF file of the other byte order: built for another machine") + kRemove;
  if (eh.e_type != ET_DYN)
    return "an ELF file of type " + std::to_string(eh.e_type) +
           ", not a shared library (type 3, ET_DYN)" + kRemove;
  if (kHostMachine >= 0 && eh.e_machine != kHostMachine)
    return "an ELF file for machine " + std::to_string(eh.e_machine) + " but this process runs "
           "on machine " + std::to_string(kHostMachine) + ": built for another machine" + kRemove;
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum == PN_XNUM)
    return "corrupt ELF header: " + std::to_string(eh.e_phnum) + " program headers of " +
           bytes_str(eh.e_phentsize) + " each (expected 1 to " + std::to_string(PN_XNUM - 1) +
           " of " + bytes_str(sizeof(Elf64_Phdr)) + ")" + kRemove;
  const std::uint64_t table = static_cast<std::uint64_t>(eh.e_phnum) * sizeof(Elf64_Phdr);
  std::uint64_t table_end = 0;
  if (__builtin_add_overflow(eh.e_phoff, table, &table_end) || table_end > size)
    return "truncated or corrupt: its program headers end at byte " +
           std::to_string(eh.e_phoff) + " + " + std::to_string(table) + " but the file has " +
           bytes_str(size) + kRemove;
  std::vector<Elf64_Phdr> headers(eh.e_phnum);
  if (!read_at(fd, headers.data(), table, eh.e_phoff))
    return std::string("cannot read its program headers") + kRemove;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    const Elf64_Phdr& ph = headers[i];
    // Loadable segments are mapped from the file (past its end: SIGBUS on first touch); the
    // dynamic section and the interpreter name are read from it.
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC && ph.p_type != PT_INTERP) continue;
    std::uint64_t end = 0;
    if (__builtin_add_overflow(ph.p_offset, ph.p_filesz, &end) || end > size)
      return "truncated: segment " + std::to_string(i) + " (" +
             (ph.p_type == PT_LOAD ? "PT_LOAD" : ph.p_type == PT_DYNAMIC ? "PT_DYNAMIC"
                                                                         : "PT_INTERP") +
             ") ends at byte " + std::to_string(ph.p_offset) + " + " +
             std::to_string(ph.p_filesz) + " but the file has " + bytes_str(size) +
             " (an interrupted copy?)" + kRemove;
  }
  return "";
}

}  // namespace

const char* file_type_name(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

std::string plugin_file_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return std::string("cannot stat it: ") + std::strerror(err);
  }
  // Decided from stat, before any open: opening a FIFO for reading blocks until a writer comes.
  if (!S_ISREG(st.st_mode))
    return std::string("not a regular file (") + file_type_name(st.st_mode) + ")" + kRemove;
  // O_NONBLOCK: should the path have become a FIFO since the stat, open still returns at once.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    return std::string("cannot open it: ") + std::strerror(err) +
           "; fix its permissions or remove it from the plugin path";
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return std::string("not a regular file (") + file_type_name(st.st_mode) + ")" + kRemove;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) return std::string("empty file (0 bytes): not a shared library") + kRemove;
  return elf_problem(fd.get(), size);
}

}  // namespace qrecipe::registry_internal
