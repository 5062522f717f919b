// Pass 1 of nvfp4 quantize, the tensor amax (nvfp4_kernels.cu has the map of the passes),
// and the compute_amax_to_host entry of nvfp4_kernels.hpp.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11): kernels (plain amax, Hadamard
// amax, amax fill), then their launchers (grid arithmetic, dtype dispatch), then the entry.
//
// Exactness: as nvfp4_kernels.cu says (every scalar rule is nvfp4_rules.hpp, compiled with
// -fmad=false --ftz=false --prec-div=true; amaxes are exact maxima).
#include <cuda_runtime.h>

#include <cstdint>

#include "hadamard.hpp"
#include "nvfp4_device.cuh"
#include "nvfp4_kernels.hpp"
#include "nvfp4_passes.cuh"
#include "nvfp4_tile64.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {


// ---------------------------------------------------------------- kernels

// Plain amax: grid-stride over 16-byte runs, kAmaxUnroll independent loads in flight per
// thread, a block max, then one atomic per block into each non-null output. 16-bit runs stay
// packed until the loads of a round are all issued (4 registers a run instead of 8: more
// threads resident), and the grid is one wave of resident blocks (launch_amax), so every
// thread has the same share and no partial last wave leaves SMs idle. H100, bf16 8192x8192:
// 4 packed runs a thread (31 registers, 8 blocks an SM) did as well as 8 (99 registers, or
// 56 capped at 4 blocks an SM); 8 decoded runs a thread (77 registers) and a grid of 8 blocks
// an SM (2.7 waves at 3 resident) ran the pass at 65% of DRAM peak.
constexpr int kAmaxThreads = 256;
constexpr int kAmaxUnroll = 4;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const typename In::Storage* src, std::int64_t numel, bool src_aligned,
                float* out0, float* out1) {
  constexpr int N = kRunLength<In>;
  const std::int64_t runs = (numel + N - 1) / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  float running = 0.0f;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       base < runs; base += stride * kAmaxUnroll) {
    if constexpr (sizeof(typename In::Storage) == 2) {
      static_assert(N == 8, "a 16-byte run of 16-bit elements is one Raw8");
      sdk::cuda::Raw8<In> raw[kAmaxUnroll];
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        const std::int64_t offset = (base + u * stride) * N;
        const int valid = valid_in_run(offset, numel, N);  // the rest read as +0
        sdk::cuda::load_raw8<In>(src, offset, valid, src_aligned && valid == N, raw[u]);
      }
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        float x[N];
        sdk::cuda::decode_raw8<In>(raw[u], x);
#pragma unroll
        for (int k = 0; k < N; ++k) running = fmaxf(running, num::abs_f(x[k]));  // NaN ignored
      }
    } else {
      float x[kAmaxUnroll][N];
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        const std::int64_t offset = (base + u * stride) * N;
        const int valid = valid_in_run(offset, numel, N);
        load_run<In, N>(src, offset, valid, src_aligned && valid == N, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u)
#pragma unroll
        for (int k = 0; k < N; ++k) running = fmaxf(running, num::abs_f(x[u][k]));
    }
  }
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) {
    if (out0) atomic_max_nonnegative(out0, block);
    if (out1) atomic_max_nonnegative(out1, block);
  }
}

// Hadamard amax (bf16 source, rows % 16 == 0): one block per 64x64 tile. max |x| goes into
// `plain` (nullable), the max over the transformed values of every 16x1 run into
// `transformed`. Thread t transforms the run (column t / 4, rows 16 * (t % 4) ..) of the tile.
struct HadamardAmaxParams {
  const std::uint16_t* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / Tile::kCols)
  bool src_aligned;            // cols % 8 == 0 and src 16-byte aligned
  float* plain;
  float* transformed;
};

__global__ void __launch_bounds__(Tile::kThreads)
    hadamard_amax_kernel(const HadamardAmaxParams p) {
  __shared__ TileValues tile;
  const std::int64_t row0 = (blockIdx.x / p.tiles_per_row) * Tile::kRows;
  const std::int64_t col0 = (blockIdx.x % p.tiles_per_row) * Tile::kCols;
  const float plain = load_tile<BF16In>(p.src, p.rows, p.cols, row0, col0, p.src_aligned, tile);
  __syncthreads();

  const int c = static_cast<int>(threadIdx.x) / Tile::kColBlocks;
  const int i = static_cast<int>(threadIdx.x) % Tile::kColBlocks;
  float transformed = 0.0f;
  if (col0 + c < p.cols && row0 + i * kBlock < p.rows) {  // whole runs: rows % 16 == 0
    float v[kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) v[j] = tile[i * kBlock + j][c];
    // max |round_to_bf16(v[j])| as round_to_bf16(max |v[j]|): RNE is odd and monotone, so the
    // largest magnitude rounds to the largest rounded magnitude (NaN is ignored either way, and
    // rounds to NaN), one rounding a run instead of 16 (the kernel is bound by instructions).
    hadamard16_fp32(v);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kBlock; ++j) m = fmaxf(m, num::abs_f(v[j]));  // fmaxf ignores NaN
    transformed = num::round_to_bf16(m);
  }
  const float block_plain = block_max<Tile::kThreads>(plain);
  const float block_transformed = block_max<Tile::kThreads>(transformed);
  if (threadIdx.x == 0) {
    if (p.plain && block_plain > 0.0f) atomic_max_nonnegative(p.plain, block_plain);
    if (block_transformed > 0.0f) atomic_max_nonnegative(p.transformed, block_transformed);
  }
}

