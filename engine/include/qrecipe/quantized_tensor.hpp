// QuantizedTensor: the owning C++ face of qr_quantized_tensor (DESIGN.md section 3).
//
// It owns the buffers of each direction it holds (allocated from an Allocator according to
// the quantizer's layout) and keeps the C struct's views pointing into them. Move-only; moving
// keeps the views valid because buffers are heap objects that do not move.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

inline const char* direction_name(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? "rowwise" : "columnwise";
}
inline std::uint32_t usage_bit(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? QR_USAGE_ROWWISE : QR_USAGE_COLUMNWISE;
}
inline std::string usage_str(std::uint32_t usage) {
  if (usage == (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) return "rowwise+columnwise";
  if (usage == QR_USAGE_ROWWISE) return "rowwise";
  if (usage == QR_USAGE_COLUMNWISE) return "columnwise";
  return "none";
}

class QuantizedTensor {
 public:
  QuantizedTensor() { c_.struct_size = sizeof(qr_quantized_tensor); }

  // Allocate zero-filled buffers for the directions in `usage`; layouts[d] describes direction d.
  QuantizedTensor(const std::string& format, std::int64_t rows, std::int64_t cols,
                  std::uint32_t usage, const std::array<qr_direction_layout, 2>& layouts,
                  Device device, std::shared_ptr<Allocator> allocator)
      : format_(format) {
    c_.struct_size = sizeof(qr_quantized_tensor);
    c_.format = format_.c_str();
    c_.rows = rows;
    c_.cols = cols;
    c_.usage = usage;
    for (int d = 0; d < 2; ++d) {
      const auto dir = static_cast<qr_direction>(d);
      qr_direction_data& dd = direction_data(dir);
      dd.struct_size = sizeof(qr_direction_data);
      dd.data.struct_size = dd.scale_inv.struct_size = dd.amax.struct_size = sizeof(qr_tensor_view);
      if (!(usage & usage_bit(dir))) continue;
      const qr_direction_layout& l = layouts[d];
      QR_CHECK(l.struct_size >= sizeof(qr_direction_layout), "layout of ", direction_name(dir),
               " for format '", format, "' has struct_size ", l.struct_size);
      dd.layout = l;
      formats_[d] = l.format ? l.format : format;
      dd.layout.format = formats_[d].c_str();
      auto& store = storage_[d];
      store = std::make_unique<Storage>();
      // A data buffer that holds exactly rows x cols values is written in full by every
      // quantize (plugin_abi.h), so it is not zero-filled first: on the GPU that fill was a
      // whole extra pass over the output. Padded data, scales and amax start at zero.
      // (Sub-byte codes with an odd row length leave a padding nibble per row: zero-filled.)
      // (An invalid rank is reported by allocate() below.)
      Buffer::Fill data_fill = Buffer::Fill::zero;
      if (l.data_ndim >= 1 && l.data_ndim <= 2) {
        std::int64_t values = 1;
        for (int i = 0; i < l.data_ndim; ++i) values *= l.data_shape[i];
        const bool whole_bytes = dtype_bits(static_cast<DType>(l.data_dtype)) >= 8 ||
                                 l.data_shape[l.data_ndim - 1] % 2 == 0;
        if (values == rows * cols && whole_bytes) data_fill = Buffer::Fill::none;
      }
      dd.data = allocate(store->data, static_cast<DType>(l.data_dtype), l.data_ndim,
                         l.data_shape, device, allocator, data_fill);
      if (l.scale_ndim > 0)
        dd.scale_inv = allocate(store->scale, static_cast<DType>(l.scale_dtype), l.scale_ndim,
                                l.scale_shape, device, allocator, Buffer::Fill::zero);
      if (l.has_amax) {
        const std::int64_t one[2] = {1, 0};
        dd.amax = allocate(store->amax, DType::f32, 1, one, device, allocator, Buffer::Fill::zero);
      }
    }
  }

  QuantizedTensor(QuantizedTensor&& o) noexcept { *this = std::move(o); }
  QuantizedTensor& operator=(QuantizedTensor&& o) noexcept {
    if (this == &o) return *this;
    format_ = std::move(o.format_);
    formats_ = std::move(o.formats_);
    storage_ = std::move(o.storage_);
    c_ = o.c_;
    c_.format = format_.c_str();
    for (int d = 0; d < 2; ++d)
      if (c_.usage & usage_bit(static_cast<qr_direction>(d)))
        direction_data(static_cast<qr_direction>(d)).layout.format = formats_[d].c_str();
    o.c_ = {};
    o.c_.struct_size = sizeof(qr_quantized_tensor);
    return *this;
  }
  QuantizedTensor(const QuantizedTensor&) = delete;
  QuantizedTensor& operator=(const QuantizedTensor&) = delete;

  const std::string& format() const { return format_; }
  std::int64_t rows() const { return c_.rows; }
  std::int64_t cols() const { return c_.cols; }
  std::uint32_t usage() const { return c_.usage; }
  bool has(qr_direction d) const { return (c_.usage & usage_bit(d)) != 0; }

  const qr_direction_data& direction(qr_direction d) const {
    QR_CHECK(has(d), "quantized tensor (format '", format_, "', ", c_.rows, "x", c_.cols,
             ") has no ", direction_name(d), " data; quantize with that usage");
    return d == QR_DIRECTION_ROWWISE ? c_.rowwise : c_.columnwise;
  }
  const qr_direction_layout& layout(qr_direction d) const { return direction(d).layout; }
  TensorView data(qr_direction d) const { return TensorView(direction(d).data); }
  TensorView scale_inv(qr_direction d) const { return TensorView(direction(d).scale_inv); }
  bool has_amax(qr_direction d) const { return direction(d).amax.data != nullptr; }
  // Reads the stored amax (host memory only).
  float amax(qr_direction d) const {
    const auto& a = direction(d).amax;
    QR_CHECK(a.data != nullptr, "direction ", direction_name(d), " of format '", format_,
             "' stores no amax");
    QR_CHECK(a.device.type == QR_DEVICE_CPU, "amax lives on the device; copy it to the host");
    return *static_cast<const float*>(a.data);
  }

  // Frees one direction's buffers and removes it from usage: a layer keeps only what its
  // backward needs (the columnwise copy of an activation once fprop has used the rowwise one).
  // Views of that direction taken earlier dangle afterwards.
  void drop(qr_direction d) {
    QR_CHECK(has(d), "cannot drop the ", direction_name(d), " direction of a quantized tensor "
             "(format '", format_, "') that holds ", usage_str(c_.usage));
    qr_direction_data& dd = direction_data(d);
    dd = qr_direction_data{};
    dd.struct_size = sizeof(qr_direction_data);
    dd.data.struct_size = dd.scale_inv.struct_size = dd.amax.struct_size = sizeof(qr_tensor_view);
    storage_[d].reset();
    formats_[d].clear();
    c_.usage &= ~usage_bit(d);
  }

  const qr_quantized_tensor& c() const { return c_; }
  qr_quantized_tensor& c() { return c_; }

 private:
  struct Storage {
    Buffer data, scale, amax;
  };
  qr_direction_data& direction_data(qr_direction d) {
    return d == QR_DIRECTION_ROWWISE ? c_.rowwise : c_.columnwise;
  }
  static qr_tensor_view allocate(Buffer& buffer, DType dtype, int ndim, const std::int64_t* shape,
                                 Device device, const std::shared_ptr<Allocator>& allocator,
                                 Buffer::Fill fill) {
    QR_CHECK(ndim >= 1 && ndim <= 2, "layout buffer with ", ndim, " dimensions; expected 1 or 2");
    std::vector<std::int64_t> s(shape, shape + ndim);
    TensorView v(nullptr, dtype, s, device);
    buffer = Buffer(allocator, static_cast<std::size_t>(v.nbytes()), device, fill);
    v.c().data = buffer.data();
    return v.c();
  }

  std::string format_;
  std::array<std::string, 2> formats_;
  std::array<std::unique_ptr<Storage>, 2> storage_;
  qr_quantized_tensor c_{};
};

}  // namespace qrecipe
