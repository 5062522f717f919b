// Registry: every load failure of docs/plugins.md ("How plugins are found") is reported clearly,
// names the file and the cause, and leaves the other plugins usable. Uses the plugins built on
// purpose in tests/broken_plugins (one directory per case).
#include <doctest/doctest.h>

#include <elf.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

std::string broken_dir(const std::string& case_name) {
  const char* root = std::getenv("QRECIPE_BROKEN_PLUGIN_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_BROKEN_PLUGIN_DIR is not set (run through ctest)");
  return std::string(root) + "/" + case_name;
}

// A registry that sees only the given paths.
RegistryOptions only(std::vector<std::string> paths) {
  RegistryOptions o;
  o.paths = std::move(paths);
  o.use_env = false;
  o.use_install_dir = false;
  o.use_library_dir = false;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Loads `good` plus one broken case; the good plugin must still load.
const LoadFailure& single_failure(Registry& r) {
  REQUIRE(r.failures().size() == 1);
  CHECK(r.find("toy") != nullptr);
  return r.failures()[0];
}

}  // namespace

TEST_CASE("a valid plugin loads and describes itself") {
  Registry r(only({broken_dir("good")}));
  REQUIRE(r.failures().empty());
  const FormatPlugin& toy = r.get("toy");
  CHECK(toy.version() == "1.0.0");
  CHECK(toy.supports(Device::cpu()));
  CHECK_FALSE(toy.supports(Device::cuda()));
  REQUIRE(toy.options().size() == 1);
  CHECK(toy.options()[0].key == "flag");
  CHECK(toy.options()[0].type == QR_OPTION_BOOL);
  CHECK(r.loaded_names() == "toy");
}

TEST_CASE("each broken plugin gives a clear failure and the others stay usable") {
  struct Case {
    const char* dir;
    const char* file;
    const char* expected;  // part of the cause
  };
  const Case cases[] = {
      {"not_a_library", "libqrecipe_garbage.so", "not a shared library"},
      {"no_abi_symbol", "libqrecipe_noabi.so", "missing symbol 'qrecipe_plugin_abi'"},
      {"no_entry_symbol", "libqrecipe_noentry.so", "missing symbol 'qrecipe_plugin_entry'"},
      {"wrong_abi", "libqrecipe_wrongabi.so", "plugin ABI version 999 but this qrecipe reads ABI version 1"},
      {"entry_returns_null", "libqrecipe_refuses.so", "returned no descriptor"},
      {"descriptor_abi", "libqrecipe_badversion.so", "descriptor ABI version 7"},
      {"small_descriptor", "libqrecipe_small.so", "struct_size 16"},
      {"missing_slot", "libqrecipe_noslot.so", "leaves a required function slot empty"},
      {"bad_numerator", "libqrecipe_badnumerator.so",
       "declares tensor_scale_numerator -2688 in its descriptor; expected 0 (no per-tensor "
       "decode factor) or a finite positive number"},
      {"missing_dependency", "libqrecipe_needsdep.so", "libqrecipe_test_missing_dep.so"},
  };
  for (const auto& c : cases) {
    const std::string dir = c.dir;
    CAPTURE(dir);
    Registry r(only({broken_dir(c.dir), broken_dir("good")}));
    const LoadFailure& f = single_failure(r);
    CHECK(contains(f.path, c.file));
    CHECK_MESSAGE(contains(f.cause, c.expected), f.cause);
  }
}

TEST_CASE("a plugin built before the fields appended after v1 still loads, without them") {
  Registry r(only({broken_dir("v1_descriptor")}));
  REQUIRE(r.failures().empty());
  const FormatPlugin& old = r.get("oldtoy");
  // Its descriptor ends before tensor_scale_numerator: no per-tensor decode factor, whatever
  // the bytes after it hold.
  CHECK(old.tensor_scale_numerator() == 0.0f);
  CHECK(old.c().struct_size == QR_PLUGIN_DESCRIPTOR_SIZE_V1);
  // And a current plugin without the factor says 0 itself.
  Registry good(only({broken_dir("good")}));
  CHECK(good.get("toy").c().struct_size == sizeof(qr_plugin_descriptor));
  CHECK(good.get("toy").tensor_scale_numerator() == 0.0f);
}

