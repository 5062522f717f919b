// QuantizedTensor: the owning C++ face of qr_quantized_tensor (docs/architecture.md, "Core types").
//
// It owns the buffers of each direction it holds (allocated from an Allocator according to
// the quantizer's layout) and keeps the C struct's views pointing into them. Move-only; moving
// keeps the views valid because buffers are heap objects that do not move.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>
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

// One direction of a QuantizedTensor decoded for emulated GEMMs and kept with it (docs/gemm.md,
// "Decoded operands kept across GEMMs"): the values as the GEMM back end reads them, in the
// stored order of the direction's data ([data_shape[0], data_shape[1]] row-major). On CUDA:
// BF16, block scales applied, per-tensor factors not (they go to the GEMM's alpha), written by
// the engine's decoder; `miss` is a device word that is nonzero when a value BF16 could not
// hold exactly (the GEMM then recomputes its output from the stored bytes). On the CPU: FP32,
// the reference decode, laid out [outer, inner] for the reference product.
struct DecodedCopy {
  std::shared_ptr<Buffer> values;
  DType dtype = DType::bf16;
  std::shared_ptr<Buffer> miss;  // CUDA only; nullptr where nothing can miss
  void* stream = nullptr;        // the stream that wrote it: another stream decodes again
};

class QuantizedTensor {
 public:
  QuantizedTensor() { c_.struct_size = sizeof(qr_quantized_tensor); }

  // Allocates the directions in `usage`; layouts[d] describes direction d. Each direction is
  // ONE allocation, laid out [scale | amax | data] (each part on a kPartAlignment boundary),
  // with at most one zero-fill: a quantize on the GPU costs one allocation and one memset per
  // direction instead of three and two (host time that dominated small layers). Scales and
  // amax start at zero. A data buffer that holds exactly rows x cols values is written in
  // full by every quantize (plugin_abi.h), so it is not zero-filled: on the GPU that fill was
  // a whole extra pass over the output. Padded data, and sub-byte codes with an odd row
  // length (a padding nibble per row), start at zero too.
  QuantizedTensor(const std::string& format, std::int64_t rows, std::int64_t cols,
                  std::uint32_t usage, const std::array<qr_direction_layout, 2>& layouts,
                  Device device, std::shared_ptr<Allocator> allocator)
      : QuantizedTensor(format, rows, cols, usage, layouts) {
    QuantizedTensor* self[1] = {this};
    allocate_parts(self, device, allocator);
  }

  // The tensors of consecutive row groups of one source (a grouped quantization's outputs,
  // group g with group_rows[g] rows and layouts[g]): per direction ONE allocation for all
  // groups, [every group's scale and amax | every group's data], and at most one zero-fill of
  // the scales and amaxes (plus each padded data part): two allocations whatever the number of
  // groups. Each tensor behaves as one allocated alone; a direction's memory is freed once
  // every group has dropped it or is gone.
  static std::vector<QuantizedTensor> allocate_groups(
      const std::string& format, std::span<const std::int64_t> group_rows, std::int64_t cols,
      std::uint32_t usage, std::span<const std::array<qr_direction_layout, 2>> layouts,
      Device device, const std::shared_ptr<Allocator>& allocator) {
    QR_CHECK(layouts.size() == group_rows.size(), "allocate_groups: ", layouts.size(),
             " layouts for ", group_rows.size(), " groups");
    std::vector<QuantizedTensor> out;
    out.reserve(group_rows.size());
    for (std::size_t g = 0; g < group_rows.size(); ++g)
      out.push_back(QuantizedTensor(format, group_rows[g], cols, usage, layouts[g]));
    std::vector<QuantizedTensor*> tensors;
    for (QuantizedTensor& t : out) tensors.push_back(&t);
    allocate_parts(tensors, device, allocator);
    return out;
  }

