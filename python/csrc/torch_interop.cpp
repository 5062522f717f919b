// Zero-copy bridges between torch tensors and qrecipe (see torch_interop.hpp).
#include "torch_interop.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "qrecipe/cuda.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::python {

DType engine_dtype(at::ScalarType type, const char* what) {
  switch (type) {
    case at::kFloat: return DType::f32;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::f16;
    case at::kByte: return DType::u8;
    default:
      QR_THROW(what, " has dtype ", c10::toString(type),
               "; qrecipe takes torch.float32, torch.bfloat16 or torch.float16 tensors "
               "(convert with .to(torch.bfloat16) or .float())");
  }
}

at::ScalarType storage_dtype(DType type) {
  switch (type) {
    case DType::f32: return at::kFloat;
    case DType::bf16: return at::kBFloat16;
    case DType::f16: return at::kHalf;
    case DType::f64: return at::kDouble;
    default: return at::kByte;  // e4m3, e5m2, e2m1 (packed), e8m0, u8
  }
}

at::Device torch_device(Device device) {
  if (device.is_cpu()) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
}

Device engine_device(const at::Device& device, const char* what) {
  if (device.is_cpu()) return Device::cpu();
  if (device.is_cuda()) return Device::cuda(device.has_index() ? device.index() : 0);
  QR_THROW(what, " lives on ", device.str(), "; qrecipe works on cpu and cuda tensors");
}

TensorView to_view(const at::Tensor& t, const char* what) {
  QR_CHECK(t.defined(), what, " is an undefined tensor");
  QR_CHECK(t.is_contiguous(), what, " of shape ", t.sizes(),
           " is not contiguous; call .contiguous() first");
  const DType dtype = engine_dtype(t.scalar_type(), what);
  const Device device = engine_device(t.device(), what);
  std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
  return TensorView(t.data_ptr(), dtype, shape, device);
}

at::Tensor alias_tensor(const TensorView& view, std::shared_ptr<const void> owner) {
  std::vector<std::int64_t> sizes = view.shape();
  if (dtype_bits(view.dtype()) == 4 && !sizes.empty())
    sizes.back() = (sizes.back() + 1) / 2;  // packed two per byte
  const auto options =
      at::TensorOptions().dtype(storage_dtype(view.dtype())).device(torch_device(view.device()));
  // An empty buffer (a direction of a tensor with no rows: an MoE expert that got no tokens)
  // has no memory to alias, and from_blob on CUDA rejects its pointer: an empty tensor of the
  // same shape on the same device is the same value.
  std::int64_t elements = 1;
  for (std::int64_t s : sizes) elements *= s;
  if (elements == 0) return at::empty(sizes, options);
  return at::from_blob(
      view.data(), sizes, [keep = std::move(owner)](void*) mutable { keep.reset(); }, options);
}

void* cuda_current_stream(int device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)))
      .native_handle();
}

void* TorchAllocator::allocate(std::size_t bytes, Device device) {
  // torch's allocator itself, not at::empty: the same memory (on CUDA the caching allocator,
  // on the device's current stream) without building a tensor, which cost ~7 us of host time
  // per buffer on an H100 machine. Over-allocate so the pointer handed out can be rounded up
  // to kAlignment (torch's CPU allocator only guarantees 64 bytes).
  c10::DataPtr owner;
  if (device.is_cpu()) {
    owner = c10::GetCPUAllocator()->allocate(bytes + kAlignment);
  } else {
    const c10::DeviceGuard on_device(torch_device(device));
    owner = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(bytes + kAlignment);
  }
  const auto base = reinterpret_cast<std::uintptr_t>(owner.get());
  const std::uintptr_t mask = ~std::uintptr_t(kAlignment - 1);
  void* aligned = reinterpret_cast<void*>((base + kAlignment - 1) & mask);
  std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(aligned, std::move(owner));
  return aligned;
}

void TorchAllocator::deallocate(void* ptr, std::size_t, Device) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(ptr);
}

void TorchAllocator::zero(void* ptr, std::size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memset(ptr, 0, bytes);
    return;
  }
  // Device memory: a memset on torch's current stream (a from_blob tensor's zero_() did the
  // same for ~20 us of host time per buffer on an H100 machine).
  zero_async(ptr, bytes, device, cuda_current_stream(device.index));
}

std::size_t TorchAllocator::live_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.size();
}

std::shared_ptr<TorchAllocator> torch_allocator() {
  static const auto instance = std::make_shared<TorchAllocator>();
  return instance;
}

}  // namespace qrecipe::python
