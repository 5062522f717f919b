// Header-only host-side helpers for plugin CPU references: reading f32/bf16/f16 source views
// as FP32 (any rank, any strides), the usual source-view checks, and writing decoded FP32 to
// f32/bf16/f16 outputs. Every conversion goes through qrecipe::num (conversions.hpp), so the
// values are exactly those the CUDA kernels produce. Nothing here is linked from the engine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qrecipe/checked.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::sdk {

// Name of a qr_dtype for messages ("unknown dtype" for values outside the enum).
inline const char* dtype_str(std::int32_t dtype) {
  if (dtype < QR_DTYPE_F32 || dtype > QR_DTYPE_F64) return "unknown dtype";
  return dtype_name(static_cast<DType>(dtype)).data();  // names are NUL-terminated literals
}

// "cpu" or "cuda:<index>", for messages.
inline std::string device_str(const qr_device& d) {
  return d.type == QR_DEVICE_CPU ? "cpu" : "cuda:" + std::to_string(d.index);
}

// "[d0, d1, ...]" of a view, for messages.
inline std::string shape_str(const qr_tensor_view& v) {
  std::string s = "[";
  for (int d = 0; d < v.ndim; ++d) s += (d ? ", " : "") + std::to_string(v.shape[d]);
  return s + "]";
}

