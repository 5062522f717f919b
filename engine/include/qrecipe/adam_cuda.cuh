// Header-only CUDA helpers of the multi-tensor Adam step (qrecipe/adam.hpp on the device): the
// per-tensor operands and hyperparameters a kernel reads, the step constants computed once
// per block, 4-element loads and stores of F32/BF16/F16 buffers, the update of several runs of
// 4 elements with every load issued before the first use (update_runs: the bandwidth of the
// update kernels), the update of one tile of a tensor whose new values a fused kernel then
// requantizes from shared memory, the tile prologue and run visitor of those kernels, and the
// 4 x 4 register blocks of formats with one scale per tensor. Used by the engine's
// plain-parameter kernel and by every plugin's fused Adam + requantize kernels (plugin_abi.h,
// QR_EXTRA_ADAM_REQUANTIZE), so all of them update alike. Include it only from CUDA
// translation units.
//
// Exactness: the element update is adam::update (adam.hpp), the constants adam::scalars, the
// widening of BF16/F16 is exact (num::fast, equal to qrecipe::num off NaN payloads) and their
// rounding goes through qrecipe::num: the CPU path (adam_host.hpp) does the same operations.
// The build compiles device code with -fmad=false.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "qrecipe/adam.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::adam::cuda {

// ---------------------------------------------------------------- per-tensor parameters

// A qr_adam_hyper as a kernel reads it (kernel parameter, by value).
struct DeviceHyper {
  double lr = 0.0, beta1 = 0.0, beta2 = 0.0, eps = 0.0, weight_decay = 0.0;
  const float* lr_device = nullptr;    // read on the device when set (capturable)
  const float* step_device = nullptr;  // read on the device when set (capturable)
  std::int64_t step = 1;
  int adam_w_mode = 1;
};

inline DeviceHyper device_hyper(const qr_adam_hyper& h) {
  DeviceHyper d;
  d.lr = h.lr;
  d.beta1 = h.beta1;
  d.beta2 = h.beta2;
  d.eps = h.eps;
  d.weight_decay = h.weight_decay;
  d.lr_device = h.lr_device;
  d.step_device = h.step_device;
  d.step = h.step;
  d.adam_w_mode = h.adam_w_mode;
  return d;
}

// The buffers of one tensor's update, as a 2-D [rows, cols] row-major view (a flat tensor of n
// elements is [1, n]). `param` is the value updated in place (the FP32 master, or a plain
// parameter in its own dtype); `copy` (optional) receives the new value rounded to its dtype.
struct Operands {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* copy = nullptr;
  std::int32_t param_dtype = QR_DTYPE_F32, grad_dtype = QR_DTYPE_F32;
  std::int32_t exp_avg_dtype = QR_DTYPE_F32, exp_avg_sq_dtype = QR_DTYPE_F32;
  std::int32_t copy_dtype = QR_DTYPE_F32;
  std::int64_t rows = 0, cols = 0;
  // Every buffer is aligned for a 4-element vector access and cols % 4 == 0, so every run of 4
  // starting at a column multiple of 4 may be loaded and stored as one vector.
  bool vec4 = false;
};

inline bool aligned_for4(const void* p, std::int32_t dtype) {
  if (p == nullptr) return true;
  return sdk::cuda::is_aligned(p, dtype == QR_DTYPE_F32 ? 16 : 8);
}

// The operands of an extra tensor (master F32 updated in place, no copy).
inline Operands operands(const qr_adam_tensor& t) {
  Operands o;
  o.param = t.master.data;
  o.grad = t.grad.data;
  o.exp_avg = t.exp_avg.data;
  o.exp_avg_sq = t.exp_avg_sq.data;
  o.param_dtype = QR_DTYPE_F32;
  o.grad_dtype = t.grad.dtype;
  o.exp_avg_dtype = t.exp_avg.dtype;
  o.exp_avg_sq_dtype = t.exp_avg_sq.dtype;
  o.rows = t.master.shape[0];
  o.cols = t.master.shape[1];
  o.vec4 = o.cols % 4 == 0 && aligned_for4(o.param, o.param_dtype) &&
           aligned_for4(o.grad, o.grad_dtype) && aligned_for4(o.exp_avg, o.exp_avg_dtype) &&
           aligned_for4(o.exp_avg_sq, o.exp_avg_sq_dtype);
  return o;
}

// ---------------------------------------------------------------- constants of a block

