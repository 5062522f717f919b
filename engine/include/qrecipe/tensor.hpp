// Device, TensorView (non-owning), Allocator, Buffer and Tensor (owning, RAII). Header-only.
//
// Ownership: a TensorView never owns memory; it is valid as long as whatever it points into.
// A Buffer owns bytes obtained from an Allocator and returns them to that same allocator on
// destruction; it holds the allocator by shared_ptr so the allocator outlives the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "qrecipe/checked.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe {

struct Device {
  qr_device_type type = QR_DEVICE_CPU;
  int index = 0;

  static Device cpu() { return {QR_DEVICE_CPU, 0}; }
  static Device cuda(int index = 0) { return {QR_DEVICE_CUDA, index}; }
  bool is_cpu() const { return type == QR_DEVICE_CPU; }
  bool is_cuda() const { return type == QR_DEVICE_CUDA; }
  qr_device to_c() const { return {static_cast<std::int32_t>(type), index}; }
  static Device from_c(const qr_device& d) {
    return {static_cast<qr_device_type>(d.type), d.index};
  }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  friend bool operator==(const Device&, const Device&) = default;
};

// Non-owning strided view; a thin C++ face over qr_tensor_view. Strides count elements.
class TensorView {
 public:
  TensorView() { view_.struct_size = sizeof(qr_tensor_view); }
  TensorView(void* data, DType dtype, const std::vector<std::int64_t>& shape,
             Device device = Device::cpu()) {
    QR_CHECK(shape.size() <= QR_MAX_DIMS, "tensor of ", shape.size(),
             " dimensions; at most ", QR_MAX_DIMS, " are supported");
    view_.struct_size = sizeof(qr_tensor_view);
    view_.data = data;
    view_.dtype = static_cast<std::int32_t>(dtype);
    view_.device = device.to_c();
    view_.ndim = static_cast<std::int32_t>(shape.size());
    std::int64_t stride = 1;
    for (int d = view_.ndim - 1; d >= 0; --d) {
      QR_CHECK(shape[d] >= 0, "negative dimension ", shape[d], " at index ", d);
      view_.shape[d] = shape[d];
      view_.strides[d] = stride;
      stride = checked_mul(stride, shape[d], "elements of a tensor view");
    }
  }
  TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
             Device device = Device::cpu())
      : TensorView(data, dtype, std::vector<std::int64_t>(shape), device) {}
  explicit TensorView(const qr_tensor_view& v) : view_(v) {
    QR_CHECK(v.struct_size >= sizeof(qr_tensor_view), "qr_tensor_view struct_size ",
             v.struct_size, " is smaller than this build's ", sizeof(qr_tensor_view));
    QR_CHECK(v.ndim >= 0 && v.ndim <= QR_MAX_DIMS, "tensor view with ndim ", v.ndim,
             "; expected 0..", QR_MAX_DIMS);
  }

  void* data() const { return view_.data; }
  template <class T> T* data_as() const { return static_cast<T*>(view_.data); }
  DType dtype() const { return static_cast<DType>(view_.dtype); }
  Device device() const { return Device::from_c(view_.device); }
  int ndim() const { return view_.ndim; }
  std::int64_t size(int d) const { return view_.shape[d < 0 ? d + view_.ndim : d]; }
  std::int64_t stride(int d) const { return view_.strides[d < 0 ? d + view_.ndim : d]; }
  std::vector<std::int64_t> shape() const {
    return std::vector<std::int64_t>(view_.shape, view_.shape + view_.ndim);
  }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < view_.ndim; ++d) n = checked_mul(n, view_.shape[d], "elements of a tensor view");
    return n;
  }
  bool empty() const { return numel() == 0; }
  bool is_contiguous() const {
    std::int64_t expected = 1;
    for (int d = view_.ndim - 1; d >= 0; --d) {
      if (view_.shape[d] != 1 && view_.strides[d] != expected) return false;
      expected *= view_.shape[d];
    }
    return true;
  }
  // Logical 2-D view [prod(leading dims), last dim]; 0-D is [1, 1], 1-D [n] is [1, n].
  std::int64_t cols() const { return view_.ndim == 0 ? 1 : view_.shape[view_.ndim - 1]; }
  std::int64_t rows() const {
    std::int64_t r = 1;
    for (int d = 0; d + 1 < view_.ndim; ++d) r = checked_mul(r, view_.shape[d], "rows of a tensor view");
    return r;
  }
  std::int64_t nbytes() const { return storage_bytes(dtype(), rows(), cols()); }
  std::string shape_str() const {
    std::string s = "[";
    for (int d = 0; d < view_.ndim; ++d) s += (d ? ", " : "") + std::to_string(view_.shape[d]);
    return s + "]";
  }
  std::string str() const {  // "bf16[2, 3] on cpu"
    return std::string(dtype_name(dtype())) + shape_str() + " on " + device().str();
  }

  const qr_tensor_view& c() const { return view_; }
  qr_tensor_view& c() { return view_; }

 private:
  qr_tensor_view view_{};
};

