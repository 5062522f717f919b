// Engine: a validated recipe plus the loaded plugins; resolves roles to quantizers (cached
// per role) and owns the shared delayed-scaling state (docs/architecture.md, "Data flow", "Where
// the scaling state lives").
//
// Lifetime: quantizers returned by resolve() reference the engine's scaling state; keep the
// Engine alive while they are used. Thread safety: resolve() and make_quantizer() may be called
// from any threads (resolve makes one quantizer per role however many threads ask); quantize
// calls on one quantizer may run concurrently (a delayed-scaling quantizer max-accumulates its
// step amax atomically on the CPU); update_scaling() and set_scaling_values() must not run
// concurrently with quantize calls that use the states (tests/test_threads.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "qrecipe/gemm.hpp"
#include "qrecipe/grouped_tensor.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

namespace detail {
class DeviceScalingTable;  // engine/src/scaling/scaling_cuda.hpp (CUDA builds)
}

// One delayed-scaling state (amax history + scale) owned by the engine. Its buffers live on
// the device the plugin asked for (request.device): host memory from the engine's allocator,
// or device memory from cuda_allocator() (then c.amax_history / c.scale are device pointers).
struct ScalingState {
  qr_scaling_request request{};
  std::string owner;  // "role format" of the quantizer that asked (logs, checkpoints)
  std::string share;  // the spec's `share` name: states with the same name act as one ("" = own)
  Buffer history, scale, scale_inv;
  qr_scaling_state c{};
};

// A role whose recipe rule delegates to a factory (RecipeRule::factory): what the engine asks
// the host that runs factories (the Python adapter), and what it answers.
struct FactoryCall {
  std::string factory;  // the rule's reference, e.g. "my_recipes:qfactory"
  std::string rule;     // the deciding rule, "rules[2] (recipe.yaml:7:5)"
  QuantizerRole role;
};
struct FactorySpec {
  QuantizerSpec spec;   // validated by the engine like a recipe's spec (format none allowed)
  std::string origin;   // where it came from, for errors and explain: "factory
                        // 'my_recipes.qfactory' (my_recipes.py:12)"
};
using FactoryResolver = std::function<FactorySpec(const FactoryCall&)>;

// How the three GEMMs of one linear layer y = x W^T run under the recipe (see plan_linear).
struct LinearPlan {
  struct Gemm {
    GemmKind kind;
    OperandTraits a, b;
    std::int64_t m = 0, n = 0, k = 0;
    GemmPlan plan;
  };
  QuantizerRole input, weight, grad_output;
  std::shared_ptr<Quantizer> input_q, weight_q, grad_output_q;  // nullptr = high precision
  Gemm fprop, dgrad, wgrad;
};

class Engine {
 public:
  // Validates the recipe against the registry (throws RecipeError).
  Engine(Recipe recipe, std::shared_ptr<Registry> registry = Registry::shared(),
         std::shared_ptr<Allocator> allocator = cpu_allocator());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Recipe& recipe() const { return recipe_; }
  Registry& registry() const { return *registry_; }
  const std::shared_ptr<Allocator>& allocator() const { return allocator_; }

  // The quantizer the recipe gives `role` (nullptr for format none); cached per role. A rule
  // that delegates to a factory asks the factory resolver (once per role): its spec is
  // validated like the recipe's own, and an error names the factory's origin and the role.
  std::shared_ptr<Quantizer> resolve(const QuantizerRole& role);
  // Where resolve(role) got its spec: "rules[2] (recipe.yaml:7:5)", "defaults (...)", or for a
  // delegating rule "rules[2] (...) -> <the factory's origin>". Resolves the role.
  std::string origin(const QuantizerRole& role);
  // The host's factory runner (the Python adapter installs one per engine). Without one, a role
  // whose rule delegates is an error naming the rule and the factory.
  void set_factory_resolver(FactoryResolver resolver);
  // An uncached quantizer for an explicit spec (validated first).
  std::shared_ptr<Quantizer> make_quantizer(const QuantizerSpec& spec, const QuantizerRole& role);

  // Resolves the three roles of a linear layer (module `name` of `module_type`, weight
  // [out_features, in_features], `tokens` rows of input) and plans its GEMMs on `target`.
  // A quantizer that cannot provide a direction a GEMM needs, or cannot lay out the shape, is
  // an error naming the module, the GEMM and the role: reported here, before step 1.
  LinearPlan plan_linear(const std::string& module_type, const std::string& name,
                         std::int64_t in_features, std::int64_t out_features, std::int64_t tokens,
                         GemmTarget target);

