// The quantize tile of blockwise, shared by the kernels of blockwise_kernels.cu (one tensor)
// and blockwise_grouped_kernels.cu (every group of a grouped call in one launch), so both run
// the same per-block code: the device helpers, the CTA's shared memory and parameters,
// quantize_tile (one 128 x 128 tile, both directions, in named steps) and the host-side
// parameter setup of one tensor. CUDA only (nvcc).
//
// Exactness: as blockwise_kernels.cu says (the scale and the product are blockwise_numerics.hpp,
// the reference's own code; the block amax is an exact max).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "blockwise_kernels.hpp"
#include "blockwise_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::blockwise::cuda {

// Shared helpers of the tile code (qrecipe/cuda_sdk.cuh).
using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::BF16In;
using sdk::cuda::block_max;
using sdk::ceil_div;
using sdk::cuda::decode_raw8;
using sdk::cuda::DeviceGuard;
using sdk::cuda::Directions;  // one kernel instance per direction request
using sdk::cuda::F16In;
using sdk::cuda::F32In;
using sdk::cuda::has_columnwise;
using sdk::cuda::has_rowwise;
using sdk::cuda::is_aligned;
using sdk::cuda::load_raw8;
using sdk::cuda::Raw8;
using sdk::cuda::store_bytes4;
using sdk::cuda::store_bytes8;
using sdk::cuda::valid_in_run;

inline constexpr int kBlock = 128;  // edge of a block / tile (ref::kBlock)

// Fused quantize. One CTA of 16 warps per 128 x 128 tile of the source (grid: column tiles x
// row tiles); warp (wy, wx) holds the 32 x 32 warp tile at rows 32 wy, columns 32 wx in the
// layout of cuda_sdk.cuh (lane 4 rg + cg: rows 4 rg .. 4 rg + 3, columns 8 cg .. 8 cg + 7),
// read with one 16-byte load per row (f32: two).
//   amaxes   rows: a shuffle over the 4 lanes of a row, then the 4 warps of a tile row through
//            shared memory; columns: a shuffle reduce-scatter over the 8 lanes of a column,
//            then the 4 warps of a tile column; 128x128: a warp max, then the 16 warps
//   scales   one thread per tile row (rowwise) and per tile column (columnwise), or thread 0
//            (128x128), computes scale and scale_inv once and publishes the scale
//   codes    rowwise: 8 codes per row and lane, one 8-byte store; columnwise (transposed
//            [cols, rows]): per column the lane's 4 rows are 4 consecutive bytes of one
//            output row, one 4-byte store; 8 lanes of a column write 32 contiguous bytes
// Two barriers per CTA; no code tile in shared memory (staging the transposed codes through
// one, for 16-byte stores of whole lines, measured slower on an H100: 1x128 columnwise 0.909 /
// 0.943 of the copy ceiling at 8192 x 8192 / 16384 x 8192 against 0.925 / 0.955). Tiles inside
// the tensor with every buffer aligned run a path without bounds checks or scalar fallbacks;
// the edge tiles run out of line.
template <class In>
struct QuantizeTile {
  static constexpr int kRows = kBlock;  // 128: one 128x1 block per column
  static constexpr int kCols = kBlock;  // 128: one 1x128 block per row
  static constexpr int kWarpsY = kRows / 32, kWarpsX = kCols / 32;
  static constexpr int kThreads = 32 * kWarpsY * kWarpsX;  // 512
  // 2 CTAs (32 warps) per SM: registers capped at 64 a thread.
  static constexpr int kMinBlocksPerSM = 2;
};

template <class In>
struct QuantizeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t tile_rows;  // ceil(rows / kRows)
  bool pow2_scales;
  float amax_epsilon, value_for_inf;
  std::uint8_t* rowwise_data;  // nullptr: rowwise not requested
  float* rowwise_scale_inv;
  std::int64_t rowwise_scale_ld;
  std::uint8_t* columnwise_data;  // nullptr: columnwise not requested
  std::int64_t columnwise_ld;     // bytes between rows of the transposed [cols, rows] codes
  float* columnwise_scale_inv;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % 8 == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 8 == 0 and rowwise data 8-byte aligned
  bool columnwise_store_aligned;  // columnwise_ld % 4 == 0 and columnwise data 4-byte aligned
  bool all_aligned;               // every flag above that the request uses
};

// Shared memory of one CTA, sized for the directions it writes.
template <class In, bool kTile128x128, Directions D>
struct QuantizeShared {
  using T = QuantizeTile<In>;
  static constexpr bool kRowParts = has_rowwise(D) && !kTile128x128;
  static constexpr bool kColParts = has_columnwise(D) && !kTile128x128;
  float row_part[kRowParts ? T::kWarpsX : 1][T::kRows];  // per warp column: max of each row
  float col_part[kColParts ? T::kWarpsY : 1][T::kCols];  // per warp row: max of each column
  float row_scale[kRowParts ? T::kRows : 1], col_scale[kColParts ? T::kCols : 1];
  float warp_max[T::kWarpsY * T::kWarpsX];
  float tile_scale;
};

