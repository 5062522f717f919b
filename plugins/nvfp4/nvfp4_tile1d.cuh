// The 1-D quantize tile of nvfp4 (no 2d, no Hadamard): one CTA's 64 x 256 tile, both
// directions, from 32 x 32 warp tiles in registers. Shared by quantize_1d_kernel
// (nvfp4_quantize_tile.cu: f32 sources and stochastic rounding of one tensor) and the grouped
// cast (nvfp4_grouped_kernels.cu: every group of a grouped call in one launch), so both run the
// same per-block code. CUDA only (nvcc); exactness as nvfp4_kernels.cu says.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_device.cuh"
#include "nvfp4_rules.hpp"
#include "philox.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::nvfp4::cuda {

// Quantize, 1-D blocks (no 2d, no Hadamard), f32 sources and stochastic rounding (one tensor
// of 16-bit sources with round to nearest: nvfp4_quantize_16bit.cu; grouped calls use this
// tile for every source dtype). A warp quantizes 32 x 32 warp tiles in the
// layout of cuda_sdk.cuh (lane 4 rg + cg: rows 4 rg .. 4 rg + 3, columns 8 cg .. 8 cg + 7,
// one 16-byte load per row), straight from registers:
//   rowwise     a 1x16 block is one row of a lane pair (cg 0-1 or 2-3): amax and NaN mark by
//               one shuffle; the lane's 8 codes are one 4-byte store of packed E2M1
//   columnwise  a 16x1 block is one column of 4 lanes (rg 0-3 or 4-7): a two-step
//               reduce-scatter leaves each lane 2 columns' amaxes, whose encode factors are
//               then gathered back; the 4 codes of a column are 2 bytes of one row of the
//               transposed output, paired with the next row group's by a shuffle into one
//               4-byte store
// A CTA is 8 warps side by side (64 x 256 with 2 row tiles a warp, loaded before use); the
// scale bytes of the CTA are collected in shared memory and stored as 16 bytes a data row
// (rowwise) and 4 bytes a data row (columnwise) at the end.
template <class In>
struct Tile1d {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  // Warp tiles loaded ahead per warp (an f32 run is two 16-byte loads already).
  static constexpr int kRowTiles = sizeof(typename In::Storage) == 4 ? 1 : 2;
  static constexpr int kRows = 32 * kRowTiles;  // 64 (f32: 32)
  static constexpr int kCols = 32 * kWarps;     // 256
  static constexpr int kRowScaleBytes = kCols / kBlock;  // 16 per CTA row
  static constexpr int kColScaleBytes = kRows / kBlock;  // 4 (f32: 2) per CTA column
  static constexpr int kMinBlocksPerSM = 3;
  static_assert(kBlock == 16, "a row block is 2 lanes, a column block 4 lanes");
  static_assert(kRowScaleBytes == 16 && kColScaleBytes <= 4, "scale rows as one vector");
};

// The E2M1 code (low nibble) of v = x * enc: round to nearest (== rules::round_nearest, via
// num::fast::f32_to_e2m1, or, when no element of the warp tile is NaN, the magnitude of
// |x| * enc with x's sign: |x * enc| = |x| * enc and the sign is x's because enc is positive
// and finite, and f32_to_e2m1_non_nan == f32_to_e2m1 off NaN) or stochastic rounding with the
// element's random word (rules::round_stochastic, or off NaN its magnitude rules::sr_magnitude
// with x's sign, by the same argument).
template <bool kStochastic, bool kNaNFree>
__device__ __forceinline__ std::uint32_t encode_element(float x, float enc, std::uint32_t word) {
  if constexpr (kStochastic && kNaNFree)
    return rules::sr_magnitude(fabsf(x) * enc, word) | ((__float_as_uint(x) >> 28) & 0x8u);
  else if constexpr (kStochastic)
    return rules::round_stochastic(x * enc, word) & 0xFu;
  else if constexpr (kNaNFree)
    return num::fast::e2m1_magnitude(fabsf(x) * enc) | ((__float_as_uint(x) >> 28) & 0x8u);
  else
    return num::fast::f32_to_e2m1(x * enc);
}

