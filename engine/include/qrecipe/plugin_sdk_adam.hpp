// Header-only helpers for a plugin's fused Adam + requantize extra (plugin_abi.h,
// QR_EXTRA_ADAM_REQUANTIZE and QR_EXTRA_ADAM_REQUANTIZE_SUPPORTS): the generic argument checks,
// the CPU path every plugin shares, and the C trampolines. Nothing here is linked from the
// engine.
//
// How a plugin fuses the step on CUDA (the shipped per-tensor FP8 plugin is a worked example):
//   1. Give the quantizer class Q a member `Plan adam_plan(const qr_adam_tensor& t)`: what
//      the kernels need of Q for t (a plain struct `Plan` declared in the namespace of step
//      2's function). t's destination has been checked against Q's layout already.
//   2. Write the CUDA entry `void adam_requantize(std::span<const qr_adam_tensor> tensors,
//      std::span<const Plan> plans, void* stream)` in the same namespace as Plan (found by
//      argument-dependent lookup, only in builds with CUDA): tensors on one CUDA device,
//      every master and moment updated with qrecipe/adam_cuda.cuh and every dst requantized
//      from the new master, byte-identical to the CPU path below.
//   3. Optional: a member `bool adam_fusable(const qr_device& device, bool capturable,
//      std::string& why)` for quantizers the kernels do not serve (default: all of them).
//   4. Register: QR_DEFINE_PLUGIN_EX(Q, ..., &qrecipe::sdk::adam_extras<Q>).
// The CPU path needs nothing from the plugin: for each tensor in order, the element loop of
// adam_host.hpp, then the quantizer's own `quantize` (its CPU reference) of the new master,
// which is the contract of the extra by definition. Quantizers the plugin does not fuse are
// served by the host's two-pass path (update, then quantize): same bytes, more passes. A build
// without CUDA fuses nothing on CUDA (the host's path then reports the missing kernels).
#pragma once

#include <cstdint>
#include <concepts>
#include <utility>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "qrecipe/adam_host.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::sdk {

