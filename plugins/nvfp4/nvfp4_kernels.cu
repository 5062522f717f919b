// CUDA kernels of the nvfp4 format, bit-exact with nvfp4_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, input element traits
//   2. device helpers: 16-byte run loads, the 64x64 shared-memory tile, the quantization of
//      one 16-element block, packed E2M1 stores, block max, atomic max of a non-negative float
//   3. kernels: amax (plain and Hadamard), quantize (both directions per tile; 1-D warp tiles;
//      1-D 16-bit sources with round to nearest), dequantize
//   4. launchers (grid arithmetic, dtype dispatch) and the entries of nvfp4_kernels.hpp
//
// Passes of one quantize call (M x K source, DESIGN.md section 7 "nvfp4"):
//   pass 1, the tensor amax (skipped when the caller passes a reduced amax; both amax buffers
//   are zeroed by one launch first):
//     - plain: grid-stride 16-byte loads, max |x| into every requested direction's amax
//       (rowwise and columnwise amax are equal without Hadamard, and under 2d);
//     - Hadamard with columnwise requested: one block per 64x64 tile computes max |x| and
//       the max over the transformed BF16 columns from the same read of the tile.
//   pass 2, 1-D blocks (no 2d, no Hadamard: the common case):
//     - bf16 / f16 source, round to nearest (the hot path): quantize_16bit_kernel, a
//       persistent grid over 64 x 128 tiles, counted in instructions per element (see above
//       it): packed 16-bit amax, table-driven encode factors, the byte-packing E2M1 encoder
//       num::fast::e2m1_magnitude_byte_below7, staged columnwise stores;
//     - f32 sources and stochastic rounding: quantize_1d_kernel, 32 x 32 warp tiles straight
//       from registers (see above it).
//     The E2M1 encoders and the block scale's hardware E4M3 conversion are proven equal to
//     the references over all 2^32 inputs (test_gpu_conversions).
//   pass 2 under 2d or Hadamard, quantize_kernel (the same fast conversions; instantiated per
//     source dtype and per rounding, so round-to-nearest carries no stochastic-rounding code):
//     one block of 256 threads per 64x64 tile. The tile is loaded once into shared memory as
//     FP32 (16-byte loads); then each thread quantizes one 1x16 rowwise block (64 rows x 4
//     blocks = 256) and one 16x1 columnwise block (64 columns x 4 blocks = 256) of that
//     tile, so the source is read once for both directions. Under Hadamard the
//     16x1 block is exactly one transform run (M % 16 == 0): the thread transforms it in
//     registers. Under 2d the rowwise threads also publish their block amax; each 16x16 tile's
//     scale is the max of its 16 row blocks, the codes are computed once (rowwise order, as
//     the reference) and parked in shared memory, and the columnwise threads store their
//     transpose.
//   Bytes moved for a bf16 source with both directions: pass 1 reads 2MK, pass 2 reads 2MK
//   and writes MK/2 + MK/2 data and 2 * MK/16 scales: 5.125 MK bytes (3.125 MK with a
//   caller-reduced amax); f32: 9.125 MK (5.125 MK).
//
// Exactness: every scalar rule is nvfp4_rules.hpp, the transform hadamard.hpp and the random
// words philox.hpp, all __host__ __device__ code the reference runs too; the plugin is
// compiled with -fmad=false --ftz=false --prec-div=true, so the device performs the same IEEE
// operations in the same order. Amaxes are exact maxima, so reduction order does not matter.
// NaN bit patterns never reach a stored byte through arithmetic (rules::decode_element).
#include "nvfp4_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "hadamard.hpp"
#include "nvfp4_device.cuh"
#include "nvfp4_rules.hpp"
#include "philox.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

constexpr const char* kFormat = "nvfp4";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers (qrecipe/cuda_sdk.cuh).
using sdk::cuda::DeviceGuard;
using sdk::cuda::BF16In;
using sdk::cuda::F16In;
using sdk::cuda::F32In;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::block_max;
using sdk::cuda::is_aligned;
using sdk::cuda::kRunLength;
using sdk::cuda::load_run;  // runs of kRunLength: 16 bytes, alignas(16)
using sdk::cuda::valid_in_run;

// ---------------------------------------------------------------- 2. device helpers

static_assert(kBlock == kHadamardSize, "a Hadamard run must be exactly one columnwise block");
static_assert(kBlock % 2 == 0, "blocks start on whole bytes of packed E2M1");

// The shared-memory tile of both kernels that work per tile (quantize, Hadamard amax).
struct Tile {
  static constexpr int kRows = 64;
  static constexpr int kCols = 64;
  static constexpr int kThreads = 256;
  static constexpr int kRowBlocks = kCols / kBlock;  // 1x16 blocks across a tile row: 4
  static constexpr int kColBlocks = kRows / kBlock;  // 16x1 blocks down a tile column: 4
  // FP32 rows padded by one word: a warp reading 8 rows x 4 blocks (rowwise) or 8 columns x
  // 4 blocks (columnwise) hits each bank at most twice.
  static constexpr int kPitch = kCols + 1;
  // 2d codes, one byte per element; rows stay 4-byte aligned for the word stores.
  static constexpr int kCodePitch = kCols + 4;
  static_assert(kRows * kRowBlocks == kThreads, "one rowwise block per thread");
  static_assert(kCols * kColBlocks == kThreads, "one columnwise block per thread");
  static_assert(kRows % kBlock == 0 && kCols % kBlock == 0, "tiles hold whole 16x16 tiles");
  static_assert(kCodePitch % 4 == 0, "code rows must stay 4-byte aligned");
};

// How the threads of a block load a tile: runs of kRun along rows, kPasses passes.
template <class In>
struct TileLoad {
  static constexpr int kRun = kRunLength<In>;                           // f32: 4, 16-bit: 8
  static constexpr int kRunsPerRow = Tile::kCols / kRun;                // 16 or 8
  static constexpr int kRowsPerPass = Tile::kThreads / kRunsPerRow;     // 16 or 32
  static constexpr int kPasses = Tile::kRows / kRowsPerPass;            // 4 or 2
  static_assert(Tile::kCols % kRun == 0, "tile rows hold whole runs");
  static_assert(Tile::kThreads % kRunsPerRow == 0 && Tile::kRows % kRowsPerPass == 0,
                "the passes cover the tile exactly");
};

using TileValues = float[Tile::kRows][Tile::kPitch];

// Loads the tile at (row0, col0) of src [rows, cols] into `tile` as FP32, 0 outside the
// tensor (0 changes no amax and encodes to code 0, which is never stored anyway). Returns this
// thread's max |x| over what it loaded (NaN ignored). The caller synchronizes afterwards.
template <class In>
__device__ __forceinline__ float load_tile(const typename In::Storage* src, std::int64_t rows,
                                           std::int64_t cols, std::int64_t row0,
                                           std::int64_t col0, bool src_aligned,
                                           TileValues& tile) {
  using L = TileLoad<In>;
  constexpr int N = L::kRun;
  const int run_col = static_cast<int>(threadIdx.x % L::kRunsPerRow) * N;
  const int valid_cols = valid_in_run(col0 + run_col, cols, N);
  float running = 0.0f;
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass) {
    const int r = static_cast<int>(threadIdx.x / L::kRunsPerRow) + pass * L::kRowsPerPass;
    float x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = 0.0f;
    if (row0 + r < rows && valid_cols > 0)
      load_run<In, N>(src, (row0 + r) * cols + col0 + run_col, valid_cols,
                      src_aligned && valid_cols == N, x);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      tile[r][run_col + k] = x[k];
      running = fmaxf(running, num::abs_f(x[k]));  // fmaxf ignores NaN, like the reference
    }
  }
  return running;
}

