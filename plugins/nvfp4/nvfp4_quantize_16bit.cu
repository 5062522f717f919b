// Pass 2 of nvfp4 quantize for bf16 / f16 sources with round to nearest and 1-D blocks: the
// hot path (nvfp4_kernels.cu has the map of the passes).
//
// Map of this file (docs/architecture.md, "Conventions", rule 11): the design (below), the tile and
// lane geometry, device helpers (PRMT byte permutes, cp.async copies, the byte-packing encoders,
// block scale pairs, staging), the per-lane quantize (fast path and the exact per-element path),
// the persistent kernel, then its launcher.
//
// Exactness: as nvfp4_kernels.cu says. The E2M1 encoders and the block scale's hardware E4M3
// conversion are proven equal to the references over all 2^32 inputs (test_gpu_conversions).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "nvfp4_device.cuh"
#include "nvfp4_passes.cuh"
#include "nvfp4_rules.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/scaling.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {

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
// tiles are still in L2) in row-major order, or, when it writes the columnwise direction, in
// groups of 32 row tiles visited column by column (TileCursor::grouped), and copies its next tile into shared memory (cp.async, double
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
  // Tile t' (= tiles - 1 - t) in the grouped order of p.tile_group_rows > 0: groups of that
  // many row tiles, each visited column by column (all its row tiles of column 0, then column
  // 1, ...). Consecutive CTAs then hold vertically stacked tiles, so the lines of the
  // transposed (columnwise) data and scales, which 4 and 32 stacked tiles complete, are
  // finished while the lines are still in L2, and a row's scale line (16 tiles across) is
  // 16 x group_rows tiles away, within one wave of the persistent grid.
  __device__ static TileCursor grouped(std::int64_t t, const QuantizeParams& p) {
    const std::int64_t row_tiles = p.tiles / p.tiles_per_row;
    const std::int64_t per_group = p.tile_group_rows * p.tiles_per_row;
    const std::int64_t group = t / per_group, inner = t % per_group;
    const std::int64_t first = group * p.tile_group_rows;
    const std::int64_t rows_here =
        row_tiles - first < p.tile_group_rows ? row_tiles - first : p.tile_group_rows;
    return TileCursor{first + inner % rows_here, inner / rows_here};
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

// The packed E2M1 of a run of 8 elements from their magnitude codes (pairs[j]: element 2j's in
// bits 0-3, element 2j + 1's in bits 4-7) and their source words (4 words w, elements 2j /
// 2j + 1 in word j's low / high half): element 2j in the low nibble of byte j, signs included
// (x's sign is the sign of x * enc, -0 included).
__device__ __forceinline__ std::uint32_t pack_run8(const std::uint32_t (&pairs)[4],
                                                   const std::uint32_t (&w)[4]) {
  const std::uint32_t magnitudes =
      prmt(prmt(pairs[0], pairs[1], 0x0040u), prmt(pairs[2], pairs[3], 0x0040u), 0x5410u);
  const std::uint32_t signs03 = prmt(w[0], w[1], 0xFDB9u);  // sign bytes of elements 0..3
  const std::uint32_t signs47 = prmt(w[2], w[3], 0xFDB9u);  // 4..7
  return magnitudes | (prmt(signs03, signs47, 0x6420u) & 0x08080808u) |  // even: bit 3
         (prmt(signs03, signs47, 0x7531u) & 0x80808080u);                 // odd: bit 7
}

// Packed E2M1 of the 8 elements of a run (4 words w, elements 2j / 2j + 1 in word j's low /
// high half, decoded in lo[j] / hi[j]) times enc, round to nearest (pack_run8's layout).
template <bool kSaturate>
__device__ __forceinline__ std::uint32_t encode_run8(const std::uint32_t (&w)[4],
                                                     const float (&lo)[4], const float (&hi)[4],
                                                     float enc, std::uint32_t two_pow_10) {
  std::uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    pairs[j] = (magnitude_byte<kSaturate>(hi[j], enc, two_pow_10) << 4) +
               magnitude_byte<kSaturate>(lo[j], enc, two_pow_10);
  return pack_run8(pairs, w);
}

// The same with stochastic rounding: element e (0..7) rounds with word r.w[e % 4] of the Philox
// group r[e / 4] (the run is columns col .. col + 7 of a data row, col % 8 == 0: two groups).
__device__ __forceinline__ std::uint32_t encode_run8_sr(const std::uint32_t (&w)[4],
                                                        const float (&lo)[4],
                                                        const float (&hi)[4], float enc,
                                                        const PhiloxWords (&r)[2]) {
  std::uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::uint32_t r_lo = r[j / 2].w[(2 * j) % 4], r_hi = r[j / 2].w[(2 * j + 1) % 4];
    pairs[j] = (rules::sr_magnitude(fabsf(hi[j]) * enc, r_hi) << 4) +
               rules::sr_magnitude(fabsf(lo[j]) * enc, r_lo);
  }
  return pack_run8(pairs, w);
}

