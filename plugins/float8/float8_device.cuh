// The cast tiles of float8, shared by the kernels of float8_kernels.cu (one tensor) and
// float8_grouped_kernels.cu (every group of a grouped call in one launch), so both run the same
// per-block code: the element traits, the vector loads and code stores, the rowwise chunk
// (a flat pass over 8-element units) and the cast + transpose tile (both directions through a
// swizzled shared-memory tile). Each routine takes its scale as a value: where it comes from
// (the amax pass, a device scale, delayed scaling) and what happens to the block's amax stay
// with the kernel. Moved here unchanged from float8_kernels.cu. CUDA only (nvcc).
//
// Exactness: as float8_kernels.cu says (q = sat_rne(fp32(x) * scale) through num::fast,
// proven equal to conversions.hpp; the amax is an exact max).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::float8::cuda {

using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::block_max;
using sdk::ceil_div;
using sdk::cuda::DeviceGuard;
using sdk::cuda::is_aligned;

// ---------------------------------------------------------------- element traits

// Input element types: storage, elements per 16-byte vector, and exact widening to FP32 (the
// reference's load_f32) for one element and for a whole vector.
struct F32In {
  using Storage = float;
  static constexpr int kPerVector = 4;
  static __device__ __forceinline__ float to_f32(Storage v) { return v; }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    x[0] = __uint_as_float(v.x);
    x[1] = __uint_as_float(v.y);
    x[2] = __uint_as_float(v.z);
    x[3] = __uint_as_float(v.w);
  }
};
struct BF16In {
  using Storage = std::uint16_t;
  static constexpr int kPerVector = 8;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::bf16_to_f32(v); }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    num::fast::bf16x2_to_f32x2(v.x, x[0], x[1]);
    num::fast::bf16x2_to_f32x2(v.y, x[2], x[3]);
    num::fast::bf16x2_to_f32x2(v.z, x[4], x[5]);
    num::fast::bf16x2_to_f32x2(v.w, x[6], x[7]);
  }
};
struct F16In {
  using Storage = std::uint16_t;
  static constexpr int kPerVector = 8;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::fast::f16_to_f32(v); }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    num::fast::f16x2_to_f32x2(v.x, x[0], x[1]);
    num::fast::f16x2_to_f32x2(v.y, x[2], x[3]);
    num::fast::f16x2_to_f32x2(v.z, x[4], x[5]);
    num::fast::f16x2_to_f32x2(v.w, x[6], x[7]);
  }
};

// FP8 data types: the reference's encode (hardware fast path, same bytes) and decode.
struct E4M3Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e4m3x4(a, b, c, d);
  }
  static __device__ __forceinline__ std::uint8_t encode1(float x) {
    return static_cast<std::uint8_t>(num::fast::f32x2_to_e4m3x2(x, 0.0f) & 0xFFu);
  }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e4m3_to_f32(c); }
};
struct E5M2Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e5m2x4(a, b, c, d);
  }
  static __device__ __forceinline__ std::uint8_t encode1(float x) {
    return static_cast<std::uint8_t>(num::fast::f32x2_to_e5m2x2(x, 0.0f) & 0xFFu);
  }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e5m2_to_f32(c); }
};

// The rowwise codes of a cast + transpose tile: the columnwise codes themselves (SameCodes:
// one type, one scale), or E4M3Out / E5M2Out with a scale of their own (another format's
// per-tensor cast written from the same read, the hybrid fusion extra of plugin_abi.h).
struct SameCodes {};

// ---------------------------------------------------------------- device helpers

// One 16-byte global load / store and 8- / 4-byte code stores (the caller guarantees the
// alignment).
__device__ __forceinline__ uint4 load16(const void* p) { return *static_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, const uint4& v) { *static_cast<uint4*>(p) = v; }
__device__ __forceinline__ void store8(void* p, std::uint32_t lo, std::uint32_t hi) {
  *static_cast<uint2*>(p) = make_uint2(lo, hi);
}
__device__ __forceinline__ void store4(void* p, std::uint32_t word) {
  *static_cast<std::uint32_t*>(p) = word;
}