// max |v| over a block and whether it holds a NaN (the reference's BlockAmax).
struct BlockStats {
  float amax = 0.0f;
  bool has_nan = false;
};

__device__ __forceinline__ BlockStats block_stats(const float (&v)[kBlock]) {
  BlockStats s;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) {
    if (num::is_nan(v[j])) s.has_nan = true;
    else s.amax = fmaxf(s.amax, num::abs_f(v[j]));
  }
  return s;
}

// Codes of the 16 elements v[j] * enc, element j with stochastic-rounding index
// first_index + j. Every element is encoded, valid or not: the tile holds +0 past the tensor's
// edge and +0 * enc (enc is positive and finite) encodes to code 0 under both roundings, so
// the padding nibble of an odd row comes out 0 without a per-element test. kStochastic is a
// template argument so the choice of rounding is made once per kernel, not per element.
template <bool kStochastic>
__device__ __forceinline__ void encode_block(const float (&v)[kBlock], float enc,
                                             const RandomStream& random,
                                             std::uint64_t first_index,
                                             std::uint8_t (&q)[kBlock]) {
#pragma unroll
  for (int j = 0; j < kBlock; ++j) {
    const float x = v[j] * enc;
    std::uint8_t code;
    if constexpr (kStochastic)
      code = rules::round_stochastic(
          x, sr_random_word(random.seed, first_index + j, random.call_offset));
    else
      code = static_cast<std::uint8_t>(num::fast::f32_to_e2m1(x));  // == rules::round_nearest
    q[j] = static_cast<std::uint8_t>(code & 0xFu);
  }
}

// One 1-D block of a direction: its scale from its own amax, then its codes. Returns the
// stored scale byte (0x7F when the block holds a NaN).
template <bool kStochastic>
__device__ __forceinline__ std::uint8_t quantize_block(const float (&v)[kBlock], float s_enc,
                                                       float s_dec, const RandomStream& random,
                                                       std::uint64_t first_index,
                                                       std::uint8_t (&q)[kBlock]) {
  const BlockStats s = block_stats(v);
  const std::uint8_t code = block_scale_code(s.amax, s_enc);
  encode_block<kStochastic>(v, rules::element_encode_factor(code, s_dec), random, first_index,
                            q);
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

// ---------------------------------------------------------------- 3. kernels

// Plain amax: grid-stride over 16-byte runs, kAmaxUnroll independent loads in flight per
// thread, a block max, then one atomic per block into each non-null output. 16-bit runs stay
// packed until the loads of a round are all issued (4 registers a run instead of 8: more
// threads resident), and the grid is one wave of resident blocks (launch_amax), so every
// thread has the same share and no partial last wave leaves SMs idle. H100, bf16 8192x8192:
// 4 packed runs a thread (31 registers, 8 blocks an SM) did as well as 8 (99 registers, or
// 56 capped at 4 blocks an SM); 8 decoded runs a thread (77 registers) and a grid of 8 blocks
// an SM (2.7 waves at 3 resident) ran the pass at 65% of DRAM peak.
constexpr int kAmaxThreads = 256;
constexpr int kAmaxUnroll = 4;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const typename In::Storage* src, std::int64_t numel, bool src_aligned,
                float* out0, float* out1) {
  constexpr int N = kRunLength<In>;
  const std::int64_t runs = (numel + N - 1) / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  float running = 0.0f;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       base < runs; base += stride * kAmaxUnroll) {
    if constexpr (sizeof(typename In::Storage) == 2) {
      static_assert(N == 8, "a 16-byte run of 16-bit elements is one Raw8");
      sdk::cuda::Raw8<In> raw[kAmaxUnroll];
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        const std::int64_t offset = (base + u * stride) * N;
        const int valid = valid_in_run(offset, numel, N);  // the rest read as +0
        sdk::cuda::load_raw8<In>(src, offset, valid, src_aligned && valid == N, raw[u]);
      }
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        float x[N];
        sdk::cuda::decode_raw8<In>(raw[u], x);
#pragma unroll
        for (int k = 0; k < N; ++k) running = fmaxf(running, num::abs_f(x[k]));  // NaN ignored
      }
    } else {
      float x[kAmaxUnroll][N];
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        const std::int64_t offset = (base + u * stride) * N;
        const int valid = valid_in_run(offset, numel, N);
        load_run<In, N>(src, offset, valid, src_aligned && valid == N, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u)
#pragma unroll
        for (int k = 0; k < N; ++k) running = fmaxf(running, num::abs_f(x[u][k]));
    }
  }
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) {
    if (out0) atomic_max_nonnegative(out0, block);
    if (out1) atomic_max_nonnegative(out1, block);
  }
}

// Hadamard amax (bf16 source, rows % 16 == 0): one block per 64x64 tile. max |x| goes into
// `plain` (nullable), the max over the transformed values of every 16x1 run into
// `transformed`. Thread t transforms the run (column t / 4, rows 16 * (t % 4) ..) of the tile.
struct HadamardAmaxParams {
  const std::uint16_t* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / Tile::kCols)
  bool src_aligned;            // cols % 8 == 0 and src 16-byte aligned
  float* plain;
  float* transformed;
};

__global__ void __launch_bounds__(Tile::kThreads)
    hadamard_amax_kernel(const HadamardAmaxParams p) {
  __shared__ TileValues tile;
  const std::int64_t row0 = (blockIdx.x / p.tiles_per_row) * Tile::kRows;
  const std::int64_t col0 = (blockIdx.x % p.tiles_per_row) * Tile::kCols;
  const float plain = load_tile<BF16In>(p.src, p.rows, p.cols, row0, col0, p.src_aligned, tile);
  __syncthreads();

  const int c = static_cast<int>(threadIdx.x) / Tile::kColBlocks;
  const int i = static_cast<int>(threadIdx.x) % Tile::kColBlocks;
  float transformed = 0.0f;
  if (col0 + c < p.cols && row0 + i * kBlock < p.rows) {  // whole runs: rows % 16 == 0
    float v[kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) v[j] = tile[i * kBlock + j][c];
    hadamard16_bf16(v);
    transformed = block_stats(v).amax;
  }
  const float block_plain = block_max<Tile::kThreads>(plain);
  const float block_transformed = block_max<Tile::kThreads>(transformed);
  if (threadIdx.x == 0) {
    if (p.plain && block_plain > 0.0f) atomic_max_nonnegative(p.plain, block_plain);
    if (block_transformed > 0.0f) atomic_max_nonnegative(p.transformed, block_transformed);
  }
}

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
    const auto first_index = static_cast<std::uint64_t>(row * p.cols + col);
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
      encode_block<kStochastic>(v, rules::element_encode_factor(code, s_dec), p.random,
                                first_index, q);
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
          quantize_block<kStochastic>(v, s_enc, s_dec, p.random, first_index, q);
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
    scale = quantize_block<kStochastic>(v, s_enc, s_dec, p.random,
                                        static_cast<std::uint64_t>(col * p.rows + row), q);
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

// ---------------------------------------------------------------- 16-bit sources, nearest