// The 8 stochastic-rounding words of elements col .. col + 7 (col % 8 == 0) of data row `row`
// (rows of data_cols elements): two Philox calls.
__device__ __forceinline__ void sr_words8(const RandomStream& random, std::int64_t row,
                                          std::int64_t data_cols, std::int64_t col,
                                          PhiloxWords (&r)[2]) {
  const std::uint64_t g = sr_group(static_cast<std::uint64_t>(row),
                                   static_cast<std::uint64_t>(data_cols),
                                   static_cast<std::uint64_t>(col));
  r[0] = sr_group_words(random.seed, g, random.call_offset);
  r[1] = sr_group_words(random.seed, g + 1, random.call_offset);
}

// The sign bits of the lane's columns 2m (lo) and 2m + 1 (hi) over its 8 rows, as they sit in
// packed column codes (row 2j in bit 3 of byte j, row 2j + 1 in bit 7).
// From the lane's word m of each of its 8 rows (col[i] = raw[i].w[m]).
__device__ __forceinline__ void column_signs(const std::uint32_t (&col)[Tile16::kLaneRows],
                                             std::uint32_t& lo, std::uint32_t& hi) {
  // [sign(a.lo), sign(b.lo), sign(a.hi), sign(b.hi)] of two rows' words a, b.
  constexpr std::uint32_t kTwoRows = 0xFBD9u;
  const std::uint32_t e04 = prmt(col[0], col[2], kTwoRows);
  const std::uint32_t e48 = prmt(col[4], col[6], kTwoRows);
  const std::uint32_t o04 = prmt(col[1], col[3], kTwoRows);
  const std::uint32_t o48 = prmt(col[5], col[7], kTwoRows);
  lo = (prmt(e04, e48, 0x5410u) & 0x08080808u) | (prmt(o04, o48, 0x5410u) & 0x80808080u);
  hi = (prmt(e04, e48, 0x7632u) & 0x08080808u) | (prmt(o04, o48, 0x7632u) & 0x80808080u);
}

template <class In>
__device__ __forceinline__ void column_signs(const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
                                             int m, std::uint32_t& lo, std::uint32_t& hi) {
  std::uint32_t col[Tile16::kLaneRows];
#pragma unroll
  for (int i = 0; i < Tile16::kLaneRows; ++i) col[i] = raw[i].w[m];
  column_signs(col, lo, hi);
}

// Encodes the lane's 64 elements when no NaN is among them: row codes stored, column code
// words returned in col_words (column k: row i in nibble i).
// The lane's row i (4 words) from its rows in the CTA's input tile (row i at in + i * 64).
template <class In>
__device__ __forceinline__ sdk::cuda::Raw8<In> tile_row(const std::uint32_t* in, int i) {
  const uint4 v = *reinterpret_cast<const uint4*>(in + i * (Tile16::kCols / 2));
  sdk::cuda::Raw8<In> r;
  r.w[0] = v.x;
  r.w[1] = v.y;
  r.w[2] = v.z;
  r.w[3] = v.w;
  return r;
}

// The source words come again from the lane's rows in the CTA's input tile (`in`, tile_row), a
// row at a time, instead of from registers held since the amaxes: the 32 registers of the
// lane's 64 elements then live only through the amax step, which lets the round-to-nearest
// kernels run 5 CTAs an SM (96 registers) without spilling.
template <class In, bool kRow, bool kCol, bool kSaturate>
__device__ __forceinline__ void encode_lane_fast(
    const QuantizeParams& p, const Lane16& L, const std::uint32_t* in,
    const float (&row_enc)[Tile16::kLaneRows], const float (&col_enc)[8],
    std::uint32_t (&col_words)[8]) {
  std::uint32_t even_row[8];  // magnitude bytes of the last even row, per column
#pragma unroll
  for (int i = 0; i < Tile16::kLaneRows; ++i) {
    const sdk::cuda::Raw8<In> row = tile_row<In>(in, i);
    float lo[4], hi[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) Packed16<In>::to_f32(row.w[m], lo[m], hi[m]);
    if constexpr (kRow) {
      *reinterpret_cast<std::uint32_t*>(L.row_out + i * p.row_pitch) =
          encode_run8<kSaturate>(row.w, lo, hi, row_enc[i], p.two_pow_10);
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
    sdk::cuda::Raw8<In> rows[Tile16::kLaneRows];
#pragma unroll
    for (int i = 0; i < Tile16::kLaneRows; ++i) rows[i] = tile_row<In>(in, i);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      std::uint32_t lo, hi;
      column_signs<In>(rows, m, lo, hi);
      col_words[2 * m] |= lo;
      col_words[2 * m + 1] |= hi;
    }
  }
}

