// The per-block arithmetic of blockwise, written once for the CPU reference
// (blockwise_ref.cpp) and the CUDA kernels (blockwise_kernels.cu), so both perform the same
// FP32 operations in the same order (rules: blockwise_ref.hpp, docs/numerics.md "blockwise").
// Header-only, QR_HD (host + device).
#pragma once

#include <cstdint>

#include "qrecipe/conversions.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::blockwise::num_bw {

inline constexpr float kE4M3Max = num::E4M3Traits::kMax;  // 448

// The scale of one block: scale_from_amax with fmax 448; `value_for_inf` is the largest finite
// value of the source dtype (what an infinite 448 / amax becomes).
QR_HD float block_scale(float amax, bool pow2_scales, float amax_epsilon, float value_for_inf) {
  return scale_from_amax(amax, kE4M3Max, pow2_scales, amax_epsilon, value_for_inf);
}

// sat_rne(x * scale) into E4M3.
QR_HD std::uint8_t encode(float x, float scale) { return num::f32_to_e4m3(x * scale); }

// e4m3(q) * scale_inv. A NaN code decodes to 0x7FC00000 without the multiply: x86 keeps a NaN
// operand's bits while the GPU returns its canonical NaN 0x7FFFFFFF, and both paths must
// produce the same bytes. (scale_inv is never NaN: scales are finite and positive.)
QR_HD float decode(std::uint8_t q, float scale_inv) {
  const float element = num::e4m3_to_f32(q);
  return num::is_nan(element) ? element : element * scale_inv;
}

}  // namespace qrecipe::blockwise::num_bw
