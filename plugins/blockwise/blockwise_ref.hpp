// CPU reference of the blockwise format (DeepSeek-style FP8 E4M3 with one FP32 scale per
// 1x128 block or 128x128 tile): the executable specification (docs/numerics.md,
// "blockwise"). blockwise_kernels.cu produces the same bytes and scale_inv bit for bit;
// test_blockwise.cpp, the conformance suite and tests/gpu/test_gpu_parity.cpp hold both to it.
//
// Pure functions on host memory; nothing here allocates device memory or keeps state.
//
// Numerics, for a logical [M, K] tensor x (leading dims flattened):
//   block amax   = max |x| over the VALID elements of the block (a partial last block covers
//                  only what exists), NaN ignored like fmaxf; 0 for an all-zero block
//   scale        = qrecipe::scale_from_amax(amax, 448, pow2_scales, amax_epsilon,
//                                           value_for_inf = largest finite of the INPUT dtype:
//                                           FLT_MAX for f32, 0x7F7F (3.3895314e38) for bf16,
//                                           65504 for f16)
//                  so amax 0 or inf -> 1.0, and pow2 rounds the scale down to 2^k
//   scale_inv    = 1 / scale                             (IEEE FP32 division)
//   q            = num::f32_to_e4m3(fp32(x) * scale)     (RNE, saturating to +-448, NaN 0x7F)
//   dequantized  = e4m3_to_f32(q) * scale_inv, then rounded to the output dtype (a NaN code
//                  decodes to 0x7FC00000 without the multiply, like float8)
//
// Blocks:
//   1x128   rowwise: 128 consecutive elements of a row. columnwise: 128 consecutive elements
//           down a column, quantized from the source independently of the rowwise copy.
//   128x128 one scale per 128x128 tile; the columnwise copy is exactly the transpose of the
//           rowwise bytes with the transposed scale grid (same numbers, never re-quantized).
//
// GEMM-ready layouts (scale_mode QR_SCALE_BLOCK, scale dtype F32, no amax). "scale_transposed"
// always speaks about the block grid of the LOGICAL [M, K] tensor: 0 means
// scale_inv[a][b] holds logical block (a, b), 1 means scale_inv[b][a] holds block (a, b).
//   1x128   rowwise    data [M, K]         scales [ceil(K/128), roundup(M, 4)]   transposed 1
//                      entry [j][i] = block (row i, column block j)
//   1x128   columnwise data [K, M] (transposed)
//                      scales [ceil(M/128), roundup(K, 4)]                    transposed 0
//                      entry [j][k] = block (row block j, column k)
//   128x128 rowwise    data [M, K]   scales [ceil(M/128), roundup(ceil(K/128), 4)]  transposed 0
//   128x128 columnwise data [K, M]   scales [ceil(K/128), roundup(ceil(M/128), 4)]  transposed 1
// Only the valid scale entries are written: padding keeps the zeros the engine allocated.
// Note the 1x128 columnwise scale array equals the rowwise scale array of x^T quantized
// rowwise (its blocks are rows of x^T), byte for byte, padding included.
#pragma once

#include <cstdint>
#include <vector>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::blockwise::ref {

inline constexpr std::int64_t kBlock = 128;  // edge of a block / tile
inline constexpr std::int64_t kScalePad = 4; // inner scale dimension is padded to a multiple of 4
inline constexpr float kE4M3Max = 448.0f;

enum class BlockShape { k1x128, k128x128 };

const char* block_shape_name(BlockShape shape);  // "1x128" or "128x128"

struct Params {
  BlockShape block = BlockShape::k1x128;
  bool pow2_scales = true;
  float amax_epsilon = 0.0f;
};


// Largest finite value of the source dtype (f32, bf16, f16): what an infinite scale becomes.
float value_for_inf(qr_dtype src_dtype);

// The scale of one block from its amax (rules above).
float block_scale(float amax, const Params& params, qr_dtype src_dtype);

// Layout of one direction for a logical [rows, cols] tensor (table above).
qr_direction_layout layout(std::int64_t rows, std::int64_t cols, BlockShape block,
                           qr_direction direction);

// The logical [rows, cols] tensor of a host f32/bf16/f16 view of any rank and strides, widened
// exactly to FP32, row-major. Throws for other dtypes or device memory.
std::vector<float> load_f32(const qr_tensor_view& src);

// max |x| over the whole tensor, NaN ignored; 0 when empty.
float tensor_amax(const std::vector<float>& x);

// Quantize one direction of x ([rows, cols] row-major FP32 that came from `src_dtype`) into
// `data` and `scale_inv`, laid out as layout(rows, cols, params.block, direction) says.
// Writes only valid entries (padding untouched).
void quantize(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
              const Params& params, qr_dtype src_dtype, qr_direction direction,
              std::uint8_t* data, float* scale_inv);

// Decode one direction into a contiguous [rows, cols] tensor of dst_dtype (f32, bf16, f16).
void dequantize(const std::uint8_t* data, const float* scale_inv, std::int64_t rows,
                std::int64_t cols, BlockShape block, qr_direction direction, void* dst,
                qr_dtype dst_dtype);

}  // namespace qrecipe::blockwise::ref
