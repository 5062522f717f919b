// Roles and who decides them (docs/recipes.md "Roles", "Recipes in Python"):
//   1. module-type families: `module_type: linear` covers every linear-like module type
//   2. rules that delegate to a factory (`factory: package.module:function`)
//   3. `share: NAME`: the spec key naming a shared scaling state
//   4. the engine's factory resolver: called once per role, its spec validated like YAML
//   5. shared delayed-scaling states: members act as one state (update, checkpoints, late joins)
//   6. Recipe::coverage: rules that match nothing, roles a rule nearly covers
//
// Plugins come through QRECIPE_PLUGIN_PATH (set by ctest); cases needing float8 say so when
// it is not built.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "qrecipe/engine.hpp"

using namespace qrecipe;

namespace {

bool have_float8() { return Registry::shared()->find("float8") != nullptr; }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
#define CHECK_CONTAINS(message, part) \
  CHECK_MESSAGE(contains((message), (part)), "message: " << (message) << "\nexpected part: " << (part))

template <class Fn>
std::string error_text(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected an error, nothing was thrown");
  return "";
}

QuantizerRole role(const std::string& m, const std::string& t, const std::string& n) {
  return {m, t, n};
}

// The text of a problem after its location ("file:l:c: " or "<origin>: "): what the validator
// says, the same whoever made the spec.
std::string after_location(const std::string& message, const std::string& location) {
  REQUIRE_MESSAGE(message.rfind(location + ": ", 0) == 0,
                  "message: " << message << "\nexpected location: " << location);
  return message.substr(location.size() + 2);
}

QuantizerSpec spec_of(const std::string& format,
                      std::vector<std::pair<std::string, OptionValue>> options = {}) {
  QuantizerSpec s;
  s.format = format;
  s.options = std::move(options);
  return s;
}

}  // namespace

// ---------------------------------------------------------------- 1. module-type families

TEST_CASE("module_type: linear covers every linear-like module type; a specific type still matches") {
  for (const char* type : {"linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"})
    CHECK_MESSAGE(module_type_covers("linear", type), type);
  CHECK(module_type_covers("layernorm_mlp", "layernorm_mlp"));
  CHECK_FALSE(module_type_covers("layernorm_mlp", "linear"));  // a type does not cover its family
  CHECK_FALSE(module_type_covers("layernorm_mlp", "layernorm_linear"));
  CHECK(module_type_covers("attention", "attention"));  // an unlisted type is its own family
  CHECK_FALSE(module_type_covers("linear", "attention"));

  const Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {module_type: layernorm_mlp, name: "*.fc2"}
    quantizer: {format: none}
  - match: {module_type: linear}
    quantizer: {format: float8}
)", "families.yaml");
  CHECK(recipe.match(role("layernorm_mlp", "weight", "mlp.fc2")) == 0);
  CHECK(recipe.match(role("layernorm_mlp", "weight", "mlp.fc1")) == 1);
  CHECK(recipe.match(role("layernorm_linear", "input", "qkv")) == 1);
  CHECK(recipe.match(role("grouped_linear", "grad_output", "experts")) == 1);
  CHECK(recipe.match(role("linear", "weight", "head")) == 1);
  CHECK(recipe.match(role("attention", "input", "attn")) == -1);
}

// ---------------------------------------------------------------- 2. factory rules

