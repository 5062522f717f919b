// The engine's multi-tensor Adam update (see adam_cuda.hpp): plain parameters and the update
// half of the two-pass path, every tensor of a step in one launch per table of
// kMaxTensorsPerLaunch tensors. The element update is adam_cuda.cuh's update_runs (adam.hpp), the
// code every plugin's fused kernel runs too.
//
// Map: the tensor table (kernel parameter), the kernel (one block per chunk of kChunk
// elements of one tensor; a block finds its tensor by a binary search over the table's
// prefix sums of blocks), the launcher.
#include "optim/adam_cuda.hpp"

#include <cuda_runtime.h>


#include "cuda_device_guard.hpp"
#include "qrecipe/adam_cuda.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::detail {
namespace {

namespace acuda = qrecipe::adam::cuda;

constexpr int kThreads = 256;
constexpr int kRunsPerThread = 4;  // runs of 4 elements per thread
constexpr int kBatch = 2;          // runs whose loads a thread keeps in flight (update_runs)
constexpr int kMinBlocks = 5;      // 48 registers, no spills (ptxas -v): 62% occupancy
constexpr std::int64_t kChunk = static_cast<std::int64_t>(kThreads) * 4 * kRunsPerThread;
constexpr int kMaxTensorsPerLaunch = 128;

struct Entry {
  acuda::Operands ops;  // [1, numel]
  acuda::DeviceHyper hyper;
  std::int64_t first_block;
};
using Table = sdk::cuda::GroupTable<Entry, kMaxTensorsPerLaunch>;

__global__ void __launch_bounds__(kThreads, kMinBlocks)
    update_kernel(const __grid_constant__ Table table) {
  const int t = sdk::cuda::find_group(table, blockIdx.x);
  const Entry& e = table.group[t];
  const adam::Scalars s = acuda::block_scalars(e.hyper);
  const std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) - e.first_block) * kChunk;
  acuda::update_flat<kThreads, kRunsPerThread, kBatch>(e.ops, s, base, [](const float (&)[4]) {});
}

void check(cudaError_t status, const char* call, int device, std::size_t tensors) {
  QR_CHECK_CODE(status == cudaSuccess, QR_STATUS_DEVICE_ERROR, call, " failed on cuda:", device,
                " in the Adam update of ", tensors, " tensor(s): ", cudaGetErrorName(status),
                ": ", cudaGetErrorString(status));
}

Entry make_entry(const AdamCudaItem& it) {
  Entry e{};
  e.ops.param = it.param;
  e.ops.param_dtype = it.param_dtype;
  e.ops.grad = it.grad;
  e.ops.grad_dtype = it.grad_dtype;
  e.ops.exp_avg = it.exp_avg;
  e.ops.exp_avg_dtype = it.exp_avg_dtype;
  e.ops.exp_avg_sq = it.exp_avg_sq;
  e.ops.exp_avg_sq_dtype = it.exp_avg_sq_dtype;
  e.ops.copy = it.copy;
  e.ops.copy_dtype = it.copy_dtype;
  e.ops.rows = 1;
  e.ops.cols = it.numel;
  // One row: runs start at multiples of 4, so aligned bases make every whole run aligned.
  e.ops.vec4 = acuda::aligned_for4(it.param, it.param_dtype) &&
               acuda::aligned_for4(it.grad, it.grad_dtype) &&
               acuda::aligned_for4(it.exp_avg, it.exp_avg_dtype) &&
               acuda::aligned_for4(it.exp_avg_sq, it.exp_avg_sq_dtype) &&
               acuda::aligned_for4(it.copy, it.copy_dtype);
  e.hyper = acuda::device_hyper(it.hyper);
  return e;
}

}  // namespace

void adam_update_cuda(const std::vector<AdamCudaItem>& items, int device, void* stream) {
  if (items.empty()) return;
  DeviceGuard on(device, "the Adam update of the optimizer step");
  const auto s = static_cast<cudaStream_t>(stream);
  acuda::for_each_table<Table>(
      items.size(), [&](std::size_t i) { return make_entry(items[i]); },
      [&](Table& table) {
        const std::int64_t blocks = acuda::assign_blocks(table, [](const Entry& e) {
          return (e.ops.cols + kChunk - 1) / kChunk;
        }, "engine");
        if (blocks == 0) return;  // only empty tensors
        update_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(table);
        check(cudaGetLastError(), "launch of the Adam update kernel", device,
              static_cast<std::size_t>(table.count));
      });
}

}  // namespace qrecipe::detail