  // Grouped quantization (MoE experts stored as one tensor; engine/src/engine_grouped.cpp).
  // `src` is [sum(group_rows), cols] as 2-D (leading dims flattened: a contiguous tensor, or
  // a 2-D view with any strides); group g is its group_rows[g] consecutive rows after those
  // of groups 0..g-1. Returns one QuantizedTensor per group (group_rows[g] x cols, `usage`,
  // buffers from `allocator`, or the engine's when null), each byte-identical to
  // q.quantize(rows of group g, usage) -- the groups quantized one after the other with
  // options.rng_offset + g as offset when one is given. When q's plugin fills the optional
  // quantize_grouped extra (plugin_abi.h) that is ONE plugin call (a CUDA plugin: one amax
  // pass and one cast launch for all groups); otherwise the engine loops over the groups
  // calling `quantize` (same bytes, one call per group). options.amax (a caller-reduced amax)
  // is given to every group's quantize as it is, so it always takes the loop. Errors name the quantizer, the group and the
  // shapes; at least one group, row counts >= 0 that sum to the source's rows.
  std::vector<QuantizedTensor> quantize_grouped(const Quantizer& q, const TensorView& src,
                                                std::span<const std::int64_t> group_rows,
                                                std::uint32_t usage,
                                                const QuantizeOptions& options = {},
                                                std::shared_ptr<Allocator> allocator = nullptr);
  // The same into existing tensors (dst[g] is group_rows[g] x cols; all hold the same usage,
  // which is what is produced): in-place requantization of grouped weights.
  void quantize_grouped_into(const Quantizer& q, const TensorView& src,
                             std::span<const std::int64_t> group_rows,
                             std::span<QuantizedTensor* const> dst,
                             const QuantizeOptions& options = {});
  // Whether q's plugin provides the grouped extra (one call for all groups) rather than the
  // engine's per-group loop.
  static bool has_grouped_quantize(const Quantizer& q) {
    return q.plugin().quantize_grouped_extra() != nullptr;
  }
  // Grouped quantization by GroupSplits (grouped_tensor.hpp). Splits the host can read (sizes,
  // or offsets in host memory) give one QuantizedTensor per group, exactly the overload above.
  // Splits only the device knows (CUDA offsets, e.g. a router's output) give ONE device-split
  // tensor, through the plugin's device extras (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE:
  // the same bytes per group, no host synchronization); a plugin without them is an error
  // (QR_STATUS_UNSUPPORTED) naming the format and what to do. options.amax is refused there.
  // The tensor points to splits.offsets, which the caller keeps alive while it is used.
  GroupedQuantizedTensor quantize_grouped(const Quantizer& q, const TensorView& src,
                                          const GroupSplits& splits, std::uint32_t usage,
                                          const QuantizeOptions& options = {},
                                          std::shared_ptr<Allocator> allocator = nullptr);
  // Whether q's plugin quantizes device-split groups (the device extras) for `device`.
  static bool has_grouped_device_quantize(const Quantizer& q, Device device) {
    return device.is_cpu() || (q.plugin().quantize_grouped_device_extra() != nullptr &&
                               q.plugin().supports(device));
  }

  // Delayed scaling: the step's amax of every state (history row 0), in creation order, for the
  // caller to max-reduce across ranks; then update_scaling(reduced) applies the update of
  // docs/numerics.md (delayed scaling) to every state. update_scaling() with no argument uses row 0
  // as is.
  // CUDA states are updated on their device, one kernel launch per device, asynchronously on
  // the stream `stream_for(device)` returns (cudaStream_t; an empty function or nullptr: the
  // legacy default stream): without reduced amaxes the step's amax is read on the device, so
  // a training step's update costs one launch and no host synchronization.
  using StreamFor = std::function<void*(int device)>;
  std::vector<float> current_amaxes() const;
  void update_scaling();
  void update_scaling_on_streams(const StreamFor& stream_for);
  void update_scaling(const std::vector<float>& reduced_amaxes);
  // The same update for the states `indices` only, each with its own row 0 (no reduction): a
  // checkpoint saved between a step and its update is resumed by updating the loaded states.
  void update_scaling_of(const std::vector<std::size_t>& indices);
  const std::vector<std::unique_ptr<ScalingState>>& scaling_states() const { return states_; }