// The 4 stochastic-rounding words of elements col .. col + 3 (col % 4 == 0) of data row `row`
// (rows of data_cols elements): one Philox call. Round to nearest draws nothing.
template <bool kStochastic>
__device__ __forceinline__ PhiloxWords sr_words(const RandomStream& random, std::int64_t row,
                                                std::int64_t data_cols, std::int64_t col) {
  if constexpr (kStochastic)
    return sr_group_words(random.seed,
                          sr_group(static_cast<std::uint64_t>(row),
                                   static_cast<std::uint64_t>(data_cols),
                                   static_cast<std::uint64_t>(col)),
                          random.call_offset);
  else
    return PhiloxWords{{0u, 0u, 0u, 0u}};
}

// Column k's 4 codes (rows first_row .. + 3 of transposed row col + k) in 16 bits, k = 0..7;
// first_row % 4 == 0, so the 4 elements are one Philox group of data row col + k.
template <bool kStochastic, bool kNaNFree>
__device__ __forceinline__ void encode_columns(const float (&x)[4][8], const float (&enc)[8],
                                               const RandomStream& random, std::int64_t col,
                                               std::int64_t rows, std::int64_t first_row,
                                               std::uint32_t (&half)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const PhiloxWords r = sr_words<kStochastic>(random, col + k, rows, first_row);
    std::uint32_t h = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      h |= encode_element<kStochastic, kNaNFree>(x[i][k], enc[k], r.w[i]) << (4 * i);
    half[k] = h;
  }
}

// Codes of the 8 elements of one row of a lane (columns col .. col + 7 of data row `row`,
// col % 8 == 0: two Philox groups). kNaNFree: no element of the warp's tile is NaN (the common
// case: no per-element NaN test).
template <bool kStochastic, bool kNaNFree>
__device__ __forceinline__ std::uint32_t encode_row8(const float (&x)[8], float enc,
                                                     const RandomStream& random,
                                                     std::int64_t row, std::int64_t cols,
                                                     std::int64_t col) {
  std::uint32_t word = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const PhiloxWords r = sr_words<kStochastic>(random, row, cols, col + 4 * half);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      word |= encode_element<kStochastic, kNaNFree>(x[4 * half + k], enc, r.w[k])
              << (4 * (4 * half + k));
  }
  return word;
}

// Where a lane of the CTA tile `tile` (row-major over ceil(rows / kRows) x tiles_per_row
// tiles) is: warp w holds columns 32 w .. of the CTA tile, lane 4 rg + cg rows 4 rg .. and
// columns 8 cg .. of each of its warp tiles.
struct Lane1d {
  int lane, warp, rg, cg;
  std::int64_t row0, cta_col;  // the CTA tile's first row and column
  std::int64_t col;            // this lane's first column
  int valid_cols;              // of its C columns, inside the tensor
};

template <class In>
__device__ __forceinline__ Lane1d lane_1d(const QuantizeParams& p, const unsigned tile) {
  using T = Tile1d<In>;
  constexpr int C = sdk::cuda::kTileColsPerLane;
  Lane1d L;
  L.lane = static_cast<int>(threadIdx.x % 32);
  L.warp = static_cast<int>(threadIdx.x / 32);
  L.rg = L.lane / 4;
  L.cg = L.lane % 4;
  L.row0 = (tile / p.tiles_per_row) * T::kRows;
  L.cta_col = (tile % p.tiles_per_row) * T::kCols;
  L.col = L.cta_col + L.warp * 32 + L.cg * C;  // this lane's first column
  L.valid_cols = valid_in_run(L.col, p.cols, C);
  return L;
}

// Step 1: every run of the lane's kRowTiles warp tiles (one 16-byte load a row, f32 two; all
// issued before any is used; outside the tensor +0), kept raw.
template <class In>
__device__ __forceinline__ void load_1d_tile(
    const QuantizeParams& p, const Lane1d& L,
    sdk::cuda::Raw8<In> (&raw)[Tile1d<In>::kRowTiles][sdk::cuda::kTileRowsPerLane]) {
  using T = Tile1d<In>;
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const auto* src = static_cast<const typename In::Storage*>(p.src);
#pragma unroll
  for (int t = 0; t < T::kRowTiles; ++t)
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const std::int64_t r = L.row0 + t * 32 + L.rg * R + i;
      const int valid = r < p.rows ? L.valid_cols : 0;
      sdk::cuda::load_raw8<In>(src, r * p.cols + L.col, valid, p.src_aligned && valid == C,
                               raw[t][i]);
    }
}