// Quantize, 1-D blocks, bf16/f16 source, round to nearest: the hot path. The cast pass is
// bound by instructions, not bytes (the previous warp-tile kernel issued about 52 a source
// element for both directions), so this kernel is written against that count:
//   - amax from the packed 16-bit words: |x| is a mask of the sign bits and the max of two
//     pairs one 16x2 integer max (non-negative floats order as their bits); a NaN shows as a
//     magnitude above inf, so the NaN test of a lane's 64 elements is one compare;
//   - block scales: the hardware E4M3 pair conversion of amax * (S_enc * fl32(1/6)), and
//     enc = min(1 / (float(s) * S_dec), FLT_MAX) read from a per-CTA table of the 128
//     non-negative E4M3 codes (filled with rules::element_encode_factor itself);
//   - elements: num::fast::e2m1_magnitude_byte_below7(|x| * enc), 5 operations, valid while
//     |x| * enc < 7; a warp takes that path only when amax * enc < 7 for every block it holds
//     (so for every element), else the same path with min(|x| * enc, 6) first. Two codes make
//     a byte with one shift-add, four bytes a word with PRMTs, and the 8 signs of a word come
//     from the source words with 4 sign-replicating PRMTs and 2 masks;
//   - a warp whose elements hold a NaN, or that reaches past the tensor's edge, takes a
//     per-element path (quantize_lane_exact: the NaN-ignoring amax, the NaN mark on the
//     scale, num::fast::f32_to_e2m1, partial rows and columns).
// Layout: a CTA of 4 warps loops over 64 x 128 tiles (a persistent grid of resident CTAs),
// taking them from the END of the tensor (the amax pass reads it from the start, so the first
// tiles are still in L2), and copies its next tile into shared memory (cp.async, double
// buffered) before it encodes the current one. Warp w holds tile rows 16w .. 16w + 15; lane
// (cg = lane % 16, rh = lane / 16) holds rows 8 rh .. 8 rh + 7 of those and columns
// 8 cg .. 8 cg + 7 (one 16-byte load a row):
//   rowwise     a 1x16 block is one row of the lanes cg and cg ^ 1: its amax is one shuffle;
//               the even lane works out the scales of rows 0-3, the odd lane of rows 4-7, and
//               they swap encode factors; a row's 8 codes are one 4-byte store (a warp
//               stores two rows x 64 bytes at a time)
//   columnwise  a 16x1 block is one column of the lanes rh = 0, 1 (lane ^ 16), split the same
//               way (rh = 0: columns 0-3); a lane's 8 codes of a column are a word, staged in
//               shared memory so that each tile column's 32 bytes go out as two 16-byte stores
// Scale bytes are staged too: 8 bytes a tile row (rowwise), 4 bytes a tile column.

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// PTX prmt.b32 in its default mode: selector nibble n picks byte n of the result among the 8
// bytes of {b, a} (a = bytes 0-3); a nibble of 8-15 writes that byte's sign (0x00 or 0xFF)
// instead. __byte_perm has no sign mode.
__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b,
                                              std::uint32_t selector) {
  std::uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// What the kernel needs of a 16-bit source type.
template <class In>
struct Packed16 {
  static_assert(sizeof(typename In::Storage) == 2, "two elements a 32-bit word");
  // Bits of +inf: a magnitude above them is a NaN.
  static constexpr std::uint32_t kInfBits = std::is_same_v<In, BF16In> ? 0x7F80u : 0x7C00u;
  // The two elements of a word (element 0 in the low half) as FP32, exactly.
  static __device__ __forceinline__ void to_f32(std::uint32_t word, float& lo, float& hi) {
    if constexpr (std::is_same_v<In, BF16In>) num::fast::bf16x2_to_f32x2(word, lo, hi);
    else num::fast::f16x2_to_f32x2(word, lo, hi);
  }
};

struct Tile16 {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;          // 128
  static constexpr int kLaneRows = 8;                   // a lane: 8 rows x 8 columns
  static constexpr int kRows = 2 * kLaneRows * kWarps;  // 64
  static constexpr int kCols = 16 * 8;                  // 128: 16 column groups of 8
  static constexpr int kRowBlocks = kCols / kBlock;     // 8 scale bytes a tile row
  static constexpr int kColBlocks = kRows / kBlock;     // 4 scale bytes a tile column
  static constexpr int kColWords = kRows / 8;           // 8 words (32 bytes) of codes a column
  static constexpr int kCodes = 128;                    // E4M3 codes of non-negative scales
  static_assert(kThreads == kCodes, "one entry of each encode-factor table per thread");
  static_assert(kThreads == kCols && kThreads >= kRows, "one staged column / row per thread");
  static_assert(kBlock == 2 * kLaneRows && kBlock == 2 * 8, "a block is two lanes");
};

// Word k (rows 8k .. 8k + 7) of tile column c in the staged column codes. The writers of one
// store are the 32 lanes of a warp with the same column j of their group: c = 8 cg + j and
// k = 2 w + rh. XOR-ing k with cg's low 3 bits and c's low 2 bits with (cg bit 0, cg bit 3)
// gives them 32 different banks (bank = 8 (c' mod 4) + k').
__device__ __forceinline__ int col_code_slot(int c, int k) {
  const int cg = c >> 3;
  const int c_swizzled = c ^ (((cg >> 3) & 1) | ((cg & 1) << 1));
  return c_swizzled * Tile16::kColWords + (k ^ (cg & 7));
}

// Which tile a CTA works on: the loop's tile index t counts from the END of the tensor (see
// above), tile (row_tile, col_tile) = t' / tiles_per_row, t' % tiles_per_row of t' = tiles - 1
// - t. Stepping t by the grid size is a subtraction with a borrow, so the loop divides once.
struct TileCursor {
  std::int64_t row_tile, col_tile;
  __device__ std::int64_t row0() const { return row_tile * Tile16::kRows; }
  __device__ std::int64_t col0() const { return col_tile * Tile16::kCols; }
  __device__ void step(std::int64_t step_rows, std::int64_t step_cols, std::int64_t per_row) {
    row_tile -= step_rows;
    col_tile -= step_cols;
    if (col_tile < 0) {
      col_tile += per_row;
      row_tile -= 1;
    }
  }
};

// The lane's 8 rows x 8 columns starting at (row, col); outside the tensor reads as +0.
template <class In>
__device__ __forceinline__ void load_lane_rows(const QuantizeParams& p, std::int64_t row,
                                               std::int64_t col,
                                               sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows]) {
  const auto* src = static_cast<const typename In::Storage*>(p.src);
  const int valid_cols = valid_in_run(col, p.cols, 8);
#pragma unroll
  for (int i = 0; i < Tile16::kLaneRows; ++i) {
    const int valid = row + i < p.rows ? valid_cols : 0;
    sdk::cuda::load_raw8<In>(src, (row + i) * p.cols + col, valid,
                             p.src_aligned && valid == 8, raw[i]);
  }
}

