// Header-only CUDA helpers for plugin kernel files (.cu): CUDA error checks that name the
// failing call, a guard that makes a device current and restores the previous one,
// stream-ordered scratch memory, input and output element traits, 16-byte vector loads, warp
// tiles, block / atomic maxima, the amax of a whole tensor, the dequantize of row-major codes
// in 16-byte runs, and the group tables of grouped launches. Include it only from CUDA
// translation units; nothing here is linked from the engine.
//
// Exactness: the element traits widen and round through qrecipe::num (conversions.hpp), and
// the maxima are exact, so kernels built on these helpers keep the bytes of the CPU references.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::sdk::cuda {

// ---------------------------------------------------------------- host: checks, device guard

// Throws a QR_STATUS_DEVICE_ERROR naming the plugin (`format`), the failing `call` and the
// CUDA error when status is not cudaSuccess. `where` is the caller's QR_WHERE().
inline void check_cuda(cudaError_t status, const char* format, const char* call,
                       const std::string& where) {
  if (status == cudaSuccess) return;
  throw Error(QR_STATUS_DEVICE_ERROR, where,
              detail::concat(format, ": CUDA call `", call, "` failed with ",
                             cudaGetErrorName(status), " (", cudaGetErrorString(status),
                             "). Check that the tensors live on the device the call names and "
                             "that the CUDA driver supports this build's toolkit"));
}

// QR_CUDA_CHECK(call) checks a CUDA runtime call; QR_CUDA_CHECK_LAUNCH("kernel") goes after a
// <<<...>>> launch and reports a bad configuration (and earlier asynchronous errors). Both
// need `kFormat` (const char*, the plugin's name) in scope at the point of use.
#define QR_CUDA_CHECK(call) ::qrecipe::sdk::cuda::check_cuda((call), kFormat, #call, QR_WHERE())
#define QR_CUDA_CHECK_LAUNCH(kernel_name)                                                \
  ::qrecipe::sdk::cuda::check_cuda(cudaGetLastError(), kFormat, "launch of " kernel_name, \
                                   QR_WHERE())

// Makes `index` the current device for the lifetime of the guard. `format` names the plugin
// in error messages.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* format) : index_(index) {
    check_cuda(cudaGetDevice(&previous_), format, "cudaGetDevice(&previous_)", QR_WHERE());
    if (previous_ != index_)
      check_cuda(cudaSetDevice(index_), format, "cudaSetDevice(index_)", QR_WHERE());
  }
  ~DeviceGuard() {
    if (previous_ != index_) cudaSetDevice(previous_);  // best effort in a destructor
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int index_;
  int previous_ = 0;
};

// The ABI passes streams as void*.
inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Whether p is a multiple of `bytes` (host and device).
__host__ __device__ inline bool is_aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Blocks for `work_items` items at one item per thread, at least 1 and at most max_blocks.
inline unsigned grid_for(std::int64_t work_items, int threads, std::int64_t max_blocks) {
  const std::int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// Streaming multiprocessors of the current device.
inline int sm_count(const char* format) {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), format, "cudaGetDevice(&device)", QR_WHERE());
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), format,
             "cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device)",
             QR_WHERE());
  return count;
}

// A CUDA entry's source must be f32, bf16 or f16 (QR_STATUS_UNSUPPORTED otherwise): the
// kernels dispatch on those three and read anything else as f16.
inline void check_source_dtype(qr_dtype dtype, const char* format, const char* entry) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, format, " CUDA ", entry, ": source dtype code ",
                static_cast<int>(dtype), " is not f32, bf16 or f16; convert the tensor first");
}

// `count` elements of T of stream-ordered device memory on the current device, from
// cudaMallocAsync on `stream` (or from `pool`), given back with cudaFreeAsync on the same
// stream on every path, exceptions included: work queued before the free still sees it.
template <class T>
class StreamScratch {
 public:
  StreamScratch(std::size_t count, cudaStream_t stream, const char* format,
                cudaMemPool_t pool = nullptr)
      : stream_(stream) {
    void** out = reinterpret_cast<void**>(&ptr_);
    if (pool != nullptr)
      check_cuda(cudaMallocFromPoolAsync(out, count * sizeof(T), pool, stream), format,
                 "cudaMallocFromPoolAsync(out, count * sizeof(T), pool, stream)", QR_WHERE());
    else
      check_cuda(cudaMallocAsync(out, count * sizeof(T), stream), format,
                 "cudaMallocAsync(out, count * sizeof(T), stream)", QR_WHERE());
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);  // best effort in a destructor
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  cudaStream_t stream_;
};