  // A tensor over memory it does not allocate (the adapter's torch tensors, e.g. a saved
  // operand coming back from CPU offload): parts[d] = {data, scale_inv, amax} pointers of
  // direction d (nullptr where the layout has no such part), on `device`. `owners[d]` keeps
  // direction d's memory alive while the tensor holds it (dropped with the direction). The
  // caller has checked that each part has the layout's size.
  static QuantizedTensor over(const std::string& format, std::int64_t rows, std::int64_t cols,
                              std::uint32_t usage,
                              const std::array<qr_direction_layout, 2>& layouts,
                              const std::array<std::array<void*, 3>, 2>& parts, Device device,
                              std::array<std::shared_ptr<const void>, 2> owners) {
    QuantizedTensor t(format, rows, cols, usage, layouts);
    const qr_device where = TensorView(nullptr, DType::f32, {0}, device).c().device;
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!t.has(d)) continue;
      qr_direction_data& dd = t.direction_data(d);
      qr_tensor_view* views[3] = {&dd.data, &dd.scale_inv, &dd.amax};
      for (int k = 0; k < 3; ++k) {
        if (views[k]->ndim == 0) continue;
        QR_CHECK(parts[d][k] != nullptr, "QuantizedTensor::over: ", direction_name(d),
                 " part ", k, " of format '", format, "' has no memory");
        views[k]->data = parts[d][k];
        views[k]->device = where;
      }
      t.external_[d] = std::move(owners[d]);
    }
    return t;
  }

  QuantizedTensor(QuantizedTensor&& o) noexcept { *this = std::move(o); }
  QuantizedTensor& operator=(QuantizedTensor&& o) noexcept {
    if (this == &o) return *this;
    format_ = std::move(o.format_);
    formats_ = std::move(o.formats_);
    storage_ = std::move(o.storage_);
    external_ = std::move(o.external_);
    c_ = o.c_;
    c_.format = format_.c_str();
    allocator_ = std::move(o.allocator_);
    // The states trade places; the moved-from tensor's is emptied (it holds no direction).
    std::swap(decoded_, o.decoded_);
    {
      std::lock_guard<std::mutex> lock(o.decoded_->mutex);
      o.decoded_->keep = false;
      o.decoded_->copies = {};
    }
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
    external_[d].reset();
    formats_[d].clear();
    {
      std::lock_guard<std::mutex> lock(decoded_->mutex);
      decoded_->copies[d] = {};
    }
    c_.usage &= ~usage_bit(d);
  }

  const qr_quantized_tensor& c() const { return c_; }
  qr_quantized_tensor& c() { return c_; }

  // ---- decoded copies (docs/gemm.md, "Decoded operands kept across GEMMs")
  //
  // Off by default. A caller that knows the bytes will not change behind the engine's back
  // (the adapter's cached weight, python/qrecipe/nn/weight_cache.py) turns it on; the GEMM
  // back ends then keep each direction they decode with the tensor and reuse it until
  // invalidate_decoded() (which quantize_into and drop call: a requantize never leaves a stale
  // copy). Writing the bytes through any other path (an alias of data()) requires a call to
  // invalidate_decoded() or turning keeping off. Memory: one value per element and direction
  // (2 bytes on CUDA, 4 on the CPU), on top of the quantized bytes.
  void set_keep_decoded(bool on) {
    std::lock_guard<std::mutex> lock(decoded_->mutex);
    decoded_->keep = on;
    if (!on) decoded_->copies = {};
  }
  bool keeps_decoded() const {
    std::lock_guard<std::mutex> lock(decoded_->mutex);
    return decoded_->keep;
  }
  // The kept copy of direction d (values nullptr when there is none). Shared ownership: the
  // copy stays valid for the caller even if it is invalidated meanwhile.
  DecodedCopy decoded(qr_direction d) const {
    std::lock_guard<std::mutex> lock(decoded_->mutex);
    return decoded_->copies[d];
  }
  // Keeps `copy` for direction d when keeping is on (ignored otherwise).
  void keep_decoded(qr_direction d, DecodedCopy copy) const {
    std::lock_guard<std::mutex> lock(decoded_->mutex);
    if (decoded_->keep && has(d)) decoded_->copies[d] = std::move(copy);
  }
  void invalidate_decoded() const {
    std::lock_guard<std::mutex> lock(decoded_->mutex);
    decoded_->copies = {};
  }
  // The allocator of the tensor's own buffers (nullptr for a tensor over() outside memory):
  // decoded copies come from it, so they live where the bytes do (the adapter's: torch's
  // stream-ordered caching allocator, whose frees never synchronize the device).
  const std::shared_ptr<Allocator>& allocator() const { return allocator_; }

 private:
  // Parts of a direction's allocation start on this boundary (what the Allocator contract
  // gives a whole allocation, so kernels see the alignment separate buffers had).
  static constexpr std::size_t kPartAlignment = 256;
  static std::size_t round_up(std::size_t bytes) {
    return checked_add(bytes, kPartAlignment - 1, "bytes of a quantized tensor") /
           kPartAlignment * kPartAlignment;
  }
  qr_direction_data& direction_data(qr_direction d) {
    return d == QR_DIRECTION_ROWWISE ? c_.rowwise : c_.columnwise;
  }

  // The C struct and layouts of the directions in `usage`, without memory (allocate_parts).
  QuantizedTensor(const std::string& format, std::int64_t rows, std::int64_t cols,
                  std::uint32_t usage, const std::array<qr_direction_layout, 2>& layouts)
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
      // The views' shapes now, their data pointers in allocate_parts.
      if (l.scale_ndim > 0)
        dd.scale_inv = view_of(static_cast<DType>(l.scale_dtype), l.scale_ndim, l.scale_shape);
      const std::int64_t one[2] = {1, 0};
      if (l.has_amax) dd.amax = view_of(DType::f32, 1, one);
      dd.data = view_of(static_cast<DType>(l.data_dtype), l.data_ndim, l.data_shape);
    }
  }

  // Gives every direction of `tensors` its memory: per direction one allocation holding every
  // tensor's scale and amax, then every tensor's data, and one zero-fill of the scales and
  // amaxes (plus each data part that is not written in full).
  static void allocate_parts(std::span<QuantizedTensor* const> tensors, Device device,
                             const std::shared_ptr<Allocator>& allocator) {
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      struct Offsets {
        std::size_t scale = 0, amax = 0, data = 0;
      };
      std::vector<Offsets> at(tensors.size());
      std::size_t cursor = 0;
      bool any = false;
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (!tensors[i]->has(d)) continue;
        any = true;
        const qr_direction_data& dd = tensors[i]->direction_data(d);
        at[i].scale = cursor;
        cursor = checked_add(cursor, round_up(bytes_of(dd.scale_inv)), "bytes of quantized tensors");
        at[i].amax = cursor;
        // every part starts on a boundary
        cursor = checked_add(cursor, round_up(bytes_of(dd.amax)), "bytes of quantized tensors");
      }
      if (!any) continue;
      // Data parts follow; the last one is not padded. Zero ranges: the scales and amaxes,
      // extended over each data part that needs zeros when it follows directly (the bytes
      // between parts are never read), otherwise a range of its own.
      std::vector<std::pair<std::size_t, std::size_t>> zero;
      if (cursor > 0) zero.emplace_back(0, cursor);
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (!tensors[i]->has(d)) continue;
        const qr_direction_data& dd = tensors[i]->direction_data(d);
        cursor = round_up(cursor);
        at[i].data = cursor;
        const std::size_t bytes = bytes_of(dd.data);
        if (bytes > 0 && !written_in_full(dd.layout, tensors[i]->rows(), tensors[i]->cols())) {
          if (!zero.empty() && round_up(zero.back().second) == cursor)
            zero.back().second = cursor + bytes;
          else
            zero.emplace_back(cursor, cursor + bytes);
        }
        cursor = checked_add(cursor, bytes, "bytes of quantized tensors");
      }
      auto buffer = std::make_shared<Buffer>(allocator, cursor, device, Buffer::Fill::none);
      auto* base = static_cast<std::uint8_t*>(buffer->data());
      for (const auto& [begin, end] : zero) allocator->zero(base + begin, end - begin, device);
      const qr_device where = TensorView(nullptr, DType::f32, {0}, device).c().device;
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        QuantizedTensor& t = *tensors[i];
        if (!t.has(d)) continue;
        qr_direction_data& dd = t.direction_data(d);
        for (qr_tensor_view* v : {&dd.scale_inv, &dd.amax, &dd.data})
          if (v->ndim > 0) v->device = where;
        if (dd.scale_inv.ndim > 0) dd.scale_inv.data = base + at[i].scale;
        if (dd.amax.ndim > 0) dd.amax.data = base + at[i].amax;
        dd.data.data = base + at[i].data;
        t.storage_[d] = buffer;
        t.allocator_ = allocator;
      }
    }
  }

  // Whether every quantize writes every byte of the data: exactly rows x cols values in
  // whole bytes (plugin_abi.h).
  static bool written_in_full(const qr_direction_layout& l, std::int64_t rows, std::int64_t cols) {
    std::int64_t values = 1;
    for (int i = 0; i < l.data_ndim; ++i) values = checked_mul(values, l.data_shape[i], "data elements");
    const bool whole_bytes = dtype_bits(static_cast<DType>(l.data_dtype)) >= 8 ||
                             l.data_shape[l.data_ndim - 1] % 2 == 0;
    return values == checked_mul(rows, cols, "elements") && whole_bytes;
  }

  // The view of one part with its data pointer still unset.
  static qr_tensor_view view_of(DType dtype, int ndim, const std::int64_t* shape) {
    QR_CHECK(ndim >= 1 && ndim <= 2, "layout buffer with ", ndim, " dimensions; expected 1 or 2");
    std::vector<std::int64_t> s(shape, shape + ndim);
    return TensorView(nullptr, dtype, s, Device::cpu()).c();
  }
  static std::size_t bytes_of(const qr_tensor_view& v) {
    return v.ndim == 0 ? 0 : static_cast<std::size_t>(TensorView(v).nbytes());
  }

  std::string format_;
  std::array<std::string, 2> formats_;
  // Per direction: the allocation its parts live in (shared by the groups of allocate_groups).
  std::array<std::shared_ptr<Buffer>, 2> storage_;
  // Per direction: what keeps memory given to over() alive (nullptr for allocated tensors).
  std::array<std::shared_ptr<const void>, 2> external_;
  std::shared_ptr<Allocator> allocator_;
  // Decoded copies behind a lock (GEMMs on several threads may read one tensor). Held by
  // pointer so the tensor stays movable; a moved-from tensor gets a fresh, empty state.
  struct DecodedState {
    std::mutex mutex;
    bool keep = false;
    std::array<DecodedCopy, 2> copies;
  };
  std::shared_ptr<DecodedState> decoded_ = std::make_shared<DecodedState>();
  qr_quantized_tensor c_{};
};

}  // namespace qrecipe
