// CUDA kernels of the nvfp4 plugin's fused Adam + requantize extra (nvfp4_adam_kernels.hpp),
// bit-exact with the CPU path: adam::update of every element (adam.hpp), then nvfp4_ref.cpp on
// the new FP32 master (round to nearest; no Hadamard transform).
//
// Map of this file:
//   1. the tensor table (kernel parameter)
//   2. device helpers: a block's codes, 1x16 / 16x1 blocks, 16x16 tiles
//   3. the quantize kernel (pass 2; pass 1 is adam_cuda.cuh's update + amax)
//   4. the entry: tables, launches
//
// Pass 2 stages a 64 x 64 tile of one new master (the tensor found by a binary search of the
// block over the table's prefix sums of blocks) as FP32 in shared memory; tiles start on
// 16-element boundaries, so every 1x16 rowwise block, 16x1 columnwise block and 16x16 tile
// lies inside one staged tile (+0 outside the tensor, which changes no amax and marks no NaN).
// One thread per 16-element block: its amax and NaN mark, its E4M3 scale code, its 16 E2M1
// codes as 8 bytes of one data row.
//
// Exactness: tensor amax = max |x| over the new master (NaN ignored); S_enc, encode factor:
// rules:: (nvfp4_rules.hpp, the reference's code); block scale code: rules:: product through
// the hardware E4M3 conversion (nvfp4_device.cuh block_scale_code); element codes: round to
// nearest through num::fast::f32_to_e2m1 (proven equal to conversions.hpp); a block holding a
// NaN stores scale 0x7F, its codes computed as if the NaN were absent (the NaN itself 0x7).
// Built with -fmad=false --ftz=false like every plugin kernel.
#include "nvfp4_adam_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_device.cuh"  // kFormat, kBlock, block_scale_code (hardware E4M3)
#include "nvfp4_rules.hpp"
#include "qrecipe/adam_cuda.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::nvfp4::cuda {
namespace {

namespace acuda = qrecipe::adam::cuda;

// ---------------------------------------------------------------- 1. the tensor table

constexpr int kMaxTensorsPerLaunch = 64;
constexpr int kTile = 64;
constexpr int kPitch = kTile + 1;          // +1 float per staged row against bank conflicts
constexpr int kThreads = 256;
// quantize_kernel: 32 registers (8 blocks, full occupancy) with a thread's 4 runs of loads in
// flight (adam_cuda.cuh load_tile), no spills (ptxas -v).
constexpr int kQuantizeMinBlocks = 8;
static_assert(kTile * (kTile / kBlock) == kThreads, "one thread per 1x16 block of a tile");
static_assert((kTile / kBlock) * (kTile / kBlock) * kBlock == kThreads,
              "one thread per row (and column) of each 16x16 tile");

struct Entry {
  acuda::Operands ops;  // master [rows, cols] and its gradient and moments
  acuda::DeviceHyper hyper;
  std::uint8_t* rowwise_data;       // data matrix [rows, ceil(cols / 2)] bytes, or nullptr
  std::uint8_t* rowwise_scales;     // [.., rowwise_scale_ld] E4M3
  std::uint8_t* columnwise_data;    // data matrix [cols, ceil(rows / 2)] bytes, or nullptr
  std::uint8_t* columnwise_scales;  // [.., columnwise_scale_ld] E4M3
  std::int64_t rowwise_scale_ld;
  std::int64_t columnwise_scale_ld;
  float* amax_main;                 // the tensor amax (rowwise's buffer when held)
  float* amax_other;                // the other direction's amax buffer, or nullptr
  int two_d;
  std::int64_t tiles_per_row;
  std::int64_t first_block;         // prefix sum of blocks (find_group)
};
using Table = sdk::cuda::GroupTable<Entry, kMaxTensorsPerLaunch>;

// ---------------------------------------------------------------- 2. device helpers

// The bytes of up to 16 codes of x[k * stride] (k < n, n >= 1) with encode factor enc, even
// index in the low nibble (the high nibble of a last odd byte stays 0), stored at out.
__device__ __forceinline__ void store_codes(std::uint8_t* out, const float* x, int stride, int n,
                                            float enc) {
  std::uint32_t words[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < kBlock; ++k)
    if (k < n)
      words[k / 8] |= (num::fast::f32_to_e2m1(x[k * stride] * enc) & 0xFu) << (4 * (k % 8));
  const int bytes = (n + 1) / 2;
  if (bytes == 8 && acuda::device_aligned(out, 8)) {
    *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
    return;
  }
  for (int b = 0; b < bytes; ++b) out[b] = static_cast<std::uint8_t>(words[b / 4] >> (8 * (b % 4)));
}

// max |x[k * stride]| over k < n (NaN ignored) and whether one of them is NaN.
__device__ __forceinline__ float block_amax(const float* x, int stride, int n, bool& has_nan) {
  float amax = 0.0f;
  has_nan = false;
#pragma unroll
  for (int k = 0; k < kBlock; ++k) {
    if (k >= n) break;
    const float v = x[k * stride];
    amax = sdk::cuda::amax_of(amax, v);
    has_nan = has_nan || num::is_nan(v);
  }
  return amax;
}

// One 16-element block of one data row: its scale (0x7F when it holds a NaN) and codes.
__device__ __forceinline__ void quantize_block(const float* x, int stride, int n, float s_enc,
                                               float s_dec, std::uint8_t* data,
                                               std::uint8_t* scale) {
  bool has_nan = false;
  const float amax = block_amax(x, stride, n, has_nan);
  const std::uint8_t code = block_scale_code(amax, s_enc);  // == rules::
  store_codes(data, x, stride, n, rules::element_encode_factor(code, s_dec));
  *scale = has_nan ? rules::kNanScaleCode : code;
}

// 1-D blocks: thread (r, b) = (t / 4, t % 4) takes the rowwise block b of tile row r; thread
// (c, b) = (t / 4, t % 4) the columnwise block b (16 rows) of tile column c. Four neighbouring
// threads write one data row's 32 bytes.
__device__ __forceinline__ void quantize_1d(const Entry& e, const float* tile, std::int64_t row0,
                                            std::int64_t col0, float s_enc, float s_dec) {
  const std::int64_t rows = e.ops.rows, cols = e.ops.cols;
  const int t = static_cast<int>(threadIdx.x);
  const int i = t / (kTile / kBlock), b = t % (kTile / kBlock);
  if (e.rowwise_data != nullptr) {
    const std::int64_t row = row0 + i, c0 = col0 + b * kBlock;
    if (row < rows && c0 < cols) {
      const int n = cols - c0 < kBlock ? static_cast<int>(cols - c0) : kBlock;
      quantize_block(tile + i * kPitch + b * kBlock, 1, n, s_enc, s_dec,
                     e.rowwise_data + row * ((cols + 1) / 2) + c0 / 2,
                     e.rowwise_scales + row * e.rowwise_scale_ld + c0 / kBlock);
    }
  }
  if (e.columnwise_data != nullptr) {
    const std::int64_t col = col0 + i, r0 = row0 + b * kBlock;
    if (col < cols && r0 < rows) {
      const int n = rows - r0 < kBlock ? static_cast<int>(rows - r0) : kBlock;
      quantize_block(tile + b * kBlock * kPitch + i, kPitch, n, s_enc, s_dec,
                     e.columnwise_data + col * ((rows + 1) / 2) + r0 / 2,
                     e.columnwise_scales + col * e.columnwise_scale_ld + r0 / kBlock);
    }
  }
}

// 16x16 tiles: 16 threads per tile (t / 16 picks the tile of the 4 x 4 in the staged tile),
// thread i of a tile takes its row i (rowwise block) and its column i (columnwise block); the
// tile amax is the max over the 16 threads' row amaxes (shuffles within 16 lanes), the NaN
// mark is per stored block, the codes of both directions come from one encode factor.
__device__ __forceinline__ void quantize_2d(const Entry& e, const float* tile, std::int64_t row0,
                                            std::int64_t col0, float s_enc, float s_dec) {
  const std::int64_t rows = e.ops.rows, cols = e.ops.cols;
  const int t = static_cast<int>(threadIdx.x);
  const int id = t / kBlock, i = t % kBlock;
  const int tr = id / (kTile / kBlock), tc = id % (kTile / kBlock);
  const std::int64_t r0 = row0 + tr * kBlock, c0 = col0 + tc * kBlock;  // the 16x16 tile
  const int n_rows = rows - r0 <= 0 ? 0 : (rows - r0 < kBlock ? static_cast<int>(rows - r0) : kBlock);
  const int n_cols = cols - c0 <= 0 ? 0 : (cols - c0 < kBlock ? static_cast<int>(cols - c0) : kBlock);
  const float* row_x = tile + (tr * kBlock + i) * kPitch + tc * kBlock;  // row i of the tile
  const float* col_x = tile + tr * kBlock * kPitch + tc * kBlock + i;    // column i
  bool row_nan = false, col_nan = false;
  // Outside the tensor the staged values are +0: every thread computes, only valid ones store.
  float amax = block_amax(row_x, 1, kBlock, row_nan);
  block_amax(col_x, kPitch, kBlock, col_nan);
#pragma unroll
  for (int offset = kBlock / 2; offset > 0; offset /= 2)  // max over the tile's 16 lanes
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  const std::uint8_t code = block_scale_code(amax, s_enc);  // == rules::
  const float enc = rules::element_encode_factor(code, s_dec);
  if (e.rowwise_data != nullptr && i < n_rows && n_cols > 0) {
    const std::int64_t row = r0 + i;
    store_codes(e.rowwise_data + row * ((cols + 1) / 2) + c0 / 2, row_x, 1, n_cols, enc);
    e.rowwise_scales[row * e.rowwise_scale_ld + c0 / kBlock] = row_nan ? rules::kNanScaleCode : code;
  }
  if (e.columnwise_data != nullptr && i < n_cols && n_rows > 0) {
    const std::int64_t col = c0 + i;
    store_codes(e.columnwise_data + col * ((rows + 1) / 2) + r0 / 2, col_x, kPitch, n_rows, enc);
    e.columnwise_scales[col * e.columnwise_scale_ld + r0 / kBlock] =
        col_nan ? rules::kNanScaleCode : code;
  }
}

// ---------------------------------------------------------------- 3. the quantize kernel

__global__ void __launch_bounds__(kThreads, kQuantizeMinBlocks)
    quantize_kernel(const __grid_constant__ Table table) {
  __shared__ float tile[kTile * kPitch];
  const auto tb = acuda::tile_block<kTile, kTile>(table);
  const Entry& e = tb.e;
  const std::int64_t row0 = tb.row0, col0 = tb.col0;
  const float amax = *e.amax_main;
  const float s_enc = rules::encode_scale(amax);
  const float s_dec = 1.0f / s_enc;
  if (tb.local == 0 && threadIdx.x == 0 && e.amax_other != nullptr) *e.amax_other = amax;
  acuda::load_tile<kTile, kTile, kThreads, kPitch>(static_cast<const float*>(e.ops.param),
                                                   e.ops.rows, e.ops.cols, e.ops.vec4, row0,
                                                   col0, tile);
  if (e.two_d) quantize_2d(e, tile, row0, col0, s_enc, s_dec);
  else quantize_1d(e, tile, row0, col0, s_enc, s_dec);
}

// ---------------------------------------------------------------- 4. the entry

Entry make_entry(const qr_adam_tensor& t, const AdamPlan& plan) {
  Entry e{};
  e.ops = acuda::operands(t);
  e.hyper = acuda::device_hyper(*t.hyper);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_ROWWISE, e.rowwise_data, e.rowwise_scales);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_COLUMNWISE, e.columnwise_data,
                           e.columnwise_scales);
  e.rowwise_scale_ld = plan.rowwise_scale_ld;
  e.columnwise_scale_ld = plan.columnwise_scale_ld;
  acuda::amax_targets(*t.dst, e.amax_main, e.amax_other);
  e.two_d = plan.two_d ? 1 : 0;
  e.tiles_per_row = e.ops.cols == 0 ? 1 : (e.ops.cols + kTile - 1) / kTile;
  return e;
}

}  // namespace

void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream) {
  acuda::run_tables<Table>(tensors, plans, stream, kFormat, make_entry,
                           [](Table& table, cudaStream_t s) {
    acuda::launch_update_amax(table, s, kFormat);  // zero, then update + amax
    // At least one block per tensor, even an empty one: it writes the other amax.
    const std::int64_t blocks = acuda::assign_blocks(table, [](const Entry& e) {
      return acuda::tiles_of(e.ops.rows, e.ops.cols, kTile, kTile);
    }, kFormat);
    quantize_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(table);
    QR_CUDA_CHECK_LAUNCH("quantize_kernel");
  });
}

}  // namespace qrecipe::nvfp4::cuda