// N scaled elements -> N codes in N / 4 little-endian words (element 0 in the lowest byte).
template <class Out, int N>
__device__ __forceinline__ void encode_words(const float (&x)[N], float scale,
                                             std::uint32_t (&words)[N / 4]) {
  static_assert(N % 4 == 0, "codes are packed four to a word");
#pragma unroll
  for (int w = 0; w < N / 4; ++w)
    words[w] = Out::encode4(x[4 * w] * scale, x[4 * w + 1] * scale, x[4 * w + 2] * scale,
                            x[4 * w + 3] * scale);
}

// Transposes a 4x4 byte matrix held as 4 words (word i = row i, byte j = column j) into
// 4 words (word j = column j, byte i = row i). __byte_perm(x, y, s): result byte n is byte
// (s >> 4n) & 7 of the 8 bytes {x, y}.
__device__ __forceinline__ void transpose_4x4_bytes(std::uint32_t r0, std::uint32_t r1,
                                                    std::uint32_t r2, std::uint32_t r3,
                                                    std::uint32_t (&col)[4]) {
  const std::uint32_t t0 = __byte_perm(r0, r1, 0x5140);  // r0.0 r1.0 r0.1 r1.1
  const std::uint32_t t1 = __byte_perm(r0, r1, 0x7362);  // r0.2 r1.2 r0.3 r1.3
  const std::uint32_t t2 = __byte_perm(r2, r3, 0x5140);  // r2.0 r3.0 r2.1 r3.1
  const std::uint32_t t3 = __byte_perm(r2, r3, 0x7362);  // r2.2 r3.2 r2.3 r3.3
  col[0] = __byte_perm(t0, t2, 0x5410);                  // r0.0 r1.0 r2.0 r3.0
  col[1] = __byte_perm(t0, t2, 0x7632);                  // r0.1 r1.1 r2.1 r3.1
  col[2] = __byte_perm(t1, t3, 0x5410);                  // r0.2 r1.2 r2.2 r3.2
  col[3] = __byte_perm(t1, t3, 0x7632);                  // r0.3 r1.3 r2.3 r3.3
}

// ---------------------------------------------------------------- rowwise chunks

// Rowwise cast of a contiguous tensor, as a flat array of 8-element units (one 16-byte load,
// two for f32; one 8-byte store of codes): a warp's load covers 512 (f32: 1024) contiguous
// bytes and its store 256, whole lines. One chunk of kRowwiseThreads x kRowwiseUnits units
// per block (32 KiB of input, like a tile of the transpose kernel), not a persistent grid: the
// hardware hands chunks to SMs as blocks retire, so the faster SMs take more of them (a
// persistent grid-stride version ran 8-10% slower on an H100).
constexpr int kRowwiseThreads = 256;
constexpr int kUnit = 8;           // elements per unit
// Units per thread, all loads issued before the first use: 128 bytes of input in flight
// (8 units of bf16/f16, 4 of f32).
template <class In>
constexpr int kRowwiseUnits = In::kPerVector == 4 ? 4 : 8;

// 8 elements of one unit, loaded as kLoads 16-byte vectors, to FP32.
template <class In>
__device__ __forceinline__ void decode_unit(const uint4 (&raw)[kUnit / In::kPerVector],
                                            float (&x)[kUnit]) {
#pragma unroll
  for (int l = 0; l < kUnit / In::kPerVector; ++l) {
    float part[In::kPerVector];
    In::decode(raw[l], part);
#pragma unroll
    for (int k = 0; k < In::kPerVector; ++k) x[l * In::kPerVector + k] = part[k];
  }
}