// Step 2, rowwise: the 1x16 blocks of warp tile t (lane pairs), their scale bytes into
// row_scales, their codes stored (one 4-byte store a row).
template <class In, bool kStochastic>
__device__ __forceinline__ void quantize_1d_rows(
    const QuantizeParams& p, const Lane1d& L, int t, std::int64_t lane_row,
    const float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane],
    bool warp_nan, float row_s_enc, float row_s_dec,
    std::uint8_t (&row_scales)[Tile1d<In>::kRows][Tile1d<In>::kRowScaleBytes]) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const int warp = L.warp, rg = L.rg, cg = L.cg, valid_cols = L.valid_cols;
  const std::int64_t col = L.col;
  // Bit i: row i of the lane pair's 16 elements (one 1x16 block) holds a NaN.
  std::uint32_t nan_rows = 0;
  if (warp_nan) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      bool any = false;
#pragma unroll
      for (int k = 0; k < C; ++k) any |= x[i][k] != x[i][k];
      nan_rows |= any ? 1u << i : 0u;
    }
    nan_rows |= __shfl_xor_sync(0xFFFFFFFFu, nan_rows, 1);
  }
  float amax[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    amax[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < C; ++k) amax[i] = fmaxf(amax[i], num::abs_f(x[i][k]));  // NaN ignored
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xFFFFFFFFu, amax[i], 1));
  }
  // The pair agrees on all 4 rows: the even lane works out the scales of rows 0-1, the odd
  // lane of rows 2-3, and they swap encode factors.
  const bool odd = cg & 1;
  float mine[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = (odd ? 2 : 0) + j;
    const float block_amax = odd ? amax[2 + j] : amax[j];
    const std::uint8_t code = block_scale_code(block_amax, row_s_enc);
    mine[j] = rules::element_encode_factor(code, row_s_dec);
    row_scales[t * 32 + rg * R + i][warp * 2 + cg / 2] =
        (nan_rows >> i) & 1u ? rules::kNanScaleCode : code;
  }
  const float other0 = __shfl_xor_sync(0xFFFFFFFFu, mine[0], 1);
  const float other1 = __shfl_xor_sync(0xFFFFFFFFu, mine[1], 1);
  const float enc[R] = {odd ? other0 : mine[0], odd ? other1 : mine[1],
                        odd ? mine[0] : other0, odd ? mine[1] : other1};
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t r = lane_row + i;
    const std::uint32_t word =
        warp_nan ? encode_row8<kStochastic, false>(x[i], enc[i], p.random, r, p.cols, col)
                 : encode_row8<kStochastic, true>(x[i], enc[i], p.random, r, p.cols, col);
    if (r < p.rows && valid_cols > 0) {
      const int valid_bytes = (valid_cols + 1) / 2;
      sdk::cuda::store_bytes4(p.row_data, r * p.row_pitch + col / 2, valid_bytes,
                              p.row_vector_ok && valid_bytes == 4, word);
    }
  }
}

// Step 2, columnwise: the 16x1 blocks of warp tile t (4 lanes a column), their scale bytes
// into col_scales, their codes stored (rows of the transposed output, 4 bytes a lane pair).
template <class In, bool kStochastic>
__device__ __forceinline__ void quantize_1d_columns(
    const QuantizeParams& p, const Lane1d& L, int t, std::int64_t tile_row,
    std::int64_t lane_row,
    const float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane],
    bool warp_nan, float col_s_enc, float col_s_dec,
    std::uint8_t (&col_scales)[Tile1d<In>::kCols][4]) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const int lane = L.lane, warp = L.warp, rg = L.rg, cg = L.cg, valid_cols = L.valid_cols;
  const std::int64_t col = L.col;
  float colmax[C];
  std::uint32_t nan_cols = 0;  // bit k: column k of the 16x1 block holds a NaN
