// qrecipe-conformance: runs the shared conformance suite on any plugin the registry finds, so
// an out-of-tree plugin can prove itself without writing a test binary (docs/plugins.md).
//
//   qrecipe-conformance --format myformat [--option key=value ...] [--plugin-path DIR ...]
//
// Options of the runner come first; everything it does not know is passed to doctest
// (e.g. -s to list passing checks, --no-colors). Exit status: 0 when every check passed
// ("not supported" checks do not fail), 1 when some failed, 2 for a usage or load error.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "qrecipe/registry.hpp"

namespace conf = qrecipe::conformance;

namespace {

constexpr const char* kUsage =
    R"(usage: qrecipe-conformance --format NAME [options] [doctest options]

Runs the qrecipe plugin conformance suite (round-trip error bounds, zeros, denormals, NaN/inf,
exact values, shapes and partial blocks, layouts and buffer sizes, directions, determinism,
option validation) on the CPU path of plugin NAME, found through the plugin registry.

  --format NAME             format to test (required)
  --option KEY=VALUE        an option for every case, as a recipe would spell it (repeatable);
                            FORMAT{KEY=VALUE,...} is a nested quantizer spec
                            (FORMAT{} with no options), e.g. rowwise=float8{scaling=delayed}
  --case KEY=VALUE[,...]    one more option set to test (repeatable); without --case, the
                            --option set alone is tested
  --role TENSOR_TYPE        role tensor_type: input (default), weight or grad_output
  --plugin-path PATH        a plugin directory or .so file, searched first (repeatable);
                            QRECIPE_PLUGIN_PATH and the install directory are searched after
  --bound SPEC              error bound as rel_element=X,rel_block=Y,rel_tensor=Z,abs=W
                            (default: derived from each direction's data dtype, see
                            conformance.hpp derive_bound)
  --no-partial-blocks       the format refuses shapes with partial blocks (with an error
                            naming the shape) instead of quantizing them
  --columnwise-is-transpose the columnwise codes are the rowwise codes transposed
  --stochastic              the format rounds stochastically (checked under rng_offset)
  --rowwise-only / --columnwise-only   the format produces one direction only
  --exact-values V,V,...    values an all-equal tensor decodes exactly (default 1,2,-0.5;
                            "none" to skip)
  -h, --help                this text
)";

conf::Suite g_suite;