// adam::scalars of `h`, computed by thread 0 into shared memory and returned to every thread
// (all threads of the block must call it; it synchronizes the block).
__device__ __forceinline__ Scalars block_scalars(const DeviceHyper& h) {
  // Raw bytes: a __shared__ object of a class type would have no constructor run (Scalars has
  // default member initializers), so the value travels by memcpy.
  __shared__ alignas(Scalars) unsigned char shared[sizeof(Scalars)];
  if (threadIdx.x == 0) {
    const double lr = h.lr_device != nullptr ? static_cast<double>(*h.lr_device) : h.lr;
    const std::int64_t step =
        h.step_device != nullptr ? static_cast<std::int64_t>(*h.step_device) : h.step;
    const Scalars computed =
        scalars(lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.adam_w_mode != 0, step);
    memcpy(shared, &computed, sizeof computed);
  }
  __syncthreads();
  Scalars s;
  memcpy(&s, shared, sizeof s);
  __syncthreads();  // `shared` may be rewritten by a later call
  return s;
}

// ---------------------------------------------------------------- 4-element access

// Device-side alignment test of a pointer.
__device__ __forceinline__ bool device_aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Four one-byte codes (little-endian in `word`) at out[0 .. valid): one 4-byte store when all
// four exist and out is aligned, else byte by byte.
__device__ __forceinline__ void store_word4(std::uint8_t* out, int valid, std::uint32_t word) {
  sdk::cuda::store_bytes4(out, 0, valid, valid == 4 && device_aligned(out, 4), word);
}

// Four elements of a F32/BF16/F16 buffer as loaded: 4 FP32 words, or 2 words of packed 16-bit
// values (element 0 in the low half). Decoded only when used (decode4), so a thread can issue
// the loads of several buffers and runs before it waits for the first.
struct Raw4 {
  std::uint32_t w[4];
};

// Elements offset .. offset + 3 of `base`, of which `valid` (0..4) exist (the rest read as +0).
// `vec`: all 4 exist and are aligned (one vector load).
__device__ __forceinline__ void load_raw4(const void* base, std::int32_t dtype,
                                          std::int64_t offset, int valid, bool vec, Raw4& r) {
  if (dtype == QR_DTYPE_F32) {
    const float* p = static_cast<const float*>(base) + offset;
    if (vec) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      r.w[0] = v.x;
      r.w[1] = v.y;
      r.w[2] = v.z;
      r.w[3] = v.w;
      return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) r.w[k] = k < valid ? __float_as_uint(p[k]) : 0u;
    return;
  }
  const std::uint16_t* p = static_cast<const std::uint16_t*>(base) + offset;
  r.w[2] = r.w[3] = 0u;
  if (vec) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x;
    r.w[1] = v.y;
    return;
  }
  r.w[0] = r.w[1] = 0u;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < valid) r.w[k / 2] |= static_cast<std::uint32_t>(p[k]) << (16 * (k % 2));
}

// The four elements widened to FP32 exactly as num::bf16_to_f32 / num::f16_to_f32 widen them
// (num::fast: an F16 NaN stays NaN with the hardware's payload, which no output can show: the
// update's FP32 operations return the device's canonical NaN either way).
__device__ __forceinline__ void decode4(const Raw4& r, std::int32_t dtype, float (&x)[4]) {
  if (dtype == QR_DTYPE_F32) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = __uint_as_float(r.w[k]);
  } else if (dtype == QR_DTYPE_BF16) {
    num::fast::bf16x2_to_f32x2(r.w[0], x[0], x[1]);
    num::fast::bf16x2_to_f32x2(r.w[1], x[2], x[3]);
  } else {
    num::fast::f16x2_to_f32x2(r.w[0], x[0], x[1]);
    num::fast::f16x2_to_f32x2(r.w[1], x[2], x[3]);
  }
}

// x[k] = element offset + k of a F32/BF16/F16 buffer widened to FP32, for k < valid (the rest
// read as +0). `vec`: all 4 exist and are aligned (one vector load).
__device__ __forceinline__ void load4(const void* base, std::int32_t dtype, std::int64_t offset,
                                      int valid, bool vec, float (&x)[4]) {
  Raw4 r;
  load_raw4(base, dtype, offset, valid, vec, r);
  decode4(r, dtype, x);
}

