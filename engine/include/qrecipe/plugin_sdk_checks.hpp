// Header-only checks that every format plugin's entry points make, and the direction helpers
// they use: a direction's name, usage bit and part of a quantized tensor; the device a call
// may run on; a quantize call's arguments and destination buffers against the plugin's own
// layout; a dequantize call's source direction and destination. Messages name the plugin
// (`format`), the operation and the direction, say what was expected and what to do next.
// Nothing here is linked from the engine.
//
// Why a plugin checks what the engine's Quantizer checks too: the C entry points are the
// boundary (plugin_abi.h; docs/architecture.md, "Conventions", rule 4). The host table's
// quantizer_quantize and
// quantizer_dequantize (how a format built from others runs its sub-quantizers) and direct callers of the descriptor
// reach a plugin without the engine's checks in front, so a plugin refuses bad arguments with
// an error value itself instead of writing out of bounds.
//
// What stays in a plugin: its layout (the `want` these checks compare with), the options and
// sources its numerics accept, and what it needs of a stored direction it reads (the layout
// it decodes with, e.g. another block shape or element dtype of the same format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"

namespace qrecipe::sdk {

// ---------------------------------------------------------------- directions

// "rowwise" or "columnwise", for messages.
inline const char* direction_str(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? "rowwise" : "columnwise";
}

// The qr_usage bit of a direction.
inline std::uint32_t usage_of(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? QR_USAGE_ROWWISE : QR_USAGE_COLUMNWISE;
}

// Direction d's part of a quantized tensor.
inline const qr_direction_data& direction_data(const qr_quantized_tensor& t, qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? t.rowwise : t.columnwise;
}
inline qr_direction_data& direction_data(qr_quantized_tensor& t, qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? t.rowwise : t.columnwise;
}

// ---------------------------------------------------------------- devices

// The tensor that decides where a call runs (`what`: "the source", "the destination") must be
// on a device this build of the plugin serves: the CPU (its reference), or CUDA when it was
// built with kernels (kHasCuda). Anything else is QR_STATUS_UNSUPPORTED: there is no silent
// fallback to the CPU reference for device memory.
inline void require_supported_device(const qr_device& device, const char* format,
                                     const char* op, const char* what) {
  QR_CHECK_CODE(device.type != QR_DEVICE_CUDA || kHasCuda, QR_STATUS_UNSUPPORTED, format, " ",
                op, ": ", what, " is on cuda:", device.index, " but this ", format,
                " plugin was built without CUDA kernels; rebuild with -DQRECIPE_CUDA=ON, or "
                "move the tensor to the CPU (there is no silent CPU fallback)");
  QR_CHECK_CODE(device.type == QR_DEVICE_CPU || device.type == QR_DEVICE_CUDA,
                QR_STATUS_UNSUPPORTED, format, " ", op, ": ", what, " is on unknown device type ",
                device.type);
}

// The CUDA kernels read a source as contiguous row-major [rows, cols]; a strided device view
// is QR_STATUS_UNSUPPORTED (the CPU references read any strides).
inline void require_contiguous_source(const qr_tensor_view& src, const char* format,
                                      const char* op) {
  QR_CHECK_CODE(is_contiguous(src), QR_STATUS_UNSUPPORTED, format, " ", op,
                ": the CUDA kernels need a contiguous source, got shape ", shape_str(src),
                " with non-default strides; make it contiguous first (tensor.contiguous())");
}

// ---------------------------------------------------------------- layouts

// Whether two layouts describe the same stored bytes (every field but struct_size and format).
inline bool same_layout(const qr_direction_layout& a, const qr_direction_layout& b) {
  return a.data_dtype == b.data_dtype && a.data_ndim == b.data_ndim &&
         a.data_shape[0] == b.data_shape[0] && a.data_shape[1] == b.data_shape[1] &&
         a.data_transposed == b.data_transposed && a.scale_mode == b.scale_mode &&
         a.scale_dtype == b.scale_dtype && a.scale_ndim == b.scale_ndim &&
         a.scale_shape[0] == b.scale_shape[0] && a.scale_shape[1] == b.scale_shape[1] &&
         a.scale_transposed == b.scale_transposed && a.block_rows == b.block_rows &&
         a.block_cols == b.block_cols && a.has_amax == b.has_amax;
}

// "e4m3 data [130, 130], f32 scales [2, 2], blocks 128x128, amax", for messages.
inline std::string layout_str(const qr_direction_layout& l) {
  auto dims = [](std::int32_t ndim, const std::int64_t* shape) {
    std::string s = "[";
    for (int d = 0; d < ndim && d < 2; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    return s + "]";
  };
  std::string s = std::string(dtype_str(l.data_dtype)) + " data " +
                  dims(l.data_ndim, l.data_shape) + (l.data_transposed ? " transposed" : "");
  if (l.scale_ndim > 0)
    s += std::string(", ") + dtype_str(l.scale_dtype) + " scales " +
         dims(l.scale_ndim, l.scale_shape) + (l.scale_transposed ? " transposed" : "");
  s += ", blocks " + std::to_string(l.block_rows) + "x" + std::to_string(l.block_cols);
  return l.has_amax ? s + ", amax" : s;
}

namespace detail {

// One buffer of a direction: `dtype` of `shape` (ndim 1 or 2), contiguous, non-null unless it
// holds no element, on `device` (the device of the tensor that decides the call, `decider`).
inline void check_buffer(const qr_tensor_view& v, const char* name, std::int32_t dtype,
                         std::int32_t ndim, const std::int64_t* shape, const qr_device& device,
                         const char* decider, const char* format, const char* op,
                         const char* dir) {
  QR_CHECK(v.struct_size >= sizeof(qr_tensor_view) && v.ndim >= 0 && v.ndim <= QR_MAX_DIMS,
           format, " ", op, ": the ", dir, " ", name, " view has struct_size ", v.struct_size,
           " and ndim ", v.ndim, "; expected struct_size >= ", sizeof(qr_tensor_view),
           " and ndim 0..", QR_MAX_DIMS);
  bool shape_ok = v.ndim == ndim;
  std::int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    shape_ok = shape_ok && v.shape[d] == shape[d];
    numel *= shape[d];
  }
  QR_CHECK(v.dtype == dtype && shape_ok && is_contiguous(v), format, " ", op, ": the ", dir,
           " ", name, " buffer is ", dtype_str(v.dtype), shape_str(v),
           (is_contiguous(v) ? "" : " (strided)"), "; expected contiguous ", dtype_str(dtype),
           "[", shape[0], (ndim > 1 ? ", " + std::to_string(shape[1]) : std::string()),
           "]. Allocate it from this quantizer's layout");
  QR_CHECK(v.data != nullptr || numel == 0, format, " ", op, ": the ", dir, " ", name,
           " buffer of ", numel, " elements has a null data pointer");
  QR_CHECK(same_device(v.device, device), format, " ", op, ": the ", dir, " ", name,
           " buffer is on ", device_str(v.device), " but ", decider, " is on ",
           device_str(device), "; allocate it on the same device");
}

// The layout of direction d and its buffers are exactly `want`; see check_destination.
inline void check_direction(const qr_direction_data& dd, const qr_direction_layout& want,
                            qr_direction d, const qr_device& device, const char* format,
                            const char* op, bool writing) {
  const char* dir = direction_str(d);
  QR_CHECK(dd.struct_size >= sizeof(qr_direction_data), format, " ", op, ": the ", dir,
           " qr_direction_data has struct_size ", dd.struct_size, "; expected at least ",
           sizeof(qr_direction_data));
  if (writing)
    QR_CHECK(same_layout(dd.layout, want), format, " ", op, ": the ", dir,
             " destination is laid out as (", layout_str(dd.layout), ") but this quantizer "
             "writes (", layout_str(want), "); allocate the destination from this quantizer's "
             "layout");
  else
    QR_CHECK(same_layout(dd.layout, want), format, " ", op, ": the ", dir,
             " data is laid out as (", layout_str(dd.layout), ") but ", format, " reads (",
             layout_str(want), "); was it made by another format?");
  const char* decider = writing ? "the source" : "the destination";
  check_buffer(dd.data, "data", want.data_dtype, want.data_ndim, want.data_shape, device,
               decider, format, op, dir);
  if (want.scale_ndim > 0)
    check_buffer(dd.scale_inv, "scale_inv", want.scale_dtype, want.scale_ndim, want.scale_shape,
                 device, decider, format, op, dir);
  if (want.has_amax) {
    const std::int64_t one[2] = {1, 0};
    check_buffer(dd.amax, "amax", QR_DTYPE_F32, 1, one, device, decider, format, op, dir);
  }
}

}  // namespace detail

// ---------------------------------------------------------------- quantize

// The checks a quantize call makes of its arguments: args.struct_size, a usage of rowwise (1),
// columnwise (2) or both (3), and a destination that holds every requested direction.
// Returns the usage.
inline std::uint32_t check_quantize_usage(const qr_quantize_args& args,
                                          const qr_quantized_tensor& dst, const char* format) {
  QR_CHECK(args.struct_size >= sizeof(qr_quantize_args), "qr_quantize_args struct_size ",
           args.struct_size, " is smaller than this plugin's ", sizeof(qr_quantize_args));
  const std::uint32_t usage = args.usage;
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0, format,
           " quantize: usage must be rowwise (1), columnwise (2) or both (3); got ", usage);
  QR_CHECK((dst.usage & usage) == usage, format, " quantize: ", usage_name(usage),
           " requested but the destination holds ", usage_name(dst.usage),
           "; allocate the destination with the requested usage");
  return usage;
}

