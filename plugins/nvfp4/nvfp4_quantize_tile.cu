// Pass 2 of nvfp4 quantize with per-CTA tiles (nvfp4_kernels.cu has the map of the passes):
//   - 1-D blocks for f32 sources (either rounding) and for stochastic rounding of 16-bit
//     sources: quantize_1d_kernel, the 32 x 32 warp tiles of nvfp4_tile1d.cuh;
//   - 2d or Hadamard: quantize_kernel, one block of 256 threads per 64x64 shared-memory tile
//     (nvfp4_tile64.cuh), both directions from one read of the tile.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11): device helpers (the quantization
// of one 16-element block, packed E2M1 stores), the kernels, then their launchers.
//
// Exactness: as nvfp4_kernels.cu says (every scalar rule is nvfp4_rules.hpp, compiled with
// -fmad=false --ftz=false --prec-div=true; amaxes are exact maxima).
#include <cuda_runtime.h>

#include <cstdint>

#include "hadamard.hpp"
#include "nvfp4_device.cuh"
#include "nvfp4_passes.cuh"
#include "nvfp4_rules.hpp"
#include "nvfp4_tile1d.cuh"
#include "nvfp4_tile64.cuh"
#include "philox.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::nvfp4::cuda {
namespace {

// ---------------------------------------------------------------- device helpers

// Codes of the 16 elements v[j] * enc of one block: elements col .. col + 15 of data row
// `data_row` (rows of data_cols elements; col % 16 == 0, so the block is 4 Philox groups under
// stochastic rounding). Every element is encoded, valid or not: the tile holds +0 past the
// tensor's edge and +0 * enc (enc is positive and finite) encodes to code 0 under both
// roundings, so the padding nibble of an odd row comes out 0 without a per-element test.
// kStochastic is a template argument so the choice of rounding is made once per kernel, not
// per element.
template <bool kStochastic>
__device__ __forceinline__ void encode_block(const float (&v)[kBlock], float enc,
                                             const RandomStream& random, std::int64_t data_row,
                                             std::int64_t data_cols, std::int64_t col,
                                             std::uint8_t (&q)[kBlock]) {
#pragma unroll
  for (int g = 0; g < kBlock / kSrWordsPerCall; ++g) {
    PhiloxWords r{{0u, 0u, 0u, 0u}};
    if constexpr (kStochastic)
      r = sr_group_words(random.seed,
                         sr_group(static_cast<std::uint64_t>(data_row),
                                  static_cast<std::uint64_t>(data_cols),
                                  static_cast<std::uint64_t>(col + kSrWordsPerCall * g)),
                         random.call_offset);
#pragma unroll
    for (int w = 0; w < kSrWordsPerCall; ++w) {
      const int j = kSrWordsPerCall * g + w;
      const float x = v[j] * enc;
      std::uint8_t code;
      if constexpr (kStochastic)
        code = rules::round_stochastic(x, r.w[w]);
      else
        code = static_cast<std::uint8_t>(num::fast::f32_to_e2m1(x));  // == rules::round_nearest
      q[j] = static_cast<std::uint8_t>(code & 0xFu);
    }
  }
}

// One 1-D block of a direction: its scale from its own amax, then its codes. Returns the
// stored scale byte (0x7F when the block holds a NaN).
template <bool kStochastic>
__device__ __forceinline__ std::uint8_t quantize_block(const float (&v)[kBlock], float s_enc,
                                                       float s_dec, const RandomStream& random,
                                                       std::int64_t data_row,
                                                       std::int64_t data_cols, std::int64_t col,
                                                       std::uint8_t (&q)[kBlock]) {
  const BlockStats s = block_stats(v);
  const std::uint8_t code = block_scale_code(s.amax, s_enc);
  encode_block<kStochastic>(v, rules::element_encode_factor(code, s_dec), random, data_row,
                            data_cols, col, q);
  return s.has_nan ? rules::kNanScaleCode : code;
}

// Stores the codes of one block, two per byte with the even index in the low nibble, at dst
// (the block's first byte: blocks start at even elements). `valid` codes: ceil(valid / 2)
// bytes. `vector_ok`: dst is 8-byte aligned, so a whole block goes out as one 8-byte store.
__device__ __forceinline__ void store_packed(std::uint8_t* dst, const std::uint8_t (&q)[kBlock],
                                             int valid, bool vector_ok) {
  std::uint8_t bytes[kBlock / 2];
#pragma unroll
  for (int k = 0; k < kBlock / 2; ++k)
    bytes[k] = static_cast<std::uint8_t>(q[2 * k] | (q[2 * k + 1] << 4));
  if (vector_ok && valid == kBlock) {
    uint2 words;
    words.x = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<unsigned>(bytes[3]) << 24);
    words.y = bytes[4] | (bytes[5] << 8) | (bytes[6] << 16) | (static_cast<unsigned>(bytes[7]) << 24);
    *reinterpret_cast<uint2*>(dst) = words;
    return;
  }
  const int n = (valid + 1) / 2;
#pragma unroll
  for (int k = 0; k < kBlock / 2; ++k)  // constant indices keep `bytes` in registers
    if (k < n) dst[k] = bytes[k];
}

