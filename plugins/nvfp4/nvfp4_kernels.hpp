// CUDA entry points of the nvfp4 format (implemented in nvfp4_kernels.cu, compiled only when
// the plugin is built with CUDA: QRECIPE_PLUGIN_HAS_CUDA). This header uses no CUDA types so
// nvfp4.cpp, compiled by the host compiler, can call it.
//
// Every entry:
//   - takes device pointers for tensor data and for what it writes (data, scales, amax),
//   - runs asynchronously on `stream` (a cudaStream_t; NULL = the legacy default stream),
//     except where it says it synchronizes,
//   - makes `device_index` current for the call and restores the previous device after,
//   - throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the CUDA call that failed.
// Sources are contiguous row-major [rows, cols] f32/bf16/f16 (nvfp4.cpp checks that first,
// together with everything ref::check_quantize_call checks). The bytes, scales and amax
// written are bit-identical to nvfp4_ref.cpp; layouts are those of nvfp4_ref.hpp.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::nvfp4::cuda {

// The device buffers of one direction, allocated from the quantizer's layout (zero-filled at
// allocation: the kernels write every valid data byte and valid scale, never the padding).
struct DirectionBuffers {
  std::uint8_t* data = nullptr;    // [data_rows, ceil(data_cols / 2)] bytes
  std::uint8_t* scales = nullptr;  // [roundup(data_rows, 128), roundup(ceil(data_cols/16), 4)]
  float* amax = nullptr;           // [1]
};

// Whether quantize can write a per-tensor cast beside the requested directions: the columnwise
// direction alone, 1-D blocks (no 2d, no Hadamard), round to nearest, a bf16 / f16 source, an
// e4m3 / e5m2 cast.
bool quantize_with_cast_supported(qr_dtype src_dtype, bool rowwise, bool columnwise, bool two_d,
                                  bool hadamard, bool stochastic, qr_dtype cast_dtype);

struct QuantizeArgs {
  const void* src = nullptr;  // device, contiguous [rows, cols]
  qr_dtype src_dtype = QR_DTYPE_F32;
  std::int64_t rows = 0, cols = 0;
  // Options (nvfp4_ref.hpp Config) and the stochastic-rounding call offset of this call.
  bool two_d = false;
  bool hadamard = false;  // bf16 source and rows % 16 == 0 when columnwise is requested
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;
  std::uint64_t call_offset = 0;
  // Host pointer to [rowwise, columnwise] reduced by the caller (already validated), or null:
  // the amax pass runs on the device.
  const float* given_amax = nullptr;
  // Device pointer to max |x| of this very source (the cast's source_amax), or null: taken
  // as the tensor amax of the requested direction instead of the amax pass (not with
  // given_amax, not with Hadamard, whose columnwise amax is another quantity).
  const float* device_amax = nullptr;
  const DirectionBuffers* rowwise = nullptr;     // null: not requested
  const DirectionBuffers* columnwise = nullptr;  // null: not requested
  // quantize_with_cast_supported requests only: also this per-tensor cast (plugin_abi.h's
  // qr_tensor_cast, untransposed here; data == nullptr: none), q = sat_rne(x * s) with
  // s = *scale or scale_from_amax(*amax, ...) of qrecipe/scaling.hpp.
  qr_tensor_cast cast{};
  int device_index = 0;
  void* stream = nullptr;
};

// [rowwise amax, columnwise amax] of src (max |x|, and under `hadamard` the max over the
// transformed BF16 values), returned to the host. Synchronizes `stream`.
void compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t rows,
                          std::int64_t cols, bool hadamard, float amax_out[2], int device_index,
                          void* stream);

// The whole quantize call: the amax pass (skipped when given_amax is set), then one pass over
// 64x64 tiles writing both requested directions. Works for empty tensors (only amax written).
void quantize(const QuantizeArgs& args);

// Decode one direction into dst (contiguous logical [rows, cols] of f32, bf16 or f16). The
// data matrix is [rows, cols], or [cols, rows] when `transposed` (columnwise); amax is the
// direction's device amax.
void dequantize(const std::uint8_t* data, const std::uint8_t* scales, const float* amax,
                std::int64_t rows, std::int64_t cols, bool transposed, void* dst,
                qr_dtype dst_dtype, int device_index, void* stream);

}  // namespace qrecipe::nvfp4::cuda
