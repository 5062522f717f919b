// CUDA kernels of the mxfp8 format, bit-exact with mxfp8_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, element traits (input dtypes, FP8 codes, output dtypes)
//   2. device helpers: 8-element runs and warp tiles (qrecipe/cuda_sdk.cuh), the run encoder
//   3. kernels: fused rowwise + columnwise quantize, dequantize, amax reduction
//   4. launchers (grid arithmetic, dtype dispatch) and the entries declared in
//      mxfp8_kernels.hpp (validation, device selection)
//
// Exactness: the block exponent, the element scaling and the decode are the QR_HD functions of
// mxfp8_numerics.hpp that the reference calls too (one FP32 multiply by fl32(1/fmax), E8M0
// round-up, x * 2^(127-e), q * 2^(e-127)), and the plugin is compiled with -fmad=false
// --ftz=false --prec-div=true (QrecipeCompileFlags.cmake), so the device performs the same IEEE
// operations. The sat_rne of the scaled element is the hardware cvt.rn.satfinite of
// qrecipe/fast_conversions.cuh, equal to num::f32_to_e4m3 / f32_to_e5m2 on every FP32 input
// (tests/gpu/test_gpu_conversions, all 2^32 inputs), with the reference's NaN code applied to
// the runs that hold a NaN. A block amax is an exact max (NaN ignored by fmaxf), so neither its
// reduction order nor the zeros that pad a partial tile change it.
//
// Quantize design (one pass, both directions; details above quantize_kernel): 32 x 32 warp
// tiles, 4 rows x 8 columns a lane read with one 16-byte load a row; both block amaxes are warp
// shuffles (1x32: the 4 lanes of a row; 32x1: a reduce-scatter over the 8 lanes of a column),
// so the only shared memory is the CTA's rowwise scale bytes, stored 8 to a word. Each request
// (rowwise, columnwise, both) has its own kernel instance, and CTA tiles inside the tensor run
// a path without bounds checks (most of the gain over the previous single kernel: 30 % fewer
// instructions, e.g. 46M instead of 64M warp instructions for both directions of a bf16
// 8192 x 8192 tensor). Bytes moved per element, both directions: the source once (4 B f32 /
// 2 B bf16), 1 B rowwise + 1 B columnwise data, and 2/32 B of scales.
#include "mxfp8_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "mxfp8_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::mxfp8::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

constexpr const char* kFormat = "mxfp8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

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
using sdk::cuda::store_bytes8;
using sdk::cuda::valid_in_run;

// FP8 element types: which encoder and which fl32(1/fmax).
struct E4M3Codes {
  static constexpr bool kE4M3 = true;
  static constexpr float kRcp = num_mx::kRcpE4M3;
};
struct E5M2Codes {
  static constexpr bool kE4M3 = false;
  static constexpr float kRcp = num_mx::kRcpE5M2;
};

// ---------------------------------------------------------------- 2. device helpers

constexpr int kBlock = 32;  // elements per MX block (ref::kBlockSize)

// Which directions one kernel instance writes. Each request (rowwise, columnwise, both) runs
// its own instance, compiled without the other direction's code and registers, so each gets
// its own occupancy (QuantizeTile).
enum class Directions { kRowwise, kColumnwise, kBoth };

__host__ __device__ constexpr bool has_rowwise(Directions d) {
  return d != Directions::kColumnwise;
}
__host__ __device__ constexpr bool has_columnwise(Directions d) {
  return d != Directions::kRowwise;
}

// ---------------------------------------------------------------- 3. kernels

// Fused quantize. A warp quantizes a 32 x 32 warp tile (layout: the warp tile section of
// cuda_sdk.cuh: lane 4 rg + cg holds rows 4 rg .., columns 8 cg ..), so a 1x32 rowwise block
// is one row of 4 lanes and a 32x1 columnwise block one column of 8 lanes: both amaxes are
// warp shuffles. A CTA is kWarps warps side by side (a 32 x 256 CTA tile); the grid is
// (column tiles, row tiles). The rowwise scales of the CTA tile are collected in shared memory
// and stored at the end, one 8-byte word (the kWarps scales of a row) per row.
// CTA tiles that lie inside the tensor with every buffer aligned (all but the edges of the
// tensors the GEMMs use) run a path without bounds checks or scalar fallbacks: fewer
// instructions between a warp's loads and its stores.
template <class In, Directions D>
struct QuantizeTile {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 32;
  static constexpr int kCols = 32 * kWarps;  // 256
  // CTAs an SM (registers: 65536 / (kThreads * kMinBlocksPerSM) a thread). One direction:
  // 4 (64 registers, 32 warps an SM). Both: 3 (80 registers); at 4 the bf16 instance spills
  // and ran 0.66 of the copy ceiling instead of 0.85 (H100, 8192 x 8192), and 5 for rowwise
  // (48 registers) measured 0.941 / 0.970 against 0.954 / 0.984 at 4. f32 runs hold twice the
  // source registers: 3.
  static constexpr int kMinBlocksPerSM = sizeof(typename In::Storage) == 4 ? 3
                                         : D == Directions::kBoth          ? 3
                                                                           : 4;
  static_assert(kBlock == 32, "a warp tile is one block high and one block wide");
  static_assert(kWarps == 8, "a CTA row of rowwise scales is one 8-byte word");
};

