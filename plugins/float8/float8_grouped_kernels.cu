// CUDA kernels of grouped float8 quantization (float8_grouped_kernels.hpp), bit-exact with
// float8_ref.cpp applied to each group alone.
//
// Map of this file (STYLE.md rule 11):
//   1. the group table (kernel parameter) and the block -> group lookup
//   2. kernels: zero the amax targets, grouped amax, grouped cast (+ transpose)
//   3. launchers (grid arithmetic, dtype dispatch) and the entry
//
// One launch serves every group: the groups' outputs (each expert's own buffers) and row
// ranges travel in a table passed by value as a kernel parameter (__grid_constant__), and a
// block finds its group by a binary search over the table's prefix sums of blocks (the "one
// offsets computation" is done once on the host per call). Tiles never cross a group
// boundary, so each group sees exactly the tiles a per-group launch would.
//
// Exactness: per group, amax = max |x| (NaN ignored; an exact max, so the reduction order
// does not matter); current scaling: scale = scale_from_amax(amax, fmax, pow2, eps)
// (scaling.hpp), delayed: the state's scale; scale_inv = 1 / scale (IEEE, --prec-div=true);
// q = sat_rne(fp32(x) * scale) through num::fast (fast_conversions.cuh, proven equal to
// conversions.hpp); columnwise = the transpose of the rowwise codes. The plugin is compiled
// with -fmad=false --ftz=false (QrecipeCompileFlags.cmake), like float8_kernels.cu.
#include "float8_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::cuda {
namespace {

constexpr const char* kFormat = "float8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::BF16In;
using sdk::cuda::block_max;
using sdk::cuda::DeviceGuard;
using sdk::cuda::F16In;
using sdk::cuda::F32In;

// Device-side alignment test of a pointer.
__device__ __forceinline__ bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// ---------------------------------------------------------------- 1. the group table

struct GroupEntry {
  std::int64_t rows;         // rows of the group
  std::int64_t row_offset;   // its first row in the source
  std::int64_t first_block;  // its first block in the launch (prefix sum of blocks)
  std::uint8_t* rowwise;
  std::uint8_t* columnwise;
  float* rowwise_scale_inv;
  float* columnwise_scale_inv;
  float* amax_main;   // the amax current scaling reduces into and reads the scale from
  float* amax_other;  // the other direction's amax buffer (both requested), or nullptr
};

using GroupTable = sdk::cuda::GroupTable<GroupEntry, kMaxGroupsPerLaunch>;
using sdk::cuda::find_group;

// FP8 outputs: four scaled values to four codes in one word (element 0 in the lowest byte).
struct E4M3Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e4m3x4(a, b, c, d);
  }
};
struct E5M2Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e5m2x4(a, b, c, d);
  }
};

