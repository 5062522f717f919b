// Recipes from a hostile or careless user (issue 19): limits on what the parser reads, special
// files, messages that survive any byte, and a check that resolves every quantizer so that
// nothing valid at check time fails at first use. docs/recipes.md ("Limits") states the limits.
//
// Map:
//   1. files: only regular files, up to the size limit (FIFOs, devices, directories refused
//      before anything is read)
//   2. YAML limits: alias expansion, nesting depth, text size; each error at file:line:column
//   3. messages: NUL bytes and control characters escaped, never cutting a message short;
//      numbers that underflow or overflow a double named as such
//   4. check resolves every rule's quantizer through its plugin (option combinations)
//   5. the fuzzers' regression inputs (tests/fuzz/regressions/recipe): a result, never a crash
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "qrecipe/engine.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#define CHECK_CONTAINS(message, part) \
  CHECK_MESSAGE(contains((message), (part)), "message: " << (message) << "\nexpected part: " << (part))

const Registry& registry() {
  static Registry instance;
  return instance;
}

void require_formats() {
  for (const char* format : {"float8", "nvfp4", "mxfp8", "hybrid"})
    REQUIRE_MESSAGE(registry().find(format) != nullptr,
                    "plugin '" << format << "' not loaded; loaded: " << registry().loaded_names());
}

// The message of the Error (a RecipeError or another) thrown by `fn`.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a qrecipe::Error, nothing was thrown");
  return "";
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "qrecipe_test_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// All problems of `check` joined, one per line ("" when the recipe is valid).
std::string check_text(const std::string& yaml) {
  const Recipe recipe = Recipe::parse(yaml, "<test>");
  std::string text;
  for (const auto& e : recipe.check(registry())) text += std::string(e.what()) + "\n";
  return text;
}

// The alias bomb of issue 19: `levels` maps, each holding `width` aliases of the one before,
// inside nested quantizer specs (where the parser descends into every map).
std::string alias_bomb(int levels, int width) {
  std::string yaml = "version: 1\ndefaults:\n  format: hybrid\n  l0: &l0 {format: float8}\n";
  for (int level = 1; level <= levels; ++level) {
    yaml += "  l" + std::to_string(level) + ": &l" + std::to_string(level) + " {format: hybrid";
    for (int i = 0; i < width; ++i)
      yaml += ", k" + std::to_string(i) + ": *l" + std::to_string(level - 1);
    yaml += "}\n";
  }
  return yaml;
}

}  // namespace

// ---------------------------------------------------------------- 1. files

TEST_CASE("a FIFO as the recipe file is refused at once, without opening it") {
  TempDir dir;
  const std::string fifo = dir.file("recipe.yaml");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a FIFO for reading blocks until a writer comes: the old loader hung here.
  const std::string message = error_of([&] { Recipe::load(fifo); });
  CHECK_CONTAINS(message, "recipe file '" + fifo + "' is not a regular file (a FIFO)");
}

TEST_CASE("a device as the recipe file is refused (/dev/zero never ends)") {
  const std::string message = error_of([] { Recipe::load("/dev/zero"); });
  CHECK_CONTAINS(message, "recipe file '/dev/zero' is not a regular file (a character device)");
}

TEST_CASE("a directory as the recipe file is refused as such") {
  TempDir dir;
  const std::string message = error_of([&] { Recipe::load(dir.path.string()); });
  CHECK_CONTAINS(message, "is not a regular file (a directory)");
}

TEST_CASE("a recipe file above the size limit is refused before it is read") {
  TempDir dir;
  const std::string path = dir.file("big.yaml");
  {
    std::ofstream out(path);
    out << "version: 1\n";
    const std::string comment = "# " + std::string(1000, 'x') + "\n";
    for (int i = 0; i < 1100; ++i) out << comment;  // ~1.1 MB of comments
  }
  const std::string message = error_of([&] { Recipe::load(path); });
  CHECK_CONTAINS(message, "recipe file '" + path + "' is 1103311 bytes");
  CHECK_CONTAINS(message, "limit of 1048576 bytes");
  // The same text given as a string.
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_CONTAINS(error_of([&] { Recipe::parse(text, "<big>"); }),
                 "<big>: the recipe text is 1103311 bytes");
}

// ---------------------------------------------------------------- 2. YAML limits