// The part of a flat [numel] tensor one block casts: chunk `chunk` of kRowwiseThreads x kUnits
// units of kUnit elements. `units` counts the whole tensor's vector units (0 when its buffers
// are not aligned: then every element goes one by one).
struct RowwiseChunk {
  std::int64_t begin, end;  // elements of the chunk
  std::int64_t units;
};

template <class In, int kUnits>
__device__ __forceinline__ RowwiseChunk rowwise_chunk(std::int64_t chunk, std::int64_t numel,
                                                      bool aligned) {
  constexpr std::int64_t kChunk = std::int64_t{kRowwiseThreads} * kUnits * kUnit;  // elements
  RowwiseChunk k;
  k.begin = chunk * kChunk;
  k.end = k.begin + kChunk < numel ? k.begin + kChunk : numel;
  k.units = aligned ? numel / kUnit : 0;  // units of the whole tensor
  return k;
}

// This thread's loads of the chunk (unit u of the chunk at u * kRowwiseThreads + thread), all
// issued before any is used.
template <class In, int kUnits>
__device__ __forceinline__ void load_rowwise_chunk(
    const typename In::Storage* __restrict__ src, const RowwiseChunk& k,
    uint4 (&raw)[kUnits][kUnit / In::kPerVector]) {
  constexpr int kLoads = kUnit / In::kPerVector;
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const std::int64_t i = k.begin / kUnit + u * kRowwiseThreads + t;
    if (i < k.units) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) raw[u][l] = load16(src + i * kUnit + l * In::kPerVector);
    }
  }
}

// Casts the chunk with `scale`: the loaded units, then the elements no unit covered (the last
// numel % kUnit, or all when unaligned) one by one, into dst. Returns this thread's running
// amax of what it cast.
template <class In, class Out, int kUnits>
__device__ __forceinline__ float cast_rowwise_chunk(
    const typename In::Storage* __restrict__ src, const RowwiseChunk& k, float scale,
    const uint4 (&raw)[kUnits][kUnit / In::kPerVector], std::uint8_t* __restrict__ dst) {
  const int t = static_cast<int>(threadIdx.x);
  float running = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const std::int64_t i = k.begin / kUnit + u * kRowwiseThreads + t;
    if (i < k.units) {
      float x[kUnit];
      decode_unit<In>(raw[u], x);
#pragma unroll
      for (int e = 0; e < kUnit; ++e) running = amax_of(running, x[e]);
      std::uint32_t words[kUnit / 4];
      encode_words<Out, kUnit>(x, scale, words);
      store8(dst + i * kUnit, words[0], words[1]);
    }
  }
  // Elements of this chunk that no unit covered: the last numel % kUnit, or all (unaligned).
  const std::int64_t first_single = k.units * kUnit > k.begin ? k.units * kUnit : k.begin;
  for (std::int64_t e = first_single + t; e < k.end; e += kRowwiseThreads) {
    const float x = In::to_f32(src[e]);
    running = amax_of(running, x);
    dst[e] = Out::encode1(x * scale);
  }
  return running;
}

// ---------------------------------------------------------------- cast + transpose tiles

