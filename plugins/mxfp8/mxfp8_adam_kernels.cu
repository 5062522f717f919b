// CUDA kernel of the mxfp8 plugin's fused Adam + requantize extra (mxfp8_adam_kernels.hpp),
// bit-exact with the CPU path: adam::update of every element (adam.hpp), then mxfp8_ref.cpp on
// the new FP32 master.
//
// Map of this file:
//   1. the tensor table (kernel parameter)
//   2. the kernel: update a tile, block exponents, codes
//   3. the entry: tables and launches
//
// One block per kTileRows x kTileCols tile of one tensor (the tensor found by a binary search
// of the block over the table's prefix sums of blocks). The tile's new master values are
// staged as FP32 in shared memory; a tile row holds kTileCols / 32 whole rowwise blocks and a
// tile column one whole columnwise block (tiles start on block boundaries), so every block
// amax is taken over staged values (+0 outside the tensor, which changes no amax).
//
// Exactness: block amax = max |x| (NaN ignored; exact in any order); exponent =
// num_mx::block_exponent(amax, fl32(1/fmax)) (mxfp8_numerics.hpp, the reference's code); codes
// = sat_rne(x * 2^(127-e)) through num::fast (proven equal to conversions.hpp). Built with
// -fmad=false --ftz=false like every plugin kernel.
#include "mxfp8_adam_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "mxfp8_numerics.hpp"
#include "mxfp8_ref.hpp"
#include "qrecipe/adam_cuda.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::mxfp8::cuda {
namespace {

constexpr const char* kFormat = "mxfp8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)
namespace acuda = qrecipe::adam::cuda;

// ---------------------------------------------------------------- 1. the tensor table

constexpr int kMaxTensorsPerLaunch = 64;
constexpr int kBlock = static_cast<int>(ref::kBlockSize);  // 32
constexpr int kTileRows = kBlock;                           // one columnwise block per column
constexpr int kTileCols = 128;                              // four rowwise blocks per row
constexpr int kBlocksPerRow = kTileCols / kBlock;
constexpr int kPitch = kTileCols + 1;  // +1 float per staged row against bank conflicts
constexpr int kThreads = 256;
// At most 64 registers: 4 blocks (50% occupancy) with two runs of loads in flight per thread
// (adam_cuda.cuh update_tile), no spills (ptxas -v).
constexpr int kMinBlocks = 4;
static_assert(kTileRows * kBlocksPerRow + kTileCols == kThreads,
              "one thread per rowwise block and one per columnwise block of a tile");

struct Entry {
  acuda::Operands ops;  // master [rows, cols] and its gradient and moments
  acuda::DeviceHyper hyper;
  std::uint8_t* rowwise_data;      // [rows, cols], or nullptr: not held
  std::uint8_t* rowwise_scale;     // [.., rowwise_scale_ld] E8M0
  std::uint8_t* columnwise_data;   // [rows, cols] (not transposed), or nullptr: not held
  std::uint8_t* columnwise_scale;  // [.., columnwise_scale_ld] E8M0
  std::int64_t rowwise_scale_ld;
  std::int64_t columnwise_scale_ld;
  float rcp_max;                   // fl32(1 / fmax)
  int e4m3;                        // 1: E4M3 codes, 0: E5M2
  std::int64_t tiles_per_row;
  std::int64_t first_block;        // prefix sum of blocks (find_group)
};
using Table = sdk::cuda::GroupTable<Entry, kMaxTensorsPerLaunch>;

// ---------------------------------------------------------------- 2. the kernel

__device__ __forceinline__ std::uint32_t encode4(bool e4m3, float a, float b, float c, float d) {
  return e4m3 ? num::fast::f32x4_to_e4m3x4(a, b, c, d) : num::fast::f32x4_to_e5m2x4(a, b, c, d);
}

__global__ void __launch_bounds__(kThreads, kMinBlocks)
    update_quantize_kernel(const __grid_constant__ Table table) {
  __shared__ float tile[kTileRows * kPitch];
  __shared__ std::uint8_t row_exponent[kTileRows][kBlocksPerRow];
  __shared__ std::uint8_t col_exponent[kTileCols];
  const auto tb = acuda::tile_block<kTileRows, kTileCols>(table);
  const Entry& e = tb.e;
  const std::int64_t row0 = tb.row0, col0 = tb.col0;
  const std::int64_t rows = e.ops.rows, cols = e.ops.cols;
  const adam::Scalars s = acuda::block_scalars(e.hyper);
  acuda::update_tile<kTileRows, kTileCols, kThreads, kPitch>(e.ops, s, row0, col0, tile);

  // Exponents: threads 0..127 take rowwise block (r, j), threads 128..255 column c.
  const int t = static_cast<int>(threadIdx.x);
  if (t < kTileRows * kBlocksPerRow) {
    const int r = t / kBlocksPerRow, j = t % kBlocksPerRow;
    float amax = 0.0f;
    for (int k = 0; k < kBlock; ++k) amax = sdk::cuda::amax_of(amax, tile[r * kPitch + j * kBlock + k]);
    const std::uint8_t exponent = num_mx::block_exponent(amax, e.rcp_max);
    row_exponent[r][j] = exponent;
    const std::int64_t row = row0 + r, block_col = col0 + j * kBlock;
    if (e.rowwise_data != nullptr && row < rows && block_col < cols)
      e.rowwise_scale[row * e.rowwise_scale_ld + block_col / kBlock] = exponent;
  } else {
    const int c = t - kTileRows * kBlocksPerRow;
    float amax = 0.0f;
    for (int k = 0; k < kTileRows; ++k) amax = sdk::cuda::amax_of(amax, tile[k * kPitch + c]);
    const std::uint8_t exponent = num_mx::block_exponent(amax, e.rcp_max);
    col_exponent[c] = exponent;
    const std::int64_t col = col0 + c;
    if (e.columnwise_data != nullptr && col < cols && row0 < rows)
      e.columnwise_scale[(row0 / kBlock) * e.columnwise_scale_ld + col] = exponent;
  }
  __syncthreads();

  // Codes: runs of 4 columns, row by row (both directions are stored [rows, cols]).
  const bool e4m3 = e.e4m3 != 0;
  acuda::for_each_run<false, kTileRows, kTileCols, kThreads>(
      row0, col0, rows, cols, [&](int r, int c, std::int64_t row, std::int64_t col, int valid) {
        const float* x = tile + r * kPitch + c;
        if (e.rowwise_data != nullptr) {
          const float m = num::e8m0_encode_factor(row_exponent[r][c / kBlock]);
          acuda::store_word4(e.rowwise_data + row * cols + col, valid,
                             encode4(e4m3, x[0] * m, x[1] * m, x[2] * m, x[3] * m));
        }
        if (e.columnwise_data != nullptr) {
          acuda::store_word4(e.columnwise_data + row * cols + col, valid,
                             encode4(e4m3, x[0] * num::e8m0_encode_factor(col_exponent[c]),
                                     x[1] * num::e8m0_encode_factor(col_exponent[c + 1]),
                                     x[2] * num::e8m0_encode_factor(col_exponent[c + 2]),
                                     x[3] * num::e8m0_encode_factor(col_exponent[c + 3])));
        }
      });
}

// ---------------------------------------------------------------- 3. the entry

Entry make_entry(const qr_adam_tensor& t, const AdamPlan& plan) {
  Entry e{};
  e.ops = acuda::operands(t);
  e.hyper = acuda::device_hyper(*t.hyper);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_ROWWISE, e.rowwise_data, e.rowwise_scale);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_COLUMNWISE, e.columnwise_data,
                           e.columnwise_scale);
  e.rowwise_scale_ld = plan.rowwise_scale_ld;
  e.columnwise_scale_ld = plan.columnwise_scale_ld;
  e.rcp_max = ref::reciprocal_max(plan.data_dtype);  // throws unless e4m3 or e5m2
  e.e4m3 = plan.data_dtype == QR_DTYPE_E4M3 ? 1 : 0;
  e.tiles_per_row = (e.ops.cols + kTileCols - 1) / kTileCols;
  return e;
}

}  // namespace

void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream) {
  acuda::run_tables<Table>(tensors, plans, stream, kFormat, make_entry,
                           [](Table& table, cudaStream_t s) {
    // An empty tensor has no block to write (mxfp8 stores no tensor-level scalar).
    const std::int64_t blocks = acuda::assign_blocks(table, [](const Entry& e) {
      return ((e.ops.rows + kTileRows - 1) / kTileRows) * e.tiles_per_row;
    }, kFormat);
    if (blocks == 0) return;
    update_quantize_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(table);
    QR_CUDA_CHECK_LAUNCH("update_quantize_kernel");
  });
}

}  // namespace qrecipe::mxfp8::cuda
