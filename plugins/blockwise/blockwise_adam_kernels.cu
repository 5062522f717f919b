// CUDA kernel of the blockwise plugin's fused Adam + requantize extra
// (blockwise_adam_kernels.hpp), bit-exact with the CPU path: adam::update of every element
// (adam.hpp), then blockwise_ref.cpp on the new FP32 master.
//
// Map of this file:
//   1. the tensor table (kernel parameter)
//   2. the kernel: update a tile, block scales, codes
//   3. the entry: tables, the shared-memory limit, launches
//
// One block per 128 x 128 tile of one tensor (found by a binary search of the block over the
// table's prefix sums of blocks). The tile's new master values are staged as FP32 in dynamic
// shared memory: a tile row is one whole 1x128 rowwise block, a tile column one whole 1x128
// columnwise block (128 rows down a column), and the tile itself one 128x128 block; +0
// outside the tensor changes no amax.
//
// Exactness: block amax = max |x| (NaN ignored; exact in any order); scale =
// num_bw::block_scale(amax, pow2, eps, FLT_MAX) (the reference's code; FLT_MAX because the
// source is the FP32 master); scale_inv = 1 / scale (IEEE); codes = sat_rne(x * scale) through
// num::fast (proven equal to conversions.hpp); the 128x128 columnwise codes are encoded from
// the same values and scale as the rowwise ones, so they are their transpose. Built with
// -fmad=false --ftz=false like every plugin kernel.
#include "blockwise_adam_kernels.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>

#include "blockwise_numerics.hpp"
#include "qrecipe/adam_cuda.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::blockwise::cuda {
namespace {

constexpr const char* kFormat = "blockwise";  // for QR_CUDA_CHECK (cuda_sdk.cuh)
namespace acuda = qrecipe::adam::cuda;

// ---------------------------------------------------------------- 1. the tensor table

constexpr int kMaxTensorsPerLaunch = 64;
constexpr int kTile = 128;         // a 1x128 block's length, a 128x128 block's edge
constexpr int kPitch = kTile + 1;  // +1 float per staged row against bank conflicts
constexpr int kThreads = 512;
constexpr std::size_t kTileBytes = sizeof(float) * kTile * kPitch;  // 66048: dynamic smem
// One run of loads in flight per thread (update_tile's kBatch = 1: all four buffers' loads
// before the first use) keeps 39 registers, so 3 blocks of 512 threads (75% occupancy) fit; two
// runs would need 63 (2 blocks) and spill at 42 (ptxas -v).
constexpr int kBatch = 1;
constexpr int kMinBlocks = 3;
static_assert(2 * kTile <= kThreads, "one thread per row block and one per column block");

struct Entry {
  acuda::Operands ops;  // master [rows, cols] and its gradient and moments
  acuda::DeviceHyper hyper;
  std::uint8_t* rowwise_data;       // [rows, cols], or nullptr: not held
  float* rowwise_scale_inv;
  std::uint8_t* columnwise_data;    // [cols, rows] (transposed), or nullptr: not held
  float* columnwise_scale_inv;
  std::int64_t rowwise_scale_ld;
  std::int64_t columnwise_scale_ld;
  float amax_epsilon;
  int pow2_scales;
  int tile_128x128;
  std::int64_t tiles_per_row;
  std::int64_t first_block;  // prefix sum of blocks (find_group)
};
using Table = sdk::cuda::GroupTable<Entry, kMaxTensorsPerLaunch>;

// ---------------------------------------------------------------- 2. the kernel

__device__ __forceinline__ float scale_of(const Entry& e, float amax) {
  return num_bw::block_scale(amax, e.pow2_scales != 0, e.amax_epsilon, FLT_MAX);
}

__global__ void __launch_bounds__(kThreads, kMinBlocks)
    update_quantize_kernel(const __grid_constant__ Table table) {
  extern __shared__ float tile[];  // [kTile][kPitch]
  __shared__ float row_scale[kTile];  // 1x128: scale of tile row r; 128x128: all equal
  __shared__ float col_scale[kTile];  // 1x128: scale of tile column c
  const auto tb = acuda::tile_block<kTile, kTile>(table);
  const Entry& e = tb.e;
  const std::int64_t row0 = tb.row0, col0 = tb.col0;
  const std::int64_t rows = e.ops.rows, cols = e.ops.cols;
  const adam::Scalars s = acuda::block_scalars(e.hyper);
  acuda::update_tile<kTile, kTile, kThreads, kPitch, kBatch>(e.ops, s, row0, col0, tile);

  const int t = static_cast<int>(threadIdx.x);
  if (e.tile_128x128) {
    float running = 0.0f;
    for (int i = t; i < kTile * kTile; i += kThreads)
      running = sdk::cuda::amax_of(running, tile[(i / kTile) * kPitch + i % kTile]);
    const float scale = scale_of(e, sdk::cuda::block_max<kThreads>(running));
    if (t < kTile) {
      row_scale[t] = scale;
      col_scale[t] = scale;
    }
    if (t == 0) {
      const std::int64_t a = row0 / kTile, b = col0 / kTile;
      if (e.rowwise_data != nullptr) e.rowwise_scale_inv[a * e.rowwise_scale_ld + b] = 1.0f / scale;
      if (e.columnwise_data != nullptr)
        e.columnwise_scale_inv[b * e.columnwise_scale_ld + a] = 1.0f / scale;
    }
  } else if (t < kTile) {  // the 1x128 block of tile row t (scales stored [col block][row])
    float amax = 0.0f;
    for (int k = 0; k < kTile; ++k) amax = sdk::cuda::amax_of(amax, tile[t * kPitch + k]);
    const float scale = scale_of(e, amax);
    row_scale[t] = scale;
    const std::int64_t row = row0 + t;
    if (e.rowwise_data != nullptr && row < rows)
      e.rowwise_scale_inv[(col0 / kTile) * e.rowwise_scale_ld + row] = 1.0f / scale;
  } else if (t < 2 * kTile) {  // the 1x128 block down tile column c ([row block][column])
    const int c = t - kTile;
    float amax = 0.0f;
    for (int k = 0; k < kTile; ++k) amax = sdk::cuda::amax_of(amax, tile[k * kPitch + c]);
    const float scale = scale_of(e, amax);
    col_scale[c] = scale;
    const std::int64_t col = col0 + c;
    if (e.columnwise_data != nullptr && col < cols)
      e.columnwise_scale_inv[(row0 / kTile) * e.columnwise_scale_ld + col] = 1.0f / scale;
  }
  __syncthreads();

  if (e.rowwise_data != nullptr) {  // runs of 4 columns of a row
    acuda::for_each_run<false, kTile, kTile, kThreads>(
        row0, col0, rows, cols, [&](int r, int c, std::int64_t row, std::int64_t col, int valid) {
          const float* x = tile + r * kPitch + c;
          const float scale = row_scale[r];
          acuda::store_word4(e.rowwise_data + row * cols + col, valid,
                             num::fast::f32x4_to_e4m3x4(x[0] * scale, x[1] * scale,
                                                        x[2] * scale, x[3] * scale));
        });
  }
  if (e.columnwise_data != nullptr) {  // runs of 4 rows of a column, stored at [col][row]
    acuda::for_each_run<true, kTile, kTile, kThreads>(
        row0, col0, rows, cols, [&](int r, int c, std::int64_t row, std::int64_t col, int valid) {
          const float* x = tile + r * kPitch + c;
          const float scale = col_scale[c];
          acuda::store_word4(e.columnwise_data + col * rows + row, valid,
                             num::fast::f32x4_to_e4m3x4(x[0] * scale, x[kPitch] * scale,
                                                        x[2 * kPitch] * scale,
                                                        x[3 * kPitch] * scale));
        });
  }
}

// ---------------------------------------------------------------- 3. the entry

Entry make_entry(const qr_adam_tensor& t, const AdamPlan& plan) {
  Entry e{};
  e.ops = acuda::operands(t);
  e.hyper = acuda::device_hyper(*t.hyper);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_ROWWISE, e.rowwise_data, e.rowwise_scale_inv);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_COLUMNWISE, e.columnwise_data,
                           e.columnwise_scale_inv);
  e.rowwise_scale_ld = plan.rowwise_scale_ld;
  e.columnwise_scale_ld = plan.columnwise_scale_ld;
  e.amax_epsilon = plan.amax_epsilon;
  e.pow2_scales = plan.pow2_scales ? 1 : 0;
  e.tile_128x128 = plan.tile_128x128 ? 1 : 0;
  e.tiles_per_row = (e.ops.cols + kTile - 1) / kTile;
  return e;
}

