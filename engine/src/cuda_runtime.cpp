// CUDA allocator, copies and device queries (cuda.hpp). With QRECIPE_WITH_CUDA the CUDA
// runtime API is called (runtime linked statically, see engine/CMakeLists.txt); without it
// every function that needs CUDA throws QR_STATUS_UNSUPPORTED.
//
// Map of this file
//   1. with CUDA: error check helper, DeviceGuard, CudaAllocator, copies, queries,
//      stream-ordered scratch (allocate_async / free_async)
//   2. without CUDA: the same functions, reporting that the build has no CUDA
#include "qrecipe/cuda.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "qrecipe/error.hpp"
#include "cuda_device_guard.hpp"

#if defined(QRECIPE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace qrecipe {

#if defined(QRECIPE_WITH_CUDA)

// ---------------------------------------------------------------- 1. with CUDA

namespace {

constexpr std::size_t kMinAllocation = 256;  // cudaMalloc aligns to 256; never ask for 0 bytes

std::string error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// Throws for a failed CUDA call. `what` names the call and its arguments ("cudaMalloc(1024
// bytes) on cuda:0"). cudaGetLastError() clears a non-sticky error so that it does not
// resurface in an unrelated later check.
void check_cuda(cudaError_t status, const std::string& what, const char* next_step) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  const qr_status_code code =
      status == cudaErrorMemoryAllocation ? QR_STATUS_OUT_OF_MEMORY : QR_STATUS_DEVICE_ERROR;
  QR_THROW_CODE(code, what, " failed: ", error_text(status), "; ", next_step);
}

constexpr const char* kCheckDevice =
    "check the device with nvidia-smi and that CUDA_VISIBLE_DEVICES includes it";

using detail::DeviceGuard;

class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device) override {
    QR_CHECK(device.is_cuda(), "the CUDA allocator cannot allocate on ", device.str(),
             "; use cpu_allocator() for host tensors");
    DeviceGuard guard(device.index, "allocating device memory");
    void* ptr = nullptr;
    check_cuda(cudaMalloc(&ptr, bytes < kMinAllocation ? kMinAllocation : bytes),
               "cudaMalloc(" + std::to_string(bytes) + " bytes) on " + device.str(),
               "free device memory (other processes: nvidia-smi) or use smaller tensors");
    QR_CHECK_CODE(ptr != nullptr, QR_STATUS_OUT_OF_MEMORY, "cudaMalloc(", bytes, " bytes) on ",
                  device.str(), " returned success but a null pointer");
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes, Device device) noexcept override {
    if (ptr == nullptr) return;
    // No DeviceGuard (it may throw): cudaFree finds the device from the pointer.
    const cudaError_t status = cudaFree(ptr);
    // At process exit the runtime may already be unloading; the memory goes with the context.
    if (status != cudaSuccess && status != cudaErrorCudartUnloading) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "qrecipe: cudaFree(%zu bytes) on %s failed: %s\n", bytes,
                   device.str().c_str(), error_text(status).c_str());
    }
  }

  void zero(void* ptr, std::size_t bytes, Device device) override {
    if (bytes == 0) return;
    QR_CHECK(device.is_cuda(), "the CUDA allocator cannot zero memory on ", device.str());
    DeviceGuard guard(device.index, "zeroing device memory");
    const std::string what = std::to_string(bytes) + " bytes on " + device.str();
    check_cuda(cudaMemsetAsync(ptr, 0, bytes, nullptr), "cudaMemsetAsync(" + what + ")",
               kCheckDevice);
    check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize after zeroing " + what,
               kCheckDevice);
  }
};

void copy(void* dst, const void* src, std::size_t bytes, void* stream, cudaMemcpyKind kind,
          const char* direction) {
  if (bytes == 0) return;
  QR_CHECK(dst != nullptr && src != nullptr, "copy ", direction, " of ", bytes,
           " bytes with a null pointer (dst ", dst, ", src ", src, ")");
  const auto s = static_cast<cudaStream_t>(stream);
  const std::string what = std::to_string(bytes) + " bytes " + direction;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync(" + what + ")",
             "check that the device pointer is a live CUDA allocation of at least that size");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after copying " + what,
             "an earlier kernel on this stream may have failed; run with "
             "CUDA_LAUNCH_BLOCKING=1 to find it");
}

int query_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

namespace detail {

// On every engine call's path, so the messages are built only on failure. cudaSetDevice runs
// even when the device is current already (cuda_device_guard.hpp says why).
DeviceGuard::DeviceGuard(int index, const char* what) {
  const cudaError_t got = cudaGetDevice(&previous_);
  if (got != cudaSuccess) check_cuda(got, std::string("cudaGetDevice (while ") + what + ")", kCheckDevice);
  const cudaError_t set = cudaSetDevice(index);
  if (set != cudaSuccess)
    check_cuda(set, "cudaSetDevice(" + std::to_string(index) + ") (while " + what + ")", kCheckDevice);
  changed_ = previous_ != index;
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);  // cannot throw from a destructor
}

}  // namespace detail

bool cuda_built() { return true; }

int cuda_device_count() {
  static const int count = query_device_count();  // the driver is asked once per process
  return count;
}

bool cuda_available() { return cuda_device_count() > 0; }

