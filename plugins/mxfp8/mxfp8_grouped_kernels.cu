// CUDA kernel of grouped mxfp8 quantization (mxfp8_grouped_kernels.hpp), bit-exact with
// mxfp8_ref.cpp applied to each group alone.
//
// Map of this file (STYLE.md rule 11):
//   1. the group table (kernel parameter) and the block -> group lookup
//   2. the kernel: one 32 x 128 tile of one group per block, both directions
//   3. the launcher (grid arithmetic, dtype dispatch) and the entry
//
// One launch serves every group: the groups' buffers and row ranges travel in a table passed
// by value as a __grid_constant__ kernel parameter, and a block finds its group by binary
// search over the table's prefix sums of blocks (computed once on the host per call). Tiles
// start at each group's first row, so a columnwise block of 32 rows never crosses an expert
// boundary and ends, partial, where the group ends: exactly the blocks of a per-group call.
//
// Exactness: block amax = max |x| over the block's valid elements (NaN ignored, an exact
// max), exponent and codes through mxfp8_numerics.hpp (the reference's own code, QR_HD), the
// source widened exactly (sdk::cuda traits); compiled with -fmad=false --ftz=false like every
// plugin kernel (QrecipeCompileFlags.cmake).
#include "mxfp8_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "mxfp8_numerics.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::mxfp8::cuda {
namespace {

constexpr const char* kFormat = "mxfp8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::BF16In;
using sdk::cuda::DeviceGuard;
using sdk::cuda::F16In;
using sdk::cuda::F32In;

// ---------------------------------------------------------------- 1. the group table

struct GroupEntry {
  std::int64_t rows;
  std::int64_t row_offset;   // first row of the group in the source
  std::int64_t first_block;  // prefix sum of blocks
  std::uint8_t* rowwise_data;
  std::uint8_t* rowwise_scale;
  std::uint8_t* columnwise_data;
  std::uint8_t* columnwise_scale;
};

using GroupTable = sdk::cuda::GroupTable<GroupEntry, kMaxGroupsPerLaunch>;
using sdk::cuda::find_group;

__device__ __forceinline__ bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// ---------------------------------------------------------------- 2. the kernel

// A block quantizes a kTileRows x kTileCols tile of one group. Load: thread t reads column t
// of the tile, row by row (a warp reads 32 consecutive elements per row), into shared memory
// as FP32. Columnwise: thread t owns column t, one block of 32 rows: amax, exponent, 32 codes
// (a warp writes 32 consecutive bytes per row). Rowwise: thread t owns row t / 4, block t % 4:
// amax over its 32 elements, exponent, 32 codes stored as 8 words when aligned.
constexpr int kTileRows = 32;   // one columnwise block
constexpr int kTileCols = 128;  // four rowwise blocks
constexpr int kThreads = 128;
constexpr int kBlock = 32;
static_assert(kTileRows == kBlock && kTileCols % kBlock == 0, "tiles hold whole blocks");
static_assert(kThreads == kTileCols && kThreads == kTileRows * (kTileCols / kBlock),
              "one thread per tile column and per rowwise block");

struct Params {
  std::int64_t cols;
  std::int64_t tiles_per_row;
  std::int64_t rowwise_scale_ld;
  std::int64_t columnwise_scale_ld;
  float rcp_max;  // fl32(1 / fmax), as the reference
  bool e4m3;
  bool rowwise;
  bool columnwise;
};

template <class In>
__global__ void __launch_bounds__(kThreads)
    grouped_mxfp8_kernel(const typename In::Storage* __restrict__ src, const Params p,
                         const __grid_constant__ GroupTable table) {
  __shared__ float tile[kTileRows][kTileCols + 1];
  const GroupEntry& e = table.group[find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  const std::int64_t row0 = (local / p.tiles_per_row) * kTileRows;
  const std::int64_t col0 = (local % p.tiles_per_row) * kTileCols;
  const typename In::Storage* base = src + e.row_offset * p.cols;
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t left_rows = e.rows - row0;
  const int valid_rows = left_rows >= kTileRows ? kTileRows : static_cast<int>(left_rows);

  const std::int64_t c = col0 + t;
#pragma unroll 8
  for (int r = 0; r < kTileRows; ++r)
    tile[r][t] = (c < p.cols && r < valid_rows) ? In::to_f32(base[(row0 + r) * p.cols + c])
                                                : 0.0f;
  __syncthreads();

  if (p.columnwise && c < p.cols) {
    float amax = 0.0f;
    for (int r = 0; r < valid_rows; ++r) amax = amax_of(amax, tile[r][t]);
    const std::uint8_t ex = num_mx::block_exponent(amax, p.rcp_max);
    e.columnwise_scale[(row0 / kBlock) * p.columnwise_scale_ld + c] = ex;
    for (int r = 0; r < valid_rows; ++r)
      e.columnwise_data[(row0 + r) * p.cols + c] = num_mx::encode(tile[r][t], ex, p.e4m3);
  }

  const int r = t / (kTileCols / kBlock);
  const int j = t % (kTileCols / kBlock);
  const std::int64_t cb = col0 + static_cast<std::int64_t>(j) * kBlock;
  if (p.rowwise && r < valid_rows && cb < p.cols) {
    const std::int64_t left = p.cols - cb;
    const int n = left >= kBlock ? kBlock : static_cast<int>(left);
    const float* x = &tile[r][j * kBlock];
    float amax = 0.0f;
    for (int k = 0; k < n; ++k) amax = amax_of(amax, x[k]);
    const std::uint8_t ex = num_mx::block_exponent(amax, p.rcp_max);
    e.rowwise_scale[(row0 + r) * p.rowwise_scale_ld + cb / kBlock] = ex;
    std::uint8_t* out = e.rowwise_data + (row0 + r) * p.cols + cb;
    if (n == kBlock && aligned_to(out, 4)) {
#pragma unroll
      for (int w = 0; w < kBlock / 4; ++w) {
        std::uint32_t word = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          word |= static_cast<std::uint32_t>(num_mx::encode(x[4 * w + k], ex, p.e4m3)) << (8 * k);
        reinterpret_cast<std::uint32_t*>(out)[w] = word;
      }
    } else {
      for (int k = 0; k < n; ++k) out[k] = num_mx::encode(x[k], ex, p.e4m3);
    }
  }
}

// ---------------------------------------------------------------- 3. launcher, entry

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

template <class In>
void launch(const GroupedQuantizeArgs& a, const Params& p, const GroupTable& table,
            std::int64_t blocks, cudaStream_t stream) {
  grouped_mxfp8_kernel<In><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const typename In::Storage*>(a.src), p, table);
  QR_CUDA_CHECK_LAUNCH("grouped_mxfp8_kernel");
}

}  // namespace