TEST_CASE("the 929-byte alias bomb fails at once at the alias that crosses the limit") {
  const std::string bomb = alias_bomb(8, 9);
  CHECK(bomb.size() < 1200);
  try {
    Recipe::parse(bomb, "<bomb>");
    FAIL("expected a RecipeError");
  } catch (const RecipeError& e) {
    const std::string message = e.what();
    CHECK_CONTAINS(message, "aliases expand this recipe to more than 100000 nodes");
    CHECK(e.location().file == "<bomb>");
    // Level k expands to 3 + 9 * (1 + level k-1) nodes: 29523 for level 4, so the third alias
    // of level 5 (line 9) crosses 100000.
    CHECK(e.location().line >= 9);
    CHECK(e.location().line <= 11);
    CHECK(e.location().column > 1);
  }
}

TEST_CASE("aliases within the limit still work (shared specs)") {
  require_formats();
  const std::string yaml =
      "version: 1\n"
      "defaults: &fp8 {format: float8, scaling: delayed}\n"
      "rules:\n"
      "  - match: {tensor_type: weight}\n"
      "    quantizer: *fp8\n";
  Recipe recipe = Recipe::parse(yaml);
  recipe.validate(registry());
  CHECK(recipe.rules()[0].quantizer.str() == recipe.defaults().str());
}

TEST_CASE("deep nesting is refused at the node that is too deep, before yaml-cpp's own guard") {
  // Well-formed (closed) nesting: an unclosed one is a syntax error anyway, and yaml-cpp's
  // positions there are its scanner's, not the node's.
  const std::pair<std::string, std::string> kinds[] = {{"[", "]"}, {"{a: ", "}"}};
  for (const auto& kind : kinds) {
    const std::string& open = kind.first;
    const std::string& close = kind.second;
    CAPTURE(open);
    std::string yaml = "version: 1\ndefaults: ";
    for (int i = 0; i < 600; ++i) yaml += open;
    if (close == "}") yaml += "b";
    for (int i = 0; i < 600; ++i) yaml += close;
    yaml += "\n";
    try {
      Recipe::parse(yaml, "<deep>");
      FAIL("expected a RecipeError");
    } catch (const RecipeError& e) {
      const std::string message = e.what();
      CHECK_CONTAINS(message, "nesting deeper than 64 levels");
      CHECK_FALSE(contains(message, "bad file"));
      // The root map is level 1, so the 64th opening bracket is level 65.
      CHECK(e.location().line == 2);
      CHECK(e.location().column == static_cast<int>(10 + 63 * open.size() + 1));
    }
  }
}

// ---------------------------------------------------------------- 3. messages

TEST_CASE("a NUL byte in a value or key is escaped and never cuts the message short") {
  require_formats();
  // YAML's "\0" escape puts a NUL byte into the scalar.
  const std::string text = check_text(
      "version: 1\ndefaults: {format: float8, scaling: \"cur\\0rent\", \"k\\0ey\": 1}\n");
  CHECK_CONTAINS(text, "'cur\\0rent' is not a valid scaling; choose one of: current, delayed");
  CHECK_CONTAINS(text, "unknown option 'k\\0ey' for format 'float8'");
  // what() of each error is a C string: everything after the NUL must still be there.
  const Recipe recipe =
      Recipe::parse("version: 1\ndefaults: {format: \"flo\\0at8\"}\n", "<nul>");
  const auto errors = recipe.check(registry());
  REQUIRE(errors.size() == 1);
  const std::string what = errors[0].what();  // up to the first NUL, if there were one
  CHECK_CONTAINS(what, "unknown format 'flo\\0at8'");
  CHECK_CONTAINS(what, "qrecipe plugins -v");
}

TEST_CASE("an option value holding a NUL byte is shown escaped") {
  require_formats();
  QuantizerSpec spec;
  spec.format = "float8";
  spec.options.emplace_back("scaling", OptionValue::of_string(std::string("current\0x", 9)));
  const std::string message = error_of([&] { validate_spec(spec, registry()); });
  CHECK_CONTAINS(message, "'current\\0x'");
}

TEST_CASE("amax_epsilon 1e-400 underflows, 1e400 overflows: neither is 'not a number'") {
  require_formats();
  const std::string under =
      check_text("version: 1\ndefaults: {format: float8, amax_epsilon: 1e-400}\n");
  CHECK_CONTAINS(under, "<test>:2:42: defaults.amax_epsilon: '1e-400' underflows a double");
  CHECK_FALSE(contains(under, "expected a number"));
  const std::string over =
      check_text("version: 1\ndefaults: {format: float8, amax_epsilon: -1e400}\n");
  CHECK_CONTAINS(over, "'-1e400' overflows a double");
  // Numbers a double holds, subnormals included, are fine (the plugin's bounds apply).
  CHECK(check_text("version: 1\ndefaults: {format: float8, amax_epsilon: 1e-310}\n").empty());
}