// The kernel's dynamic shared memory exceeds the default 48 KiB: raise its limit once per
// device, the current one (the first call is an eager one, before any CUDA-graph capture).
void allow_tile_smem() {
  constexpr int kMaxDevices = 128;
  static std::atomic<bool> done[kMaxDevices];
  int device = 0;
  QR_CUDA_CHECK(cudaGetDevice(&device));
  QR_CHECK(device >= 0 && device < kMaxDevices, "blockwise adam_requantize: device index ",
           device, " is out of range");
  if (done[device].load(std::memory_order_acquire)) return;
  QR_CUDA_CHECK(cudaFuncSetAttribute(update_quantize_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kTileBytes)));
  done[device].store(true, std::memory_order_release);
}

}  // namespace

void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream) {
  acuda::run_tables<Table>(tensors, plans, stream, kFormat, make_entry,
                           [](Table& table, cudaStream_t s) {
    allow_tile_smem();  // on the tensors' device, made current by run_tables
    // An empty tensor has nothing to write (blockwise stores no tensor-level scalar).
    const std::int64_t blocks = acuda::assign_blocks(table, [](const Entry& e) {
      return ((e.ops.rows + kTile - 1) / kTile) * e.tiles_per_row;
    }, kFormat);
    if (blocks == 0) return;
    update_quantize_kernel<<<static_cast<unsigned>(blocks), kThreads, kTileBytes, s>>>(table);
    QR_CUDA_CHECK_LAUNCH("update_quantize_kernel");
  });
}

}  // namespace qrecipe::blockwise::cuda