// Loads src[offset .. offset + 4), `valid` of them (the rest read as +0, which changes no
// amax and whose codes are never stored); one vector load when all 4 exist and are aligned.
template <class In>
__device__ __forceinline__ void load4(const typename In::Storage* src, std::int64_t offset,
                                      int valid, float (&x)[4]) {
  using Storage = typename In::Storage;
  const Storage* p = src + offset;
  if (valid == 4 && aligned_to(p, 4 * sizeof(Storage))) {
    if constexpr (sizeof(Storage) == 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      x[0] = In::to_f32(__uint_as_float(v.x));
      x[1] = In::to_f32(__uint_as_float(v.y));
      x[2] = In::to_f32(__uint_as_float(v.z));
      x[3] = In::to_f32(__uint_as_float(v.w));
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      x[0] = In::to_f32(static_cast<Storage>(v.x & 0xFFFFu));
      x[1] = In::to_f32(static_cast<Storage>(v.x >> 16));
      x[2] = In::to_f32(static_cast<Storage>(v.y & 0xFFFFu));
      x[3] = In::to_f32(static_cast<Storage>(v.y >> 16));
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = k < valid ? In::to_f32(p[k]) : 0.0f;
}

// ---------------------------------------------------------------- 2. kernels

// Every group's amax targets start at +0 (a requantization finds old values there).
__global__ void zero_amax_kernel(const __grid_constant__ GroupTable table) {
  const int g = static_cast<int>(threadIdx.x);
  if (g >= table.count) return;
  if (table.group[g].amax_main) *table.group[g].amax_main = 0.0f;
  if (table.group[g].amax_other) *table.group[g].amax_other = 0.0f;
}

// Grouped amax (current scaling): each block reduces one chunk of kAmaxChunk consecutive
// elements of one group (kAmaxPerThread per thread), then one atomic max into the group's
// amax_main. Groups are contiguous element ranges of the source.
constexpr int kAmaxThreads = 256;
constexpr int kAmaxPerThread = 16;
constexpr std::int64_t kAmaxChunk = static_cast<std::int64_t>(kAmaxThreads) * kAmaxPerThread;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    grouped_amax_kernel(const typename In::Storage* __restrict__ src, std::int64_t cols,
                        const __grid_constant__ GroupTable table) {
  const int g = find_group(table, blockIdx.x);
  const GroupEntry& e = table.group[g];
  const std::int64_t numel = e.rows * cols;
  const typename In::Storage* base = src + e.row_offset * cols;
  const std::int64_t start =
      (static_cast<std::int64_t>(blockIdx.x) - e.first_block) * kAmaxChunk +
      static_cast<std::int64_t>(threadIdx.x) * kAmaxPerThread;
  float running = 0.0f;
  float x[kAmaxPerThread / 4][4];
#pragma unroll
  for (int v = 0; v < kAmaxPerThread / 4; ++v) {  // every load issued before any is used
    const std::int64_t offset = start + 4 * v;
    const std::int64_t left = numel - offset;
    load4<In>(base, offset, left <= 0 ? 0 : (left >= 4 ? 4 : static_cast<int>(left)), x[v]);
  }
#pragma unroll
  for (int v = 0; v < kAmaxPerThread / 4; ++v)
#pragma unroll
    for (int k = 0; k < 4; ++k) running = amax_of(running, x[v][k]);
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) atomic_max_nonnegative(e.amax_main, block);
}

// Grouped cast (+ transpose): one block per kTile x kTile tile of one group (an empty group
// gets one block, which only writes its scalars).
// Phase 1: thread (cq, rq) = (t % 16, t / 16) loads 4 columns x kTile/16 rows, encodes them,
// stores the rowwise codes (one word per 4 codes when aligned) and parks the words in the
// shared tile. Phase 2 (columnwise requested): thread (c, seg) = (t / 4, t % 4) gathers 16
// consecutive rows of tile column c and stores them as one 16-byte run of the group's
// columnwise [cols, rows] output (bytewise at ragged edges or unaligned outputs).
constexpr int kCastThreads = 256;
constexpr int kTile = 64;
constexpr int kColQuads = kTile / 4;                   // 16 threads across a tile row
constexpr int kRowsPerPass = kCastThreads / kColQuads;  // 16
constexpr int kPasses = kTile / kRowsPerPass;           // 4
constexpr int kTileWordsPerRow = kTile / 4 + 1;         // +1 word of padding against conflicts
static_assert(kCastThreads == kTile * 4, "phase 2: four threads (16 rows each) per column");

struct CastParams {
  std::int64_t cols;
  std::int64_t tiles_per_row;
  float fmax;
  bool pow2_scales;
  float amax_epsilon;
  const float* delayed_scale;  // nullptr: current scaling
  float* history_row0;         // delayed scaling: every group's amax joins it
};

template <class In, class Out>
__global__ void __launch_bounds__(kCastThreads)
    grouped_cast_kernel(const typename In::Storage* __restrict__ src, const CastParams p,
                        const __grid_constant__ GroupTable table) {
  __shared__ std::uint32_t tile[kTile][kTileWordsPerRow];
  const int g = find_group(table, blockIdx.x);
  const GroupEntry& e = table.group[g];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  const std::int64_t row0 = (local / p.tiles_per_row) * kTile;
  const std::int64_t col0 = (local % p.tiles_per_row) * kTile;
  const bool current = p.delayed_scale == nullptr;
  const float scale = current ? scale_from_amax(*e.amax_main, p.fmax, p.pow2_scales,
                                                p.amax_epsilon)
                              : *p.delayed_scale;
  if (local == 0 && threadIdx.x == 0) {
    const float scale_inv = 1.0f / scale;
    if (e.rowwise_scale_inv) *e.rowwise_scale_inv = scale_inv;
    if (e.columnwise_scale_inv) *e.columnwise_scale_inv = scale_inv;
    if (current && e.amax_other) *e.amax_other = *e.amax_main;  // both directions store it
  }

  // Phase 1.
  const int cq = static_cast<int>(threadIdx.x) % kColQuads;
  const int rq = static_cast<int>(threadIdx.x) / kColQuads;
  const std::int64_t c = col0 + 4 * cq;
  const std::int64_t left_cols = p.cols - c;
  const int valid_cols = left_cols <= 0 ? 0 : (left_cols >= 4 ? 4 : static_cast<int>(left_cols));
  const typename In::Storage* base = src + e.row_offset * p.cols;
  float x[kPasses][4];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {  // every load issued before any is used
    const std::int64_t r = row0 + pass * kRowsPerPass + rq;
    load4<In>(base, r * p.cols + c, r < e.rows ? valid_cols : 0, x[pass]);
  }
  float running = 0.0f;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int tr = pass * kRowsPerPass + rq;
    const std::int64_t r = row0 + tr;
#pragma unroll
    for (int k = 0; k < 4; ++k) running = amax_of(running, x[pass][k]);
    const std::uint32_t word = Out::encode4(x[pass][0] * scale, x[pass][1] * scale,
                                            x[pass][2] * scale, x[pass][3] * scale);
    tile[tr][cq] = word;
    if (e.rowwise != nullptr && r < e.rows && valid_cols > 0) {
      std::uint8_t* out = e.rowwise + r * p.cols + c;
      if (valid_cols == 4 && aligned_to(out, 4)) {
        *reinterpret_cast<std::uint32_t*>(out) = word;
      } else {
        for (int k = 0; k < valid_cols; ++k) out[k] = static_cast<std::uint8_t>(word >> (8 * k));
      }
    }
  }

  // Delayed scaling observes the amax while it casts: the group's amax buffers and row 0.
  if (!current) {
    const float block = block_max<kCastThreads>(running);  // contains __syncthreads
    if (threadIdx.x == 0 && block > 0.0f) {
      if (e.amax_main) atomic_max_nonnegative(e.amax_main, block);
      if (e.amax_other) atomic_max_nonnegative(e.amax_other, block);
      if (p.history_row0) atomic_max_nonnegative(p.history_row0, block);
    }
  }
  if (e.columnwise == nullptr) return;
  __syncthreads();

  // Phase 2: columnwise[gc][row0 + 16 seg ..] = codes of tile column tc.
  const int tc = static_cast<int>(threadIdx.x) / 4;
  const int seg = static_cast<int>(threadIdx.x) % 4;
  const std::int64_t gc = col0 + tc;
  if (gc >= p.cols) return;
  const std::int64_t r_first = row0 + 16 * seg;
  const std::int64_t left_rows = e.rows - r_first;
  if (left_rows <= 0) return;
  const int valid_rows = left_rows >= 16 ? 16 : static_cast<int>(left_rows);
  std::uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const std::uint32_t code = (tile[16 * seg + i][tc / 4] >> (8 * (tc % 4))) & 0xFFu;
    words[i / 4] |= code << (8 * (i % 4));
  }
  std::uint8_t* out = e.columnwise + gc * e.rows + r_first;
  if (valid_rows == 16 && aligned_to(out, 16)) {
    *reinterpret_cast<uint4*>(out) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    for (int i = 0; i < valid_rows; ++i)
      out[i] = static_cast<std::uint8_t>(words[i / 4] >> (8 * (i % 4)));
  }
}

