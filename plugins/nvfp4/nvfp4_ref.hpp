// CPU reference of the nvfp4 format: the executable specification (docs/numerics.md,
// "nvfp4"). The CUDA kernels (nvfp4_kernels.cu) reproduce its bytes, scales and amax bit for
// bit (test_gpu_parity holds them to it); test_nvfp4.cpp and the conformance suite hold the
// plugin to this file.
//
// Map of this header
//   1. scalar rules (tensor scale, block scale, element encode/decode, the two roundings)
//   2. layouts (data and scale shapes of one direction)
//   3. helpers on host matrices (load a strided source, amax, transpose, Hadamard)
//   4. quantization of one direction's data matrix (1x16 blocks, 16x16 tiles), dequantization
//   5. the whole quantize call (options, amax, both directions), used by nvfp4.cpp
//
// Rules (the scalar rules live in nvfp4_rules.hpp, __host__ __device__ code that the CUDA
// kernels run too; the functions of section 1 below forward to it):
//   S_enc   = scale_from_amax(amax_tensor, 2688, no pow2, eps 0): 2688 / amax (IEEE), capped
//             at FLT_MAX, 1.0 when amax is 0, inf or NaN.     S_dec = 1 / S_enc
//   s       = e4m3(amax_block * (S_enc * fl32(1/6)))        (that multiplication order)
//   enc     = min(1 / (float(s) * S_dec), FLT_MAX)
//   q       = e2m1(x * enc)                                   (RNE, saturating to +-6)
//             or the stochastic rounding of x * enc (round_stochastic below)
//   decode  = (float(q) * float(s)) * S_dec
// A stored block holding a NaN gets scale E4M3 0x7F (NaN) so it, and only it, decodes to
// NaN; its data nibbles are computed as if the NaNs were absent (a NaN element stores 0x7).
// amaxes (tensor and block) ignore NaN, like fmaxf.
// Tiny blocks: when s * S_dec < 1 / FLT_MAX (block amax below about 6 * 2^-128), enc is capped
// at FLT_MAX and the block decodes with up to 100% error, as in TransformerEngine.
//
// Data layout of one direction: a "data matrix" [data_rows, data_cols] of E2M1 codes packed
// two per byte, even column in the low nibble, each row padded to whole bytes (odd data_cols:
// the last high nibble is 0). Blocks of 16 run along data_cols; scale[r][b] (E4M3, row pitch
// scale_cols) belongs to data row r, columns [16b, 16b + 16). Rowwise: the data matrix is the
// source [M, K]. Columnwise: it is the transpose [K, M] (blocks of 16 run down M).
// Scale arrays are [roundup(data_rows, 128), roundup(ceil(data_cols / 16), 4)]; everything
// outside the valid blocks is zero. A partial last block's amax covers its valid elements.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4_rules.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::nvfp4::ref {

inline constexpr std::int64_t kBlockSize = rules::kBlockSize;  // elements per block scale
inline constexpr std::int64_t kScaleRowAlign = 128;  // scale rows padded to the 128x4 swizzle tile
inline constexpr std::int64_t kScaleColAlign = 4;
inline constexpr float kTensorScaleNumerator = rules::kTensorScaleNumerator;  // 448 * 6
inline constexpr std::uint8_t kNanScaleCode = rules::kNanScaleCode;  // marks a block holding NaN

// ---------------------------------------------------------------- 1. scalar rules

// S_enc and S_dec of a direction from its tensor amax.
float encode_scale(float tensor_amax);
float decode_scale(float tensor_amax);  // 1 / encode_scale(tensor_amax)

// E4M3 code of a block scale: e4m3(block_amax * (s_enc * fl32(1/6))).
std::uint8_t block_scale_code(float block_amax, float s_enc);

// enc = min(1 / (float(scale) * s_dec), FLT_MAX): what elements of the block are multiplied by.
float element_encode_factor(std::uint8_t scale_code, float s_dec);

// E2M1 code (sign in bit 3) of v = x * enc, round to nearest even, saturating.
std::uint8_t round_nearest(float v);

// Stochastic rounding of v = x * enc with the 32-bit random word r: with lo < |v| < hi the
// neighbouring E2M1 values, round away from zero iff (r >> 8) * 2^-24 < (|v| - lo) / (hi - lo)
// (FP32); |v| >= 6 (inf included) gives 6, grid values stay, the sign is kept; NaN gives 0x7.
// The words: one Philox4x32-10 call per 4 consecutive elements of a data row (philox.hpp).
std::uint8_t round_stochastic(float v, std::uint32_t r);

// (float(q) * float(scale)) * s_dec; the scale's NaN (0x7FC00000) when scale_code is 0x7F.
float decode_element(std::uint8_t q, std::uint8_t scale_code, float s_dec);

// ---------------------------------------------------------------- 2. layouts

std::int64_t packed_row_bytes(std::int64_t data_cols);  // ceil(data_cols / 2)
std::int64_t scale_rows(std::int64_t data_rows);        // roundup(data_rows, 128)
std::int64_t scale_cols(std::int64_t data_cols);        // roundup(ceil(data_cols / 16), 4)

