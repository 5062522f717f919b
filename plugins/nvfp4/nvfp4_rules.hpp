// The scalar rules of nvfp4 (DESIGN.md section 7, "nvfp4"; docs/numerics.md) as __host__
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

// Stochastic rounding of v with the 32-bit random word r: with lo < |v| < hi the neighbouring
// E2M1 values, round away from zero iff (r >> 8) * 2^-24 < (|v| - lo) / (hi - lo) (FP32);
// |v| >= 6 (inf included) gives 6, grid values stay, the sign is kept; NaN gives 0x7.
QR_HD std::uint8_t round_stochastic(float v, std::uint32_t r) {
  if (num::is_nan(v)) return num::f32_to_e2m1(v);  // E2M1 has no NaN: 0x7, like RNE
  const std::uint8_t sign = static_cast<std::uint8_t>((num::float_bits(v) >> 31) << 3);
  const float a = num::abs_f(v);
  // The non-negative E2M1 values; code = index.
  constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  if (a >= kGrid[7]) return static_cast<std::uint8_t>(sign | num::f32_to_e2m1(kGrid[7]));
  // lo = the largest grid value <= a, hi the next one (the grid increases, a < 6). A fixed
  // trip count with constant indices keeps the grid in registers on the device.
  float lo = kGrid[0], hi = kGrid[1];
  for (int k = 1; k < 7; ++k) {
    if (kGrid[k] <= a) {
      lo = kGrid[k];
      hi = kGrid[k + 1];
    }
  }
  if (a == lo) return static_cast<std::uint8_t>(sign | num::f32_to_e2m1(lo));
  const float u = static_cast<float>(r >> 8) * num::exp2i(-24);  // 24 random bits in [0, 1)
  const float p = (a - lo) / (hi - lo);  // probability of rounding away from zero
  return static_cast<std::uint8_t>(sign | num::f32_to_e2m1(u < p ? hi : lo));
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
