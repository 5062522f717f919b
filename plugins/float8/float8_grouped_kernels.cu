// CUDA kernels of grouped float8 quantization (float8_grouped_kernels.hpp), bit-exact with
// float8_ref.cpp applied to each group alone.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11):
//   1. the group table (kernel parameter)
//   2. device helpers: a group's scale and scalars, its amax under delayed scaling
//   3. kernels: zero the amax targets, grouped amax, grouped casts (rowwise chunks; cast +
//      transpose tiles)
//   4. launchers (table chunks, grid arithmetic, dtype dispatch) and the entry
//   5. device-split groups: the layout kernel, the launches sized for any split, the entry
//
// One launch serves every group: the groups' outputs (each expert's own buffers) and row
// ranges travel in a table passed by value as a kernel parameter (__grid_constant__), and a
// block finds its group by a binary search over the table's prefix sums of blocks (the "one
// offsets computation" is done once on the host per call). A cast block runs the one-tensor
// kernels' code on its group (float8_device.cuh: the rowwise chunk when only rowwise is
// requested, else the cast + transpose tile), with the flags the one-tensor launch would
// compute for that group alone; chunks and tiles never cross a group boundary, so each group
// sees exactly the blocks a per-group launch would. Device-split groups (section 5) run the
// same kernels on a table in device memory that a one-block layout kernel writes from the
// offsets (sdk::cuda::DeviceGroupTable: blocks past the real count return at once).
//
// Exactness: per group, amax = max |x| (NaN ignored; an exact max, so the reduction order
// does not matter); current scaling: scale = scale_from_amax(amax, fmax, pow2, eps)
// (scaling.hpp), delayed: the state's scale; scale_inv = 1 / scale (IEEE, --prec-div=true);
// the codes are the one-tensor cast's. The plugin is compiled with -fmad=false --ftz=false
// (QrecipeCompileFlags.cmake), like float8_kernels.cu.
#include "float8_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "float8_device.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::cuda {
namespace {

constexpr const char* kFormat = "float8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

using sdk::cuda::find_group;
using sdk::cuda::past_end;

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
  std::int64_t columnwise_ld;  // bytes between the rows of the columnwise [cols, rows] codes
  // The vector paths of the group's blocks, as the one-tensor launch sets them for it alone:
  TileFlags flags;  // cast + transpose tiles
  bool aligned;     // rowwise chunks: source 16-byte and rowwise data 8-byte aligned
};

using GroupTable = sdk::cuda::GroupTable<GroupEntry, kMaxGroupsPerLaunch>;
using DeviceTable = sdk::cuda::DeviceGroupTable<GroupEntry>;

// What every cast block of a launch shares.
struct CastParams {
  std::int64_t cols;
  unsigned tiles_per_row;  // cast + transpose tiles across a group's columns
  float fmax;
  bool pow2_scales;
  float amax_epsilon;
  const float* delayed_scale;  // nullptr: current scaling
  float* history_row0;         // delayed scaling: every group's amax joins it
};

// ---------------------------------------------------------------- 2. device helpers