template <class In>
struct QuantizeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t row_tiles;      // ceil(rows / kRows)
  std::uint8_t* rowwise_data;  // nullptr: rowwise not requested
  std::uint8_t* rowwise_scale;
  std::int64_t rowwise_scale_ld;
  std::uint8_t* columnwise_data;  // nullptr: columnwise not requested
  std::uint8_t* columnwise_scale;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % 8 == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 8 == 0 and rowwise data 8-byte aligned
  bool columnwise_store_aligned;  // cols % 8 == 0 and columnwise data 8-byte aligned
  bool rowwise_scale_aligned;     // rowwise_scale_ld % 8 == 0 and rowwise scale 8-byte aligned
  bool all_aligned;               // every flag above that the request uses
};

// The codes of x[k] * factor[k] (num_mx::encode: one FP32 multiply by 2^(127-e), then
// sat_rne), as two little-endian words. The hardware conversion equals num::f32_to_e4m3 /
// f32_to_e5m2 on every non-NaN input (test_gpu_conversions); `has_nan` (some x[k] is NaN, so
// some product is: the factors are finite) adds the reference's canonical NaN 0x7F, exactly
// as num::fast::f32x2_to_e4m3x2 does.
template <class Codes>
__device__ __forceinline__ void encode_run(const float (&x)[8], const float (&factor)[8],
                                           bool has_nan, std::uint32_t& lo, std::uint32_t& hi) {
  float y[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) y[k] = x[k] * factor[k];
  std::uint32_t pair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    pair[k] = Codes::kE4M3 ? num::fast::hardware_e4m3x2(y[2 * k], y[2 * k + 1])
                           : num::fast::hardware_e5m2x2(y[2 * k], y[2 * k + 1]);
  if (has_nan) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      pair[k] = num::fast::canonical_nan_pair(pair[k], y[2 * k], y[2 * k + 1]);
  }
  lo = pair[0] | (pair[1] << 16);
  hi = pair[2] | (pair[3] << 16);
}

