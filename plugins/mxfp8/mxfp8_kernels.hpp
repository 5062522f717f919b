// CUDA entry points of the mxfp8 format (implemented in mxfp8_kernels.cu, compiled only when
// the plugin is built with CUDA: QRECIPE_PLUGIN_HAS_CUDA). This header uses no CUDA types so
// mxfp8.cpp, compiled by the host compiler, can call it.
//
// Every entry:
//   - takes device pointers (all on `device_index`) for what it reads and writes,
//   - runs asynchronously on `stream` (a cudaStream_t; nullptr = the legacy default stream),
//     except where it says it synchronizes,
//   - makes `device_index` current for the call and restores the previous device after,
//   - throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the CUDA call that failed.
// Sources are contiguous row-major [rows, cols] (mxfp8.cpp checks that first). The data and
// scale bytes written are bit-identical to mxfp8_ref.cpp; scale padding is never written.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::mxfp8::cuda {

struct QuantizeArgs {
  const void* src = nullptr;           // device, contiguous [rows, cols]
  qr_dtype src_dtype = QR_DTYPE_F32;   // f32, bf16 or f16
  std::int64_t rows = 0, cols = 0;
  qr_dtype data_dtype = QR_DTYPE_E4M3;  // e4m3 or e5m2
  // Rowwise: data [rows, cols]; scale e8m0 [roundup(rows,128), rowwise_scale_ld] with
  // rowwise_scale_ld = roundup(ceil(cols/32), 4). nullptr data: rowwise not requested.
  std::uint8_t* rowwise_data = nullptr;
  std::uint8_t* rowwise_scale = nullptr;
  std::int64_t rowwise_scale_ld = 0;
  // Columnwise: data [rows, cols] (not transposed); scale e8m0
  // [roundup(ceil(rows/32),4), columnwise_scale_ld] with columnwise_scale_ld =
  // roundup(cols, 128). nullptr data: columnwise not requested.
  std::uint8_t* columnwise_data = nullptr;
  std::uint8_t* columnwise_scale = nullptr;
  std::int64_t columnwise_scale_ld = 0;
  // Columnwise only, bf16 / f16 sources (quantize_with_cast_supported): also this per-tensor
  // cast (plugin_abi.h's qr_tensor_cast, untransposed here; data == nullptr: none), with
  // q = sat_rne(x * s), s = *scale or scale_from_amax(*amax, ...) of qrecipe/scaling.hpp.
  qr_tensor_cast cast{};
  // Quantize and decode in one pass (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED; not with a
  // cast): the BF16 value of each code written, [rows, cols], for a requested direction whose
  // pointer is set, and its miss word set to 1 when a finite value has bits BF16 drops.
  std::uint16_t* rowwise_decoded = nullptr;
  std::uint32_t* rowwise_miss = nullptr;
  std::uint16_t* columnwise_decoded = nullptr;
  std::uint32_t* columnwise_miss = nullptr;
  int device_index = 0;
  void* stream = nullptr;
};

// Whether quantize can write a per-tensor cast beside the requested directions: the columnwise
// direction alone, from a bf16 or f16 source, into an e4m3 or e5m2 cast.
bool quantize_with_cast_supported(qr_dtype src_dtype, bool rowwise, bool columnwise,
                                  qr_dtype cast_dtype);

// Quantizes the requested directions (and args.cast, when set) in ONE pass over the source
// (each element is read once). Empty tensors launch nothing.
void quantize(const QuantizeArgs& args);

// dst[r][c] = decode(data[r][c], its block's exponent), rounded to dst_dtype (f32 or bf16).
// data is [rows, cols] for both directions; `scale` is that direction's padded scale array
// with `scale_ld` bytes per row. dst is contiguous [rows, cols].
void dequantize(const std::uint8_t* data, const std::uint8_t* scale, std::int64_t scale_ld,
                qr_dtype data_dtype, qr_direction direction, std::int64_t rows,
                std::int64_t cols, void* dst, qr_dtype dst_dtype, int device_index,
                void* stream);

// max |x| over src (NaN ignored; 0 when empty), returned to the host. Synchronizes `stream`.
float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream);

}  // namespace qrecipe::mxfp8::cuda