// Stores x[k] for k < valid, rounded to the buffer's dtype (F32, BF16 or F16; RNE).
__device__ __forceinline__ void store4(void* base, std::int32_t dtype, std::int64_t offset,
                                       int valid, bool vec, const float (&x)[4]) {
  if (dtype == QR_DTYPE_F32) {
    float* p = static_cast<float*>(base) + offset;
    if (vec) {
      *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
      return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (k < valid) p[k] = x[k];
    return;
  }
  std::uint16_t h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    h[k] = dtype == QR_DTYPE_BF16 ? num::f32_to_bf16(x[k]) : num::f32_to_f16(x[k]);
  std::uint16_t* p = static_cast<std::uint16_t*>(base) + offset;
  if (vec) {
    *reinterpret_cast<uint2*>(p) =
        make_uint2(static_cast<std::uint32_t>(h[0]) | (static_cast<std::uint32_t>(h[1]) << 16),
                   static_cast<std::uint32_t>(h[2]) | (static_cast<std::uint32_t>(h[3]) << 16));
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < valid) p[k] = h[k];
}

// The update of kN runs of up to 4 elements of o: run i is the valid[i] (0..4) elements at
// element offset[i]. Every load of the kN runs is issued before the first store: the compiler
// may not move a load above a store to a buffer it could alias, so a load-update-store loop
// over runs would keep only one run's loads in flight; here a thread keeps kN of each
// buffer's loads in flight. Leaves the new values in p (+0 beyond valid[i]; a run with valid
// 0 reads and stores nothing).
template <int kN>
__device__ __forceinline__ void update_runs(const Operands& o, const Scalars& s,
                                            const std::int64_t (&offset)[kN],
                                            const int (&valid)[kN], float (&p)[kN][4]) {
  Raw4 rp[kN], rg[kN], rm[kN], rv[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const bool vec = o.vec4 && valid[i] == 4;
    load_raw4(o.param, o.param_dtype, offset[i], valid[i], vec, rp[i]);
    load_raw4(o.grad, o.grad_dtype, offset[i], valid[i], vec, rg[i]);
    load_raw4(o.exp_avg, o.exp_avg_dtype, offset[i], valid[i], vec, rm[i]);
    load_raw4(o.exp_avg_sq, o.exp_avg_sq_dtype, offset[i], valid[i], vec, rv[i]);
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float g[4], m[4], v[4];
    decode4(rp[i], o.param_dtype, p[i]);
    decode4(rg[i], o.grad_dtype, g);
    decode4(rm[i], o.exp_avg_dtype, m);
    decode4(rv[i], o.exp_avg_sq_dtype, v);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (k < valid[i]) update(p[i][k], m[k], v[k], g[k], s);
    if (valid[i] <= 0) continue;
    const bool vec = o.vec4 && valid[i] == 4;
    store4(o.param, o.param_dtype, offset[i], valid[i], vec, p[i]);
    store4(o.exp_avg, o.exp_avg_dtype, offset[i], valid[i], vec, m);
    store4(o.exp_avg_sq, o.exp_avg_sq_dtype, offset[i], valid[i], vec, v);
    if (o.copy != nullptr) store4(o.copy, o.copy_dtype, offset[i], valid[i], vec, p[i]);
  }
}

// Runs of a flat launch (Operands viewed as one array of rows * cols elements): a block owns
// kThreads * 4 * kRunsPerThread consecutive elements from `base`, thread t the runs at base +
// (i * kThreads + t) * 4 (neighbouring threads touch neighbouring bytes), updated kBatch runs
// at a time (update_runs). Calls each(p[k]) with the new values of every run (+0 beyond the
// tensor).
template <int kThreads, int kRunsPerThread, int kBatch, class Each>
__device__ __forceinline__ void update_flat(const Operands& o, const Scalars& s,
                                            std::int64_t base, Each&& each) {
  static_assert(kRunsPerThread % kBatch == 0, "whole batches of runs per thread");
  const std::int64_t n = o.rows * o.cols;
#pragma unroll
  for (int first = 0; first < kRunsPerThread; first += kBatch) {
    std::int64_t offset[kBatch];
    int valid[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      offset[b] = base + (static_cast<std::int64_t>(first + b) * kThreads + threadIdx.x) * 4;
      valid[b] = sdk::cuda::valid_in_run(offset[b], n, 4);
    }
    float p[kBatch][4];
    update_runs<kBatch>(o, s, offset, valid, p);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) each(p[b]);
  }
}