template <class In>
__device__ __forceinline__ float block_scale_of(const QuantizeParams<In>& p, float amax) {
  return num_bw::block_scale(amax, p.pow2_scales, p.amax_epsilon, p.value_for_inf);
}

// E4M3 codes of two products (lo in bits 0..7): num_bw::encode = f32_to_e4m3(x * scale). The
// hardware conversion equals f32_to_e4m3 on every non-NaN input (test_gpu_conversions);
// `has_nan` (the lane holds a NaN source element; scales are finite, so only those products
// are NaN) adds the reference's canonical NaN 0x7F, as num::fast::f32x2_to_e4m3x2 does.
__device__ __forceinline__ std::uint32_t encode_pair(float lo, float hi, bool has_nan) {
  const std::uint32_t codes = num::fast::hardware_e4m3x2(lo, hi);
  return has_nan ? num::fast::canonical_nan_pair(codes, lo, hi) : codes;
}

// Where this lane's part of tile (tile_row, tile_col) lies: warp (wy, wx) holds the warp tile
// at rows 32 wy, columns 32 wx; lane 4 rg + cg its rows 4 rg .., columns 8 cg .. .
struct TileLane {
  int lane, warp, rg, cg, wy, wx;
  std::int64_t row0, col0;      // the tile's first row and column
  int lane_row, lane_col;       // the lane's first row and column within the tile
  std::int64_t col;             // the lane's first column in the tensor
  std::int64_t lane_offset;     // element of run 0: (row0 + lane_row, col)
  int valid_cols;               // of its C columns, inside the tensor
};

template <bool kInterior, class In>
__device__ __forceinline__ TileLane tile_lane(const QuantizeParams<In>& p, std::int64_t tile_row,
                                              std::int64_t tile_col) {
  using T = QuantizeTile<In>;
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  TileLane L;
  L.lane = static_cast<int>(threadIdx.x % 32);
  L.warp = static_cast<int>(threadIdx.x / 32);
  L.rg = L.lane / 4;
  L.cg = L.lane % 4;
  L.wy = L.warp / T::kWarpsX;
  L.wx = L.warp % T::kWarpsX;
  L.row0 = tile_row * T::kRows;
  L.col0 = tile_col * T::kCols;
  L.lane_row = L.wy * 32 + L.rg * R;
  L.lane_col = L.wx * 32 + L.cg * C;
  L.col = L.col0 + L.lane_col;
  L.lane_offset = (L.row0 + L.lane_row) * p.cols + L.col;
  L.valid_cols = kInterior ? C : valid_in_run(L.col, p.cols, C);
  return L;
}

// Step 1: the lane's R runs of C elements (one 16-byte load a row, all issued first; outside
// the tensor +0), as FP32. Returns whether any of them is NaN.
template <bool kInterior, class In>
__device__ __forceinline__ bool load_lane_values(
    const QuantizeParams<In>& p, const TileLane& L,
    float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane]) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  Raw8<In> raw[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = L.lane_offset + i * p.cols;
    if constexpr (kInterior) {
      load_raw8<In>(p.src, offset, C, true, raw[i]);
    } else {
      const int valid = L.row0 + L.lane_row + i < p.rows ? L.valid_cols : 0;
      load_raw8<In>(p.src, offset, valid, p.load_aligned && valid == C, raw[i]);
    }
  }
  bool has_nan = false;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    decode_raw8<In>(raw[i], x[i]);
#pragma unroll
    for (int k = 0; k < C; ++k) has_nan |= x[i][k] != x[i][k];
  }
  return has_nan;
}

// Step 2: the lane's partial amaxes into shared memory (rows and columns outside the tensor
// hold +0): 128x128, the warp's max; else a row's max over its 4 lanes, per warp column, and a
// column's max over its 8 lanes, per warp row.
template <class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void publish_partial_amaxes(
    const TileLane& L, const float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane],
    QuantizeShared<In, kTile128x128, D>& sh) {
  constexpr bool kRowwise = has_rowwise(D), kColumnwise = has_columnwise(D);
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  if constexpr (kTile128x128) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int k = 0; k < C; ++k) m = amax_of(m, x[i][k]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (L.lane == 0) sh.warp_max[L.warp] = m;
  } else {
    if constexpr (kRowwise) {
      float m[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        m[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < C; ++k) m[i] = amax_of(m[i], x[i][k]);
        m[i] = sdk::cuda::max_over_row_lanes(m[i]);
      }
      float mine = m[0];  // lane cg publishes row 4 rg + cg (the 4 lanes agree on all 4)
#pragma unroll
      for (int i = 1; i < R; ++i) mine = L.cg == i ? m[i] : mine;
      sh.row_part[L.wx][L.lane_row + L.cg] = mine;
    }
    if constexpr (kColumnwise) {
      float colmax[C];
#pragma unroll
      for (int k = 0; k < C; ++k) {
        colmax[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < R; ++i) colmax[k] = amax_of(colmax[k], x[i][k]);
      }
      sh.col_part[L.wy][L.wx * 32 + L.cg * C + L.rg] =
          sdk::cuda::max_over_column_lanes_scatter(colmax);
    }
  }
}

