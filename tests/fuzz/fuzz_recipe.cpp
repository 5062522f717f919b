// libFuzzer target: the recipe parser and validator (engine/src/recipe/) on any bytes.
//
// Invariants, beyond "no crash, no sanitizer report, no hang":
//   - the only exception is qrecipe::Error (anything else escapes and libFuzzer reports it);
//   - a recipe that `check` accepts builds an Engine and plans a linear layer (explain's work):
//     what check accepts must not fail at first use (issue 19). A violation aborts.
// The plugins come from the build's lib directory beside libqrecipe (QRECIPE_PLUGIN_PATH
// adds others). Seeds: tests/fuzz/corpus/recipe; crashes found become regression inputs in
// tests/fuzz/regressions/recipe, replayed by test_recipe_limits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "qrecipe/engine.hpp"

using namespace qrecipe;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::shared_ptr<Registry> registry = Registry::shared();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Recipe recipe = Recipe::parse(text, "<fuzz>");
    if (!recipe.check(*registry).empty()) return 0;
    try {
      Engine engine(recipe, registry);
      for (const char* module : {"linear", "grouped_linear"})
        engine.plan_linear(module, "layers.0.fc1", 128, 64, 32, GemmTarget::sm90);
    } catch (const Error& e) {
      std::fprintf(stderr, "recipe check accepted a recipe that fails at first use:\n%s\n%s\n",
                   text.c_str(), e.what());
      std::abort();
    }
  } catch (const Error&) {
    // A clear refusal is a correct answer.
  }
  return 0;
}
