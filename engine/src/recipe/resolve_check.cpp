// The second pass of a recipe check (internal.hpp): each spec that passed the schema pass is
// made into a quantizer by its plugin, so that what only the plugin knows fails at check time
// with the recipe's file:line:column instead of at first use: option combinations
// (amax_history_len without delayed scaling, a seed without stochastic_rounding), the own
// options of a sub-quantizer (a format built from others makes them through the host), and a direction
// the quantizer cannot lay out at all.
//
// A rule is tried for every tensor type it can match (all three when it names none: plugins
// pick defaults by tensor type, e.g. an E5M2 dtype for grad_output), under its first module
// type (or linear) and its first name glob as the module name ("*" when it names none). The quantizers live in a
// throwaway engine on the CPU: their scaling states go with it, and nothing is cached.
// What stays for first use: shape-dependent errors (a GEMM needing dimensions divisible by
// 16) and device-dependent ones (a format without kernels for the tensor's device).
#include <memory>
#include <string>
#include <vector>

#include "qrecipe/engine.hpp"
#include "recipe/internal.hpp"

namespace qrecipe::recipe_internal {
namespace {

// A nominal shape every shipped block geometry tiles exactly (1x16 .. 128x128).
constexpr std::int64_t kProbeRows = 128, kProbeCols = 128;

// Why `spec` cannot serve `role` ("" when it can): the plugin's own message.
std::string probe(Engine& engine, const QuantizerSpec& located, const QuantizerRole& role) {
  // Without its location, so the plugin's message comes back bare (the Problem adds the
  // location once).
  QuantizerSpec spec = located;
  spec.location = {};
  try {
    const auto q = engine.make_quantizer(spec, role);
    if (!q) return "";
    for (const auto direction : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      try {
        q->layout(kProbeRows, kProbeCols, direction);
      } catch (const Error& e) {
        return "format '" + spec.format + "' cannot lay out the " + direction_name(direction) +
               " direction that the GEMMs of role " + role.str() + " need: " + e.message();
      }
    }
  } catch (const RecipeError& e) {
    // The engine's own refusals (a `share` on a quantizer without scaling state) carry a
    // location, here the empty one: keep just the words.
    const std::string prefix = e.location().str() + ": ";
    const std::string& message = e.message();
    return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

std::vector<Problem> resolve_problems(const std::vector<SpecToResolve>& specs,
                                      const Registry& registry) {
  std::vector<Problem> problems;
  if (specs.empty()) return problems;
  // Engine takes shared ownership; this registry outlives the engine made here, so a
  // non-owning pointer (aliasing constructor, empty owner) is enough. The engine only reads it.
  std::shared_ptr<Registry> view(std::shared_ptr<Registry>(), const_cast<Registry*>(&registry));
  Engine engine(RecipeAccess::validated_uniform(QuantizerSpec{}), view);
  for (const SpecToResolve& item : specs) {
    const QuantizerSpec& spec = *item.spec;
    if (spec.is_none()) continue;
    const std::string module_type = item.match && !item.match->module_types.empty()
                                        ? item.match->module_types.front()
                                        : "linear";
    const std::string name =
        item.match && !item.match->names.empty() ? item.match->names.front() : "*";
    std::vector<std::string> tensor_types;
    if (item.match && !item.match->tensor_types.empty())
      tensor_types = item.match->tensor_types;
    else
      tensor_types.assign(std::begin(kTensorTypes), std::end(kTensorTypes));
    for (const std::string& tensor_type : tensor_types) {
      const std::string why = probe(engine, spec, {module_type, tensor_type, name});
      if (why.empty()) continue;
      problems.push_back({spec.location, item.path, why});
      break;  // one problem per spec: the other tensor types usually fail the same way
    }
  }
  return problems;
}

}  // namespace qrecipe::recipe_internal
