// CUDA kernels of the blockwise format, bit-exact with blockwise_ref.cpp.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11: helpers, kernels,
// launchers, entries):
//   1. error checking, device guard, element traits (input dtypes, output dtypes)
//   2. device helpers: the scale_inv position of a block (the quantize tile's helpers are in
//      blockwise_device.cuh)
//   3. kernels: fused rowwise + columnwise quantize (1x128 and 128x128; the tile code is
//      blockwise_device.cuh's quantize_tile), dequantize (row-major data; transposed data
//      through a shared-memory tile), amax reduction
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
// Quantize design (one pass, both directions; details: blockwise_device.cuh): a CTA of 16
// warps owns a 128 x 128 tile, each warp a 32 x 32 warp tile in registers (4 rows x 8 columns a
// lane, one 16-byte load a row). Block amaxes: warp shuffles, then the 4 (or 16) warps of a
// tile row / column / tile through shared memory; each scale is computed once and published.
// The sat_rne(x * scale) is the hardware cvt.rn.satfinite of qrecipe/fast_conversions.cuh, equal
// to num::f32_to_e4m3 on every FP32 input (tests/gpu/test_gpu_conversions.cpp), with the
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

#include "blockwise_device.cuh"
#include "blockwise_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::blockwise::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

constexpr const char* kFormat = "blockwise";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers (qrecipe/cuda_sdk.cuh; those of the quantize tile: blockwise_device.cuh).
using sdk::cuda::BF16Out;
using sdk::cuda::F16Out;
using sdk::cuda::F32Out;
using sdk::cuda::kRunLength;

// ---------------------------------------------------------------- 2. device helpers

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

// Fused quantize: one CTA per 128 x 128 tile (grid: column tiles x row tiles). The tile
// quantization itself (quantize_tile, its shared memory and parameters) lives in
// blockwise_device.cuh, shared with the grouped kernel (blockwise_grouped_kernels.cu).
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

// Dequantize of row-major data ([rows, cols]): the SDK's 16-byte-run kernel
// (cuda_sdk.cuh dequantize_runs_kernel) with the blockwise decode.
struct Decoder {
  const float* scale_inv;
  ScaleGeometry scale;

  struct Run {
    std::int64_t r, c0;
  };
  __device__ __forceinline__ Run run(std::int64_t r, std::int64_t c0) const { return {r, c0}; }
  // Element k's scale_inv from its block (1.0 past the edge, unused).
  __device__ __forceinline__ float decode(const Run& at, std::uint8_t q, int k, int valid) const {
    const float s = k < valid ? scale_inv[scale.offset(at.r, at.c0 + k)] : 1.0f;
    return num_bw::decode(q, s);
  }
};

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


template <class In, bool kTile128x128, Directions D>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In>;
  const QuantizeParams<In> p = quantize_params<In, D>(a);
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
    sdk::cuda::launch_dequantize_runs<Out>(a.data, Decoder{a.scale_inv, geometry}, a.rows, a.cols,
                                           a.dst, stream, kFormat);
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
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "quantize");
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
  sdk::cuda::check_source_dtype(src_dtype, kFormat, "compute_amax");
  return sdk::cuda::amax_to_host(src, src_dtype, numel, device_index, stream, kFormat);
}

}  // namespace qrecipe::blockwise::cuda