// Quantizes the CTA tile at rows row0 .., columns cta_col .. . kInterior: the tile lies inside
// the tensor and every buffer is aligned (p.all_aligned), so every run is a whole vector.
template <bool kInterior, class In, class Codes, Directions D>
__device__ __forceinline__ void quantize_cta_tile(const QuantizeParams<In>& p, std::int64_t row0,
                                                  std::int64_t cta_col,
                                                  std::uint8_t (*row_scales)[8]) {
  using T = QuantizeTile<In, D>;
  constexpr bool kRowwise = has_rowwise(D), kColumnwise = has_columnwise(D);
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int rg = lane / 4, cg = lane % 4;
  const std::int64_t tile_col = cta_col + warp * 32;
  const std::int64_t col = tile_col + cg * C;  // this lane's first column
  const std::int64_t lane_row = row0 + rg * R;
  const std::int64_t lane_offset = lane_row * p.cols + col;  // element (lane_row, col)
  const int valid_cols = kInterior ? C : valid_in_run(col, p.cols, C);
  // Run i (row lane_row + i): whole in the interior, else `valid` elements of it exist.
  auto run_valid = [&](int i) { return lane_row + i < p.rows ? valid_cols : 0; };

  Raw8<In> raw[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = lane_offset + i * p.cols;
    if constexpr (kInterior) {
      load_raw8<In>(p.src, offset, C, true, raw[i]);
    } else {
      const int valid = run_valid(i);
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

  // Rowwise: each row's 1x32 block amax over its 4 lanes, then its exponent.
  float row_factor[R];
  if constexpr (kRowwise) {
    std::uint8_t e[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < C; ++k) amax = amax_of(amax, x[i][k]);
      amax = sdk::cuda::max_over_row_lanes(amax);
      e[i] = num_mx::block_exponent(amax, Codes::kRcp);
      row_factor[i] = num::e8m0_encode_factor(e[i]);
    }
    // Lane cg parks the scale of its row group's row cg (the 4 lanes agree on all 4).
    std::uint8_t my_e = e[0];
#pragma unroll
    for (int i = 1; i < R; ++i) my_e = cg == i ? e[i] : my_e;
    row_scales[rg * R + cg][warp] = my_e;
  }

  // Columnwise: each column's 32x1 block amax over its 8 lanes (reduce-scatter: this lane
  // ends with column 8 cg + rg), exponent, then every lane gathers its 8 columns' factors.
  float col_factor[C];
  if constexpr (kColumnwise) {
    float colmax[C];
#pragma unroll
    for (int k = 0; k < C; ++k) {
      colmax[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < R; ++i) colmax[k] = amax_of(colmax[k], x[i][k]);
    }
    const float amax = sdk::cuda::max_over_column_lanes_scatter(colmax);
    const std::uint8_t e = num_mx::block_exponent(amax, Codes::kRcp);
    const std::int64_t my_col = tile_col + cg * C + rg;
    if (kInterior || my_col < p.cols)  // row0 < rows: the CTA exists
      p.columnwise_scale[(row0 / kBlock) * p.columnwise_scale_ld + my_col] = e;
    sdk::cuda::gather_column_values(num::e8m0_encode_factor(e), col_factor);
  }

  // Codes, row by row: both directions of a row are encoded and stored before the next, so
  // each row's elements die early (fewer live registers than one direction after the other).
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = lane_offset + i * p.cols;
    const int valid = kInterior ? C : run_valid(i);
    if constexpr (kRowwise) {
      const float f[C] = {row_factor[i], row_factor[i], row_factor[i], row_factor[i],
                          row_factor[i], row_factor[i], row_factor[i], row_factor[i]};
      std::uint32_t lo, hi;
      encode_run<Codes>(x[i], f, has_nan, lo, hi);
      if (kInterior || valid > 0)
        store_bytes8(p.rowwise_data, offset, valid,
                     kInterior || (p.rowwise_store_aligned && valid == C), lo, hi);
    }
    if constexpr (kColumnwise) {
      std::uint32_t lo, hi;
      encode_run<Codes>(x[i], col_factor, has_nan, lo, hi);
      if (kInterior || valid > 0)
        store_bytes8(p.columnwise_data, offset, valid,
                     kInterior || (p.columnwise_store_aligned && valid == C), lo, hi);
    }
  }

  if constexpr (kRowwise) {
    __syncthreads();
    const int tr = static_cast<int>(threadIdx.x);
    const std::int64_t r = row0 + tr;
    const std::int64_t first_block = cta_col / kBlock;
    if (tr < T::kRows && (kInterior || r < p.rows)) {
      const uint2 word = *reinterpret_cast<const uint2*>(row_scales[tr]);
      if constexpr (kInterior) {
        store_bytes8(p.rowwise_scale, r * p.rowwise_scale_ld + first_block, T::kWarps, true,
                     word.x, word.y);
      } else {
        // Blocks of this CTA that exist in the row.
        const int blocks =
            (valid_in_run(cta_col, p.cols, T::kCols) + kBlock - 1) / kBlock;
        store_bytes8(p.rowwise_scale, r * p.rowwise_scale_ld + first_block, blocks,
                     p.rowwise_scale_aligned && blocks == T::kWarps, word.x, word.y);
      }
    }
  }
}

// The edge tiles, out of line: their bounds checks and scalar fallbacks keep more values live,
// and as a separate function they get their own register allocation (spills there, if any,
// stay off the interior path).
template <class In, class Codes, Directions D>
__device__ __noinline__ void quantize_edge_tile(const QuantizeParams<In> p, std::int64_t row0,
                                                std::int64_t cta_col,
                                                std::uint8_t (*row_scales)[8]) {
  quantize_cta_tile<false, In, Codes, D>(p, row0, cta_col, row_scales);
}