// ---------------------------------------------------------------- direction requests

// Which directions one quantize kernel instance writes: each request (rowwise, columnwise,
// both) runs its own instance, compiled without the other direction's code, registers and
// shared memory.
enum class Directions { kRowwise, kColumnwise, kBoth };

__host__ __device__ constexpr bool has_rowwise(Directions d) {
  return d != Directions::kColumnwise;
}
__host__ __device__ constexpr bool has_columnwise(Directions d) {
  return d != Directions::kRowwise;
}

// ---------------------------------------------------------------- element traits

// Input element types: storage type and exact widening to FP32 (sdk::load_f32 on the host).
struct F32In {
  using Storage = float;
  static __device__ __forceinline__ float to_f32(Storage v) { return v; }
};
struct BF16In {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::bf16_to_f32(v); }
};
struct F16In {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::f16_to_f32(v); }
};

// Dequantize outputs: the final rounding of sdk::store_f32_as on the host.
struct F32Out {
  using Storage = float;
  static __device__ __forceinline__ Storage from_f32(float v) { return v; }
};
struct BF16Out {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ Storage from_f32(float v) { return num::f32_to_bf16(v); }
};
struct F16Out {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ Storage from_f32(float v) { return num::f32_to_f16(v); }
};

// ---------------------------------------------------------------- device: vector access

// A thread reads runs of consecutive elements with one 16-byte load: 4 f32 or 8 bf16/f16.
template <class In>
inline constexpr int kRunLength = 16 / static_cast<int>(sizeof(typename In::Storage));

template <class Storage, int N>
struct alignas(N * sizeof(Storage) >= 16 ? 16 : N * sizeof(Storage)) RunOf {
  Storage v[N];
};

// Loads the run src[offset .. offset + N) holding `valid` (0..N) elements; the missing ones
// read as 0 (which never changes a block amax). `aligned`: the whole run is in bounds and
// 16-byte aligned (one vector load).
template <class In, int N>
__device__ __forceinline__ void load_run(const typename In::Storage* src, std::int64_t offset,
                                         int valid, bool aligned, float (&out)[N]) {
  using Storage = typename In::Storage;
  if (aligned) {
    const RunOf<Storage, N> run = *reinterpret_cast<const RunOf<Storage, N>*>(src + offset);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = In::to_f32(run.v[k]);
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = k < valid ? In::to_f32(src[offset + k]) : 0.0f;
}

// Stores `valid` codes at dst[offset ..]; a whole, 4-byte aligned run goes out as N / 4
// 32-bit words (little-endian: codes[0] is the lowest byte).
template <int N>
__device__ __forceinline__ void store_codes(std::uint8_t* dst, std::int64_t offset, int valid,
                                            bool aligned, const std::uint8_t (&codes)[N]) {
  static_assert(N % 4 == 0, "runs are stored as whole 32-bit words");
  if (aligned) {
#pragma unroll
    for (int w = 0; w < N / 4; ++w) {
      const std::uint32_t word = static_cast<std::uint32_t>(codes[4 * w]) |
                                 (static_cast<std::uint32_t>(codes[4 * w + 1]) << 8) |
                                 (static_cast<std::uint32_t>(codes[4 * w + 2]) << 16) |
                                 (static_cast<std::uint32_t>(codes[4 * w + 3]) << 24);
      *reinterpret_cast<std::uint32_t*>(dst + offset + 4 * w) = word;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k)  // constant indices keep `codes` in registers
    if (k < valid) dst[offset + k] = codes[k];
}

// N floats to 16-byte aligned shared memory as N / 4 vector stores (conflict-free).
template <int N>
__device__ __forceinline__ void store_floats_shared(float* dst, const float (&v)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
    reinterpret_cast<float4*>(dst)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2],
                                                    v[4 * i + 3]);
}

