// The small CUDA kernels around the engine's cuBLASLt GEMMs (internal header, CUDA builds only;
// implemented in gemm_cuda_kernels.cu). No CUDA types here, so gemm_cuda.cpp stays plain C++.
//
// Every entry enqueues on `stream` (a cudaStream_t; nullptr = legacy default stream) on the
// current device and throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the launch that
// failed. Matrices are row-major and contiguous. The arithmetic is the CPU reference's
// epilogue, operation for operation (the engine is compiled with -fmad=false): see finish().
#pragma once

#include <cstdint>

namespace qrecipe::detail::gemm_kernels {

// dst[i] = f32(src[i]) for n BF16 values (exact).
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, void* stream);

// out[i][j] += bias[j] for an FP32 [rows, cols] output (the bias the CPU adds last).
void add_bias_f32(float* out, const float* bias, std::int64_t rows, std::int64_t cols, void* stream);

// The CPU reference's epilogue for an output cuBLASLt could not write directly:
//   v = product ? product[i][j] : alpha * 0.0f    (product already holds alpha * AB)
//   if accumulate: v += out[i][j]
//   if bias:       v += bias[j]
//   out[i][j] = v, rounded to BF16 (RNE) when out_bf16, else stored as FP32.
// product may alias neither out nor bias. rows * cols may be 0.
void finish(void* out, bool out_bf16, const float* product, float alpha, bool accumulate,
            const float* bias, std::int64_t rows, std::int64_t cols, void* stream);

}  // namespace qrecipe::detail::gemm_kernels
