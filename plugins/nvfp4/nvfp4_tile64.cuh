// The 64x64 shared-memory tile of the nvfp4 passes that work per tile: the Hadamard amax
// (nvfp4_amax.cu) and the 2d / Hadamard quantize (nvfp4_quantize_tile.cu). The tile is loaded
// once into shared memory as FP32 with 16-byte loads; its grid is one CTA per tile. CUDA only
// (nvcc); exactness as nvfp4_kernels.cu says.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "hadamard.hpp"
#include "nvfp4_device.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::nvfp4::cuda {

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

// Tiles of 64x64 over [rows, cols] (one CUDA block each), checked against the grid limit.
inline unsigned tile_grid(std::int64_t rows, std::int64_t cols, std::int64_t& tiles_per_row,
                   const char* entry) {
  tiles_per_row = ceil_div(cols, Tile::kCols);
  const std::int64_t tiles = ceil_div(rows, Tile::kRows) * tiles_per_row;
  QR_CHECK(tiles >= 1 && tiles <= INT_MAX, "nvfp4 CUDA ", entry, ": ", rows, " x ", cols,
           " needs ", tiles, " tiles of ", Tile::kRows, "x", Tile::kCols, "; expected 1..",
           INT_MAX, " (split the tensor)");
  return static_cast<unsigned>(tiles);
}

}  // namespace qrecipe::nvfp4::cuda
