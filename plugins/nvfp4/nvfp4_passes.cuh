// The passes of an nvfp4 quantize call as the entries of nvfp4_kernels.cu run them: host
// launchers, each in the .cu of its pass (nvfp4_kernels.cu has the map). Every launcher runs
// asynchronously on `stream` on the current device (the entry's DeviceGuard) and throws
// qrecipe::Error naming the CUDA call that failed. CUDA only (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_device.cuh"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::nvfp4::cuda {

// ---------------------------------------------------------------- pass 1 (nvfp4_amax.cu)

// *dst0 = value0 and *dst1 = value1 in one launch (either pointer may be null): the
// caller-reduced amaxes, or the +0 the amax passes start from.
void fill_amax(float* dst0, float value0, float* dst1, float value1, cudaStream_t stream);

// max |x| over `numel` elements of src (f32, bf16 or f16; NaN ignored) into out0 and out1
// (each nullable; both receive the same value; they must hold +0 or a smaller maximum).
void plain_amax(const void* src, qr_dtype dtype, std::int64_t numel, float* out0, float* out1,
                cudaStream_t stream);

// Hadamard amax of a bf16 [rows, cols] source with rows % 16 == 0: max |x| into `plain`
// (nullable) and the max over the transformed 16x1 runs into `transformed`.
void hadamard_amax(const void* src, qr_dtype dtype, std::int64_t rows, std::int64_t cols,
                   float* plain, float* transformed, cudaStream_t stream);

// ---------------------------------------------------------------- pass 2

// 1-D blocks, bf16 / f16 source, either rounding: the hot path (nvfp4_quantize_16bit.cu);
// with cast.data set (columnwise alone, round to nearest) it also writes the per-tensor cast.
void quantize_16bit(const QuantizeParams& p, qr_dtype src_dtype, bool stochastic,
                    const qr_tensor_cast& cast, cudaStream_t stream);

// 1-D blocks, f32 sources (either rounding), and stochastic rounding of 16-bit sources when
// QRECIPE_NVFP4_SR_KERNEL=tile1d selects it (the previous path, kept to time against): 32 x 32
// warp tiles (nvfp4_quantize_tile.cu, the tile of nvfp4_tile1d.cuh).
void quantize_1d(const QuantizeParams& p, qr_dtype src_dtype, bool stochastic,
                 cudaStream_t stream);

// 2d or Hadamard: one CTA per 64x64 shared-memory tile (nvfp4_quantize_tile.cu).
void quantize_tile(QuantizeParams p, qr_dtype src_dtype, bool stochastic, cudaStream_t stream);

}  // namespace qrecipe::nvfp4::cuda
