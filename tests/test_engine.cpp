// Engine: role resolution (first match, cached per role, none -> no quantizer) and the shared
// delayed-scaling states (amaxes reduced by the caller, one update for all of them).
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "qrecipe/engine.hpp"

using namespace qrecipe;

namespace {
bool have_float8() { return Registry::shared()->find("float8") != nullptr; }

const char* kRecipe = R"(
version: 1
name: engine-test
defaults: {format: none}
rules:
  - match: {name: "delayed.*"}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4}
  - match: {tensor_type: [input, weight]}
    quantizer: {format: float8}
)";
}  // namespace

TEST_CASE("resolve: first match, cached per role, none gives no quantizer") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "engine-test.yaml"));
  const QuantizerRole in{"linear", "input", "layers.0.fc1"};
  const auto q = engine.resolve(in);
  REQUIRE(q != nullptr);
  CHECK(q->format() == "float8");
  CHECK(q->role() == in);
  CHECK(engine.resolve(in) == q);                                     // cached
  CHECK(engine.resolve({"linear", "weight", "layers.0.fc1"}) != q);   // one per role
  CHECK(engine.resolve({"linear", "grad_output", "layers.0.fc1"}) == nullptr);  // defaults: none
  CHECK(engine.scaling_states().empty());                             // current scaling: stateless
}

TEST_CASE("delayed scaling: one state per stateful quantizer, caller-reduced amaxes") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "engine-test.yaml"));
  const auto qa = engine.resolve({"linear", "input", "delayed.a"});
  const auto qb = engine.resolve({"linear", "input", "delayed.b"});
  REQUIRE(engine.scaling_states().size() == 2);
  // Each state is labelled with the role and format that asked for it.
  CHECK(engine.scaling_states()[0]->owner == "linear:input@delayed.a float8");
  CHECK(engine.scaling_states()[1]->owner == "linear:input@delayed.b float8");
  float xa[4] = {1.0f, -2.0f, 0.5f, 0.0f};  // amax 2
  float xb[4] = {8.0f, 0.0f, 0.0f, 0.0f};   // amax 8
  qa->quantize(TensorView(xa, DType::f32, {2, 2}), QR_USAGE_ROWWISE);
  qb->quantize(TensorView(xb, DType::f32, {2, 2}), QR_USAGE_ROWWISE);
  const auto amaxes = engine.current_amaxes();
  REQUIRE(amaxes.size() == 2);
  CHECK(amaxes[0] == 2.0f);
  CHECK(amaxes[1] == 8.0f);
  // Another rank saw a larger amax for the first tensor: the reduced value decides.
  engine.update_scaling({16.0f, 8.0f});
  CHECK(*engine.scaling_states()[0]->c.scale == 448.0f / 16.0f);
  CHECK(*engine.scaling_states()[1]->c.scale == 448.0f / 8.0f);
  CHECK(*engine.scaling_states()[0]->c.scale_inv == 1.0f / (448.0f / 16.0f));
  CHECK(engine.scaling_states()[0]->c.amax_history[0] == 0.0f);  // row 0 cleared for the next step
  CHECK(engine.scaling_states()[0]->c.amax_history[3] == 16.0f); // newest entry
  CHECK_THROWS_WITH_AS(engine.update_scaling({1.0f}), doctest::Contains("1 amaxes for 2 scaling states"),
                       Error);
}