// Whether a view is row-major contiguous (dimensions of size 1 may have any stride).
inline bool is_contiguous(const qr_tensor_view& v) {
  std::int64_t expected = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    if (v.shape[d] != 1 && v.strides[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

// Name of a qr_quantized_tensor usage mask, for messages.
inline const char* usage_name(std::uint32_t usage) {
  switch (usage) {
    case QR_USAGE_ROWWISE: return "rowwise";
    case QR_USAGE_COLUMNWISE: return "columnwise";
    case QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE: return "rowwise+columnwise";
    default: return "no direction";
  }
}

// Reads element `offset` (in elements) of a f32/bf16/f16 buffer as FP32 (exact widening).
// Any dtype other than f32/bf16 is read as f16: check the dtype first (check_source_dtype).
inline float load_f32(const void* base, std::int32_t dtype, std::int64_t offset) {
  switch (dtype) {
    case QR_DTYPE_F32: return static_cast<const float*>(base)[offset];
    case QR_DTYPE_BF16: return num::bf16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
    default: return num::f16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
  }
}

// Writes FP32 `v` to element `offset` of a f32/bf16/f16 buffer (round to nearest even).
// Any dtype other than f32/bf16 is written as f16: check the dtype first.
inline void store_f32_as(void* dst, std::int32_t dtype, std::int64_t offset, float v) {
  switch (dtype) {
    case QR_DTYPE_F32: static_cast<float*>(dst)[offset] = v; break;
    case QR_DTYPE_BF16: static_cast<std::uint16_t*>(dst)[offset] = num::f32_to_bf16(v); break;
    default: static_cast<std::uint16_t*>(dst)[offset] = num::f32_to_f16(v); break;
  }
}

// A source must be f32, bf16 or f16; `format` names the plugin in the message.
inline void check_source_dtype(std::int32_t dtype, const char* format) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, format, " quantizes f32, bf16 or f16 sources; got ",
                dtype_str(dtype), ". Convert the tensor to one of those first");
}

// A CPU reference reads host memory; `status` is the code the plugin reports when it does not.
inline void check_host_source(const qr_tensor_view& src, const char* format,
                              qr_status_code status = QR_STATUS_UNSUPPORTED) {
  QR_CHECK_CODE(src.device.type == QR_DEVICE_CPU, status, "the ", format,
                " CPU reference reads host memory; the source is on cuda:", src.device.index);
}

// How check_source_view treats the source's device.
enum class SourceDevice {
  kAny,                   // no device check (the caller checks, or CUDA sources are fine)
  kHostUnsupported,       // a device source is QR_STATUS_UNSUPPORTED
  kHostInvalidArgument,   // a device source is QR_STATUS_INVALID_ARGUMENT
};

// The checks every reference makes of a source view, in this order: struct_size, ndim,
// dtype (f32/bf16/f16), device (per `device`), then no negative dimension.
inline void check_source_view(const qr_tensor_view& src, const char* format,
                              SourceDevice device = SourceDevice::kAny) {
  QR_CHECK(src.struct_size >= sizeof(qr_tensor_view), "source view struct_size ",
           src.struct_size, " is smaller than this build's ", sizeof(qr_tensor_view));
  QR_CHECK(src.ndim >= 0 && src.ndim <= QR_MAX_DIMS, "source view has ndim ", src.ndim,
           "; expected 0..", QR_MAX_DIMS);
  check_source_dtype(src.dtype, format);
  if (device != SourceDevice::kAny)
    check_host_source(src, format,
                      device == SourceDevice::kHostUnsupported ? QR_STATUS_UNSUPPORTED
                                                               : QR_STATUS_INVALID_ARGUMENT);
  for (int d = 0; d < src.ndim; ++d)
    QR_CHECK(src.shape[d] >= 0, "source dimension ", d, " is negative (", src.shape[d], ")");
}

// Number of elements of a view (1 for rank 0).
inline std::int64_t numel(const qr_tensor_view& v) {
  std::int64_t n = 1;
  for (int d = 0; d < v.ndim; ++d) n = checked_mul(n, v.shape[d], "elements of a view");
  return n;
}

// The 2-D logical shape of a view: [prod(leading dims), last dim] ([1, 1] for rank 0).
inline std::int64_t view_rows(const qr_tensor_view& v) {
  std::int64_t r = 1;
  for (int d = 0; d + 1 < v.ndim; ++d) r = checked_mul(r, v.shape[d], "rows of a view");
  return r;
}
inline std::int64_t view_cols(const qr_tensor_view& v) {
  return v.ndim == 0 ? 1 : v.shape[v.ndim - 1];
}
inline void matrix_shape(const qr_tensor_view& v, std::int64_t& rows, std::int64_t& cols) {
  cols = view_cols(v);
  rows = view_rows(v);
}

// Whether two devices are the same one (the index of a CPU device is ignored).
inline bool same_device(const qr_device& a, const qr_device& b) {
  return a.type == b.type && (a.type == QR_DEVICE_CPU || a.index == b.index);
}

// The rows [row_begin, row_begin + rows) of a 2-D view, as a view of their own (same
// strides): group g of a grouped quantize call (plugin_abi.h quantize_grouped).
inline qr_tensor_view row_slice(const qr_tensor_view& src, std::int64_t row_begin,
                                std::int64_t rows) {
  qr_tensor_view v = src;
  v.shape[0] = rows;
  if (src.data != nullptr && rows > 0)
    v.data = static_cast<char*>(src.data) +
             row_begin * src.strides[0] * dtype_bits(static_cast<DType>(src.dtype)) / 8;
  return v;
}

// Calls quantize_one(rows of group g as a view, *dst[g]) for g = 0, 1, ... in order: grouped
// quantization by its definition (plugin_abi.h, QR_EXTRA_QUANTIZE_GROUPED), which is what a
// CPU reference runs.
template <class Fn>
void for_each_group(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                    std::span<qr_quantized_tensor* const> dst, Fn&& quantize_one) {
  std::int64_t row = 0;
  for (std::size_t g = 0; g < dst.size(); ++g) {
    quantize_one(row_slice(src, row, group_rows[g]), *dst[g]);
    row += group_rows[g];
  }
}

// The grouped extra by its definition, through the plugin's own one-tensor `quantize`: what a
// format runs where it has no grouped kernel (its CPU reference, or shapes a kernel skips).
template <class Quantizer>
void quantize_each_group(Quantizer& quantizer, const qr_tensor_view& src,
                         std::span<const std::int64_t> group_rows, const qr_quantize_args& args,
                         std::span<qr_quantized_tensor* const> dst) {
  for_each_group(src, group_rows, dst, [&](const qr_tensor_view& rows, qr_quantized_tensor& out) {
    quantizer.quantize(rows, args, out);
  });
}

// Calls fn(offset) with the element offset of every element of v in logical row-major order.
// The view is walked with an N-D counter, so any strides (0, negative, padded) are fine.
template <class Fn>
void for_each_offset(const qr_tensor_view& v, Fn&& fn) {
  const std::int64_t n = numel(v);
  if (n == 0) return;
  std::int64_t index[QR_MAX_DIMS] = {};
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    fn(offset);
    // Advance the counter: bump the last dimension, carrying into earlier ones.
    for (int d = v.ndim - 1; d >= 0; --d) {
      ++index[d];
      offset += v.strides[d];
      if (index[d] < v.shape[d]) break;
      offset -= v.strides[d] * v.shape[d];
      index[d] = 0;
    }
  }
}

// Calls fn(value) with every element of a checked f32/bf16/f16 host view as FP32, in logical
// row-major order.
template <class Fn>
void for_each_element(const qr_tensor_view& src, Fn&& fn) {
  for_each_offset(src, [&](std::int64_t offset) { fn(load_f32(src.data, src.dtype, offset)); });
}

// All elements of a checked f32/bf16/f16 host view as FP32, in logical row-major order.
inline std::vector<float> gather_f32(const qr_tensor_view& src) {
  std::vector<float> out(static_cast<std::size_t>(numel(src)));
  std::size_t i = 0;
  for_each_element(src, [&](float v) { out[i++] = v; });
  return out;
}

}  // namespace qrecipe::sdk
