// CUDA kernels of the mxfp8 format, bit-exact with mxfp8_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, element traits (input dtypes, FP8 codes, output dtypes)
//   2. device helpers: 16-byte run loads, packed code stores, block max, atomic max
//   3. kernels: fused rowwise + columnwise quantize, dequantize, amax reduction
//   4. launchers (grid arithmetic, dtype dispatch) and the entries declared in
//      mxfp8_kernels.hpp (validation, device selection)
//
// Exactness: the block exponent, the element encode and the decode are the QR_HD functions of
// mxfp8_numerics.hpp that the reference calls too (one FP32 multiply by fl32(1/fmax), E8M0
// round-up, sat_rne(x * 2^(127-e)), q * 2^(e-127)), and the plugin is compiled with
// -fmad=false --ftz=false --prec-div=true (QrecipeCompileFlags.cmake), so the device performs
// the same IEEE operations. A block amax is an exact max (NaN ignored by fmaxf), so neither
// its reduction order nor the zeros that pad a partial tile change it.
//
// Quantize design (one pass, both directions): a CTA owns a 64 x 128 tile of the source and
// holds it in registers (32 elements per thread, read with 16-byte loads). The rowwise 1x32
// blocks are reduced across the 8 (f32) or 4 (bf16/f16) lanes that hold one block; the
// columnwise 32x1 blocks are reduced through shared memory (each thread's partial max per
// column, then one thread per (column block, column)). Both directions are then encoded from
// the same registers and written row-major, as 32-bit words where aligned. Bytes moved per
// element, both directions: the source once (4 B f32 / 2 B bf16), 1 B rowwise + 1 B
// columnwise data, and 2/32 B of scales.
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
using sdk::cuda::load_run;
using sdk::cuda::store_codes;
using sdk::cuda::store_floats_shared;
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

// ---------------------------------------------------------------- 3. kernels

// Fused quantize of both directions. One CTA per kRows x kCols tile of the [rows, cols]
// source; thread t owns the run of kRun columns starting at run_col = (t % kThreadsPerRow) *
// kRun in tile rows pass_row + pass * kRowsPerPass (pass_row = t / kThreadsPerRow).
template <class In>
struct QuantizeTile {
  static constexpr int kRun = kRunLength<In>;                      // f32: 4, bf16/f16: 8
  static constexpr int kRows = 64;                                 // 2 columnwise blocks
  static constexpr int kCols = 128;                                // 4 rowwise blocks per row
  static constexpr int kThreads = 256;
  static constexpr int kThreadsPerRow = kCols / kRun;              // 32 or 16
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;   // 8 or 16
  static constexpr int kPasses = kRows / kRowsPerPass;             // 8 or 4 (x kRun = 32 each)
  static constexpr int kLanesPerRowBlock = kBlock / kRun;          // 8 or 4 lanes per 1x32
  static constexpr int kColBlocks = kRows / kBlock;                // 2
  static constexpr int kPassesPerColBlock = kBlock / kRowsPerPass; // 4 or 2 passes per 32x1
  static_assert(kCols % kBlock == 0 && kRows % kBlock == 0, "tiles hold whole blocks");
  static_assert(32 % kThreadsPerRow == 0,
                "a tile row lies within one warp, so a 1x32 block's lanes can shuffle");
  static_assert(kThreadsPerRow % kLanesPerRowBlock == 0 &&
                    (kLanesPerRowBlock & (kLanesPerRowBlock - 1)) == 0,
                "the lanes of a 1x32 block are an aligned power-of-two group");
  static_assert(kRows % kRowsPerPass == 0 && kBlock % kRowsPerPass == 0,
                "passes cover the tile and split evenly into 32-row column blocks");
  static_assert(kColBlocks * kCols == kThreads,
                "the columnwise reduction uses one thread per (column block, column)");
};

template <class In>
struct QuantizeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / kCols)
  std::uint8_t* rowwise_data;  // nullptr: rowwise not requested
  std::uint8_t* rowwise_scale;
  std::int64_t rowwise_scale_ld;
  std::uint8_t* columnwise_data;  // nullptr: columnwise not requested
  std::uint8_t* columnwise_scale;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % kRun == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 4 == 0 and rowwise data 4-byte aligned
  bool columnwise_store_aligned;  // cols % 4 == 0 and columnwise data 4-byte aligned
};