TEST_CASE("scaling values: read, written in place (checkpoints), updated one state at a time") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "engine-test.yaml"));
  engine.resolve({"linear", "input", "delayed.a"});
  engine.resolve({"linear", "input", "delayed.b"});
  const float* scale_a = engine.scaling_states()[0]->c.scale;
  Engine::ScalingValues v;
  v.amax_history = {3.5f, 1.0f, 0.0f, 2.0f};
  v.scale = 2.0f;
  v.scale_inv = 0.5f;
  engine.set_scaling_values(0, v);
  CHECK(engine.scaling_states()[0]->c.scale == scale_a);  // same buffers: quantizers hold them
  const Engine::ScalingValues read = engine.scaling_values(0);
  CHECK(read.amax_history == v.amax_history);
  CHECK(read.scale == 2.0f);
  CHECK(read.scale_inv == 0.5f);
  CHECK(engine.scaling_values(1).scale == 1.0f);  // untouched
  // Only state 0 advances: row 0 (3.5) rolls in, max over the history is 3.5.
  engine.update_scaling_of({0});
  CHECK(*engine.scaling_states()[0]->c.scale == 448.0f / 3.5f);
  CHECK(engine.scaling_values(0).amax_history == std::vector<float>{0.0f, 0.0f, 2.0f, 3.5f});
  CHECK(*engine.scaling_states()[1]->c.scale == 1.0f);
  v.amax_history = {1.0f};
  CHECK_THROWS_WITH_AS(engine.set_scaling_values(1, v),
                       doctest::Contains("amax history of 4 steps, the values to load have 1"),
                       Error);
  CHECK_THROWS_WITH_AS(engine.scaling_values(2), doctest::Contains("this engine has 2"), Error);
  CHECK_THROWS_AS(engine.update_scaling_of({5}), Error);
}

TEST_CASE("an invalid spec made in code fails before the plugin sees it") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "engine-test.yaml"));
  QuantizerSpec bad;
  bad.format = "float8";
  bad.options.emplace_back("no_such_option", OptionValue::of_bool(true));
  CHECK_THROWS_WITH_AS(engine.make_quantizer(bad, {"linear", "input", "x"}),
                       doctest::Contains("no_such_option"), RecipeError);
  QuantizerSpec unknown;
  unknown.format = "fp8";
  CHECK_THROWS_WITH_AS(engine.make_quantizer(unknown, {"linear", "input", "x"}),
                       doctest::Contains("unknown format 'fp8'"), RecipeError);
}

// Checkpointed scaling values are validated before anything is written (issue 19): a NaN, inf,
// zero or negative scale, a scale_inv that is not the float reciprocal the engine computes
// (1.0f / scale, IEEE round to nearest), or a NaN or negative amax in the history would make
// the next forward output NaN.
TEST_CASE("scaling values: corrupt values are refused, naming the state and the key") {
  if (!have_float8()) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "engine-test.yaml"));
  engine.resolve({"linear", "input", "delayed.a"});
  const Engine::ScalingValues before = engine.scaling_values(0);
  auto values = [](float scale, float scale_inv, std::vector<float> history = {0, 1, 2, 3}) {
    Engine::ScalingValues v;
    v.scale = scale;
    v.scale_inv = scale_inv;
    v.amax_history = std::move(history);
    return v;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    Engine::ScalingValues v;
    const char* expected;
  };
  const Case cases[] = {
      {values(nan, nan), "scale is nan; a scale is a finite number > 0"},
      {values(inf, 0.0f), "scale is inf; a scale is a finite number > 0"},
      {values(0.0f, inf), "scale is 0; a scale is a finite number > 0"},
      {values(-2.0f, -0.5f), "scale is -2; a scale is a finite number > 0"},
      {values(3.0f, 0.333f), "scale_inv is 0.333 but 1/scale is 0.33333334"},
      {values(2.0f, 0.5f, {0, nan, 2, 3}), "amax_history[1] is nan"},
      {values(2.0f, 0.5f, {nan, nan, nan, nan}), "amax_history[0] is nan"},
      {values(2.0f, 0.5f, {0, 1, -2, 3}), "amax_history[2] is -2"},
  };
  for (const auto& c : cases) {
    const std::string expected = c.expected;
    CAPTURE(expected);
    try {
      engine.set_scaling_values(0, c.v);
      FAIL("expected an error");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK_MESSAGE(message.find(c.expected) != std::string::npos, message);
      CHECK_MESSAGE(message.find("linear:input@delayed.a float8") != std::string::npos, message);
    }
    // Nothing was written.
    const Engine::ScalingValues now = engine.scaling_values(0);
    CHECK(now.scale == before.scale);
    CHECK(now.amax_history == before.amax_history);
  }
  // What the engine itself writes loads: an inf amax (an input holding inf) freezes the scale
  // for the history's length, a tiny scale has a large but exact reciprocal.
  engine.set_scaling_values(0, values(3.0f, 1.0f / 3.0f, {0, inf, 2, 3}));
  engine.set_scaling_values(0, values(1e-30f, 1.0f / 1e-30f));
  CHECK(engine.scaling_values(0).scale == 1e-30f);
}