TEST_CASE("a rule may delegate to a factory; the reference is checked when parsing") {
  const Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {name: "layers.0.*"}
    factory: my_recipes.factories:first_layer
  - match: {}
    quantizer: {format: none}
)", "delegating.yaml");
  REQUIRE(recipe.rules().size() == 2);
  const RecipeRule& rule = recipe.rules()[0];
  CHECK(rule.delegates());
  CHECK(rule.factory == "my_recipes.factories:first_layer");
  CHECK(rule.decision_str() == "factory my_recipes.factories:first_layer");
  CHECK_FALSE(recipe.rules()[1].delegates());
  CHECK(recipe.check(*Registry::shared()).empty());  // nothing to validate before it answers
  CHECK(recipe.match(role("linear", "weight", "layers.0.fc1")) == 0);
  // The recipe alone cannot say what a delegated role gets.
  const std::string message = error_text([&] { recipe.resolve(role("linear", "weight", "layers.0.fc1")); });
  CHECK(message == "delegating.yaml:4:5: rules[0] delegates role linear:weight@layers.0.fc1 to "
                   "the factory 'my_recipes.factories:first_layer', which only an engine with a "
                   "factory resolver can call (the Python adapter: qrecipe.Recipe); the recipe "
                   "alone cannot say what the role gets");
  CHECK(recipe.resolve(role("linear", "weight", "layers.1.fc1")).is_none());
  CHECK(recipe.decider_str(role("linear", "weight", "layers.0.fc1")) == "rules[0] (delegating.yaml:4:5)");
}

TEST_CASE("malformed factory rules name the rule and what is allowed") {
  const auto parse_error = [](const std::string& rule) {
    return error_text([&] { Recipe::parse("version: 1\nrules:\n" + rule, "f.yaml"); });
  };
  CHECK(parse_error("  - {match: {}, quantizer: {format: none}, factory: a:b}\n") ==
        "f.yaml:3:53: rules[0].factory: a rule gives either 'quantizer' or 'factory', not both; "
        "keep one");
  CHECK_CONTAINS(parse_error("  - {match: {}}\n"),
                 "rules[0]: missing required key 'quantizer', e.g. `quantizer: {format: <name>}` "
                 "(`qrecipe plugins` lists the formats) or `quantizer: {format: none}` (or "
                 "`factory: package.module:function` to let a Python function decide)");
  CHECK(parse_error("  - {match: {}, factory: my_module}\n") ==
        "f.yaml:3:26: rules[0].factory: expected 'package.module:function' (a Python module to "
        "import and the function in it that decides each role), got 'my_module': no ':' between "
        "the module and the function");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: 'a:b:c'}\n"), "more than one ':'");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: 'a.:b'}\n"), "'a.' is not a dotted Python name");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: 'my-mod:f'}\n"), "'my-mod' is not a dotted Python name");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: '1a:f'}\n"), "'1a' is not a dotted Python name");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: ':f'}\n"), "an empty module or function name");
  CHECK_CONTAINS(parse_error("  - {match: {}, factory: [a, b]}\n"), "rules[0].factory: expected a string, got a list");
  // Classes and nested functions are dotted paths inside the module.
  CHECK(Recipe::parse("version: 1\nrules:\n  - {match: {}, factory: 'pkg.mod:Recipes.weights'}\n")
            .rules()[0].factory == "pkg.mod:Recipes.weights");
}

// ---------------------------------------------------------------- 3. share

TEST_CASE("share: an engine key beside format, validated, shown last, top level only") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, share: weights, amax_history_len: 8}
)", "share.yaml");
  recipe.validate(*Registry::shared());
  const QuantizerSpec& spec = recipe.rules()[0].quantizer;
  CHECK(spec.share == "weights");
  CHECK(spec.find("share") == nullptr);  // never an option the plugin sees
  CHECK(spec.str() == "float8{scaling=delayed, amax_history_len=8, share=weights}");

  const auto check_one = [](const std::string& text) {
    const auto errors = Recipe::parse(text, "s.yaml").check(*Registry::shared());
    REQUIRE(errors.size() == 1);
    return std::string(errors[0].what());
  };
  CHECK(check_one("version: 1\ndefaults: {format: float8, share: ''}\n") ==
        "s.yaml:2:35: defaults.share: the name of a shared scaling state is empty; give a name, "
        "e.g. `share: weights`, or remove the key");
  CHECK(check_one("version: 1\ndefaults: {format: float8, share: {format: none}}\n") ==
        "s.yaml:2:35: defaults.share: expected the name of a shared scaling state (a string), got "
        "a nested quantizer spec (a map)");
  if (Registry::shared()->find("hybrid") != nullptr) {
    CHECK(check_one("version: 1\ndefaults: {format: hybrid, rowwise: {format: float8, scaling: "
                    "delayed, share: w}, columnwise: {format: float8}}\n") ==
          "s.yaml:2:79: defaults.rowwise.share: a nested quantizer spec (format 'float8') cannot "
          "share a scaling state; `share` belongs to a top-level quantizer spec, beside its "
          "`format`");
  }
  // A spec made in code carries it as a field; on format none it means nothing.
  QuantizerSpec none;
  none.share = "w";
  CHECK(error_text([&] { validate_spec(none, *Registry::shared()); }) ==
        "<code>: quantizer.share: format none keeps high precision and no scaling state to share; "
        "remove 'share'");
}