// Fused cast + transpose over kRows x kCols tiles of the [rows, cols] input, one tile per
// block (columnwise requested; rowwise optional). One tile per block rather than a persistent
// grid for the same reason as the rowwise chunks (the persistent version ran ~10% slower).
// `reverse`: block b takes the b-th tile from the end.
//
// Phase 1: thread (tx, ty) owns micro-tiles of kMicroRows rows x kVector columns: per row one
// 16-byte load (all kPasses x kMicroRows loads issued first, before the wait for the kernel
// this launch overlaps), the codes of a row go out as one kVector-byte rowwise store, and each
// 4x4 block of codes is transposed in registers into 4 words (4 consecutive rows of one
// column) stored in the shared tile, which holds the tile transposed: tile[c] is the kRows
// codes of column c, as kRows / 4 words.
// Phase 2: each thread copies 16-byte runs of tile[c] (16 consecutive rows of column c) to
// the columnwise output [cols, rows]: 8 threads write one 128-byte run per tile column.
//
// Bank conflicts: a phase-1 store instruction of a warp writes word q = pass * 16 + ty of 32
// different columns (tx = 0..15, two values of ty). Unpadded rows of 32 words would put all
// of them in one bank; the word is therefore stored at q ^ swizzle(c) with swizzle(c) =
// 2 * (c / kVector) = 2 * tx: (q ^ 2tx) takes 32 distinct values over the warp (2tx is even
// and distinct per tx, the two ty differ in bit 0), so stores are conflict-free. Phase 2 reads
// a whole 16-byte group: logical group g sits at physical group g ^ (swizzle >> 2), with its
// words in the order (2, 3, 0, 1) when bit 1 of the swizzle is set; 8 consecutive threads
// read the 8 groups of one column, conflict-free.
template <class In>
struct TileShape {
  static constexpr int kVector = In::kPerVector;                // elements per 16-byte load
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocksPerSm = 4;                     // registers <= 64
  static constexpr int kThreadsX = 16;                          // across a tile row
  static constexpr int kThreadsY = kThreads / kThreadsX;        // 16
  static constexpr int kCols = kThreadsX * kVector;             // 64 (f32) or 128: 256 bytes
  static constexpr int kMicroRows = 4;                          // one 4x4 byte transpose
  static constexpr int kRowsPerPass = kThreadsY * kMicroRows;   // 64
  static constexpr int kPasses = 2;
  static constexpr int kRows = kRowsPerPass * kPasses;          // 128: 128-byte output runs
  static constexpr int kWordsPerCol = kRows / 4;                // 32 words per tile column
  static constexpr int kGroupsPerCol = kRows / 16;              // 8 16-byte runs per column
  static constexpr int kColsPerStorePass = kThreads / kGroupsPerCol;  // 32
  static constexpr int kStorePasses = kCols / kColsPerStorePass;      // 2 (f32) or 4
  // Shared tile: kCols x kRows codes = 8 KiB (f32) or 16 KiB.
  static_assert(kThreads % kThreadsX == 0 && kVector % 4 == 0, "whole 4x4 transposes");
  static_assert(kWordsPerCol == 32, "one tile column is one 128-byte row of 32 banks");
  static_assert(2 * (kThreadsX - 1) < kWordsPerCol, "the swizzle stays inside a column row");
  static_assert(kThreadsY * kPasses == kRows / kMicroRows, "phase-1 passes cover the rows");
  static_assert(kThreads % kGroupsPerCol == 0 && kCols % kColsPerStorePass == 0,
                "phase-2 passes cover the columns");
  static __device__ __forceinline__ int swizzle(int col) { return 2 * (col / kVector); }
  // Byte of row r, column c in the swizzled transposed tile.
  static __device__ __forceinline__ int byte_index(int r, int c) {
    return (c * kWordsPerCol + ((r / 4) ^ swizzle(c))) * 4 + r % 4;
  }
};

struct TileFlags {
  bool vector_rows;     // src 16-byte aligned, cols % kVector == 0, rowwise kVector-aligned
  bool vector_columns;  // columnwise 16-byte aligned and columnwise_ld % 16 == 0
};

// Edge tiles (or unaligned data), element by element with the same bytes, out of line so the
// vector path keeps its registers. Phase 1: quantizes the in-range elements (rowwise store
// when requested) into the shared tile, out-of-range codes 0 (never stored); returns the
// running amax. Phase 2: stores the in-range codes columnwise.
template <class In, class Out, class T, class RowOut = SameCodes>
__device__ __noinline__ float edge_tile_codes(const typename In::Storage* src, std::int64_t rows,
                                              std::int64_t cols, std::int64_t row0,
                                              std::int64_t col0, float scale,
                                              std::uint8_t* rowwise, std::uint8_t* tile_bytes,
                                              float running, float row_scale = 0.0f) {
  for (int e = static_cast<int>(threadIdx.x); e < T::kRows * T::kCols; e += T::kThreads) {
    const int r = e / T::kCols, c = e % T::kCols;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    std::uint8_t code = 0;
    if (gr < rows && gc < cols) {
      const float x = In::to_f32(src[gr * cols + gc]);
      running = amax_of(running, x);
      code = Out::encode1(x * scale);
      if (rowwise != nullptr) {
        if constexpr (std::is_same_v<RowOut, SameCodes>) rowwise[gr * cols + gc] = code;
        else rowwise[gr * cols + gc] = RowOut::encode1(x * row_scale);
      }
    }
    tile_bytes[T::byte_index(r, c)] = code;
  }
  return running;
}

