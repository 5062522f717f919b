// CUDA kernel of grouped mxfp8 quantization (mxfp8_grouped_kernels.hpp), bit-exact with
// mxfp8_ref.cpp applied to each group alone.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11):
//   1. the tile of a group: what the SDK's grouped kernel (qrecipe/cuda_sdk.cuh
//      grouped_tile_kernel: one 32 x 256 CTA tile of one group per CTA) runs
//   2. the launcher (dtype / codes / direction dispatch) and the entry
//   3. device-split groups: the layout kernel, the launch sized for any split, the entry
//
// One launch serves every group: each group's quantize_cta_tile parameters (the very
// QuantizeParams that mxfp8_kernels.cu's quantize would pass for that group alone, made by the
// same quantize_params) travel in a table passed by value as a __grid_constant__ kernel
// parameter, and a CTA finds its group by binary search over the table's prefix sums of tiles
// (computed once on the host per call). Tiles start at each group's first row, so a
// columnwise block of 32 rows never crosses an expert boundary and ends, partial, where the
// group ends: exactly the blocks of a per-group call, quantized by the same code
// (mxfp8_device.cuh quantize_cta_tile). Device-split groups (section 3) run the same tile code
// from a table in device memory that a one-block layout kernel writes from the offsets, with
// the same quantize_params (sdk::cuda's device_grouped_tile_kernel: tiles past the real count
// return at once).
//
// Exactness: that of mxfp8_kernels.cu (same tile code, same flags: -fmad=false --ftz=false
// --prec-div=true, QrecipeCompileFlags.cmake).
#include "mxfp8_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "mxfp8_device.cuh"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::mxfp8::cuda {
namespace {

constexpr const char* kFormat = "mxfp8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)


// ---------------------------------------------------------------- 1. the tile of a group

// What sdk::cuda::grouped_tile_kernel runs for each CTA: CTA tile (tile_row, tile_col) of its
// group with quantize_cta_tile, the code of the one-tensor kernel (mxfp8_kernels.cu
// quantize_kernel): the interior path when the tile lies inside the group and the group's
// buffers are aligned, the out-of-line edge path otherwise.
template <class In, class Codes, Directions D>
struct GroupTile {
  using T = QuantizeTile<In, D>;
  using Params = QuantizeParams<In>;
  struct Shared {  // rowwise scales of the CTA tile, [tile row][warp]
    alignas(8) std::uint8_t row_scales[has_rowwise(D) ? T::kRows : 1][T::kWarps];
  };
  static constexpr int kRows = T::kRows, kCols = T::kCols;
  static constexpr int kThreads = T::kThreads, kMinBlocksPerSM = T::kMinBlocksPerSM;