// Direction d of a quantize destination is what `want` (the plugin's layout for the call's
// shape) describes: its layout, and its buffers (data and scale_inv of the layout's dtypes and
// shapes, contiguous, non-null where they hold elements, an f32 [1] amax where the layout has
// one), every buffer on `device` (the source's). The kernels and references index the buffers
// with those shapes, so nothing else is safe to write.
inline void check_destination(const qr_direction_data& dd, const qr_direction_layout& want,
                              qr_direction d, const qr_device& device, const char* format,
                              const char* op) {
  detail::check_direction(dd, want, d, device, format, op, /*writing=*/true);
}

// The checks of a quantize call (`op`: "quantize", or "quantize_grouped" for each group) that
// do not depend on the format: check_quantize_usage; a source view on a device this build
// serves whose 2-D shape is the destination's; check_destination of every requested
// direction against quantizer.layout(rows, cols, d) (the plugin's own layout). Returns the
// usage.
inline std::uint32_t check_quantize_call(const qr_tensor_view& src, const qr_quantize_args& args,
                                         const qr_quantized_tensor& dst, const char* format,
                                         const char* op, const QuantizerBase& quantizer) {
  const std::uint32_t usage = check_quantize_usage(args, dst, format);
  QR_CHECK(src.struct_size >= sizeof(qr_tensor_view) && src.ndim >= 0 &&
               src.ndim <= QR_MAX_DIMS,
           format, " ", op, ": the source view has struct_size ", src.struct_size, " and ndim ",
           src.ndim, "; expected struct_size >= ", sizeof(qr_tensor_view), " and ndim 0..",
           QR_MAX_DIMS);
  require_supported_device(src.device, format, op, "the source");
  const std::int64_t rows = view_rows(src), cols = view_cols(src);
  QR_CHECK(dst.rows == rows && dst.cols == cols, format, " ", op, ": the source is ", rows,
           " x ", cols, " (as 2-D) but the destination is ", dst.rows, " x ", dst.cols);
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (usage & usage_of(d))
      check_destination(direction_data(dst, d), quantizer.layout(rows, cols, d), d, src.device,
                        format, op);
  return usage;
}