TEST_CASE("a missing dependency is named as such") {
  Registry r(only({broken_dir("missing_dependency")}));
  REQUIRE(r.failures().size() == 1);
  CHECK(contains(r.failures()[0].cause, "a library it depends on could not be loaded"));
}

TEST_CASE("a missing path is reported, not fatal") {
  Registry r(only({"/nonexistent/qrecipe/plugins", broken_dir("good")}));
  const LoadFailure& f = single_failure(r);
  CHECK(f.path == "/nonexistent/qrecipe/plugins");
  CHECK(contains(f.cause, "no such file or directory"));
  // An explicit file that does not exist.
  CHECK(r.load_file("/nonexistent/libqrecipe_x.so") == nullptr);
  CHECK(contains(r.failures().back().cause, "no such file"));
}

TEST_CASE("the same format found twice: first in search order wins, the other is reported") {
  Registry r(only({broken_dir("good"), broken_dir("duplicate")}));
  CHECK(r.failures().empty());
  REQUIRE(r.duplicates().size() == 1);
  const DuplicateFormat& d = r.duplicates()[0];
  CHECK(d.format == "toy");
  CHECK(contains(d.used_path, "/good/"));
  CHECK(contains(d.ignored_path, "/duplicate/"));
  CHECK(contains(r.get("toy").path(), "/good/"));
  CHECK(r.plugins().size() == 1);
}

TEST_CASE("two different files claiming one format name is an error naming both") {
  Registry r(only({broken_dir("good"), broken_dir("renamed")}));
  REQUIRE(r.failures().size() == 1);
  CHECK(contains(r.failures()[0].path, "libqrecipe_toy_copy.so"));
  CHECK(contains(r.failures()[0].cause, "already provided by"));
  CHECK(contains(r.failures()[0].cause, "libqrecipe_toy.so"));
}

TEST_CASE("the same directory twice loads each plugin once") {
  Registry r(only({broken_dir("good"), broken_dir("good")}));
  CHECK(r.failures().empty());
  CHECK(r.duplicates().empty());
  CHECK(r.plugins().size() == 1);
}

TEST_CASE("unknown format lists the loaded ones and the failures") {
  Registry r(only({broken_dir("good"), broken_dir("wrong_abi")}));
  try {
    r.get("nope");
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(contains(msg, "unknown format 'nope'"));
    CHECK(contains(msg, "loaded formats: toy"));
    CHECK(contains(msg, "libqrecipe_wrongabi.so"));
    CHECK(contains(msg, "qrecipe plugins -v"));
  }
}

TEST_CASE("a throwing factory is an error when the quantizer is made; the engine survives") {
  auto r = std::make_shared<Registry>(only({broken_dir("throwing_factory")}));
  REQUIRE(r->failures().empty());
  QuantizerSpec spec;
  spec.format = "toy";
  // Validating a recipe makes its quantizers once (recipe check), so the factory's error
  // comes when the engine is built, before any use.
  try {
    Engine refused(Recipe::uniform(spec), r);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "toy factory failed on purpose"));
    CHECK(contains(e.what(), "creating a 'toy' quantizer"));
  }
  // A spec made in code after the engine exists: the error names the role; the engine still
  // answers (and still refuses) without crashing.
  Engine engine(Recipe::uniform(QuantizerSpec{}), r);
  const QuantizerRole role{"linear", "input", "x"};
  try {
    engine.make_quantizer(spec, role);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "toy factory failed on purpose"));
    CHECK(contains(e.what(), "creating a 'toy' quantizer"));
    CHECK(contains(e.what(), "linear:input@x"));
  }
  CHECK_THROWS_AS(engine.make_quantizer(spec, role), Error);
  CHECK(engine.resolve(role) == nullptr);  // the recipe's own roles still resolve
}

