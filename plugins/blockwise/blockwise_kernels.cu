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
// Exactness: the scale (scale_from_amax with the source dtype's value_for_inf), the encode
// sat_rne(x * scale) and the decode are the QR_HD functions of blockwise_numerics.hpp that the
// reference calls too; scale_inv = 1.0f / scale is an IEEE division; the plugin is compiled
// with -fmad=false --ftz=false --prec-div=true (QrecipeCompileFlags.cmake). A block amax is an
// exact max (NaN ignored by fmaxf), so neither its reduction order nor the zeros that pad a
// partial tile change it.
//
// Quantize design (one pass, both directions): a CTA owns a 128 x 128 tile of the source
// (one 1x128 block per tile row, one 128x1 block per tile column, or the one 128x128 tile) and
// holds it in registers, 64 elements per thread read with 16-byte loads.
//   1x128 rowwise     amax across the lanes of one row (a shuffle), encode, store row-major
//   1x128 columnwise  per-column amaxes through shared memory, encode into a shared code tile
//   128x128           one block-wide amax; the codes are computed once, stored row-major and
//                     into the code tile (the columnwise copy is their transpose)
// The code tile then goes out transposed: each warp writes 128 consecutive bytes of one row of
// the [cols, rows] columnwise data. Bytes moved per element, both directions: the source once
// (4 B f32 / 2 B bf16), 1 B rowwise + 1 B columnwise data, and 8/128 B (1x128) or
// 8/16384 B (128x128) of scale_inv.
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
using sdk::cuda::load_run;
using sdk::cuda::store_codes;
using sdk::cuda::store_floats_shared;
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

// ---------------------------------------------------------------- 3. kernels

// Fused quantize of both directions. One CTA per kRows x kCols tile of the [rows, cols]
// source; thread t owns the run of kRun columns starting at run_col = (t % kThreadsPerRow) *
// kRun in tile rows pass_row + pass * kRowsPerPass (pass_row = t / kThreadsPerRow).
template <class In>
struct QuantizeTile {
  static constexpr int kRun = kRunLength<In>;                     // f32: 4, bf16/f16: 8
  static constexpr int kRows = kBlock;                            // 128: one 128x1 block per column
  static constexpr int kCols = kBlock;                            // 128: one 1x128 block per row
  static constexpr int kThreads = 256;
  static constexpr int kThreadsPerRow = kCols / kRun;             // 32 or 16
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;  // 8 or 16
  static constexpr int kPasses = kRows / kRowsPerPass;            // 16 or 8 (x kRun = 64 each)
  // The columnwise code tile goes out in runs of kOutRun rows down one tile column: a warp
  // covers the 128 rows of a column (one 128-byte row of the transposed output).
  static constexpr int kOutRun = 4;
  static constexpr int kThreadsPerCol = kRows / kOutRun;          // 32
  static constexpr int kColsPerPass = kThreads / kThreadsPerCol;  // 8
  static constexpr int kColPasses = kCols / kColsPerPass;         // 16
  // An odd pitch puts the 4 rows x 32 lanes a warp reads down a column in 32 distinct banks
  // (lane l starts at byte 4 * l * 129, word 129 * l, bank l).
  static constexpr int kPitch = kCols + 1;
  static_assert(kRows % kRowsPerPass == 0, "passes cover the tile exactly");
  static_assert(32 % kThreadsPerRow == 0,
                "a tile row lies within one warp, so a 1x128 block's lanes can shuffle");
  static_assert(kThreadsPerCol == 32 && kCols % kColsPerPass == 0,
                "one warp per output row run; passes cover the tile's columns");
  static_assert(kThreads >= kCols, "the columnwise reduction uses one thread per column");
  static_assert(kRun % 4 == 0 && kOutRun % 4 == 0, "code runs are whole 32-bit words");
};

template <class In>
struct QuantizeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / kCols)
  bool pow2_scales;
  float amax_epsilon, value_for_inf;
  std::uint8_t* rowwise_data;  // nullptr: rowwise not requested
  float* rowwise_scale_inv;
  std::int64_t rowwise_scale_ld;
  std::uint8_t* columnwise_data;  // nullptr: columnwise not requested
  float* columnwise_scale_inv;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % kRun == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 4 == 0 and rowwise data 4-byte aligned
  bool columnwise_store_aligned;  // rows % 4 == 0 and columnwise data 4-byte aligned
};