// ---------------------------------------------------------------- 4. factory resolver

TEST_CASE("a delegated role asks the factory resolver once; its spec is validated like YAML") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  const Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {name: head}
    quantizer: {format: none}
  - match: {tensor_type: weight}
    factory: recipes_py:weights
  - match: {}
    quantizer: {format: float8, scaling: current}
)", "d.yaml");
  Engine engine(recipe);
  // Without a resolver the delegated role fails, naming the rule and the factory.
  CHECK(error_text([&] { engine.resolve(role("linear", "weight", "fc")); }) ==
        "d.yaml:6:5: rules[1] delegates role linear:weight@fc to the factory 'recipes_py:weights', "
        "but this engine has no factory resolver: factories are Python functions, which run under "
        "the Python adapter (qrecipe.Recipe)");
  CHECK(engine.resolve(role("linear", "input", "fc")) != nullptr);  // other rules still work

  std::vector<FactoryCall> calls;
  QuantizerSpec answer = spec_of("float8", {{"scaling", OptionValue::of_enum("delayed")},
                                            {"amax_history_len", OptionValue::of_int(4)}});
  engine.set_factory_resolver([&](const FactoryCall& call) {
    calls.push_back(call);
    return FactorySpec{answer, "factory 'recipes_py.weights' (recipes_py.py:3)"};
  });
  const QuantizerRole w{"layernorm_linear", "weight", "fc"};
  const auto q = engine.resolve(w);
  REQUIRE(q != nullptr);
  CHECK(q->spec().str() == "float8{scaling=delayed, amax_history_len=4}");
  CHECK(engine.resolve(w) == q);  // cached: the factory ran once
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].factory == "recipes_py:weights");
  CHECK(calls[0].rule == "rules[1] (d.yaml:6:5)");
  CHECK(calls[0].role == w);
  CHECK(engine.origin(w) == "rules[1] (d.yaml:6:5) -> factory 'recipes_py.weights' (recipes_py.py:3)");
  CHECK(engine.origin(role("linear", "input", "fc")) == "rules[2] (d.yaml:8:5)");
  CHECK(engine.origin(role("linear", "weight", "head")) == "rules[0] (d.yaml:4:5)");

  // A bad answer gets the validator's own words, located at the factory and the role.
  answer = spec_of("float8", {{"scaling", OptionValue::of_string("delay")}});
  const std::string origin = "factory 'recipes_py.weights' (recipes_py.py:3), role linear:weight@bad";
  const std::string bad = error_text([&] { engine.resolve(role("linear", "weight", "bad")); });
  Recipe yaml = Recipe::parse("version: 1\ndefaults: {format: float8, scaling: delay}\n", "y.yaml");
  const auto yaml_errors = yaml.check(*Registry::shared());
  REQUIRE(yaml_errors.size() == 1);
  const std::string yaml_text = after_location(yaml_errors[0].what(), "y.yaml:2:37");
  CHECK(after_location(bad, origin) == "quantizer" + yaml_text.substr(yaml_text.find('.')));
  CHECK(bad == origin + ": quantizer.scaling: 'delay' is not a valid scaling; choose one of: "
               "current, delayed; did you mean 'delayed'?");
  answer = spec_of("fp9");
  CHECK_CONTAINS(error_text([&] { engine.resolve(role("linear", "weight", "fp9")); }),
                 "factory 'recipes_py.weights' (recipes_py.py:3), role linear:weight@fp9: "
                 "quantizer.format: unknown format 'fp9'; loaded formats: ");
  // A spec the plugin itself refuses (options that contradict each other) names the role too.
  answer = spec_of("float8", {{"scaling", OptionValue::of_enum("current")},
                              {"margin", OptionValue::of_int(1)}});
  CHECK_CONTAINS(error_text([&] { engine.resolve(role("linear", "weight", "contradict")); }),
                 "role linear:weight@contradict gets float8{scaling=current, margin=1} from "
                 "rules[1] (d.yaml:6:5) -> factory 'recipes_py.weights' (recipes_py.py:3): ");
  // Format none from a factory keeps the role in high precision.
  answer = spec_of("none");
  CHECK(engine.resolve(role("linear", "weight", "hp")) == nullptr);
}