  static __device__ __forceinline__ void quantize(const Params& p, std::int64_t tile_row,
                                                  std::int64_t tile_col, Shared& sh) {
    const std::int64_t row0 = tile_row * kRows, cta_col = tile_col * kCols;
    if (p.all_aligned && row0 + kRows <= p.rows && cta_col + kCols <= p.cols)
      quantize_cta_tile<true, In, Codes, D>(p, row0, cta_col, sh.row_scales);
    else
      quantize_edge_tile<In, Codes, D>(p, row0, cta_col, sh.row_scales);
  }
};

// ---------------------------------------------------------------- 2. launcher, entry

// Every group's tiles in one launch (per kMaxGroupsPerLaunch groups): sdk::cuda's grouped
// kernel with each group's QuantizeParams, made by the same quantize_params as quantize's.
template <class In, class Codes, Directions D>
void launch_grouped(const std::vector<QuantizeArgs>& groups) {
  sdk::cuda::launch_grouped_tiles<GroupTile<In, Codes, D>, kMaxGroupsPerLaunch>(
      groups, groups.front().cols, [](const QuantizeArgs& a) { return quantize_params<In, D>(a); },
      as_stream(groups.front().stream), kFormat);
}

template <class In, class Codes>
void dispatch_directions(const std::vector<QuantizeArgs>& groups, bool rowwise, bool columnwise) {
  if (!columnwise) launch_grouped<In, Codes, Directions::kRowwise>(groups);
  else if (!rowwise) launch_grouped<In, Codes, Directions::kColumnwise>(groups);
  else launch_grouped<In, Codes, Directions::kBoth>(groups);
}

template <class In>
void dispatch_codes(const std::vector<QuantizeArgs>& groups, bool rowwise, bool columnwise) {
  if (groups.front().data_dtype == QR_DTYPE_E4M3)
    dispatch_directions<In, E4M3Codes>(groups, rowwise, columnwise);
  else
    dispatch_directions<In, E5M2Codes>(groups, rowwise, columnwise);
}

// ---------------------------------------------------------------- 3. device-split groups

// One block: each group's rows from the offsets, and as prefix sums its tiles and the rows of
// its two scale arrays (the reference's [roundup(rows, 128)][...] and
// [roundup(ceil(rows / 32), 4)][...]); writes the kernel's entries (the QuantizeParams
// quantize_params makes for the group alone, with the packed pointers), the consumers'
// qr_group_entry tables and the real tile count.
template <class In, class Codes, Directions D>
__global__ void __launch_bounds__(sdk::cuda::kScanThreads)
    device_layout_kernel(const DeviceGroupedArgs a,
                         sdk::cuda::TileGroup<QuantizeParams<In>>* entries, std::int64_t* total) {
  using Tile = GroupTile<In, Codes, D>;
  const QuantizeArgs& b = a.base;
  const std::int64_t cols = b.cols;
  const auto up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
  sdk::cuda::scan_groups<3>(
      a.groups,
      [&](int g, std::int64_t* c) {
        const std::int64_t rows = a.offsets[g + 1] - a.offsets[g];
        c[0] = sdk::cuda::group_tiles<Tile>(rows, cols);
        c[1] = up(rows, 128);
        c[2] = up((rows + kBlock - 1) / kBlock, 4);
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
          q.rowwise_scale = b.rowwise_scale + first[1] * b.rowwise_scale_ld;
          a.rowwise_table[g] = {q.rowwise_data, q.rowwise_scale, nullptr, rows, cols,
                                b.rowwise_scale_ld};
        }
        if constexpr (has_columnwise(D)) {
          q.columnwise_data = b.columnwise_data + row * cols;
          q.columnwise_scale = b.columnwise_scale + first[2] * b.columnwise_scale_ld;
          a.columnwise_table[g] = {q.columnwise_data, q.columnwise_scale, nullptr, rows, cols,
                                   b.columnwise_scale_ld};
        }
        entries[g] = {first[0], quantize_params<In, D>(q)};
      });
}

template <class In, class Codes, Directions D>
void launch_device(const DeviceGroupedArgs& a) {
  using Tile = GroupTile<In, Codes, D>;
  const cudaStream_t stream = as_stream(a.base.stream);
  const sdk::cuda::StreamScratch<sdk::cuda::TileGroup<QuantizeParams<In>>> entries(
      static_cast<std::size_t>(a.groups), stream, kFormat);
  const sdk::cuda::StreamScratch<std::int64_t> total(1, stream, kFormat);
  device_layout_kernel<In, Codes, D><<<1, sdk::cuda::kScanThreads, 0, stream>>>(
      a, entries.get(), total.get());
  QR_CUDA_CHECK_LAUNCH("mxfp8 device_layout_kernel");
  sdk::cuda::launch_device_grouped_tiles<Tile>({entries.get(), a.groups, total.get()},
                                               a.base.rows, a.base.cols, stream, kFormat);
}

template <class In, class Codes>
void dispatch_device_directions(const DeviceGroupedArgs& a) {
  const bool rowwise = a.base.rowwise_data != nullptr;
  const bool columnwise = a.base.columnwise_data != nullptr;
  if (!columnwise) launch_device<In, Codes, Directions::kRowwise>(a);
  else if (!rowwise) launch_device<In, Codes, Directions::kColumnwise>(a);
  else launch_device<In, Codes, Directions::kBoth>(a);
}

template <class In>
void dispatch_device(const DeviceGroupedArgs& a) {
  if (a.base.data_dtype == QR_DTYPE_E4M3) dispatch_device_directions<In, E4M3Codes>(a);
  else dispatch_device_directions<In, E5M2Codes>(a);
}

}  // namespace

