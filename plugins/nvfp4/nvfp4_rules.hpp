// The scalar rules of nvfp4 (docs/numerics.md, "nvfp4") as __host__
// __device__ functions: the single implementation that the CPU reference (nvfp4_ref.cpp) and
// the CUDA kernels (nvfp4_kernels.cu) both run, so the two cannot drift apart. Every FP4/FP8
// rounding goes through qrecipe::num; the order of FP32 operations is the one written here
// (the build forbids FMA contraction, fast math and flush-to-zero on host and device).
//
//   S_enc  = scale_from_amax(amax_tensor, 2688, no pow2, eps 0)     S_dec = 1 / S_enc
//   s      = e4m3(amax_block * (S_enc * fl32(1/6)))
//   enc    = min(1 / (float(s) * S_dec), FLT_MAX)
//   q      = e2m1(x * enc) (RNE, saturating) or round_stochastic(x * enc, r)
//   decode = (float(q) * float(s)) * S_dec; a NaN scale decodes to that scale's NaN
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "qrecipe/conversions.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::nvfp4::rules {

inline constexpr int kBlockSize = 16;                    // elements per block scale
inline constexpr float kTensorScaleNumerator = 2688.0f;  // E4M3 max * E2M1 max = 448 * 6
inline constexpr std::uint8_t kNanScaleCode = 0x7F;      // E4M3 NaN: marks a block holding NaN
// fl32(1/6), written as its exact bits 0x3E2AAAAB so no compiler folds it differently.
inline constexpr float kOneSixth = 0x1.555556p-3f;

// S_enc of a direction: 2688 / amax (IEEE), capped at FLT_MAX; 1.0 when amax is 0, inf or NaN.
QR_HD float encode_scale(float tensor_amax) {
  return scale_from_amax(tensor_amax, kTensorScaleNumerator, /*pow2=*/false, /*eps=*/0.0f);
}

// S_dec = 1 / S_enc: qrecipe::tensor_decode_factor with this format's numerator, the very
// function the engine's GPU GEMM decodes with once the descriptor hands it the numerator
// (tensor_scale_numerator, plugin_abi.h).
QR_HD float decode_scale(float tensor_amax) {
  return tensor_decode_factor(tensor_amax, kTensorScaleNumerator);
}

// E4M3 code of a block scale: the product S_enc * fl32(1/6) first (the order decides the
// result at E4M3 rounding boundaries).
QR_HD std::uint8_t block_scale_code(float block_amax, float s_enc) {
  const float scale_times_sixth = s_enc * kOneSixth;
  return num::f32_to_e4m3(block_amax * scale_times_sixth);
}

// What the elements of a block are multiplied by: min(1 / (float(s) * S_dec), FLT_MAX).
QR_HD float element_encode_factor(std::uint8_t scale_code, float s_dec) {
  const float block_decode = num::e4m3_to_f32(scale_code) * s_dec;
  const float enc = 1.0f / block_decode;  // s = 0 gives inf, capped below
  return enc > FLT_MAX ? FLT_MAX : enc;   // NaN only for a NaN scale
}

// E2M1 code (sign in bit 3) of v, round to nearest even, saturating; NaN gives 0x7.
QR_HD std::uint8_t round_nearest(float v) { return num::f32_to_e2m1(v); }

// floor(t) of 0 <= t < 4, exactly, as a float and as an integer. The device adds 2^23 rounding
// down (the integer part lands in the low mantissa bits) instead of FRND / F2I, which run on
// the slow conversion pipe; the host uses std::floor. Both are exact, so they agree.
struct SmallFloor {
  float value;
  std::uint32_t integer;
};
QR_HD SmallFloor floor_below_4(float t) {
#if defined(__CUDA_ARCH__)
  const float shifted = __fadd_rd(t, 8388608.0f);  // 2^23 + floor(t), exactly
  return {__fsub_rn(shifted, 8388608.0f), __float_as_uint(shifted) & 3u};
#else
  const float f = std::floor(t);
  return {f, static_cast<std::uint32_t>(f)};
#endif
}

// The E2M1 magnitude code (0..7) of stochastic rounding of a = |v| (a >= 0, not NaN) with the
// random word r: round away from zero iff (r >> 8) * 2^-24 < (a - lo) / (hi - lo) (FP32), with
// lo <= a < hi the neighbouring E2M1 values; a >= 6 (inf included) gives 6, grid values stay.
// Computed without the division and the grid search, with the same result for every input:
//   - a is clamped to 6 (then t = 3, p = 0 below: code 7, never moved);
//   - k = 1 / (hi - lo) is 2 below 2, 1 below 4 and 0.5 from 4, so t = a * k is exact (a power
//     of two), lies in [0, 4) and the grid is the integers there: lo * k = floor(t);
//   - p = t - floor(t) is exact (floor(t) = 0, or floor(t) >= t / 2: Sterbenz) and equals
//     (a - lo) / (hi - lo) exactly (a - lo is exact by Sterbenz, and dividing it by a power of
//     two is exact here), so it is the reference's p;
//   - (r >> 8) * 2^-24 < p  <=>  float(r >> 8) < p * 2^24: both sides are exact;
//   - lo's code is floor(t) plus 0, 2 or 4 (codes 0-3 are 0, 0.5, 1, 1.5; 4-5 are 2, 3; 6-7 are
//     4, 6).
// test_nvfp4.cpp checks it against the formula written plainly, over every boundary.
QR_HD std::uint32_t sr_magnitude(float a, std::uint32_t r) {
  a = a < 6.0f ? a : 6.0f;
  const bool below2 = a < 2.0f, below4 = a < 4.0f;
  const float k = below2 ? 2.0f : (below4 ? 1.0f : 0.5f);
  const std::uint32_t code_offset = below2 ? 0u : (below4 ? 2u : 4u);
  const float t = a * k;
  const SmallFloor f = floor_below_4(t);
  const float p = t - f.value;
  const bool away = static_cast<float>(r >> 8) < p * 16777216.0f;  // 2^24
  return f.integer + code_offset + (away ? 1u : 0u);
}

// Stochastic rounding of v with the 32-bit random word r (sr_magnitude above), sign kept; NaN
// gives 0x7, as round to nearest does (E2M1 has no NaN; the block scale carries it).
QR_HD std::uint8_t round_stochastic(float v, std::uint32_t r) {
  if (num::is_nan(v)) return num::f32_to_e2m1(v);
  const std::uint32_t sign = (num::float_bits(v) >> 31) << 3;
  return static_cast<std::uint8_t>(sign | sr_magnitude(num::abs_f(v), r));
}

// (float(q) * float(s)) * S_dec. A NaN scale (0x7F, the NaN mark) returns the scale's own
// NaN (0x7FC00000) instead of going through a multiplication: the host propagates a NaN
// operand's bits while the device returns a canonical NaN, and both must store equal bytes.
QR_HD float decode_element(std::uint8_t q, std::uint8_t scale_code, float s_dec) {
  const float s = num::e4m3_to_f32(scale_code);
  if (num::is_nan(s)) return s;
  const float qs = num::e2m1_to_f32(q) * s;  // exact product
  return qs * s_dec;
}

}  // namespace qrecipe::nvfp4::rules
