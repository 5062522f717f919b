// CUDA kernels of the blockwise format, bit-exact with blockwise_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, element traits (input dtypes, output dtypes)
//   2. device helpers: 16-byte run loads, packed code stores, block max, atomic max, the
//      scale_inv position of a block
//   3. kernels: fused rowwise + columnwise quantize (1x128 and 128x128), dequantize (row-major
//      data; transposed data through a shared-memory tile), amax reduction
//   4. launchers (grid arithmetic, dtype dispatch) and the entries declared in
//      blockwise_kernels.hpp (validation, device selection)
//
// Exactness: the scale (scale_from_amax with the source dtype's value_for_inf), the product
// x * scale and the decode are the QR_HD functions / operations of blockwise_numerics.hpp that
// the reference runs too; scale_inv = 1.0f / scale is an IEEE division; the plugin is compiled
// with -fmad=false --ftz=false --prec-div=true (QrecipeCompileFlags.cmake). A block amax is an
// exact max (NaN ignored by fmaxf), so neither its reduction order nor the zeros that pad a
// partial tile change it.
//
// Quantize design (one pass, both directions; details above quantize_kernel): a CTA of 16
// warps owns a 128 x 128 tile, each warp a 32 x 32 warp tile in registers (4 rows x 8 columns a
// lane, one 16-byte load a row). Block amaxes: warp shuffles, then the 4 (or 16) warps of a
// tile row / column / tile through shared memory; each scale is computed once and published.
// The sat_rne(x * scale) is the hardware cvt.rn.satfinite of qrecipe/fast_conversions.cuh, equal
// to num::f32_to_e4m3 on every FP32 input (tests/gpu/test_gpu_conversions), with the
// reference's NaN code where a lane holds a NaN. The transposed columnwise data needs no code
// tile: a lane's 4 rows of one column are 4 consecutive bytes of one output row. Each request
// (rowwise, columnwise, both) has its own kernel instance, and tiles inside the tensor run a
// path without bounds checks (about 35 % fewer instructions than the previous single kernel,
// e.g. 36M instead of 64M warp instructions for 1x128 both directions of a bf16 8192 x 8192
// tensor). Bytes moved per element, both directions: the source once (4 B f32 / 2 B bf16),
// 1 B rowwise + 1 B columnwise data, and 8/128 B (1x128) or 8/16384 B (128x128) of scale_inv.
#include "blockwise_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "blockwise_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::blockwise::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

constexpr const char* kFormat = "blockwise";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers (qrecipe/cuda_sdk.cuh).
using sdk::cuda::DeviceGuard;
using sdk::cuda::BF16In;
using sdk::cuda::BF16Out;
using sdk::cuda::F16In;
using sdk::cuda::F32In;
using sdk::cuda::F32Out;
using sdk::cuda::RunOf;
using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::block_max;
using sdk::cuda::grid_for;
using sdk::cuda::is_aligned;
using sdk::cuda::kRunLength;
using sdk::cuda::Raw8;
using sdk::cuda::decode_raw8;
using sdk::cuda::load_raw8;
using sdk::cuda::store_bytes4;
using sdk::cuda::store_bytes8;
using sdk::cuda::valid_in_run;

struct F16Out {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ Storage from_f32(float v) { return num::f32_to_f16(v); }
};

// ---------------------------------------------------------------- 2. device helpers

constexpr int kBlock = 128;  // edge of a block / tile (ref::kBlock)

// The reference's DirectionGeometry::scale_offset: where the scale_inv of logical element
// (r, c) lives.
struct ScaleGeometry {
  std::int64_t block_rows, block_cols, ld;
  bool transposed;
  __device__ __forceinline__ std::int64_t offset(std::int64_t r, std::int64_t c) const {
    const std::int64_t a = r / block_rows, b = c / block_cols;
    return transposed ? b * ld + a : a * ld + b;
  }
};

// Which directions one kernel instance writes: each request runs its own instance, compiled
// without the other direction's code, registers and shared memory.
enum class Directions { kRowwise, kColumnwise, kBoth };

__host__ __device__ constexpr bool has_rowwise(Directions d) {
  return d != Directions::kColumnwise;
}
__host__ __device__ constexpr bool has_columnwise(Directions d) {
  return d != Directions::kRowwise;
}

// ---------------------------------------------------------------- 3. kernels

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
  float* columnwise_scale_inv;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % 8 == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 8 == 0 and rowwise data 8-byte aligned
  bool columnwise_store_aligned;  // rows % 4 == 0 and columnwise data 4-byte aligned
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