TEST_CASE("Recipe::from_factory: every role goes to the factory; origin is the factory's own") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::from_factory("tests.qf", "factory-recipe", "<factory tests.qf>"));
  CHECK(engine.recipe().name() == "factory-recipe");
  engine.set_factory_resolver([](const FactoryCall& call) {
    return FactorySpec{call.role.tensor_type == "weight" ? spec_of("float8") : spec_of("none"),
                       "factory 'tests.qf' (tests.py:1)"};
  });
  CHECK(engine.resolve(role("linear", "weight", "a")) != nullptr);
  CHECK(engine.resolve(role("linear", "input", "a")) == nullptr);
  CHECK(engine.origin(role("linear", "weight", "a")) == "factory 'tests.qf' (tests.py:1)");
}

// ---------------------------------------------------------------- 5. shared states

namespace {
const char* kShared = R"(
version: 1
rules:
  - match: {name: "shared.*", tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4, share: w}
  - match: {tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4}
)";
// Share groups whose members cannot share: the recipe check makes every rule's quantizer for
// every tensor type it matches in one engine, so these fail at check time (before, they
// failed at the first use of the second member).
const char* kSharedConflicts = R"(
version: 1
rules:
  - match: {name: "shared.*", tensor_type: [weight, grad_output]}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4, share: w}
  - match: {name: "other.*", tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 8, share: w}
  - match: {name: "current.*"}
    quantizer: {format: float8, scaling: current, share: w}
)";

void quantize_amax(Quantizer& q, float amax) {
  float x[4] = {amax, 0.0f, -0.5f, 0.25f};
  q.quantize(TensorView(x, DType::f32, {2, 2}), QR_USAGE_ROWWISE);
}
}  // namespace