void quantize_grouped(const GroupedQuantizeArgs& a) {
  QR_CHECK(a.src_dtype == QR_DTYPE_F32 || a.src_dtype == QR_DTYPE_BF16 ||
               a.src_dtype == QR_DTYPE_F16,
           "mxfp8 CUDA quantize_grouped: source dtype code ", static_cast<int>(a.src_dtype),
           " is not f32, bf16 or f16");
  QR_CHECK(a.data_dtype == QR_DTYPE_E4M3 || a.data_dtype == QR_DTYPE_E5M2,
           "mxfp8 CUDA quantize_grouped: data dtype code ", static_cast<int>(a.data_dtype),
           " is not e4m3 or e5m2");
  QR_CHECK(!a.groups.empty() && (a.rowwise || a.columnwise) && a.cols >= 0,
           "mxfp8 CUDA quantize_grouped: no groups, no direction or a negative column count");
  std::int64_t total_rows = 0;
  for (std::size_t g = 0; g < a.groups.size(); ++g) {
    const GroupOutputs& o = a.groups[g];
    QR_CHECK(o.rows >= 0, "mxfp8 CUDA quantize_grouped: group ", g, " has ", o.rows, " rows");
    const bool empty = o.rows * a.cols == 0;
    QR_CHECK(empty || ((!a.rowwise || (o.rowwise_data && o.rowwise_scale)) &&
                       (!a.columnwise || (o.columnwise_data && o.columnwise_scale))),
             "mxfp8 CUDA quantize_grouped: group ", g, " lacks a data or scale buffer of a "
             "requested direction");
    total_rows += o.rows;
  }
  QR_CHECK(total_rows * a.cols == 0 || a.src != nullptr,
           "mxfp8 CUDA quantize_grouped: the source has a null data pointer");
  if (total_rows * a.cols == 0) return;  // nothing to write (scale padding stays zero)

  Params p{};
  p.cols = a.cols;
  p.tiles_per_row = ceil_div(a.cols, kTileCols);
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  p.e4m3 = a.data_dtype == QR_DTYPE_E4M3;
  p.rcp_max = p.e4m3 ? num_mx::kRcpE4M3 : num_mx::kRcpE5M2;
  p.rowwise = a.rowwise;
  p.columnwise = a.columnwise;

  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t stream = as_stream(a.stream);
  std::int64_t row = 0;
  for (std::size_t first = 0; first < a.groups.size(); first += kMaxGroupsPerLaunch) {
    GroupTable table{};
    const std::size_t left = a.groups.size() - first;
    const int n = static_cast<int>(left < static_cast<std::size_t>(kMaxGroupsPerLaunch)
                                       ? left
                                       : static_cast<std::size_t>(kMaxGroupsPerLaunch));
    table.count = n;
    std::int64_t blocks = 0;
    for (int i = 0; i < n; ++i) {
      const GroupOutputs& o = a.groups[first + static_cast<std::size_t>(i)];
      GroupEntry& e = table.group[i];
      e.rows = o.rows;
      e.row_offset = row;
      e.first_block = blocks;
      e.rowwise_data = o.rowwise_data;
      e.rowwise_scale = o.rowwise_scale;
      e.columnwise_data = o.columnwise_data;
      e.columnwise_scale = o.columnwise_scale;
      row += o.rows;
      blocks += a.cols == 0 ? 0 : ceil_div(o.rows, kTileRows) * p.tiles_per_row;
    }
    if (blocks == 0) continue;  // only empty groups in this chunk
    QR_CHECK(blocks <= INT_MAX, "mxfp8 CUDA quantize_grouped: ", blocks, " tiles; at most ",
             INT_MAX, " fit in one grid");
    switch (a.src_dtype) {
      case QR_DTYPE_F32: launch<F32In>(a, p, table, blocks, stream); break;
      case QR_DTYPE_BF16: launch<BF16In>(a, p, table, blocks, stream); break;
      default: launch<F16In>(a, p, table, blocks, stream); break;
    }
  }
}

}  // namespace qrecipe::mxfp8::cuda