// Quantizes the tile (tile_row, tile_col). kInterior: the tile lies inside the tensor and
// every buffer is aligned (p.all_aligned), so every run is a whole vector.
template <bool kInterior, class In, bool kTile128x128, Directions D>
__device__ __forceinline__ void quantize_tile(const QuantizeParams<In>& p, std::int64_t tile_row,
                                              std::int64_t tile_col,
                                              QuantizeShared<In, kTile128x128, D>& sh) {
  using T = QuantizeTile<In>;
  constexpr bool kRowwise = has_rowwise(D), kColumnwise = has_columnwise(D);
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int rg = lane / 4, cg = lane % 4;
  const int wy = warp / T::kWarpsX, wx = warp % T::kWarpsX;
  const std::int64_t row0 = tile_row * T::kRows, col0 = tile_col * T::kCols;
  const int lane_row = wy * 32 + rg * R;  // within the tile
  const int lane_col = wx * 32 + cg * C;
  const std::int64_t col = col0 + lane_col;
  const std::int64_t lane_offset = (row0 + lane_row) * p.cols + col;  // element of run 0
  const int valid_cols = kInterior ? C : valid_in_run(col, p.cols, C);

  Raw8<In> raw[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = lane_offset + i * p.cols;
    if constexpr (kInterior) {
      load_raw8<In>(p.src, offset, C, true, raw[i]);
    } else {
      const int valid = row0 + lane_row + i < p.rows ? valid_cols : 0;
      load_raw8<In>(p.src, offset, valid, p.load_aligned && valid == C, raw[i]);
    }
  }
  float x[R][C];
  bool has_nan = false;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    decode_raw8<In>(raw[i], x[i]);
#pragma unroll
    for (int k = 0; k < C; ++k) has_nan |= x[i][k] != x[i][k];
  }

  // Partial amaxes into shared memory (rows and columns outside the tensor hold +0).
  if constexpr (kTile128x128) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int k = 0; k < C; ++k) m = amax_of(m, x[i][k]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (lane == 0) sh.warp_max[warp] = m;
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
      for (int i = 1; i < R; ++i) mine = cg == i ? m[i] : mine;
      sh.row_part[wx][lane_row + cg] = mine;
    }
    if constexpr (kColumnwise) {
      float colmax[C];
#pragma unroll
      for (int k = 0; k < C; ++k) {
        colmax[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < R; ++i) colmax[k] = amax_of(colmax[k], x[i][k]);
      }
      sh.col_part[wy][wx * 32 + cg * C + rg] = sdk::cuda::max_over_column_lanes_scatter(colmax);
    }
  }
  __syncthreads();

  // Scales, each computed once: scale for the codes, scale_inv = 1 / scale (IEEE) stored.
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
  __syncthreads();

  if constexpr (kRowwise) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float scale = kTile128x128 ? sh.tile_scale : sh.row_scale[lane_row + i];
      float y[C];
#pragma unroll
      for (int k = 0; k < C; ++k) y[k] = x[i][k] * scale;
      const std::uint32_t lo =
          encode_pair(y[0], y[1], has_nan) | (encode_pair(y[2], y[3], has_nan) << 16);
      const std::uint32_t hi =
          encode_pair(y[4], y[5], has_nan) | (encode_pair(y[6], y[7], has_nan) << 16);
      const std::int64_t offset = lane_offset + i * p.cols;
      if constexpr (kInterior) {
        store_bytes8(p.rowwise_data, offset, C, true, lo, hi);
      } else if (row0 + lane_row + i < p.rows && valid_cols > 0) {
        store_bytes8(p.rowwise_data, offset, valid_cols,
                     p.rowwise_store_aligned && valid_cols == C, lo, hi);
      }
    }
  }
  if constexpr (kColumnwise) {
    // Transposed: columnwise[c][r] = code of (r, c); the lane's 4 rows of column c are 4
    // consecutive bytes of output row c.
    const std::int64_t r = row0 + lane_row;
    const int valid_rows = kInterior ? R : valid_in_run(r, p.rows, R);
    const std::int64_t column_offset = col * p.rows + r;  // code of (r, col)
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const float scale = kTile128x128 ? sh.tile_scale : sh.col_scale[lane_col + k];
      float y[R];
#pragma unroll
      for (int i = 0; i < R; ++i) y[i] = x[i][k] * scale;
      const std::uint32_t word =
          encode_pair(y[0], y[1], has_nan) | (encode_pair(y[2], y[3], has_nan) << 16);
      if constexpr (kInterior) {
        store_bytes4(p.columnwise_data, column_offset + k * p.rows, R, true, word);
      } else if (k < valid_cols && valid_rows > 0) {
        store_bytes4(p.columnwise_data, column_offset + k * p.rows, valid_rows,
                     p.columnwise_store_aligned && valid_rows == R, word);
      }
    }
  }
}

