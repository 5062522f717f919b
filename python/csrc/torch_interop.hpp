// Zero-copy bridges between torch tensors and the engine's types (docs/architecture.md, "The Python
// package's layers").
//
//   to_view(tensor)        a qrecipe::TensorView over a torch tensor's memory (no copy)
//   TorchAllocator         an Allocator whose bytes come from torch's allocator (the caching
//                          allocator on CUDA), zeroed on torch's current stream
//   alias_tensor(view, o)  a torch tensor over engine-owned memory that keeps `o` alive
//
// Ownership: a TensorView from to_view is valid while the torch tensor lives and is not
// resized; the caller keeps the tensor alive for the duration of the engine call. A tensor from
// alias_tensor holds a shared_ptr to the owner of the bytes, so it stays valid on its own.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "qrecipe/tensor.hpp"

namespace qrecipe::python {

// The engine dtype of a torch dtype: float32, bfloat16, float16 and uint8 (raw bytes).
DType engine_dtype(at::ScalarType type, const char* what);
// The torch dtype that stores an engine dtype: FP32/BF16/F16 as themselves, every 8- and
// 4-bit format as uint8 bytes (E2M1 packed two per byte).
at::ScalarType storage_dtype(DType type);
at::Device torch_device(Device device);
Device engine_device(const at::Device& device, const char* what);

// torch's current stream on CUDA device `device` as a cudaStream_t, read through c10's
// device-generic interface so the adapter needs no CUDA headers and builds against CPU-only
// torch too.
void* cuda_current_stream(int device);

// A view of `t`'s memory. `t` must be contiguous and of a dtype engine_dtype accepts; `what`
// names the tensor in errors ("input of qrecipe.quantize").
TensorView to_view(const at::Tensor& t, const char* what);

// A torch tensor aliasing the buffer `view` describes (its byte shape for 4-bit dtypes); the
// deleter keeps `owner` alive until torch releases the tensor.
at::Tensor alias_tensor(const TensorView& view, std::shared_ptr<const void> owner);

class TorchAllocator final : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 256;  // Allocator contract
  void* allocate(std::size_t bytes, Device device) override;
  void deallocate(void* ptr, std::size_t bytes, Device device) noexcept override;
  void zero(void* ptr, std::size_t bytes, Device device) override;
  std::size_t live_allocations() const;

 private:
  mutable std::mutex mutex_;
  // Aligned pointer handed out -> torch's allocation that owns the bytes.
  std::unordered_map<void*, c10::DataPtr> live_;
};

// One process-wide instance: every engine the adapter makes allocates through it.
std::shared_ptr<TorchAllocator> torch_allocator();

}  // namespace qrecipe::python