// Elements of a run of n that lie inside a dimension of `extent` when it starts at `start`.
__device__ __forceinline__ int valid_in_run(std::int64_t start, std::int64_t extent, int n) {
  if (start >= extent) return 0;
  return extent - start < n ? static_cast<int>(extent - start) : n;
}

// ---------------------------------------------------------------- device: 8-element runs

// Eight consecutive source elements of one row as loaded (raw bits: 4 words of packed 16-bit
// values or 8 FP32 words), decoded to FP32 only when used so a thread can keep several runs in
// flight in few registers.
template <class In>
struct Raw8 {
  static constexpr int kWords = 8 * static_cast<int>(sizeof(typename In::Storage)) / 4;
  std::uint32_t w[kWords];
};

// Loads src[offset .. offset + 8) of which `valid` (0..8) exist; the rest read as +0.
// `vector_ok`: all 8 exist and src + offset is 16-byte aligned (one or two 16-byte loads).
template <class In>
__device__ __forceinline__ void load_raw8(const typename In::Storage* src, std::int64_t offset,
                                          int valid, bool vector_ok, Raw8<In>& out) {
  using Storage = typename In::Storage;
  constexpr int kVectors = Raw8<In>::kWords / 4;
  if (vector_ok) {
    const uint4* v = reinterpret_cast<const uint4*>(src + offset);
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const uint4 q = v[i];
      out.w[4 * i] = q.x;
      out.w[4 * i + 1] = q.y;
      out.w[4 * i + 2] = q.z;
      out.w[4 * i + 3] = q.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < Raw8<In>::kWords; ++i) out.w[i] = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k >= valid) break;
    if constexpr (sizeof(Storage) == 4) {
      out.w[k] = __float_as_uint(src[offset + k]);
    } else {
      out.w[k / 2] |= static_cast<std::uint32_t>(src[offset + k]) << (16 * (k % 2));
    }
  }
}

// The 8 elements of a run as FP32, exactly as In::to_f32 widens them (fast_conversions.cuh:
// F16 NaNs keep NaN-ness, not their payload, which no output can show).
template <class In>
__device__ __forceinline__ void decode_raw8(const Raw8<In>& r, float (&x)[8]) {
  if constexpr (std::is_same_v<In, F32In>) {
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = __uint_as_float(r.w[k]);
  } else if constexpr (std::is_same_v<In, BF16In>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) num::fast::bf16x2_to_f32x2(r.w[i], x[2 * i], x[2 * i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) num::fast::f16x2_to_f32x2(r.w[i], x[2 * i], x[2 * i + 1]);
  }
}

// Stores 8 one-byte codes (lo: codes 0..3, hi: 4..7, little-endian) at dst[offset ..], of
// which `valid` exist. `vector_ok`: all 8 exist and dst + offset is 8-byte aligned.
__device__ __forceinline__ void store_bytes8(std::uint8_t* dst, std::int64_t offset, int valid,
                                             bool vector_ok, std::uint32_t lo,
                                             std::uint32_t hi) {
  if (vector_ok) {
    *reinterpret_cast<uint2*>(dst + offset) = make_uint2(lo, hi);
    return;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k >= valid) break;
    dst[offset + k] = static_cast<std::uint8_t>((k < 4 ? lo : hi) >> (8 * (k % 4)));
  }
}

// Stores 4 one-byte codes (little-endian in `word`) at dst[offset ..], `valid` of them.
// `vector_ok`: all 4 exist and dst + offset is 4-byte aligned.
__device__ __forceinline__ void store_bytes4(std::uint8_t* dst, std::int64_t offset, int valid,
                                             bool vector_ok, std::uint32_t word) {
  if (vector_ok) {
    *reinterpret_cast<std::uint32_t*>(dst + offset) = word;
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (k >= valid) break;
    dst[offset + k] = static_cast<std::uint8_t>(word >> (8 * k));
  }
}

// ---------------------------------------------------------------- device: 32x32 warp tiles

// A warp tile of 32 rows x 32 columns: lane = 4 * rg + cg holds rows 4 rg .. 4 rg + 3 and
// columns 8 cg .. 8 cg + 7 (4 runs of 8). A row's 32 columns lie in the 4 lanes of one rg
// (lane bits 0..1), a column's 32 rows in the 8 lanes of one cg (lane bits 2..4). Loads (16
// bytes a lane) and 8-byte code stores cover whole 32-byte sectors.
inline constexpr int kTileRowsPerLane = 4;
inline constexpr int kTileColsPerLane = 8;