TEST_CASE("search path order: api, QRECIPE_PLUGIN_PATH, install dir, engine library dir") {
  setenv("QRECIPE_PLUGIN_PATH", (broken_dir("duplicate") + ":" + broken_dir("nothing_here")).c_str(), 1);
  RegistryOptions o;
  o.paths = {broken_dir("good")};
  Registry r(o);
  const auto& sp = r.search_path();
  REQUIRE(sp.size() >= 3);
  CHECK(sp[0].origin == "api");
  CHECK(sp[1].origin == "QRECIPE_PLUGIN_PATH");
  CHECK(sp[2].origin == "QRECIPE_PLUGIN_PATH");
  CHECK(sp.back().origin == "engine library dir");
  // api first: the good directory's toy wins over the env's duplicate.
  CHECK(contains(r.get("toy").path(), "/good/"));
  REQUIRE(r.duplicates().size() == 1);
  unsetenv("QRECIPE_PLUGIN_PATH");
}

TEST_CASE("quantize through a loaded plugin, and device checks happen before the plugin") {
  auto r = std::make_shared<Registry>(only({broken_dir("good")}));
  QuantizerSpec spec;
  spec.format = "toy";
  Engine engine(Recipe::uniform(spec), r);
  auto q = engine.resolve({"linear", "weight", "w"});
  REQUIRE(q != nullptr);
  CHECK(engine.resolve({"linear", "weight", "w"}) == q);  // cached per role
  float data[6] = {1, 2, 3, 4, 5, 6};
  const TensorView x(data, DType::f32, {2, 3});
  const QuantizedTensor t = q->quantize(x, QR_USAGE_ROWWISE);
  CHECK(t.rows() == 2);
  CHECK(t.cols() == 3);
  const Tensor back = q->dequantize(t, QR_DIRECTION_ROWWISE);
  for (int i = 0; i < 6; ++i) CHECK(back.data_as<float>()[i] == data[i]);
  // A CUDA view is refused by the engine (the toy plugin is CPU only): no silent fallback.
  const TensorView on_gpu(data, DType::f32, {2, 3}, Device::cuda(0));
  try {
    q->quantize(on_gpu, QR_USAGE_ROWWISE);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(contains(e.what(), "supports cpu only"));
  }
  // Wrong source dtype.
  std::uint8_t bytes[6] = {};
  CHECK_THROWS_WITH_AS(q->quantize(TensorView(bytes, DType::u8, {2, 3}), QR_USAGE_ROWWISE),
                       doctest::Contains("source dtype must be f32, bf16 or f16, got u8"), Error);
  // A plugin error comes back as an Error with the plugin's message and the context.
  std::uint16_t halfs[6] = {};
  CHECK_THROWS_WITH_AS(q->quantize(TensorView(halfs, DType::bf16, {2, 3}), QR_USAGE_ROWWISE),
                       doctest::Contains("toy takes contiguous f32"), Error);
}

// ---------------------------------------------------------------- hostile files (issue 19)
// Files a user (or an attacker) can put on the plugin path. Each one is a listed load failure
// with a clear reason; none may crash the process, block it or take the good plugin down.

namespace {

// A fresh directory under $TMPDIR, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "qrecipe_test_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string good_plugin_file() { return broken_dir("good") + "/libqrecipe_toy.so"; }

std::string read_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string bytes;
  char buffer[1 << 14];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.append(buffer, got);
  std::fclose(f);
  return bytes;
}

void write_bytes(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

// Where the file bytes of the loadable segments end (the part dlopen maps).
std::size_t end_of_load_segments(const std::string& elf) {
  REQUIRE(elf.size() >= sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  std::memcpy(&eh, elf.data(), sizeof eh);
  std::size_t end = 0;
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, elf.data() + eh.e_phoff + static_cast<std::size_t>(i) * eh.e_phentsize,
                sizeof ph);
    if (ph.p_type == PT_LOAD) end = std::max<std::size_t>(end, ph.p_offset + ph.p_filesz);
  }
  return end;
}

// Round, square and curly brackets open and close in order.
bool balanced_brackets(const std::string& s) {
  std::string open;
  for (char c : s) {
    if (c == '(' || c == '[' || c == '{') open += c;
    if (c == ')' || c == ']' || c == '}') {
      const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (open.empty() || open.back() != want) return false;
      open.pop_back();
    }
  }
  return open.empty();
}

