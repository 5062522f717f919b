// CUDA entry of the nvfp4 plugin's fused Adam + requantize extra (nvfp4_adam_kernels.cu,
// compiled only with CUDA; AdamPlan is plain data and used by nvfp4.cpp in every build). No
// CUDA types, so the host compiler can include it.
#pragma once

#include <cstdint>
#include <span>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::nvfp4::cuda {

// What the fused kernels need of one nvfp4 quantizer and destination (Nvfp4Quantizer::adam_plan;
// the SDK checked the destination as quantize does). Only quantizers without Hadamard transform
// and stochastic rounding are fused (Nvfp4Quantizer::adam_fusable).
struct AdamPlan {
  bool two_d = false;                   // 16x16 tiles share one block scale
  std::int64_t rowwise_scale_ld = 0;     // padded scale columns of each direction held
  std::int64_t columnwise_scale_ld = 0;
};

// The extra's CUDA path (plugin_abi.h, QR_EXTRA_ADAM_REQUANTIZE): tensors on one CUDA device,
// checked by sdk::check_adam_call; plans[i] belongs to tensors[i]. Per table of tensors:
// one zeroing launch and one update + amax launch (the tensor amax of the new master decides
// S_enc), then one quantize launch over 64 x 64 tiles of the new masters (their second read)
// writing both directions' codes, E4M3 block scales and amax, bit-identical to nvfp4
// quantize of the new master. Asynchronous on `stream`, no allocation, no host
// synchronization.
void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream);

}  // namespace qrecipe::nvfp4::cuda