// The same 8 rows as asynchronous copies into shared memory (cp.async, 16 bytes a row at
// dst + 16 i; outside the tensor filled with +0), for sources with p.src_aligned (cols % 8 == 0
// and a 16-byte aligned base: every row's 16 bytes are aligned). The caller commits the group.
template <class In>
__device__ __forceinline__ void copy_lane_rows_async(const QuantizeParams& p, std::int64_t row,
                                                     std::int64_t col, std::uint32_t dst,
                                                     int dst_pitch) {
  const auto* src = static_cast<const typename In::Storage*>(p.src);
  const int row_bytes = 2 * valid_in_run(col, p.cols, 8);
#pragma unroll
  for (int i = 0; i < Tile16::kLaneRows; ++i) {
    const int bytes = row + i < p.rows ? row_bytes : 0;
    const void* from = bytes > 0 ? src + (row + i) * p.cols + col : p.src;  // 0 bytes read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + i * dst_pitch),
                 "l"(from), "r"(bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed copy groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Where a lane is (the tile-independent part is set once).
struct Lane16 {
  int lane, warp, cg, rh;
  std::int64_t row, col;  // its first row and column in the tensor
  int valid_cols;         // of its 8 columns, inside the tensor
  // Its 8 rows and 8 columns are inside the tensor and (rowwise) whole words can be stored:
  // row i's codes go to row_out + i * row_pitch. Warps with a lane that is not take the
  // per-element path, so the fast path has no edge cases.
  bool interior;
  std::uint8_t* row_out;
};

// One row's 8 codes (4 bytes) of the rowwise data.
__device__ __forceinline__ void store_row_codes(const QuantizeParams& p, const Lane16& L, int i,
                                                std::uint32_t word) {
  const std::int64_t r = L.row + i;
  if (r >= p.rows || L.valid_cols == 0) return;
  const int bytes = (L.valid_cols + 1) / 2;
  sdk::cuda::store_bytes4(p.row_data, r * p.row_pitch + L.col / 2, bytes,
                          p.row_word_ok && bytes == 4, word);
}

// The magnitude code of |x| * enc in the low byte (see e2m1_magnitude_byte_below7).
template <bool kSaturate>
__device__ __forceinline__ std::uint32_t magnitude_byte(float x, float enc,
                                                        std::uint32_t two_pow_10) {
  float v = fabsf(x) * enc;  // == |x * enc|: enc is positive and finite
  if constexpr (kSaturate) v = fminf(v, 6.0f);
  return num::fast::e2m1_magnitude_byte_below7(v, two_pow_10);
}

// Byte j (1, 2 or 3; a compile-time constant after unrolling) of `word` replaced by the low
// byte of `byte`.
__device__ __forceinline__ std::uint32_t insert_byte(std::uint32_t word, std::uint32_t byte,
                                                     int j) {
  return prmt(word, byte, j == 1 ? 0x3240u : (j == 2 ? 0x3410u : 0x4210u));
}

// Packed E2M1 of the 8 elements of a run (4 words w, elements 2j / 2j + 1 in word j's low /
// high half, decoded in lo[j] / hi[j]) times enc: element 2j in the low nibble of byte j, signs
// included (x's sign is the sign of x * enc, -0 included).
template <bool kSaturate>
__device__ __forceinline__ std::uint32_t encode_run8(const std::uint32_t (&w)[4],
                                                     const float (&lo)[4], const float (&hi)[4],
                                                     float enc, std::uint32_t two_pow_10) {
  std::uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    pairs[j] = (magnitude_byte<kSaturate>(hi[j], enc, two_pow_10) << 4) +
               magnitude_byte<kSaturate>(lo[j], enc, two_pow_10);
  const std::uint32_t magnitudes =
      prmt(prmt(pairs[0], pairs[1], 0x0040u), prmt(pairs[2], pairs[3], 0x0040u), 0x5410u);
  const std::uint32_t signs03 = prmt(w[0], w[1], 0xFDB9u);  // sign bytes of elements 0..3
  const std::uint32_t signs47 = prmt(w[2], w[3], 0xFDB9u);  // 4..7
  return magnitudes | (prmt(signs03, signs47, 0x6420u) & 0x08080808u) |  // even: bit 3
         (prmt(signs03, signs47, 0x7531u) & 0x80808080u);                 // odd: bit 7
}

// The sign bits of the lane's columns 2m (lo) and 2m + 1 (hi) over its 8 rows, as they sit in
// packed column codes (row 2j in bit 3 of byte j, row 2j + 1 in bit 7).
template <class In>
__device__ __forceinline__ void column_signs(const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
                                             int m, std::uint32_t& lo, std::uint32_t& hi) {
  // [sign(a.lo), sign(b.lo), sign(a.hi), sign(b.hi)] of two rows' words a, b.
  constexpr std::uint32_t kTwoRows = 0xFBD9u;
  const std::uint32_t e04 = prmt(raw[0].w[m], raw[2].w[m], kTwoRows);
  const std::uint32_t e48 = prmt(raw[4].w[m], raw[6].w[m], kTwoRows);
  const std::uint32_t o04 = prmt(raw[1].w[m], raw[3].w[m], kTwoRows);
  const std::uint32_t o48 = prmt(raw[5].w[m], raw[7].w[m], kTwoRows);
  lo = (prmt(e04, e48, 0x5410u) & 0x08080808u) | (prmt(o04, o48, 0x5410u) & 0x80808080u);
  hi = (prmt(e04, e48, 0x7632u) & 0x08080808u) | (prmt(o04, o48, 0x7632u) & 0x80808080u);
}

// Encodes the lane's 64 elements when no NaN is among them: row codes stored, column code
// words returned in col_words (column k: row i in nibble i).
template <class In, bool kRow, bool kCol, bool kSaturate>
__device__ __forceinline__ void encode_lane_fast(
    const QuantizeParams& p, const Lane16& L, const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
    const float (&row_enc)[Tile16::kLaneRows], const float (&col_enc)[8],
    std::uint32_t (&col_words)[8]) {
  std::uint32_t even_row[8];  // magnitude bytes of the last even row, per column
#pragma unroll
  for (int i = 0; i < Tile16::kLaneRows; ++i) {
    float lo[4], hi[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) Packed16<In>::to_f32(raw[i].w[m], lo[m], hi[m]);
    if constexpr (kRow) {
      *reinterpret_cast<std::uint32_t*>(L.row_out + i * p.row_pitch) =
          encode_run8<kSaturate>(raw[i].w, lo, hi, row_enc[i], p.two_pow_10);
    }
    if constexpr (kCol) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const std::uint32_t t_lo = magnitude_byte<kSaturate>(lo[m], col_enc[2 * m], p.two_pow_10);
        const std::uint32_t t_hi =
            magnitude_byte<kSaturate>(hi[m], col_enc[2 * m + 1], p.two_pow_10);
        if (i % 2 == 0) {
          even_row[2 * m] = t_lo;
          even_row[2 * m + 1] = t_hi;
        } else {
          const std::uint32_t pair_lo = (t_lo << 4) + even_row[2 * m];
          const std::uint32_t pair_hi = (t_hi << 4) + even_row[2 * m + 1];
          if (i == 1) {
            col_words[2 * m] = pair_lo;
            col_words[2 * m + 1] = pair_hi;
          } else {
            col_words[2 * m] = insert_byte(col_words[2 * m], pair_lo, i / 2);
            col_words[2 * m + 1] = insert_byte(col_words[2 * m + 1], pair_hi, i / 2);
          }
        }
      }
    }
  }
  if constexpr (kCol) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      std::uint32_t lo, hi;
      column_signs<In>(raw, m, lo, hi);
      col_words[2 * m] |= lo;
      col_words[2 * m + 1] |= hi;
    }
  }
}

// The 2 block scales whose amaxes are the halves of `amax_pair` (16-bit magnitudes, no NaN):
// E4M3 codes in bits 0-7 / 8-15, encode factors from `table`, max(amax * enc) into `reach`.
template <class In>
__device__ __forceinline__ std::uint32_t scale_pair(std::uint32_t amax_pair, float s6,
                                                    const float* table, float& enc_lo,
                                                    float& enc_hi, float& reach) {
  float lo, hi;
  Packed16<In>::to_f32(amax_pair, lo, hi);
  // == rules::block_scale_code: non-NaN inputs, where the raw conversion is the reference's
  const std::uint32_t codes = num::fast::hardware_e4m3x2(lo * s6, hi * s6);
  enc_lo = table[codes & 0xFFu];
  enc_hi = table[codes >> 8];
  reach = fmaxf(reach, fmaxf(lo * enc_lo, hi * enc_hi));
  return codes;
}

