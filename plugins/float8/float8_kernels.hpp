// CUDA entry points of the float8 format (implemented in float8_kernels.cu, compiled only when
// the plugin is built with CUDA: QRECIPE_PLUGIN_HAS_CUDA). This header uses no CUDA types so
// float8.cpp, compiled by the host compiler, can call it.
//
// Every entry:
//   - takes device pointers for tensor data and for the scalars it writes (scale_inv, amax),
//   - runs asynchronously on `stream` (a cudaStream_t; NULL = the legacy default stream),
//     except where it says it synchronizes,
//   - makes `device_index` current for the call and restores the previous device after,
//   - throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the CUDA call that failed.
// Sources must be contiguous (row-major [rows, cols]); float8.cpp checks that first.
// The bytes, scale_inv and amax written are bit-identical to float8_ref.cpp.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::float8::cuda {

// Where the per-tensor scale of a cast comes from (the first that is set wins).
struct ScaleSource {
  // Current scaling, amax pass included: cast_transpose first reduces max |x| over src itself
  // (one read of the input, per-block maxima in stream-ordered scratch memory, no memset),
  // and the cast derives scale = scale_from_amax(amax, fmax, pow2_scales, amax_epsilon) on
  // the device; the amax lands in CastTransposeArgs::amax_out. The fastest current-scaling
  // path: the cast overlaps the end of the amax pass and starts where it ended (in L2).
  bool tensor_amax = false;
  // Current scaling: a device pointer to the tensor amax; each block computes
  // scale = scale_from_amax(*amax, fmax, pow2_scales, amax_epsilon) on the device, so no host
  // round trip is needed.
  const float* device_amax = nullptr;
  float fmax = 448.0f;
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;
  // Delayed scaling: a device pointer to the state's scale (read by each block).
  const float* device_scale = nullptr;
  // Otherwise: a scale computed on the host (a caller-reduced amax under current scaling).
  float scale = 1.0f;
};

struct CastTransposeArgs {
  const void* src = nullptr;       // device, contiguous [rows, cols]
  qr_dtype src_dtype = QR_DTYPE_F32;  // f32, bf16 or f16
  std::int64_t rows = 0, cols = 0;
  qr_dtype data_dtype = QR_DTYPE_E4M3;  // e4m3 or e5m2
  std::uint8_t* rowwise = nullptr;      // [rows, cols] or nullptr (not requested)
  std::uint8_t* columnwise = nullptr;   // [cols, rows] or nullptr (not requested)
  float* rowwise_scale_inv = nullptr;    // [1]: receives 1/scale, or nullptr
  float* columnwise_scale_inv = nullptr; // [1]: receives 1/scale, or nullptr
  // Optional: max |x| over the tensor (NaN ignored) is atomically max-accumulated into each
  // non-null entry (delayed scaling observes the amax while it casts: the tensor's amax
  // buffers and the history row 0). Each must hold a non-negative, non-NaN value before.
  float* amax_accumulate[3] = {nullptr, nullptr, nullptr};
  // Optional (current scaling with device_amax): receives a copy of *scale.device_amax, for
  // the other direction's amax buffer.
  float* amax_mirror = nullptr;
  // Optional: each non-null entry receives the tensor amax (max |x|, NaN ignored), overwritten:
  // with scale.tensor_amax, the amax pass's value; otherwise the amax the cast observes (the
  // entry zeroes these buffers itself, in a launch the cast overlaps: delayed scaling).
  float* amax_out[2] = {nullptr, nullptr};
  ScaleSource scale;
  // Optional (columnwise requested, bf16 / f16 sources, cast_with_own_rowwise_supported): the
  // rowwise bytes are another format's per-tensor cast from the same read of the source (the
  // hybrid fusion extra of plugin_abi.h, qr_tensor_cast), q = sat_rne(x * s) in
  // rowwise_dtype, s = *rowwise_scale.device_scale, or scale_from_amax(
  // *rowwise_scale.device_amax, fmax, pow2_scales, amax_epsilon): one of the two pointers set.
  // Their scale_inv belongs to that format: rowwise_scale_inv must stay null.
  bool rowwise_own = false;
  qr_dtype rowwise_dtype = QR_DTYPE_E4M3;
  ScaleSource rowwise_scale;
  int device_index = 0;
  void* stream = nullptr;
};

// Whether cast_transpose can write rowwise bytes of their own type and scale (rowwise_own):
// a bf16 or f16 source, an e4m3 or e5m2 rowwise type.
bool cast_with_own_rowwise_supported(qr_dtype src_dtype, qr_dtype rowwise_dtype);

// *amax_out = max |x| over src (NaN ignored); the buffer is zeroed first, then reduced into.
void compute_amax(const void* src, qr_dtype src_dtype, std::int64_t numel, float* amax_out,
                  int device_index, void* stream);

// Same, returned to the host. Synchronizes `stream` (uses a temporary device float).
float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream);

// Fused cast (+ transpose): reads src once (twice with scale.tensor_amax: amax pass, then
// cast), writes the rowwise and/or the columnwise bytes and the scale_inv of each requested
// direction. Works for empty tensors (only scalars written).
void cast_transpose(const CastTransposeArgs& args);

// dst[r][c] = decode(data) * (*scale_inv) rounded to dst_dtype (f32, bf16, f16); data is
// [rows, cols], or [cols, rows] when `transposed`. dst is contiguous [rows, cols].
void dequantize(const std::uint8_t* data, qr_dtype data_dtype, bool transposed,
                std::int64_t rows, std::int64_t cols, const float* scale_inv, void* dst,
                qr_dtype dst_dtype, int device_index, void* stream);

// Small scalar writes in one stream-ordered launch: each non-null dst[i] = value; then, when
// max_into is non-null and max_value > 0 (false for NaN), *max_into = max(*max_into,
// max_value) atomically (*max_into must be non-negative and not NaN, like a history row 0).
void write_scalars(float* dst0, float* dst1, float value, float* max_into, float max_value,
                   int device_index, void* stream);
// Copies one device float to the host and synchronizes `stream`.
float read_scalar(const float* src, int device_index, void* stream);

}  // namespace qrecipe::float8::cuda
