// Engine-internal (CUDA builds only): the launchers of the fused RMSNorm kernels
// (qrecipe/norm.hpp states the formula). No CUDA types, so rms_norm.cpp (host compiler) calls
// them after checking every view.
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>

#include "qrecipe/plugin_abi.h"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

// Device pointers of contiguous buffers; dtype is QR_DTYPE_F32, _BF16 or _F16 (x, weight, y,
// dy, dx, dweight share it); rstd and the partials are F32.
struct RmsNormCudaArgs {
  std::int32_t dtype = QR_DTYPE_F32;
  std::int64_t rows = 0;
  std::int64_t n = 0;
  int device = 0;
  void* stream = nullptr;
};

// `amax`: nullptr, or two F32 values max-accumulated with max |y| (qrecipe/norm.hpp).
void rms_norm_forward_cuda(const RmsNormCudaArgs& a, const void* x, const void* weight,
                           float eps, void* y, float* rstd, float* amax);

// `partials` holds `count` rows of n FP32 values (rms_norm_backward_partials).
void rms_norm_backward_cuda(const RmsNormCudaArgs& a, const void* dy, const void* x,
                            const void* weight, const float* rstd, void* dx, void* dweight,
                            float* partials, std::int64_t count);

}  // namespace qrecipe::detail
QR_INTERNAL_END
