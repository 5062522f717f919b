// CUDA entry of the mxfp8 plugin's fused Adam + requantize extra (mxfp8_adam_kernels.cu,
// compiled only with CUDA; AdamPlan is plain data and used by mxfp8.cpp in every build). No
// CUDA types, so the host compiler can include it.
#pragma once

#include <cstdint>
#include <span>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::mxfp8::cuda {

// What the fused kernel needs of one mxfp8 quantizer and destination (Mxfp8Quantizer::adam_plan;
// the SDK checked the destination's buffers as quantize does).
struct AdamPlan {
  qr_dtype data_dtype = QR_DTYPE_E4M3;  // e4m3 or e5m2
  std::int64_t rowwise_scale_ld = 0;     // padded scale columns of each direction held
  std::int64_t columnwise_scale_ld = 0;
};

// The extra's CUDA path (plugin_abi.h, QR_EXTRA_ADAM_REQUANTIZE): tensors on one CUDA device,
// checked by sdk::check_adam_call; plans[i] belongs to tensors[i]. ONE launch per table of
// tensors (mxfp8 has no tensor-level quantity): each block updates a 32 x 128 tile of one
// master and writes its rowwise (1 x 32 blocks) and columnwise (32 x 1 blocks) codes and E8M0
// scales, bit-identical to mxfp8 quantize of the new master. Asynchronous on `stream`, no
// allocation, no host synchronization.
void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream);

}  // namespace qrecipe::mxfp8::cuda