// Loads src[offset .. offset + 4), `valid` of them (the rest read as +0, which changes no
// amax); one vector load when all 4 exist and are aligned.
template <class In>
__device__ __forceinline__ void load4(const typename In::Storage* src, std::int64_t offset,
                                      int valid, float (&x)[4]) {
  using Storage = typename In::Storage;
  const Storage* p = src + offset;
  if (valid == 4 && is_aligned(p, 4 * sizeof(Storage))) {
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

// The group's scale (current scaling: from its amax, which the amax launch before left in
// amax_main; delayed: the state's), and, in its first block, its scale_inv = 1 / scale and the
// amax copy of its other direction.
__device__ __forceinline__ float group_scale(const CastParams& p, const GroupEntry& e,
                                             std::int64_t local) {
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
  return scale;
}

// Delayed scaling observes the amax while it casts: the block's amax joins the group's amax
// buffers and the history row 0. Block-uniform (every thread calls it).
template <int kThreads>
__device__ __forceinline__ void observe_group_amax(const CastParams& p, const GroupEntry& e,
                                                   float running) {
  if (p.delayed_scale == nullptr) return;
  const float block = block_max<kThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) {
    if (e.amax_main) atomic_max_nonnegative(e.amax_main, block);
    if (e.amax_other) atomic_max_nonnegative(e.amax_other, block);
    if (p.history_row0) atomic_max_nonnegative(p.history_row0, block);
  }
}

// ---------------------------------------------------------------- 3. kernels

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

template <class In, class Table>
__global__ void __launch_bounds__(kAmaxThreads)
    grouped_amax_kernel(const typename In::Storage* __restrict__ src, std::int64_t cols,
                        const __grid_constant__ Table table) {
  if (past_end(table, blockIdx.x)) return;
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

// Grouped rowwise cast (rowwise requested alone): block b casts chunk b - first_block of its
// group, flat, with the code of the one-tensor cast_rowwise_kernel. An empty group gets one
// block, which only writes its scalars.
template <class In, class Out, int kUnits, class Table>
__global__ void __launch_bounds__(kRowwiseThreads)
    grouped_cast_rowwise_kernel(const typename In::Storage* __restrict__ src, const CastParams p,
                                const __grid_constant__ Table table) {
  if (past_end(table, blockIdx.x)) return;
  const GroupEntry& e = table.group[find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  const typename In::Storage* base = src + e.row_offset * p.cols;
  const RowwiseChunk k = rowwise_chunk<In, kUnits>(local, e.rows * p.cols, e.aligned);
  uint4 raw[kUnits][kUnit / In::kPerVector];
  load_rowwise_chunk<In, kUnits>(base, k, raw);
  const float scale = group_scale(p, e, local);
  const float running = cast_rowwise_chunk<In, Out, kUnits>(base, k, scale, raw, e.rowwise);
  observe_group_amax<kRowwiseThreads>(p, e, running);
}

// Grouped cast + transpose (columnwise requested; rowwise optional): block b casts tile
// b - first_block of its group with the code of the one-tensor cast_transpose_kernel. An
// empty group gets one block, which only writes its scalars.
template <class In, class Out, class Table>
__global__ void __launch_bounds__(TileShape<In>::kThreads, TileShape<In>::kMinBlocksPerSm)
    grouped_cast_transpose_kernel(const typename In::Storage* __restrict__ src,
                                  const CastParams p, const __grid_constant__ Table table) {
  using T = TileShape<In>;
  __shared__ alignas(16) std::uint32_t tile[T::kCols][T::kWordsPerCol];
  if (past_end(table, blockIdx.x)) return;
  const GroupEntry& e = table.group[find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  const typename In::Storage* base = src + e.row_offset * p.cols;
  const CastTile at =
      cast_tile<In>(static_cast<unsigned>(local), p.tiles_per_row, e.rows, p.cols, e.flags);
  uint4 raw[T::kPasses][T::kMicroRows];
  load_cast_tile<In>(base, p.cols, at, raw);
  const float scale = group_scale(p, e, local);
  const float running = cast_transpose_tile<In, Out>(base, e.rows, p.cols, at, scale, raw,
                                                     e.rowwise, e.columnwise, e.columnwise_ld,
                                                     e.flags, tile);
  observe_group_amax<T::kThreads>(p, e, running);
}

// ---------------------------------------------------------------- 4. launchers, entry

unsigned grid_of(std::int64_t blocks, const char* kernel) {
  QR_CHECK(blocks <= INT_MAX, "float8 grouped ", kernel, ": ", blocks, " blocks; at most ",
           INT_MAX, " fit in one grid");
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

__host__ __device__ inline std::int64_t div_up(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// A group's vector paths, as launch_rowwise / launch_cast_transpose of float8_kernels.cu set
// them for the group alone (host or device: the device-split layout kernel).
template <class In>
__host__ __device__ inline void set_vector_paths(GroupEntry& e, const typename In::Storage* src,
                                                 std::int64_t cols) {
  using T = TileShape<In>;
  const typename In::Storage* group_src = src + e.row_offset * cols;
  e.aligned = is_aligned(group_src, 16) && is_aligned(e.rowwise, 8);
  e.flags.vector_rows = is_aligned(group_src, 16) && cols % T::kVector == 0 &&
                        (e.rowwise == nullptr || is_aligned(e.rowwise, T::kVector));
  e.flags.vector_columns = is_aligned(e.columnwise, 16) && e.columnwise_ld % 16 == 0;
}

// The blocks of a group of `rows` rows in the amax launch, and in the cast launch: cast +
// transpose tiles when columnwise is requested, else rowwise chunks; at least one (its scalars).
__host__ __device__ inline std::int64_t amax_blocks(std::int64_t rows, std::int64_t cols) {
  return div_up(rows * cols, kAmaxChunk);
}

template <class In>
__host__ __device__ inline std::int64_t cast_blocks(std::int64_t rows, std::int64_t cols,
                                                    bool columnwise) {
  using T = TileShape<In>;
  constexpr std::int64_t kChunk = std::int64_t{kRowwiseThreads} * kRowwiseUnits<In> * kUnit;
  // No columns: no tiles however many rows (an empty group still writes its scalars).
  const std::int64_t blocks = columnwise
                                  ? (cols == 0 ? 0 : div_up(rows, T::kRows) * div_up(cols, T::kCols))
                                  : div_up(rows * cols, kChunk);
  return blocks < 1 ? 1 : blocks;
}

// What every cast block shares, from the host or the device-split arguments.
template <class In, class Args>
CastParams cast_params(const Args& a) {
  CastParams p{};
  p.cols = a.cols;
  p.tiles_per_row =
      static_cast<unsigned>(a.cols == 0 ? 1 : div_up(a.cols, TileShape<In>::kCols));
  p.fmax = a.fmax;
  p.pow2_scales = a.pow2_scales;
  p.amax_epsilon = a.amax_epsilon;
  p.delayed_scale = a.delayed_scale;
  p.history_row0 = a.history_row0;
  return p;
}

// The launches of a table of either kind (`amax_grid` / `cast_grid` blocks; no amax launch
// under delayed scaling or when it has no blocks).
template <class In, class Out, class Table>
void launch_amax_and_cast(const typename In::Storage* src, const CastParams& p,
                          const Table& amax_table, std::int64_t amax_grid,
                          const Table& cast_table, std::int64_t cast_grid, bool columnwise,
                          cudaStream_t stream) {
  if (p.delayed_scale == nullptr && amax_grid > 0) {  // current scaling: one amax launch
    grouped_amax_kernel<In, Table><<<grid_of(amax_grid, "amax"), kAmaxThreads, 0, stream>>>(
        src, p.cols, amax_table);
    QR_CUDA_CHECK_LAUNCH("grouped_amax_kernel");
  }
  if (columnwise) {
    grouped_cast_transpose_kernel<In, Out, Table>
        <<<grid_of(cast_grid, "cast"), TileShape<In>::kThreads, 0, stream>>>(src, p, cast_table);
    QR_CUDA_CHECK_LAUNCH("grouped_cast_transpose_kernel");
  } else {
    grouped_cast_rowwise_kernel<In, Out, kRowwiseUnits<In>, Table>
        <<<grid_of(cast_grid, "cast"), kRowwiseThreads, 0, stream>>>(src, p, cast_table);
    QR_CUDA_CHECK_LAUNCH("grouped_cast_rowwise_kernel");
  }
}

template <class In, class Out>
void launch_chunk(const GroupedCastArgs& a, GroupTable& table, cudaStream_t stream) {
  const auto* src = static_cast<const typename In::Storage*>(a.src);
  const bool columnwise = table.group[0].columnwise_scale_inv != nullptr;
  for (int g = 0; g < table.count; ++g) set_vector_paths<In>(table.group[g], src, a.cols);
  zero_amax_kernel<<<1, kMaxGroupsPerLaunch, 0, stream>>>(table);
  QR_CUDA_CHECK_LAUNCH("zero_amax_kernel");
  // The two launches' tables: the same entries, each launch's first blocks.
  GroupTable amax_table = table;
  const std::int64_t amax_grid = amax_table.assign_first_blocks(
      [&](const GroupEntry& e) { return amax_blocks(e.rows, a.cols); });
  const std::int64_t cast_grid = table.assign_first_blocks(
      [&](const GroupEntry& e) { return cast_blocks<In>(e.rows, a.cols, columnwise); });
  launch_amax_and_cast<In, Out>(src, cast_params<In>(a), amax_table, amax_grid, table, cast_grid,
                                columnwise, stream);
}

template <class In>
void dispatch_out(const GroupedCastArgs& a, GroupTable& table, cudaStream_t stream) {
  if (a.data_dtype == QR_DTYPE_E4M3) launch_chunk<In, E4M3Out>(a, table, stream);
  else launch_chunk<In, E5M2Out>(a, table, stream);
}

// ---------------------------------------------------------------- 5. device-split groups

// One block: each group's rows from the offsets, its amax chunks, cast blocks and padded
// columnwise rows as prefix sums; writes the two launches' entries (their first_block), the
// consumers' qr_group_entry tables and the two launches' real block counts (totals).
template <class In>
__global__ void __launch_bounds__(sdk::cuda::kScanThreads)
    device_layout_kernel(const DeviceGroupedArgs a, GroupEntry* amax_entries,
                         GroupEntry* cast_entries, std::int64_t* totals) {
  const std::int64_t cols = a.cols;
  const bool columnwise = a.columnwise != nullptr;
  const auto* src = static_cast<const typename In::Storage*>(a.src);
  sdk::cuda::scan_groups<3>(
      a.groups,
      [&](int g, std::int64_t* c) {
        const std::int64_t rows = a.offsets[g + 1] - a.offsets[g];
        c[0] = a.delayed_scale == nullptr ? amax_blocks(rows, cols) : 0;
        c[1] = cast_blocks<In>(rows, cols, columnwise);
        c[2] = div_up(rows, kColumnwiseRowAlign) * kColumnwiseRowAlign;
      },
      [&](int g, const std::int64_t* first) {
        if (g == a.groups) {
          totals[0] = first[0];
          totals[1] = first[1];
          return;
        }
        const std::int64_t row = a.offsets[g], rows = a.offsets[g + 1] - row;
        GroupEntry e{};
        e.rows = rows;
        e.row_offset = row;
        e.rowwise = a.rowwise ? a.rowwise + row * cols : nullptr;
        e.columnwise = a.columnwise ? a.columnwise + cols * first[2] : nullptr;
        e.rowwise_scale_inv = a.rowwise ? a.rowwise_scale_inv + g : nullptr;
        e.columnwise_scale_inv = a.columnwise ? a.columnwise_scale_inv + g : nullptr;
        e.amax_main = a.rowwise ? a.rowwise_amax + g : a.columnwise_amax + g;
        e.amax_other = a.rowwise && a.columnwise ? a.columnwise_amax + g : nullptr;
        e.columnwise_ld = div_up(rows, kColumnwiseRowAlign) * kColumnwiseRowAlign;
        set_vector_paths<In>(e, src, cols);
        e.first_block = first[0];
        amax_entries[g] = e;
        e.first_block = first[1];
        cast_entries[g] = e;
        if (a.rowwise_table)
          a.rowwise_table[g] = {e.rowwise, e.rowwise_scale_inv, a.rowwise_amax + g, rows, cols, 0};
        if (a.columnwise_table)
          a.columnwise_table[g] = {e.columnwise, e.columnwise_scale_inv, a.columnwise_amax + g,
                                   rows, e.columnwise_ld, 0};
      });
}

template <class In, class Out>
void launch_device(const DeviceGroupedArgs& a, cudaStream_t stream) {
  const auto* src = static_cast<const typename In::Storage*>(a.src);
  const auto groups = static_cast<std::size_t>(a.groups);
  // The two launches' entries and real block counts, stream-ordered (no host wait).
  const sdk::cuda::StreamScratch<GroupEntry> entries(2 * groups, stream, kFormat);
  const sdk::cuda::StreamScratch<std::int64_t> totals(2, stream, kFormat);
  device_layout_kernel<In><<<1, sdk::cuda::kScanThreads, 0, stream>>>(
      a, entries.get(), entries.get() + groups, totals.get());
  QR_CUDA_CHECK_LAUNCH("device_layout_kernel");
  // Grids for any split: sum_g max(1, ceil(v_g / d)) <= total / d + groups (cast tiles: per
  // tile row of the groups, tiles_per_row tiles).
  const bool columnwise = a.columnwise != nullptr;
  const CastParams p = cast_params<In>(a);
  const std::int64_t amax_grid = a.rows * a.cols / kAmaxChunk + a.groups;
  const std::int64_t cast_grid =
      columnwise ? (a.rows / TileShape<In>::kRows + a.groups) * p.tiles_per_row
                 : a.rows * a.cols /
                           (std::int64_t{kRowwiseThreads} * kRowwiseUnits<In> * kUnit) +
                       a.groups;
  const DeviceTable amax_table{entries.get(), a.groups, totals.get()};
  const DeviceTable cast_table{entries.get() + groups, a.groups, totals.get() + 1};
  launch_amax_and_cast<In, Out>(src, p, amax_table, amax_grid, cast_table, cast_grid, columnwise,
                                stream);
}

template <class In>
void dispatch_device(const DeviceGroupedArgs& a, cudaStream_t stream) {
  if (a.data_dtype == QR_DTYPE_E4M3) launch_device<In, E4M3Out>(a, stream);
  else launch_device<In, E5M2Out>(a, stream);
}

}  // namespace

void quantize_grouped(const GroupedCastArgs& a) {
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "quantize_grouped");
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
  sdk::cuda::for_each_group_chunk<GroupTable>(a.groups.size(), [&](GroupTable& table,
                                                                   std::size_t first) {
    for (int i = 0; i < table.count; ++i) {
      const GroupOutputs& o = a.groups[first + static_cast<std::size_t>(i)];
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
      e.columnwise_ld = o.rows;
    }
    switch (a.src_dtype) {
      case QR_DTYPE_F32: dispatch_out<F32In>(a, table, stream); break;
      case QR_DTYPE_BF16: dispatch_out<BF16In>(a, table, stream); break;
      default: dispatch_out<F16In>(a, table, stream); break;
    }
  });
}

void quantize_grouped_device(const DeviceGroupedArgs& a) {
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "quantize_grouped_device");
  QR_CHECK(a.data_dtype == QR_DTYPE_E4M3 || a.data_dtype == QR_DTYPE_E5M2,
           "float8 CUDA quantize_grouped_device: data dtype code ", static_cast<int>(a.data_dtype),
           " is not e4m3 or e5m2");
  QR_CHECK(a.groups >= 1 && a.offsets != nullptr, "float8 CUDA quantize_grouped_device: ",
           a.groups, " groups, offsets ", a.offsets == nullptr ? "null" : "given");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "float8 CUDA quantize_grouped_device: negative shape");
  QR_CHECK(a.rowwise || a.columnwise,
           "float8 CUDA quantize_grouped_device: no direction requested");
  QR_CHECK((!a.rowwise || (a.rowwise_scale_inv && a.rowwise_amax)) &&
               (!a.columnwise || (a.columnwise_scale_inv && a.columnwise_amax)),
           "float8 CUDA quantize_grouped_device: a requested direction lacks its scale or amax "
           "buffer");
  QR_CHECK(a.rows * a.cols == 0 || a.src != nullptr,
           "float8 CUDA quantize_grouped_device: the source has a null data pointer");
  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t stream = as_stream(a.stream);
  switch (a.src_dtype) {
    case QR_DTYPE_F32: dispatch_device<F32In>(a, stream); break;
    case QR_DTYPE_BF16: dispatch_device<BF16In>(a, stream); break;
    default: dispatch_device<F16In>(a, stream); break;
  }
}

}  // namespace qrecipe::float8::cuda