// Caller-reduced amaxes into the direction buffers (either pointer may be null).
__global__ void fill_amax_kernel(float* dst0, float value0, float* dst1, float value1) {
  if (dst0) *dst0 = value0;
  if (dst1) *dst1 = value1;
}

// ---------------------------------------------------------------- launchers

template <class In>
void launch_amax(const void* src, std::int64_t numel, float* out0, float* out1,
                 cudaStream_t stream) {
  using Storage = typename In::Storage;
  constexpr int N = kRunLength<In>;
  // At most the blocks resident at once (one wave); the grid-stride loop covers the rest.
  static const int blocks_per_sm = [] {
    int n = 0;
    QR_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, amax_kernel<In>, kAmaxThreads, 0));
    return n < 1 ? 1 : n;
  }();
  const std::int64_t runs = ceil_div(numel, N);
  std::int64_t blocks = ceil_div(runs, static_cast<std::int64_t>(kAmaxThreads) * kAmaxUnroll);
  const std::int64_t max_blocks = static_cast<std::int64_t>(sdk::cuda::sm_count(kFormat)) * blocks_per_sm;
  blocks = blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks);
  amax_kernel<In><<<static_cast<unsigned>(blocks), kAmaxThreads, 0, stream>>>(
      static_cast<const Storage*>(src), numel, is_aligned(src, 16), out0, out1);
  QR_CUDA_CHECK_LAUNCH("amax_kernel");
}


}  // namespace

void fill_amax(float* dst0, float value0, float* dst1, float value1, cudaStream_t stream) {
  fill_amax_kernel<<<1, 1, 0, stream>>>(dst0, value0, dst1, value1);
  QR_CUDA_CHECK_LAUNCH("fill_amax_kernel");
}

void plain_amax(const void* src, qr_dtype dtype, std::int64_t numel, float* out0, float* out1,
                cudaStream_t stream) {
  switch (dtype) {
    case QR_DTYPE_F32: launch_amax<F32In>(src, numel, out0, out1, stream); break;
    case QR_DTYPE_BF16: launch_amax<BF16In>(src, numel, out0, out1, stream); break;
    default: launch_amax<F16In>(src, numel, out0, out1, stream); break;
  }
}

void hadamard_amax(const void* src, qr_dtype dtype, std::int64_t rows, std::int64_t cols,
                   float* plain, float* transformed, cudaStream_t stream) {
  QR_CHECK_CODE(dtype == QR_DTYPE_BF16 && rows % kBlock == 0, QR_STATUS_UNSUPPORTED,
                "nvfp4 CUDA hadamard amax: needs a bf16 source with rows % 16 == 0; got dtype "
                "code ", static_cast<int>(dtype), ", ", rows, " rows");
  HadamardAmaxParams p{};
  p.src = static_cast<const std::uint16_t*>(src);
  p.rows = rows;
  p.cols = cols;
  p.src_aligned = cols % TileLoad<BF16In>::kRun == 0 && is_aligned(src, 16);
  p.plain = plain;
  p.transformed = transformed;
  const unsigned blocks = tile_grid(rows, cols, p.tiles_per_row, "hadamard amax");
  hadamard_amax_kernel<<<blocks, Tile::kThreads, 0, stream>>>(p);
  QR_CUDA_CHECK_LAUNCH("hadamard_amax_kernel");
}

// ---------------------------------------------------------------- entry

void compute_amax_device(const void* src, qr_dtype src_dtype, std::int64_t rows,
                         std::int64_t cols, bool hadamard, float* amax_out, int device_index,
                         void* stream) {
  sdk::cuda::check_source_dtype(src_dtype, kFormat, "compute_amax");
  QR_CHECK(rows >= 0 && cols >= 0, "nvfp4 CUDA compute_amax: negative shape ", rows, " x ",
           cols);
  QR_CHECK(rows * cols == 0 || src != nullptr,
           "nvfp4 CUDA compute_amax: the source has a null data pointer");
  QR_CHECK(amax_out != nullptr, "nvfp4 CUDA compute_amax: the output pointer is null");
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  QR_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, 2 * sizeof(float), s));
  if (rows * cols > 0) {
    if (hadamard)
      hadamard_amax(src, src_dtype, rows, cols, amax_out, amax_out + 1, s);
    else
      plain_amax(src, src_dtype, rows * cols, amax_out, amax_out + 1, s);
  }
}

void compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t rows,
                          std::int64_t cols, bool hadamard, float amax_out[2], int device_index,
                          void* stream) {
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  // A stream-ordered temporary [plain, transformed], freed on every path.
  const sdk::cuda::StreamScratch<float> scratch(2, s, kFormat);
  compute_amax_device(src, src_dtype, rows, cols, hadamard, scratch.get(), device_index, stream);
  float host[2] = {0.0f, 0.0f};
  QR_CUDA_CHECK(cudaMemcpyAsync(host, scratch.get(), sizeof host, cudaMemcpyDeviceToHost, s));
  QR_CUDA_CHECK(cudaStreamSynchronize(s));
  amax_out[0] = host[0];
  amax_out[1] = host[1];
}

}  // namespace qrecipe::nvfp4::cuda
