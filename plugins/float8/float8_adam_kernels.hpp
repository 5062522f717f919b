// CUDA entry of the float8 plugin's fused Adam + requantize extra (float8_adam_kernels.cu,
// compiled only with CUDA; AdamPlan is plain data and used by float8.cpp in every build). No
// CUDA types, so the host compiler can include it.
#pragma once

#include <span>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::float8::cuda {

// What the fused kernels need of one float8 quantizer (Float8Quantizer::adam_plan).
struct AdamPlan {
  qr_dtype data_dtype = QR_DTYPE_E4M3;  // e4m3 or e5m2
  // Current scaling: scale_from_amax(tensor amax, fmax, pow2_scales, amax_epsilon).
  float fmax = 448.0f;
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;
  // Delayed scaling (both set, device pointers of the state on the tensors' device): every
  // tensor reads the state's scale and max-accumulates its amax into history row 0.
  const float* delayed_scale = nullptr;
  float* history_row0 = nullptr;
};

// The extra's CUDA path (plugin_abi.h, QR_EXTRA_ADAM_REQUANTIZE): tensors on one CUDA device,
// checked by sdk::check_adam_call and the destinations against the quantizer's layout;
// plans[i] belongs to tensors[i]. Every master and moment
// updated, every dst rewritten (data, scale_inv, amax of each direction it holds), bit-identical
// to the update followed by float8 quantize of the new master. Launches, for any number of
// tensors (each kind once per table of kMaxTensorsPerLaunch tensors):
//   one zeroing launch (the amax buffers the passes max-accumulate into);
//   current scaling: one update + amax launch, then one cast (+ transpose) launch, which
//                    reads each new master a second time once its tensor amax is known;
//   delayed scaling: one update + cast (+ transpose) launch.
// Asynchronous on `stream`, no allocation, no host synchronization.
void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream);

}  // namespace qrecipe::float8::cuda