// ---------------------------------------------------------------- 3. launchers, entry

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

unsigned grid_of(std::int64_t blocks, const char* kernel) {
  QR_CHECK(blocks <= INT_MAX, "float8 grouped ", kernel, ": ", blocks, " blocks; at most ",
           INT_MAX, " fit in one grid");
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <class In, class Out>
void launch_chunk(const GroupedCastArgs& a, GroupTable& table, cudaStream_t stream) {
  using Storage = typename In::Storage;
  const auto* src = static_cast<const Storage*>(a.src);
  zero_amax_kernel<<<1, kMaxGroupsPerLaunch, 0, stream>>>(table);
  QR_CUDA_CHECK_LAUNCH("zero_amax_kernel");
  const bool current = a.delayed_scale == nullptr;
  if (current) {  // one amax launch for every group of the chunk
    std::int64_t blocks = 0;
    for (int g = 0; g < table.count; ++g) {
      table.group[g].first_block = blocks;
      blocks += ceil_div(table.group[g].rows * a.cols, kAmaxChunk);
    }
    if (blocks > 0) {
      grouped_amax_kernel<In><<<grid_of(blocks, "amax"), kAmaxThreads, 0, stream>>>(
          src, a.cols, table);
      QR_CUDA_CHECK_LAUNCH("grouped_amax_kernel");
    }
  }
  CastParams p{};
  p.cols = a.cols;
  p.tiles_per_row = a.cols == 0 ? 1 : ceil_div(a.cols, kTile);
  p.fmax = a.fmax;
  p.pow2_scales = a.pow2_scales;
  p.amax_epsilon = a.amax_epsilon;
  p.delayed_scale = a.delayed_scale;
  p.history_row0 = a.history_row0;
  std::int64_t blocks = 0;
  for (int g = 0; g < table.count; ++g) {  // at least one block per group (its scalars)
    table.group[g].first_block = blocks;
    const std::int64_t tiles = ceil_div(table.group[g].rows, kTile) * p.tiles_per_row;
    blocks += tiles < 1 ? 1 : tiles;
  }
  grouped_cast_kernel<In, Out><<<grid_of(blocks, "cast"), kCastThreads, 0, stream>>>(src, p,
                                                                                   table);
  QR_CUDA_CHECK_LAUNCH("grouped_cast_kernel");
}

template <class In>
void dispatch_out(const GroupedCastArgs& a, GroupTable& table, cudaStream_t stream) {
  if (a.data_dtype == QR_DTYPE_E4M3) launch_chunk<In, E4M3Out>(a, table, stream);
  else launch_chunk<In, E5M2Out>(a, table, stream);
}

}  // namespace