  // The values of state `index` (of scaling_states()) read through the host, and writing them
  // back in place (the buffers and the pointers quantizers hold stay the same): checkpoints.
  // CUDA states are copied on the legacy default stream, synchronized. set_scaling_values
  // checks the history length and the index; the caller matches states by owner.
  struct ScalingValues {
    std::vector<float> amax_history;
    float scale = 1.0f;
    float scale_inv = 1.0f;
  };
  ScalingValues scaling_values(std::size_t index) const;
  void set_scaling_values(std::size_t index, const ScalingValues& values);
  // Throws (naming the state's owner and the key) unless `values` could be state `index`'s:
  // the history length matches; the scale is finite and > 0; scale_inv is exactly
  // 1.0f / scale (the IEEE float division the update computes); every amax is >= 0 and not
  // NaN (+inf is kept: an input holding inf records it, and it freezes the scale for the
  // history's length). set_scaling_values checks this first; a loader of several states
  // checks them all before writing any.
  void check_scaling_values(std::size_t index, const ScalingValues& values) const;

  // Called through the host table (host_api.cpp) for the quantizer this thread is creating
  // (make_quantizer), with its owner and its spec's `share` name. A state with a
  // share name is one of a group that acts as ONE state: every member starts from the group's
  // values, quantizers read their member's scale and max-accumulate into its history row 0 as
  // usual, and every update, checkpoint read or write treats the group as one state (the step's
  // amax is the max over the members' row 0; all members get the same history and scale).
  // Members keep their own buffers, so each follows its own quantizer's device. A member whose
  // request (history length, algorithm, margin, fp8 max) differs from the group's is an error
  // naming both owners.
  qr_scaling_state acquire_scaling_state(const qr_scaling_request& request,
                                         const std::string& owner, const std::string& share = "");
  // "role format" of the quantizer this thread is creating (the owner of a state it requests)
  // and its spec's share name.
  static std::string creating_owner();
  static std::string creating_share();
  // Moves the state whose history is `amax_history` to `device` (values kept, old buffers
  // freed, position in scaling_states() unchanged) and returns its new pointers. Copies go
  // through the legacy default stream, synchronized.
  qr_scaling_state move_scaling_state(const float* amax_history, const qr_device& device);
  qr_host_context* host_context() { return reinterpret_cast<qr_host_context*>(this); }
  static Engine* from_host_context(qr_host_context* ctx) { return reinterpret_cast<Engine*>(ctx); }

 private:
  // reduced_amaxes empty: each state's own row 0 (read on its device for CUDA states).
  void update_states(const std::vector<std::size_t>& indices,
                     const std::vector<float>& reduced_amaxes, const StreamFor& stream_for);
  // Counts a state acquired by the quantizer this thread is creating (make_quantizer checks
  // that a spec with a share name got one).
  static void note_state_acquired();
  // The members of state `index`'s share group (just `index` for a state of its own).
  std::vector<std::size_t> group_of(std::size_t index) const;
  // `indices` plus every other member of their groups, in ascending order.
  std::vector<std::size_t> with_groups(const std::vector<std::size_t>& indices) const;
  // The spec a role gets and where from (a factory's answer, stamped with its origin).
  std::pair<QuantizerSpec, std::string> spec_for(const QuantizerRole& role);

  Recipe recipe_;
  std::shared_ptr<Registry> registry_;
  std::shared_ptr<Allocator> allocator_;
  FactoryResolver factory_resolver_;
  std::mutex mutex_;
  // Serializes resolve()'s creations: two threads resolving one role must not both create a
  // quantizer (the loser's scaling state would stay behind as an orphan with the same owner).
  // Not mutex_: creating a quantizer takes mutex_ (scaling states) and may nest creations (a
  // format built from others makes its sub-quantizers through the host table, through make_quantizer). Recursive: a factory
  // rule's resolver may resolve another role on the same thread.
  std::recursive_mutex resolve_mutex_;
  std::unordered_map<QuantizerRole, std::shared_ptr<Quantizer>> cache_;
  std::unordered_map<QuantizerRole, std::string> origins_;
  std::vector<std::unique_ptr<ScalingState>> states_;
  // share name -> indices into states_ of its members; member -> its group (states of their
  // own are absent).
  std::map<std::string, std::vector<std::size_t>> share_groups_;
  std::unordered_map<std::size_t, std::string> group_name_;
  // Bumped whenever a state is added or moves to another device: the device update tables
  // built from the states' pointers are re-uploaded only then.
  std::uint64_t states_version_ = 1;
  std::map<int, std::shared_ptr<detail::DeviceScalingTable>> device_tables_;
};

}  // namespace qrecipe
