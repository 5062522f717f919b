// CPU reference of the mxfp8 format: the executable specification (docs/numerics.md,
// "mxfp8"; TransformerEngine's MXFP8 "RCEIL" rule). The CUDA kernels must produce the same
// data and scale bytes bit for bit; test_mxfp8.cpp and the conformance suite hold both to it.
//
// Pure functions on host memory; nothing here allocates or keeps state.
//
//   block       32 consecutive elements of a row (rowwise, along K = cols) or of a column
//               (columnwise, 32 rows down one column); a partial last block holds the valid
//               elements only
//   amax        max |x| over the valid elements of the block, NaN ignored (like fmaxf), so a
//               block of only NaN (or zeros) has amax 0
//   exponent    e = num::e8m0_from_f32_round_up(amax * rcp), rcp = fl32(1 / fmax) computed as a
//               float (E4M3: 1.0f/448.0f, E5M2: 1.0f/57344.0f). A multiply by the rounded
//               reciprocal, never a division. inf amax gives 0xFE, amax 0 gives 0x00.
//   element     q = sat_rne(fp32(x) * m), m = num::e8m0_encode_factor(e) = 2^(127-e)
//               (e = 254: 2^-127; e = 255: NaN). NaN stays NaN (0x7F); +-inf saturates to +-max.
//   decode      fp32(q) * num::e8m0_to_f32(e) = q * 2^(e-127), then rounded to the output dtype
//
// Layouts for a logical [M, K] tensor (compact, row-major, uint8 codes):
//   rowwise     data [M, K]; scale [roundup(M, 128), roundup(ceil(K/32), 4)],
//               scale[r][j] is the block of row r holding cols 32j .. 32j+31
//   columnwise  data [M, K] (not transposed); scale [roundup(ceil(M/32), 4), roundup(K, 128)],
//               scale[i][c] is the block of column c holding rows 32i .. 32i+31
// Padding entries of the scale arrays are never written: the engine zero-fills the buffers,
// so padding stays 0x00 across requantization. Both directions are quantized independently
// from the source (no quantize-dequantize-quantize).
//
// Sources: f32, bf16 or f16 views of any rank with any strides; the logical 2-D tensor is
// [prod(leading dims), last dim]. Empty tensors write nothing.
#pragma once

#include <cstdint>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::mxfp8::ref {

// Elements per block (the MX specification's k).
inline constexpr std::int64_t kBlockSize = 32;
// cuBLASLt's scale tiles are 128 x 4 bytes: the scale arrays are padded to whole tiles so the
// swizzle a GEMM applies later never reads past the buffer.
inline constexpr std::int64_t kScaleTileLong = 128;
inline constexpr std::int64_t kScaleTileShort = 4;

struct ScaleShape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// Padded scale array shapes of each direction for a logical [rows, cols] tensor.
ScaleShape rowwise_scale_shape(std::int64_t rows, std::int64_t cols);
ScaleShape columnwise_scale_shape(std::int64_t rows, std::int64_t cols);


// Throws unless data_dtype is E4M3 or E5M2.
void check_data_dtype(std::int32_t data_dtype);

// fl32(1 / fmax): 1.0f/448.0f (E4M3) or 1.0f/57344.0f (E5M2), rounded to FP32.
float reciprocal_max(qr_dtype data_dtype);

// The E8M0 block exponent for a block amax: e8m0_from_f32_round_up(amax * reciprocal_max).
std::uint8_t block_exponent(float amax, qr_dtype data_dtype);

// One element of a block with exponent e: sat_rne(x * 2^(127-e)); and its decoded value.
std::uint8_t encode(float x, std::uint8_t e, qr_dtype data_dtype);
float decode(std::uint8_t q, std::uint8_t e, qr_dtype data_dtype);

// max |x| over every element of src (host memory); NaN ignored; 0 if empty.
float amax(const qr_tensor_view& src);

// Quantizes one direction of src: data is [rows, cols] row-major (rows * cols bytes); scale is
// the padded scale array of that direction with `scale_row_stride` bytes per row (the padded
// column count). Only valid entries of `scale` are written.
void quantize(const qr_tensor_view& src, qr_direction direction, qr_dtype data_dtype,
              std::uint8_t* data, std::uint8_t* scale, std::int64_t scale_row_stride);

// Decodes one direction into a contiguous [rows, cols] tensor of dst_dtype (f32 or bf16).
void dequantize(const std::uint8_t* data, const std::uint8_t* scale,
                std::int64_t scale_row_stride, qr_dtype data_dtype, qr_direction direction,
                std::int64_t rows, std::int64_t cols, void* dst, qr_dtype dst_dtype);

}  // namespace qrecipe::mxfp8::ref
