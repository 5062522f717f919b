// Device-only fast paths of conversions.hpp for kernels: the hardware FP8 conversion
// (cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32, sm_89 and later) and the hardware F16 decode, plus
// the packed BF16 / F16 pair decodes a 16-byte vector load needs.
//
// Contract: every function here returns exactly what its reference in conversions.hpp
// returns, for every input (the reference is the specification). The decodes of F16 NaNs are
// the one exception: they are NaN like the reference's, with the hardware's payload; nothing
// downstream can tell (amax ignores NaN, every NaN encodes to the same FP8 code, NaN * scale
// is NaN). tests/gpu/test_gpu_conversions.cpp proves all of it on the GPU by running these
// functions and the references over all 2^32 inputs.
//
// Why the explicit NaN rule: the reference encodes every NaN as 0x7F (sign dropped), which
// is TransformerEngine's canonical NaN; the hardware's choice of NaN code (sign, E5M2
// payload) is not something to depend on, so NaN inputs are mapped to 0x7F here, after the
// conversion, from the input (which also covers any code the hardware picks).
//
// Below sm_89 (no hardware FP8 conversion) every function falls back to the reference.
#pragma once

#if !defined(__CUDACC__)
#error "qrecipe/fast_conversions.cuh holds device code: include it from .cu files only"
#endif

#include <cstdint>

#include "qrecipe/conversions.hpp"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define QR_HARDWARE_FP8 1
#else
#define QR_HARDWARE_FP8 0
#endif