template <class In, class Codes, Directions D>
__global__ void __launch_bounds__(QuantizeTile<In, D>::kThreads,
                                  QuantizeTile<In, D>::kMinBlocksPerSM)
    quantize_kernel(const QuantizeParams<In> p) {
  using T = QuantizeTile<In, D>;
  // Rowwise scales of the CTA tile, [tile row][warp].
  __shared__ alignas(8) std::uint8_t row_scales[has_rowwise(D) ? T::kRows : 1][T::kWarps];
  const std::int64_t cta_col = static_cast<std::int64_t>(blockIdx.x) * T::kCols;
  // gridDim.y is capped at 65535: taller tensors take several row tiles per CTA.
  for (std::int64_t tile = blockIdx.y; tile < p.row_tiles; tile += gridDim.y) {
    const std::int64_t row0 = tile * T::kRows;
    if (p.all_aligned && row0 + T::kRows <= p.rows && cta_col + T::kCols <= p.cols)
      quantize_cta_tile<true, In, Codes, D>(p, row0, cta_col, row_scales);
    else
      quantize_edge_tile<In, Codes, D>(p, row0, cta_col, row_scales);
    if (has_rowwise(D) && tile + gridDim.y < p.row_tiles) __syncthreads();  // row_scales reused
  }
}

// Dequantize: a thread decodes runs of kDequantizeRun codes of one row (one 16-byte load
// where aligned), grid-stride. Both directions store data [rows, cols]; only where the
// exponent comes from differs.
constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeRun = 16;
constexpr std::int64_t kDequantizeMaxBlocks = 8192;  // 2M threads; the grid-stride loop does the rest
static_assert(kBlock % kDequantizeRun == 0, "a rowwise run lies inside one 1x32 block");

struct DequantizeParams {
  const std::uint8_t* data;
  const std::uint8_t* scale;
  std::int64_t scale_ld;
  bool rowwise;
  bool e4m3;
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
      const RunOf<std::uint8_t, N> in = *reinterpret_cast<const RunOf<std::uint8_t, N>*>(p.data + offset);
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = in.v[k];
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = k < valid ? p.data[offset + k] : 0;
    }
    RunOf<Storage, N> out;
    const std::uint8_t* scale_row =
        p.rowwise ? p.scale + r * p.scale_ld + c0 / kBlock : p.scale + (r / kBlock) * p.scale_ld + c0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      // Rowwise: the whole run shares one exponent; columnwise: one per column.
      const std::uint8_t e = k < valid ? scale_row[p.rowwise ? 0 : k] : 0;
      out.v[k] = Out::from_f32(num_mx::decode(q[k], e, p.e4m3));
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

// ---------------------------------------------------------------- 4. launchers, entries

using sdk::ceil_div;  // qrecipe/plugin_sdk.hpp

void check_source_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "mxfp8 CUDA ", entry, ": source dtype code ",
                static_cast<int>(dtype), " is not f32, bf16 or f16; convert the tensor first");
}

void check_data_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK(dtype == QR_DTYPE_E4M3 || dtype == QR_DTYPE_E5M2, "mxfp8 CUDA ", entry,
           ": data dtype code ", static_cast<int>(dtype), " is not e4m3 or e5m2");
}

template <class In, class Codes, Directions D>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In, D>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.row_tiles = ceil_div(a.rows, T::kRows);
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale = a.rowwise_scale;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_scale = a.columnwise_scale;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  // Runs start at multiples of 8 within a row: with cols % 8 == 0 every run starts 16-byte
  // (source, 2- or 4-byte elements) and 8-byte (codes) aligned when the buffers do.
  p.load_aligned = a.cols % 8 == 0 && is_aligned(a.src, 16);
  p.rowwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.rowwise_data, 8);
  p.columnwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.columnwise_data, 8);
  // A CTA's scales start at block kWarps * (CTA column), a multiple of 8.
  p.rowwise_scale_aligned = a.rowwise_scale_ld % 8 == 0 && is_aligned(a.rowwise_scale, 8);
  p.all_aligned = p.load_aligned &&
                  (!has_rowwise(D) || (p.rowwise_store_aligned && p.rowwise_scale_aligned)) &&
                  (!has_columnwise(D) || p.columnwise_store_aligned);
  const std::int64_t col_tiles = ceil_div(a.cols, T::kCols);
  QR_CHECK(col_tiles <= INT_MAX, "mxfp8 CUDA quantize: ", a.cols, " columns need ", col_tiles,
           " CTA tiles of ", T::kCols, " columns; at most ", INT_MAX, " fit in one grid row");
  constexpr std::int64_t kMaxGridY = 65535;  // CUDA's limit; the kernel loops past it
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(p.row_tiles < kMaxGridY ? p.row_tiles : kMaxGridY));
  quantize_kernel<In, Codes, D><<<grid, T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("mxfp8 quantize_kernel");
}