template <class In>
__device__ __forceinline__ float block_scale_of(const QuantizeParams<In>& p, float amax) {
  return num_bw::block_scale(amax, p.pow2_scales, p.amax_epsilon, p.value_for_inf);
}

template <class In, bool kTile128x128>
__global__ void __launch_bounds__(QuantizeTile<In>::kThreads)
    quantize_kernel(const QuantizeParams<In> p) {
  using T = QuantizeTile<In>;
  constexpr int N = T::kRun;
  // 1x128 columnwise: each thread's max per column over its rows, then the column scales.
  __shared__ alignas(16) float col_partial[T::kRowsPerPass][T::kCols];
  __shared__ float col_scale[T::kCols];
  // Columnwise codes of the tile, row-major, read down the columns for the transposed store.
  __shared__ std::uint8_t col_codes[T::kRows][T::kPitch];

  const std::int64_t tile_row = blockIdx.x / p.tiles_per_row;
  const std::int64_t tile_col = blockIdx.x % p.tiles_per_row;
  const std::int64_t row0 = tile_row * T::kRows, col0 = tile_col * T::kCols;
  const int run_col = static_cast<int>(threadIdx.x % T::kThreadsPerRow) * N;
  const int pass_row = static_cast<int>(threadIdx.x / T::kThreadsPerRow);
  const int valid_cols = valid_in_run(col0 + run_col, p.cols, N);

  // Phase 1: the tile into registers; rows and columns outside the tensor read as 0.
  float x[T::kPasses][N];
#pragma unroll
  for (int pass = 0; pass < T::kPasses; ++pass) {
    const std::int64_t r = row0 + pass_row + pass * T::kRowsPerPass;
    const int valid = r < p.rows ? valid_cols : 0;
    load_run<In, N>(p.src, r * p.cols + col0 + run_col, valid, p.load_aligned && valid == N,
                    x[pass]);
  }

  if constexpr (kTile128x128) {
    // Phase 2: one amax, one scale for the whole tile; the codes serve both directions.
    float amax = 0.0f;
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass)
#pragma unroll
      for (int k = 0; k < N; ++k) amax = amax_of(amax, x[pass][k]);
    amax = block_max<T::kThreads>(amax);
    const float scale = block_scale_of(p, amax);
    if (threadIdx.x == 0) {
      const float scale_inv = 1.0f / scale;
      if (p.rowwise_data != nullptr)  // [tile_row][tile_col]
        p.rowwise_scale_inv[tile_row * p.rowwise_scale_ld + tile_col] = scale_inv;
      if (p.columnwise_data != nullptr)  // transposed grid: [tile_col][tile_row]
        p.columnwise_scale_inv[tile_col * p.columnwise_scale_ld + tile_row] = scale_inv;
    }
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass) {
      const int tr = pass_row + pass * T::kRowsPerPass;
      std::uint8_t codes[N];
#pragma unroll
      for (int k = 0; k < N; ++k) codes[k] = num_bw::encode(x[pass][k], scale);
      if (p.rowwise_data != nullptr && row0 + tr < p.rows && valid_cols > 0)
        store_codes<N>(p.rowwise_data, (row0 + tr) * p.cols + col0 + run_col, valid_cols,
                       p.rowwise_store_aligned && valid_cols == N, codes);
      if (p.columnwise_data != nullptr)
#pragma unroll
        for (int k = 0; k < N; ++k) col_codes[tr][run_col + k] = codes[k];
    }
  } else {
    // Phase 2, 1x128 rowwise: the row's amax over its kThreadsPerRow lanes, scale, encode.
    if (p.rowwise_data != nullptr) {
#pragma unroll
      for (int pass = 0; pass < T::kPasses; ++pass) {
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < N; ++k) amax = amax_of(amax, x[pass][k]);
#pragma unroll
        for (int offset = T::kThreadsPerRow / 2; offset > 0; offset >>= 1)
          amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
        const float scale = block_scale_of(p, amax);
        const std::int64_t r = row0 + pass_row + pass * T::kRowsPerPass;
        if (r >= p.rows) continue;
        if (run_col == 0)  // stored transposed: [column block][row]
          p.rowwise_scale_inv[tile_col * p.rowwise_scale_ld + r] = 1.0f / scale;
        if (valid_cols == 0) continue;
        std::uint8_t codes[N];
#pragma unroll
        for (int k = 0; k < N; ++k) codes[k] = num_bw::encode(x[pass][k], scale);
        store_codes<N>(p.rowwise_data, r * p.cols + col0 + run_col, valid_cols,
                       p.rowwise_store_aligned && valid_cols == N, codes);
      }
    }
    // Phase 3, 1x128 columnwise (128x1 blocks): column amaxes through shared memory, encode
    // into the code tile with each column's own scale.
    if (p.columnwise_data != nullptr) {
      float partial[N];
#pragma unroll
      for (int k = 0; k < N; ++k) partial[k] = 0.0f;
#pragma unroll
      for (int pass = 0; pass < T::kPasses; ++pass)
#pragma unroll
        for (int k = 0; k < N; ++k) partial[k] = amax_of(partial[k], x[pass][k]);
      store_floats_shared<N>(&col_partial[pass_row][run_col], partial);
      __syncthreads();
      if (threadIdx.x < T::kCols) {
        const int c = static_cast<int>(threadIdx.x);
        float amax = 0.0f;
#pragma unroll
        for (int g = 0; g < T::kRowsPerPass; ++g) amax = fmaxf(amax, col_partial[g][c]);
        const float scale = block_scale_of(p, amax);
        col_scale[c] = scale;
        if (col0 + c < p.cols)  // [row block][column]
          p.columnwise_scale_inv[tile_row * p.columnwise_scale_ld + col0 + c] = 1.0f / scale;
      }
      __syncthreads();
#pragma unroll
      for (int pass = 0; pass < T::kPasses; ++pass) {
        const int tr = pass_row + pass * T::kRowsPerPass;
#pragma unroll
        for (int k = 0; k < N; ++k)
          col_codes[tr][run_col + k] = num_bw::encode(x[pass][k], col_scale[run_col + k]);
      }
    }
  }

  // Last phase, columnwise: the code tile out transposed, columnwise[c][r] = codes[r][c]; a
  // thread writes kOutRun consecutive rows of one tile column.
  if (p.columnwise_data != nullptr) {
    __syncthreads();
    constexpr int R = T::kOutRun;
    const int run_row = static_cast<int>(threadIdx.x % T::kThreadsPerCol) * R;
    const int valid_rows = valid_in_run(row0 + run_row, p.rows, R);
    if (valid_rows == 0) return;  // no barrier follows
#pragma unroll
    for (int pass = 0; pass < T::kColPasses; ++pass) {
      const int c = static_cast<int>(threadIdx.x / T::kThreadsPerCol) + pass * T::kColsPerPass;
      if (col0 + c >= p.cols) break;  // later passes only go further right
      std::uint8_t codes[R];
#pragma unroll
      for (int k = 0; k < R; ++k) codes[k] = col_codes[run_row + k][c];
      store_codes<R>(p.columnwise_data, (col0 + c) * p.rows + row0 + run_row, valid_rows,
                     p.columnwise_store_aligned && valid_rows == R, codes);
    }
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

template <class In, bool kTile128x128>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_per_row = ceil_div(a.cols, T::kCols);
  p.pow2_scales = a.pow2_scales;
  p.amax_epsilon = a.amax_epsilon;
  p.value_for_inf = a.value_for_inf;
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  p.load_aligned = a.cols % T::kRun == 0 && is_aligned(a.src, 16);
  // Row runs start at multiples of kRun (a multiple of 4) within a row of `cols` bytes, and
  // column runs at multiples of kOutRun within a row of `rows` bytes of the transposed data.
  p.rowwise_store_aligned = a.cols % 4 == 0 && is_aligned(a.rowwise_data, 4);
  p.columnwise_store_aligned = a.rows % 4 == 0 && is_aligned(a.columnwise_data, 4);
  const std::int64_t tiles = ceil_div(a.rows, T::kRows) * p.tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "blockwise CUDA quantize: ", a.rows, " x ", a.cols, " needs ",
           tiles, " tiles of ", T::kRows, "x", T::kCols, "; at most ", INT_MAX,
           " fit in one grid");
  quantize_kernel<In, kTile128x128>
      <<<static_cast<unsigned>(tiles), T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("blockwise quantize_kernel");
}

template <class In>
void dispatch_quantize(const QuantizeArgs& a) {
  if (a.tile_128x128) launch_quantize<In, true>(a);
  else launch_quantize<In, false>(a);
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