template <class T>
__device__ __noinline__ void edge_tile_columns(const std::uint8_t* tile_bytes, std::int64_t rows,
                                               std::int64_t cols, std::int64_t row0,
                                               std::int64_t col0, std::uint8_t* columnwise,
                                               std::int64_t columnwise_ld) {
  for (int e = static_cast<int>(threadIdx.x); e < T::kRows * T::kCols; e += T::kThreads) {
    const int c = e / T::kRows, r = e % T::kRows;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    if (gr < rows && gc < cols)
      columnwise[gc * columnwise_ld + gr] = tile_bytes[T::byte_index(r, c)];
  }
}

// Where a block's tile lies and what this thread does in it: tile t of [rows, cols] in
// row-major order of tiles_per_row tiles a row; thread (tx, ty) owns the micro-tiles at tile
// column c = tx * kVector.
struct CastTile {
  std::int64_t row0, col0;
  bool full_tile;    // the tile lies inside the tensor
  bool vector_tile;  // full, and the rows can be loaded and stored as vectors
  int ty, c;
  std::int64_t first;  // element (row0 + ty * kMicroRows, col0 + c): this thread's first vector
};

template <class In>
__device__ __forceinline__ CastTile cast_tile(unsigned t, unsigned tiles_per_row,
                                              std::int64_t rows, std::int64_t cols,
                                              const TileFlags& flags) {
  using T = TileShape<In>;
  CastTile g;
  g.row0 = static_cast<std::int64_t>(t / tiles_per_row) * T::kRows;
  g.col0 = static_cast<std::int64_t>(t % tiles_per_row) * T::kCols;
  g.full_tile = g.row0 + T::kRows <= rows && g.col0 + T::kCols <= cols;
  g.vector_tile = g.full_tile && flags.vector_rows;
  const int tx = static_cast<int>(threadIdx.x) % T::kThreadsX;
  g.ty = static_cast<int>(threadIdx.x) / T::kThreadsX;
  g.c = tx * T::kVector;  // first tile column of this thread (vector path)
  g.first = (g.row0 + g.ty * T::kMicroRows) * cols + g.col0 + g.c;
  return g;
}

// This thread's vector loads of the tile (all kPasses x kMicroRows issued together; none on
// the element-by-element path).
template <class In>
__device__ __forceinline__ void load_cast_tile(
    const typename In::Storage* __restrict__ src, std::int64_t cols, const CastTile& at,
    uint4 (&raw)[TileShape<In>::kPasses][TileShape<In>::kMicroRows]) {
  using T = TileShape<In>;
  if (at.vector_tile) {
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass)
#pragma unroll
      for (int i = 0; i < T::kMicroRows; ++i)
        raw[pass][i] = load16(src + at.first + (pass * T::kRowsPerPass + i) * cols);
  }
}