void quantize_grouped(const GroupedCastArgs& a) {
  QR_CHECK(a.src_dtype == QR_DTYPE_F32 || a.src_dtype == QR_DTYPE_BF16 ||
               a.src_dtype == QR_DTYPE_F16,
           "float8 CUDA quantize_grouped: source dtype code ", static_cast<int>(a.src_dtype),
           " is not f32, bf16 or f16");
  QR_CHECK(a.data_dtype == QR_DTYPE_E4M3 || a.data_dtype == QR_DTYPE_E5M2,
           "float8 CUDA quantize_grouped: data dtype code ", static_cast<int>(a.data_dtype),
           " is not e4m3 or e5m2");
  QR_CHECK(!a.groups.empty(), "float8 CUDA quantize_grouped: no groups");
  QR_CHECK(a.cols >= 0, "float8 CUDA quantize_grouped: negative column count ", a.cols);
  const bool rowwise = a.groups[0].rowwise_scale_inv != nullptr;
  const bool columnwise = a.groups[0].columnwise_scale_inv != nullptr;
  QR_CHECK(rowwise || columnwise, "float8 CUDA quantize_grouped: no direction requested");
  std::int64_t total_rows = 0;
  for (std::size_t g = 0; g < a.groups.size(); ++g) {
    const GroupOutputs& o = a.groups[g];
    QR_CHECK(o.rows >= 0, "float8 CUDA quantize_grouped: group ", g, " has ", o.rows, " rows");
    QR_CHECK((o.rowwise_scale_inv != nullptr) == rowwise &&
                 (o.columnwise_scale_inv != nullptr) == columnwise,
             "float8 CUDA quantize_grouped: group ", g, " requests other directions than "
             "group 0; every group must request the same");
    const bool empty = o.rows * a.cols == 0;
    QR_CHECK((!rowwise || ((o.rowwise || empty) && o.rowwise_amax)) &&
                 (!columnwise || ((o.columnwise || empty) && o.columnwise_amax)),
             "float8 CUDA quantize_grouped: group ", g, " lacks a data or amax buffer");
    total_rows += o.rows;
  }
  QR_CHECK(total_rows * a.cols == 0 || a.src != nullptr,
           "float8 CUDA quantize_grouped: the source has a null data pointer");
  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t stream = as_stream(a.stream);
  std::int64_t row = 0;
  for (std::size_t first = 0; first < a.groups.size(); first += kMaxGroupsPerLaunch) {
    GroupTable table{};
    const std::size_t n = a.groups.size() - first < static_cast<std::size_t>(kMaxGroupsPerLaunch)
                              ? a.groups.size() - first
                              : static_cast<std::size_t>(kMaxGroupsPerLaunch);
    table.count = static_cast<int>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const GroupOutputs& o = a.groups[first + i];
      GroupEntry& e = table.group[i];
      e.rows = o.rows;
      e.row_offset = row;
      row += o.rows;
      e.rowwise = o.rowwise;
      e.columnwise = o.columnwise;
      e.rowwise_scale_inv = o.rowwise_scale_inv;
      e.columnwise_scale_inv = o.columnwise_scale_inv;
      e.amax_main = rowwise ? o.rowwise_amax : o.columnwise_amax;
      e.amax_other = rowwise && columnwise ? o.columnwise_amax : nullptr;
    }
    switch (a.src_dtype) {
      case QR_DTYPE_F32: dispatch_out<F32In>(a, table, stream); break;
      case QR_DTYPE_BF16: dispatch_out<BF16In>(a, table, stream); break;
      default: dispatch_out<F16In>(a, table, stream); break;
    }
  }
}

}  // namespace qrecipe::float8::cuda
