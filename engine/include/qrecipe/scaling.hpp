// Scales from amaxes (docs/numerics.md, "General rules"), as __host__ __device__
// functions. Delayed scaling: the per-tensor scale follows the amax history of previous steps;
// the update is one pure function shared by the CPU path and the CUDA kernel that updates all
// states in one launch.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "qrecipe/conversions.hpp"

namespace qrecipe {

// scale_from_amax of docs/numerics.md (current scaling, per-block scales):
// amax < eps -> eps; amax 0 or inf (or NaN) -> 1; scale = fmax / amax; inf -> value_for_inf;
// pow2 -> clear the mantissa (round down to 2^k).
QR_HD float scale_from_amax(float amax, float fmax, bool pow2, float eps,
                            float value_for_inf = FLT_MAX) {
  if (amax < eps) amax = eps;
  if (amax == 0.0f || !num::is_finite(amax)) return 1.0f;
  float scale = fmax / amax;
  if (num::is_inf(scale)) scale = value_for_inf;
  if (pow2) scale = num::bits_float(num::float_bits(scale) & 0xFF800000u);
  return scale;
}

// The per-tensor decode factor of a QR_SCALE_BLOCK_TENSOR direction from its stored amax:
// 1 / scale_from_amax(amax, numerator, no pow2, eps 0), `numerator` being the owning format's
// descriptor field tensor_scale_numerator (plugin_abi.h). An element of such a direction
// decodes as (code * block scale) * factor.
QR_HD float tensor_decode_factor(float amax, float numerator) {
  return 1.0f / scale_from_amax(amax, numerator, /*pow2=*/false, /*eps=*/0.0f);
}

// One delayed-scaling update of one state, after the caller reduced the step's amax across
// ranks (`reduced_amax`; pass history[0] when there is nothing to reduce).
//   last = reduced_amax, or history[0] if that is 0; if last is 0 nothing changes.
//   amax = max(old history[1..L-1], last) for algo max, or last for most_recent.
//   roll: history[i] = old[i+1] (1 <= i <= L-2), history[L-1] = last, history[0] = 0.
//   scale = (fmax * 2^-margin) / amax if amax is finite and > 0, else unchanged;
//   an infinite result becomes FLT_MAX. scale_inv = 1 / scale.
// The last step of the update: the scale and its inverse from the window's amax.
QR_HD void delayed_scaling_scale(float amax, int margin, float fmax, float* scale,
                                 float* scale_inv) {
  const float scaled_max = fmax * num::exp2i(-margin);
  if (num::is_finite(amax) && amax > 0.0f) {
    float s = scaled_max / amax;
    if (num::is_inf(s)) s = FLT_MAX;
    *scale = s;
  }
  *scale_inv = 1.0f / *scale;
}

QR_HD void delayed_scaling_update(float* history, int length, float* scale, float* scale_inv,
                                  float reduced_amax, bool most_recent, int margin, float fmax) {
  const float last = reduced_amax != 0.0f ? reduced_amax : history[0];
  if (last == 0.0f) return;
  float amax = last;
  for (int i = 0; i < length; ++i) {
    const float a = i < length - 1 ? history[i + 1] : last;
    if (!most_recent) amax = fmaxf(amax, a);
    history[i] = i > 0 ? a : 0.0f;
  }
  delayed_scaling_scale(amax, margin, fmax, scale, scale_inv);
}

}  // namespace qrecipe
