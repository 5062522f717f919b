// One launch updates every delayed-scaling state of a device (see scaling_cuda.hpp).
#include "scaling_cuda.hpp"

#include <cuda_runtime.h>

#include "qrecipe/error.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::detail {
namespace {

void check(cudaError_t status, const char* call, int device, std::size_t states) {
  QR_CHECK_CODE(status == cudaSuccess, QR_STATUS_DEVICE_ERROR, call, " failed on cuda:", device,
                " while updating ", states, " delayed-scaling state(s): ",
                cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

// One thread per state: the history roll is sequential within a state (a few thousand floats
// at most), and states are independent.
__global__ void update_kernel(const DeviceScalingUpdate* updates, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const DeviceScalingUpdate u = updates[i];
  const float amax = u.amax_from_history ? u.history[0] : u.reduced_amax;
  delayed_scaling_update(u.history, u.length, u.scale, u.scale_inv, amax, u.most_recent != 0,
                         u.margin, u.fmax);
}

constexpr int kThreads = 128;

// Makes `device` current for the scope and restores the previous device after.
class CurrentDevice {
 public:
  CurrentDevice(int device, std::size_t states) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device, states);
    check(cudaSetDevice(device), "cudaSetDevice", device, states);
  }
  ~CurrentDevice() { (void)cudaSetDevice(previous_); }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

DeviceScalingTable::~DeviceScalingTable() {
  if (table_ == nullptr) return;
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess) {
    (void)cudaFree(table_);  // waits for the launches that read it
    (void)cudaSetDevice(previous);
  }
}

void DeviceScalingTable::run(const std::vector<DeviceScalingUpdate>& updates,
                             std::uint64_t version, void* stream) {
  const std::size_t n = updates.size();
  if (n == 0) return;
  CurrentDevice on(device_, n);
  const auto s = static_cast<cudaStream_t>(stream);
  if (!uploaded_ || version == 0 || version != version_ || n != count_) {
    // A launch of an earlier call on another stream may still read the old table.
    if (uploaded_ && last_stream_ != stream)
      check(cudaStreamSynchronize(static_cast<cudaStream_t>(last_stream_)),
            "cudaStreamSynchronize (previous update)", device_, n);
    if (n > capacity_) {
      if (table_ != nullptr) check(cudaFree(table_), "cudaFree (update table)", device_, n);
      table_ = nullptr;
      capacity_ = 0;
      uploaded_ = false;
      check(cudaMalloc(&table_, n * sizeof(DeviceScalingUpdate)), "cudaMalloc (update table)",
            device_, n);
      capacity_ = n;
    }
    // From pageable memory: the call returns once the host table has been staged, so the
    // vector may go away; the copy is ordered before the launch on the same stream.
    check(cudaMemcpyAsync(table_, updates.data(), n * sizeof(DeviceScalingUpdate),
                          cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (update table)", device_, n);
    count_ = n;
    version_ = version;
    uploaded_ = true;
  }
  const int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  update_kernel<<<blocks, kThreads, 0, s>>>(table_, static_cast<int>(n));
  last_stream_ = stream;
  check(cudaGetLastError(), "delayed-scaling update kernel launch", device_, n);
}

}  // namespace qrecipe::detail