#pragma unroll
  for (int k = 0; k < C; ++k) {
    colmax[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) colmax[k] = fmaxf(colmax[k], num::abs_f(x[i][k]));
  }
  if (warp_nan) {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      bool any = false;
#pragma unroll
      for (int i = 0; i < R; ++i) any |= x[i][k] != x[i][k];
      nan_cols |= any ? 1u << k : 0u;
    }
    // Over the 4 lanes of a 16x1 block (lane bits 2 and 3).
    nan_cols |= __shfl_xor_sync(0xFFFFFFFFu, nan_cols, 8);
    nan_cols |= __shfl_xor_sync(0xFFFFFFFFu, nan_cols, 4);
  }
  const bool b3 = lane & 8, b2 = lane & 4;
  float a[4], own_max[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // a[k]: column 4 b3 + k
    const float send = b3 ? colmax[k] : colmax[k + 4], keep = b3 ? colmax[k + 4] : colmax[k];
    a[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 8));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // own_max[k]: column 4 b3 + 2 b2 + k
    const float send = b2 ? a[k] : a[k + 2], keep = b2 ? a[k + 2] : a[k];
    own_max[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 4));
  }
  const int own_col = 4 * b3 + 2 * b2;  // within the lane's cg: columns own_col, +1
  float own_enc[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const std::uint8_t code = block_scale_code(own_max[k], col_s_enc);
    own_enc[k] = rules::element_encode_factor(code, col_s_dec);
    col_scales[warp * 32 + cg * C + own_col + k][t * 2 + rg / 4] =
        (nan_cols >> (own_col + k)) & 1u ? rules::kNanScaleCode : code;
  }
  // Column j of this lane's cg: from the lane of the same 16-row group (rg / 4) holding it.
  float enc[C];
#pragma unroll
  for (int j = 0; j < C; ++j)
    enc[j] = __shfl_sync(0xFFFFFFFFu, own_enc[j & 1], ((rg / 4) * 4 + j / 2) * 4 + cg);
  // Column k's 4 codes: 2 bytes of transposed row col + k at rows lane_row ..
  std::uint32_t half[C];
  if (warp_nan) encode_columns<kStochastic, false>(x, enc, p.random, col, p.rows, lane_row, half);
  else encode_columns<kStochastic, true>(x, enc, p.random, col, p.rows, lane_row, half);
  // Lane pairs rg = 2m, 2m + 1 (lane bit 2) make 8 rows = 4 bytes: the even lane stores
  // columns 0..3, the odd lane columns 4..7.
  const bool odd = rg & 1;
  const std::uint32_t send_lo = odd ? half[0] | (half[1] << 16) : half[4] | (half[5] << 16);
  const std::uint32_t send_hi = odd ? half[2] | (half[3] << 16) : half[6] | (half[7] << 16);
  const std::uint32_t got_lo = __shfl_xor_sync(0xFFFFFFFFu, send_lo, 4);
  const std::uint32_t got_hi = __shfl_xor_sync(0xFFFFFFFFu, send_hi, 4);
  const std::uint32_t partner[4] = {got_lo & 0xFFFFu, got_lo >> 16, got_hi & 0xFFFFu,
                                    got_hi >> 16};
  const std::int64_t pair_row = tile_row + (rg & ~1) * R;  // first of the 8 rows
  const int valid_rows = valid_in_run(pair_row, p.rows, 2 * R);
  const int valid_bytes = (valid_rows + 1) / 2;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int c = odd ? k + 4 : k;
    const std::uint32_t word = odd ? partner[k] | (half[k + 4] << 16) : half[k] | (partner[k] << 16);
    if (c < valid_cols && valid_bytes > 0)
      sdk::cuda::store_bytes4(p.col_data, (col + c) * p.col_pitch + pair_row / 2, valid_bytes,
                              p.col_vector_ok && valid_bytes == 4, word);
  }
}

