// CPU reference of the float8 format: the executable specification (docs/numerics.md,
// "float8"). The CUDA kernels in float8_kernels.cu must produce the same bytes, scale_inv and
// amax bit for bit; test_float8.cpp and the conformance suite hold both to this file.
//
// Pure functions on host memory; nothing here allocates device memory or keeps state.
//
//   amax(x)              = max |x| over all elements, NaN ignored (like fmaxf); 0 when empty
//   current_scale(amax)  = qrecipe::scale_from_amax(amax, fmax(dtype), pow2, eps)
//   scale_inv            = 1 / scale                       (IEEE FP32 division)
//   rowwise q[r][c]      = sat_rne(fp32(x[r][c]) * scale)  (num::f32_to_e4m3 / f32_to_e5m2)
//   columnwise q_t[c][r] = q[r][c]   the transpose of the rowwise bytes, same scale_inv,
//                                    never re-quantized
//   dequantize           = fp32(decode(q)) * scale_inv, then rounded to the output dtype;
//                          NaN codes decode to the quiet NaN 0x7FC00000 (no multiply)
//
// Sources: f32, bf16 or f16 views of any rank with any strides (a strided view is read
// element by element; the logical 2-D tensor is [prod(leading dims), last dim]). Outputs are
// contiguous buffers. Empty tensors are allowed: nothing is written and the amax is 0.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::float8::ref {


// Largest finite value of an FP8 data dtype: 448 (E4M3) or 57344 (E5M2). Throws for others.
float fp8_max(qr_dtype data_dtype);

// One element: sat_rne(x) into E4M3 / E5M2, and back to FP32.
std::uint8_t encode(float x, qr_dtype data_dtype);
float decode(std::uint8_t code, qr_dtype data_dtype);

// One decoded element: fp32(decode(q)) * scale_inv; a NaN code gives the canonical quiet NaN
// 0x7FC00000 without the multiply (so host and device agree on the NaN's bits).
float decode_scaled(std::uint8_t code, qr_dtype data_dtype, float scale_inv);

// max |x| over every element of src (host memory, f32/bf16/f16); NaN ignored; 0 if empty.
float amax(const qr_tensor_view& src);

// Current scaling: the per-tensor scale for an amax (docs/numerics.md, "float8": scale_from_amax).
float current_scale(float amax, qr_dtype data_dtype, bool pow2_scales, float amax_epsilon);

// Rowwise data: out[r * cols + c] = encode(fp32(src[r][c]) * scale), for the logical
// [rows, cols] view of src. `out` holds rows * cols bytes.
void quantize_rowwise(const qr_tensor_view& src, float scale, qr_dtype data_dtype,
                      std::uint8_t* out);

// Columnwise data from rowwise data: out[c * rows + r] = in[r * cols + c].
void transpose_bytes(const std::uint8_t* in, std::int64_t rows, std::int64_t cols,
                     std::uint8_t* out);

// Decode one direction into a contiguous [rows, cols] tensor of dst_dtype (f32, bf16, f16).
// `data` is [rows, cols] row-major, or [cols, rows] when `transposed` (the columnwise copy).
void dequantize(const std::uint8_t* data, qr_dtype data_dtype, std::int64_t rows,
                std::int64_t cols, bool transposed, float scale_inv, void* dst,
                qr_dtype dst_dtype);

}  // namespace qrecipe::float8::ref