// The registry over `dir` plus the good plugin: exactly one failure, for `file`, whose cause
// holds `expected`; the toy format still loads. Returns the cause.
std::string only_failure(const std::string& dir, const std::string& file,
                         const std::string& expected) {
  Registry r(only({dir, broken_dir("good")}));
  REQUIRE(r.failures().size() == 1);
  CHECK(r.find("toy") != nullptr);
  const LoadFailure& f = r.failures()[0];
  CHECK(contains(f.path, file));
  CHECK_MESSAGE(contains(f.cause, expected), f.cause);
  CHECK_MESSAGE(balanced_brackets(f.cause), f.cause);
  CHECK_MESSAGE(!contains(f.cause, "Bad file descriptor"), f.cause);
  return f.cause;
}

}  // namespace

TEST_CASE("a truncated plugin is a listed load failure, never a bus error") {
  const std::string elf = read_bytes(good_plugin_file());
  const std::size_t load_end = end_of_load_segments(elf);
  REQUIRE(load_end > 8192);
  const std::size_t cuts[] = {1, 16, 63, 64, 1024, 4096, load_end / 2, load_end - 1};
  for (const std::size_t cut : cuts) {
    CAPTURE(cut);
    TempDir dir;
    write_bytes(dir.file("libqrecipe_x.so"), std::string_view(elf).substr(0, cut));
    const std::string cause = only_failure(dir.str(), "libqrecipe_x.so", "");
    CHECK_MESSAGE((contains(cause, "truncated") || contains(cause, "too short")), cause);
    CHECK_MESSAGE(contains(cause, "the file has " + std::to_string(cut) + " byte"), cause);
  }
}

TEST_CASE("an empty file is refused as such, without a misleading errno") {
  TempDir dir;
  write_bytes(dir.file("libqrecipe_empty.so"), "");
  only_failure(dir.str(), "libqrecipe_empty.so", "empty file");
}

TEST_CASE("a FIFO, a device or a directory named like a plugin is refused without opening it") {
  TempDir dir;
  REQUIRE(mkfifo(dir.file("libqrecipe_fifo.so").c_str(), 0600) == 0);
  // Blocking here (a FIFO opened for reading waits for a writer) would hang every command.
  only_failure(dir.str(), "libqrecipe_fifo.so", "not a regular file (a FIFO)");
  // The same FIFO given as an explicit file path.
  only_failure(dir.file("libqrecipe_fifo.so"), "libqrecipe_fifo.so", "not a regular file (a FIFO)");
  TempDir dev;
  std::filesystem::create_symlink("/dev/zero", dev.file("libqrecipe_zero.so"));
  only_failure(dev.str(), "libqrecipe_zero.so", "not a regular file (a character device)");
  TempDir sub;
  std::filesystem::create_directory(sub.file("libqrecipe_dir.so"));
  only_failure(sub.str(), "libqrecipe_dir.so", "not a regular file (a directory)");
}

TEST_CASE("a file that is not ELF, or ELF for another machine, is refused before dlopen") {
  TempDir dir;
  std::string elf = read_bytes(good_plugin_file());
  std::string other = elf;
  other[18] = 0x28;  // e_machine = EM_ARM (little-endian 16-bit at offset 18)
  other[19] = 0;
  write_bytes(dir.file("libqrecipe_arm.so"), other);
  only_failure(dir.str(), "libqrecipe_arm.so", "built for another machine");
  TempDir text;
  write_bytes(text.file("libqrecipe_text.so"), std::string(200, 'x'));
  only_failure(text.str(), "libqrecipe_text.so", "not an ELF file");
  // Program headers pointing past the end of the file.
  TempDir phdr;
  std::string bad = elf;
  Elf64_Ehdr eh;
  std::memcpy(&eh, bad.data(), sizeof eh);
  eh.e_phoff = bad.size() - 8;
  std::memcpy(bad.data(), &eh, sizeof eh);
  write_bytes(phdr.file("libqrecipe_phdr.so"), bad);
  only_failure(phdr.str(), "libqrecipe_phdr.so", "program headers");
}

