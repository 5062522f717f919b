// Fused RMSNorm with Hugging Face's numerics (LlamaRMSNorm and its copies), on CUDA tensors:
// one kernel for the forward, one for dx plus per-block dweight partials and a small one that
// reduces the partials (engine/src/norm/). qrecipe.nn.RMSNorm (python/qrecipe/nn/rms_norm.py)
// runs it on CUDA; on the CPU it runs the torch formula itself.
//
// The formula, per row x of n elements, in the input dtype T (F32, BF16 or F16) and FP32:
//   h = float(x); var = (sum h*h) * (1/n); r = rsqrtf(var + eps)      (r saved, FP32)
//   hb = T(h * r); y = T(weight * hb)
// and its gradient as torch's autograd computes it for that formula:
//   g = float(T(dy * weight)); dr = sum g*h; c = ((dr * -0.5) * (r*r*r)) * (1/n)
//   dx = T(g * r + c * (2h));  dweight = T(sum over rows of T(dy * hb))
// Every elementwise step rounds where torch's does (no contraction). The row sums (h*h, g*h)
// and the column sum of dweight run in this code's fixed order, not torch's: that is the only
// difference from the formula run by torch on the same device (docs/adapter.md, "Fused
// RMSNorm", states the bound).
#pragma once

#include <cstdint>

#include "qrecipe/tensor.hpp"

namespace qrecipe {

// The widest hidden size (last dimension) served: the backward keeps one FP32 row of dweight
// partial sums per block in shared memory, 48 Ki values = 192 KiB (Hopper: 227 KiB a block).
constexpr std::int64_t kRmsNormMaxHidden = 48 * 1024;

// y (the shape and dtype of x) and rstd (F32, one per row: x's leading dims, flattened) from
// x ([..., n], contiguous) and weight ([n], x's dtype). All on one CUDA device; runs on
// `stream` (cudaStream_t; nullptr: the legacy default stream) without host synchronization.
// `amax` (optional: a view without data is none): two F32 values on x's device, both raised
// to max |y| over the whole output, NaN ignored (the per-tensor amax a current-scaling
// quantizer computes of y, for both directions: plugin_abi.h, QR_EXTRA_QUANTIZE_DEVICE_AMAX).
// Each is max-accumulated (max(amax[i], max |y|)), so the caller zeroes them first; they must
// not be negative or NaN.
void rms_norm_forward(const TensorView& x, const TensorView& weight, double eps,
                      const TensorView& y, const TensorView& rstd, const TensorView& amax,
                      void* stream);

// The number of per-block dweight partials rms_norm_backward uses for `rows` rows of `n`
// elements (a function of the shape only): its workspace is F32
// [rms_norm_backward_partials(rows, n), n].
std::int64_t rms_norm_backward_partials(std::int64_t rows, std::int64_t n);

// dx (x's shape and dtype) and dweight (weight's shape and dtype) from dy (x's shape and
// dtype), x, weight and the forward's rstd, through `workspace` (see above).
void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                       const TensorView& workspace, void* stream);

}  // namespace qrecipe