// Max over the 4 lanes of a row group (the lanes holding one 32-column row), in every lane.
__device__ __forceinline__ float max_over_row_lanes(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// Column maxima of a warp tile, scattered: v[j] is this lane's value for its column 8 cg + j;
// returns the max over the 8 lanes of its cg of column 8 cg + rg (rg = lane / 4). A
// reduce-scatter (each step halves the values exchanged): 7 shuffles instead of 24.
__device__ __forceinline__ float max_over_column_lanes_scatter(const float (&v)[8]) {
  const unsigned lane = threadIdx.x % 32;
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float a[4], b[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // a[k]: column 4 * b4 + k
    const float send = b4 ? v[k] : v[k + 4], keep = b4 ? v[k + 4] : v[k];
    a[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 16));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // b[k]: column 4 * b4 + 2 * b3 + k
    const float send = b3 ? a[k] : a[k + 2], keep = b3 ? a[k + 2] : a[k];
    b[k] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 8));
  }
  const float send = b2 ? b[0] : b[1], keep = b2 ? b[1] : b[0];  // column 4 b4 + 2 b3 + b2
  return fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 4));
}

// The inverse direction: `own` is this lane's value for column 8 cg + rg; returns in out[j]
// the value of column 8 cg + j (from lane 4 j + cg).
template <class T>
__device__ __forceinline__ void gather_column_values(T own, T (&out)[8]) {
  const unsigned cg = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = __shfl_sync(0xFFFFFFFFu, own, 4 * j + cg);
}

// ---------------------------------------------------------------- device: maxima

// |x| folded into a running max; fmaxf ignores NaN, like the references' std::fmax.
__device__ __forceinline__ float amax_of(float running, float x) {
  return fmaxf(running, num::abs_f(x));
}

// Max over the block of every thread's `v` (all threads must call it; result valid in all).
template <int kThreads>
__device__ float block_max(float v) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size must be whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_max[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  float result = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) result = fmaxf(result, warp_max[w]);
  __syncthreads();  // warp_max may be reused by a later call
  return result;
}

// Max of non-negative floats through their bit patterns: for x, y >= +0 (never NaN, never
// -0), x < y exactly when bits(x) < bits(y) as unsigned integers. +inf orders last.
__device__ __forceinline__ void atomic_max_nonnegative(float* address, float value) {
  atomicMax(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
}

// ---------------------------------------------------------------- amax of a whole tensor

// amax: grid-stride over 16-byte runs, a block max, then one atomic per block.
inline constexpr int kAmaxThreads = 256;
inline constexpr std::int64_t kAmaxMaxBlocks = 2048;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const typename In::Storage* src, std::int64_t numel, bool src_aligned,
                float* amax_out) {
  constexpr int N = kRunLength<In>;
  const std::int64_t runs = (numel + N - 1) / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  float running = 0.0f;
  for (std::int64_t run = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       run < runs; run += stride) {
    const std::int64_t offset = run * N;
    const int valid = valid_in_run(offset, numel, N);
    float x[N];
    load_run<In, N>(src, offset, valid, src_aligned && valid == N, x);
#pragma unroll
    for (int k = 0; k < N; ++k) running = amax_of(running, x[k]);  // padding reads 0
  }
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) atomic_max_nonnegative(amax_out, block);
}

// Launches amax_kernel over `numel` elements of `src`, folding into *amax_out (device).
template <class In>
void launch_amax(const void* src, std::int64_t numel, float* amax_out, cudaStream_t stream,
                 const char* format) {
  const std::int64_t runs = (numel + kRunLength<In> - 1) / kRunLength<In>;
  amax_kernel<In><<<grid_for(runs, kAmaxThreads, kAmaxMaxBlocks), kAmaxThreads, 0, stream>>>(
      static_cast<const typename In::Storage*>(src), numel, is_aligned(src, 16), amax_out);
  // After the launch: reports a bad configuration (and earlier asynchronous errors).
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess)
    check_cuda(status, format, (std::string("launch of ") + format + " amax_kernel").c_str(),
               QR_WHERE());
}