// The CTA's shared memory: encode-factor tables and the staged tile outputs.
struct Stage16 {
  const float* row_table;  // rowwise enc by E4M3 code
  const float* col_table;
  std::uint32_t* col_codes;                        // [kCols * kColWords], col_code_slot
  std::uint8_t (*row_scales)[Tile16::kRowBlocks];  // [kRows]
  std::uint8_t (*col_scales)[Tile16::kColBlocks];  // [kCols]
};

// Stages what a lane leaves for the CTA's stores: its column code words (column k: row i in
// nibble i) and its own scale codes (byte q: row 4 (cg & 1) + q / column 4 rh + q).
template <bool kRow, bool kCol>
__device__ __forceinline__ void stage_lane(const Lane16& L, const Stage16& s,
                                           const std::uint32_t (&col_words)[8],
                                           std::uint32_t own_row_codes,
                                           std::uint32_t own_col_codes) {
  const int lane_row = 16 * L.warp + Tile16::kLaneRows * L.rh, lane_col = 8 * L.cg;
  if constexpr (kRow) {
    const int r = lane_row + 4 * (L.cg & 1);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      s.row_scales[r + q][L.cg / 2] = static_cast<std::uint8_t>(own_row_codes >> (8 * q));
  }
  if constexpr (kCol) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      s.col_codes[col_code_slot(lane_col + k, 2 * L.warp + L.rh)] = col_words[k];
    const int c = lane_col + 4 * L.rh;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      s.col_scales[c + q][L.warp] = static_cast<std::uint8_t>(own_col_codes >> (8 * q));
  }
}

// The per-element path of a warp with a NaN among its elements or a lane past the tensor's edge:
// the reference's rules one element at a time (rules::block_scale_code through the hardware
// E4M3, the NaN mark, enc from the table, num::fast::f32_to_e2m1 == rules::round_nearest).
// Not inlined (it is rare, and its registers would count for the whole kernel): it reloads the
// lane's elements (L1 / L2 hits) and stages its results itself.
template <class In, bool kRow, bool kCol>
__device__ __noinline__ void quantize_lane_exact(const QuantizeParams& p, const Lane16 L,
                                                 float row_s6, float col_s6, const Stage16 s) {
  sdk::cuda::Raw8<In> raw[Tile16::kLaneRows];
  load_lane_rows<In>(p, L.row, L.col, raw);
  const float* row_table = s.row_table;
  const float* col_table = s.col_table;
  std::uint32_t col_words[8] = {}, own_row_codes = 0, own_col_codes = 0;
  if constexpr (kRow) {
#pragma unroll
    for (int i = 0; i < Tile16::kLaneRows; ++i) {
      float x[8];
      sdk::cuda::decode_raw8<In>(raw[i], x);
      float amax = 0.0f;
      bool nan = false;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        amax = fmaxf(amax, num::abs_f(x[k]));  // NaN ignored
        nan |= x[k] != x[k];
      }
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
      nan |= __shfl_xor_sync(kFullMask, static_cast<int>(nan), 1) != 0;
      const std::uint8_t code = num::fast::f32_to_e4m3(amax * row_s6);
      const float enc = row_table[code];
      std::uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) word |= num::fast::f32_to_e2m1(x[k] * enc) << (4 * k);
      store_row_codes(p, L, i, word);
      if ((i >> 2) == (L.cg & 1))
        own_row_codes |= static_cast<std::uint32_t>(nan ? rules::kNanScaleCode : code)
                         << (8 * (i & 3));
    }
  }
  if constexpr (kCol) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float x[Tile16::kLaneRows];
      float amax = 0.0f;
      bool nan = false;
#pragma unroll
      for (int i = 0; i < Tile16::kLaneRows; ++i) {
        float lo, hi;
        Packed16<In>::to_f32(raw[i].w[k / 2], lo, hi);
        x[i] = k % 2 ? hi : lo;
        amax = fmaxf(amax, num::abs_f(x[i]));
        nan |= x[i] != x[i];
      }
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 16));
      nan |= __shfl_xor_sync(kFullMask, static_cast<int>(nan), 16) != 0;
      const std::uint8_t code = num::fast::f32_to_e4m3(amax * col_s6);
      const float enc = col_table[code];
      std::uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < Tile16::kLaneRows; ++i)
        word |= num::fast::f32_to_e2m1(x[i] * enc) << (4 * i);
      col_words[k] = word;
      if ((k >> 2) == L.rh)
        own_col_codes |= static_cast<std::uint32_t>(nan ? rules::kNanScaleCode : code)
                         << (8 * (k & 3));
    }
  }
  stage_lane<kRow, kCol>(L, s, col_words, own_row_codes, own_col_codes);
}

// The lane's part of one tile: row codes stored, column codes and scale bytes staged.
template <class In, bool kRow, bool kCol>
__device__ __forceinline__ void quantize_lane(const QuantizeParams& p, const Lane16& L,
                                              const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
                                              float row_s6, float col_s6, const Stage16& s) {
  const float* row_table = s.row_table;
  const float* col_table = s.col_table;
  std::uint32_t col_words[8] = {}, own_row_codes = 0, own_col_codes = 0;
  constexpr int R = Tile16::kLaneRows;
  constexpr std::uint32_t kAbs = 0x7FFF7FFFu;
  // Maxima of |x| as packed 16-bit magnitudes: per row (even / odd columns) and per column pair.
  std::uint32_t row_max[R], col_max[4];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::uint32_t a0 = raw[i].w[0] & kAbs, a1 = raw[i].w[1] & kAbs;
    const std::uint32_t a2 = raw[i].w[2] & kAbs, a3 = raw[i].w[3] & kAbs;
    if constexpr (kRow) row_max[i] = __vmaxu2(__vmaxu2(a0, a1), __vmaxu2(a2, a3));
    if constexpr (kCol) {
      col_max[0] = i == 0 ? a0 : __vmaxu2(col_max[0], a0);
      col_max[1] = i == 0 ? a1 : __vmaxu2(col_max[1], a1);
      col_max[2] = i == 0 ? a2 : __vmaxu2(col_max[2], a2);
      col_max[3] = i == 0 ? a3 : __vmaxu2(col_max[3], a3);
    }
  }
  std::uint32_t lane_max;
  if constexpr (kCol) {
    lane_max = __vmaxu2(__vmaxu2(col_max[0], col_max[1]), __vmaxu2(col_max[2], col_max[3]));
  } else {
    lane_max = row_max[0];
#pragma unroll
    for (int i = 1; i < R; ++i) lane_max = __vmaxu2(lane_max, row_max[i]);
  }
  const bool lane_nan = max(lane_max & 0xFFFFu, lane_max >> 16) > Packed16<In>::kInfBits;
  if (__any_sync(kFullMask, lane_nan || !L.interior)) {
    quantize_lane_exact<In, kRow, kCol>(p, L, row_s6, col_s6, s);
    return;
  }

  float reach = 0.0f;  // max of block amax * enc over the lane's blocks
  float row_enc[R], col_enc[8];
  if constexpr (kRow) {
    // Rows (2j, 2j + 1) of the lane pair: [max row 2j, max row 2j + 1].
    std::uint32_t pair_max[R / 2];
#pragma unroll
    for (int j = 0; j < R / 2; ++j) {
      pair_max[j] = __vmaxu2(prmt(row_max[2 * j], row_max[2 * j + 1], 0x5410u),
                             prmt(row_max[2 * j], row_max[2 * j + 1], 0x7632u));
      pair_max[j] = __vmaxu2(pair_max[j], __shfl_xor_sync(kFullMask, pair_max[j], 1));
    }
    const bool odd = L.cg & 1;  // owns rows 4-7
    float own[4];
    const std::uint32_t codes01 =
        scale_pair<In>(odd ? pair_max[2] : pair_max[0], row_s6, row_table, own[0], own[1], reach);
    const std::uint32_t codes23 =
        scale_pair<In>(odd ? pair_max[3] : pair_max[1], row_s6, row_table, own[2], own[3], reach);
    own_row_codes = codes01 | (codes23 << 16);
#pragma unroll
    for (int i = 0; i < R; ++i)
      row_enc[i] = __shfl_sync(kFullMask, own[i & 3], (L.lane & ~1) | (i >> 2));
  }
  if constexpr (kCol) {
#pragma unroll
    for (int m = 0; m < 4; ++m)
      col_max[m] = __vmaxu2(col_max[m], __shfl_xor_sync(kFullMask, col_max[m], 16));
    float own[4];
    const std::uint32_t codes01 =
        scale_pair<In>(L.rh ? col_max[2] : col_max[0], col_s6, col_table, own[0], own[1], reach);
    const std::uint32_t codes23 =
        scale_pair<In>(L.rh ? col_max[3] : col_max[1], col_s6, col_table, own[2], own[3], reach);
    own_col_codes = codes01 | (codes23 << 16);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      col_enc[k] = __shfl_sync(kFullMask, own[k & 3], (L.lane & 15) | ((k >> 2) << 4));
  }
  if (__any_sync(kFullMask, !(reach < 7.0f)))
    encode_lane_fast<In, kRow, kCol, true>(p, L, raw, row_enc, col_enc, col_words);
  else
    encode_lane_fast<In, kRow, kCol, false>(p, L, raw, row_enc, col_enc, col_words);
  stage_lane<kRow, kCol>(L, s, col_words, own_row_codes, own_col_codes);
}

