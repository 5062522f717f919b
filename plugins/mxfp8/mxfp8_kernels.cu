// CUDA kernels of the mxfp8 format, bit-exact with mxfp8_ref.cpp.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11: helpers, kernels,
// launchers, entries):
//   1. checking and the element traits it uses (qrecipe/cuda_sdk.cuh)
//   2. kernels: fused rowwise + columnwise quantize (the CTA tile is mxfp8_device.cuh's
//      quantize_cta_tile, shared with the grouped kernel), the dequantize decode (the kernel
//      is the SDK's 16-byte-run dequantize)
//   3. launchers (grid arithmetic, dtype dispatch) and the entries declared in
//      mxfp8_kernels.hpp (validation, device selection)
//
// Exactness: the block exponent, the element scaling and the decode are the QR_HD functions of
// mxfp8_numerics.hpp that the reference calls too (one FP32 multiply by fl32(1/fmax), E8M0
// round-up, x * 2^(127-e), q * 2^(e-127)), and the plugin is compiled with -fmad=false
// --ftz=false --prec-div=true (QrecipeCompileFlags.cmake), so the device performs the same IEEE
// operations. The sat_rne of the scaled element is the hardware cvt.rn.satfinite of
// qrecipe/fast_conversions.cuh, equal to num::f32_to_e4m3 / f32_to_e5m2 on every FP32 input
// (tests/gpu/test_gpu_conversions.cpp, all 2^32 inputs), with the reference's NaN code applied to
// the runs that hold a NaN. A block amax is an exact max (NaN ignored by fmaxf), so neither its
// reduction order nor the zeros that pad a partial tile change it.
//
// Quantize design (one pass, both directions; details in mxfp8_device.cuh): 32 x 32 warp
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
#include <type_traits>

#include "mxfp8_device.cuh"
#include "mxfp8_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::mxfp8::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

constexpr const char* kFormat = "mxfp8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers (qrecipe/cuda_sdk.cuh; those of the quantize tile: mxfp8_device.cuh).
using sdk::cuda::BF16Out;
using sdk::cuda::F32Out;

// ---------------------------------------------------------------- 2. kernels

// A kernel that also writes a per-tensor cast stores two directions, like kBoth: 3 CTAs an SM
// (80 registers; at 4, 64 registers spilled).
// kDecoded (quantize and decode in one pass) stores up to four outputs a row, like a cast: 3
// CTAs an SM.
template <class In, class Codes, Directions D, class Cast = NoCast, bool kDecoded = false>
__global__ void __launch_bounds__(QuantizeTile<In, D>::kThreads,
                                  std::is_same_v<Cast, NoCast> && !kDecoded
                                      ? QuantizeTile<In, D>::kMinBlocksPerSM
                                      : 3)
    quantize_kernel(const QuantizeParams<In> p) {
  using T = QuantizeTile<In, D>;
  // Rowwise scales of the CTA tile, [tile row][warp].
  __shared__ alignas(8) std::uint8_t row_scales[has_rowwise(D) ? T::kRows : 1][T::kWarps];
  const std::int64_t cta_col = static_cast<std::int64_t>(blockIdx.x) * T::kCols;
  // gridDim.y is capped at 65535: taller tensors take several row tiles per CTA.
  for (std::int64_t tile = blockIdx.y; tile < p.row_tiles; tile += gridDim.y) {
    const std::int64_t row0 = tile * T::kRows;
    if (p.all_aligned && row0 + T::kRows <= p.rows && cta_col + T::kCols <= p.cols)
      quantize_cta_tile<true, In, Codes, D, Cast, kDecoded>(p, row0, cta_col, row_scales);
    else
      quantize_edge_tile<In, Codes, D, Cast, kDecoded>(p, row0, cta_col, row_scales);
    if (has_rowwise(D) && tile + gridDim.y < p.row_tiles) __syncthreads();  // row_scales reused
  }
}

// Dequantize: the SDK's 16-byte-run kernel (cuda_sdk.cuh dequantize_runs_kernel) with the
// mxfp8 decode. Both directions store data [rows, cols]; only where the exponent comes from
// differs.
static_assert(kBlock % sdk::cuda::kDequantizeRun == 0, "a rowwise run lies inside one 1x32 block");

struct Decoder {
  const std::uint8_t* scale;
  std::int64_t scale_ld;
  bool rowwise;
  bool e4m3;

  // The exponents of the run at (r, c0): rowwise, the one its block shares; columnwise, one a
  // column, in the scale row of the run's 32-row block.
  __device__ __forceinline__ const std::uint8_t* run(std::int64_t r, std::int64_t c0) const {
    return rowwise ? scale + r * scale_ld + c0 / kBlock : scale + (r / kBlock) * scale_ld + c0;
  }
  __device__ __forceinline__ float decode(const std::uint8_t* scale_row, std::uint8_t q, int k,
                                          int valid) const {
    const std::uint8_t e = k < valid ? scale_row[rowwise ? 0 : k] : 0;
    return num_mx::decode(q, e, e4m3);
  }
};

