// Registry: finds, loads and keeps the format plugins (docs/plugins.md, "How plugins are found").
//
// Search order (printed by `qrecipe plugins -v`):
//   1. paths given through the API (RegistryOptions::paths: directories or .so files)
//   2. QRECIPE_PLUGIN_PATH (colon-separated directories or files)
//   3. the install directory baked in by CMake (QRECIPE_INSTALL_PLUGIN_DIR)
//   4. the directory of the engine library itself, and its qrecipe/plugins subdirectory
//      (where `cmake --install` puts plugins, whatever the prefix)
// In a directory, every file named libqrecipe_<name>.so is a plugin candidate.
//
// Loading a candidate: Boost.DLL opens it, the data symbol `qrecipe_plugin_abi` is read and
// checked before any plugin code runs, then `qrecipe_plugin_entry(host)` returns the
// descriptor, whose abi_version and struct_size are checked before any other field is read.
// Every failure (missing file, not a shared library, missing symbol, wrong ABI version,
// missing dependency, entry refusing the host, a duplicate name) is recorded as a LoadFailure
// naming the file and the cause; the other plugins stay usable. The same format found twice:
// the first in search order wins and the other is recorded in duplicates().
//
// Thread safety: loading mutates; lookups after construction are read-only and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qrecipe/format_plugin.hpp"

namespace qrecipe {

struct RegistryOptions {
  std::vector<std::string> paths;  // searched first, in order
  bool use_env = true;             // QRECIPE_PLUGIN_PATH
  bool use_install_dir = true;     // CMake install prefix
  bool use_library_dir = true;     // beside libqrecipe
};

struct SearchEntry {
  std::string path;    // directory or file
  std::string origin;  // "api", "QRECIPE_PLUGIN_PATH", "install dir", "engine library dir"
};

struct LoadFailure {
  std::string path;
  std::string cause;  // what went wrong and what to do next
};

struct DuplicateFormat {
  std::string format;
  std::string used_path;     // first in search order: this one is loaded
  std::string ignored_path;  // found later: reported, not loaded
  bool same_file_name = true;
};

class Registry {
 public:
  explicit Registry(RegistryOptions options = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Load one more plugin file explicitly. Returns the plugin, or nullptr with a LoadFailure
  // recorded (never throws for a bad plugin file).
  std::shared_ptr<const FormatPlugin> load_file(const std::string& path);

  const std::vector<SearchEntry>& search_path() const { return search_path_; }
  std::shared_ptr<const FormatPlugin> find(std::string_view format) const;  // nullptr if absent
  // Throws qrecipe::Error naming the loaded formats (and load failures) if absent.
  const FormatPlugin& get(std::string_view format) const;
  const std::vector<std::shared_ptr<const FormatPlugin>>& plugins() const { return plugins_; }
  const std::vector<LoadFailure>& failures() const { return failures_; }
  const std::vector<DuplicateFormat>& duplicates() const { return duplicates_; }
  std::string loaded_names() const;  // "fmt_a, fmt_b, toy" (sorted), or "none"

  // A process-wide registry with default options, made on first use.
  static std::shared_ptr<Registry> shared();

 private:
  void scan(const SearchEntry& entry);
  std::vector<SearchEntry> search_path_;
  std::vector<std::shared_ptr<const FormatPlugin>> plugins_;
  std::vector<LoadFailure> failures_;
  std::vector<DuplicateFormat> duplicates_;
  std::vector<std::shared_ptr<void>> libraries_;  // kept forever (never unloaded)
};

// Host table handed to every plugin entry (host_api.cpp).
const qr_host_api* host_api();
// Throws the error carried by `status` (and frees it) if it is not NULL; `context` prefixes
// the message, e.g. "myformat quantize of bf16[4, 8]".
void throw_if_error(qr_status status, const std::string& context);

}  // namespace qrecipe