template <class In, class Codes>
__global__ void __launch_bounds__(QuantizeTile<In>::kThreads)
    quantize_kernel(const QuantizeParams<In> p) {
  using T = QuantizeTile<In>;
  constexpr int N = T::kRun;
  // Columnwise: each thread's max per column over its rows of one 32-row block, then the
  // block exponent of every (column block, column) of the tile.
  __shared__ alignas(16) float col_partial[T::kColBlocks][T::kRowsPerPass][T::kCols];
  __shared__ std::uint8_t col_exponent[T::kColBlocks][T::kCols];

  const std::int64_t row0 = (blockIdx.x / p.tiles_per_row) * T::kRows;
  const std::int64_t col0 = (blockIdx.x % p.tiles_per_row) * T::kCols;
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

  // Phase 2, rowwise: the 1x32 block amax over its lanes, exponent, encode, store.
  if (p.rowwise_data != nullptr) {
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass) {
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < N; ++k) amax = amax_of(amax, x[pass][k]);
#pragma unroll
      for (int offset = T::kLanesPerRowBlock / 2; offset > 0; offset >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      const std::uint8_t e = num_mx::block_exponent(amax, Codes::kRcp);
      const std::int64_t r = row0 + pass_row + pass * T::kRowsPerPass;
      if (r < p.rows && valid_cols > 0) {
        if (run_col % kBlock == 0)  // the lane holding the block's first run writes its scale
          p.rowwise_scale[r * p.rowwise_scale_ld + (col0 + run_col) / kBlock] = e;
        std::uint8_t codes[N];
#pragma unroll
        for (int k = 0; k < N; ++k) codes[k] = num_mx::encode(x[pass][k], e, Codes::kE4M3);
        store_codes<N>(p.rowwise_data, r * p.cols + col0 + run_col, valid_cols,
                       p.rowwise_store_aligned && valid_cols == N, codes);
      }
    }
  }

  // Phase 3, columnwise: 32x1 block amaxes through shared memory, then encode, store.
  if (p.columnwise_data != nullptr) {
#pragma unroll
    for (int b = 0; b < T::kColBlocks; ++b) {
      float partial[N];
#pragma unroll
      for (int k = 0; k < N; ++k) partial[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < T::kPassesPerColBlock; ++q)
#pragma unroll
        for (int k = 0; k < N; ++k)
          partial[k] = amax_of(partial[k], x[b * T::kPassesPerColBlock + q][k]);
      store_floats_shared<N>(&col_partial[b][pass_row][run_col], partial);
    }
    __syncthreads();
    {
      const int b = static_cast<int>(threadIdx.x / T::kCols);
      const int c = static_cast<int>(threadIdx.x % T::kCols);
      float amax = 0.0f;
#pragma unroll
      for (int g = 0; g < T::kRowsPerPass; ++g) amax = fmaxf(amax, col_partial[b][g][c]);
      const std::uint8_t e = num_mx::block_exponent(amax, Codes::kRcp);
      col_exponent[b][c] = e;
      const std::int64_t block_row0 = row0 + b * kBlock;
      if (block_row0 < p.rows && col0 + c < p.cols)
        p.columnwise_scale[(block_row0 / kBlock) * p.columnwise_scale_ld + col0 + c] = e;
    }
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass) {
      const std::int64_t r = row0 + pass_row + pass * T::kRowsPerPass;
      if (r >= p.rows || valid_cols == 0) continue;
      const int b = pass / T::kPassesPerColBlock;
      std::uint8_t codes[N];
#pragma unroll
      for (int k = 0; k < N; ++k)
        codes[k] = num_mx::encode(x[pass][k], col_exponent[b][run_col + k], Codes::kE4M3);
      store_codes<N>(p.columnwise_data, r * p.cols + col0 + run_col, valid_cols,
                     p.columnwise_store_aligned && valid_cols == N, codes);
    }
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

template <class In, class Codes>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_per_row = ceil_div(a.cols, T::kCols);
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale = a.rowwise_scale;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_scale = a.columnwise_scale;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  p.load_aligned = a.cols % T::kRun == 0 && is_aligned(a.src, 16);
  // Runs start at multiples of kRun (itself a multiple of 4) within a row: a run starts
  // 4-byte aligned when the row length is a multiple of 4.
  p.rowwise_store_aligned = a.cols % 4 == 0 && is_aligned(a.rowwise_data, 4);
  p.columnwise_store_aligned = a.cols % 4 == 0 && is_aligned(a.columnwise_data, 4);
  const std::int64_t tiles = ceil_div(a.rows, T::kRows) * p.tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "mxfp8 CUDA quantize: ", a.rows, " x ", a.cols, " needs ", tiles,
           " tiles of ", T::kRows, "x", T::kCols, "; at most ", INT_MAX, " fit in one grid");
  quantize_kernel<In, Codes>
      <<<static_cast<unsigned>(tiles), T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("mxfp8 quantize_kernel");
}

template <class In>
void dispatch_quantize(const QuantizeArgs& a) {
  if (a.data_dtype == QR_DTYPE_E4M3) launch_quantize<In, E4M3Codes>(a);
  else launch_quantize<In, E5M2Codes>(a);
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