// max |x| over `numel` elements of a contiguous f32/bf16/f16 device tensor (NaN ignored),
// returned to the host after synchronizing `stream`. The caller checks src_dtype; any dtype
// other than f32/bf16 is read as f16. `format` names the plugin in error messages. (A
// template so that only the translation units that call it compile its three kernels.)
template <class = void>
float amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                          int device_index, void* stream, const char* format) {
  QR_CHECK(numel >= 0, format, " CUDA compute_amax: negative element count ", numel);
  if (numel == 0) return 0.0f;
  QR_CHECK(src != nullptr, format, " CUDA compute_amax: source of ", numel,
           " elements has a null data pointer");
  DeviceGuard guard(device_index, format);
  const cudaStream_t s = as_stream(stream);
  const StreamScratch<float> scratch(1, s, format);
  check_cuda(cudaMemsetAsync(scratch.get(), 0, sizeof(float), s), format,
             "cudaMemsetAsync(scratch.get(), 0, sizeof(float), s)", QR_WHERE());
  switch (src_dtype) {
    case QR_DTYPE_F32: launch_amax<F32In>(src, numel, scratch.get(), s, format); break;
    case QR_DTYPE_BF16: launch_amax<BF16In>(src, numel, scratch.get(), s, format); break;
    default: launch_amax<F16In>(src, numel, scratch.get(), s, format); break;
  }
  float value = 0.0f;
  check_cuda(cudaMemcpyAsync(&value, scratch.get(), sizeof(float), cudaMemcpyDeviceToHost, s),
             format,
             "cudaMemcpyAsync(&value, scratch.get(), sizeof(float), cudaMemcpyDeviceToHost, s)",
             QR_WHERE());
  check_cuda(cudaStreamSynchronize(s), format, "cudaStreamSynchronize(s)", QR_WHERE());
  return value;
}

// ---------------------------------------------------------------- dequantize, 16-byte runs

// Dequantize of one-byte codes stored row-major [rows, cols] (the layout of the destination):
// a thread decodes runs of kDequantizeRun codes of one row (one 16-byte load, and one vector
// store of the outputs, where aligned), grid-stride. Only the decode is the format's: a
// Decoder is a trivially copyable kernel parameter with
//   __device__ Run run(std::int64_t r, std::int64_t c0) const
//   __device__ float decode(const Run& run, std::uint8_t q, int k, int valid) const
// run() gives what the run starting at (r, c0) decodes with (a scale row, say); decode() the
// value of its element k, code q (only k < valid exist; the others are not stored).
inline constexpr int kDequantizeThreads = 256;
inline constexpr int kDequantizeRun = 16;
inline constexpr std::int64_t kDequantizeMaxBlocks = 8192;  // the grid-stride loop does the rest

template <class Decoder>
struct DequantizeRunsParams {
  const std::uint8_t* data;
  Decoder decoder;
  std::int64_t rows, cols;
  std::int64_t runs_per_row;  // ceil(cols / kDequantizeRun)
  bool aligned;               // cols % 16 == 0, data and dst 16-byte aligned
};

template <class Out, class Decoder>
__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_runs_kernel(const DequantizeRunsParams<Decoder> p, typename Out::Storage* dst) {
  using Storage = typename Out::Storage;
  constexpr int N = kDequantizeRun;
  const std::int64_t runs = p.rows * p.runs_per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t run = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       run < runs; run += stride) {
    const std::int64_t r = run / p.runs_per_row;
    const std::int64_t c0 = (run % p.runs_per_row) * N;
    const int valid = valid_in_run(c0, p.cols, N);
    const std::int64_t offset = r * p.cols + c0;
    const bool whole = p.aligned && valid == N;
    std::uint8_t q[N];
    if (whole) {
      const RunOf<std::uint8_t, N> in =
          *reinterpret_cast<const RunOf<std::uint8_t, N>*>(p.data + offset);
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = in.v[k];
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) q[k] = k < valid ? p.data[offset + k] : 0;
    }
    RunOf<Storage, N> out;
    const auto at = p.decoder.run(r, c0);
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = Out::from_f32(p.decoder.decode(at, q[k], k, valid));
    if (whole) {
      *reinterpret_cast<RunOf<Storage, N>*>(dst + offset) = out;
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (k < valid) dst[offset + k] = out.v[k];
    }
  }
}

