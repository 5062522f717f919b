// CUDA kernel of grouped blockwise quantization (blockwise_grouped_kernels.hpp), bit-exact with
// blockwise_ref.cpp applied to each group alone.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11):
//   1. the tile of a group: what the SDK's grouped kernel (qrecipe/cuda_sdk.cuh
//      grouped_tile_kernel: one 128 x 128 tile of one group per CTA) runs
//   2. the launcher (dtype / block / direction dispatch) and the entry
//   3. device-split groups: the layout kernel, the launch sized for any split, the entry
//
// One launch serves every group: each group's quantize_tile parameters (the very
// QuantizeParams that blockwise_kernels.cu's quantize would pass for that group alone, made by
// the same quantize_params) travel in a table passed by value as a __grid_constant__ kernel
// parameter, and a CTA finds its group by binary search over the table's prefix sums of tiles
// (computed once on the host per call). Tiles start at each group's first row, so no 128 x 1
// block or 128 x 128 tile ever crosses an expert boundary: exactly the blocks of a per-group
// call, quantized by the same code (blockwise_device.cuh quantize_tile). Device-split groups
// (section 3) run the same tile code from a table in device memory that a one-block layout
// kernel writes from the offsets, with the same quantize_params (sdk::cuda's
// device_grouped_tile_kernel: tiles past the real count return at once).
//
// Exactness: that of blockwise_kernels.cu (same tile code, same flags: -fmad=false
// --ftz=false --prec-div=true, QrecipeCompileFlags.cmake).
#include "blockwise_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "blockwise_device.cuh"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::blockwise::cuda {
namespace {

constexpr const char* kFormat = "blockwise";  // for QR_CUDA_CHECK (cuda_sdk.cuh)


// ---------------------------------------------------------------- 1. the tile of a group

// What sdk::cuda::grouped_tile_kernel runs for each CTA: tile (tile_row, tile_col) of its group
// with quantize_tile, the code of the one-tensor kernel (blockwise_kernels.cu quantize_kernel):
// the interior path when the tile lies inside the group and the group's buffers are aligned,
// the out-of-line edge path otherwise.
template <class In, bool kTile128x128, Directions D>
struct GroupTile {
  using T = QuantizeTile<In>;
  using Params = QuantizeParams<In>;
  using Shared = QuantizeShared<In, kTile128x128, D>;
  static constexpr int kRows = T::kRows, kCols = T::kCols;
  static constexpr int kThreads = T::kThreads, kMinBlocksPerSM = T::kMinBlocksPerSM;