// 4 CTAs an SM: at most 128 registers (the both-directions kernel needs about that many).
template <class In, bool kRow, bool kCol>
__global__ void __launch_bounds__(Tile16::kThreads, 4)
    quantize_16bit_kernel(const __grid_constant__ QuantizeParams p) {
  using T = Tile16;
  constexpr int R = T::kLaneRows;
  __shared__ float row_table[T::kCodes], col_table[T::kCodes];
  __shared__ std::uint32_t col_codes[kCol ? T::kCols * T::kColWords : 1];
  __shared__ alignas(8) std::uint8_t row_scale_tile[T::kRows][T::kRowBlocks];
  __shared__ alignas(4) std::uint8_t col_scale_tile[T::kCols][T::kColBlocks];
  // Two input tiles (double buffer of the cp.async path), 32 KB.
  __shared__ alignas(16) std::uint32_t in_tile[2][T::kRows][T::kCols / 2];

  const int tid = static_cast<int>(threadIdx.x);
  Lane16 L{};
  L.lane = tid % 32;
  L.warp = tid / 32;
  L.cg = L.lane % 16;
  L.rh = L.lane / 16;
  const int lane_row = 16 * L.warp + R * L.rh, lane_col = 8 * L.cg;  // in the tile

  // The direction scales and the encode-factor tables (entry = E4M3 code).
  float row_s6 = 0.0f, col_s6 = 0.0f;
  if constexpr (kRow) {
    const float s_enc = rules::encode_scale(*p.row_amax);
    row_s6 = s_enc * rules::kOneSixth;
    row_table[tid] = rules::element_encode_factor(static_cast<std::uint8_t>(tid), 1.0f / s_enc);
  }
  if constexpr (kCol) {
    const float s_enc = rules::encode_scale(*p.col_amax);
    col_s6 = s_enc * rules::kOneSixth;
    col_table[tid] = rules::element_encode_factor(static_cast<std::uint8_t>(tid), 1.0f / s_enc);
  }
  __syncthreads();
  const Stage16 stage{row_table, col_table, col_codes, row_scale_tile, col_scale_tile};

  // The grid never exceeds the tile count. With an aligned source each thread copies its rows
  // of the NEXT tile into the other input buffer (cp.async) before it encodes the current one,
  // so the loads of a tile overlap the work on the one before; a thread reads back only what it
  // copied itself, so cp.async.wait_group orders it (no barrier).
  const bool async = p.src_aligned;
  const std::int64_t grid = gridDim.x;
  const std::int64_t step_rows = grid / p.tiles_per_row, step_cols = grid % p.tiles_per_row;
  TileCursor t;
  {
    const std::int64_t first = p.tiles - 1 - static_cast<std::int64_t>(blockIdx.x);
    t.row_tile = first / p.tiles_per_row;
    t.col_tile = first % p.tiles_per_row;
  }
  constexpr int kInPitch = 2 * T::kCols;  // bytes of a tile row of a 16-bit source
  const std::uint32_t in_lane =
      static_cast<std::uint32_t>(__cvta_generic_to_shared(&in_tile[0][lane_row][lane_col / 2]));
  constexpr std::uint32_t kInBuffer = sizeof(in_tile[0]);
  int buffer = 0;
  if (async) {
    copy_lane_rows_async<In>(p, t.row0() + lane_row, t.col0() + lane_col, in_lane, kInPitch);
    cp_async_commit();
  }
  for (std::int64_t tile = blockIdx.x;; tile += grid) {
    const bool has_next = tile + grid < p.tiles;
    TileCursor next = t;
    if (has_next) next.step(step_rows, step_cols, p.tiles_per_row);
    L.row = t.row0() + lane_row;
    L.col = t.col0() + lane_col;
    L.valid_cols = valid_in_run(L.col, p.cols, 8);
    L.interior = L.row + R <= p.rows && L.valid_cols == 8 && (!kRow || p.row_word_ok);
    if constexpr (kRow) L.row_out = p.row_data + L.row * p.row_pitch + L.col / 2;
    sdk::cuda::Raw8<In> raw[R];
    if (async) {
      if (has_next)
        copy_lane_rows_async<In>(p, next.row0() + lane_row, next.col0() + lane_col,
                                 in_lane + (buffer ^ 1) * kInBuffer, kInPitch);
      cp_async_commit();  // possibly empty: the wait below then still means "this tile"
      cp_async_wait<1>();
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const uint4 v =
            *reinterpret_cast<const uint4*>(&in_tile[buffer][lane_row + i][lane_col / 2]);
        raw[i].w[0] = v.x;
        raw[i].w[1] = v.y;
        raw[i].w[2] = v.z;
        raw[i].w[3] = v.w;
      }
    } else {
      load_lane_rows<In>(p, L.row, L.col, raw);
    }
    quantize_lane<In, kRow, kCol>(p, L, raw, row_s6, col_s6, stage);
    __syncthreads();
    const std::int64_t row0 = t.row0(), col0 = t.col0();
    const int valid_rows = valid_in_run(row0, p.rows, T::kRows);
    const int valid_cols = valid_in_run(col0, p.cols, T::kCols);
    if (kCol && tid < valid_cols) {  // thread = tile column
      const std::int64_t c = col0 + tid;
      std::uint32_t w[T::kColWords];
#pragma unroll
      for (int k = 0; k < T::kColWords; ++k) w[k] = col_codes[col_code_slot(tid, k)];
      std::uint8_t* dst = p.col_data + c * p.col_pitch + row0 / 2;
      if (p.col_chunk_ok && valid_rows == T::kRows) {
        reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
        reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else {
        const int bytes = (valid_rows + 1) / 2;
#pragma unroll
        for (int b = 0; b < 4 * T::kColWords; ++b)
          if (b < bytes) dst[b] = static_cast<std::uint8_t>(w[b / 4] >> (8 * (b % 4)));
      }
      const int blocks = (valid_rows + kBlock - 1) / kBlock;
      sdk::cuda::store_bytes4(p.col_scales, c * p.col_spitch + row0 / kBlock, blocks,
                              p.col_scale_vector_ok && blocks == T::kColBlocks,
                              *reinterpret_cast<const std::uint32_t*>(col_scale_tile[tid]));
    }
    if (kRow && tid < valid_rows) {  // thread = tile row
      const int blocks = (valid_cols + kBlock - 1) / kBlock;
      const uint2 v = *reinterpret_cast<const uint2*>(row_scale_tile[tid]);
      sdk::cuda::store_bytes8(p.row_scales, (row0 + tid) * p.row_spitch + col0 / kBlock,
                              blocks, p.row_scale8_ok && blocks == T::kRowBlocks, v.x, v.y);
    }
    if (!has_next) break;
    __syncthreads();  // the staging buffers are rewritten by the next tile
    t = next;
    buffer ^= 1;
  }
}