// encode_lane_fast with stochastic rounding (no NaN among the lane's elements, every element
// inside the tensor): the words of rowwise row i are the two Philox groups of data row
// L.row + i at column L.col, those of column k the two groups of data row L.col + k of the
// transposed output at column L.row (both 8-aligned). rules::sr_magnitude saturates itself, so
// there is no kSaturate split; the signs come from the source words as in the nearest path.
// The source words come again from the lane's rows in the CTA's input tile (`in`, tile_row):
// a row at a time (rowwise) or one word of each of the 8 rows (columnwise: two columns), so
// no more than that is held across the Philox calls.
template <class In, bool kRow, bool kCol>
__device__ __forceinline__ void encode_lane_sr(const QuantizeParams& p, const Lane16& L,
                                               const std::uint32_t* in,
                                               const float (&row_enc)[Tile16::kLaneRows],
                                               const float (&col_enc)[8],
                                               std::uint32_t (&col_words)[8]) {
  if constexpr (kRow) {
    // Not unrolled past a pair of rows (4 Philox calls), as the columns below.
#pragma unroll 1
    for (int i2 = 0; i2 < Tile16::kLaneRows; i2 += 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = i2 + h;
        float enc = row_enc[0];
#pragma unroll
        for (int j = 1; j < Tile16::kLaneRows; ++j) enc = i == j ? row_enc[j] : enc;
        const sdk::cuda::Raw8<In> row = tile_row<In>(in, i);
        float lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) Packed16<In>::to_f32(row.w[m], lo[m], hi[m]);
        PhiloxWords r[2];
        sr_words8(p.random, L.row + i, p.cols, L.col, r);
        *reinterpret_cast<std::uint32_t*>(L.row_out + i * p.row_pitch) =
            encode_run8_sr(row.w, lo, hi, enc, r);
      }
    }
  }
  if constexpr (kCol) {
    constexpr int kPitch = Tile16::kCols / 2;  // words of a tile row
    // Not unrolled: a pair of columns (4 Philox calls) at a time bounds the values in flight.
    // The run-time column k picks its encode factor and its code word by selects (constant
    // register indices; an indexed array would go to local memory).
#pragma unroll 1
    for (int m = 0; m < 4; ++m) {  // columns 2m (low halves) and 2m + 1 (high halves)
      std::uint32_t col[Tile16::kLaneRows];
#pragma unroll
      for (int i = 0; i < Tile16::kLaneRows; ++i) col[i] = in[i * kPitch + m];
      std::uint32_t signs[2];
      column_signs(col, signs[0], signs[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * m + h;
        float enc = col_enc[0];
#pragma unroll
        for (int j = 1; j < 8; ++j) enc = k == j ? col_enc[j] : enc;
        PhiloxWords r[2];
        sr_words8(p.random, L.col + k, p.rows, L.row, r);
        std::uint32_t word = signs[h];  // the magnitudes (bits 0-2 of a nibble) below
#pragma unroll
        for (int i = 0; i < Tile16::kLaneRows; ++i) {
          float lo, hi;
          Packed16<In>::to_f32(col[i], lo, hi);
          word |= rules::sr_magnitude(fabsf(h ? hi : lo) * enc, r[i / 4].w[i % 4]) << (4 * i);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) col_words[j] = k == j ? word : col_words[j];
      }
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

// The E2M1 code of v = x * enc on the per-element path: round to nearest
// (num::fast::f32_to_e2m1 == rules::round_nearest), or stochastic rounding with word r.
template <bool kSR>
__device__ __forceinline__ std::uint32_t exact_code(float v, std::uint32_t r) {
  if constexpr (kSR) return rules::round_stochastic(v, r) & 0xFu;
  else return num::fast::f32_to_e2m1(v);
}

// sr_words8 under stochastic rounding; nothing under round to nearest.
template <bool kSR>
__device__ __forceinline__ void exact_words8(const QuantizeParams& p, std::int64_t row,
                                             std::int64_t data_cols, std::int64_t col,
                                             PhiloxWords (&r)[2]) {
  if constexpr (kSR) sr_words8(p.random, row, data_cols, col, r);
  else r[0] = r[1] = PhiloxWords{{0u, 0u, 0u, 0u}};
}

// The per-tensor cast a kernel writes beside the columnwise direction (the hybrid fusion
// extra): no cast, or E4M3 / E5M2 codes of x * scale into data [rows, cols].
struct NoCast {};
struct CastE4M3 {};
struct CastE5M2 {};
struct Cast16 {
  std::uint8_t* data;
  float scale;      // the tensor scale, worked out once per CTA
  bool vector_ok;   // cols % 8 == 0 and data 8-byte aligned
};

// The 8 cast codes of x[0..7] * scale, little-endian in (lo, hi): the hardware conversion
// (== num::f32_to_e4m3 / f32_to_e5m2 off NaN, test_gpu_conversions) and, when `exact`, the
// reference's canonical NaN 0x7F (the fast path holds no NaN).
template <class Cast, bool kExact>
__device__ __forceinline__ void cast_run8(const float (&x)[8], float scale, std::uint32_t& lo,
                                          std::uint32_t& hi) {
  std::uint32_t pair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float a = x[2 * k] * scale, b = x[2 * k + 1] * scale;
    pair[k] = std::is_same_v<Cast, CastE4M3> ? num::fast::hardware_e4m3x2(a, b)
                                             : num::fast::hardware_e5m2x2(a, b);
    if constexpr (kExact) pair[k] = num::fast::canonical_nan_pair(pair[k], a, b);
  }
  lo = pair[0] | (pair[1] << 16);
  hi = pair[2] | (pair[3] << 16);
}

// The lane's 8 rows of the cast: rows L.row .., columns L.col .. of data [rows, cols]. The
// exact path casts `raw`, the fast path the lane's rows in the input tile (`in`, tile_row), so
// that `raw` is dead after the amaxes there too.
template <class In, class Cast, bool kExact>
__device__ __forceinline__ void cast_lane(const QuantizeParams& p, const Lane16& L,
                                          const Cast16& c,
                                          const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
                                          const std::uint32_t* in) {
  if constexpr (!std::is_same_v<Cast, NoCast>) {
#pragma unroll
    for (int i = 0; i < Tile16::kLaneRows; ++i) {
      const std::int64_t r = L.row + i;
      if (kExact && (r >= p.rows || L.valid_cols == 0)) continue;
      float x[8];
      if constexpr (kExact) sdk::cuda::decode_raw8<In>(raw[i], x);
      else sdk::cuda::decode_raw8<In>(tile_row<In>(in, i), x);
      std::uint32_t lo, hi;
      cast_run8<Cast, kExact>(x, c.scale, lo, hi);
      const int valid = kExact ? L.valid_cols : 8;
      sdk::cuda::store_bytes8(c.data, r * p.cols + L.col, valid, c.vector_ok && valid == 8, lo,
                              hi);
    }
  }
}

// The per-element path of a warp with a NaN among its elements or a lane past the tensor's edge:
// the reference's rules one element at a time (rules::block_scale_code through the hardware
// E4M3, the NaN mark, enc from the table, num::fast::f32_to_e2m1 == rules::round_nearest).
// Not inlined (it is rare, and its registers would count for the whole kernel): it reloads the
// lane's elements (L1 / L2 hits) and stages its results itself.
template <class In, bool kRow, bool kCol, bool kSR, class Cast>
__device__ __noinline__ void quantize_lane_exact(const QuantizeParams& p, const Lane16 L,
                                                 float row_s6, float col_s6, const Stage16 s,
                                                 const Cast16 c) {
  sdk::cuda::Raw8<In> raw[Tile16::kLaneRows];
  load_lane_rows<In>(p, L.row, L.col, raw);
  cast_lane<In, Cast, true>(p, L, c, raw, nullptr);
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
      PhiloxWords r[2];  // the lane's groups are 8-aligned, partial lanes included
      exact_words8<kSR>(p, L.row + i, p.cols, L.col, r);
      std::uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) word |= exact_code<kSR>(x[k] * enc, r[k / 4].w[k % 4]) << (4 * k);
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
      PhiloxWords r[2];
      exact_words8<kSR>(p, L.col + k, p.rows, L.row, r);
      std::uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < Tile16::kLaneRows; ++i)
        word |= exact_code<kSR>(x[i] * enc, r[i / 4].w[i % 4]) << (4 * i);
      col_words[k] = word;
      if ((k >> 2) == L.rh)
        own_col_codes |= static_cast<std::uint32_t>(nan ? rules::kNanScaleCode : code)
                         << (8 * (k & 3));
    }
  }
  stage_lane<kRow, kCol>(L, s, col_words, own_row_codes, own_col_codes);
}

