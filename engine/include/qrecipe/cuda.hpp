// CUDA memory for the engine and its users: an Allocator backed by cudaMalloc, and the few
// copies and synchronizations the engine, the tests and the benchmarks need.
//
// These functions exist in every build. In a build without CUDA (QRECIPE_CUDA=OFF) they throw
// qrecipe::Error with QR_STATUS_UNSUPPORTED saying so, except cuda_available() (false) and
// cuda_status() (a line saying why). libqrecipe links the CUDA runtime statically and never
// needs libcudart or libcuda at load time: the driver is opened on the first CUDA call, so a
// CPU-only machine loads the engine fine and cuda_available() reports false there.
//
// Streams are passed as void* (a cudaStream_t) so this header needs no CUDA header; nullptr
// is the legacy default stream. Every CUDA failure throws qrecipe::Error (QR_STATUS_DEVICE_ERROR,
// or QR_STATUS_OUT_OF_MEMORY for a failed allocation) naming the CUDA call, the CUDA error
// name and string, the byte count and the device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "qrecipe/tensor.hpp"

namespace qrecipe {

// True when this build of libqrecipe was compiled with CUDA (QRECIPE_CUDA=ON).
bool cuda_built();
// True when the build has CUDA and at least one CUDA device is usable (driver present and
// recent enough). Never throws.
bool cuda_available();
// Number of usable CUDA devices (0 when cuda_available() is false). Never throws.
int cuda_device_count();
// One line for logs and skipped tests: "cuda: 1 device(s), runtime 13000, driver 13000,
// cuda:0 = NVIDIA H100 80GB HBM3" or why there is none ("no CUDA device: ..." / "this build
// has no CUDA"). Never throws.
std::string cuda_status();

// The process-wide CUDA allocator: cudaMalloc / cudaFree on the buffer's device (made current
// for the call and restored after). allocate() returns 256-byte aligned memory (at least 256
// bytes even for 0, so a pointer is never null); zero() fills on the legacy default stream
// and synchronizes it, so the zeros are visible to work on any stream afterwards.
// Lifetime: the returned allocator lives until the end of the process; buffers hold it.
std::shared_ptr<Allocator> cuda_allocator();

// Copy `bytes` between host memory and device memory (any device: unified addressing finds
// the device from the pointer) on `stream` (nullptr: legacy default stream), then synchronize
// that stream, so on return dst holds the data and the source may be freed or reused.
// bytes == 0 does nothing.
void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream = nullptr);
void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream = nullptr);

// Waits until all work queued on `stream` of `device` (nullptr: legacy default stream) is done.
void synchronize(Device device, void* stream = nullptr);

// Zeroes `bytes` of device memory at `ptr` by cudaMemsetAsync on `stream` of `device`
// (nullptr: legacy default stream), without synchronizing: work queued on that stream
// afterwards sees the zeros. bytes == 0 does nothing. (An allocator backed by stream-ordered
// memory, like the torch adapter's, zeroes its buffers with it.)
void zero_async(void* ptr, std::size_t bytes, Device device, void* stream);

// Stream-ordered scratch memory (the host table's scratch_alloc / scratch_free): `bytes` from
// the default memory pool of `device` by cudaMallocAsync on `stream`, zero-filled by
// cudaMemsetAsync on that stream, so work queued on `stream` afterwards may use it; no host
// synchronization. At least 256 bytes even for 0; 256-byte aligned. free_async gives it back
// with cudaFreeAsync on the same stream: work queued before the free still sees the memory.
// free_async never throws (a failure is printed to stderr).
void* allocate_async(std::size_t bytes, Device device, void* stream);
void free_async(void* ptr, std::size_t bytes, Device device, void* stream) noexcept;

}  // namespace qrecipe