// Dequantize: one logical output element per thread (grid-stride), so the writes are
// coalesced; the columnwise data is read transposed (a gather). Not a hot path.
constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeMaxBlocks = 8192;

struct DequantizeParams {
  const std::uint8_t* data;
  const std::uint8_t* scales;
  const float* amax;
  std::int64_t rows, cols;  // logical
  bool transposed;
  std::int64_t pitch, spitch;  // of the data matrix ([cols, rows] when transposed)
  void* dst;
  qr_dtype dst_dtype;
};

__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_kernel(const DequantizeParams p) {
  const float s_dec = rules::decode_scale(*p.amax);
  const std::int64_t numel = p.rows * p.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < numel; e += stride) {
    const std::int64_t r = e / p.cols, c = e % p.cols;
    const std::int64_t i = p.transposed ? c : r;  // data row
    const std::int64_t j = p.transposed ? r : c;  // element within it
    const std::uint8_t q = static_cast<std::uint8_t>((p.data[i * p.pitch + j / 2] >> ((j & 1) * 4)) & 0xFu);
    const float v = rules::decode_element(q, p.scales[i * p.spitch + j / kBlock], s_dec);
    if (p.dst_dtype == QR_DTYPE_F32) static_cast<float*>(p.dst)[e] = v;
    else if (p.dst_dtype == QR_DTYPE_BF16) static_cast<std::uint16_t*>(p.dst)[e] = num::f32_to_bf16(v);
    else static_cast<std::uint16_t*>(p.dst)[e] = num::f32_to_f16(v);
  }
}

// Caller-reduced amaxes into the direction buffers (either pointer may be null).
__global__ void fill_amax_kernel(float* dst0, float value0, float* dst1, float value1) {
  if (dst0) *dst0 = value0;
  if (dst1) *dst1 = value1;
}

// ---------------------------------------------------------------- 4. launchers, entries

using sdk::ceil_div;  // qrecipe/plugin_sdk.hpp


int sm_count() {
  int device = 0, count = 0;
  QR_CUDA_CHECK(cudaGetDevice(&device));
  QR_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

void check_source_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "nvfp4 CUDA ", entry, ": source dtype code ",
                static_cast<int>(dtype), " is not f32, bf16 or f16; convert the tensor first");
}

// Tiles of 64x64 over [rows, cols] (one CUDA block each), checked against the grid limit.
unsigned tile_grid(std::int64_t rows, std::int64_t cols, std::int64_t& tiles_per_row,
                   const char* entry) {
  tiles_per_row = ceil_div(cols, Tile::kCols);
  const std::int64_t tiles = ceil_div(rows, Tile::kRows) * tiles_per_row;
  QR_CHECK(tiles >= 1 && tiles <= INT_MAX, "nvfp4 CUDA ", entry, ": ", rows, " x ", cols,
           " needs ", tiles, " tiles of ", Tile::kRows, "x", Tile::kCols, "; expected 1..",
           INT_MAX, " (split the tensor)");
  return static_cast<unsigned>(tiles);
}

template <class In>
void launch_amax(const void* src, std::int64_t numel, float* out0, float* out1,
                 cudaStream_t stream) {
  using Storage = typename In::Storage;
  constexpr int N = kRunLength<In>;
  // At most the blocks resident at once (one wave); the grid-stride loop covers the rest.
  static const int blocks_per_sm = [] {
    int n = 0;
    QR_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, amax_kernel<In>, kAmaxThreads, 0));
    return n < 1 ? 1 : n;
  }();
  const std::int64_t runs = ceil_div(numel, N);
  std::int64_t blocks = ceil_div(runs, static_cast<std::int64_t>(kAmaxThreads) * kAmaxUnroll);
  const std::int64_t max_blocks = static_cast<std::int64_t>(sm_count()) * blocks_per_sm;
  blocks = blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks);
  amax_kernel<In><<<static_cast<unsigned>(blocks), kAmaxThreads, 0, stream>>>(
      static_cast<const Storage*>(src), numel, is_aligned(src, 16), out0, out1);
  QR_CUDA_CHECK_LAUNCH("amax_kernel");
}

// max |x| into out0 and out1 (each nullable; both receive the same value).
void plain_amax(const void* src, qr_dtype dtype, std::int64_t numel, float* out0, float* out1,
                cudaStream_t stream) {
  switch (dtype) {
    case QR_DTYPE_F32: launch_amax<F32In>(src, numel, out0, out1, stream); break;
    case QR_DTYPE_BF16: launch_amax<BF16In>(src, numel, out0, out1, stream); break;
    default: launch_amax<F16In>(src, numel, out0, out1, stream); break;
  }
}

void hadamard_amax(const void* src, qr_dtype dtype, std::int64_t rows, std::int64_t cols,
                   float* plain, float* transformed, cudaStream_t stream) {
  QR_CHECK_CODE(dtype == QR_DTYPE_BF16 && rows % kBlock == 0, QR_STATUS_UNSUPPORTED,
                "nvfp4 CUDA hadamard amax: needs a bf16 source with rows % 16 == 0; got dtype "
                "code ", static_cast<int>(dtype), ", ", rows, " rows");
  HadamardAmaxParams p{};
  p.src = static_cast<const std::uint16_t*>(src);
  p.rows = rows;
  p.cols = cols;
  p.src_aligned = cols % TileLoad<BF16In>::kRun == 0 && is_aligned(src, 16);
  p.plain = plain;
  p.transformed = transformed;
  const unsigned blocks = tile_grid(rows, cols, p.tiles_per_row, "hadamard amax");
  hadamard_amax_kernel<<<blocks, Tile::kThreads, 0, stream>>>(p);
  QR_CUDA_CHECK_LAUNCH("hadamard_amax_kernel");
}

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

template <class In, bool kRow, bool kCol>
void launch_quantize_16bit_dirs(QuantizeParams p, cudaStream_t stream) {
  using T = Tile16;
  p.tiles_per_row = ceil_div(p.cols, T::kCols);
  p.tiles = ceil_div(p.rows, T::kRows) * p.tiles_per_row;
  p.two_pow_10 = 1u << 10;
  // A persistent grid: the CTAs resident at once (each loops over tiles).
  static const int blocks_per_sm = [] {
    int n = 0;
    QR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, quantize_16bit_kernel<In, kRow, kCol>, T::kThreads, 0));
    return n < 1 ? 1 : n;
  }();
  const std::int64_t resident = static_cast<std::int64_t>(sm_count()) * blocks_per_sm;
  const std::int64_t blocks = p.tiles < resident ? p.tiles : resident;
  quantize_16bit_kernel<In, kRow, kCol>
      <<<static_cast<unsigned>(blocks), T::kThreads, 0, stream>>>(p);
  QR_CUDA_CHECK_LAUNCH("quantize_16bit_kernel");
}

