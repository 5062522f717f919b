// CUDA kernels around the engine's cuBLASLt GEMMs (see gemm_cuda_kernels.hpp).
//
// Map (STYLE.md rule 11): launch checking, then kernels (elementwise, grid-stride), then the
// entries that size the grid and launch. These kernels are memory-bound one-pass loops: one
// thread per element with a grid-stride loop, 256 threads per block, at most kMaxBlocks
// blocks. They run only off the fast path (bias with FP8 or BF16 output, BF16 output of an FP32
// GEMM, a mixed-dtype dense GEMM, K = 0).
#include "gemm_cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::detail::gemm_kernels {
namespace {

constexpr int kThreads = 256;       // threads per block
constexpr int kMaxBlocks = 65535;   // enough to cover an H100 many times (132 SMs x 8 blocks)

void check_launch(const char* kernel, std::int64_t n) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "launch of the GEMM helper kernel ", kernel, " over ", n,
                " elements failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                "); an earlier asynchronous error may also surface here: rerun with "
                "CUDA_LAUNCH_BLOCKING=1 to find it");
}

int blocks_for(std::int64_t n) {
  return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* __restrict__ src, float* __restrict__ dst,
                                   std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = num::bf16_to_f32(src[i]);
}

__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias,
                                std::int64_t n, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = out[i] + bias[i % cols];
}

// One element of the reference epilogue (gemm.cpp): alpha * AB, + out, + bias, then round.
__global__ void finish_kernel(void* __restrict__ out, bool out_bf16, const float* __restrict__ product,
                              float alpha, bool accumulate, const float* __restrict__ bias,
                              std::int64_t n, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = product ? product[i] : alpha * 0.0f;  // K = 0: the empty sum is +0
    if (out_bf16) {
      auto* o = static_cast<std::uint16_t*>(out);
      if (accumulate) v = v + num::bf16_to_f32(o[i]);
      if (bias) v = v + bias[i % cols];
      o[i] = num::f32_to_bf16(v);
    } else {
      auto* o = static_cast<float*>(out);
      if (accumulate) v = v + o[i];
      if (bias) v = v + bias[i % cols];
      o[i] = v;
    }
  }
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, void* stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  check_launch("bf16_to_f32", n);
}

void add_bias_f32(float* out, const float* bias, std::int64_t rows, std::int64_t cols, void* stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, bias, n, cols);
  check_launch("add_bias_f32", n);
}

void finish(void* out, bool out_bf16, const float* product, float alpha, bool accumulate,
            const float* bias, std::int64_t rows, std::int64_t cols, void* stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  finish_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      out, out_bf16, product, alpha, accumulate, bias, n, cols);
  check_launch("finish", n);
}

}  // namespace qrecipe::detail::gemm_kernels
