// Registry: plugin discovery and loading through Boost.DLL (see registry.hpp for the rules).
#include "qrecipe/registry.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "qrecipe/error.hpp"
#include "registry/plugin_file.hpp"

#ifndef QRECIPE_INSTALL_PLUGIN_DIR
#define QRECIPE_INSTALL_PLUGIN_DIR ""
#endif

namespace qrecipe {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "libqrecipe_";
constexpr const char* kSuffix = ".so";

bool is_plugin_file_name(const std::string& name) {
  return name.size() > std::string(kPrefix).size() + std::string(kSuffix).size() &&
         name.rfind(kPrefix, 0) == 0 &&
         name.compare(name.size() - 3, 3, kSuffix) == 0;
}

std::vector<std::string> split_colon(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == ':') {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

// Boost.DLL puts the dynamic loader's message in its exception text, then the errno of the
// failed call: "boost::dll::shared_library::load() failed (dlerror system message: <text>):
// <strerror>". Keep just the loader's words: the errno is whatever dlopen left behind ("Bad
// file descriptor" for an empty file), not the cause.
std::string loader_message(const std::string& what) {
  const std::string marker = "(dlerror system message: ";
  const auto pos = what.find(marker);
  if (pos == std::string::npos) return printable(what);
  std::string msg = what.substr(pos + marker.size());
  // The loader's text may hold parentheses itself: its end is the last ')' of the text.
  const auto end = msg.rfind(')');
  if (end != std::string::npos) msg.resize(end);
  return printable(msg);
}

std::string explain_dlopen_failure(const std::string& path, const std::string& loader) {
  std::ostringstream os;
  if (loader.find("cannot open shared object file") != std::string::npos &&
      loader.find(fs::path(path).filename().string()) == std::string::npos) {
    // The plugin itself exists; one of its dependencies does not.
    const auto colon = loader.find(':');
    const std::string dep = colon == std::string::npos ? loader : loader.substr(0, colon);
    os << "a library it depends on could not be loaded: " << dep
       << " (loader: " << loader << "); install it or add its directory to LD_LIBRARY_PATH";
  } else if (loader.find("invalid ELF header") != std::string::npos ||
             loader.find("file too short") != std::string::npos ||
             loader.find("not an ELF") != std::string::npos) {
    os << "not a shared library (loader: " << loader << "); remove the file from the plugin path";
  } else if (loader.find("undefined symbol") != std::string::npos) {
    os << "it references a symbol nothing provides (loader: " << loader
       << "); rebuild the plugin against this qrecipe";
  } else {
    os << "the dynamic loader refused it: " << loader;
  }
  return os.str();
}

}  // namespace

Registry::Registry(RegistryOptions options) {
  for (const auto& p : options.paths) search_path_.push_back({p, "api"});
  if (options.use_env) {
    if (const char* env = std::getenv("QRECIPE_PLUGIN_PATH"))
      for (const auto& p : split_colon(env)) search_path_.push_back({p, "QRECIPE_PLUGIN_PATH"});
  }
  if (options.use_install_dir && std::string(QRECIPE_INSTALL_PLUGIN_DIR).size() > 0)
    search_path_.push_back({QRECIPE_INSTALL_PLUGIN_DIR, "install dir"});
  if (options.use_library_dir) {
    boost::dll::fs::error_code ec;
    const auto here = boost::dll::this_line_location(ec);
    if (!ec) {
      // Build trees put plugins beside the engine library; installs put them in
      // <libdir>/qrecipe/plugins, found this way whatever the install prefix.
      const fs::path lib_dir = here.parent_path().string();
      search_path_.push_back({lib_dir.string(), "engine library dir"});
      const fs::path installed = lib_dir / "qrecipe" / "plugins";
      std::error_code exists_ec;
      if (fs::is_directory(installed, exists_ec) &&
          installed.string() != QRECIPE_INSTALL_PLUGIN_DIR)
        search_path_.push_back({installed.string(), "engine library dir"});
    }
  }
  for (const auto& entry : search_path_) scan(entry);
}

void Registry::scan(const SearchEntry& entry) {
  std::error_code ec;
  const fs::path p(entry.path);
  const fs::file_status status = fs::status(p, ec);
  if (!fs::exists(status)) {
    // An explicitly given path that does not exist is a mistake worth reporting; the default
    // install dir not existing (not installed) is normal.
    if (entry.origin == "api" || entry.origin == "QRECIPE_PLUGIN_PATH")
      failures_.push_back({entry.path, "no such file or directory (from " + entry.origin +
                                           "); fix the path or remove it"});
    return;
  }
  if (!fs::is_directory(status)) {
    load_file(p.string());  // a file given by name: load_file says what is wrong with it
    return;
  }
  // An unreadable directory is reported, never skipped silently: its plugins would be missing
  // without a word. Names are only listed here; load_file checks what each one is.
  std::vector<fs::path> files;
  fs::directory_iterator it(p, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec))
    if (is_plugin_file_name(it->path().filename().string())) files.push_back(it->path());
  if (ec)
    failures_.push_back({entry.path, "cannot read the directory (from " + entry.origin + "): " +
                                         ec.message() + "; fix its permissions or remove it "
                                         "from the plugin path"});
  std::sort(files.begin(), files.end());  // deterministic order within a directory
  for (const auto& f : files) load_file(f.string());
}