// Launches dequantize_runs_kernel<Out> over the [rows, cols] codes at `data` into `dst`
// (contiguous [rows, cols] of Out::Storage) on `stream`.
template <class Out, class Decoder>
void launch_dequantize_runs(const std::uint8_t* data, const Decoder& decoder, std::int64_t rows,
                            std::int64_t cols, void* dst, cudaStream_t stream,
                            const char* format) {
  DequantizeRunsParams<Decoder> p{};
  p.data = data;
  p.decoder = decoder;
  p.rows = rows;
  p.cols = cols;
  p.runs_per_row = (cols + kDequantizeRun - 1) / kDequantizeRun;
  p.aligned = cols % kDequantizeRun == 0 && is_aligned(data, 16) && is_aligned(dst, 16);
  const unsigned blocks = grid_for(rows * p.runs_per_row, kDequantizeThreads, kDequantizeMaxBlocks);
  dequantize_runs_kernel<Out, Decoder><<<blocks, kDequantizeThreads, 0, stream>>>(
      p, static_cast<typename Out::Storage*>(dst));
  check_cuda(cudaGetLastError(), format, "launch of dequantize_runs_kernel", QR_WHERE());
}

// ---------------------------------------------------------------- grouped quantization
// (plugin_abi.h, QR_EXTRA_QUANTIZE_GROUPED)

// The groups of one grouped launch, passed by value as a `__grid_constant__` kernel parameter
// (no upload, no allocation). `Entry` is the plugin's per-group record; it must have
// `std::int64_t first_block`, the prefix sum of the blocks of the groups before it.
template <class Entry, int kMaxGroups>
struct GroupTable {
  // Kernel parameters may hold 32764 bytes since CUDA 12.1 (Volta and later); 256 are left to
  // the kernel's other parameters.
  static_assert(sizeof(Entry) * kMaxGroups + sizeof(int) + 256 <= 32764,
                "the group table must fit the kernel parameters");
  static constexpr int kCapacity = kMaxGroups;
  Entry group[kMaxGroups];
  int count;

  // Host: sets each of the `count` entries' first_block to the blocks of the entries before
  // it (blocks_of(entry), >= 0) and returns the blocks of all of them.
  template <class BlocksOf>
  std::int64_t assign_first_blocks(BlocksOf&& blocks_of) {
    std::int64_t blocks = 0;
    for (int i = 0; i < count; ++i) {
      group[i].first_block = blocks;
      blocks += blocks_of(group[i]);
    }
    return blocks;
  }
};

// Host: the groups of a grouped call in launches of at most Table::kCapacity: calls
// fn(table, first) for groups first, first + 1, ... with a zeroed table whose count is set
// (entry i is group first + i); fn fills the entries and launches.
template <class Table, class Fn>
void for_each_group_chunk(std::size_t num_groups, Fn&& fn) {
  constexpr auto kCapacity = static_cast<std::size_t>(Table::kCapacity);
  for (std::size_t first = 0; first < num_groups; first += kCapacity) {
    Table table{};
    const std::size_t left = num_groups - first;
    table.count = static_cast<int>(left < kCapacity ? left : kCapacity);
    fn(table, first);
  }
}