// Step 3: the CTA's scale bytes, after a barrier: 16 bytes a data row (rowwise) and 4 bytes a
// data row (columnwise) from shared memory. Block-uniform (`want_*` are the same for the whole
// grid).
template <class In>
__device__ __forceinline__ void store_1d_tile_scales(
    const QuantizeParams& p, const Lane1d& L, bool want_row, bool want_col,
    const std::uint8_t (&row_scales)[Tile1d<In>::kRows][Tile1d<In>::kRowScaleBytes],
    const std::uint8_t (&col_scales)[Tile1d<In>::kCols][4]) {
  using T = Tile1d<In>;
  const std::int64_t row0 = L.row0, cta_col = L.cta_col;
  __syncthreads();
  const int tid = static_cast<int>(threadIdx.x);
  if (want_row && tid < T::kRows && row0 + tid < p.rows) {
    const std::int64_t first_block = cta_col / kBlock;
    const int blocks = (valid_in_run(cta_col, p.cols, T::kCols) + kBlock - 1) / kBlock;
    const uint4 v = *reinterpret_cast<const uint4*>(row_scales[tid]);
    std::uint8_t* dst = p.row_scales + (row0 + tid) * p.row_spitch + first_block;
    if (p.row_scale_vector_ok && blocks == T::kRowScaleBytes) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      for (int b = 0; b < blocks; ++b) dst[b] = row_scales[tid][b];
    }
  }
  if (want_col && cta_col + tid < p.cols) {
    const std::int64_t first_block = row0 / kBlock;
    const int blocks = (valid_in_run(row0, p.rows, T::kRows) + kBlock - 1) / kBlock;
    const std::uint32_t v = *reinterpret_cast<const std::uint32_t*>(col_scales[tid]);  // low bytes
    sdk::cuda::store_bytes4(p.col_scales, (cta_col + tid) * p.col_spitch + first_block, blocks,
                            p.col_scale_vector_ok && blocks == 4, v);  // f32: never 4
  }
}

// Quantizes tile `tile` (row-major over ceil(rows / kRows) x tiles_per_row tiles) of the
// tensor `p` describes, with one CTA of Tile1d<In>::kThreads threads: the loads of every warp
// tile first, then per warp tile its rowwise and columnwise blocks, then the CTA's scales.
template <class In, bool kStochastic>
__device__ __forceinline__ void quantize_1d_tile(const QuantizeParams& p, const unsigned tile) {
  using T = Tile1d<In>;
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  __shared__ alignas(16) std::uint8_t row_scales[T::kRows][T::kRowScaleBytes];
  __shared__ alignas(4) std::uint8_t col_scales[T::kCols][4];  // kColScaleBytes used

  const Lane1d L = lane_1d<In>(p, tile);
  const bool want_row = p.row_data != nullptr, want_col = p.col_data != nullptr;
  sdk::cuda::Raw8<In> raw[T::kRowTiles][R];
  load_1d_tile<In>(p, L, raw);
  float row_s_enc = 1.0f, row_s_dec = 1.0f, col_s_enc = 1.0f, col_s_dec = 1.0f;
  if (want_row) {
    row_s_enc = rules::encode_scale(*p.row_amax);
    row_s_dec = 1.0f / row_s_enc;
  }
  if (want_col) {
    col_s_enc = rules::encode_scale(*p.col_amax);
    col_s_dec = 1.0f / col_s_enc;
  }

#pragma unroll
  for (int t = 0; t < T::kRowTiles; ++t) {
    const std::int64_t tile_row = L.row0 + t * 32;
    const std::int64_t lane_row = tile_row + L.rg * R;
    float x[R][C];
#pragma unroll
    for (int i = 0; i < R; ++i) sdk::cuda::decode_raw8<In>(raw[t][i], x[i]);

    bool lane_nan = false;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int k = 0; k < C; ++k) lane_nan |= x[i][k] != x[i][k];
    const bool warp_nan = __any_sync(0xFFFFFFFFu, lane_nan);  // rare: NaN-exact slow path

    if (want_row)
      quantize_1d_rows<In, kStochastic>(p, L, t, lane_row, x, warp_nan, row_s_enc, row_s_dec,
                                        row_scales);
    if (want_col)
      quantize_1d_columns<In, kStochastic>(p, L, t, tile_row, lane_row, x, warp_nan, col_s_enc,
                                           col_s_dec, col_scales);
  }
  store_1d_tile_scales<In>(p, L, want_row, want_col, row_scales, col_scales);
}

}  // namespace qrecipe::nvfp4::cuda