// ---------------------------------------------------------------- 3. host matrix helpers


// Throws unless src is a well-formed view of an f32/bf16/f16 tensor (any device): what every
// quantize and amax path checks before it looks at the data.
void check_source_view(const qr_tensor_view& src);

// The logical [rows, cols] = [prod(leading dims), last dim] of src (f32/bf16/f16, host memory,
// any strides) as a contiguous FP32 matrix (exact widening).
std::vector<float> load_matrix(const qr_tensor_view& src, std::int64_t& rows, std::int64_t& cols);

// max |x| over n values, NaN ignored; 0 when n == 0.
float amax(const float* x, std::int64_t n);

// out[c][r] = x[r][c]
std::vector<float> transpose(const float* x, std::int64_t rows, std::int64_t cols);

// The columnwise operand under `hadamard`: out[c][r] (shape [cols, rows]) holds the Hadamard
// transform (hadamard.hpp, BF16-rounded) of x's column c, taken over runs of 16 rows.
// rows must be a multiple of 16.
std::vector<float> hadamard_transpose(const float* x, std::int64_t rows, std::int64_t cols);

// ---------------------------------------------------------------- 4. one direction

struct Rounding {
  bool stochastic = false;
  std::uint64_t seed = 0;
  std::uint64_t call_offset = 0;
};

// Buffers of one direction (host memory): data is data_rows * packed_row_bytes(data_cols)
// bytes, scales scale_rows(data_rows) * scale_cols(data_cols) bytes, amax one float.
struct DirectionOut {
  std::uint8_t* data = nullptr;
  std::uint8_t* scales = nullptr;
  float* amax = nullptr;
};

// 1x16 blocks along the rows of the data matrix x [rows, cols]. Stochastic rounding: element
// (r, c) takes word c % 4 of the Philox group sr_group(r, cols, c) (philox.hpp).
void quantize_1d(const float* x, std::int64_t rows, std::int64_t cols, float tensor_amax,
                 const Rounding& rounding, const DirectionOut& out);

// 16x16 tiles of the source x [rows, cols] share one block scale (from the tile's amax). The
// codes are computed once in rowwise order (SR words of the rowwise element (r, c)); the columnwise
// data is their transpose. Scales are stored per 1x16 (rowwise) / 16x1 (columnwise) block as
// in quantize_1d, each holding its tile's scale, so the columnwise scales are the transpose of
// the rowwise ones, except for the NaN mark: 0x7F goes on the stored blocks that hold a NaN
// (the tile row in rowwise, the tile column in columnwise). Either output may be null.
void quantize_2d(const float* x, std::int64_t rows, std::int64_t cols, float tensor_amax,
                 const Rounding& rounding, const DirectionOut* rowwise,
                 const DirectionOut* columnwise);

// Decode one direction into a contiguous logical [rows, cols] tensor of dst_dtype (f32, bf16,
// f16). The data matrix is [rows, cols], or [cols, rows] when `transposed` (columnwise).
void dequantize(const std::uint8_t* data, const std::uint8_t* scales, float tensor_amax,
                std::int64_t rows, std::int64_t cols, bool transposed, void* dst,
                std::int32_t dst_dtype);

// ---------------------------------------------------------------- 5. the whole call

struct Config {
  bool two_d = false;         // 16x16 tiles, columnwise = transpose of rowwise
  bool hadamard = false;      // columnwise operand transformed (BF16 sources only)
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;
};

// Throws for option combinations that are not allowed (hadamard with 2d).
void check_config(const Config& config);

// Throws unless the Hadamard transform can run on src: BF16, M a multiple of 16.
void check_hadamard_source(const qr_tensor_view& src, std::int64_t rows, std::int64_t cols);

// The checks of compute_amax / quantize that read no tensor data (options, source view,
// Hadamard source, caller-reduced amax): the CUDA path runs them too, so both paths refuse
// the same calls with the same messages before any byte is written.
void check_amax_call(const qr_tensor_view& src, const Config& config);

// [rowwise amax, columnwise amax] of src: max |x|, and under hadamard the max over the
// transformed BF16 values (NaN ignored).
std::array<float, 2> compute_amax(const qr_tensor_view& src, const Config& config);

struct Request {
  const float* amax = nullptr;      // [rowwise, columnwise] reduced by the caller, or null
  std::uint64_t call_offset = 0;    // stochastic-rounding call offset
  const DirectionOut* rowwise = nullptr;     // null: not requested
  const DirectionOut* columnwise = nullptr;  // null: not requested
};

// check_amax_call's counterpart for quantize (plus the Hadamard source only when columnwise
// data is requested, and the caller-reduced amax: >= 0, not NaN, equal in both entries
// under 2d).
void check_quantize_call(const qr_tensor_view& src, const Config& config,
                         const Request& request);

// Quantize src into the requested directions (docs/numerics.md, "nvfp4").
void quantize(const qr_tensor_view& src, const Config& config, const Request& request);

}  // namespace qrecipe::nvfp4::ref