// The checks of one extra call that read no tensor data, made before the plugin's own: struct
// sizes, a hyper per tensor, one device for everything, F32 contiguous 2-D masters, gradients
// (F32/BF16/F16) and moments (F32/BF16) of the master's shape and contiguous, a destination
// of the master's shape holding at least one direction. `format` names the plugin.
inline void check_adam_call(const qr_adam_tensor* tensors, std::uint32_t count,
                            const char* format) {
  QR_CHECK(tensors != nullptr && count >= 1, format, " adam_requantize: called with ", count,
           " tensors and ", tensors ? "a" : "a null", " tensor array; pass at least one");
  const qr_device device = tensors[0].master.device;
  for (std::uint32_t i = 0; i < count; ++i) {
    const qr_adam_tensor& t = tensors[i];
    QR_CHECK(t.struct_size >= sizeof(qr_adam_tensor), format, " adam_requantize: tensor ", i,
             " has struct_size ", t.struct_size, " < ", sizeof(qr_adam_tensor));
    QR_CHECK(t.quantizer != nullptr && t.dst != nullptr && t.hyper != nullptr, format,
             " adam_requantize: tensor ", i, " has a null quantizer, destination or hyper");
    QR_CHECK(t.hyper->struct_size >= sizeof(qr_adam_hyper), format, " adam_requantize: tensor ",
             i, " has a hyper with struct_size ", t.hyper->struct_size, " < ",
             sizeof(qr_adam_hyper));
    QR_CHECK(t.hyper->step_device != nullptr || t.hyper->step >= 1, format,
             " adam_requantize: tensor ", i, " has step ", t.hyper->step,
             "; the step count after the increment is >= 1");
    QR_CHECK(t.master.dtype == QR_DTYPE_F32 && t.master.ndim == 2, format,
             " adam_requantize: tensor ", i, " master must be a 2-D F32 view, got ",
             TensorView(t.master).str());
    const std::int64_t rows = t.master.shape[0], cols = t.master.shape[1];
    const struct {
      const qr_tensor_view* view;
      const char* name;
      bool moment;
    } parts[] = {{&t.master, "master", false},
                 {&t.grad, "grad", false},
                 {&t.exp_avg, "exp_avg", true},
                 {&t.exp_avg_sq, "exp_avg_sq", true}};
    for (const auto& part : parts) {
      const TensorView v(*part.view);
      QR_CHECK(part.view->struct_size >= sizeof(qr_tensor_view), format,
               " adam_requantize: tensor ", i, " ", part.name, " view has a short struct_size");
      QR_CHECK(part.moment ? adam::is_moment_dtype(part.view->dtype)
                           : adam::is_value_dtype(part.view->dtype),
               format, " adam_requantize: tensor ", i, " ", part.name, " has dtype ",
               dtype_str(part.view->dtype), "; expected ",
               part.moment ? "f32 or bf16" : "f32, bf16 or f16");
      QR_CHECK(v.rows() == rows && v.cols() == cols && v.numel() == rows * cols, format,
               " adam_requantize: tensor ", i, " ", part.name, " is ", v.str(),
               " but the master is [", rows, ", ", cols, "]");
      QR_CHECK(v.is_contiguous(), format, " adam_requantize: tensor ", i, " ", part.name,
               " must be contiguous, got ", v.str(), " with non-default strides");
      QR_CHECK(part.view->data != nullptr || rows * cols == 0, format,
               " adam_requantize: tensor ", i, " ", part.name, " has no data pointer");
      QR_CHECK(same_device(part.view->device, device), format, " adam_requantize: tensor ", i,
               " ", part.name, " is on ", device_str(part.view->device), " but tensor 0's "
               "master is on ", device_str(device), "; one call serves one device");
    }
    QR_CHECK(t.dst->rows == rows && t.dst->cols == cols, format, " adam_requantize: tensor ", i,
             " destination is ", t.dst->rows, " x ", t.dst->cols, " but the master is ", rows,
             " x ", cols);
    QR_CHECK((t.dst->usage & (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) != 0, format,
             " adam_requantize: tensor ", i, " destination holds no direction");
  }
}

// The CPU path of the extra for one tensor (host memory): the update, then q.quantize of the
// new master into dst with dst's usage (q: the plugin's quantizer class, its CPU reference).
template <class Q>
void adam_requantize_host(Q& q, const qr_adam_tensor& t) {
  const std::int64_t n = t.master.shape[0] * t.master.shape[1];
  adam::update_host({t.master.data, t.master.dtype}, {t.grad.data, t.grad.dtype},
                    {t.exp_avg.data, t.exp_avg.dtype}, {t.exp_avg_sq.data, t.exp_avg_sq.dtype},
                    n, adam::host_scalars(*t.hyper));
  qr_quantize_args args{};
  args.struct_size = sizeof(qr_quantize_args);
  args.usage = t.dst->usage & (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
  q.quantize(t.master, args, *t.dst);  // the F32 [rows, cols] master as the source
}

// Copies `text` into a C buffer of `capacity` bytes (NUL-terminated, truncated to fit).
inline void copy_reason(const std::string& text, char* buffer, std::size_t capacity) {
  if (buffer == nullptr || capacity == 0) return;
  const std::size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}

// C trampolines of the two extras for quantizer class Q (see the how-to above).
template <class Q, bool (*Fusable)(Q&, const qr_device&, bool, std::string&),
          void (*DevicePass)(std::span<const qr_adam_tensor>, void*)>
struct AdamTrampolines {
  static Q& self(qr_quantizer* q) { return *reinterpret_cast<Q*>(q); }

  static qr_status requantize(const qr_adam_tensor* tensors, std::uint32_t count,
                              void* stream) noexcept {
    return guard([&] {
      check_adam_call(tensors, count, "plugin");
      const qr_device device = tensors[0].master.device;
      if (device.type == QR_DEVICE_CPU) {
        for (std::uint32_t i = 0; i < count; ++i)
          adam_requantize_host(self(tensors[i].quantizer), tensors[i]);
        return;
      }
      for (std::uint32_t i = 0; i < count; ++i) {
        std::string why;
        QR_CHECK_CODE(Fusable(self(tensors[i].quantizer), device, false, why),
                      QR_STATUS_UNSUPPORTED, "adam_requantize: tensor ", i, " has a quantizer "
                      "this plugin does not fuse on ", device_str(device), " (", why,
                      "); ask qr_adam_requantize_supports first and serve it with the update "
                      "followed by quantize");
      }
      DevicePass(std::span<const qr_adam_tensor>(tensors, count), stream);
    });
  }

  static std::int32_t supports(qr_quantizer* q, qr_device device, std::int32_t capturable,
                               char* reason, std::size_t capacity) noexcept {
    try {
      if (q == nullptr) {
        copy_reason("no quantizer given", reason, capacity);
        return 0;
      }
      if (device.type == QR_DEVICE_CPU) return 1;  // the CPU path serves every quantizer
      std::string why;
      if (Fusable(self(q), device, capturable != 0, why)) return 1;
      copy_reason(why, reason, capacity);
      return 0;
    } catch (const std::exception& e) {
      copy_reason(e.what(), reason, capacity);
      return 0;
    } catch (...) {
      copy_reason("unknown exception in the plugin", reason, capacity);
      return 0;
    }
  }
};

// The descriptor's get_proc_address for the two Adam extras, given the fusable test and the
// device pass (nullptr for other names). adam_extras<Q> below is the usual way in.
template <class Q, bool (*Fusable)(Q&, const qr_device&, bool, std::string&),
          void (*DevicePass)(std::span<const qr_adam_tensor>, void*)>
void* adam_extras_of(const char* name) {
  using T = AdamTrampolines<Q, Fusable, DevicePass>;
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, QR_EXTRA_ADAM_REQUANTIZE) == 0) {
    const qr_adam_requantize_fn fn = &T::requantize;
    return reinterpret_cast<void*>(fn);  // POSIX: function pointers round-trip through void*
  }
  if (std::strcmp(name, QR_EXTRA_ADAM_REQUANTIZE_SUPPORTS) == 0) {
    const qr_adam_requantize_supports_fn fn = &T::supports;
    return reinterpret_cast<void*>(fn);
  }
  return nullptr;
}