// ---------------------------------------------------------------- 3. launchers, entries


void check_data_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK(dtype == QR_DTYPE_E4M3 || dtype == QR_DTYPE_E5M2, "mxfp8 CUDA ", entry,
           ": data dtype code ", static_cast<int>(dtype), " is not e4m3 or e5m2");
}

template <class In, class Codes, Directions D, class Cast = NoCast, bool kDecoded = false>
void launch_quantize(const QuantizeArgs& a) {
  using T = QuantizeTile<In, D>;
  const QuantizeParams<In> p = quantize_params<In, D>(a);
  const std::int64_t col_tiles = ceil_div(a.cols, T::kCols);
  QR_CHECK(col_tiles <= INT_MAX, "mxfp8 CUDA quantize: ", a.cols, " columns need ", col_tiles,
           " CTA tiles of ", T::kCols, " columns; at most ", INT_MAX, " fit in one grid row");
  constexpr std::int64_t kMaxGridY = 65535;  // CUDA's limit; the kernel loops past it
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(p.row_tiles < kMaxGridY ? p.row_tiles : kMaxGridY));
  quantize_kernel<In, Codes, D, Cast, kDecoded><<<grid, T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("mxfp8 quantize_kernel");
}

template <class In, class Codes>
void dispatch_directions(const QuantizeArgs& a) {
  if constexpr (sizeof(typename In::Storage) == 2) {  // the fused cast: 16-bit sources
    if (a.cast.data != nullptr) {
      if (a.cast.dtype == QR_DTYPE_E4M3)
        launch_quantize<In, Codes, Directions::kColumnwise, E4M3Codes>(a);
      else
        launch_quantize<In, Codes, Directions::kColumnwise, E5M2Codes>(a);
      return;
    }
  }
  if (a.rowwise_decoded != nullptr || a.columnwise_decoded != nullptr) {  // quantize + decode
    if (a.columnwise_data == nullptr) launch_quantize<In, Codes, Directions::kRowwise, NoCast, true>(a);
    else if (a.rowwise_data == nullptr) launch_quantize<In, Codes, Directions::kColumnwise, NoCast, true>(a);
    else launch_quantize<In, Codes, Directions::kBoth, NoCast, true>(a);
    return;
  }
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

bool quantize_with_cast_supported(qr_dtype src_dtype, bool rowwise, bool columnwise,
                                  qr_dtype cast_dtype) {
  return (src_dtype == QR_DTYPE_BF16 || src_dtype == QR_DTYPE_F16) && !rowwise && columnwise &&
         (cast_dtype == QR_DTYPE_E4M3 || cast_dtype == QR_DTYPE_E5M2);
}

void quantize(const QuantizeArgs& a) {
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "quantize");
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
  QR_CHECK(a.cast.data == nullptr ||
               (quantize_with_cast_supported(a.src_dtype, a.rowwise_data != nullptr,
                                             a.columnwise_data != nullptr,
                                             static_cast<qr_dtype>(a.cast.dtype)) &&
                (a.cast.scale != nullptr || a.cast.amax != nullptr)),
           "mxfp8 CUDA quantize: a per-tensor cast needs the columnwise direction alone, a "
           "bf16 / f16 source, an e4m3 / e5m2 cast and its scale or amax");
  QR_CHECK((a.rowwise_decoded == nullptr || (a.rowwise_data != nullptr && a.rowwise_miss != nullptr)) &&
               (a.columnwise_decoded == nullptr ||
                (a.columnwise_data != nullptr && a.columnwise_miss != nullptr)) &&
               (a.cast.data == nullptr || (a.rowwise_decoded == nullptr && a.columnwise_decoded == nullptr)),
           "mxfp8 CUDA quantize: decoded values need their direction, a miss word and no cast");
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
  const Decoder decoder{scale, scale_ld, direction == QR_DIRECTION_ROWWISE,
                        data_dtype == QR_DTYPE_E4M3};
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  if (dst_dtype == QR_DTYPE_F32)
    sdk::cuda::launch_dequantize_runs<F32Out>(data, decoder, rows, cols, dst, s, kFormat);
  else
    sdk::cuda::launch_dequantize_runs<BF16Out>(data, decoder, rows, cols, dst, s, kFormat);
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  sdk::cuda::check_source_dtype(src_dtype, kFormat, "compute_amax");
  return sdk::cuda::amax_to_host(src, src_dtype, numel, device_index, stream, kFormat);
}

}  // namespace qrecipe::mxfp8::cuda