// Casts the tile with `scale`: phase 1 quantizes, stores the rowwise codes (rowwise may be
// null) and parks the codes transposed in `tile`; phase 2 stores them into columnwise
// [cols, rows] with rows columnwise_ld bytes apart (rows for a tensor of its own; a device-split
// group's padded rows). Block-uniform (a barrier between the phases). Returns this thread's running
// amax. RowOut other than SameCodes: the rowwise codes are RowOut's of x * row_scale.
template <class In, class Out, class RowOut = SameCodes>
__device__ __forceinline__ float cast_transpose_tile(
    const typename In::Storage* __restrict__ src, std::int64_t rows, std::int64_t cols,
    const CastTile& at, float scale,
    const uint4 (&raw)[TileShape<In>::kPasses][TileShape<In>::kMicroRows],
    std::uint8_t* __restrict__ rowwise, std::uint8_t* __restrict__ columnwise,
    std::int64_t columnwise_ld, const TileFlags& flags,
    std::uint32_t (&tile)[TileShape<In>::kCols][TileShape<In>::kWordsPerCol],
    float row_scale = 0.0f) {
  constexpr bool kOwnRow = !std::is_same_v<RowOut, SameCodes>;
  using T = TileShape<In>;
  constexpr int V = T::kVector;
  std::uint8_t* const tile_bytes = reinterpret_cast<std::uint8_t*>(&tile[0][0]);
  const std::int64_t row0 = at.row0, col0 = at.col0, first = at.first;
  const bool full_tile = at.full_tile, vector_tile = at.vector_tile;
  const int ty = at.ty, c = at.c;
  float running = 0.0f;

  if (vector_tile) {
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass) {
      std::uint32_t codes[T::kMicroRows][V / 4];
#pragma unroll
      for (int i = 0; i < T::kMicroRows; ++i) {
        float x[V];
        In::decode(raw[pass][i], x);
#pragma unroll
        for (int e = 0; e < V; ++e) running = amax_of(running, x[e]);
        encode_words<Out, V>(x, scale, codes[i]);
        if (rowwise != nullptr) {
          std::uint8_t* out = rowwise + first + (pass * T::kRowsPerPass + i) * cols;
          std::uint32_t row_codes[V / 4];
          if constexpr (kOwnRow) {
            encode_words<RowOut, V>(x, row_scale, row_codes);
          } else {
#pragma unroll
            for (int w = 0; w < V / 4; ++w) row_codes[w] = codes[i][w];
          }
          if constexpr (V == 8) store8(out, row_codes[0], row_codes[1]);
          else store4(out, row_codes[0]);
        }
      }
      const int q = pass * (T::kRowsPerPass / 4) + ty;  // word of these 4 rows in a column
#pragma unroll
      for (int w = 0; w < V / 4; ++w) {
        std::uint32_t col_words[4];
        transpose_4x4_bytes(codes[0][w], codes[1][w], codes[2][w], codes[3][w], col_words);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = c + 4 * w + j;
          tile[col][q ^ T::swizzle(col)] = col_words[j];
        }
      }
    }
  } else {
    running = edge_tile_codes<In, Out, T, RowOut>(src, rows, cols, row0, col0, scale, rowwise,
                                                  tile_bytes, running, row_scale);
  }
  __syncthreads();

  // Phase 2: columnwise[col0 + c][row0 + r] = code of (r, c).
  if (full_tile && flags.vector_columns) {
    const int g = static_cast<int>(threadIdx.x) % T::kGroupsPerCol;
#pragma unroll
    for (int pass = 0; pass < T::kStorePasses; ++pass) {
      const int col =
          pass * T::kColsPerStorePass + static_cast<int>(threadIdx.x) / T::kGroupsPerCol;
      const int sw = T::swizzle(col);
      uint4 v = reinterpret_cast<const uint4*>(&tile[col][0])[g ^ (sw >> 2)];
      if (sw & 2) {
        const uint4 physical = v;
        v = make_uint4(physical.z, physical.w, physical.x, physical.y);
      }
      store16(columnwise + (col0 + col) * columnwise_ld + row0 + 16 * g, v);
    }
  } else {
    edge_tile_columns<T>(tile_bytes, rows, cols, row0, col0, columnwise, columnwise_ld);
  }
  return running;
}

}  // namespace qrecipe::float8::cuda
