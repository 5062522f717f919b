// CUDA entry of the blockwise plugin's fused Adam + requantize extra
// (blockwise_adam_kernels.cu, compiled only with CUDA; AdamPlan is plain data and used by
// blockwise.cpp in every build). No CUDA types, so the host compiler can include it.
#pragma once

#include <cstdint>
#include <span>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::blockwise::cuda {

// What the fused kernel needs of one blockwise quantizer and destination
// (BlockwiseQuantizer::adam_plan; the SDK checked the destination as quantize does). The source
// of the requantization is the FP32 master, so an infinite block scale becomes FLT_MAX.
struct AdamPlan {
  bool tile_128x128 = false;  // else 1x128 blocks
  bool pow2_scales = true;
  float amax_epsilon = 0.0f;
  std::int64_t rowwise_scale_ld = 0;  // padded inner scale dimension of each direction held
  std::int64_t columnwise_scale_ld = 0;
};

// The extra's CUDA path (plugin_abi.h, QR_EXTRA_ADAM_REQUANTIZE): tensors on one CUDA device,
// checked by sdk::check_adam_call; plans[i] belongs to tensors[i]. ONE launch per table of
// tensors (blockwise has no tensor-level quantity): each block updates a 128 x 128 tile of one
// master and writes its rowwise and columnwise codes and scale_inv, bit-identical to blockwise
// quantize of the new master. Asynchronous on `stream`, no allocation, no host synchronization
// (the kernel's shared-memory limit is raised once per device, on the first call).
void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream);

}  // namespace qrecipe::blockwise::cuda
