// The host side of the Adam step (qrecipe/adam.hpp): the constants of a qr_adam_hyper and the
// element loop over host buffers. Used by the engine's CPU path and by every plugin's CPU path
// of the fused Adam extra (plugin_sdk_adam.hpp), so both are the same code. Header-only.
#pragma once

#include <cstdint>

#include "qrecipe/adam.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk_tensor.hpp"

namespace qrecipe::adam {

// The learning rate and step count of a hyper: the device values when it has them (read
// through the pointers, so only for tensors in host memory), else the host values.
inline double lr_of(const qr_adam_hyper& h) {
  return h.lr_device != nullptr ? static_cast<double>(*h.lr_device) : h.lr;
}
inline std::int64_t step_of(const qr_adam_hyper& h) {
  return h.step_device != nullptr ? static_cast<std::int64_t>(*h.step_device) : h.step;
}

// The constants of one step for tensors in host memory.
inline Scalars host_scalars(const qr_adam_hyper& h) {
  return scalars(lr_of(h), h.beta1, h.beta2, h.eps, h.weight_decay, h.adam_w_mode != 0,
                 step_of(h));
}

// Whether a dtype can hold a moment (F32 or BF16) / a gradient or parameter (F32, BF16, F16).
inline bool is_moment_dtype(std::int32_t dtype) {
  return dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16;
}
inline bool is_value_dtype(std::int32_t dtype) {
  return dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16;
}

// One host buffer of n elements of `dtype`, contiguous.
struct HostBuffer {
  void* data = nullptr;
  std::int32_t dtype = QR_DTYPE_F32;
};

// Updates n elements in place: `param` (F32, BF16 or F16: the FP32 master, or a parameter
// updated in its own precision: widened, updated, rounded to nearest even), the moments (F32
// or BF16, likewise) from `grad` (read only, widened exactly). `copy` (optional, data may be
// null) receives the new parameter rounded to its dtype: a low-precision model parameter
// refreshed from its FP32 master. Dtypes are checked by the caller.
inline void update_host(HostBuffer param, HostBuffer grad, HostBuffer exp_avg,
                        HostBuffer exp_avg_sq, std::int64_t n, const Scalars& s,
                        HostBuffer copy = {}) {
  for (std::int64_t i = 0; i < n; ++i) {
    float p = sdk::load_f32(param.data, param.dtype, i);
    float m = sdk::load_f32(exp_avg.data, exp_avg.dtype, i);
    float v = sdk::load_f32(exp_avg_sq.data, exp_avg_sq.dtype, i);
    update(p, m, v, sdk::load_f32(grad.data, grad.dtype, i), s);
    sdk::store_f32_as(param.data, param.dtype, i, p);
    sdk::store_f32_as(exp_avg.data, exp_avg.dtype, i, m);
    sdk::store_f32_as(exp_avg_sq.data, exp_avg_sq.dtype, i, v);
    if (copy.data != nullptr) sdk::store_f32_as(copy.data, copy.dtype, i, p);
  }
}

}  // namespace qrecipe::adam
