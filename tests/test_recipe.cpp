// Tests of recipes (engine/src/recipe/, docs/recipes.md).
//
// Map:
//   1. glob_match
//   2. parsing good recipes and matching roles (first match wins, any-of lists, defaults)
//   3. malformed recipes: each fixture in tests/recipes/ must fail with the exact
//      file:line:column and key path
//   4. validation against the real float8 plugin, loaded through the Registry
//   5. the shipped recipes under recipes/
//
// Fixtures are found through QRECIPE_SOURCE_DIR and plugins through QRECIPE_PLUGIN_PATH (both
// set by ctest, tests/CMakeLists.txt). To add a malformed case: add a fixture file and a
// CHECK of its full "file:line:column: key.path: message" text in section 3 or 4.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

std::string source_dir() {
  const char* dir = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "QRECIPE_SOURCE_DIR is not set; run this test through ctest");
  return dir;
}
std::string fixture(const std::string& name) { return source_dir() + "/tests/recipes/" + name; }
std::string shipped(const std::string& name) { return source_dir() + "/recipes/" + name; }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The RecipeError thrown by `fn` (fails the test if nothing or something else is thrown).
template <class Fn>
RecipeError recipe_error(Fn&& fn) {
  try {
    fn();
  } catch (const RecipeError& e) {
    return e;
  }
  FAIL("expected a RecipeError, nothing was thrown");
  return RecipeError({}, "");  // unreachable: FAIL throws
}

RecipeError load_error(const std::string& path) {
  return recipe_error([&] { Recipe::load(path); });
}

// Checks that `message` starts with the full expected text "path:line:col: key: what...".
#define CHECK_STARTS_WITH(message, expected)                                           \
  CHECK_MESSAGE(std::string(message).rfind((expected), 0) == 0,                        \
                "message: " << (message) << "\nexpected start: " << (expected))
#define CHECK_CONTAINS(message, part) \
  CHECK_MESSAGE(contains((message), (part)), "message: " << (message) << "\nexpected part: " << (part))

QuantizerRole role(const char* module_type, const char* tensor_type, const char* name) {
  return {module_type, tensor_type, name};
}

// The one registry of this test binary: the build's plugins (QRECIPE_PLUGIN_PATH).
const Registry& registry() {
  static Registry instance;
  return instance;
}