TEST_CASE("load messages have balanced brackets and no stray errno") {
  const char* cases[] = {"not_a_library", "no_abi_symbol", "missing_dependency", "wrong_abi"};
  for (const char* c : cases) {
    const std::string name = c;
    CAPTURE(name);
    Registry r(only({broken_dir(c)}));
    REQUIRE(r.failures().size() == 1);
    const std::string& cause = r.failures()[0].cause;
    CHECK_MESSAGE(balanced_brackets(cause), cause);
    CHECK_MESSAGE(!contains(cause, "): "), cause);  // Boost.DLL's errno suffix
  }
}

TEST_CASE("a malformed option table is a load failure naming the entry, never a crash") {
  struct Case {
    const char* dir;
    const char* expected;
  };
  const Case cases[] = {
      {"enum_null_choices", "option 0 ('mode'): enum with 3 choices but a NULL choices array"},
      {"enum_null_choice", "option 0 ('mode'): choice 1 is NULL or empty"},
      {"enum_no_choices", "option 0 ('mode'): enum with no choices"},
      {"enum_choice_twice", "option 0 ('mode'): choice 'a' is listed twice"},
      {"option_type_99", "option 0 ('odd'): type 99 is not an option type"},
      {"duplicate_option_keys", "option 1 ('flag'): key 'flag' is already used by option 0"},
      {"min_above_max", "option 0 ('count'): min_value 8 > max_value 2"},
      {"nan_bound", "option 0 ('ratio'): bounds [0, nan] are not finite numbers"},
      {"null_option_key", "option 0: NULL or empty key"},
      {"format_option_key", "option 0 ('format'): 'format' is the spec's own key"},
      {"null_options", "declares 2 options but no option table"},
      {"huge_option_count", "declares 4294967295 options"},
  };
  for (const auto& c : cases) {
    const std::string dir = c.dir;
    CAPTURE(dir);
    Registry r(only({broken_dir(c.dir), broken_dir("good")}));
    const LoadFailure& f = single_failure(r);
    CHECK_MESSAGE(contains(f.cause, c.expected), f.cause);
    CHECK_MESSAGE(contains(f.cause, "option table"), f.cause);
  }
}

TEST_CASE("a plugin named 'none' is refused: recipes use none for high precision") {
  Registry r(only({broken_dir("named_none"), broken_dir("good")}));
  const LoadFailure& f = single_failure(r);
  CHECK_MESSAGE(contains(f.cause, "format name 'none' is reserved"), f.cause);
  CHECK(r.find("none") == nullptr);
}

// Root reads every directory, so the unreadable cases run in a child that drops to `nobody`.
TEST_CASE("an unreadable plugin directory or file is listed, not skipped") {
  TempDir top;  // 0700, owned by us: nobody cannot enter it
  std::filesystem::permissions(top.path, std::filesystem::perms::owner_all |
                                             std::filesystem::perms::others_exec);
  const std::string closed = top.file("closed");
  std::filesystem::create_directory(closed);
  std::filesystem::copy_file(good_plugin_file(), closed + "/libqrecipe_toy.so");
  std::filesystem::permissions(closed, std::filesystem::perms::none);
  const std::string open_dir = top.file("open");
  std::filesystem::create_directory(open_dir);
  std::filesystem::copy_file(good_plugin_file(), open_dir + "/libqrecipe_secret.so");
  std::filesystem::permissions(open_dir, std::filesystem::perms::all);
  std::filesystem::permissions(open_dir + "/libqrecipe_secret.so", std::filesystem::perms::none);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // In the child: no doctest macros (they would report into the parent's copy of the run).
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(90);
    Registry r(only({closed, open_dir}));
    int code = 0;
    if (r.failures().size() != 2) code = 91;
    else if (!contains(r.failures()[0].path, "closed") ||
             !contains(r.failures()[0].cause, "cannot read the directory")) code = 92;
    else if (!contains(r.failures()[1].path, "libqrecipe_secret.so") ||
             !contains(r.failures()[1].cause, "cannot open")) code = 93;
    if (code != 0)
      for (const auto& f : r.failures()) std::fprintf(stderr, "  %s: %s\n", f.path.c_str(), f.cause.c_str());
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK_MESSAGE(WEXITSTATUS(status) == 0, "child exit code ", WEXITSTATUS(status),
                " (91: wrong number of failures, 92: directory, 93: file)");
}
