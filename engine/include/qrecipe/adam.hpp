// The Adam / AdamW arithmetic of qrecipe's master-weight optimizer (qrecipe.optim.FusedAdam),
// written once for the host (the engine's CPU path, every plugin's CPU path) and the device
// (the engine's multi-tensor kernel, every plugin's fused Adam + requantize kernel), so both
// update the FP32 master and the moments with the same IEEE operations in the same order and
// agree bit for bit. Header-only, QR_HD.
//
// One step of one element (docs/adapter.md, "Optimizer"; g is the gradient widened to FP32):
//   L2 mode only (adam_w_mode = 0):   g = g + wd * p
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g * g                 ((1 - b2) * g first, then * g)
//   p = p * (1 - lr * wd)                         (AdamW mode; the factor is 1 in L2 mode)
//   p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// with every operation an FP32 IEEE operation (no FMA contraction: the build forbids it on
// host and device; sqrt and division are correctly rounded, nvcc --prec-sqrt/--prec-div).
//
// The FP32 constants come from the double-precision hyperparameters, each rounded once:
//   b1, b2, eps, lr        float(b)                     1 - b1, 1 - b2   float(1.0 - b)
//   1 - lr * wd            float(1.0 - lr * wd)         (lr * wd in double)
//   1 - b^t                float(1.0 - b^t), b^t by binary exponentiation in double
// so they are the same numbers whether the host computes them (an eager step) or every CUDA
// block does (a capturable step reading lr and the step count from device memory). float(b2),
// float(1 - b2) and float(1 - lr * wd) are exactly the factors torch.optim.AdamW multiplies by
// (it rounds the same double expressions to FP32), so the second moment and the decay factor
// of the two optimizers are computed alike; torch's first moment (lerp) and its final update
// (sqrt(v) / sqrt(1 - b2^t)) are ordered differently (docs/adapter.md lists the differences).
#pragma once

#include <cmath>
#include <cstdint>

#include "qrecipe/conversions.hpp"

namespace qrecipe::adam {

// beta^step for step >= 0 by binary exponentiation: only double multiplications, the same on
// every host and device (std::pow / pow need not be). beta^0 = 1.
QR_HD double pow_step(double beta, std::int64_t step) {
  double result = 1.0;
  double base = beta;
  while (step > 0) {
    if (step & 1) result = result * base;
    base = base * base;
    step >>= 1;
  }
  return result;
}

// The FP32 constants of one step of one tensor (see the header comment).
struct Scalars {
  float lr = 0.0f;
  float beta1 = 0.0f, beta2 = 0.0f;
  float one_minus_beta1 = 0.0f, one_minus_beta2 = 0.0f;
  float eps = 0.0f;
  float weight_decay = 0.0f;       // L2 mode: g += weight_decay * p
  float decay = 1.0f;              // AdamW mode: p *= decay
  float bias_correction1 = 1.0f;   // 1 - b1^t
  float bias_correction2 = 1.0f;   // 1 - b2^t
  bool adam_w_mode = true;
};

// `step` is the step count after this step's increment (1 for the first step).
QR_HD Scalars scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                      bool adam_w_mode, std::int64_t step) {
  Scalars s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.decay = adam_w_mode ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  s.bias_correction1 = static_cast<float>(1.0 - pow_step(beta1, step));
  s.bias_correction2 = static_cast<float>(1.0 - pow_step(beta2, step));
  s.adam_w_mode = adam_w_mode;
  return s;
}

QR_HD float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);  // IEEE round to nearest, whatever the flags
#else
  return std::sqrt(x);   // IEEE 754 requires the correctly rounded square root
#endif
}

// One element: updates the master p and the moments m, v in place from the FP32 gradient g.
QR_HD void update(float& p, float& m, float& v, float g, const Scalars& s) {
  if (!s.adam_w_mode) g = g + s.weight_decay * p;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  p = p * s.decay;
  const float m_hat = m / s.bias_correction1;
  const float denom = sqrt_f(v / s.bias_correction2) + s.eps;
  p = p - s.lr * m_hat / denom;
}

}  // namespace qrecipe::adam