const FormatPlugin& float8_plugin() {
  const auto plugin = registry().find("float8");
  if (!plugin) {
    std::string failures;
    for (const auto& f : registry().failures()) failures += "\n  " + f.path + ": " + f.cause;
    FAIL("the float8 plugin was not loaded (build target qrecipe_float8); loaded: "
         << registry().loaded_names() << "; failures:" << failures);
  }
  return *plugin;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// 1. Globs

TEST_CASE("glob_match: '*' spans any run of characters, dots included") {
  CHECK(glob_match("layers.*", "layers.3.mlp.fc1"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*", "a.b.c"));
  CHECK(glob_match("*.fc1", "layers.fc1.fc1"));  // needs backtracking past the first ".fc1"
  CHECK(glob_match("*a*a*a", "aaaa"));
  CHECK(glob_match("a*b*c", "aXXbYYc"));
  CHECK_FALSE(glob_match("a*b*c", "aXXbYY"));
  CHECK_FALSE(glob_match("layers.*", "layers"));
  CHECK_FALSE(glob_match("layers.*", "head.layers.0"));
}

TEST_CASE("glob_match: '?' is exactly one character; literals must match whole") {
  CHECK(glob_match("layers.?.fc1", "layers.3.fc1"));
  CHECK_FALSE(glob_match("layers.?.fc1", "layers.10.fc1"));
  CHECK_FALSE(glob_match("?", ""));
  CHECK(glob_match("", ""));
  CHECK_FALSE(glob_match("", "a"));
  CHECK(glob_match("layers.0", "layers.0"));
  CHECK_FALSE(glob_match("layers.0", "layers.00"));
  CHECK_FALSE(glob_match("layers.00", "layers.0"));
}

TEST_CASE("glob_match: character classes") {
  CHECK(glob_match("[abc]x", "bx"));
  CHECK_FALSE(glob_match("[abc]x", "dx"));
  CHECK(glob_match("layers.[0-3].*", "layers.2.attn"));
  CHECK_FALSE(glob_match("layers.[0-3].*", "layers.4.attn"));
  CHECK(glob_match("[!0-3]", "4"));
  CHECK_FALSE(glob_match("[!0-3]", "2"));
  CHECK(glob_match("*fc[12]", "mlp.fc2"));
  CHECK_FALSE(glob_match("*fc[12]", "mlp.fc3"));
  CHECK(glob_match("[]]", "]"));   // ']' first in a class is a member
  CHECK(glob_match("[*]", "*"));   // how to match a literal '*'
  CHECK_FALSE(glob_match("[*]", "x"));
  CHECK(glob_match("[a-]", "-"));  // '-' before ']' is a literal
  CHECK(glob_match("[ab", "[ab"));  // never closed: '[' is literal (the parser refuses it)
}

// ---------------------------------------------------------------------------------------------
// 2. Good recipes and matching

TEST_CASE("parse a recipe with every match key, lists, globs and defaults") {
  const std::string path = fixture("good_mixed.yaml");
  const Recipe recipe = Recipe::load(path);
  CHECK(recipe.name() == "mixed");
  CHECK(recipe.version() == 1);
  CHECK(recipe.source() == path);
  CHECK_FALSE(recipe.validated());
  REQUIRE(recipe.rules().size() == 4);

  // defaults: {format: float8, scaling: current} on line 5
  const QuantizerSpec& defaults = recipe.defaults();
  CHECK(defaults.format == "float8");
  CHECK(defaults.location.str() == path + ":5:11");
  REQUIRE(defaults.options.size() == 1);
  CHECK(defaults.options[0].first == "scaling");
  const OptionValue& scaling = defaults.options[0].second;
  CHECK(scaling.type == QR_OPTION_STRING);  // untyped until validate()
  CHECK(scaling.string_value == "current");
  CHECK(scaling.location.str() == path + ":5:37");

  const RecipeRule& first = recipe.rules()[0];
  CHECK(first.location.str() == path + ":8:5");
  CHECK(first.match.names == std::vector<std::string>{"layers.0.*", "layers.1[0-9].*"});
  CHECK(first.match.module_types.empty());
  CHECK(first.match.tensor_types.empty());
  CHECK(first.quantizer.is_none());
  CHECK(first.match.str() == "{name: [layers.0.*, layers.1[0-9].*]}");

  const RecipeRule& second = recipe.rules()[1];
  CHECK(second.match.module_types == std::vector<std::string>{"linear", "layernorm_linear"});
  CHECK(second.match.tensor_types == std::vector<std::string>{"weight"});
  CHECK(second.match.str() == "{module_type: [linear, layernorm_linear], tensor_type: weight}");
  CHECK(second.quantizer.str() == "float8{scaling=delayed, amax_history_len=16}");
  const OptionValue* history = second.quantizer.find("amax_history_len");
  REQUIRE(history != nullptr);
  CHECK(history->string_value == "16");
  CHECK(history->location.str() == path + ":16:25");

  CHECK(recipe.rules()[2].match.str() ==
        "{tensor_type: [input, grad_output], name: layers.?.mlp.*}");
  CHECK(recipe.rules()[3].match.str() == "{}");
}

TEST_CASE("match: first match wins, lists are any-of, names are globs") {
  const Recipe recipe = Recipe::load(fixture("good_mixed.yaml"));
  // Rules: 0 {name: [layers.0.*, layers.1[0-9].*]}  1 {module_type: [linear,
  // layernorm_linear], tensor_type: weight}  2 {tensor_type: [input, grad_output], name:
  // layers.?.mlp.*}  3 {} (everything else).
  CHECK(recipe.match(role("linear", "weight", "layers.0.fc1")) == 0);  // 0 and 1 match: 0 wins
  CHECK(recipe.match(role("linear", "input", "layers.0.mlp.fc1")) == 0);  // 0 and 2 match
  CHECK(recipe.match(role("linear", "weight", "layers.12.fc1")) == 0);  // class [0-9]
  CHECK(recipe.match(role("linear", "weight", "layers.2.fc1")) == 1);
  CHECK(recipe.match(role("layernorm_linear", "weight", "layers.20.qkv")) == 1);  // any-of
  // The family: linear covers grouped_linear (role.hpp, kModuleTypes).
  CHECK(recipe.match(role("grouped_linear", "weight", "layers.2.experts")) == 1);
  CHECK(recipe.match(role("my_module", "weight", "layers.2.experts")) == 3);
  CHECK(recipe.match(role("linear", "input", "layers.5.mlp.fc1")) == 2);
  CHECK(recipe.match(role("linear", "grad_output", "layers.5.mlp.fc2")) == 2);
  CHECK(recipe.match(role("linear", "input", "layers.25.mlp.fc1")) == 3);  // '?' is one char
  CHECK(recipe.match(role("linear", "input", "layers.5.attn.qkv")) == 3);

  CHECK(recipe.resolve(role("linear", "weight", "layers.2.fc1")).str() ==
        "float8{scaling=delayed, amax_history_len=16}");
  CHECK(recipe.resolve(role("linear", "input", "layers.5.mlp.fc1")).str() == "float8{dtype=e5m2}");
  CHECK(recipe.resolve(role("linear", "input", "layers.0.mlp.fc1")).is_none());
}

TEST_CASE("defaults apply when no rule matches; missing defaults mean format none") {
  const Recipe recipe = Recipe::parse(R"(
version: 1
defaults: {format: float8, dtype: e5m2}
rules:
  - match: {module_type: linear, tensor_type: weight}
    quantizer: {format: none}
)", "inline.yaml");
  CHECK(recipe.name() == "unnamed");
  CHECK(recipe.source() == "inline.yaml");
  CHECK(recipe.match(role("linear", "weight", "fc")) == 0);
  CHECK(recipe.match(role("linear", "input", "fc")) == -1);
  CHECK(recipe.match(role("grouped_linear", "weight", "fc")) == 0);  // linear covers it
  CHECK(recipe.match(role("my_module", "weight", "fc")) == -1);
  CHECK(recipe.resolve(role("linear", "input", "fc")).str() == "float8{dtype=e5m2}");

  const Recipe bare = Recipe::parse("version: 1\n");
  CHECK(bare.defaults().is_none());
  CHECK(bare.rules().empty());
  CHECK(bare.match(role("linear", "input", "fc")) == -1);
  CHECK(bare.resolve(role("linear", "input", "fc")).is_none());

  const Recipe empty_rules = Recipe::parse("version: 1\nrules:\n");  // `rules:` with nothing
  CHECK(empty_rules.rules().empty());
}

TEST_CASE("an empty name matches '*' but not a name glob that needs characters") {
  const Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {name: "layers.*"}
    quantizer: {format: float8}
  - match: {name: "*"}
    quantizer: {format: none}
)");
  CHECK(recipe.match(role("linear", "input", "")) == 1);
  CHECK(recipe.match(role("linear", "input", "layers.1")) == 0);
}

TEST_CASE("nested quantizer specs parse into OptionValue::of_spec") {
  const Recipe recipe = Recipe::parse(R"(version: 1
defaults:
  format: hybrid
  rowwise: {format: float8, scaling: current}
  columnwise:
    format: mxfp8
)", "nested.yaml");
  const QuantizerSpec& spec = recipe.defaults();
  CHECK(spec.str() == "hybrid{rowwise=float8{scaling=current}, columnwise=mxfp8}");
  const OptionValue* rowwise = spec.find("rowwise");
  REQUIRE(rowwise != nullptr);
  CHECK(rowwise->type == QR_OPTION_QUANTIZER);
  REQUIRE(rowwise->spec != nullptr);
  CHECK(rowwise->location.str() == "nested.yaml:4:12");
  CHECK(rowwise->spec->location.str() == "nested.yaml:4:12");
  CHECK(rowwise->spec->find("scaling")->location.str() == "nested.yaml:4:38");
  const OptionValue* columnwise = spec.find("columnwise");
  REQUIRE(columnwise != nullptr);
  CHECK(columnwise->spec->location.str() == "nested.yaml:6:5");
}

TEST_CASE("Recipe is a value type: copies are independent") {
  const Recipe original = Recipe::load(fixture("good_mixed.yaml"));
  Recipe copy = original;
  CHECK(copy.rules().size() == original.rules().size());
  CHECK(copy.defaults().str() == original.defaults().str());
  Recipe assigned = Recipe::parse("version: 1\n");
  assigned = copy;
  CHECK(assigned.name() == "mixed");
  CHECK(assigned.match(role("linear", "weight", "layers.2.fc1")) == 1);
}

TEST_CASE("Recipe::uniform has no rules and the given defaults, not yet validated") {
  QuantizerSpec spec;
  spec.format = "float8";
  spec.options.emplace_back("scaling", OptionValue::of_string("current"));
  const Recipe recipe = Recipe::uniform(spec, "all-float8");
  CHECK(recipe.name() == "all-float8");
  CHECK(recipe.rules().empty());
  CHECK_FALSE(recipe.validated());
  CHECK(recipe.match(role("linear", "weight", "x")) == -1);
  CHECK(recipe.resolve(role("linear", "grad_output", "y")).str() == "float8{scaling=current}");
  CHECK(Recipe::uniform(QuantizerSpec{}).name() == "uniform");
}

// ---------------------------------------------------------------------------------------------
// 3. Malformed recipes (structure): exact file:line:column and key path

TEST_CASE("unreadable file: qrecipe::Error naming the path and the OS reason") {
  const std::string missing = fixture("does_not_exist.yaml");
  try {
    Recipe::load(missing);
    FAIL("expected an error");
  } catch (const RecipeError& e) {
    FAIL("an unreadable file is not a recipe error: " << e.what());
  } catch (const Error& e) {
    CHECK_CONTAINS(std::string(e.what()), "cannot open recipe file '" + missing +
                                              "': No such file or directory");
  }
  // A directory is refused before it is opened (tests/test_recipe_limits.cpp has the FIFO
  // and device cases).
  const std::string directory = source_dir() + "/tests/recipes";
  try {
    Recipe::load(directory);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_CONTAINS(std::string(e.what()), "recipe file '" + directory +
                                              "' is not a regular file (a directory)");
  }
}

TEST_CASE("YAML syntax error: the parser's position and message") {
  // Line 3 opens a flow map `{tensor_type: weight` that is never closed; the parser notices
  // at line 4, column 14 (the ':' after `quantizer`, which cannot start a flow-map entry).
  const std::string path = fixture("bad_syntax.yaml");
  const RecipeError e = load_error(path);
  CHECK(std::string(e.what()) == path + ":4:14: YAML syntax error: end of map flow not found");
  CHECK(e.location().file == path);
  CHECK(e.location().line == 4);
  CHECK(e.location().column == 14);
  CHECK(e.code() == QR_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("missing version") {
  const std::string path = fixture("bad_missing_version.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":1:1: missing required key 'version'; add `version: 1` (this build reads "
               "recipe version 1)");
}

TEST_CASE("version 2: says which version this build reads") {
  const std::string path = fixture("bad_version_2.yaml");
  const RecipeError e = load_error(path);
  CHECK_STARTS_WITH(e.what(), path + ":2:10: version: recipe version 2 is not supported; this "
                                     "build reads recipe version 1");
  CHECK(e.location().line == 2);
  CHECK_STARTS_WITH(recipe_error([] { Recipe::parse("version: one\n", "v.yaml"); }).what(),
                    "v.yaml:1:10: version: expected an integer, got 'one'; this build reads "
                    "recipe version 1");
}

TEST_CASE("unknown top-level key: lists the allowed keys") {
  const std::string path = fixture("bad_unknown_top_key.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":3:1: rule: unknown top-level key 'rule'; allowed keys: version, name, "
               "description, defaults, rules, telemetry; did you mean 'rules'?");
}

TEST_CASE("rules that are not a list") {
  const std::string path = fixture("bad_rules_not_list.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":3:3: rules: expected a list of rules ('- match: ...' entries), got a map");
}

TEST_CASE("rule without quantizer") {
  const std::string path = fixture("bad_rule_missing_quantizer.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":5:5: rules[1]: missing required key 'quantizer', e.g. "
               "`quantizer: {format: <name>}` (`qrecipe plugins` lists the formats) or "
               "`quantizer: {format: none}` (or `factory: package.module:function` to let a "
               "Python function decide)");
}

TEST_CASE("unknown match key: lists the allowed ones") {
  const std::string path = fixture("bad_unknown_match_key.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":3:34: rules[0].match.tensor: unknown match key 'tensor'; allowed keys: "
               "module_type, tensor_type, name");
}

TEST_CASE("bad tensor_type value: points at the list item") {
  const std::string path = fixture("bad_tensor_type.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":4:28: rules[0].match.tensor_type[1]: unknown tensor_type 'weights'; allowed: "
               "input, weight, grad_output; did you mean 'weight'?");
}

TEST_CASE("quantizer without format") {
  const std::string path = fixture("bad_quantizer_without_format.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":5:7: rules[0].quantizer: missing required key 'format' (a format name "
               "`qrecipe plugins` lists, or none)");
}

TEST_CASE("a list as an option value") {
  const std::string path = fixture("bad_list_option.yaml");
  CHECK(std::string(load_error(path).what()) ==
        path + ":4:10: defaults.dtype: a list is not a valid option value (no option takes a "
               "list); give a single value");
}

TEST_CASE("more structural problems, inline") {
  auto message = [](const std::string& text) {
    return std::string(recipe_error([&] { Recipe::parse(text, "r.yaml"); }).what());
  };
  CHECK(message("") == "r.yaml:1:1: the recipe is empty; a recipe needs at least `version: 1` "
                       "(see docs/recipes.md)");
  CHECK(message("version: 1\n---\nversion: 1\n") ==
        "r.yaml:3:1: a recipe file holds one YAML document, found 2; remove the extra '---'");
  CHECK(message("- version: 1\n") ==
        "r.yaml:1:1: a recipe is a YAML map with the keys version, name, description, "
        "defaults, rules, telemetry; got a list");
  CHECK(message("version: 1\nversion: 1\n") ==
        "r.yaml:2:1: version: duplicate key 'version'; keep only one");
  CHECK(message("version: 1\nname: [a, b]\n") ==
        "r.yaml:2:7: name: expected a string, got a list");
  CHECK(message("version: 1\ndefaults: float8\n") ==
        "r.yaml:2:11: defaults: a quantizer spec is a map with a 'format' key, e.g. "
        "{format: <name>} or {format: none}; got 'float8'");
  CHECK(message("version: 1\ndefaults: {format: none, dtype: e4m3}\n") ==
        "r.yaml:2:33: defaults.dtype: format none keeps high precision and takes no options; "
        "remove 'dtype'");
  CHECK(message("version: 1\ndefaults: {format: float8, margin: }\n") ==
        "r.yaml:2:28: defaults.margin: option has no value; give one or remove the key");
  CHECK(message("version: 1\ndefaults: {format: [a]}\n") ==
        "r.yaml:2:20: defaults.format: expected a format name (one `qrecipe plugins` lists, "
        "or none), got a list");
  CHECK(message("version: 1\nrules:\n  - quantizer: {format: none}\n") ==
        "r.yaml:3:5: rules[0]: missing required key 'match'; write `match: {}` to match every "
        "role");
  CHECK(message("version: 1\nrules:\n  - match: {}\n    quantizer: {format: none}\n    "
                "when: always\n") ==
        "r.yaml:5:5: rules[0].when: unknown rule key 'when'; allowed keys: match, quantizer, "
        "factory");
  CHECK(message("version: 1\nrules:\n  - match: {module_type: []}\n    quantizer: {format: "
                "none}\n") ==
        "r.yaml:3:26: rules[0].match.module_type: an empty list matches nothing; remove the key "
        "to match any value");
  CHECK(message("version: 1\nrules:\n  - match: {name: \"layers.[0-3.fc1\"}\n    quantizer: "
                "{format: none}\n") ==
        "r.yaml:3:19: rules[0].match.name: bad name glob 'layers.[0-3.fc1': character class "
        "opened at offset 7 is never closed; add ']' (or write '[[]' for a literal '[')");
  CHECK(message("version: 1\nrules:\n  - match:\n    quantizer: {format: none}\n") ==
        "r.yaml:3:5: rules[0].match: expected a map with any of the keys module_type, "
        "tensor_type, name (or {} to match every role), got nothing (null)");
}

TEST_CASE("several structural problems are reported together, first one's location first") {
  const RecipeError e = recipe_error([] {
    Recipe::parse("name: x\nrules:\n  - match: {modul_type: linear}\n    quantizer: {}\n",
                  "r.yaml");
  });
  CHECK(std::string(e.what()) ==
        "r.yaml:3:13: rules[0].match.modul_type: unknown match key 'modul_type'; allowed keys: "
        "module_type, tensor_type, name; did you mean 'module_type'?\n"
        "r.yaml:4:16: rules[0].quantizer: missing required key 'format' (a format name "
        "`qrecipe plugins` lists, or none)\n"
        "r.yaml:1:1: missing required key 'version'; add `version: 1` (this build reads recipe "
        "version 1)\n"
        "(3 problems in all)");
  CHECK(e.location().line == 3);
  CHECK(e.location().column == 13);
}

// ---------------------------------------------------------------------------------------------
// 4. Validation against the real float8 plugin

namespace {

// The single problem check() finds in a fixture, also thrown as is by validate().
std::string single_problem(const std::string& name) {
  Recipe recipe = Recipe::load(fixture(name));
  const std::vector<RecipeError> errors = recipe.check(registry());
  REQUIRE_MESSAGE(errors.size() == 1, name << ": expected one problem, got " << errors.size());
  const RecipeError thrown = recipe_error([&] { recipe.validate(registry()); });
  CHECK(std::string(thrown.what()) == errors[0].what());
  CHECK_FALSE(recipe.validated());
  return errors[0].what();
}

}  // namespace

TEST_CASE("validation: the float8 plugin is loaded with the expected schema") {
  const FormatPlugin& float8 = float8_plugin();
  for (const char* key : {"scaling", "dtype", "pow2_scales", "amax_epsilon", "amax_history_len",
                          "amax_compute_algo", "margin"})
    CHECK_MESSAGE(float8.find_option(key) != nullptr, "float8 has no option " << key);
  CHECK_FALSE(float8.takes_quantizers());
}

TEST_CASE("validation: unknown format lists the loaded formats") {
  float8_plugin();
  const std::string path = fixture("invalid_unknown_format.yaml");
  const std::string message = single_problem("invalid_unknown_format.yaml");
  CHECK_STARTS_WITH(message, path + ":5:16: rules[0].quantizer.format: unknown format 'float9'; "
                                    "loaded formats: " + registry().loaded_names() +
                                 "; did you mean 'float8'?");
  CHECK_CONTAINS(registry().loaded_names(), "float8");
  CHECK_CONTAINS(message, "qrecipe plugins -v");
}

TEST_CASE("validation: unknown option key lists the format's keys") {
  const FormatPlugin& float8 = float8_plugin();
  const std::string path = fixture("invalid_unknown_option.yaml");
  CHECK(single_problem("invalid_unknown_option.yaml") ==
        path + ":4:13: defaults.scalling: unknown option 'scalling' for format 'float8'; its "
               "options are: " + float8.option_keys() + "; did you mean 'scaling'?");
  CHECK_CONTAINS(float8.option_keys(), "scaling");
}

TEST_CASE("validation: bad enum value lists the choices") {
  float8_plugin();
  const std::string path = fixture("invalid_enum.yaml");
  CHECK(single_problem("invalid_enum.yaml") ==
        path + ":4:40: rules[0].quantizer.dtype: 'e5m3' is not a valid dtype; choose one of: "
               "e4m3, e5m2; did you mean 'e4m3' or 'e5m2'?");
}

TEST_CASE("validation: integers must be integer text") {
  float8_plugin();
  std::string path = fixture("invalid_int_text.yaml");
  CHECK(single_problem("invalid_int_text.yaml") ==
        path + ":2:54: defaults.margin: expected an integer (decimal digits, no fraction or "
               "exponent), got 'abc'");
  path = fixture("invalid_int_fraction.yaml");
  CHECK(single_problem("invalid_int_fraction.yaml") ==
        path + ":5:21: defaults.amax_history_len: expected an integer (decimal digits, no "
               "fraction or exponent), got '1.5'");
}

TEST_CASE("validation: integers out of the schema's range") {
  const OptionSchema* history = float8_plugin().find_option("amax_history_len");
  REQUIRE(history != nullptr);
  REQUIRE(history->type == QR_OPTION_INT);
  REQUIRE(history->min_value == 1);  // the fixture's 0 is just below the range
  const std::string path = fixture("invalid_int_range.yaml");
  CHECK(single_problem("invalid_int_range.yaml") ==
        path + ":5:21: defaults.amax_history_len: 0 is out of range; allowed: [1, " +
            std::to_string(static_cast<long long>(history->max_value)) + "] (inclusive)");
}

TEST_CASE("validation: bool typo") {
  float8_plugin();
  const std::string path = fixture("invalid_bool.yaml");
  CHECK(single_problem("invalid_bool.yaml") ==
        path + ":4:16: defaults.pow2_scales: expected a bool (true or false), got 'ture' "
               "(yes/no and on/off are accepted too, in any case); did you mean 'true'?");
}

TEST_CASE("validation: a map for an option that is not a quantizer") {
  float8_plugin();
  const std::string path = fixture("invalid_map_for_option.yaml");
  CHECK(single_problem("invalid_map_for_option.yaml") ==
        path + ":4:10: defaults.dtype: expected one of e4m3, e5m2, got a nested quantizer "
               "spec (a map)");
}

TEST_CASE("validation: check() reports every problem; validate() throws the first and counts") {
  float8_plugin();
  const std::string path = fixture("invalid_many.yaml");
  Recipe recipe = Recipe::load(path);
  const std::vector<RecipeError> errors = recipe.check(registry());
  REQUIRE(errors.size() == 3);
  CHECK_STARTS_WITH(errors[0].what(), path + ":3:35: defaults.dtype: 'e4m4' is not a valid "
                                             "dtype; choose one of: e4m3, e5m2");
  CHECK_STARTS_WITH(errors[1].what(), path + ":6:16: rules[0].quantizer.format: unknown format "
                                             "'fp8'; loaded formats: ");
  CHECK(std::string(errors[2].what()) ==
        path + ":8:41: rules[1].quantizer.margin: expected an integer (decimal digits, no "
               "fraction or exponent), got '-x'");
  CHECK(errors[2].location().line == 8);
  CHECK(errors[2].location().column == 41);

  const RecipeError first = recipe_error([&] { recipe.validate(registry()); });
  CHECK(std::string(first.what()) ==
        std::string(errors[0].what()) + " (and 2 more problems; run `qrecipe recipe check " +
            path + "`)");
  CHECK(first.location().line == 3);
  CHECK_FALSE(recipe.validated());
  CHECK(recipe.defaults().find("dtype")->type == QR_OPTION_STRING);  // left untouched
}

TEST_CASE("validation: success converts every option to its schema type, keeping locations") {
  float8_plugin();
  const std::string path = fixture("good_mixed.yaml");
  Recipe recipe = Recipe::load(path);
  CHECK(recipe.check(registry()).empty());
  recipe.validate(registry());
  CHECK(recipe.validated());

  const OptionValue* scaling = recipe.defaults().find("scaling");
  REQUIRE(scaling != nullptr);
  CHECK(scaling->type == QR_OPTION_ENUM);
  CHECK(scaling->string_value == "current");
  CHECK(scaling->location.str() == path + ":5:37");

  const QuantizerSpec& weight = recipe.resolve(role("linear", "weight", "layers.2.fc1"));
  const OptionValue* history = weight.find("amax_history_len");
  REQUIRE(history != nullptr);
  CHECK(history->type == QR_OPTION_INT);
  CHECK(history->int_value == 16);
  CHECK(history->location.str() == path + ":16:25");
  CHECK(weight.location.str() == path + ":14:7");
  CHECK(weight.str() == "float8{scaling=delayed, amax_history_len=16}");
  CHECK(recipe.rules()[1].match.str() ==
        "{module_type: [linear, layernorm_linear], tensor_type: weight}");  // rules kept

  // Validating again is a no-op: typed values of the right type are accepted as they are.
  recipe.validate(registry());
  CHECK(recipe.resolve(role("linear", "weight", "layers.2.fc1")).str() ==
        "float8{scaling=delayed, amax_history_len=16}");
}

TEST_CASE("validation: bool spellings, floats and signed integers") {
  float8_plugin();
  for (const char* yes : {"true", "True", "YES", "on"}) {
    Recipe recipe = Recipe::parse(std::string("version: 1\ndefaults: {format: float8, "
                                              "pow2_scales: ") + yes + "}\n");
    recipe.validate(registry());
    const OptionValue* v = recipe.defaults().find("pow2_scales");
    CHECK(v->type == QR_OPTION_BOOL);
    CHECK_MESSAGE(v->bool_value, yes);
  }
  for (const char* no : {"false", "No", "OFF"}) {
    Recipe recipe = Recipe::parse(std::string("version: 1\ndefaults: {format: float8, "
                                              "pow2_scales: ") + no + "}\n");
    recipe.validate(registry());
    CHECK_FALSE(recipe.defaults().find("pow2_scales")->bool_value);
  }
  // "1" is not a bool: integers and bools stay apart.
  CHECK(Recipe::parse("version: 1\ndefaults: {format: float8, pow2_scales: 1}\n")
            .check(registry()).size() == 1);

  // (amax_epsilon belongs to current scaling, margin to delayed: validation makes the
  // quantizer, which refuses the two together.)
  Recipe floats = Recipe::parse("version: 1\ndefaults: {format: float8, amax_epsilon: 1e-6}\n");
  floats.validate(registry());
  const OptionValue* epsilon = floats.defaults().find("amax_epsilon");
  CHECK(epsilon->type == QR_OPTION_FLOAT);
  CHECK(epsilon->float_value == 1e-6);  // from_chars rounds "1e-6" to the nearest double
  Recipe signed_int =
      Recipe::parse("version: 1\ndefaults: {format: float8, scaling: delayed, margin: +2}\n");
  signed_int.validate(registry());
  CHECK(signed_int.defaults().find("margin")->int_value == 2);

  for (const char* bad : {"abc", ".inf", "nan", "1e", "+-1", "0x10"}) {
    const auto errors = Recipe::parse(std::string("version: 1\ndefaults: {format: float8, "
                                                  "amax_epsilon: \"") + bad + "\"}\n")
                            .check(registry());
    REQUIRE_MESSAGE(errors.size() == 1, bad);
    CHECK_CONTAINS(std::string(errors[0].what()),
                   std::string("defaults.amax_epsilon: expected a number (such as 0, 1.5 or "
                               "1e-6), got '") + bad + "'");
  }
  for (const char* bad : {"1e3", "0x10", "+-1", "1 000", "99999999999999999999"}) {
    const auto errors = Recipe::parse(std::string("version: 1\ndefaults: {format: float8, "
                                                  "margin: \"") + bad + "\"}\n")
                            .check(registry());
    CHECK_MESSAGE(errors.size() == 1, bad);
  }
}

TEST_CASE("validate_spec: specs made in code, typed or text") {
  float8_plugin();
  QuantizerSpec spec;
  spec.format = "float8";
  spec.options.emplace_back("scaling", OptionValue::of_enum("delayed"));
  spec.options.emplace_back("amax_history_len", OptionValue::of_int(8));
  spec.options.emplace_back("margin", OptionValue::of_string("3"));
  spec.options.emplace_back("amax_epsilon", OptionValue::of_int(0));  // an int is a fine float
  const QuantizerSpec typed = validate_spec(spec, registry());
  CHECK(typed.str() == "float8{scaling=delayed, amax_history_len=8, margin=3, amax_epsilon=0}");
  CHECK(typed.find("margin")->type == QR_OPTION_INT);
  CHECK(typed.find("amax_epsilon")->type == QR_OPTION_FLOAT);

  QuantizerSpec wrong_type;
  wrong_type.format = "float8";
  wrong_type.options.emplace_back("pow2_scales", OptionValue::of_int(1));
  CHECK(std::string(recipe_error([&] { validate_spec(wrong_type, registry()); }).what()) ==
        "<code>: quantizer.pow2_scales: expected a bool (true or false), got a value of type "
        "int");

  QuantizerSpec out_of_range;
  out_of_range.format = "float8";
  out_of_range.options.emplace_back("amax_history_len", OptionValue::of_int(0));
  out_of_range.options.emplace_back("dtype", OptionValue::of_enum("e3m4"));
  const std::string message =
      recipe_error([&] { validate_spec(out_of_range, registry()); }).what();
  CHECK_STARTS_WITH(message, "<code>: quantizer.amax_history_len: 0 is out of range; allowed: [1, ");
  CHECK_CONTAINS(message, "(and 1 more problem)");

  QuantizerSpec none_with_options;
  none_with_options.options.emplace_back("dtype", OptionValue::of_enum("e4m3"));
  CHECK(std::string(recipe_error([&] { validate_spec(none_with_options, registry()); }).what()) ==
        "<code>: quantizer.dtype: format none keeps high precision and takes no options; "
        "remove 'dtype'");

  QuantizerSpec unknown;
  unknown.format = "float16";
  CHECK_STARTS_WITH(recipe_error([&] { validate_spec(unknown, registry()); }).what(),
                    "<code>: quantizer.format: unknown format 'float16'; loaded formats: ");
  CHECK(validate_spec(QuantizerSpec{}, registry()).is_none());
}

TEST_CASE("validation: Recipe::uniform validates like a loaded recipe") {
  float8_plugin();
  QuantizerSpec spec;
  spec.format = "float8";
  spec.options.emplace_back("dtype", OptionValue::of_string("e5m2"));
  Recipe recipe = Recipe::uniform(spec);
  recipe.validate(registry());
  CHECK(recipe.validated());
  CHECK(recipe.defaults().find("dtype")->type == QR_OPTION_ENUM);

  spec.options[0].second = OptionValue::of_string("e5m3");
  Recipe bad = Recipe::uniform(spec);
  // Code-made specs have no file: the location is "<code>" and there is no file to check.
  CHECK(std::string(recipe_error([&] { bad.validate(registry()); }).what()) ==
        "<code>: defaults.dtype: 'e5m3' is not a valid dtype; choose one of: e4m3, e5m2; did "
        "you mean 'e4m3' or 'e5m2'?");
}

// Nested specs need a format that takes quantizers: the hybrid plugin. Skipped (with a
// message) in a build without it.
bool hybrid_loaded() {
  if (registry().find("hybrid")) return true;
  MESSAGE("the hybrid plugin is not loaded; nested-spec validation not tested");
  return false;
}

TEST_CASE("validation: nested specs are typed recursively") {
  float8_plugin();
  if (!hybrid_loaded()) return;
  REQUIRE(registry().get("hybrid").takes_quantizers());
  Recipe recipe = Recipe::parse(R"(version: 1
defaults:
  format: hybrid
  rowwise: {format: float8, scaling: current, pow2_scales: yes}
  columnwise: {format: float8, dtype: e5m2}
)", "hybrid.yaml");
  recipe.validate(registry());
  const OptionValue* rowwise = recipe.defaults().find("rowwise");
  REQUIRE(rowwise != nullptr);
  CHECK(rowwise->type == QR_OPTION_QUANTIZER);
  CHECK(rowwise->location.str() == "hybrid.yaml:4:12");
  REQUIRE(rowwise->spec != nullptr);
  const OptionValue* pow2 = rowwise->spec->find("pow2_scales");
  REQUIRE(pow2 != nullptr);
  CHECK(pow2->type == QR_OPTION_BOOL);
  CHECK(pow2->bool_value);
  CHECK(pow2->location.str() == "hybrid.yaml:4:60");
  CHECK(recipe.defaults().str() ==
        "hybrid{rowwise=float8{scaling=current, pow2_scales=true}, columnwise=float8{dtype=e5m2}}");
  CHECK(recipe.defaults().find("columnwise")->spec->find("dtype")->type == QR_OPTION_ENUM);
}

TEST_CASE("validation: problems inside nested specs, and a hybrid nested in a hybrid") {
  float8_plugin();
  if (!hybrid_loaded()) return;
  const std::string path = fixture("invalid_nested.yaml");
  const std::vector<RecipeError> errors = Recipe::load(path).check(registry());
  REQUIRE(errors.size() == 3);
  CHECK(std::string(errors[0].what()) ==
        path + ":7:40: rules[0].quantizer.rowwise.dtype: 'e4m4' is not a valid dtype; choose "
               "one of: e4m3, e5m2; did you mean 'e4m3'?");
  CHECK(std::string(errors[1].what()) ==
        path + ":8:19: rules[0].quantizer.columnwise: expected a nested quantizer spec such as "
               "{format: <name>, ...}, got 'float8'");
  CHECK_STARTS_WITH(errors[2].what(),
                    path + ":12:16: rules[1].quantizer.rowwise.format: a nested spec cannot "
                           "nest again: format 'hybrid' takes nested quantizers itself, so it "
                           "cannot be one; use a format without quantizer options here (loaded: ");
  // The formats it may use instead: the loaded ones without quantizer options.
  const std::string message = errors[2].what();
  const std::string listed = message.substr(message.find("(loaded: "));
  CHECK_CONTAINS(listed, "float8");
  CHECK(listed.find("hybrid") == std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// 5. Shipped recipes

TEST_CASE("shipped recipes parse and validate against the float8 plugin") {
  float8_plugin();
  for (const char* name : {"default.yaml", "float8_delayed.yaml", "none.yaml"}) {
    Recipe recipe = Recipe::load(shipped(name));
    const auto errors = recipe.check(registry());
    CHECK_MESSAGE(errors.empty(), name << ": " << (errors.empty() ? "" : errors[0].what()));
    recipe.validate(registry());
    CHECK(recipe.validated());
  }
}

TEST_CASE("default.yaml: float8 current scaling, E4M3 input/weight, E5M2 grad_output") {
  float8_plugin();
  Recipe recipe = Recipe::load(shipped("default.yaml"));
  recipe.validate(registry());
  CHECK(recipe.name() == "default");
  for (const char* module : {"linear", "layernorm_linear", "grouped_linear"}) {
    CHECK(recipe.resolve(role(module, "input", "layers.0.fc1")).str() ==
          "float8{scaling=current, dtype=e4m3}");
    CHECK(recipe.resolve(role(module, "weight", "lm_head")).str() ==
          "float8{scaling=current, dtype=e4m3}");
    CHECK(recipe.resolve(role(module, "grad_output", "")).str() ==
          "float8{scaling=current, dtype=e5m2}");
  }
}

TEST_CASE("float8_delayed.yaml: delayed scaling, history 1024, max, margin 0") {
  float8_plugin();
  Recipe recipe = Recipe::load(shipped("float8_delayed.yaml"));
  recipe.validate(registry());
  CHECK(recipe.resolve(role("linear", "weight", "fc")).str() ==
        "float8{scaling=delayed, dtype=e4m3, amax_history_len=1024, amax_compute_algo=max, "
        "margin=0}");
  CHECK(recipe.resolve(role("linear", "grad_output", "fc")).str() ==
        "float8{scaling=delayed, dtype=e5m2, amax_history_len=1024, amax_compute_algo=max, "
        "margin=0}");
  const OptionValue* history = recipe.resolve(role("linear", "input", "fc")).find("amax_history_len");
  CHECK(history->type == QR_OPTION_INT);
  CHECK(history->int_value == 1024);
}

TEST_CASE("none.yaml: everything stays in high precision") {
  Recipe recipe = Recipe::load(shipped("none.yaml"));
  recipe.validate(registry());
  CHECK(recipe.rules().empty());
  CHECK(recipe.resolve(role("linear", "weight", "fc")).is_none());
  CHECK(recipe.resolve(role("linear", "grad_output", "fc")).is_none());
}