// The edge tiles, out of line: their bounds checks and scalar fallbacks keep more values live,
// and as a separate function they get their own register allocation.
template <class In, bool kTile128x128, Directions D>
__device__ __noinline__ void quantize_edge_tile(const QuantizeParams<In> p, std::int64_t tile_row,
                                                std::int64_t tile_col,
                                                QuantizeShared<In, kTile128x128, D>& sh) {
  quantize_tile<false, In, kTile128x128, D>(p, tile_row, tile_col, sh);
}

template <class In, bool kTile128x128, Directions D>
__global__ void __launch_bounds__(QuantizeTile<In>::kThreads, QuantizeTile<In>::kMinBlocksPerSM)
    quantize_kernel(const QuantizeParams<In> p) {
  using T = QuantizeTile<In>;
  __shared__ QuantizeShared<In, kTile128x128, D> sh;
  const std::int64_t tile_col = blockIdx.x;
  const bool cols_inside = (tile_col + 1) * T::kCols <= p.cols;
  // gridDim.y is capped at 65535: taller tensors take several tile rows per CTA.
  for (std::int64_t tile_row = blockIdx.y; tile_row < p.tile_rows; tile_row += gridDim.y) {
    if (p.all_aligned && cols_inside && (tile_row + 1) * T::kRows <= p.rows)
      quantize_tile<true, In, kTile128x128, D>(p, tile_row, tile_col, sh);
    else
      quantize_edge_tile<In, kTile128x128, D>(p, tile_row, tile_col, sh);
    if (tile_row + gridDim.y < p.tile_rows) __syncthreads();  // `sh` is reused
  }
}

// Dequantize of row-major data ([rows, cols]): a thread decodes runs of kDequantizeRun codes
// of one row (one 16-byte load where aligned), grid-stride.
constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeRun = 16;
constexpr std::int64_t kDequantizeMaxBlocks = 8192;  // 2M threads; the grid-stride loop does the rest

struct DequantizeParams {
  const std::uint8_t* data;
  const float* scale_inv;
  ScaleGeometry scale;
  std::int64_t rows, cols;
  std::int64_t runs_per_row;  // ceil(cols / kDequantizeRun)
  bool aligned;               // cols % 16 == 0, data and dst 16-byte aligned
};

template <class Out>
__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_kernel(const DequantizeParams p, typename Out::Storage* dst) {
  using Storage = typename Out::Storage;
  constexpr int N = kDequantizeRun;
  const std::int64_t runs = p.rows * p.runs_per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t run = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       run < runs; run += stride) {
    const std::int64_t r = run / p.runs_per_row;
    const std::int64_t c0 = (run % p.runs_per_row) * N;
    const int valid = valid_in_run(c0, p.cols, N);
    const std::int64_t offset = r * p.cols + c0;
    const bool whole = p.aligned && valid == N;
    std::uint8_t q[N];
    if (whole) {
      const RunOf<std::uint8_t, N> in =
          *reinterpret_cast<const RunOf<std::uint8_t, N>*>(p.data + offset);
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = in.v[k];
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = k < valid ? p.data[offset + k] : 0;
    }
    RunOf<Storage, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float s = k < valid ? p.scale_inv[p.scale.offset(r, c0 + k)] : 1.0f;
      out.v[k] = Out::from_f32(num_bw::decode(q[k], s));
    }
    if (whole) {
      *reinterpret_cast<RunOf<Storage, N>*>(dst + offset) = out;
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (k < valid) dst[offset + k] = out.v[k];
    }
  }
}

// Dequantize of transposed data ([cols, rows] holds logical (r, c) at [c][r]): one CTA per
// kTransposeTile^2 tile; byte loads along the stored rows into shared memory, then stores
// along the logical rows, so both global sides are coalesced.
constexpr int kTransposeTile = 64;
constexpr int kTransposeThreads = 256;
constexpr int kTransposePasses = kTransposeTile * kTransposeTile / kTransposeThreads;  // 16
// 68 bytes = 17 words: the 32 lanes reading codes[kk .. kk + 31][mm] hit 32 distinct banks.
constexpr int kTransposePitch = kTransposeTile + 4;
static_assert(kTransposeTile * kTransposeTile % kTransposeThreads == 0, "whole passes");
static_assert(kTransposeThreads % kTransposeTile == 0, "a pass covers whole tile rows");