// The lane's part of one tile: row codes stored, column codes and scale bytes staged.
// `in`: the lane's rows in the CTA's input tile (the same values as raw; encode_lane_sr reads
// them from there).
template <class In, bool kRow, bool kCol, bool kSR, class Cast>
__device__ __forceinline__ void quantize_lane(const QuantizeParams& p, const Lane16& L, const Cast16& c,
                                              const sdk::cuda::Raw8<In> (&raw)[Tile16::kLaneRows],
                                              const std::uint32_t* in, float row_s6,
                                              float col_s6, const Stage16& s) {
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
    quantize_lane_exact<In, kRow, kCol, kSR, Cast>(p, L, row_s6, col_s6, s, c);
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
  cast_lane<In, Cast, false>(p, L, c, raw, in);
  if constexpr (kSR)
    encode_lane_sr<In, kRow, kCol>(p, L, in, row_enc, col_enc, col_words);
  else if (__any_sync(kFullMask, !(reach < 7.0f)))
    encode_lane_fast<In, kRow, kCol, true>(p, L, in, row_enc, col_enc, col_words);
  else
    encode_lane_fast<In, kRow, kCol, false>(p, L, in, row_enc, col_enc, col_words);
  stage_lane<kRow, kCol>(L, s, col_words, own_row_codes, own_col_codes);
}