// Splits at `sep` outside braces, so nested specs ("rowwise=float8{a=1,b=2}") stay whole.
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char ch : s) {
    if (ch == '{') ++depth;
    if (ch == '}') --depth;
    if (ch == sep && depth == 0) {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "qrecipe-conformance: " << message << "\n(run with --help for the options)\n";
  std::exit(2);
}

std::pair<std::string, std::string> key_value(const std::string& s, const char* flag) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    usage_error(std::string(flag) + " expects KEY=VALUE, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// Option text as a recipe would give it; FORMAT{KEY=VALUE,...} is a nested quantizer spec
// (the hybrid format's rowwise / columnwise), the form QuantizerSpec::str() prints.
qrecipe::OptionValue option_value(const std::string& text) {
  const auto open = text.find('{');
  if (open == std::string::npos || open == 0 || text.back() != '}')
    return qrecipe::OptionValue::of_string(text);
  qrecipe::QuantizerSpec nested;
  nested.format = text.substr(0, open);
  for (const std::string& kv : split(text.substr(open + 1, text.size() - open - 2), ',')) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      usage_error("nested spec '" + text + "': expected KEY=VALUE, got '" + kv + "'");
    std::string key = kv.substr(0, eq);
    while (!key.empty() && key.front() == ' ') key.erase(key.begin());
    nested.options.emplace_back(key, option_value(kv.substr(eq + 1)));
  }
  return qrecipe::OptionValue::of_spec(std::move(nested));
}

double number(const std::string& s, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0')
    usage_error(std::string(what) + ": '" + s + "' is not a number");
  return v;
}

conf::ErrorBound parse_bound(const std::string& s) {
  conf::ErrorBound b;
  for (const std::string& part : split(s, ',')) {
    const auto [key, value] = key_value(part, "--bound");
    const double v = number(value, "--bound");
    if (key == "rel_element") b.rel_element = v;
    else if (key == "rel_block") b.rel_block = v;
    else if (key == "rel_tensor") b.rel_tensor = v;
    else if (key == "abs") b.abs = v;
    else
      usage_error("--bound: unknown term '" + key +
                  "'; use rel_element, rel_block, rel_tensor, abs");
  }
  return b;
}

// Parses the runner's own arguments into g_suite; returns the ones left for doctest.
std::vector<const char*> parse(int argc, char** argv) {
  std::vector<const char*> rest{argv[0]};
  std::vector<std::pair<std::string, std::string>> base;
  std::vector<std::vector<std::pair<std::string, std::string>>> cases;
  std::vector<std::string> plugin_paths;
  qrecipe::QuantizerRole role{"linear", "input", "conformance"};
  std::optional<conf::ErrorBound> bound;
  conf::Properties props;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--format") {
      g_suite.format = value();
    } else if (a == "--option") {
      base.push_back(key_value(value(), "--option"));
    } else if (a == "--case") {
      std::vector<std::pair<std::string, std::string>> options;
      for (const std::string& kv : split(value(), ',')) options.push_back(key_value(kv, "--case"));
      cases.push_back(std::move(options));
    } else if (a == "--role") {
      role.tensor_type = value();
    } else if (a == "--plugin-path") {
      plugin_paths.push_back(value());
    } else if (a == "--bound") {
      bound = parse_bound(value());
    } else if (a == "--no-partial-blocks") {
      props.supports_partial_blocks = false;
    } else if (a == "--columnwise-is-transpose") {
      props.columnwise_is_transpose = true;
    } else if (a == "--stochastic") {
      props.stochastic = true;
    } else if (a == "--rowwise-only") {
      props.usage = QR_USAGE_ROWWISE;
    } else if (a == "--columnwise-only") {
      props.usage = QR_USAGE_COLUMNWISE;
    } else if (a == "--exact-values") {
      props.exact_values.clear();
      const std::string v = value();
      if (v != "none")
        for (const std::string& x : split(v, ','))
          props.exact_values.push_back(static_cast<float>(number(x, "--exact-values")));
    } else {
      rest.push_back(argv[i]);  // doctest's
    }
  }
  if (g_suite.format.empty()) usage_error("--format NAME is required");
  if (cases.empty()) cases.emplace_back();
  for (auto& options : cases) {
    auto all = base;
    all.insert(all.end(), options.begin(), options.end());
    conf::Case c;
    c.spec.format = g_suite.format;
    for (const auto& [key, text] : all) c.spec.options.emplace_back(key, option_value(text));
    c.role = role;
    c.bound = bound;
    c.properties = props;
    g_suite.cases.push_back(std::move(c));
  }
  qrecipe::RegistryOptions ro;
  ro.paths = plugin_paths;
  g_suite.registry = std::make_shared<qrecipe::Registry>(ro);
  return rest;
}

// Says where the plugin came from, or why it was not found (exit 2).
void announce(const qrecipe::Registry& registry) {
  if (auto p = registry.find(g_suite.format)) {
    std::cout << "qrecipe-conformance: format '" << p->name() << "' version " << p->version()
              << " from " << p->path() << " (devices: " << p->devices_str() << ")\n";
    for (const auto& c : g_suite.cases)
      std::cout << "  case " << c.spec.str() << " for role " << c.role.str() << "\n";
    return;
  }
  std::cerr << "qrecipe-conformance: format '" << g_suite.format << "' not found; loaded: "
            << registry.loaded_names() << "\nsearch path:\n";
  for (const auto& e : registry.search_path())
    std::cerr << "  " << e.path << " (" << e.origin << ")\n";
  for (const auto& f : registry.failures())
    std::cerr << "load failure: " << f.path << ": " << f.cause << "\n";
  std::cerr << "pass --plugin-path DIR (the directory holding libqrecipe_" << g_suite.format
            << ".so) or set QRECIPE_PLUGIN_PATH\n";
  std::exit(2);
}

}  // namespace

TEST_CASE("conformance") { conf::run(g_suite); }

int main(int argc, char** argv) {
  std::vector<const char*> rest = parse(argc, argv);
  announce(*g_suite.registry);
  doctest::Context context;
  context.applyCommandLine(static_cast<int>(rest.size()), rest.data());
  const int failed = context.run();
  if (context.shouldExit()) return failed;
  const auto skipped = conf::not_supported_log();
  std::cout << "qrecipe-conformance: " << (failed ? "FAILED" : "passed") << "; "
            << skipped.size() << " check(s) not supported (not failures):\n";
  for (const auto& s : skipped) std::cout << "  - " << s << "\n";
  return failed ? 1 : 0;
}