struct TransposedDequantizeParams {
  const std::uint8_t* data;  // [cols, rows]
  const float* scale_inv;
  ScaleGeometry scale;
  std::int64_t rows, cols;  // the logical tensor
  std::int64_t tiles_per_row;  // ceil(cols / kTransposeTile): tiles along the logical row
};

template <class Out>
__global__ void __launch_bounds__(kTransposeThreads)
    dequantize_transposed_kernel(const TransposedDequantizeParams p,
                                 typename Out::Storage* dst) {
  __shared__ std::uint8_t codes[kTransposeTile][kTransposePitch];  // [c - c0][r - r0]
  const std::int64_t r0 = (blockIdx.x / p.tiles_per_row) * kTransposeTile;
  const std::int64_t c0 = (blockIdx.x % p.tiles_per_row) * kTransposeTile;
#pragma unroll 4
  for (int pass = 0; pass < kTransposePasses; ++pass) {
    const int i = static_cast<int>(threadIdx.x) + pass * kTransposeThreads;
    const int cc = i / kTransposeTile, rr = i % kTransposeTile;  // lanes run along stored rows
    const std::int64_t r = r0 + rr, c = c0 + cc;
    codes[cc][rr] = r < p.rows && c < p.cols ? p.data[c * p.rows + r] : 0;
  }
  __syncthreads();
#pragma unroll 4
  for (int pass = 0; pass < kTransposePasses; ++pass) {
    const int i = static_cast<int>(threadIdx.x) + pass * kTransposeThreads;
    const int rr = i / kTransposeTile, cc = i % kTransposeTile;  // lanes run along dst rows
    const std::int64_t r = r0 + rr, c = c0 + cc;
    if (r < p.rows && c < p.cols)
      dst[r * p.cols + c] =
          Out::from_f32(num_bw::decode(codes[cc][rr], p.scale_inv[p.scale.offset(r, c)]));
  }
}

// ---------------------------------------------------------------- 4. launchers, entries

using sdk::ceil_div;  // qrecipe/plugin_sdk.hpp

void check_source_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "blockwise CUDA ", entry, ": source dtype code ",
                static_cast<int>(dtype), " is not f32, bf16 or f16; convert the tensor first");
}

template <class In, bool kTile128x128, Directions D>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.tile_rows = ceil_div(a.rows, T::kRows);
  p.pow2_scales = a.pow2_scales;
  p.amax_epsilon = a.amax_epsilon;
  p.value_for_inf = a.value_for_inf;
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  // Row runs start at multiples of 8 within a row: with cols % 8 == 0 every run starts
  // 16-byte (source) and 8-byte (codes) aligned when the buffers do; column runs start at
  // multiples of 4 within a row of `rows` bytes of the transposed data.
  p.load_aligned = a.cols % 8 == 0 && is_aligned(a.src, 16);
  p.rowwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.rowwise_data, 8);
  p.columnwise_store_aligned = a.rows % 4 == 0 && is_aligned(a.columnwise_data, 4);
  p.all_aligned = p.load_aligned && (!has_rowwise(D) || p.rowwise_store_aligned) &&
                  (!has_columnwise(D) || p.columnwise_store_aligned);
  const std::int64_t tile_cols = ceil_div(a.cols, T::kCols);
  QR_CHECK(tile_cols <= INT_MAX, "blockwise CUDA quantize: ", a.cols, " columns need ",
           tile_cols, " tiles of ", T::kCols, " columns; at most ", INT_MAX,
           " fit in one grid row");
  constexpr std::int64_t kMaxGridY = 65535;  // CUDA's limit; the kernel loops past it
  const dim3 grid(static_cast<unsigned>(tile_cols),
                  static_cast<unsigned>(p.tile_rows < kMaxGridY ? p.tile_rows : kMaxGridY));
  quantize_kernel<In, kTile128x128, D><<<grid, T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("blockwise quantize_kernel");
}

template <class In, bool kTile128x128>
void dispatch_directions(const QuantizeArgs& a) {
  if (a.columnwise_data == nullptr) launch_quantize<In, kTile128x128, Directions::kRowwise>(a);
  else if (a.rowwise_data == nullptr)
    launch_quantize<In, kTile128x128, Directions::kColumnwise>(a);
  else launch_quantize<In, kTile128x128, Directions::kBoth>(a);
}