// Step 3: the scales, each computed once from the partial amaxes (thread 0 for a 128x128
// tile; else one thread per tile row and per tile column, both directions at once): the
// scale for the codes into shared memory, scale_inv = 1 / scale (IEEE) stored.
template <bool kInterior, class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void publish_scales(const QuantizeParams<In>& p, std::int64_t tile_row,
                                               std::int64_t tile_col, const TileLane& L,
                                               QuantizeShared<In, kTile128x128, D>& sh) {
  using T = QuantizeTile<In>;
  constexpr bool kRowwise = has_rowwise(D), kColumnwise = has_columnwise(D);
  const std::int64_t row0 = L.row0, col0 = L.col0;
  const int t = static_cast<int>(threadIdx.x);
  if constexpr (kTile128x128) {
    if (t == 0) {
      float amax = 0.0f;
#pragma unroll
      for (int w = 0; w < T::kWarpsY * T::kWarpsX; ++w) amax = fmaxf(amax, sh.warp_max[w]);
      const float scale = block_scale_of(p, amax);
      sh.tile_scale = scale;
      const float scale_inv = 1.0f / scale;
      if (kRowwise)  // [tile_row][tile_col]
        p.rowwise_scale_inv[tile_row * p.rowwise_scale_ld + tile_col] = scale_inv;
      if (kColumnwise)  // transposed grid: [tile_col][tile_row]
        p.columnwise_scale_inv[tile_col * p.columnwise_scale_ld + tile_row] = scale_inv;
    }
  } else {
    if constexpr (kRowwise) {
      if (t < T::kRows) {
        float amax = 0.0f;
#pragma unroll
        for (int w = 0; w < T::kWarpsX; ++w) amax = fmaxf(amax, sh.row_part[w][t]);
        const float scale = block_scale_of(p, amax);
        sh.row_scale[t] = scale;
        if (kInterior || row0 + t < p.rows)  // stored transposed: [column block][row]
          p.rowwise_scale_inv[tile_col * p.rowwise_scale_ld + row0 + t] = 1.0f / scale;
      }
    }
    if constexpr (kColumnwise) {
      // Both directions: threads kRows.. take the columns, so both run at once.
      const int c = kRowwise ? t - T::kRows : t;
      if (c >= 0 && c < T::kCols) {
        float amax = 0.0f;
#pragma unroll
        for (int w = 0; w < T::kWarpsY; ++w) amax = fmaxf(amax, sh.col_part[w][c]);
        const float scale = block_scale_of(p, amax);
        sh.col_scale[c] = scale;
        if (kInterior || col0 + c < p.cols)  // [row block][column]
          p.columnwise_scale_inv[tile_row * p.columnwise_scale_ld + col0 + c] = 1.0f / scale;
      }
    }
  }
}

// Step 4: the rowwise codes, 8 a row and lane (one 8-byte store), with the row's scale.
template <bool kInterior, class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void store_rowwise_codes(
    const QuantizeParams<In>& p, const TileLane& L,
    const float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane], bool has_nan,
    const QuantizeShared<In, kTile128x128, D>& sh) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float scale = kTile128x128 ? sh.tile_scale : sh.row_scale[L.lane_row + i];
    float y[C];
#pragma unroll
    for (int k = 0; k < C; ++k) y[k] = x[i][k] * scale;
    const std::uint32_t lo =
        encode_pair(y[0], y[1], has_nan) | (encode_pair(y[2], y[3], has_nan) << 16);
    const std::uint32_t hi =
        encode_pair(y[4], y[5], has_nan) | (encode_pair(y[6], y[7], has_nan) << 16);
    const std::int64_t offset = L.lane_offset + i * p.cols;
    if constexpr (kInterior) {
      store_bytes8(p.rowwise_data, offset, C, true, lo, hi);
    } else if (L.row0 + L.lane_row + i < p.rows && L.valid_cols > 0) {
      store_bytes8(p.rowwise_data, offset, L.valid_cols,
                   p.rowwise_store_aligned && L.valid_cols == C, lo, hi);
    }
  }
}