TEST_CASE("shared delayed scaling: roles with one share name act as one state") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kShared, "shared.yaml"));
  const auto a = engine.resolve(role("linear", "weight", "shared.a"));
  const auto b = engine.resolve(role("linear", "weight", "shared.b"));
  const auto own = engine.resolve(role("linear", "weight", "own"));
  REQUIRE(engine.scaling_states().size() == 3);  // every role keeps its own buffers ...
  CHECK(engine.scaling_states()[0]->share == "w");
  CHECK(engine.scaling_states()[1]->share == "w");
  CHECK(engine.scaling_states()[2]->share.empty());
  quantize_amax(*a, 2.0f);
  quantize_amax(*b, 8.0f);
  quantize_amax(*own, 2.0f);
  CHECK(engine.current_amaxes() == std::vector<float>{2.0f, 8.0f, 2.0f});  // ... per member
  CHECK(engine.scaling_values(0).amax_history[0] == 8.0f);  // the group's row 0
  engine.update_scaling();
  // ... but update as one: the group's amax is the max over its members.
  CHECK(*engine.scaling_states()[0]->c.scale == 448.0f / 8.0f);
  CHECK(*engine.scaling_states()[1]->c.scale == 448.0f / 8.0f);
  CHECK(*engine.scaling_states()[2]->c.scale == 448.0f / 2.0f);
  CHECK(engine.scaling_values(0).amax_history == std::vector<float>{0, 0, 0, 8});
  CHECK(engine.scaling_values(1).amax_history == std::vector<float>{0, 0, 0, 8});

  // Caller-reduced amaxes (distributed): the group takes the max of its members' values.
  quantize_amax(*a, 1.0f);
  engine.update_scaling({4.0f, 16.0f, 1.0f});
  CHECK(*engine.scaling_states()[0]->c.scale == 448.0f / 16.0f);
  CHECK(*engine.scaling_states()[1]->c.scale == 448.0f / 16.0f);

  // A member resolved later starts from the group's history and scale.
  const auto c = engine.resolve(role("layernorm_mlp", "weight", "shared.c"));
  REQUIRE(engine.scaling_states().size() == 4);
  CHECK(engine.scaling_values(3).amax_history == engine.scaling_values(0).amax_history);
  CHECK(*engine.scaling_states()[3]->c.scale == 448.0f / 16.0f);
  quantize_amax(*c, 32.0f);
  engine.update_scaling();
  for (std::size_t i : {0u, 1u, 3u}) CHECK(*engine.scaling_states()[i]->c.scale == 448.0f / 32.0f);
}

TEST_CASE("shared delayed scaling: checkpoints read and write the group as one state") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kShared, "shared.yaml"));
  const auto a = engine.resolve(role("linear", "weight", "shared.a"));
  const auto b = engine.resolve(role("linear", "weight", "shared.b"));
  quantize_amax(*a, 3.0f);
  quantize_amax(*b, 5.0f);
  // Saved mid-step: every member reads the group's row 0.
  const Engine::ScalingValues saved_a = engine.scaling_values(0), saved_b = engine.scaling_values(1);
  CHECK(saved_a.amax_history[0] == 5.0f);
  CHECK(saved_b.amax_history[0] == 5.0f);

  // Loading one member sets the whole group; loading both gives the same group.
  for (const bool both : {false, true}) {
    Engine fresh(Recipe::parse(kShared, "shared.yaml"));
    fresh.resolve(role("linear", "weight", "shared.a"));
    fresh.resolve(role("linear", "weight", "shared.b"));
    Engine::ScalingValues loaded = saved_a;
    loaded.scale = 2.0f;
    loaded.scale_inv = 0.5f;
    fresh.set_scaling_values(0, loaded);
    if (both) {
      Engine::ScalingValues also = saved_b;
      also.scale = 2.0f;
      also.scale_inv = 0.5f;
      fresh.set_scaling_values(1, also);
    }
    CHECK(*fresh.scaling_states()[1]->c.scale == 2.0f);
    CHECK(fresh.scaling_values(1).amax_history[0] == 5.0f);
    fresh.update_scaling_of({both ? 1u : 0u});  // a pending update runs for the whole group
    CHECK(*fresh.scaling_states()[0]->c.scale == 448.0f / 5.0f);
    CHECK(*fresh.scaling_states()[1]->c.scale == 448.0f / 5.0f);
    CHECK(fresh.scaling_values(0).amax_history == fresh.scaling_values(1).amax_history);
  }
}