// ---------------------------------------------------------------- dequantize

// The checks of a dequantize call that do not depend on the format: the tensor holds
// `direction`; the destination is on a device this build serves, f32, bf16 or f16 (what
// store_f32_as and the kernels write), a contiguous view of the tensor's [rows, cols] with a
// data pointer unless empty. Returns the direction's part of `src`; the plugin then checks it
// with check_stored (against the layout it decodes with) and its own needs.
inline const qr_direction_data& check_dequantize_call(const qr_quantized_tensor& src,
                                                      qr_direction direction,
                                                      const qr_tensor_view& dst,
                                                      const char* format) {
  QR_CHECK(direction == QR_DIRECTION_ROWWISE || direction == QR_DIRECTION_COLUMNWISE, format,
           " dequantize: direction ", static_cast<int>(direction),
           " is neither rowwise (0) nor columnwise (1)");
  QR_CHECK(src.usage & usage_of(direction), format, " dequantize: the tensor holds ",
           usage_name(src.usage), " data, not ", direction_str(direction),
           "; quantize with that usage");
  QR_CHECK(dst.struct_size >= sizeof(qr_tensor_view) && dst.ndim >= 0 &&
               dst.ndim <= QR_MAX_DIMS,
           format, " dequantize: the destination view has struct_size ", dst.struct_size,
           " and ndim ", dst.ndim, "; expected struct_size >= ", sizeof(qr_tensor_view),
           " and ndim 0..", QR_MAX_DIMS);
  require_supported_device(dst.device, format, "dequantize", "the destination");
  QR_CHECK_CODE(dst.dtype == QR_DTYPE_F32 || dst.dtype == QR_DTYPE_BF16 ||
                    dst.dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, format, " dequantize: the destination must be f32, bf16 "
                "or f16; got ", dtype_str(dst.dtype));
  QR_CHECK(view_rows(dst) == src.rows && view_cols(dst) == src.cols, format,
           " dequantize: the destination is ", view_rows(dst), " x ", view_cols(dst),
           " (as 2-D) but the tensor is ", src.rows, " x ", src.cols);
  QR_CHECK(is_contiguous(dst), format, " dequantize: the destination must be contiguous; got "
           "shape ", shape_str(dst), " with non-default strides");
  QR_CHECK(dst.data != nullptr || src.rows * src.cols == 0, format,
           " dequantize: the destination has a null data pointer");
  return direction_data(src, direction);
}