std::shared_ptr<const FormatPlugin> Registry::load_file(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  auto fail = [&](const std::string& cause) -> std::shared_ptr<const FormatPlugin> {
    failures_.push_back({path, cause});
    return nullptr;
  };
  if (!fs::exists(p, ec)) return fail("no such file; check the path");
  const std::string canonical = fs::weakly_canonical(p, ec).string();
  for (const auto& plugin : plugins_)
    if (fs::weakly_canonical(plugin->path(), ec).string() == canonical) return plugin;  // seen

  // The loader trusts the file: a FIFO blocks dlopen forever and a truncated ELF file dies of
  // SIGBUS inside it. Check what it is first (registry/plugin_file.hpp).
  if (const std::string problem = registry_internal::plugin_file_problem(canonical); !problem.empty())
    return fail(problem);

  auto library = std::make_shared<boost::dll::shared_library>();
  try {
    library->load(canonical, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return fail(explain_dlopen_failure(path, loader_message(e.what())));
  }
  if (!library->has(QR_PLUGIN_ABI_SYMBOL))
    return fail(std::string("missing symbol '") + QR_PLUGIN_ABI_SYMBOL +
                "': not a qrecipe plugin (a plugin defines it with QR_DEFINE_PLUGIN)");
  const std::uint32_t abi = library->get<const std::uint32_t>(QR_PLUGIN_ABI_SYMBOL);
  if (abi != QR_PLUGIN_ABI_VERSION) {
    std::ostringstream os;
    os << "plugin ABI version " << abi << " but this qrecipe reads ABI version "
       << QR_PLUGIN_ABI_VERSION << "; rebuild the plugin against this qrecipe's headers";
    return fail(os.str());
  }
  if (!library->has(QR_PLUGIN_ENTRY_SYMBOL))
    return fail(std::string("missing symbol '") + QR_PLUGIN_ENTRY_SYMBOL +
                "'; a plugin defines it with QR_DEFINE_PLUGIN");
  auto& entry = library->get<std::remove_pointer_t<qr_plugin_entry_fn>>(QR_PLUGIN_ENTRY_SYMBOL);
  const qr_plugin_descriptor* d = nullptr;
  try {
    // One entry call at a time in the process: registries built on several threads load the
    // same plugins, and an entry (the SDK's records the host table) need not be reentrant.
    static std::mutex entry_mutex;
    const std::lock_guard<std::mutex> lock(entry_mutex);
    d = entry(host_api());
  } catch (...) {
    // A C entry point must not throw; if a C++ one does anyway, report it instead of dying.
    return fail("qrecipe_plugin_entry threw an exception; plugin entry points must be noexcept");
  }
  if (d == nullptr)
    return fail("qrecipe_plugin_entry returned no descriptor (the plugin refused this host: "
                "ABI version or host table size mismatch)");
  if (d->abi_version != QR_PLUGIN_ABI_VERSION) {
    std::ostringstream os;
    os << "descriptor ABI version " << d->abi_version << " but this qrecipe reads ABI version "
       << QR_PLUGIN_ABI_VERSION << "; rebuild the plugin";
    return fail(os.str());
  }
  // The released v1 size, not sizeof: a plugin built before the fields appended since then
  // (plugin_abi.h) still loads, and FormatPlugin reads those fields only where struct_size
  // reaches them.
  if (d->struct_size < QR_PLUGIN_DESCRIPTOR_SIZE_V1) {
    std::ostringstream os;
    os << "descriptor struct_size " << d->struct_size << " is smaller than the "
       << QR_PLUGIN_DESCRIPTOR_SIZE_V1 << " bytes ABI version " << QR_PLUGIN_ABI_VERSION
       << " requires; rebuild the plugin";
    return fail(os.str());
  }
  std::shared_ptr<FormatPlugin> plugin;
  try {
    plugin = std::make_shared<FormatPlugin>(path, d);
  } catch (const Error& e) {
    return fail(e.message());
  }
  for (const auto& other : plugins_) {
    if (other->name() != plugin->name()) continue;
    const bool same_name = fs::path(other->path()).filename() == p.filename();
    if (same_name) {
      duplicates_.push_back({plugin->name(), other->path(), path, true});
      libraries_.push_back(std::move(library));  // never unload what ran
      return other;
    }
    return fail("format '" + plugin->name() + "' is already provided by " + other->path() +
                "; two different plugins claim the same format name, rename one");
  }
  libraries_.push_back(std::move(library));
  plugins_.push_back(plugin);
  return plugin;
}

std::shared_ptr<const FormatPlugin> Registry::find(std::string_view format) const {
  for (const auto& p : plugins_)
    if (p->name() == format) return p;
  return nullptr;
}

const FormatPlugin& Registry::get(std::string_view format) const {
  if (auto p = find(format)) return *p;
  std::ostringstream os;
  os << "unknown format '" << format << "'; loaded formats: " << loaded_names();
  if (!failures_.empty()) {
    os << "; plugins that failed to load:";
    for (const auto& f : failures_) os << " " << f.path << " (" << f.cause << ")";
  }
  os << ". Run `qrecipe plugins -v` to see the search path";
  QR_THROW(os.str());
}

std::string Registry::loaded_names() const {
  std::vector<std::string> names;
  for (const auto& p : plugins_) names.push_back(p->name());
  std::sort(names.begin(), names.end());
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

std::shared_ptr<Registry> Registry::shared() {
  static std::shared_ptr<Registry> instance = std::make_shared<Registry>();
  return instance;
}

}  // namespace qrecipe