TEST_CASE("shared delayed scaling: different settings or no state to share fail the check") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  const Recipe recipe = Recipe::parse(kSharedConflicts, "shared.yaml");
  std::string all;
  for (const auto& e : recipe.check(*Registry::shared())) all += std::string(e.what()) + "\n";
  INFO(all);
  // A gradient's default dtype is E5M2: another fp8 max than the weight's.
  CHECK_CONTAINS(all, "shared.yaml:5:16: rules[0].quantizer: ");
  CHECK_CONTAINS(all, "the delayed-scaling state shared as 'w' was made by linear:weight@shared.* "
                      "float8 with amax_history_len 4, amax_compute_algo max, margin 0, fp8 max "
                      "448, but linear:grad_output@shared.* float8 asks for it with "
                      "amax_history_len 4, amax_compute_algo max, margin 0, fp8 max 57344; roles "
                      "that share a state need the same delayed-scaling settings and FP8 dtype "
                      "(or another share name)");
  CHECK_CONTAINS(all, "shared.yaml:7:16: rules[1].quantizer: ");
  CHECK_CONTAINS(all, "asks for it with amax_history_len 8, amax_compute_algo max, margin 0, "
                      "fp8 max 448");
  CHECK_CONTAINS(all, "shared.yaml:9:16: ");
  CHECK_CONTAINS(all, "keeps no scaling state, so there is nothing to share under 'w'");
  CHECK_THROWS_AS(Engine(Recipe::parse(kSharedConflicts, "shared.yaml")), RecipeError);
}

// ---------------------------------------------------------------- 6. coverage

TEST_CASE("coverage: rules that match nothing or never decide, roles a rule nearly covers") {
  const Recipe recipe = Recipe::parse(R"(
version: 1
rules:
  - match: {name: "layers.0.*"}
    quantizer: {format: none}
  - match: {name: "layer.*"}
    quantizer: {format: float8}
  - match: {module_type: linear, name: "layers.*"}
    quantizer: {format: float8}
  - match: {name: "layers.0.fc"}
    quantizer: {format: float8}
  - match: {module_type: linear, name: "head"}
    quantizer: {format: float8}
)", "cov.yaml");
  std::vector<QuantizerRole> roles;
  for (const char* t : {"input", "weight", "grad_output"}) {
    roles.push_back(role("linear", t, "layers.0.fc"));
    roles.push_back(role("layernorm_mlp", t, "layers.1.mlp.fc1"));
    roles.push_back(role("attention_proj", t, "layers.1.attn"));
    roles.push_back(role("linear", t, "lm_head"));
  }
  const auto lines = recipe.coverage(roles);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "rules[1] {name: layer.*} (cov.yaml:6:5) matches none of the roles (module "
                    "types: linear, layernorm_mlp, attention_proj; names: layers.0.fc, "
                    "layers.1.mlp.fc1, layers.1.attn, lm_head)");
  CHECK(lines[1] == "rules[3] {name: layers.0.fc} (cov.yaml:10:5) never decides a role: every "
                    "role it matches is decided by an earlier rule (rules[0])");
  CHECK(lines[2] == "rules[4] {module_type: linear, name: head} (cov.yaml:12:5) matches none of "
                    "the roles (module types: linear, layernorm_mlp, attention_proj; names: "
                    "layers.0.fc, layers.1.mlp.fc1, layers.1.attn, lm_head)");
  CHECK(lines[3] == "attention_proj layers.1.attn: input, weight, grad_output get no "
                    "quantization (no rule matches them and the defaults are none), but rules[2] "
                    "{module_type: linear, name: layers.*} (cov.yaml:8:5) would give them float8 "
                    "if its module_type [linear] covered attention_proj; add attention_proj to "
                    "it, or remove the key");
  CHECK(lines[4] == "linear lm_head: input, weight, grad_output get no quantization (no rule "
                    "matches them and the defaults are none), but rules[4] {module_type: linear, "
                    "name: head} (cov.yaml:12:5) would give them float8 if its name [head] "
                    "matched 'lm_head'; check the glob (`*` matches dots too, the whole name "
                    "must match)");
  CHECK(recipe.coverage({}).empty());
  // Defaults that quantize: nothing is left in high precision by accident.
  const Recipe quantizing = Recipe::parse(
      "version: 1\ndefaults: {format: float8}\nrules:\n  - {match: {name: x}, quantizer: {format: none}}\n");
  CHECK(quantizing.coverage({role("linear", "input", "y")}) ==
        std::vector<std::string>{"rules[0] {name: x} (<string>:4:5) matches none of the roles "
                                 "(module types: linear; names: y)"});
}