// ---------------------------------------------------------------- tiles

// A block of a tiled multi-tensor launch: its table entry (found by a binary search over the
// entries' first blocks, sdk::cuda::find_group), its index `local` among its tensor's blocks,
// and the origin of its kRows x kCols tile (row-major, entry.tiles_per_row tiles a row).
template <class Entry>
struct TileBlock {
  const Entry& e;
  std::int64_t local, row0, col0;
};

template <int kRows, int kCols, class Table>
__device__ __forceinline__ auto tile_block(const Table& table) {
  const auto& e = table.group[sdk::cuda::find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  using Entry = std::remove_cvref_t<decltype(e)>;
  return TileBlock<Entry>{e, local, (local / e.tiles_per_row) * kRows,
                          (local % e.tiles_per_row) * kCols};
}

// Visits the runs of 4 elements of the kRows x kCols tile at (row0, col0) of a [rows, cols]
// tensor that lie in the tensor: runs of 4 columns of one row (kDownColumns false: rowwise
// codes), or of 4 rows of one column (true: codes stored transposed, [cols, rows]). Calls
// fn(r, c, row, col, valid) with (r, c) the run's first element in the tile, (row, col) in the
// tensor and valid (1..4) its elements inside the tensor. Threads take consecutive runs of a
// line, so neighbouring threads store neighbouring bytes.
template <bool kDownColumns, int kRows, int kCols, int kThreads, class Fn>
__device__ __forceinline__ void for_each_run(std::int64_t row0, std::int64_t col0,
                                             std::int64_t rows, std::int64_t cols, Fn&& fn) {
  constexpr int kAlong = kDownColumns ? kRows : kCols;  // the length of a line of runs
  constexpr int kLines = kDownColumns ? kCols : kRows;
  static_assert(kAlong % 4 == 0, "whole runs of 4 per tile line");
  constexpr int kRunsPerLine = kAlong / 4;
  for (int run = static_cast<int>(threadIdx.x); run < kLines * kRunsPerLine; run += kThreads) {
    const int line = run / kRunsPerLine, at = (run % kRunsPerLine) * 4;
    const int r = kDownColumns ? at : line, c = kDownColumns ? line : at;
    const std::int64_t row = row0 + r, col = col0 + c;
    const int valid = kDownColumns ? (col < cols ? sdk::cuda::valid_in_run(row, rows, 4) : 0)
                                   : (row < rows ? sdk::cuda::valid_in_run(col, cols, 4) : 0);
    if (valid > 0) fn(r, c, row, col, valid);
  }
}

// Updates the tile [row0, row0 + kRows) x [col0, col0 + kCols) of o and leaves the new values
// in `tile` (row-major, kPitch floats per row, shared memory); elements outside the tensor are
// +0 there (they change no amax) and are never stored. Threads take runs of 4 columns, row by
// row, so neighbouring threads touch neighbouring bytes, kBatch runs at a time (update_runs).
// Ends with a block barrier.
template <int kRows, int kCols, int kThreads, int kPitch, int kBatch = 2>
__device__ __forceinline__ void update_tile(const Operands& o, const Scalars& s,
                                            std::int64_t row0, std::int64_t col0, float* tile) {
  static_assert(kCols % 4 == 0 && kPitch >= kCols, "whole runs of 4 columns per tile row");
  constexpr int kRunsPerRow = kCols / 4;
  constexpr int kRuns = kRows * kRunsPerRow;
  static_assert(kRuns % (kThreads * kBatch) == 0, "whole batches of runs per thread");
  for (int first = static_cast<int>(threadIdx.x); first < kRuns; first += kThreads * kBatch) {
    std::int64_t offset[kBatch];
    int valid[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int run = first + b * kThreads;
      const std::int64_t row = row0 + run / kRunsPerRow, col = col0 + (run % kRunsPerRow) * 4;
      valid[b] = row < o.rows ? sdk::cuda::valid_in_run(col, o.cols, 4) : 0;
      offset[b] = row * o.cols + col;
    }
    float p[kBatch][4];
    update_runs<kBatch>(o, s, offset, valid, p);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int run = first + b * kThreads;
      float* out = tile + (run / kRunsPerRow) * kPitch + (run % kRunsPerRow) * 4;
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = p[b][k];
    }
  }
  __syncthreads();
}