// Step 5: the columnwise codes (transposed data [cols, rows]), with each column's scale.
template <bool kInterior, class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void store_columnwise_codes(
    const QuantizeParams<In>& p, const TileLane& L,
    const float (&x)[sdk::cuda::kTileRowsPerLane][sdk::cuda::kTileColsPerLane], bool has_nan,
    const QuantizeShared<In, kTile128x128, D>& sh) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  // Transposed: columnwise[c][r] = code of (r, c); the lane's 4 rows of column c are 4
  // consecutive bytes of output row c.
  const std::int64_t r = L.row0 + L.lane_row;
  const int valid_rows = kInterior ? R : valid_in_run(r, p.rows, R);
  const std::int64_t column_offset = L.col * p.columnwise_ld + r;  // code of (r, col)
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const float scale = kTile128x128 ? sh.tile_scale : sh.col_scale[L.lane_col + k];
    float y[R];
#pragma unroll
    for (int i = 0; i < R; ++i) y[i] = x[i][k] * scale;
    const std::uint32_t word =
        encode_pair(y[0], y[1], has_nan) | (encode_pair(y[2], y[3], has_nan) << 16);
    if constexpr (kInterior) {
      store_bytes4(p.columnwise_data, column_offset + k * p.columnwise_ld, R, true, word);
    } else if (k < L.valid_cols && valid_rows > 0) {
      store_bytes4(p.columnwise_data, column_offset + k * p.columnwise_ld, valid_rows,
                   p.columnwise_store_aligned && valid_rows == R, word);
    }
  }
}

// Quantizes the tile (tile_row, tile_col), both requested directions, in five steps with two
// barriers. kInterior: the tile lies inside the tensor and every buffer is aligned
// (p.all_aligned), so every run is a whole vector.
template <bool kInterior, class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void quantize_tile(const QuantizeParams<In>& p, std::int64_t tile_row,
                                              std::int64_t tile_col,
                                              QuantizeShared<In, kTile128x128, D>& sh) {
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const TileLane L = tile_lane<kInterior>(p, tile_row, tile_col);
  float x[R][C];
  const bool has_nan = load_lane_values<kInterior>(p, L, x);
  publish_partial_amaxes<In, kTile128x128, D>(L, x, sh);
  __syncthreads();
  publish_scales<kInterior, In, kTile128x128, D>(p, tile_row, tile_col, L, sh);
  __syncthreads();
  if constexpr (has_rowwise(D))
    store_rowwise_codes<kInterior, In, kTile128x128, D>(p, L, x, has_nan, sh);
  if constexpr (has_columnwise(D))
    store_columnwise_codes<kInterior, In, kTile128x128, D>(p, L, x, has_nan, sh);
}

// The edge tiles, out of line: their bounds checks and scalar fallbacks keep more values live,
// and as a separate function they get their own register allocation.
template <class In, bool kTile128x128, Directions D>
__device__ __noinline__ void quantize_edge_tile(const QuantizeParams<In> p, std::int64_t tile_row,
                                                std::int64_t tile_col,
                                                QuantizeShared<In, kTile128x128, D>& sh) {
  quantize_tile<false, In, kTile128x128, D>(p, tile_row, tile_col, sh);
}

// The parameters of quantize_tile for one tensor (one group of a grouped call) described by
// `a`, its buffers already checked (blockwise_kernels.cu quantize). Also made on the device, for
// device-split groups (blockwise_grouped_kernels.cu).
template <class In, Directions D>
__host__ __device__ QuantizeParams<In> quantize_params(const QuantizeArgs& a) {
  using T = QuantizeTile<In>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.tile_rows = (a.rows + T::kRows - 1) / T::kRows;
  p.pow2_scales = a.pow2_scales;
  p.amax_epsilon = a.amax_epsilon;
  p.value_for_inf = a.value_for_inf;
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_ld = a.columnwise_ld != 0 ? a.columnwise_ld : a.rows;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  // Row runs start at multiples of 8 within a row: with cols % 8 == 0 every run starts
  // 16-byte (source) and 8-byte (codes) aligned when the buffers do; column runs start at
  // multiples of 4 within a row of columnwise_ld bytes of the transposed data.
  p.load_aligned = a.cols % 8 == 0 && is_aligned(a.src, 16);
  p.rowwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.rowwise_data, 8);
  p.columnwise_store_aligned = p.columnwise_ld % 4 == 0 && is_aligned(a.columnwise_data, 4);
  p.all_aligned = p.load_aligned && (!has_rowwise(D) || p.rowwise_store_aligned) &&
                  (!has_columnwise(D) || p.columnwise_store_aligned);
  return p;
}

}  // namespace qrecipe::blockwise::cuda