// Where buffers come from. The torch adapter supplies one backed by the caching allocator.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Memory aligned to at least 256 bytes, or throws qrecipe::Error (out of memory / device).
  virtual void* allocate(std::size_t bytes, Device device) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, Device device) noexcept = 0;
  // Zero-fill (scale padding must be zero); host memset for the CPU.
  virtual void zero(void* ptr, std::size_t bytes, Device device) = 0;
};

class CpuAllocator final : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 256;
  void* allocate(std::size_t bytes, Device device) override {
    QR_CHECK(device.is_cpu(), "CpuAllocator cannot allocate on ", device.str(),
             "; pass a CUDA allocator (build with QRECIPE_CUDA=ON) for device tensors");
    QR_CHECK_CODE(bytes <= (std::size_t{1} << 62), QR_STATUS_OUT_OF_MEMORY, "host allocation of ",
                  bytes, " bytes refused: more than any machine has");
    const std::size_t rounded = ((bytes + kAlignment - 1) / kAlignment) * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    QR_CHECK_CODE(p != nullptr, QR_STATUS_OUT_OF_MEMORY, "host allocation of ", bytes,
                  " bytes failed");
    return p;
  }
  void deallocate(void* ptr, std::size_t, Device) noexcept override { std::free(ptr); }
  void zero(void* ptr, std::size_t bytes, Device) override {
    if (bytes) std::memset(ptr, 0, bytes);
  }
};

inline std::shared_ptr<Allocator> cpu_allocator() {
  static const auto instance = std::make_shared<CpuAllocator>();
  return instance;
}

// Owned bytes, zero-filled unless the owner will write every byte itself. Move-only.
class Buffer {
 public:
  enum class Fill { zero, none };
  Buffer() = default;
  Buffer(std::shared_ptr<Allocator> allocator, std::size_t bytes, Device device,
         Fill fill = Fill::zero)
      : allocator_(std::move(allocator)), bytes_(bytes), device_(device) {
    QR_CHECK(allocator_ != nullptr, "Buffer needs an allocator");
    ptr_ = allocator_->allocate(bytes, device);
    if (fill == Fill::zero) allocator_->zero(ptr_, bytes, device);
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept
      : allocator_(std::move(o.allocator_)), ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      allocator_ = std::move(o.allocator_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release() noexcept {
    if (ptr_ && allocator_) allocator_->deallocate(ptr_, bytes_, device_);
    ptr_ = nullptr;
  }
  std::shared_ptr<Allocator> allocator_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_{};
};

// A contiguous tensor that owns its (zero-filled) memory. Move-only.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, const std::vector<std::int64_t>& shape, Device device = Device::cpu(),
         std::shared_ptr<Allocator> allocator = cpu_allocator())
      : view_(nullptr, dtype, shape, device) {
    buffer_ = Buffer(std::move(allocator), static_cast<std::size_t>(view_.nbytes()), device);
    view_.c().data = buffer_.data();
  }
  const TensorView& view() const { return view_; }
  template <class T> T* data_as() const { return view_.data_as<T>(); }
  std::int64_t numel() const { return view_.numel(); }
  std::vector<std::int64_t> shape() const { return view_.shape(); }

 private:
  Buffer buffer_;
  TensorView view_;
};

}  // namespace qrecipe