// Round to nearest: one direction 5 CTAs an SM (96 registers, no spill; shared memory, 38 KB
// a CTA, allows no 6th), so more tiles' loads are in flight (they measured 16-22 % achieved
// occupancy at 4); both directions 4 CTAs (128 registers; at 96 it spilled 64 bytes);
// stochastic rounding, whose Philox calls keep more values live (encode_lane_sr reads the
// source words again from shared memory and takes rows and columns a pair at a time): one
// direction 5 CTAs (96 registers), both directions 3 (168; at 128 they spilled 64 bytes). It
// is bound by instructions: each warp's 4 Philox calls in flight, times 12 to 20 warps an SM,
// hide the latency of their dependent rounds.
// A kernel that also writes a per-tensor cast (the hybrid fusion) stores two directions: 4
// CTAs (128 registers, no spill, since its cast reads the input tile too; at 96 it spilled
// 148 bytes).
template <class In, bool kRow, bool kCol, bool kSR, class Cast = NoCast>
__global__ void __launch_bounds__(Tile16::kThreads,
                                  kSR ? (kRow && kCol ? 3 : 5)
                                      : (std::is_same_v<Cast, NoCast> ? (kRow && kCol ? 4 : 5) : 4))
    quantize_16bit_kernel(const __grid_constant__ QuantizeParams p, const qr_tensor_cast cast) {
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
  Cast16 c16{cast.data, 0.0f, false};
  if constexpr (!std::is_same_v<Cast, NoCast>) {
    // The rule float8 applies (qrecipe/scaling.hpp), so the codes are float8's own.
    c16.scale = cast.scale != nullptr ? __ldcg(cast.scale)
                                      : scale_from_amax(__ldcg(cast.amax), cast.fmax,
                                                        cast.pow2_scales != 0, cast.amax_epsilon);
    c16.vector_ok = p.cols % 8 == 0 && is_aligned(cast.data, 8);
  }

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
    if (p.tile_group_rows > 0) {
      t = TileCursor::grouped(first, p);
    } else {
      t.row_tile = first / p.tiles_per_row;
      t.col_tile = first % p.tiles_per_row;
    }
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
    if (has_next) {
      if (p.tile_group_rows > 0) next = TileCursor::grouped(p.tiles - 1 - (tile + grid), p);
      else next.step(step_rows, step_cols, p.tiles_per_row);
    }
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
      // The encoders read the lane's rows from the input tile (tile_row).
#pragma unroll
      for (int i = 0; i < R; ++i)
        *reinterpret_cast<uint4*>(&in_tile[buffer][lane_row + i][lane_col / 2]) =
            make_uint4(raw[i].w[0], raw[i].w[1], raw[i].w[2], raw[i].w[3]);
    }
    quantize_lane<In, kRow, kCol, kSR, Cast>(p, L, c16, raw,
                                             &in_tile[buffer][lane_row][lane_col / 2], row_s6,
                                             col_s6, stage);
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