// ---------------------------------------------------------------- kernels

template <class In, bool kStochastic>
__global__ void __launch_bounds__(Tile::kThreads) quantize_kernel(const QuantizeParams p) {
  __shared__ TileValues tile;
  // 2d only: the codes of the tile (rowwise order) and the scale of each 16x16 tile.
  __shared__ alignas(4) std::uint8_t codes[Tile::kRows][Tile::kCodePitch];
  __shared__ float row_block_amax[Tile::kRows][Tile::kRowBlocks];
  __shared__ std::uint8_t tile_code[Tile::kColBlocks][Tile::kRowBlocks];

  const bool want_row = p.row_data != nullptr, want_col = p.col_data != nullptr;
  const std::int64_t row0 = (blockIdx.x / p.tiles_per_row) * Tile::kRows;
  const std::int64_t col0 = (blockIdx.x % p.tiles_per_row) * Tile::kCols;
  load_tile<In>(static_cast<const typename In::Storage*>(p.src), p.rows, p.cols, row0, col0,
                p.src_aligned, tile);
  __syncthreads();

  // Rowwise side: thread t owns the 1x16 block (tile row r, block b).
  {
    const int r = static_cast<int>(threadIdx.x) / Tile::kRowBlocks;
    const int b = static_cast<int>(threadIdx.x) % Tile::kRowBlocks;
    const std::int64_t row = row0 + r, col = col0 + b * kBlock;
    const int valid = row < p.rows ? valid_in_run(col, p.cols, kBlock) : 0;
    float v[kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) v[j] = tile[r][b * kBlock + j];
    std::uint8_t q[kBlock];
    if (p.two_d) {
      // One tensor amax for both directions (equal buffers; rowwise when requested).
      const float s_enc = rules::encode_scale(want_row ? *p.row_amax : *p.col_amax);
      const float s_dec = 1.0f / s_enc;
      const BlockStats s = block_stats(v);  // padding reads 0: no effect on amax or NaN
      row_block_amax[r][b] = s.amax;
      __syncthreads();
      const int tile_r0 = (r / kBlock) * kBlock;
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < kBlock; ++k) amax = fmaxf(amax, row_block_amax[tile_r0 + k][b]);
      const std::uint8_t code = block_scale_code(amax, s_enc);
      if (r % kBlock == 0) tile_code[r / kBlock][b] = code;
      encode_block<kStochastic>(v, rules::element_encode_factor(code, s_dec), p.random, row,
                                p.cols, col, q);
#pragma unroll
      for (int w = 0; w < kBlock / 4; ++w)
        *reinterpret_cast<std::uint32_t*>(&codes[r][b * kBlock + 4 * w]) =
            q[4 * w] | (q[4 * w + 1] << 8) | (q[4 * w + 2] << 16) |
            (static_cast<std::uint32_t>(q[4 * w + 3]) << 24);
      if (want_row && valid > 0) {
        store_packed(p.row_data + row * p.row_pitch + col / 2, q, valid, p.row_vector_ok);
        p.row_scales[row * p.row_spitch + col / kBlock] = s.has_nan ? rules::kNanScaleCode : code;
      }
      __syncthreads();  // codes and tile_code are read by the columnwise side
    } else if (want_row && valid > 0) {
      const float s_enc = rules::encode_scale(*p.row_amax);
      const float s_dec = 1.0f / s_enc;
      const std::uint8_t scale =
          quantize_block<kStochastic>(v, s_enc, s_dec, p.random, row, p.cols, col, q);
      store_packed(p.row_data + row * p.row_pitch + col / 2, q, valid, p.row_vector_ok);
      p.row_scales[row * p.row_spitch + col / kBlock] = scale;
    }
  }
  if (!want_col) return;

  // Columnwise side: thread t owns the 16x1 block (tile column c, block i), which is data
  // row col0 + c, elements row0 + 16i .. of the transposed [cols, rows] output.
  const int c = static_cast<int>(threadIdx.x) / Tile::kColBlocks;
  const int i = static_cast<int>(threadIdx.x) % Tile::kColBlocks;
  const std::int64_t col = col0 + c, row = row0 + i * kBlock;
  const int valid = col < p.cols ? valid_in_run(row, p.rows, kBlock) : 0;
  if (valid == 0) return;
  float v[kBlock];