template <class In>
void dispatch_quantize(const QuantizeArgs& a) {
  if (a.tile_128x128) dispatch_directions<In, true>(a);
  else dispatch_directions<In, false>(a);
}

template <class Out>
void launch_dequantize(const DequantizeArgs& a, cudaStream_t stream) {
  using Storage = typename Out::Storage;
  const ScaleGeometry geometry{a.block_rows, a.block_cols, a.scale_ld, a.scale_transposed};
  auto* dst = static_cast<Storage*>(a.dst);
  if (!a.data_transposed) {
    DequantizeParams p{};
    p.data = a.data;
    p.scale_inv = a.scale_inv;
    p.scale = geometry;
    p.rows = a.rows;
    p.cols = a.cols;
    p.runs_per_row = ceil_div(a.cols, kDequantizeRun);
    p.aligned = a.cols % kDequantizeRun == 0 && is_aligned(a.data, 16) && is_aligned(a.dst, 16);
    const unsigned blocks =
        grid_for(a.rows * p.runs_per_row, kDequantizeThreads, kDequantizeMaxBlocks);
    dequantize_kernel<Out><<<blocks, kDequantizeThreads, 0, stream>>>(p, dst);
    QR_CUDA_CHECK_LAUNCH("blockwise dequantize_kernel");
    return;
  }
  TransposedDequantizeParams p{};
  p.data = a.data;
  p.scale_inv = a.scale_inv;
  p.scale = geometry;
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_per_row = ceil_div(a.cols, kTransposeTile);
  const std::int64_t tiles = ceil_div(a.rows, kTransposeTile) * p.tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "blockwise CUDA dequantize: ", a.rows, " x ", a.cols, " needs ",
           tiles, " tiles of ", kTransposeTile, "x", kTransposeTile, "; at most ", INT_MAX,
           " fit in one grid");
  dequantize_transposed_kernel<Out>
      <<<static_cast<unsigned>(tiles), kTransposeThreads, 0, stream>>>(p, dst);
  QR_CUDA_CHECK_LAUNCH("blockwise dequantize_transposed_kernel");
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  check_source_dtype(a.src_dtype, "quantize");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "blockwise CUDA quantize: negative shape ", a.rows,
           " x ", a.cols);
  QR_CHECK(a.rowwise_data != nullptr || a.columnwise_data != nullptr,
           "blockwise CUDA quantize: neither direction was requested");
  if (a.rows == 0 || a.cols == 0) return;
  QR_CHECK(a.src != nullptr, "blockwise CUDA quantize: the source has a null data pointer");
  QR_CHECK((a.rowwise_data == nullptr || a.rowwise_scale_inv != nullptr) &&
               (a.columnwise_data == nullptr || a.columnwise_scale_inv != nullptr),
           "blockwise CUDA quantize: a requested direction has no scale_inv buffer");
  DeviceGuard guard(a.device_index, kFormat);
  switch (a.src_dtype) {
    case QR_DTYPE_F32: dispatch_quantize<F32In>(a); break;
    case QR_DTYPE_BF16: dispatch_quantize<BF16In>(a); break;
    default: dispatch_quantize<F16In>(a); break;
  }
}

void dequantize(const DequantizeArgs& a) {
  QR_CHECK_CODE(a.dst_dtype == QR_DTYPE_F32 || a.dst_dtype == QR_DTYPE_BF16 ||
                    a.dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "blockwise CUDA dequantize: output dtype code ",
                static_cast<int>(a.dst_dtype), " is not f32, bf16 or f16");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "blockwise CUDA dequantize: negative shape ", a.rows,
           " x ", a.cols);
  QR_CHECK(a.block_rows > 0 && a.block_cols > 0, "blockwise CUDA dequantize: block ",
           a.block_rows, "x", a.block_cols, " is empty");
  if (a.rows == 0 || a.cols == 0) return;
  QR_CHECK(a.data != nullptr && a.scale_inv != nullptr && a.dst != nullptr,
           "blockwise CUDA dequantize: a data, scale_inv or destination pointer is null");
  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t s = as_stream(a.stream);
  switch (a.dst_dtype) {
    case QR_DTYPE_F32: launch_dequantize<F32Out>(a, s); break;
    case QR_DTYPE_BF16: launch_dequantize<BF16Out>(a, s); break;
    default: launch_dequantize<F16Out>(a, s); break;
  }
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  check_source_dtype(src_dtype, "compute_amax");
  return sdk::cuda::amax_to_host(src, src_dtype, numel, device_index, stream, kFormat);
}

}  // namespace qrecipe::blockwise::cuda