// ---------------------------------------------------------------- 4. check resolves quantizers

TEST_CASE("check: amax_history_len without delayed scaling fails at check, at the recipe's place") {
  require_formats();
  const std::string text =
      check_text("version: 1\ndefaults: {format: float8, amax_history_len: 16}\n");
  CHECK_CONTAINS(text, "<test>:2:11: defaults: ");
  CHECK_CONTAINS(text, "amax_history_len' only applies to scaling: delayed");
  CHECK_FALSE(contains(text, "float8.cpp"));  // the recipe's place, not the plugin's source
}

TEST_CASE("check: nvfp4 seed without stochastic_rounding fails at check") {
  require_formats();
  const std::string text = check_text(
      "version: 1\n"
      "rules:\n"
      "  - match: {tensor_type: grad_output}\n"
      "    quantizer: {format: nvfp4, seed: 7}\n");
  CHECK_CONTAINS(text, "<test>:4:16: rules[0].quantizer: ");
  CHECK_CONTAINS(text, "seed");
  CHECK_CONTAINS(text, "stochastic_rounding");
}

TEST_CASE("check: a bad combination inside a hybrid half fails at check") {
  require_formats();
  const std::string text = check_text(
      "version: 1\n"
      "defaults:\n"
      "  format: hybrid\n"
      "  rowwise: {format: float8, margin: 2}\n"
      "  columnwise: {format: mxfp8}\n");
  CHECK_CONTAINS(text, "<test>:3:3: defaults: ");
  CHECK_CONTAINS(text, "margin' only applies to scaling: delayed");
}

TEST_CASE("validate (and so an Engine) refuses what would fail at first use") {
  require_formats();
  Recipe recipe = Recipe::parse("version: 1\ndefaults: {format: float8, margin: 1}\n", "<r>");
  const std::string message = error_of([&] { recipe.validate(registry()); });
  CHECK_CONTAINS(message, "<r>:2:11: defaults: ");
  CHECK_FALSE(recipe.validated());
  // A valid recipe with delayed scaling still validates, and the check leaves no state behind.
  auto shared = std::make_shared<Registry>();
  Engine engine(Recipe::parse("version: 1\ndefaults: {format: float8, scaling: delayed}\n"),
                shared);
  CHECK(engine.scaling_states().empty());
  engine.resolve({"linear", "weight", "w"});
  CHECK(engine.scaling_states().size() == 1);
}

TEST_CASE("check: valid option combinations stay valid") {
  require_formats();
  CHECK(check_text("version: 1\ndefaults: {format: nvfp4, 2d: true}\n").empty());
  CHECK(check_text("version: 1\ndefaults: {format: nvfp4, stochastic_rounding: true, seed: 3}\n")
            .empty());
  CHECK(check_text("version: 1\ndefaults: {format: float8, scaling: delayed, margin: 1}\n")
            .empty());
}

TEST_CASE("check: a share on a quantizer without scaling state fails at check; factory rules wait") {
  require_formats();
  const std::string text = check_text("version: 1\ndefaults: {format: mxfp8, share: weights}\n");
  CHECK_CONTAINS(text, "<test>:2:11: defaults: share: ");
  CHECK_CONTAINS(text, "keeps no scaling state");
  CHECK_FALSE(contains(text, "<code>"));
  // A rule delegating to a factory has no spec until a role asks (the engine validates what
  // the factory returns then): the check leaves it alone.
  CHECK(check_text("version: 1\nrules:\n  - match: {}\n    factory: my.module:pick\n").empty());
}

// ---------------------------------------------------------------- 5. fuzz regressions

TEST_CASE("every fuzz regression input gives a result or a qrecipe::Error") {
  const char* root = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_SOURCE_DIR is not set; run this test through ctest");
  const std::filesystem::path dir = std::filesystem::path(root) / "tests/fuzz/regressions/recipe";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    CAPTURE(path);
    ++files;
    try {
      const Recipe recipe = Recipe::load(path);
      (void)recipe.check(registry());
    } catch (const Error&) {
      // A clear refusal is a result; anything else escapes and fails the test.
    }
  }
  CHECK(files > 0);
}