namespace qrecipe::num::fast {

// ---------------------------------------------------------------- the raw hardware conversion

// The hardware conversion alone, no NaN rule: codes of `lo` in bits 0..7 and of `hi` in bits
// 8..15. PTX `cvt.rn.satfinite.e4m3x2.f32 d, a, b` puts a in the upper byte and b in the lower
// one. Exposed for the conversion test, which reports how it treats NaN; kernels use the
// functions below.
__device__ __forceinline__ std::uint32_t hardware_e4m3x2(float lo, float hi) {
#if QR_HARDWARE_FP8
  unsigned short codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
#else
  return f32_to_e4m3(lo) | (static_cast<std::uint32_t>(f32_to_e4m3(hi)) << 8);
#endif
}

__device__ __forceinline__ std::uint32_t hardware_e5m2x2(float lo, float hi) {
#if QR_HARDWARE_FP8
  unsigned short codes;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
#else
  return f32_to_e5m2(lo) | (static_cast<std::uint32_t>(f32_to_e5m2(hi)) << 8);
#endif
}

// ---------------------------------------------------------------- FP8 encode (== reference)

// The reference's NaN rule on a pair of codes: a NaN input becomes 0x7F, whatever the
// hardware wrote. `x != x` is true exactly for NaN (no fast math in this project).
__device__ __forceinline__ std::uint32_t canonical_nan_pair(std::uint32_t codes, float lo,
                                                            float hi) {
  if (lo != lo) codes = (codes & 0xFF00u) | 0x007Fu;
  if (hi != hi) codes = (codes & 0x00FFu) | 0x7F00u;
  return codes;
}

// == f32_to_e4m3(lo) | f32_to_e4m3(hi) << 8
__device__ __forceinline__ std::uint32_t f32x2_to_e4m3x2(float lo, float hi) {
  return canonical_nan_pair(hardware_e4m3x2(lo, hi), lo, hi);
}

// == f32_to_e5m2(lo) | f32_to_e5m2(hi) << 8
__device__ __forceinline__ std::uint32_t f32x2_to_e5m2x2(float lo, float hi) {
  return canonical_nan_pair(hardware_e5m2x2(lo, hi), lo, hi);
}

// Four codes in one little-endian word: x0 in bits 0..7, ..., x3 in bits 24..31.
__device__ __forceinline__ std::uint32_t f32x4_to_e4m3x4(float x0, float x1, float x2,
                                                         float x3) {
  return f32x2_to_e4m3x2(x0, x1) | (f32x2_to_e4m3x2(x2, x3) << 16);
}
__device__ __forceinline__ std::uint32_t f32x4_to_e5m2x4(float x0, float x1, float x2,
                                                         float x3) {
  return f32x2_to_e5m2x2(x0, x1) | (f32x2_to_e5m2x2(x2, x3) << 16);
}

// One code: == f32_to_e4m3(x) (the low byte of the pair conversion).
__device__ __forceinline__ std::uint8_t f32_to_e4m3(float x) {
  return static_cast<std::uint8_t>(f32x2_to_e4m3x2(x, 0.0f));
}

// ---------------------------------------------------------------- E2M1 encode (== reference)

// == f32_to_e2m1(x) for every FP32 x: the 4-bit code (sign in bit 3) in the low nibble. No
// hardware E2M1 conversion exists before sm_100, so this is arithmetic, branch-free:
//   a = min(|x|, 6)             saturation (inf -> 6); fminf returns 6 for NaN
//   e = max(floor(log2 a), 0)   the E2M1 binade (0 also for a < 1: E2M1 subnormals)
//   k = RNE(a / 2^(e-1))        one IEEE addition a + 2^(e+22): the sum's ulp is 2^(e-1), so
//                               it rounds a to a multiple of 2^(e-1), ties to even, exactly
//                               once; k (0..4) is then the sum's bits minus 2^(e+22)'s bits
//   code = 2e + k               (the reference's ((e + bias - 1) << 1) + q, and q for a < 1)
//   sign = bit 31 of x, except NaN, which encodes as +6 (0x7) like the reference
// tests/gpu/test_gpu_conversions.cpp proves it equal to num::f32_to_e2m1 over all 2^32 inputs.
__device__ __forceinline__ std::uint32_t e2m1_magnitude(float a);

__device__ __forceinline__ std::uint32_t f32_to_e2m1(float x) {
  const std::uint32_t sign = x != x ? 0u : (__float_as_uint(x) >> 28) & 0x8u;
  return e2m1_magnitude(fabsf(x)) | sign;  // fminf inside maps NaN to 6: code 7
}

// The 3-bit magnitude code of a = |x| (any non-negative FP32, +inf and NaN give 7): steps
// 1 to 4 above. Kernels that know x's sign separately (v = x * enc with enc > 0 has |v| =
// |x| * enc and v's sign is x's) call this on |x| * enc.
__device__ __forceinline__ std::uint32_t e2m1_magnitude(float a) {
  a = fminf(a, 6.0f);
  const std::uint32_t binade = max(__float_as_uint(a), 0x3F800000u) & 0x7F800000u;  // 2^e
  const std::uint32_t magic = binade + (22u << 23);                                  // 2^(e+22)
  const float sum = a + __uint_as_float(magic);
  return (binade >> 22) - 254u + (__float_as_uint(sum) - magic);  // 2e + k
}

// == f32_to_e2m1(x) for every x that is not NaN (a NaN keeps its sign bit here: the caller
// must route NaN inputs to f32_to_e2m1). Proven with f32_to_e2m1 by the same sweep.
__device__ __forceinline__ std::uint32_t f32_to_e2m1_non_nan(float x) {
  return e2m1_magnitude(fabsf(x)) | ((__float_as_uint(x) >> 28) & 0x8u);
}

// The magnitude code of a for 0 <= a < 7 (sign bit clear, not NaN), in the LOW BYTE of the
// result (bits 8..31 are not part of the result): == f32_to_e2m1(a) there. For kernels that
// know no scaled element reaches 7, so no saturation is needed; the code comes out without a
// mask, ready for byte packing ((t1 << 4) + t0 has the byte of codes t0, t1 in its low byte).
// The RNE addition of e2m1_magnitude with the binade folded into the magic number:
//   b     = 2^e, e = max(floor(log2 a), 0) in {0, 1, 2}
//   magic = b * (2^22 + 1)         = 2^(e+22) + 2 ulps, exactly; the sum's ulp is 2^(e-1), so
//                                  a + magic = magic + k ulps with k = RNE(a / 2^(e-1)), ties
//                                  to even (the sum's mantissa 2 + k is even exactly when k is)
//   bits(sum) + (bits(b) >> 22)    low byte (2 + k) + (2e + 254) = 2e + k (mod 256)
// Two of its five operations (the magic's multiply, the shift as the high word of a multiply)
// run on the FMA pipe. `two_pow_10` must be 1024: a kernel that passes it as a run-time value
// keeps the shift an IMAD.HI (FMA pipe) instead of an ALU shift-add, for ALU-bound kernels.
// tests/gpu/test_gpu_conversions.cpp proves it equal to f32_to_e2m1 on every FP32 input of its
// domain.
__device__ __forceinline__ std::uint32_t e2m1_magnitude_byte_below7(
    float a, std::uint32_t two_pow_10 = 1u << 10) {
  const std::uint32_t binade = max(__float_as_uint(a), 0x3F800000u) & 0x7F800000u;
  const float magic = __uint_as_float(binade) * 4194305.0f;  // 2^22 + 1
  const float sum = a + magic;
  return __float_as_uint(sum) + __umulhi(binade, two_pow_10);  // bits(b) >> 22
}

// ---------------------------------------------------------------- packed input decodes

// Two BF16 values of one little-endian word (element 0 in the low half): == bf16_to_f32 of
// each half, bit for bit (BF16 is the top half of an FP32).
__device__ __forceinline__ void bf16x2_to_f32x2(std::uint32_t word, float& lo, float& hi) {
  lo = __uint_as_float(word << 16);
  hi = __uint_as_float(word & 0xFFFF0000u);
}

// One F16 value: == f16_to_f32 for every non-NaN input (F16 subnormals are FP32 normals, so
// the hardware conversion is exact); a NaN for every NaN input (payload may differ, see top).
__device__ __forceinline__ float f16_to_f32(std::uint16_t code) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(code));
  return f;
#else
  return num::f16_to_f32(code);
#endif
}

// Two F16 values of one little-endian word (element 0 in the low half).
__device__ __forceinline__ void f16x2_to_f32x2(std::uint32_t word, float& lo, float& hi) {
  lo = f16_to_f32(static_cast<std::uint16_t>(word & 0xFFFFu));
  hi = f16_to_f32(static_cast<std::uint16_t>(word >> 16));
}

}  // namespace qrecipe::num::fast