// The same tile of an F32 [rows, cols] tensor read as it is (a second pass over new masters);
// every load of a thread's runs is issued before the first store to `tile`.
template <int kRows, int kCols, int kThreads, int kPitch>
__device__ __forceinline__ void load_tile(const float* src, std::int64_t rows, std::int64_t cols,
                                          bool vec4, std::int64_t row0, std::int64_t col0,
                                          float* tile) {
  static_assert(kCols % 4 == 0 && kPitch >= kCols, "whole runs of 4 columns per tile row");
  constexpr int kRunsPerRow = kCols / 4;
  constexpr int kRuns = kRows * kRunsPerRow;
  static_assert(kRuns % kThreads == 0, "whole runs per thread");
  constexpr int kPerThread = kRuns / kThreads;
  float p[kPerThread][4];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int run = static_cast<int>(threadIdx.x) + i * kThreads;
    const std::int64_t row = row0 + run / kRunsPerRow, col = col0 + (run % kRunsPerRow) * 4;
    const int valid = row < rows ? sdk::cuda::valid_in_run(col, cols, 4) : 0;
    load4(src, QR_DTYPE_F32, row * cols + col, valid, vec4 && valid == 4, p[i]);  // +0 if 0
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int run = static_cast<int>(threadIdx.x) + i * kThreads;
    float* out = tile + (run / kRunsPerRow) * kPitch + (run % kRunsPerRow) * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = p[i][k];
  }
  __syncthreads();
}

// ---------------------------------------------------------------- 4 x 4 blocks in registers

// Formats with one scale for a whole tile (per-tensor FP8) need no exchange between threads to
// encode, so a thread keeps a 4 x 4 block of the tile in registers: 4 runs of 4 columns (one
// per row), each encoded to one word of 4 codes along its row; the columnwise words (4 rows of
// one column) are the same codes transposed (transpose_bytes4x4), so no value is staged or
// encoded twice.

// The 4 x 4 block of thread t in a 64 x 64 tile of 256 threads: 8 lanes of a warp along the
// columns and 4 down the rows, so a warp's load of one row of its blocks reads 4 rows of 128
// contiguous bytes, and its columnwise stores write 16 contiguous bytes of 8 columns.
inline constexpr int kQuadTile = 64;
inline constexpr int kQuadThreads = 256;

struct Quad {
  int r, c;  // the block's first row and column in the tile
};

__device__ __forceinline__ Quad quad_of_thread() {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  return {((warp / 2) * 4 + lane / 8) * 4, ((warp % 2) * 8 + lane % 8) * 4};
}

// words[i] holds the codes of row i (column j in byte j); returns column j's word (row i in
// byte i) in words[j].
__device__ __forceinline__ void transpose_bytes4x4(std::uint32_t (&w)[4]) {
  const std::uint32_t t0 = __byte_perm(w[0], w[1], 0x5140);  // a0 b0 a1 b1
  const std::uint32_t t1 = __byte_perm(w[2], w[3], 0x5140);  // c0 d0 c1 d1
  const std::uint32_t t2 = __byte_perm(w[0], w[1], 0x7362);  // a2 b2 a3 b3
  const std::uint32_t t3 = __byte_perm(w[2], w[3], 0x7362);  // c2 d2 c3 d3
  w[0] = __byte_perm(t0, t1, 0x5410);
  w[1] = __byte_perm(t0, t1, 0x7632);
  w[2] = __byte_perm(t2, t3, 0x5410);
  w[3] = __byte_perm(t2, t3, 0x7632);
}

// The rows of a quad as runs: offset[i] of row row0 + i (columns col0 .. col0 + 3) in a
// [rows, cols] row-major tensor and valid[i] its columns inside the tensor (0 past the end).
__device__ __forceinline__ void quad_runs(std::int64_t row0, std::int64_t col0,
                                          std::int64_t rows, std::int64_t cols,
                                          std::int64_t (&offset)[4], int (&valid)[4]) {
  const int in_row = sdk::cuda::valid_in_run(col0, cols, 4);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    offset[i] = (row0 + i) * cols + col0;
    valid[i] = row0 + i < rows ? in_row : 0;
  }
}

