// One launch updates every delayed-scaling state of a device (see scaling_cuda.hpp).
#include "scaling_cuda.hpp"

#include <cuda_runtime.h>

#include <string>

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
  delayed_scaling_update(u.history, u.length, u.scale, u.scale_inv, u.reduced_amax,
                         u.most_recent != 0, u.margin, u.fmax);
}

constexpr int kThreads = 128;

}  // namespace

void update_scaling_cuda(const std::vector<DeviceScalingUpdate>& updates, int device) {
  if (updates.empty()) return;
  const std::size_t n = updates.size();
  int previous = 0;
  check(cudaGetDevice(&previous), "cudaGetDevice", device, n);
  check(cudaSetDevice(device), "cudaSetDevice", device, n);
  DeviceScalingUpdate* table = nullptr;
  cudaError_t status = cudaMalloc(&table, n * sizeof(DeviceScalingUpdate));
  if (status == cudaSuccess)
    status = cudaMemcpy(table, updates.data(), n * sizeof(DeviceScalingUpdate),
                        cudaMemcpyHostToDevice);
  if (status == cudaSuccess) {
    const int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
    update_kernel<<<blocks, kThreads>>>(table, static_cast<int>(n));
    status = cudaGetLastError();
  }
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  if (table) (void)cudaFree(table);
  (void)cudaSetDevice(previous);
  check(status, "delayed-scaling update (table copy, kernel or synchronize)", device, n);
}

}  // namespace qrecipe::detail
