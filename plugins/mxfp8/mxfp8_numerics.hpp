// The per-block arithmetic of mxfp8, written once for the CPU reference (mxfp8_ref.cpp) and
// the CUDA kernels (mxfp8_kernels.cu), so both perform the same FP32 operations in the same
// order (rules: mxfp8_ref.hpp, docs/numerics.md "mxfp8"). Header-only, QR_HD (host + device).
#pragma once

#include <cstdint>

#include "qrecipe/conversions.hpp"

namespace qrecipe::mxfp8::num_mx {

// fl32(1 / fmax), the constant TransformerEngine multiplies a block amax by. Evaluated by the
// compiler in FP32 (round to nearest), identically in host and device code.
inline constexpr float kRcpE4M3 = 1.0f / num::E4M3Traits::kMax;
inline constexpr float kRcpE5M2 = 1.0f / num::E5M2Traits::kMax;
static_assert(kRcpE4M3 == 0x1.24924ap-9f, "fl32(1/448) is 0x1.24924ap-9");
static_assert(kRcpE5M2 == 0x1.24924ap-16f, "fl32(1/57344) is 0x1.24924ap-16");

// The E8M0 exponent of a block: one FP32 multiply (never a division), then round up to a
// power of two, saturating.
QR_HD std::uint8_t block_exponent(float amax, float rcp_max) {
  const float ratio = amax * rcp_max;
  return num::e8m0_from_f32_round_up(ratio);
}

// sat_rne(x * 2^(127-e)) into E4M3 (e4m3 = true) or E5M2.
QR_HD std::uint8_t encode(float x, std::uint8_t e, bool e4m3) {
  const float scaled = x * num::e8m0_encode_factor(e);
  return e4m3 ? num::f32_to_e4m3(scaled) : num::f32_to_e5m2(scaled);
}

// q * 2^(e-127). A NaN operand is returned as it is rather than multiplied: x86 keeps a NaN
// operand's bits (0x7FC00000 from the decoders) while the GPU returns its canonical NaN
// 0x7FFFFFFF, and both paths must produce the same bytes.
QR_HD float decode(std::uint8_t q, std::uint8_t e, bool e4m3) {
  const float element = e4m3 ? num::e4m3_to_f32(q) : num::e5m2_to_f32(q);
  const float factor = num::e8m0_to_f32(e);
  if (num::is_nan(element)) return element;
  if (num::is_nan(factor)) return factor;
  return element * factor;
}

}  // namespace qrecipe::mxfp8::num_mx