// Stores the codes of a quad at (row0, col0) of a [rows, cols] tensor: words[i] (row i's codes)
// rowwise at rowwise[row * cols + col] when rowwise is set; then, transposed, column j's codes
// at columnwise[col * rows + row] when columnwise is set. Only elements inside the tensor.
__device__ __forceinline__ void store_quad(std::uint8_t* rowwise, std::uint8_t* columnwise,
                                           std::int64_t row0, std::int64_t col0,
                                           std::int64_t rows, std::int64_t cols,
                                           std::uint32_t (&words)[4]) {
  const int in_row = sdk::cuda::valid_in_run(col0, cols, 4);
  const int in_col = sdk::cuda::valid_in_run(row0, rows, 4);
  if (rowwise != nullptr) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < in_col && in_row > 0)
        store_word4(rowwise + (row0 + i) * cols + col0, in_row, words[i]);
  }
  if (columnwise != nullptr) {
    transpose_bytes4x4(words);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < in_row && in_col > 0)
        store_word4(columnwise + (col0 + j) * rows + row0, in_col, words[j]);
  }
}

// ---------------------------------------------------------------- launching over tables

// The tensors of one call, kMax at a time (a __grid_constant__ table, sdk::cuda::GroupTable):
// table.group[i] = make(index of the tensor), then launch(table), per table.
template <class Table, class Make, class Launch>
void for_each_table(std::size_t count, Make&& make, Launch&& launch) {
  constexpr std::size_t kMax = sizeof(Table::group) / sizeof(Table::group[0]);
  for (std::size_t first = 0; first < count; first += kMax) {
    Table table{};
    const std::size_t n = count - first < kMax ? count - first : kMax;
    table.count = static_cast<int>(n);
    for (std::size_t i = 0; i < n; ++i) table.group[i] = make(first + i);
    launch(table);
  }
}

// Sets each entry's first_block to the prefix sum of blocks_of(entry) and returns the total,
// checked to fit one grid (`format` names the plugin in the error).
template <class Table, class BlocksOf>
std::int64_t assign_blocks(Table& table, BlocksOf&& blocks_of, const char* format) {
  std::int64_t blocks = 0;
  for (int i = 0; i < table.count; ++i) {
    table.group[i].first_block = blocks;
    blocks += blocks_of(table.group[i]);
  }
  QR_CHECK(blocks <= 0x7FFFFFFF, format, " adam_requantize: ", blocks, " blocks; at most "
           "2^31 - 1 fit in one grid");
  return blocks;
}

// The data and scale_inv pointers of direction d of a destination, both nullptr when it does
// not hold d.
template <class Scale>
inline void direction_buffers(const qr_quantized_tensor& dst, qr_direction d,
                              std::uint8_t*& data, Scale*& scale_inv) {
  const bool held = (dst.usage & (d == QR_DIRECTION_ROWWISE ? QR_USAGE_ROWWISE
                                                            : QR_USAGE_COLUMNWISE)) != 0;
  const qr_direction_data& dd = d == QR_DIRECTION_ROWWISE ? dst.rowwise : dst.columnwise;
  data = held ? static_cast<std::uint8_t*>(dd.data.data) : nullptr;
  scale_inv = held ? static_cast<Scale*>(dd.scale_inv.data) : nullptr;
}

// The common entry of a plugin's device pass (plugin_sdk_adam.hpp): the argument checks, the
// tensors' device made current, then launch(table, stream) for each table of entries
// make(tensors[i], plans[i]). `format` names the plugin in errors.
template <class Table, class Plan, class Make, class Launch>
void run_tables(std::span<const qr_adam_tensor> tensors, std::span<const Plan> plans,
                void* stream, const char* format, Make&& make, Launch&& launch) {
  QR_CHECK(tensors.size() == plans.size(), format, " adam_requantize: ", plans.size(),
           " plans for ", tensors.size(), " tensors");
  if (tensors.empty()) return;
  const qr_device device = tensors[0].master.device;
  QR_CHECK(device.type == QR_DEVICE_CUDA, format, " adam_requantize: the CUDA path got "
           "tensors on ", device.type == QR_DEVICE_CPU ? "the CPU" : "another device");
  sdk::cuda::DeviceGuard guard(device.index, format);
  const cudaStream_t s = sdk::cuda::as_stream(stream);
  for_each_table<Table>(tensors.size(), [&](std::size_t i) { return make(tensors[i], plans[i]); },
                        [&](Table& table) { launch(table, s); });
}

