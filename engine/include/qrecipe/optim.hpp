// The optimizer step of qrecipe's master-weight Adam (qrecipe.optim.FusedAdam): FP32 masters
// and moments updated by qrecipe/adam.hpp, quantized parameters requantized from their new
// master, every tensor of the step in a few multi-tensor passes (engine/src/optim/).
//
// Paths (adam_step returns the one each tensor took):
//   plain     a tensor without a quantized target: the engine updates it (its FP32 master, or
//             a plain parameter in its own dtype) and writes `copy` from the new value. CPU: the
//             loop of adam_host.hpp; CUDA: one launch for every plain and two-pass tensor.
//   fused     a quantized target whose plugin has the Adam extra (plugin_abi.h,
//             QR_EXTRA_ADAM_REQUANTIZE) and supports its quantizer on the device: ONE extra call
//             per plugin for all its tensors (a CUDA plugin: one launch per pass).
//   two_pass  any other quantized target: the engine's update (with the plain tensors), then
//             the quantizer's quantize_into of the new master: the same bytes in more passes.
// The tensors are independent, so the order in which the paths run does not change a byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qrecipe/plugin_abi.h"
#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

// One tensor of a step. Views are non-owning: the caller keeps the memory alive for the call.
struct AdamTensor {
  std::string name;           // names the parameter in errors, e.g. "'fc1.weight' (group 0)"
  qr_adam_hyper hyper{};      // hyperparameters and step count (struct_size is set by adam_step)
  TensorView param;           // updated in place: the FP32 master, or a parameter without one
                              // (F32, BF16, F16: widened, updated in FP32, rounded back)
  TensorView grad;            // F32, BF16 or F16 (read only, never reinterpreted)
  TensorView exp_avg;         // F32 or BF16
  TensorView exp_avg_sq;      // F32 or BF16
  TensorView copy;            // optional (no data pointer: none): a low-precision parameter
                              // written with the new master rounded to its dtype (F32/BF16/F16)
  QuantizedTensor* quantized = nullptr;  // optional: requantized from the new master, which
                                         // must then be F32 with the quantized tensor's numel
  const Quantizer* quantizer = nullptr;  // the quantizer that made `quantized`
};

enum class AdamPath { plain, fused, two_pass };
const char* adam_path_name(AdamPath path);  // "plain", "fused", "two_pass"

struct AdamStepOptions {
  void* stream = nullptr;   // cudaStream_t of the CUDA work (nullptr: legacy default stream)
  bool fused = true;        // false: quantized tensors take the two-pass path (tests, bench)
  // Every tensor must then be served without host synchronization: quantized tensors by a
  // fused extra that supports capture (otherwise an error naming the tensor and the reason).
  bool capturable = false;
};

// The path a quantized tensor of `q` on `device` takes (plain is never returned); `why` (when
// not null) receives the reason of a two-pass choice.
AdamPath adam_path(const Quantizer& q, Device device, bool fused, bool capturable,
                   std::string* why = nullptr);

// One optimizer step over `tensors` (all on one device; at least one). Checks every tensor
// first (shapes, dtypes, contiguity, device, step >= 1), with errors naming the tensor; then
// runs the paths above. Returns the path of each tensor, in order.
std::vector<AdamPath> adam_step(std::span<AdamTensor> tensors, const AdamStepOptions& options = {});

}  // namespace qrecipe