#pragma unroll
  for (int j = 0; j < kBlock; ++j) v[j] = tile[i * kBlock + j][c];
  std::uint8_t q[kBlock];
  std::uint8_t scale;
  if (p.two_d) {
    // The codes are the rowwise ones, transposed; only the NaN mark is this block's own.
#pragma unroll
    for (int j = 0; j < kBlock; ++j) q[j] = codes[i * kBlock + j][c];  // 0 past the edge
    scale = block_stats(v).has_nan ? rules::kNanScaleCode : tile_code[i][c / kBlock];
  } else {
    if (p.hadamard) hadamard16_bf16(v);  // a whole run: rows % 16 == 0 was checked
    const float s_enc = rules::encode_scale(*p.col_amax);
    const float s_dec = 1.0f / s_enc;
    // Data row `col` of the transposed [cols, rows] output, elements row .. row + 15.
    scale = quantize_block<kStochastic>(v, s_enc, s_dec, p.random, col, p.rows, row, q);
  }
  store_packed(p.col_data + col * p.col_pitch + row / 2, q, valid, p.col_vector_ok);
  p.col_scales[col * p.col_spitch + row / kBlock] = scale;
}

// Quantize, 1-D blocks (no 2d, no Hadamard), f32 sources and stochastic rounding: one CTA per
// tile; the tile code is nvfp4_device.cuh's quantize_1d_tile (shared with the grouped kernel
// of nvfp4_grouped_kernels.cu).
template <class In, bool kStochastic>
__global__ void __launch_bounds__(Tile1d<In>::kThreads, Tile1d<In>::kMinBlocksPerSM)
    quantize_1d_kernel(const QuantizeParams p) {
  quantize_1d_tile<In, kStochastic>(p, blockIdx.x);
}

// ---------------------------------------------------------------- launchers

template <class In>
void launch_quantize(const QuantizeParams& p, bool stochastic, unsigned blocks,
                     cudaStream_t stream) {
  if (stochastic)
    quantize_kernel<In, true><<<blocks, Tile::kThreads, 0, stream>>>(p);
  else
    quantize_kernel<In, false><<<blocks, Tile::kThreads, 0, stream>>>(p);
  QR_CUDA_CHECK_LAUNCH("quantize_kernel");
}

template <class In, bool kStochastic>
void launch_quantize_1d(QuantizeParams p, cudaStream_t stream) {
  using T = Tile1d<In>;
  p.tiles_per_row = ceil_div(p.cols, T::kCols);
  const std::int64_t tiles = ceil_div(p.rows, T::kRows) * p.tiles_per_row;
  QR_CHECK(tiles >= 1 && tiles <= INT_MAX, "nvfp4 CUDA quantize: ", p.rows, " x ", p.cols,
           " needs ", tiles, " tiles of ", T::kRows, "x", T::kCols, "; expected 1..", INT_MAX,
           " (split the tensor)");
  const auto blocks = static_cast<unsigned>(tiles);
  quantize_1d_kernel<In, kStochastic><<<blocks, T::kThreads, 0, stream>>>(p);
  QR_CUDA_CHECK_LAUNCH("quantize_1d_kernel");
}

}  // namespace

void quantize_1d(const QuantizeParams& p, qr_dtype src_dtype, bool stochastic,
                 cudaStream_t stream) {
  if (src_dtype == QR_DTYPE_F32) {
    if (stochastic) launch_quantize_1d<F32In, true>(p, stream);
    else launch_quantize_1d<F32In, false>(p, stream);
    return;
  }
  // 16-bit sources with round to nearest take quantize_16bit; only stochastic rounding of
  // them comes here (the random words dominate: warp tiles).
  QR_CHECK_CODE(stochastic, QR_STATUS_INTERNAL, "nvfp4 CUDA quantize_1d: a 16-bit source with "
                "round to nearest belongs to quantize_16bit");
  if (src_dtype == QR_DTYPE_BF16) launch_quantize_1d<BF16In, true>(p, stream);
  else launch_quantize_1d<F16In, true>(p, stream);
}

void quantize_tile(QuantizeParams p, qr_dtype src_dtype, bool stochastic, cudaStream_t stream) {
  const unsigned blocks = tile_grid(p.rows, p.cols, p.tiles_per_row, "quantize");
  switch (src_dtype) {
    case QR_DTYPE_F32: launch_quantize<F32In>(p, stochastic, blocks, stream); break;
    case QR_DTYPE_BF16: launch_quantize<BF16In>(p, stochastic, blocks, stream); break;
    default: launch_quantize<F16In>(p, stochastic, blocks, stream); break;
  }
}

}  // namespace qrecipe::nvfp4::cuda