// The amax buffers of a destination: `main` is rowwise's when it is held (a pass reduces
// into it), `other` the columnwise one when both are held (filled from main), else nullptr.
inline void amax_targets(const qr_quantized_tensor& dst, float*& main, float*& other) {
  const bool rowwise = (dst.usage & QR_USAGE_ROWWISE) != 0;
  const bool columnwise = (dst.usage & QR_USAGE_COLUMNWISE) != 0;
  float* row = rowwise ? static_cast<float*>(dst.rowwise.amax.data) : nullptr;
  float* col = columnwise ? static_cast<float*>(dst.columnwise.amax.data) : nullptr;
  main = rowwise ? row : col;
  other = rowwise ? col : nullptr;
}

// ---------------------------------------------------------------- passes of tensor-amax formats

// Formats whose scale needs the tensor amax of the new master (per-tensor FP8 with current
// scaling, the tensor scale of block-and-tensor scaled FP4) update in a first pass that also reduces the amax, and cast
// in a second. Their tables (sdk::cuda::GroupTable) hold entries with at least
//   Operands ops; DeviceHyper hyper; float* amax_main; float* amax_other;
//   std::int64_t first_block;
// amax_main receives the amax; amax_other (or nullptr) is the other direction's buffer, which
// the format's cast pass fills from amax_main.
inline constexpr int kAmaxThreads = 256;
inline constexpr int kAmaxRunsPerThread = 4;
inline constexpr int kAmaxBatch = 2;  // runs whose loads a thread keeps in flight (update_runs)
inline constexpr int kAmaxMinBlocks = 4;  // at most 64 registers (50% occupancy): no spills
inline constexpr std::int64_t kAmaxChunk =
    static_cast<std::int64_t>(kAmaxThreads) * 4 * kAmaxRunsPerThread;

// Every entry's amax targets start at +0 (they hold the previous step's values). One thread
// per entry.
template <class Table>
__global__ void zero_amax_kernel(const __grid_constant__ Table table) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= table.count) return;
  if (table.group[t].amax_main != nullptr) *table.group[t].amax_main = 0.0f;
  if (table.group[t].amax_other != nullptr) *table.group[t].amax_other = 0.0f;
}

// The update of one chunk of kAmaxChunk elements of a tensor (as a flat array), then the
// chunk's max |new value| (NaN ignored) into amax_main by one atomic max.
template <class Table>
__global__ void __launch_bounds__(kAmaxThreads, kAmaxMinBlocks)
    update_amax_kernel(const __grid_constant__ Table table) {
  const auto& e = table.group[sdk::cuda::find_group(table, blockIdx.x)];
  const Scalars s = block_scalars(e.hyper);
  const std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) - e.first_block) * kAmaxChunk;
  float running = 0.0f;
  update_flat<kAmaxThreads, kAmaxRunsPerThread, kAmaxBatch>(
      e.ops, s, base, [&](const float (&p)[4]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) running = sdk::cuda::amax_of(running, p[k]);  // +0 past end
      });
  const float block = sdk::cuda::block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) sdk::cuda::atomic_max_nonnegative(e.amax_main, block);
}

// The first pass over a table: zero the amax targets, then update every tensor and reduce its
// amax (first_block is rewritten for the update's chunks). `format` names the plugin in errors.
template <class Table>
void launch_update_amax(Table& table, cudaStream_t stream, const char* format) {
  zero_amax_kernel<Table><<<1, sizeof(table.group) / sizeof(table.group[0]), 0, stream>>>(table);
  sdk::cuda::check_cuda(cudaGetLastError(), format, "launch of zero_amax_kernel", QR_WHERE());
  const std::int64_t blocks = assign_blocks(table, [](const auto& e) {
    return (e.ops.rows * e.ops.cols + kAmaxChunk - 1) / kAmaxChunk;
  }, format);
  if (blocks == 0) return;
  update_amax_kernel<Table><<<static_cast<unsigned>(blocks), kAmaxThreads, 0, stream>>>(table);
  sdk::cuda::check_cuda(cudaGetLastError(), format, "launch of update_amax_kernel", QR_WHERE());
}

// Tiles of kRows x kCols covering a [rows, cols] tensor (at least 1, so an empty tensor still
// gets the block that writes its scalars).
inline std::int64_t tiles_of(std::int64_t rows, std::int64_t cols, int kRows, int kCols) {
  const std::int64_t t = ((rows + kRows - 1) / kRows) * ((cols + kCols - 1) / kCols);
  return t < 1 ? 1 : t;
}

}  // namespace qrecipe::adam::cuda