// The group of block b: the last group whose first block is <= b. A group without blocks
// shares its first_block with the next group, which then owns b.
template <class Entry>
__device__ __forceinline__ int find_group_in(const Entry* group, int count, std::int64_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (group[mid].first_block <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <class Entry, int kMaxGroups>
__device__ __forceinline__ int find_group(const GroupTable<Entry, kMaxGroups>& table,
                                          std::int64_t b) {
  return find_group_in(table.group, table.count, b);
}

// The table entry of a grouped launch whose CTAs run the format's one-tensor tile code: the
// group's first block and the parameters the one-tensor launch takes for the group alone.
template <class Params>
struct TileGroup {
  std::int64_t first_block;  // prefix sum of the tiles of the groups before it
  Params p;
};

template <class Tile, int kMaxGroups>
using TileGroupTable = GroupTable<TileGroup<typename Tile::Params>, kMaxGroups>;

// The grouped kernel of a format whose groups run its one-tensor tile code: CTA b quantizes
// tile b - first_block of its group (row-major, tile_cols tiles a row) with the group's own
// parameters, read in place from the table. `Tile` is the format's: Params (with `rows`),
// Shared (the CTA's shared memory), kRows, kCols, kThreads, kMinBlocksPerSM, and
//   static __device__ void quantize(const Params& p, std::int64_t tile_row,
//                                   std::int64_t tile_col, Shared& shared)
// (the interior or the edge path of the one-tensor kernel, as it would choose).
template <class Tile, int kMaxGroups>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSM)
    grouped_tile_kernel(const std::int64_t tile_cols,
                        const __grid_constant__ TileGroupTable<Tile, kMaxGroups> table) {
  __shared__ typename Tile::Shared shared;
  const TileGroup<typename Tile::Params>& e = table.group[find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  Tile::quantize(e.p, local / tile_cols, local % tile_cols, shared);
}

// Host: every group of a grouped call through grouped_tile_kernel<Tile>, in launches of at most
// kMaxGroups groups on `stream`. Group g (with `rows`) gets params_of(g), the parameters the
// one-tensor kernel would take for it alone, and ceil(rows / kRows) x ceil(cols / kCols) tiles
// starting at its first row, so no tile crosses a group; a group without elements gets none
// (its buffers may be null). `format` names the plugin in errors.
template <class Tile, int kMaxGroups, class Group, class ParamsOf>
void launch_grouped_tiles(const std::vector<Group>& groups, std::int64_t cols,
                          ParamsOf&& params_of, cudaStream_t stream, const char* format) {
  using Table = TileGroupTable<Tile, kMaxGroups>;
  const std::int64_t tile_cols = (cols + Tile::kCols - 1) / Tile::kCols;
  for_each_group_chunk<Table>(groups.size(), [&](Table& table, std::size_t first) {
    for (int i = 0; i < table.count; ++i) {
      const Group& g = groups[first + static_cast<std::size_t>(i)];
      if (g.rows > 0 && cols > 0) table.group[i].p = params_of(g);
    }
    const std::int64_t tiles = table.assign_first_blocks([&](const auto& e) {
      return (e.p.rows + Tile::kRows - 1) / Tile::kRows * tile_cols;
    });
    if (tiles == 0) return;  // only empty groups in this chunk
    QR_CHECK(tiles <= INT_MAX, format, " CUDA quantize_grouped: ", tiles, " tiles of ",
             Tile::kRows, "x", Tile::kCols, "; at most ", INT_MAX, " fit in one grid (split "
             "the groups over several calls)");
    grouped_tile_kernel<Tile, kMaxGroups>
        <<<static_cast<unsigned>(tiles), Tile::kThreads, 0, stream>>>(tile_cols, table);
    check_cuda(cudaGetLastError(), format, "launch of grouped_tile_kernel", QR_WHERE());
  });
}

// A parameter table's launch has exactly its blocks: none is past the end.
template <class Entry, int kMaxGroups>
__device__ __forceinline__ bool past_end(const GroupTable<Entry, kMaxGroups>&, std::int64_t) {
  return false;
}

// ---- device-split grouped quantization (plugin_abi.h, QR_EXTRA_QUANTIZE_GROUPED_DEVICE)

// The groups of a launch whose sizes only the device knows: the plugin's entries in device
// memory (written by a layout kernel from the offsets, `first_block` as in GroupTable), and
// the launch's real block count in device memory. The grid is sized on the host for any split
// (a bound), so blocks past the real count return at once (past_end).
template <class Entry>
struct DeviceGroupTable {
  const Entry* group;
  int count;
  const std::int64_t* total_blocks;
};

template <class Entry>
__device__ __forceinline__ int find_group(const DeviceGroupTable<Entry>& table, std::int64_t b) {
  return find_group_in(table.group, table.count, b);
}

template <class Entry>
__device__ __forceinline__ bool past_end(const DeviceGroupTable<Entry>& table, std::int64_t b) {
  return b >= *table.total_blocks;
}

// Exclusive prefix sums over the groups inside ONE block of kScanThreads threads (a layout
// kernel): `count(g, c)` fills the kCounts counts of group g < groups, `emit(g, first)` gets
// the sums of those of the groups before it, and `emit(groups, total)` the totals (thread 0).
// A chunked Hillis-Steele scan in shared memory; every thread of the block must call it.
inline constexpr int kScanThreads = 1024;

template <int kCounts, class Count, class Emit>
__device__ void scan_groups(int groups, Count count, Emit emit) {
  __shared__ std::int64_t part[kCounts][kScanThreads];
  __shared__ std::int64_t carry[kCounts];
  if (threadIdx.x == 0)
    for (int k = 0; k < kCounts; ++k) carry[k] = 0;
  for (int base = 0; base < groups; base += kScanThreads) {
    const int g = base + static_cast<int>(threadIdx.x);
    std::int64_t c[kCounts] = {};
    if (g < groups) count(g, c);
    __syncthreads();
    for (int k = 0; k < kCounts; ++k) part[k][threadIdx.x] = c[k];
    __syncthreads();
    for (int step = 1; step < kScanThreads; step *= 2) {
      std::int64_t before[kCounts];
      for (int k = 0; k < kCounts; ++k)
        before[k] = threadIdx.x >= step ? part[k][threadIdx.x - step] : 0;
      __syncthreads();
      for (int k = 0; k < kCounts; ++k) part[k][threadIdx.x] += before[k];
      __syncthreads();
    }
    if (g < groups) {
      std::int64_t first[kCounts];
      for (int k = 0; k < kCounts; ++k) first[k] = carry[k] + part[k][threadIdx.x] - c[k];
      emit(g, first);
    }
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1)
      for (int k = 0; k < kCounts; ++k) carry[k] += part[k][kScanThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    std::int64_t total[kCounts];
    for (int k = 0; k < kCounts; ++k) total[k] = carry[k];
    emit(groups, total);
  }
}


// The device-split form of grouped_tile_kernel: the groups' TileGroup entries in device memory,
// written on the stream before the launch by the plugin's layout kernel (a scan_groups kernel
// that makes each group's Params on the device from the offsets, the same Params the host path
// makes), the real tile count in device memory; blocks past it return at once.
template <class Tile>
using DeviceTileTable = DeviceGroupTable<TileGroup<typename Tile::Params>>;

template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSM)
    device_grouped_tile_kernel(const std::int64_t tile_cols,
                               const __grid_constant__ DeviceTileTable<Tile> table) {
  __shared__ typename Tile::Shared shared;
  if (past_end(table, blockIdx.x)) return;
  const TileGroup<typename Tile::Params>& e = table.group[find_group(table, blockIdx.x)];
  const std::int64_t local = static_cast<std::int64_t>(blockIdx.x) - e.first_block;
  Tile::quantize(e.p, local / tile_cols, local % tile_cols, shared);
}

// The tiles of a group of `rows` rows (device or host): ceil(rows / kRows) x ceil(cols / kCols),
// none for a group without elements.
template <class Tile>
__host__ __device__ inline std::int64_t group_tiles(std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return (rows + Tile::kRows - 1) / Tile::kRows * ((cols + Tile::kCols - 1) / Tile::kCols);
}

// Host: launches device_grouped_tile_kernel<Tile> over the `groups` entries at `table.group`
// (device; their real tile count at table.total_blocks), with a grid sized for any split of
// `rows` rows into the groups: sum_g ceil(rows_g / kRows) <= rows / kRows + groups.
template <class Tile>
void launch_device_grouped_tiles(const DeviceTileTable<Tile>& table, std::int64_t rows,
                                 std::int64_t cols, cudaStream_t stream, const char* format) {
  const std::int64_t tile_cols = (cols + Tile::kCols - 1) / Tile::kCols;
  const std::int64_t bound = (rows / Tile::kRows + table.count) * tile_cols;
  if (bound == 0) return;  // no elements
  QR_CHECK(bound <= INT_MAX, format, " CUDA quantize_grouped_device: up to ", bound,
           " tiles of ", Tile::kRows, "x", Tile::kCols, "; at most ", INT_MAX,
           " fit in one grid (split the groups over several calls)");
  device_grouped_tile_kernel<Tile>
      <<<static_cast<unsigned>(bound), Tile::kThreads, 0, stream>>>(tile_cols, table);
  check_cuda(cudaGetLastError(), format, "launch of device_grouped_tile_kernel", QR_WHERE());
}

}  // namespace qrecipe::sdk::cuda
