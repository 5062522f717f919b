// Device helpers that decode stored GEMM operand values (internal, CUDA builds): shared by the
// dense emulation's kernels (gemm_cuda_kernels.cu) and the grouped GEMM's (grouped_cuda_kernels.cu),
// so both decode every format the same way (gemm_cuda_kernels.hpp says why each is exact).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "gemm/cuda/gemm_cuda_kernels.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::detail::gemm_kernels {

// FP8 codes -> FP32 through the hardware FP8 -> F16 conversion (exact: F16 holds every E4M3
// and E5M2 value, NaN stays NaN).
template <Code C>
__device__ __forceinline__ float2 fp8x2_to_f32x2(std::uint16_t pair) {
  constexpr __nv_fp8_interpretation_t kind = C == Code::e4m3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), kind);
  return __half22float2(__half2(raw));
}

__device__ __forceinline__ float e4m3_to_f32_hw(std::uint8_t code) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(raw));
}

// E2M1 code (sign in bit 3) -> FP32 from its bits: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_f32(std::uint32_t c) {
  const std::uint32_t e = (c >> 1) & 3u, m = c & 1u;
  std::uint32_t bits;
  if (e == 0)
    bits = m ? 0x3F000000u : 0u;  // 0.5 or 0
  else
    bits = ((e + 126u) << 23) | (m << 22);
  return __uint_as_float(bits | ((c & 8u) << 28));
}

// Decoded FP32 -> BF16 bits. Callers only pass values that are exact in BF16 (or that a check
// has flagged for the exact GEMM), so dropping the low half is exact. A NaN stays a NaN:
// every NaN here has high mantissa bits (the F16 NaN of an FP8 or E4M3 NaN code, the E8M0 NaN
// 0x7FC00000, or the canonical 0x7FFFFFFF a multiplication returns for any NaN operand).
__device__ __forceinline__ std::uint32_t bf16_bits(float v) { return __float_as_uint(v) >> 16; }

template <BlockScale S>
__device__ __forceinline__ float scale_value(std::uint32_t raw) {
  if constexpr (S == BlockScale::e8m0) {
    return num::e8m0_to_f32(static_cast<std::uint8_t>(raw));
  } else if constexpr (S == BlockScale::e4m3) {
    return e4m3_to_f32_hw(static_cast<std::uint8_t>(raw));
  } else {
    return __uint_as_float(raw);
  }
}

// The per-tensor factor of an operand (what moves into alpha; FactorSource in
// gemm_cuda_kernels.hpp): a scale_inv, or the decode factor of a stored amax
// (tensor_decode_factor with the owning format's numerator).
__device__ __forceinline__ float factor_value(const FactorSource& f) {
  switch (f.kind) {
    case Factor::none: return 1.0f;
    case Factor::value: return *f.ptr;
    case Factor::from_amax: return tensor_decode_factor(*f.ptr, f.numerator);
  }
  return 1.0f;
}

}  // namespace qrecipe::detail::gemm_kernels