// A stored direction that a dequantize reads is what `want` (the layout the plugin decodes it
// with) describes, its buffers as check_destination says, on `device` (the destination's).
inline void check_stored(const qr_direction_data& dd, const qr_direction_layout& want,
                         qr_direction d, const qr_device& device, const char* format) {
  detail::check_direction(dd, want, d, device, format, "dequantize", /*writing=*/false);
}


// ---------------------------------------------------------------- device-split groups

// The source of a device-split grouped call (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE):
// a contiguous CUDA tensor this build serves. Host tensors take host splits (the descriptor's
// quantize_grouped), so another device is QR_STATUS_UNSUPPORTED.
inline void check_grouped_device_source(const qr_tensor_view& src, const char* format) {
  QR_CHECK_CODE(src.device.type == QR_DEVICE_CUDA, QR_STATUS_UNSUPPORTED, format,
                " quantize_grouped_device: device-split groups are for CUDA tensors, the source "
                "is on device type ", src.device.type, "; pass host splits for CPU tensors");
  require_supported_device(src.device, format, "quantize_grouped_device", "the source");
  require_contiguous_source(src, format, "quantize_grouped_device");
}

// Direction d of a device-split grouped destination, requested: its buffers hold at least what
// the quantizer's grouped_device_sizes gives for the call, its scale_inv is set and, when the
// format keeps one (`needs_amax`), its amax. Returns the direction.
template <class Q>
const qr_grouped_direction& check_grouped_device_direction(const Q& q,
                                                           const qr_grouped_quantized& dst,
                                                           qr_direction d, bool needs_amax,
                                                           const char* format) {
  const qr_grouped_direction& gd = d == QR_DIRECTION_ROWWISE ? dst.rowwise : dst.columnwise;
  std::size_t data = 0, scales = 0;
  q.grouped_device_sizes(dst.rows, dst.cols, dst.num_groups, d, data, scales);
  QR_CHECK(gd.data_bytes >= data && gd.scale_bytes >= scales && gd.scale_inv != nullptr &&
               (!needs_amax || gd.amax != nullptr),
           format, " quantize_grouped_device: the ", direction_str(d), " buffers hold ",
           gd.data_bytes, " / ", gd.scale_bytes, " bytes",
           needs_amax && !gd.amax ? " and no amax" : "", ", need ", data, " / ", scales,
           " (grouped_device_sizes)", gd.scale_inv ? "" : " and a scale_inv buffer");
  return gd;
}

}  // namespace qrecipe::sdk