// ---------------------------------------------------------------- launcher

// The persistent grid's tile order: row-major, or grouped by 32 row tiles (TileCursor::grouped)
// for kernels that write the columnwise direction. QRECIPE_NVFP4_TILE_ORDER=rows|grouped
// forces one order for every kernel, so one GPU run can time both (the bytes are the same).
constexpr std::int64_t kTileGroupRows = 32;

std::int64_t tile_group_rows(bool writes_columnwise) {
  static const int forced = [] {  // -1: the default, 0: rows, 1: grouped
    const char* v = std::getenv("QRECIPE_NVFP4_TILE_ORDER");
    const std::string s = v ? v : "";
    QR_CHECK(s.empty() || s == "rows" || s == "grouped", "QRECIPE_NVFP4_TILE_ORDER='", s,
             "' is not rows or grouped (unset it for the default: grouped when the columnwise "
             "direction is written)");
    return s.empty() ? -1 : (s == "grouped" ? 1 : 0);
  }();
  const bool grouped = forced < 0 ? writes_columnwise : forced == 1;
  return grouped ? kTileGroupRows : 0;
}

template <class In, bool kRow, bool kCol, bool kSR, class Cast = NoCast>
void launch_quantize_16bit_dirs(QuantizeParams p, const qr_tensor_cast& cast, cudaStream_t stream) {
  using T = Tile16;
  p.tiles_per_row = ceil_div(p.cols, T::kCols);
  p.tiles = ceil_div(p.rows, T::kRows) * p.tiles_per_row;
  p.tile_group_rows = tile_group_rows(kCol);
  p.two_pow_10 = 1u << 10;
  // A persistent grid: the CTAs resident at once (each loops over tiles).
  static const int blocks_per_sm = [] {
    int n = 0;
    QR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, quantize_16bit_kernel<In, kRow, kCol, kSR, Cast>, T::kThreads, 0));
    return n < 1 ? 1 : n;
  }();
  const std::int64_t resident = static_cast<std::int64_t>(sdk::cuda::sm_count(kFormat)) * blocks_per_sm;
  const std::int64_t blocks = p.tiles < resident ? p.tiles : resident;
  quantize_16bit_kernel<In, kRow, kCol, kSR, Cast>
      <<<static_cast<unsigned>(blocks), T::kThreads, 0, stream>>>(p, cast);
  QR_CUDA_CHECK_LAUNCH("quantize_16bit_kernel");
}

template <class In, bool kSR>
void launch_quantize_16bit(const QuantizeParams& p, const qr_tensor_cast& cast,
                           cudaStream_t stream) {
  const bool row = p.row_data != nullptr, col = p.col_data != nullptr;
  if constexpr (!kSR) {  // the fused cast (nvfp4_kernels.cu checked: columnwise alone)
    if (cast.data != nullptr) {
      if (cast.dtype == QR_DTYPE_E4M3)
        launch_quantize_16bit_dirs<In, false, true, false, CastE4M3>(p, cast, stream);
      else
        launch_quantize_16bit_dirs<In, false, true, false, CastE5M2>(p, cast, stream);
      return;
    }
  }
  if (row && col) launch_quantize_16bit_dirs<In, true, true, kSR>(p, cast, stream);
  else if (row) launch_quantize_16bit_dirs<In, true, false, kSR>(p, cast, stream);
  else launch_quantize_16bit_dirs<In, false, true, kSR>(p, cast, stream);
}

}  // namespace

void quantize_16bit(const QuantizeParams& p, qr_dtype src_dtype, bool stochastic,
                    const qr_tensor_cast& cast, cudaStream_t stream) {
  if (src_dtype == QR_DTYPE_BF16) {
    if (stochastic) launch_quantize_16bit<BF16In, true>(p, cast, stream);
    else launch_quantize_16bit<BF16In, false>(p, cast, stream);
  } else {
    if (stochastic) launch_quantize_16bit<F16In, true>(p, cast, stream);
    else launch_quantize_16bit<F16In, false>(p, cast, stream);
  }
}

}  // namespace qrecipe::nvfp4::cuda