template <class In, class Codes>
void dispatch_directions(const QuantizeArgs& a) {
  if (a.columnwise_data == nullptr) launch_quantize<In, Codes, Directions::kRowwise>(a);
  else if (a.rowwise_data == nullptr) launch_quantize<In, Codes, Directions::kColumnwise>(a);
  else launch_quantize<In, Codes, Directions::kBoth>(a);
}

template <class In>
void dispatch_quantize(const QuantizeArgs& a) {
  if (a.data_dtype == QR_DTYPE_E4M3) dispatch_directions<In, E4M3Codes>(a);
  else dispatch_directions<In, E5M2Codes>(a);
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  check_source_dtype(a.src_dtype, "quantize");
  check_data_dtype(a.data_dtype, "quantize");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "mxfp8 CUDA quantize: negative shape ", a.rows, " x ",
           a.cols);
  QR_CHECK(a.rowwise_data != nullptr || a.columnwise_data != nullptr,
           "mxfp8 CUDA quantize: neither direction was requested");
  if (a.rows == 0 || a.cols == 0) return;
  QR_CHECK(a.src != nullptr, "mxfp8 CUDA quantize: the source has a null data pointer");
  QR_CHECK(a.rowwise_data == nullptr ||
               (a.rowwise_scale != nullptr && a.rowwise_scale_ld >= ceil_div(a.cols, kBlock)),
           "mxfp8 CUDA quantize: the rowwise scale buffer is null or its rows (",
           a.rowwise_scale_ld, " bytes) are shorter than ", ceil_div(a.cols, kBlock), " blocks");
  QR_CHECK(a.columnwise_data == nullptr ||
               (a.columnwise_scale != nullptr && a.columnwise_scale_ld >= a.cols),
           "mxfp8 CUDA quantize: the columnwise scale buffer is null or its rows (",
           a.columnwise_scale_ld, " bytes) are shorter than ", a.cols, " columns");
  DeviceGuard guard(a.device_index, kFormat);
  switch (a.src_dtype) {
    case QR_DTYPE_F32: dispatch_quantize<F32In>(a); break;
    case QR_DTYPE_BF16: dispatch_quantize<BF16In>(a); break;
    default: dispatch_quantize<F16In>(a); break;
  }
}

void dequantize(const std::uint8_t* data, const std::uint8_t* scale, std::int64_t scale_ld,
                qr_dtype data_dtype, qr_direction direction, std::int64_t rows,
                std::int64_t cols, void* dst, qr_dtype dst_dtype, int device_index,
                void* stream) {
  check_data_dtype(data_dtype, "dequantize");
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16, QR_STATUS_UNSUPPORTED,
                "mxfp8 CUDA dequantize: output dtype code ", static_cast<int>(dst_dtype),
                " is not f32 or bf16");
  QR_CHECK(rows >= 0 && cols >= 0, "mxfp8 CUDA dequantize: negative shape ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  QR_CHECK(data != nullptr && scale != nullptr && dst != nullptr,
           "mxfp8 CUDA dequantize: a data, scale or destination pointer is null");
  DequantizeParams p{};
  p.data = data;
  p.scale = scale;
  p.scale_ld = scale_ld;
  p.rowwise = direction == QR_DIRECTION_ROWWISE;
  p.e4m3 = data_dtype == QR_DTYPE_E4M3;
  p.rows = rows;
  p.cols = cols;
  p.runs_per_row = ceil_div(cols, kDequantizeRun);
  p.aligned = cols % kDequantizeRun == 0 && is_aligned(data, 16) && is_aligned(dst, 16);
  DeviceGuard guard(device_index, kFormat);
  const unsigned blocks = grid_for(rows * p.runs_per_row, kDequantizeThreads, kDequantizeMaxBlocks);
  const cudaStream_t s = as_stream(stream);
  if (dst_dtype == QR_DTYPE_F32)
    dequantize_kernel<F32Out><<<blocks, kDequantizeThreads, 0, s>>>(p, static_cast<float*>(dst));
  else
    dequantize_kernel<BF16Out>
        <<<blocks, kDequantizeThreads, 0, s>>>(p, static_cast<std::uint16_t*>(dst));
  QR_CUDA_CHECK_LAUNCH("mxfp8 dequantize_kernel");
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  check_source_dtype(src_dtype, "compute_amax");
  return sdk::cuda::amax_to_host(src, src_dtype, numel, device_index, stream, kFormat);
}

}  // namespace qrecipe::mxfp8::cuda