  static __device__ __forceinline__ void quantize(const Params& p, std::int64_t tile_row,
                                                  std::int64_t tile_col, Shared& sh) {
    if (p.all_aligned && (tile_col + 1) * kCols <= p.cols && (tile_row + 1) * kRows <= p.rows)
      quantize_tile<true, In, kTile128x128, D>(p, tile_row, tile_col, sh);
    else
      quantize_edge_tile<In, kTile128x128, D>(p, tile_row, tile_col, sh);
  }
};

// ---------------------------------------------------------------- 2. launcher, entry

// Every group's tiles in one launch (per kMaxGroupsPerLaunch groups): sdk::cuda's grouped
// kernel with each group's QuantizeParams, made by the same quantize_params as quantize's.
template <class In, bool kTile128x128, Directions D>
void launch_grouped(const std::vector<QuantizeArgs>& groups) {
  sdk::cuda::launch_grouped_tiles<GroupTile<In, kTile128x128, D>, kMaxGroupsPerLaunch>(
      groups, groups.front().cols, [](const QuantizeArgs& a) { return quantize_params<In, D>(a); },
      as_stream(groups.front().stream), kFormat);
}

template <class In, bool kTile128x128>
void dispatch_directions(const std::vector<QuantizeArgs>& groups, bool rowwise, bool columnwise) {
  if (!columnwise) launch_grouped<In, kTile128x128, Directions::kRowwise>(groups);
  else if (!rowwise) launch_grouped<In, kTile128x128, Directions::kColumnwise>(groups);
  else launch_grouped<In, kTile128x128, Directions::kBoth>(groups);
}

template <class In>
void dispatch_block(const std::vector<QuantizeArgs>& groups, bool rowwise, bool columnwise) {
  if (groups.front().tile_128x128) dispatch_directions<In, true>(groups, rowwise, columnwise);
  else dispatch_directions<In, false>(groups, rowwise, columnwise);
}

// ---------------------------------------------------------------- 3. device-split groups

// One block: each group's rows from the offsets, and as prefix sums its tiles, its padded
// columnwise rows and its two scale arrays (1x128 blocks: rowwise [ceil(cols/128)][roundup(
// rows, 4)], columnwise [ceil(rows/128)][roundup(cols, 4)], the reference's layouts); writes
// the kernel's entries (the QuantizeParams quantize_params makes for the group alone, with
// the packed pointers), the consumers' qr_group_entry tables and the real tile count.
template <class In, Directions D>
__global__ void __launch_bounds__(sdk::cuda::kScanThreads)
    device_layout_kernel(const DeviceGroupedArgs a,
                         sdk::cuda::TileGroup<QuantizeParams<In>>* entries, std::int64_t* total) {
  using Tile = GroupTile<In, false, D>;
  const QuantizeArgs& b = a.base;
  const std::int64_t cols = b.cols;
  const std::int64_t col_blocks = (cols + kBlock - 1) / kBlock;
  const std::int64_t padded_cols = (cols + kScalePad - 1) / kScalePad * kScalePad;
  const auto up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
  sdk::cuda::scan_groups<4>(
      a.groups,
      [&](int g, std::int64_t* c) {
        const std::int64_t rows = a.offsets[g + 1] - a.offsets[g];
        c[0] = sdk::cuda::group_tiles<Tile>(rows, cols);
        c[1] = up(rows, kColumnwiseRowAlign);
        c[2] = col_blocks * up(rows, kScalePad);
        c[3] = padded_cols * ((rows + kBlock - 1) / kBlock);
      },
      [&](int g, const std::int64_t* first) {
        if (g == a.groups) {
          *total = first[0];
          return;
        }
        const std::int64_t row = a.offsets[g], rows = a.offsets[g + 1] - row;
        QuantizeArgs q = b;
        q.src = static_cast<const typename In::Storage*>(b.src) + row * cols;
        q.rows = rows;
        if constexpr (has_rowwise(D)) {
          q.rowwise_data = b.rowwise_data + row * cols;
          q.rowwise_scale_inv = b.rowwise_scale_inv + first[2];
          q.rowwise_scale_ld = up(rows, kScalePad);
          a.rowwise_table[g] = {q.rowwise_data, q.rowwise_scale_inv, nullptr, rows, cols,
                                q.rowwise_scale_ld};
        }
        if constexpr (has_columnwise(D)) {
          q.columnwise_data = b.columnwise_data + cols * first[1];
          q.columnwise_ld = up(rows, kColumnwiseRowAlign);
          q.columnwise_scale_inv = b.columnwise_scale_inv + first[3];
          q.columnwise_scale_ld = padded_cols;
          a.columnwise_table[g] = {q.columnwise_data, q.columnwise_scale_inv, nullptr, rows,
                                   q.columnwise_ld, q.columnwise_scale_ld};
        }
        entries[g] = {first[0], quantize_params<In, D>(q)};
      });
}

template <class In, Directions D>
void launch_device(const DeviceGroupedArgs& a) {
  using Tile = GroupTile<In, false, D>;
  const cudaStream_t stream = as_stream(a.base.stream);
  const sdk::cuda::StreamScratch<sdk::cuda::TileGroup<typename Tile::Params>> entries(
      static_cast<std::size_t>(a.groups), stream, kFormat);
  const sdk::cuda::StreamScratch<std::int64_t> total(1, stream, kFormat);
  device_layout_kernel<In, D><<<1, sdk::cuda::kScanThreads, 0, stream>>>(a, entries.get(),
                                                                          total.get());
  QR_CUDA_CHECK_LAUNCH("blockwise device_layout_kernel");
  sdk::cuda::launch_device_grouped_tiles<Tile>({entries.get(), a.groups, total.get()},
                                               a.base.rows, a.base.cols, stream, kFormat);
}

template <class In>
void dispatch_device(const DeviceGroupedArgs& a) {
  const bool rowwise = a.base.rowwise_data != nullptr;
  const bool columnwise = a.base.columnwise_data != nullptr;
  if (!columnwise) launch_device<In, Directions::kRowwise>(a);
  else if (!rowwise) launch_device<In, Directions::kColumnwise>(a);
  else launch_device<In, Directions::kBoth>(a);
}

}  // namespace