// A quantizer class with the optional member of the how-to's step 3.
template <class Q>
concept HasAdamFusable = requires(Q& q, const qr_device& d, bool capturable, std::string& why) {
  { q.adam_fusable(d, capturable, why) } -> std::convertible_to<bool>;
};

// Steps 1 to 3 of the how-to as the fusable test and the device pass.
template <class Q>
bool planned_adam_fusable(Q& q, const qr_device& device, bool capturable, std::string& why) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  if constexpr (HasAdamFusable<Q>) return q.adam_fusable(device, capturable, why);
  (void)q;
  (void)device;
  (void)capturable;
  return true;
#else
  (void)q;
  (void)device;
  (void)capturable;
  why = "this build of the plugin has no CUDA kernels";
  return false;
#endif
}

template <class Q>
void planned_adam_pass(std::span<const qr_adam_tensor> tensors, void* stream) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  using Plan = decltype(std::declval<Q&>().adam_plan(std::declval<const qr_adam_tensor&>()));
  std::vector<Plan> plans;
  plans.reserve(tensors.size());
  for (const qr_adam_tensor& t : tensors) {
    Q& q = *reinterpret_cast<Q*>(t.quantizer);
    // What quantize checks of a destination: every direction it holds is the quantizer's
    // layout for the master's shape, its buffers on the master's device.
    const char* format = t.dst->format != nullptr ? t.dst->format : "plugin";
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
      if (t.dst->usage & usage_of(d))
        check_destination(direction_data(*t.dst, d),
                          q.layout(t.master.shape[0], t.master.shape[1], d), d, t.master.device,
                          format, "adam_requantize");
    plans.push_back(q.adam_plan(t));
  }
  adam_requantize(tensors, std::span<const Plan>(plans), stream);  // the plugin's CUDA entry
#else
  (void)tensors;
  (void)stream;
  QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "adam_requantize: this build of the plugin has no CUDA "
                "kernels");
#endif
}

// The descriptor's get_proc_address of the how-to (QR_DEFINE_PLUGIN_EX's last argument).
template <class Q>
void* adam_extras(const char* name) {
  return adam_extras_of<Q, &planned_adam_fusable<Q>, &planned_adam_pass<Q>>(name);
}

}  // namespace qrecipe::sdk
