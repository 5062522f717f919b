// CUDA entry points of the blockwise format (implemented in blockwise_kernels.cu, compiled only
// when the plugin is built with CUDA: QRECIPE_PLUGIN_HAS_CUDA). This header uses no CUDA types
// so blockwise.cpp, compiled by the host compiler, can call it.
//
// Every entry:
//   - takes device pointers (all on `device_index`) for what it reads and writes,
//   - runs asynchronously on `stream` (a cudaStream_t; nullptr = the legacy default stream),
//     except where it says it synchronizes,
//   - makes `device_index` current for the call and restores the previous device after,
//   - throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the CUDA call that failed.
// Sources are contiguous row-major [rows, cols] (blockwise.cpp checks that first). The data
// and scale_inv written are bit-identical to blockwise_ref.cpp; scale padding is never
// written. Layouts: blockwise_ref.hpp.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::blockwise::cuda {

struct QuantizeArgs {
  const void* src = nullptr;          // device, contiguous [rows, cols]
  qr_dtype src_dtype = QR_DTYPE_F32;  // f32, bf16 or f16
  std::int64_t rows = 0, cols = 0;
  bool tile_128x128 = false;  // false: 1x128 blocks (rowwise) / 128x1 (columnwise)
  bool pow2_scales = true;
  float amax_epsilon = 0.0f;
  float value_for_inf = 0.0f;  // largest finite value of src_dtype (ref::value_for_inf)
  // Rowwise: data [rows, cols]; scale_inv f32 with rows of rowwise_scale_ld floats, laid out
  // as the reference's layout() says. nullptr data: rowwise not requested.
  std::uint8_t* rowwise_data = nullptr;
  float* rowwise_scale_inv = nullptr;
  std::int64_t rowwise_scale_ld = 0;
  // Columnwise: data transposed [cols, rows]; scale_inv likewise. nullptr: not requested.
  // columnwise_ld: bytes between the data's rows, 0 for `rows` (a device-split group's rows
  // are padded, blockwise_grouped_kernels.hpp).
  std::uint8_t* columnwise_data = nullptr;
  std::int64_t columnwise_ld = 0;
  float* columnwise_scale_inv = nullptr;
  std::int64_t columnwise_scale_ld = 0;
  int device_index = 0;
  void* stream = nullptr;
};

// Quantizes the requested directions in ONE pass over the source (each element is read
// once). Empty tensors launch nothing.
void quantize(const QuantizeArgs& args);

// Where the scale_inv of logical element (r, c) lives, and how the data is stored; the
// fields of the direction's qr_direction_layout.
struct DequantizeArgs {
  const std::uint8_t* data = nullptr;  // [rows, cols], or [cols, rows] when data_transposed
  const float* scale_inv = nullptr;
  std::int64_t rows = 0, cols = 0;  // the logical tensor
  std::int64_t block_rows = 1, block_cols = 128;
  std::int64_t scale_ld = 0;      // scale_shape[1]
  bool scale_transposed = false;  // scale_inv[b][a] holds block (a, b)
  bool data_transposed = false;
  void* dst = nullptr;  // contiguous [rows, cols]
  qr_dtype dst_dtype = QR_DTYPE_F32;  // f32, bf16 or f16
  int device_index = 0;
  void* stream = nullptr;
};

// dst[r][c] = e4m3(data of (r, c)) * scale_inv of its block, rounded to dst_dtype.
void dequantize(const DequantizeArgs& args);

// max |x| over src (NaN ignored; 0 when empty), returned to the host. Synchronizes `stream`.
float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream);

}  // namespace qrecipe::blockwise::cuda