std::string cuda_status() {
  int runtime = 0, driver = 0, n = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device (" +
           (status != cudaSuccess ? error_text(status) : std::string("0 devices")) +
           "; runtime " + std::to_string(runtime) + ", driver " + std::to_string(driver) + ")";
  }
  std::string line = "cuda: " + std::to_string(n) + " device(s), runtime " +
                     std::to_string(runtime) + ", driver " + std::to_string(driver);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    line += ", cuda:0 = " + std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ")";
  else
    (void)cudaGetLastError();
  return line;
}

std::shared_ptr<Allocator> cuda_allocator() {
  static const auto instance = std::make_shared<CudaAllocator>();
  return instance;
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream) {
  copy(dst, src, bytes, stream, cudaMemcpyDeviceToHost, "device to host");
}

void copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  copy(dst, src, bytes, stream, cudaMemcpyHostToDevice, "host to device");
}

void zero_async(void* ptr, std::size_t bytes, Device device, void* stream) {
  if (bytes == 0) return;
  QR_CHECK(device.is_cuda(), "zero_async needs a CUDA device, got ", device.str());
  DeviceGuard guard(device.index, "zeroing device memory");
  const cudaError_t status = cudaMemsetAsync(ptr, 0, bytes, static_cast<cudaStream_t>(stream));
  if (status != cudaSuccess)
    check_cuda(status, "cudaMemsetAsync(" + std::to_string(bytes) + " bytes on " + device.str() + ")",
               kCheckDevice);
}

void synchronize(Device device, void* stream) {
  QR_CHECK(device.is_cuda(), "synchronize needs a CUDA device, got ", device.str());
  DeviceGuard guard(device.index, "synchronizing a stream");
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
             "cudaStreamSynchronize on " + device.str(),
             "an earlier kernel on this stream may have failed; run with CUDA_LAUNCH_BLOCKING=1 "
             "to find it");
}

void* allocate_async(std::size_t bytes, Device device, void* stream) {
  QR_CHECK(device.is_cuda(), "allocate_async needs a CUDA device, got ", device.str());
  // The legacy default stream belongs to the current device.
  DeviceGuard guard(device.index, "allocating stream-ordered scratch");
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t size = bytes < kMinAllocation ? kMinAllocation : bytes;
  const std::string what = std::to_string(bytes) + " bytes on " + device.str();
  void* ptr = nullptr;
  check_cuda(cudaMallocAsync(&ptr, size, s), "cudaMallocAsync(" + what + ")",
             "free device memory (other processes: nvidia-smi) or use smaller tensors");
  QR_CHECK_CODE(ptr != nullptr, QR_STATUS_OUT_OF_MEMORY, "cudaMallocAsync(", what,
                ") returned success but a null pointer");
  const cudaError_t zeroed = cudaMemsetAsync(ptr, 0, size, s);
  if (zeroed != cudaSuccess || reinterpret_cast<std::uintptr_t>(ptr) % kMinAllocation != 0) {
    (void)cudaFreeAsync(ptr, s);
    check_cuda(zeroed, "cudaMemsetAsync(" + what + ")", kCheckDevice);
    QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "cudaMallocAsync(", what, ") returned ", ptr,
                  ", not 256-byte aligned; report this with the driver version (nvidia-smi)");
  }
  return ptr;
}

void free_async(void* ptr, std::size_t bytes, Device device, void* stream) noexcept {
  if (ptr == nullptr) return;
  // The legacy default stream (nullptr) is the current device's: make `device` current, as
  // allocate_async did, without DeviceGuard (it may throw).
  int previous = device.index;
  if (cudaGetDevice(&previous) != cudaSuccess) (void)cudaGetLastError();
  bool switched = false;
  if (previous != device.index) {
    switched = cudaSetDevice(device.index) == cudaSuccess;
    if (!switched) (void)cudaGetLastError();
  }
  const cudaError_t status = cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
  if (switched) (void)cudaSetDevice(previous);
  if (status != cudaSuccess && status != cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "qrecipe: cudaFreeAsync(%zu bytes) on %s failed: %s\n", bytes,
                 device.str().c_str(), error_text(status).c_str());
  }
}

#else  // !QRECIPE_WITH_CUDA

// ---------------------------------------------------------------- 2. without CUDA

namespace {
[[noreturn]] void throw_no_cuda(const char* what) {
  QR_THROW_CODE(QR_STATUS_UNSUPPORTED, what, ": this build of qrecipe has no CUDA (configured "
                "with QRECIPE_CUDA=OFF or without nvcc); rebuild with -DQRECIPE_CUDA=ON on a "
                "machine with the CUDA toolkit, or keep tensors on the CPU");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
bool cuda_available() { return false; }
std::string cuda_status() { return "this build of qrecipe has no CUDA (QRECIPE_CUDA=OFF)"; }
std::shared_ptr<Allocator> cuda_allocator() { throw_no_cuda("cuda_allocator"); }
void copy_to_host(void*, const void*, std::size_t, void*) { throw_no_cuda("copy_to_host"); }
void copy_to_device(void*, const void*, std::size_t, void*) { throw_no_cuda("copy_to_device"); }
void synchronize(Device, void*) { throw_no_cuda("synchronize"); }
void zero_async(void*, std::size_t, Device, void*) { throw_no_cuda("zero_async"); }
void* allocate_async(std::size_t, Device, void*) { throw_no_cuda("allocate_async"); }
void free_async(void*, std::size_t, Device, void*) noexcept {}  // nothing can have been allocated

#endif

}  // namespace qrecipe