template <class In>
void launch_quantize_16bit(const QuantizeParams& p, cudaStream_t stream) {
  const bool row = p.row_data != nullptr, col = p.col_data != nullptr;
  if (row && col) launch_quantize_16bit_dirs<In, true, true>(p, stream);
  else if (row) launch_quantize_16bit_dirs<In, true, false>(p, stream);
  else launch_quantize_16bit_dirs<In, false, true>(p, stream);
}

}  // namespace

void compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t rows,
                          std::int64_t cols, bool hadamard, float amax_out[2], int device_index,
                          void* stream) {
  check_source_dtype(src_dtype, "compute_amax");
  QR_CHECK(rows >= 0 && cols >= 0, "nvfp4 CUDA compute_amax: negative shape ", rows, " x ",
           cols);
  QR_CHECK(rows * cols == 0 || src != nullptr,
           "nvfp4 CUDA compute_amax: the source has a null data pointer");
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  // A stream-ordered temporary [plain, transformed], freed on every path.
  struct Scratch {
    float* ptr = nullptr;
    cudaStream_t stream;
    ~Scratch() {
      if (ptr) cudaFreeAsync(ptr, stream);
    }
  } scratch{nullptr, s};
  QR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch.ptr), 2 * sizeof(float), s));
  QR_CUDA_CHECK(cudaMemsetAsync(scratch.ptr, 0, 2 * sizeof(float), s));
  if (rows * cols > 0) {
    if (hadamard)
      hadamard_amax(src, src_dtype, rows, cols, scratch.ptr, scratch.ptr + 1, s);
    else
      plain_amax(src, src_dtype, rows * cols, scratch.ptr, scratch.ptr + 1, s);
  }
  float host[2] = {0.0f, 0.0f};
  QR_CUDA_CHECK(cudaMemcpyAsync(host, scratch.ptr, sizeof host, cudaMemcpyDeviceToHost, s));
  QR_CUDA_CHECK(cudaStreamSynchronize(s));
  amax_out[0] = host[0];
  amax_out[1] = host[1];
}

void quantize(const QuantizeArgs& a) {
  check_source_dtype(a.src_dtype, "quantize");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "nvfp4 CUDA quantize: negative shape ", a.rows, " x ",
           a.cols);
  QR_CHECK(a.rowwise || a.columnwise, "nvfp4 CUDA quantize: no direction requested");
  const std::int64_t numel = a.rows * a.cols;
  QR_CHECK(numel == 0 || a.src != nullptr, "nvfp4 CUDA quantize: the source has a null data "
           "pointer");
  for (const DirectionBuffers* d : {a.rowwise, a.columnwise})
    QR_CHECK(!d || (d->amax != nullptr && (numel == 0 || (d->data && d->scales))),
             "nvfp4 CUDA quantize: a requested direction lacks its data, scale or amax buffer");
  QR_CHECK(!(a.hadamard && a.two_d), "nvfp4 CUDA quantize: hadamard and 2d cannot be combined");
  QR_CHECK_CODE(!a.hadamard || !a.columnwise ||
                    (a.src_dtype == QR_DTYPE_BF16 && a.rows % kBlock == 0),
                QR_STATUS_UNSUPPORTED, "nvfp4 CUDA quantize: hadamard needs a bf16 source with "
                "rows % 16 == 0 (checked by the plugin before this call)");

  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t s = as_stream(a.stream);
  float* row_amax = a.rowwise ? a.rowwise->amax : nullptr;
  float* col_amax = a.columnwise ? a.columnwise->amax : nullptr;

  // Pass 1: the tensor amax of each requested direction, in its amax buffer.
  if (a.given_amax) {
    // 2d stores one tensor amax, the rowwise entry (equal to the columnwise one by value;
    // copying it keeps -0 / +0 as the reference stores them).
    const float col_value = a.two_d ? a.given_amax[0] : a.given_amax[1];
    fill_amax_kernel<<<1, 1, 0, s>>>(row_amax, a.given_amax[0], col_amax, col_value);
    QR_CUDA_CHECK_LAUNCH("fill_amax_kernel");
  } else {
    // Both amax buffers zeroed by one launch (the atomic maxima start from +0).
    fill_amax_kernel<<<1, 1, 0, s>>>(row_amax, 0.0f, col_amax, 0.0f);
    QR_CUDA_CHECK_LAUNCH("fill_amax_kernel");
    if (numel > 0) {
      if (a.hadamard && col_amax)
        hadamard_amax(a.src, a.src_dtype, a.rows, a.cols, row_amax, col_amax, s);
      else
        plain_amax(a.src, a.src_dtype, numel, row_amax, col_amax, s);
    }
  }
  if (numel == 0) return;

  // Pass 2: both directions per tile.
  QuantizeParams p = quantize_params(a);
  if (!a.two_d && !a.hadamard) {  // the 1-D paths
    if (a.src_dtype == QR_DTYPE_F32) {
      if (a.stochastic_rounding) launch_quantize_1d<F32In, true>(p, s);
      else launch_quantize_1d<F32In, false>(p, s);
    } else if (a.stochastic_rounding) {  // the random words dominate; warp tiles
      if (a.src_dtype == QR_DTYPE_BF16) launch_quantize_1d<BF16In, true>(p, s);
      else launch_quantize_1d<F16In, true>(p, s);
    } else if (a.src_dtype == QR_DTYPE_BF16) {
      launch_quantize_16bit<BF16In>(p, s);
    } else {
      launch_quantize_16bit<F16In>(p, s);
    }
    return;
  }
  const unsigned blocks = tile_grid(a.rows, a.cols, p.tiles_per_row, "quantize");
  switch (a.src_dtype) {
    case QR_DTYPE_F32: launch_quantize<F32In>(p, a.stochastic_rounding, blocks, s); break;
    case QR_DTYPE_BF16: launch_quantize<BF16In>(p, a.stochastic_rounding, blocks, s); break;
    default: launch_quantize<F16In>(p, a.stochastic_rounding, blocks, s); break;
  }
}

void dequantize(const std::uint8_t* data, const std::uint8_t* scales, const float* amax,
                std::int64_t rows, std::int64_t cols, bool transposed, void* dst,
                qr_dtype dst_dtype, int device_index, void* stream) {
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "nvfp4 CUDA dequantize: output dtype code ",
                static_cast<int>(dst_dtype), " is not f32, bf16 or f16");
  QR_CHECK(rows >= 0 && cols >= 0, "nvfp4 CUDA dequantize: negative shape ", rows, " x ", cols);
  const std::int64_t numel = rows * cols;
  if (numel == 0) return;
  QR_CHECK(data && scales && amax && dst, "nvfp4 CUDA dequantize: a null data, scale, amax or "
           "destination pointer");
  DeviceGuard guard(device_index, kFormat);
  DequantizeParams p{};
  p.data = data;
  p.scales = scales;
  p.amax = amax;
  p.rows = rows;
  p.cols = cols;
  p.transposed = transposed;
  const std::int64_t data_cols = transposed ? rows : cols;
  p.pitch = packed_pitch(data_cols);
  p.spitch = scale_pitch(data_cols);
  p.dst = dst;
  p.dst_dtype = dst_dtype;
  std::int64_t blocks = ceil_div(numel, kDequantizeThreads);
  blocks = blocks > kDequantizeMaxBlocks ? kDequantizeMaxBlocks : blocks;
  dequantize_kernel<<<static_cast<unsigned>(blocks), kDequantizeThreads, 0, as_stream(stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

}  // namespace qrecipe::nvfp4::cuda