void quantize_grouped(const std::vector<QuantizeArgs>& groups) {
  QR_CHECK(!groups.empty(), "blockwise CUDA quantize_grouped: no groups; pass at least one");
  const QuantizeArgs& a0 = groups.front();
  sdk::cuda::check_source_dtype(a0.src_dtype, kFormat, "quantize_grouped");
  QR_CHECK(a0.cols >= 0, "blockwise CUDA quantize_grouped: negative column count ", a0.cols);
  // The requested directions: those of the groups with elements (an empty group writes
  // nothing and its buffers may be null); every such group must request the same.
  bool rowwise = false, columnwise = false, any_tiles = false;
  for (const QuantizeArgs& a : groups) {
    if (a.rows <= 0 || a.cols == 0) continue;
    rowwise = rowwise || a.rowwise_data != nullptr;
    columnwise = columnwise || a.columnwise_data != nullptr;
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const QuantizeArgs& a = groups[g];
    QR_CHECK(a.src_dtype == a0.src_dtype && a.cols == a0.cols &&
                 a.tile_128x128 == a0.tile_128x128 && a.pow2_scales == a0.pow2_scales &&
                 a.amax_epsilon == a0.amax_epsilon && a.value_for_inf == a0.value_for_inf &&
                 a.device_index == a0.device_index && a.stream == a0.stream,
             "blockwise CUDA quantize_grouped: group ", g, " differs from group 0 in source "
             "dtype, columns, block shape, scale options, device or stream; the groups of one "
             "call share one quantizer and one source");
    QR_CHECK(a.rows >= 0, "blockwise CUDA quantize_grouped: group ", g, " has ", a.rows,
             " rows");
    if (a.rows == 0 || a.cols == 0) continue;  // writes nothing, as quantize
    any_tiles = true;
    QR_CHECK(a.src != nullptr, "blockwise CUDA quantize_grouped: group ", g,
             " has a null source pointer");
    QR_CHECK((a.rowwise_data != nullptr) == rowwise &&
                 (a.rowwise_scale_inv != nullptr) == rowwise &&
                 (a.columnwise_data != nullptr) == columnwise &&
                 (a.columnwise_scale_inv != nullptr) == columnwise,
             "blockwise CUDA quantize_grouped: group ", g, " has the data and scale_inv "
             "buffers of other directions than the other groups (rowwise ", rowwise,
             ", columnwise ", columnwise, "); every group is quantized with the same usage");
  }
  if (!any_tiles) return;  // nothing to write (scale padding stays zero)
  QR_CHECK(rowwise || columnwise,
           "blockwise CUDA quantize_grouped: neither direction was requested");
  DeviceGuard guard(a0.device_index, kFormat);
  switch (a0.src_dtype) {
    case QR_DTYPE_F32: dispatch_block<F32In>(groups, rowwise, columnwise); break;
    case QR_DTYPE_BF16: dispatch_block<BF16In>(groups, rowwise, columnwise); break;
    default: dispatch_block<F16In>(groups, rowwise, columnwise); break;
  }
}

void quantize_grouped_device(const DeviceGroupedArgs& a) {
  const QuantizeArgs& b = a.base;
  sdk::cuda::check_source_dtype(b.src_dtype, kFormat, "quantize_grouped_device");
  QR_CHECK_CODE(!b.tile_128x128, QR_STATUS_UNSUPPORTED, "blockwise CUDA quantize_grouped_device: "
                "128x128 tiles with device-split groups are not supported (weights are grouped "
                "by host sizes); pass the splits as host sizes");
  QR_CHECK(a.groups >= 1 && a.offsets != nullptr, "blockwise CUDA quantize_grouped_device: ",
           a.groups, " groups, offsets ", a.offsets ? "given" : "null");
  QR_CHECK(b.rows >= 0 && b.cols >= 0, "blockwise CUDA quantize_grouped_device: negative shape");
  QR_CHECK(b.rowwise_data || b.columnwise_data,
           "blockwise CUDA quantize_grouped_device: neither direction was requested");
  QR_CHECK((!b.rowwise_data || (b.rowwise_scale_inv && a.rowwise_table)) &&
               (!b.columnwise_data || (b.columnwise_scale_inv && a.columnwise_table)),
           "blockwise CUDA quantize_grouped_device: a requested direction has no scale buffer "
           "or group table");
  QR_CHECK(b.rows * b.cols == 0 || b.src != nullptr,
           "blockwise CUDA quantize_grouped_device: the source has a null data pointer");
  DeviceGuard guard(b.device_index, kFormat);
  switch (b.src_dtype) {
    case QR_DTYPE_F32: dispatch_device<F32In>(a); break;
    case QR_DTYPE_BF16: dispatch_device<BF16In>(a); break;
    default: dispatch_device<F16In>(a); break;
  }
}

}  // namespace qrecipe::blockwise::cuda
