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
// codes as 8 bytes of one data row; with 2-D tiles each element is encoded once and the
// columnwise codes are read back transposed (quantize_2d).
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
constexpr int kCodePitch = kTile / 4 + 1;  // words of one code byte each: 2d codes, +1 likewise
constexpr int kThreads = 256;
// quantize_kernel: at most 40 registers (6 blocks, 75% occupancy) with a thread's 4 runs of
// loads in flight (adam_cuda.cuh load_tile), no spills (ptxas -v; 32 spill).
constexpr int kQuantizeMinBlocks = 6;
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

// The bytes of up to 16 packed codes (words: even index in the low nibble) at out: (n + 1) / 2
// bytes, one 8-byte store when all 16 exist and out is aligned.
__device__ __forceinline__ void store_packed16(std::uint8_t* out, const std::uint32_t (&words)[2],
                                               int n) {
  const int bytes = (n + 1) / 2;
  if (bytes == 8 && acuda::device_aligned(out, 8)) {
    *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
    return;
  }
#pragma unroll
  for (int b = 0; b < 8; ++b)  // unrolled: words stays in registers
    if (b < bytes) out[b] = static_cast<std::uint8_t>(words[b / 4] >> (8 * (b % 4)));
}

// 16x16 tiles: 16 threads per tile (t / 16 picks the tile of the 4 x 4 in the staged tile),
// thread i of a tile takes its row i (rowwise block) and its column i (columnwise block). The
// tile amax is the max over the 16 threads' row amaxes, a column's NaN mark the OR of the
// rows' NaN masks (shuffles within 16 lanes). One encode factor serves the whole 16x16 tile,
// so each element is encoded once, by its row's thread: the codes go to `codes` (one byte
// each, shared memory) and a column's codes are read back from there, the transpose of the
// rowwise ones by construction. Outside the tensor the staged values are +0 (code 0, no NaN):
// every thread computes, only valid ones store.
__device__ __forceinline__ void quantize_2d(const Entry& e, const float* tile,
                                            std::uint32_t (*codes)[kCodePitch],
                                            std::int64_t row0, std::int64_t col0, float s_enc,
                                            float s_dec) {
  const std::int64_t rows = e.ops.rows, cols = e.ops.cols;
  const int t = static_cast<int>(threadIdx.x);
  const int id = t / kBlock, i = t % kBlock;
  const int tr = id / (kTile / kBlock), tc = id % (kTile / kBlock);
  const std::int64_t r0 = row0 + tr * kBlock, c0 = col0 + tc * kBlock;  // the 16x16 tile
  const int n_rows = sdk::cuda::valid_in_run(r0, rows, kBlock);
  const int n_cols = sdk::cuda::valid_in_run(c0, cols, kBlock);
  const float* row_x = tile + (tr * kBlock + i) * kPitch + tc * kBlock;  // row i of the tile
  float amax = 0.0f;
  std::uint32_t nan_mask = 0u;  // bit k: element k of row i is NaN
#pragma unroll
  for (int k = 0; k < kBlock; ++k) {
    amax = sdk::cuda::amax_of(amax, row_x[k]);
    nan_mask |= (num::is_nan(row_x[k]) ? 1u : 0u) << k;
  }
  std::uint32_t column_nans = nan_mask;  // bit k: column k of the tile holds a NaN
#pragma unroll
  for (int offset = kBlock / 2; offset > 0; offset /= 2) {  // over the tile's 16 lanes
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    column_nans |= __shfl_xor_sync(0xFFFFFFFFu, column_nans, offset);
  }
  const std::uint8_t code = block_scale_code(amax, s_enc);  // == rules::
  const float enc = rules::element_encode_factor(code, s_dec);
  std::uint32_t row_words[2] = {0u, 0u};  // packed nibbles, element k at bits 4 (k % 8)
  std::uint32_t row_bytes[4] = {0u, 0u, 0u, 0u};  // one byte per code, for the transpose
#pragma unroll
  for (int k = 0; k < kBlock; ++k) {
    const std::uint32_t q = num::fast::f32_to_e2m1(row_x[k] * enc) & 0xFu;
    row_words[k / 8] |= q << (4 * (k % 8));
    row_bytes[k / 4] |= q << (8 * (k % 4));
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) codes[tr * kBlock + i][tc * (kBlock / 4) + w] = row_bytes[w];
  __syncwarp();  // a 16x16 tile's 16 lanes lie in one warp
  std::uint32_t col_words[2] = {0u, 0u};  // column i's codes, row j at bits 4 (j % 8)
#pragma unroll
  for (int j = 0; j < kBlock; ++j) {
    const std::uint32_t q =
        (codes[tr * kBlock + j][tc * (kBlock / 4) + i / 4] >> (8 * (i % 4))) & 0xFu;
    col_words[j / 8] |= q << (4 * (j % 8));
  }
  if (e.rowwise_data != nullptr && i < n_rows && n_cols > 0) {
    const std::int64_t row = r0 + i;
    store_packed16(e.rowwise_data + row * ((cols + 1) / 2) + c0 / 2, row_words, n_cols);
    e.rowwise_scales[row * e.rowwise_scale_ld + c0 / kBlock] =
        nan_mask != 0u ? rules::kNanScaleCode : code;
  }
  if (e.columnwise_data != nullptr && i < n_cols && n_rows > 0) {
    const std::int64_t col = c0 + i;
    store_packed16(e.columnwise_data + col * ((rows + 1) / 2) + r0 / 2, col_words, n_rows);
    e.columnwise_scales[col * e.columnwise_scale_ld + r0 / kBlock] =
        ((column_nans >> i) & 1u) != 0u ? rules::kNanScaleCode : code;
  }
}

// ---------------------------------------------------------------- 3. the quantize kernel

__global__ void __launch_bounds__(kThreads, kQuantizeMinBlocks)
    quantize_kernel(const __grid_constant__ Table table) {
  __shared__ float tile[kTile * kPitch];
  __shared__ std::uint32_t codes[kTile][kCodePitch];  // 2d: the tile's codes, a byte each
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
  if (e.two_d) quantize_2d(e, tile, codes, row0, col0, s_enc, s_dec);
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
