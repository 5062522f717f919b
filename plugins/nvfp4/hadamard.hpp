// The random Hadamard transform (RHT) of nvfp4's columnwise (wgrad) operand (docs/numerics.md,
// "nvfp4"): each run of 16 elements along M is multiplied by D·H16/4, where H16 is the
// Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and D = diag(kHadamardSigns)
// (TransformerEngine's fixed wgrad sign vector; it is not re-randomized per step).
//
// The exact sequence of FP32 operations (shared by the CPU reference and the kernels):
//   1. v[i] = sign[i] * v[i]                 (a sign flip, exact)
//   2. four butterfly stages, h = 1, 2, 4, 8: for every i with (i & h) == 0
//        (v[i], v[i + h]) = (v[i] + v[i + h], v[i] - v[i + h])   (FP32 add/sub, no FMA)
//   3. v[i] = v[i] * 0.25f                   (exact unless it underflows)
//   4. v[i] = round_to_bf16(v[i])            (RNE)
// For a row vector x this computes x·D·H16/4 (H16 is symmetric). D·H16/4 is orthogonal
// ((D·H/4)(D·H/4)^T = D·H·H^T·D/16 = I), so sum over M of hadamard(A)^T·hadamard(B) equals
// A^T·B up to rounding: the wgrad GEMM is unchanged in exact arithmetic.
#pragma once

#include "qrecipe/conversions.hpp"

namespace qrecipe::nvfp4 {

inline constexpr int kHadamardSize = 16;

// +1 / -1 per position: [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1]; bit i set = negative.
inline constexpr unsigned kHadamardNegativeMask =
    (1u << 3) | (1u << 5) | (1u << 6) | (1u << 7) | (1u << 8) | (1u << 9) | (1u << 10) |
    (1u << 12) | (1u << 14) | (1u << 15);

QR_HD bool hadamard_sign_negative(int i) { return ((kHadamardNegativeMask >> i) & 1u) != 0; }

// Steps 1-3 in place, FP32 results (no BF16 rounding): the exact order used by the kernels.
QR_HD void hadamard16_fp32(float v[kHadamardSize]) {
  for (int i = 0; i < kHadamardSize; ++i)
    if (hadamard_sign_negative(i)) v[i] = -v[i];
  for (int h = 1; h < kHadamardSize; h <<= 1) {
    for (int i = 0; i < kHadamardSize; ++i) {
      if (i & h) continue;
      const float a = v[i];
      const float b = v[i + h];
      v[i] = a + b;
      v[i + h] = a - b;
    }
  }
  for (int i = 0; i < kHadamardSize; ++i) v[i] = v[i] * 0.25f;
}

// Steps 1-4 in place: the values nvfp4 quantizes (each exactly representable in BF16).
QR_HD void hadamard16_bf16(float v[kHadamardSize]) {
  hadamard16_fp32(v);
  for (int i = 0; i < kHadamardSize; ++i) v[i] = num::round_to_bf16(v[i]);
}

}  // namespace qrecipe::nvfp4
