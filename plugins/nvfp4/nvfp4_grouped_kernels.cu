// CUDA kernels of grouped nvfp4 quantization (nvfp4_grouped_kernels.hpp), bit-exact with
// nvfp4_ref.cpp applied to each group alone.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11):
//   1. the group tables (kernel parameters)
//   2. kernels: zero the group amaxes, grouped amax, grouped 1-D cast
//   3. the launcher (table chunks, dtype / rounding dispatch) and the entry
//
// One call is three launches per kMaxGroupsPerLaunch groups, whatever their number: every
// group's amax buffers set to +0 (a requantization finds old values there), then every
// group's tensor amax (max |x|, NaN ignored, into both requested directions' buffers: without
// 2d and Hadamard they are equal), then every group's cast. The groups travel in tables passed
// by value as __grid_constant__ kernel parameters; a CTA finds its group by binary search over
// the table's prefix sums of CTAs (sdk::cuda::find_group). Cast tiles start at each group's
// first row, so no 16x1 block crosses an expert boundary: the cast CTA runs quantize_1d_tile
// (nvfp4_tile1d.cuh, the code of the one-tensor quantize_1d_kernel) with the very
// QuantizeParams that nvfp4_kernels.cu's quantize builds for that group alone (the same
// quantize_params), reading the group's amax from its own buffer.
//
// Exactness: amaxes are exact maxima (reduction order does not matter, +0 start as the
// one-tensor pass); the cast is the one-tensor tile code; same compile flags (-fmad=false
// --ftz=false --prec-div=true, QrecipeCompileFlags.cmake).
#include "nvfp4_grouped_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "nvfp4_device.cuh"
#include "nvfp4_tile1d.cuh"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {

using sdk::cuda::find_group;

// ---------------------------------------------------------------- 1. the group tables

struct AmaxEntry {
  std::int64_t first_block;  // prefix sum of amax CTAs (sdk::cuda::GroupTable)
  const void* src;           // the group's first element
  std::int64_t numel;
  bool src_aligned;  // src 16-byte aligned (every run then starts aligned)
  float* out0;       // the requested directions' amax buffers (nullptr: not requested)
  float* out1;
};
using AmaxTable = sdk::cuda::GroupTable<AmaxEntry, kMaxGroupsPerLaunch>;

struct CastEntry {
  std::int64_t first_block;  // prefix sum of cast tiles (sdk::cuda::GroupTable)
  QuantizeParams p;          // the group alone, as nvfp4_kernels.cu would launch it
};
using CastTable = sdk::cuda::GroupTable<CastEntry, kMaxGroupsPerLaunch>;

// ---------------------------------------------------------------- 2. kernels

// Every group's amax buffers start at +0 (thread g: group g), as the one-tensor pass 1.
__global__ void zero_group_amax_kernel(const __grid_constant__ AmaxTable table) {
  const int g = static_cast<int>(threadIdx.x);
  if (g >= table.count) return;
  if (table.group[g].out0) *table.group[g].out0 = 0.0f;
  if (table.group[g].out1) *table.group[g].out1 = 0.0f;
}

// Grouped amax: a CTA reduces kAmaxChunk consecutive elements of one group (kAmaxRuns runs of
// 16 bytes a thread, the runs of a pass adjacent across threads), then one atomic max into
// each of the group's amax buffers. NaN is ignored (fmaxf), padding reads +0.
constexpr int kAmaxThreads = 256;
constexpr int kAmaxRuns = 4;

template <class In>
constexpr std::int64_t kAmaxChunk =
    static_cast<std::int64_t>(kAmaxThreads) * kAmaxRuns * kRunLength<In>;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    grouped_amax_kernel(const __grid_constant__ AmaxTable table) {
  constexpr int N = kRunLength<In>;
  const AmaxEntry& e = table.group[find_group(table, blockIdx.x)];
  const auto* src = static_cast<const typename In::Storage*>(e.src);
  const std::int64_t chunk0 =
      (static_cast<std::int64_t>(blockIdx.x) - e.first_block) * kAmaxChunk<In>;
  float x[kAmaxRuns][N];
#pragma unroll
  for (int u = 0; u < kAmaxRuns; ++u) {  // every load issued before any is used
    const std::int64_t offset =
        chunk0 + (static_cast<std::int64_t>(u) * kAmaxThreads + threadIdx.x) * N;
    const int valid = valid_in_run(offset, e.numel, N);
    if (valid > 0) {
      load_run<In, N>(src, offset, valid, e.src_aligned && valid == N, x[u]);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) x[u][k] = 0.0f;
    }
  }
  float running = 0.0f;
#pragma unroll
  for (int u = 0; u < kAmaxRuns; ++u)
#pragma unroll
    for (int k = 0; k < N; ++k) running = fmaxf(running, num::abs_f(x[u][k]));
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) {
    if (e.out0) atomic_max_nonnegative(e.out0, block);
    if (e.out1) atomic_max_nonnegative(e.out1, block);
  }
}

// Grouped 1-D cast: a CTA quantizes tile (blockIdx.x - first_block) of its group with the
// one-tensor kernel's tile code; the group's parameters are read in place from the table.
template <class In, bool kStochastic>
__global__ void __launch_bounds__(Tile1d<In>::kThreads, Tile1d<In>::kMinBlocksPerSM)
    grouped_quantize_1d_kernel(const __grid_constant__ CastTable table) {
  const CastEntry& e = table.group[find_group(table, blockIdx.x)];
  quantize_1d_tile<In, kStochastic>(
      e.p, static_cast<unsigned>(static_cast<std::int64_t>(blockIdx.x) - e.first_block));
}

// ---------------------------------------------------------------- 3. launcher, entry

