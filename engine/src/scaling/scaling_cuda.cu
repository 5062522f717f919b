// One launch updates every delayed-scaling state of a device (see scaling_cuda.hpp).
#include "scaling/scaling_cuda.hpp"

#include <cuda_runtime.h>

#include <cstring>

#include "qrecipe/error.hpp"
#include "qrecipe/scaling.hpp"
#include "cuda_device_guard.hpp"

namespace qrecipe::detail {
namespace {

void check(cudaError_t status, const char* call, int device, std::size_t states) {
  QR_CHECK_CODE(status == cudaSuccess, QR_STATUS_DEVICE_ERROR, call, " failed on cuda:", device,
                " while updating ", states, " delayed-scaling state(s): ",
                cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

// One block per state. The roll reads every old entry before any is written (a barrier
// between), and the window maximum is an exact max, so the block computes what the sequential
// delayed_scaling_update of scaling.hpp computes, in any order: fmaxf ignores NaN either way,
// and amaxes are never -0. A history longer than the shared staging area takes the sequential
// function on one thread. (One thread per state took ~50 us for a 1024-step history.)
constexpr int kThreads = 256;
constexpr int kMaxStagedHistory = 8192;  // 32 KiB of shared memory

__global__ void update_kernel(const DeviceScalingUpdate* updates, int staged_length) {
  extern __shared__ float staged[];  // [staged_length]: old history[1..L-1], then last
  __shared__ float warp_max[kThreads / 32];
  const DeviceScalingUpdate u = updates[blockIdx.x];
  const float reduced = u.amax_from_history ? u.history[0] : u.reduced_amax;
  if (u.length > staged_length) {
    if (threadIdx.x == 0)
      delayed_scaling_update(u.history, u.length, u.scale, u.scale_inv, reduced,
                             u.most_recent != 0, u.margin, u.fmax);
    return;
  }
  const float last = reduced != 0.0f ? reduced : u.history[0];
  if (last == 0.0f) return;  // the same for every thread of the block
  float amax = last;
  for (int i = threadIdx.x; i < u.length; i += blockDim.x) {
    const float a = i < u.length - 1 ? u.history[i + 1] : last;
    staged[i] = a;
    if (!u.most_recent) amax = fmaxf(amax, a);
  }
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();  // every old entry is staged, every warp's max is stored
  for (int i = threadIdx.x; i < u.length; i += blockDim.x) u.history[i] = i > 0 ? staged[i] : 0.0f;
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    delayed_scaling_scale(amax, u.margin, u.fmax, u.scale, u.scale_inv);
  }
}


// One thread per shared state: the max of its members' row 0 (what one shared row 0 would
// have accumulated) written back into each member's row 0. fmaxf ignores NaN, as the
// accumulation does.
__global__ void share_max_kernel(float* const* rows, const int* offsets, int groups) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  float amax = 0.0f;
  for (int j = offsets[g]; j < offsets[g + 1]; ++j) amax = fmaxf(amax, rows[j][0]);
  for (int j = offsets[g]; j < offsets[g + 1]; ++j) rows[j][0] = amax;
}

// Bytes of the device table: updates | member row pointers | offsets (groups + 1 ints).
struct TableLayout {
  std::size_t rows_at, offsets_at, bytes;
  TableLayout(std::size_t updates, std::size_t members, std::size_t groups) {
    rows_at = updates * sizeof(DeviceScalingUpdate);
    offsets_at = rows_at + members * sizeof(float*);
    bytes = offsets_at + (groups + 1) * sizeof(int);
  }
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
                             const std::vector<std::vector<float*>>& share_groups,
                             std::uint64_t version, void* stream) {
  const std::size_t n = updates.size();
  if (n == 0) return;
  DeviceGuard on(device_, "updating delayed-scaling states");
  const auto s = static_cast<cudaStream_t>(stream);
  if (!uploaded_ || version == 0 || version != version_ || n != count_ ||
      share_groups.size() != groups_) {
    // A launch of an earlier call on another stream may still read the old table.
    if (uploaded_ && last_stream_ != stream)
      check(cudaStreamSynchronize(static_cast<cudaStream_t>(last_stream_)),
            "cudaStreamSynchronize (previous update)", device_, n);
    // The host image of the table, in the layout TableLayout describes.
    std::vector<float*> rows;
    std::vector<int> offsets{0};
    for (const auto& group : share_groups) {
      rows.insert(rows.end(), group.begin(), group.end());
      offsets.push_back(static_cast<int>(rows.size()));
    }
    const TableLayout layout(n, rows.size(), share_groups.size());
    std::vector<unsigned char> image(layout.bytes);
    std::memcpy(image.data(), updates.data(), n * sizeof(DeviceScalingUpdate));
    if (!rows.empty()) std::memcpy(image.data() + layout.rows_at, rows.data(), rows.size() * sizeof(float*));
    std::memcpy(image.data() + layout.offsets_at, offsets.data(), offsets.size() * sizeof(int));
    if (layout.bytes > capacity_) {
      if (table_ != nullptr) check(cudaFree(table_), "cudaFree (update table)", device_, n);
      table_ = nullptr;
      capacity_ = 0;
      uploaded_ = false;
      check(cudaMalloc(&table_, layout.bytes), "cudaMalloc (update table)", device_, n);
      capacity_ = layout.bytes;
    }
    // From pageable memory: the call returns once the host image has been staged, so the
    // vector may go away; the copy is ordered before the launches on the same stream.
    check(cudaMemcpyAsync(table_, image.data(), layout.bytes, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (update table)", device_, n);
    count_ = n;
    groups_ = share_groups.size();
    members_ = rows.size();
    version_ = version;
    uploaded_ = true;
  }
  auto* bytes = static_cast<unsigned char*>(table_);
  const TableLayout layout(count_, members_, groups_);
  if (groups_ > 0) {
    constexpr int kGroupThreads = 128;
    const auto blocks = static_cast<unsigned>((groups_ + kGroupThreads - 1) / kGroupThreads);
    share_max_kernel<<<blocks, kGroupThreads, 0, s>>>(
        reinterpret_cast<float* const*>(bytes + layout.rows_at),
        reinterpret_cast<const int*>(bytes + layout.offsets_at), static_cast<int>(groups_));
    check(cudaGetLastError(), "shared-state amax kernel launch", device_, n);
  }
  int staged = 0;  // the longest history that fits the staging area
  for (const auto& u : updates)
    if (u.length <= kMaxStagedHistory && u.length > staged) staged = u.length;
  update_kernel<<<static_cast<unsigned>(n), kThreads, staged * sizeof(float), s>>>(
      reinterpret_cast<const DeviceScalingUpdate*>(bytes), staged);
  last_stream_ = stream;
  check(cudaGetLastError(), "delayed-scaling update kernel launch", device_, n);
}

}  // namespace qrecipe::detail
