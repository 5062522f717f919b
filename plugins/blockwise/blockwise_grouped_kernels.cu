// CUDA kernel of grouped blockwise quantization (blockwise_grouped_kernels.hpp), bit-exact with
// blockwise_ref.cpp applied to each group alone.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11):
//   1. the tile of a group: what the SDK's grouped kernel (qrecipe/cuda_sdk.cuh
//      grouped_tile_kernel: one 128 x 128 tile of one group per CTA) runs
//   2. the launcher (dtype / block / direction dispatch) and the entry
//
// One launch serves every group: each group's quantize_tile parameters (the very
// QuantizeParams that blockwise_kernels.cu's quantize would pass for that group alone, made by
// the same quantize_params) travel in a table passed by value as a __grid_constant__ kernel
// parameter, and a CTA finds its group by binary search over the table's prefix sums of tiles
// (computed once on the host per call). Tiles start at each group's first row, so no 128 x 1
// block or 128 x 128 tile ever crosses an expert boundary: exactly the blocks of a per-group
// call, quantized by the same code (blockwise_device.cuh quantize_tile).
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

}  // namespace qrecipe::blockwise::cuda