unsigned grid_of(std::int64_t blocks, const char* kernel) {
  QR_CHECK(blocks >= 1 && blocks <= INT_MAX, "nvfp4 CUDA quantize_grouped: ", kernel, " needs ",
           blocks, " CTAs; expected 1..", INT_MAX, " (split the groups over several calls)");
  return static_cast<unsigned>(blocks);
}

template <class In, bool kStochastic>
void launch_grouped(const std::vector<QuantizeArgs>& groups) {
  using T = Tile1d<In>;
  const std::int64_t cols = groups.front().cols;
  const cudaStream_t stream = as_stream(groups.front().stream);
  sdk::cuda::for_each_group_chunk<AmaxTable>(groups.size(), [&](AmaxTable& amax,
                                                                std::size_t first) {
    CastTable cast{};
    cast.count = amax.count;
    for (int i = 0; i < amax.count; ++i) {
      const QuantizeArgs& a = groups[first + static_cast<std::size_t>(i)];
      AmaxEntry& ae = amax.group[i];
      ae.src = a.src;
      ae.numel = a.rows * cols;
      ae.src_aligned = sdk::cuda::is_aligned(a.src, 16);
      ae.out0 = a.rowwise ? a.rowwise->amax : nullptr;
      ae.out1 = a.columnwise ? a.columnwise->amax : nullptr;
      if (ae.numel == 0) continue;  // amax only (+0), as quantize of an empty tensor
      QuantizeParams& p = cast.group[i].p;
      p = quantize_params(a);
      p.tiles_per_row = ceil_div(cols, T::kCols);
    }
    const std::int64_t amax_blocks = amax.assign_first_blocks(
        [](const AmaxEntry& e) { return ceil_div(e.numel, kAmaxChunk<In>); });
    const std::int64_t cast_blocks = cast.assign_first_blocks(
        [](const CastEntry& e) { return ceil_div(e.p.rows, T::kRows) * e.p.tiles_per_row; });
    zero_group_amax_kernel<<<1, kMaxGroupsPerLaunch, 0, stream>>>(amax);
    QR_CUDA_CHECK_LAUNCH("zero_group_amax_kernel");
    if (cast_blocks == 0) return;  // only empty groups in this chunk
    grouped_amax_kernel<In>
        <<<grid_of(amax_blocks, "the amax pass"), kAmaxThreads, 0, stream>>>(amax);
    QR_CUDA_CHECK_LAUNCH("grouped_amax_kernel");
    grouped_quantize_1d_kernel<In, kStochastic>
        <<<grid_of(cast_blocks, "the cast pass"), T::kThreads, 0, stream>>>(cast);
    QR_CUDA_CHECK_LAUNCH("grouped_quantize_1d_kernel");
  });
}

template <class In>
void dispatch_rounding(const std::vector<QuantizeArgs>& groups) {
  if (groups.front().stochastic_rounding) launch_grouped<In, true>(groups);
  else launch_grouped<In, false>(groups);
}

}  // namespace

void quantize_grouped(const std::vector<QuantizeArgs>& groups) {
  QR_CHECK(!groups.empty(), "nvfp4 CUDA quantize_grouped: no groups; pass at least one");
  const QuantizeArgs& a0 = groups.front();
  sdk::cuda::check_source_dtype(a0.src_dtype, kFormat, "quantize_grouped");
  QR_CHECK(!a0.two_d && !a0.hadamard, "nvfp4 CUDA quantize_grouped: covers the 1-D options "
           "only (no 2d, no hadamard); quantize those groups one by one");
  QR_CHECK(a0.cols >= 0, "nvfp4 CUDA quantize_grouped: negative column count ", a0.cols);
  const bool rowwise = a0.rowwise != nullptr, columnwise = a0.columnwise != nullptr;
  QR_CHECK(rowwise || columnwise, "nvfp4 CUDA quantize_grouped: no direction requested");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const QuantizeArgs& a = groups[g];
    QR_CHECK(a.src_dtype == a0.src_dtype && a.cols == a0.cols && a.two_d == a0.two_d &&
                 a.hadamard == a0.hadamard && a.stochastic_rounding == a0.stochastic_rounding &&
                 a.seed == a0.seed && (a.rowwise != nullptr) == rowwise &&
                 (a.columnwise != nullptr) == columnwise && a.device_index == a0.device_index &&
                 a.stream == a0.stream,
             "nvfp4 CUDA quantize_grouped: group ", g, " differs from group 0 in source dtype, "
             "columns, options, directions, device or stream; the groups of one call share "
             "one quantizer and one source");
    QR_CHECK(a.given_amax == nullptr, "nvfp4 CUDA quantize_grouped: group ", g, " passes a "
             "reduced amax; grouped calls compute every group's own amax");
    QR_CHECK(a.rows >= 0, "nvfp4 CUDA quantize_grouped: group ", g, " has ", a.rows, " rows");
    const std::int64_t numel = a.rows * a.cols;
    QR_CHECK(numel == 0 || a.src != nullptr, "nvfp4 CUDA quantize_grouped: group ", g,
             " has a null source pointer");
    for (const DirectionBuffers* d : {a.rowwise, a.columnwise})
      QR_CHECK(!d || (d->amax != nullptr && (numel == 0 || (d->data && d->scales))),
               "nvfp4 CUDA quantize_grouped: group ", g, " lacks the data, scale or amax "
               "buffer of a requested direction");
  }
  DeviceGuard guard(a0.device_index, kFormat);
  switch (a0.src_dtype) {
    case QR_DTYPE_F32: dispatch_rounding<F32In>(groups); break;
    case QR_DTYPE_BF16: dispatch_rounding<BF16In>(groups); break;
    default: dispatch_rounding<F16In>(groups); break;
  }
}

}  // namespace qrecipe::nvfp4::cuda