void quantize_grouped(const std::vector<QuantizeArgs>& groups) {
  QR_CHECK(!groups.empty(), "mxfp8 CUDA quantize_grouped: no groups; pass at least one");
  const QuantizeArgs& a0 = groups.front();
  sdk::cuda::check_source_dtype(a0.src_dtype, kFormat, "quantize_grouped");
  QR_CHECK(a0.data_dtype == QR_DTYPE_E4M3 || a0.data_dtype == QR_DTYPE_E5M2,
           "mxfp8 CUDA quantize_grouped: data dtype code ", static_cast<int>(a0.data_dtype),
           " is not e4m3 or e5m2");
  QR_CHECK(a0.cols >= 0, "mxfp8 CUDA quantize_grouped: negative column count ", a0.cols);
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
    QR_CHECK(a.src_dtype == a0.src_dtype && a.cols == a0.cols && a.data_dtype == a0.data_dtype &&
                 a.device_index == a0.device_index && a.stream == a0.stream,
             "mxfp8 CUDA quantize_grouped: group ", g, " differs from group 0 in source dtype, "
             "columns, data dtype, device or stream; the groups of one call share one quantizer "
             "and one source");
    QR_CHECK(a.rows >= 0, "mxfp8 CUDA quantize_grouped: group ", g, " has ", a.rows, " rows");
    if (a.rows == 0 || a.cols == 0) continue;  // writes nothing, as quantize
    any_tiles = true;
    QR_CHECK(a.src != nullptr, "mxfp8 CUDA quantize_grouped: group ", g,
             " has a null source pointer");
    QR_CHECK((a.rowwise_data != nullptr) == rowwise && (a.columnwise_data != nullptr) == columnwise,
             "mxfp8 CUDA quantize_grouped: group ", g, " has the data buffers of other "
             "directions than the other groups (rowwise ", rowwise, ", columnwise ", columnwise,
             "); every group is quantized with the same usage");
    // The checks of the one-tensor entry (mxfp8_kernels.cu quantize).
    QR_CHECK(!rowwise || (a.rowwise_scale != nullptr &&
                          a.rowwise_scale_ld >= ceil_div(a.cols, kBlock)),
             "mxfp8 CUDA quantize_grouped: group ", g, " has a null rowwise scale buffer or "
             "rows of ", a.rowwise_scale_ld, " bytes, shorter than ", ceil_div(a.cols, kBlock),
             " blocks");
    QR_CHECK(!columnwise || (a.columnwise_scale != nullptr && a.columnwise_scale_ld >= a.cols),
             "mxfp8 CUDA quantize_grouped: group ", g, " has a null columnwise scale buffer or "
             "rows of ", a.columnwise_scale_ld, " bytes, shorter than ", a.cols, " columns");
  }
  if (!any_tiles) return;  // nothing to write (scale padding stays zero)
  QR_CHECK(rowwise || columnwise, "mxfp8 CUDA quantize_grouped: neither direction was requested");
  DeviceGuard guard(a0.device_index, kFormat);
  switch (a0.src_dtype) {
    case QR_DTYPE_F32: dispatch_codes<F32In>(groups, rowwise, columnwise); break;
    case QR_DTYPE_BF16: dispatch_codes<BF16In>(groups, rowwise, columnwise); break;
    default: dispatch_codes<F16In>(groups, rowwise, columnwise); break;
  }
}

void quantize_grouped_device(const DeviceGroupedArgs& a) {
  const QuantizeArgs& b = a.base;
  sdk::cuda::check_source_dtype(b.src_dtype, kFormat, "quantize_grouped_device");
  QR_CHECK(b.data_dtype == QR_DTYPE_E4M3 || b.data_dtype == QR_DTYPE_E5M2,
           "mxfp8 CUDA quantize_grouped_device: data dtype code ", static_cast<int>(b.data_dtype),
           " is not e4m3 or e5m2");
  QR_CHECK(a.groups >= 1 && a.offsets != nullptr && b.rows >= 0 && b.cols >= 0,
           "mxfp8 CUDA quantize_grouped_device: ", a.groups, " groups, a ", b.rows, " x ", b.cols,
           " source, offsets ", a.offsets ? "given" : "null");
  QR_CHECK((b.rowwise_data || b.columnwise_data) &&
               (!b.rowwise_data || (b.rowwise_scale && a.rowwise_table)) &&
               (!b.columnwise_data || (b.columnwise_scale && a.columnwise_table)),
           "mxfp8 CUDA quantize_grouped_device: no direction requested, or one without its scale "
           "buffer or group table");
  QR_CHECK(b.rows * b.cols == 0 || b.src != nullptr,
           "mxfp8 CUDA quantize_grouped_device: the source has a null data pointer");
  DeviceGuard guard(b.device_index, kFormat);
  switch (b.src_dtype) {
    case QR_DTYPE_F32: dispatch_device<F32In>(a); break;
    case QR_DTYPE_BF16: dispatch_device<BF16In>(a); break;
    default: dispatch_device<F16In>(a); break;
  }
}

}  // namespace qrecipe::mxfp8::cuda
