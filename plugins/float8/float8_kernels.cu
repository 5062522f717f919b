// CUDA kernels of the float8 format, bit-exact with float8_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, launch sizes (resident blocks per device and kernel),
//      launches that overlap the previous kernel (PDL), scratch memory for the amax pass
//   2. element traits: input dtypes (16-byte vector decode), FP8 outputs (hardware encode)
//   3. device helpers: loads / stores, grid dependency control, scale, block max,
//      atomic max, 4x4 byte transpose, tile swizzle
//   4. kernels: amax, rowwise cast (flat), cast + transpose (tiles), dequantize, scalars
//   5. launchers (grid arithmetic, dtype dispatch) and the entries of float8_kernels.hpp
//
// Exactness: FP8 rounding goes through qrecipe::num::fast (fast_conversions.cuh: the hardware
// conversion with the reference's NaN rule, proven equal to conversions.hpp over all 2^32
// inputs by tests/gpu/test_gpu_conversions.cpp), the scale comes from
// qrecipe::scale_from_amax (scaling.hpp), and the plugin is compiled with -fmad=false
// --ftz=false --prec-div=true (QrecipeCompileFlags.cmake), so the device performs the same
// IEEE operations as the reference: q = sat_rne(fp32(x) * scale), scale_inv = 1 / scale,
// decode = fp32(q) * scale_inv. The amax is an exact max, so its reduction order does not
// matter.
//
// Bandwidth (issue 6): every kernel moves 16-byte vectors (8- or 16-byte code stores) with
// 128 bytes of loads in flight per thread, issued before any of them is used. The cast
// kernels give each block one 32 KiB piece of the input (a chunk, or a 128-row tile) rather
// than a persistent grid (measured ~10% slower on an H100, likely because a static share per
// SM waits for the slowest SM),
// and issue their loads before they wait for the kernel they follow. Fixed costs per call are
// what separates a 64 MiB tensor from the copy ceiling, so the entry makes two launches and no
// memset:
//   current scaling: amax pass (per-block maxima into stream-ordered scratch, no zeroing)
//     -> cast, launched to overlap the amax pass (programmatic dependent launch, PDL): its
//     blocks start as amax blocks retire, load their first data, then wait for the pass to
//     finish; each warp reduces the per-block maxima (about 1 KiB) into the scale. The cast
//     walks the tensor backwards, so it first reads what the amax pass read last, partly
//     still in L2.
//   delayed scaling: a one-thread launch zeroes the amax buffers -> the cast (one pass,
//     overlapping it) observes the amax and waits for the zeroing only before its atomics.
// Both directions come out of one pass over shared-memory tiles. Ragged edges, unaligned
// pointers and shapes that are not multiples of the vector fall back to element-by-element
// code paths that produce the same bytes.
#include "float8_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, launch sizes

constexpr const char* kFormat = "float8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers (qrecipe/cuda_sdk.cuh).
using sdk::cuda::DeviceGuard;
using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::block_max;
using sdk::cuda::check_cuda;
using sdk::cuda::is_aligned;

int current_device() {
  int device = 0;
  QR_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Blocks of `kernel` (launched with `threads` threads and no dynamic shared memory) that fit
// on the current device at once: SM count x resident blocks per SM. Asked from the runtime
// once per (device, kernel) and cached, so a launch costs a map lookup.
int resident_blocks(const void* kernel, int threads) {
  const int device = current_device();
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, kernel);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int sms = 0, per_sm = 0;
  QR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  QR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int blocks = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  cache.emplace(key, blocks);
  return blocks;
}

// Blocks for a grid-stride kernel over `items` (each thread takes `per_thread` per
// iteration): one full wave of resident blocks, or fewer when there is less work.
unsigned grid_stride_blocks(const void* kernel, int threads, std::int64_t items,
                            std::int64_t per_thread) {
  const std::int64_t per_block = static_cast<std::int64_t>(threads) * per_thread;
  const std::int64_t wanted = (items + per_block - 1) / per_block;
  const std::int64_t resident = resident_blocks(kernel, threads);
  return static_cast<unsigned>(wanted < 1 ? 1 : (wanted < resident ? wanted : resident));
}

// Launches kernel<<<blocks, threads, 0, stream>>>(args...). With `overlap_previous`, as a
// programmatic dependent launch (PDL, sm_90): its blocks may start while the previous kernel
// in the stream (always one of this file's, which allows it early) still runs, and must call
// grid_dependency_wait() before touching anything that kernel writes. Only for kernels that
// follow one of ours: a foreign previous kernel could still be writing our input. Where the
// attribute is refused (a device or stream without PDL), the plain launch is used.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), unsigned blocks, int threads, cudaStream_t stream,
            bool overlap_previous, const char* name, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = overlap_previous ? 1 : 0;
  cudaError_t status = cudaLaunchKernelEx(&config, kernel, args...);
  if (status != cudaSuccess && config.numAttrs != 0) {
    (void)cudaGetLastError();  // the refused attribute; the plain launch reports real errors
    config.numAttrs = 0;
    status = cudaLaunchKernelEx(&config, kernel, args...);
  }
  check_cuda(status, kFormat, (std::string("launch of ") + name).c_str(), QR_WHERE());
}

// Scratch for the amax pass's per-block maxima: stream-ordered allocations from a memory pool
// of this plugin (one per device, created on first use, never trimmed: the few KiB it holds
// are reused by every call without a trip to the driver). Stream-ordered allocation keeps
// concurrent quantizes on different streams apart; the application's pools are untouched.
cudaMemPool_t scratch_pool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  QR_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep_all = UINT64_MAX;
  QR_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  pools.emplace(device, pool);
  return pool;
}

// `count` floats of stream-ordered scratch, freed (stream-ordered) on every path.
class StreamScratch {
 public:
  StreamScratch(std::size_t count, cudaStream_t stream) : stream_(stream) {
    QR_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&ptr_),
                                          count * sizeof(float), scratch_pool(current_device()),
                                          stream));
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
  cudaStream_t stream_;
};

// ---------------------------------------------------------------- 2. element traits

// Input element types: storage, elements per 16-byte vector, and exact widening to FP32 (the
// reference's load_f32) for one element and for a whole vector.
struct F32In {
  using Storage = float;
  static constexpr int kPerVector = 4;
  static __device__ __forceinline__ float to_f32(Storage v) { return v; }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    x[0] = __uint_as_float(v.x);
    x[1] = __uint_as_float(v.y);
    x[2] = __uint_as_float(v.z);
    x[3] = __uint_as_float(v.w);
  }
};
struct BF16In {
  using Storage = std::uint16_t;
  static constexpr int kPerVector = 8;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::bf16_to_f32(v); }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    num::fast::bf16x2_to_f32x2(v.x, x[0], x[1]);
    num::fast::bf16x2_to_f32x2(v.y, x[2], x[3]);
    num::fast::bf16x2_to_f32x2(v.z, x[4], x[5]);
    num::fast::bf16x2_to_f32x2(v.w, x[6], x[7]);
  }
};
struct F16In {
  using Storage = std::uint16_t;
  static constexpr int kPerVector = 8;
  static __device__ __forceinline__ float to_f32(Storage v) { return num::fast::f16_to_f32(v); }
  static __device__ __forceinline__ void decode(const uint4& v, float (&x)[kPerVector]) {
    num::fast::f16x2_to_f32x2(v.x, x[0], x[1]);
    num::fast::f16x2_to_f32x2(v.y, x[2], x[3]);
    num::fast::f16x2_to_f32x2(v.z, x[4], x[5]);
    num::fast::f16x2_to_f32x2(v.w, x[6], x[7]);
  }
};

// FP8 data types: the reference's encode (hardware fast path, same bytes) and decode.
struct E4M3Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e4m3x4(a, b, c, d);
  }
  static __device__ __forceinline__ std::uint8_t encode1(float x) {
    return static_cast<std::uint8_t>(num::fast::f32x2_to_e4m3x2(x, 0.0f) & 0xFFu);
  }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e4m3_to_f32(c); }
};
struct E5M2Out {
  static __device__ __forceinline__ std::uint32_t encode4(float a, float b, float c, float d) {
    return num::fast::f32x4_to_e5m2x4(a, b, c, d);
  }
  static __device__ __forceinline__ std::uint8_t encode1(float x) {
    return static_cast<std::uint8_t>(num::fast::f32x2_to_e5m2x2(x, 0.0f) & 0xFFu);
  }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e5m2_to_f32(c); }
};

// ---------------------------------------------------------------- 3. device helpers

// One 16-byte global load / store and 8- / 4-byte code stores (the caller guarantees the
// alignment).
__device__ __forceinline__ uint4 load16(const void* p) { return *static_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, const uint4& v) { *static_cast<uint4*>(p) = v; }
__device__ __forceinline__ void store8(void* p, std::uint32_t lo, std::uint32_t hi) {
  *static_cast<uint2*>(p) = make_uint2(lo, hi);
}
__device__ __forceinline__ void store4(void* p, std::uint32_t word) {
  *static_cast<std::uint32_t*>(p) = word;
}

// Programmatic dependent launch (sm_90; no-ops below, where launches never overlap).
// Lets the next kernel in the stream, if launched with PDL, start its blocks now (they still
// wait for this grid's completion in grid_dependency_wait before reading what it writes).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Waits until the kernel this one overlaps has completed and its writes are visible; returns
// at once when the launch did not overlap. Idempotent.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// N scaled elements -> N codes in N / 4 little-endian words (element 0 in the lowest byte).
template <class Out, int N>
__device__ __forceinline__ void encode_words(const float (&x)[N], float scale,
                                             std::uint32_t (&words)[N / 4]) {
  static_assert(N % 4 == 0, "codes are packed four to a word");
#pragma unroll
  for (int w = 0; w < N / 4; ++w)
    words[w] = Out::encode4(x[4 * w] * scale, x[4 * w + 1] * scale, x[4 * w + 2] * scale,
                            x[4 * w + 3] * scale);
}

// The most amax targets a cast can have: CastTransposeArgs::amax_accumulate (3) and
// amax_out (2, delayed scaling).
constexpr int kMaxAccumulate = 5;

// What both cast kernels write besides the data, and where their scale comes from.
struct CastScalars {
  float* rowwise_scale_inv;     // nullptr: not requested
  float* columnwise_scale_inv;  // nullptr: not requested
  float* amax_accumulate[kMaxAccumulate];  // nullptr entries skipped; all nullptr: no amax
  float* amax_set[2];           // receive the amax pass's tensor amax (block 0), or nullptr
  float* amax_mirror;           // nullptr, or receives *scale.device_amax
  ScaleSource scale;
  const float* amax_partials;   // the amax pass's per-block maxima, or nullptr
  int partial_count;
  bool scale_waits;             // the scale comes from the kernel this launch overlaps
};

// Most per-block maxima an amax pass leaves (its grid is capped to this): each warp of a cast
// reads them all, kMaxAmaxPartials / 32 loads per lane issued together.
constexpr int kMaxAmaxPartials = 512;

// The cast's scale, in every thread. Warp-uniform, no block barrier: every warp must call it
// with all its lanes. From the amax pass: the max of its per-block maxima, which each warp
// reduces on its own (read through L2 with __ldcg: they were written by the grid this one
// overlaps), also returned in `tensor_amax`.
__device__ __forceinline__ float cast_scale(const CastScalars& s, float& tensor_amax) {
  tensor_amax = 0.0f;
  if (s.amax_partials != nullptr) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    float part[kMaxAmaxPartials / 32];
#pragma unroll
    for (int j = 0; j < kMaxAmaxPartials / 32; ++j) {
      const int i = lane + 32 * j;
      part[j] = i < s.partial_count ? __ldcg(s.amax_partials + i) : 0.0f;
    }
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxAmaxPartials / 32; ++j) m = fmaxf(m, part[j]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    tensor_amax = m;
    return scale_from_amax(m, s.scale.fmax, s.scale.pow2_scales, s.scale.amax_epsilon);
  }
  if (s.scale.device_amax != nullptr)
    return scale_from_amax(__ldcg(s.scale.device_amax), s.scale.fmax, s.scale.pow2_scales,
                           s.scale.amax_epsilon);
  if (s.scale.device_scale != nullptr) return __ldcg(s.scale.device_scale);
  return s.scale.scale;
}

// Block 0 writes scale_inv = 1 / scale (IEEE division, --prec-div=true), the amax pass's
// amax and the mirror amax.
__device__ __forceinline__ void write_block_zero_scalars(const CastScalars& s, float scale,
                                                         float tensor_amax) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const float scale_inv = 1.0f / scale;
  if (s.rowwise_scale_inv) *s.rowwise_scale_inv = scale_inv;
  if (s.columnwise_scale_inv) *s.columnwise_scale_inv = scale_inv;
  if (s.amax_set[0]) *s.amax_set[0] = tensor_amax;
  if (s.amax_set[1]) *s.amax_set[1] = tensor_amax;
  if (s.amax_mirror) *s.amax_mirror = __ldcg(s.scale.device_amax);
}

// The block's amax joins every accumulation target: one atomic per block and target.
// Block-uniform: every thread of the block must call it. The targets may have been zeroed by
// the kernel this launch overlaps, hence the wait first.
template <int kThreads>
__device__ __forceinline__ void accumulate_block_amax(const CastScalars& s, float running) {
  grid_dependency_wait();
  bool any = false;
#pragma unroll
  for (int i = 0; i < kMaxAccumulate; ++i) any = any || s.amax_accumulate[i] != nullptr;
  if (!any) return;
  const float block = block_max<kThreads>(running);
  if (threadIdx.x != 0 || !(block > 0.0f)) return;  // 0 changes nothing
#pragma unroll
  for (int i = 0; i < kMaxAccumulate; ++i)
    if (s.amax_accumulate[i]) atomic_max_nonnegative(s.amax_accumulate[i], block);
}

// Transposes a 4x4 byte matrix held as 4 words (word i = row i, byte j = column j) into
// 4 words (word j = column j, byte i = row i). __byte_perm(x, y, s): result byte n is byte
// (s >> 4n) & 7 of the 8 bytes {x, y}.
__device__ __forceinline__ void transpose_4x4_bytes(std::uint32_t r0, std::uint32_t r1,
                                                    std::uint32_t r2, std::uint32_t r3,
                                                    std::uint32_t (&col)[4]) {
  const std::uint32_t t0 = __byte_perm(r0, r1, 0x5140);  // r0.0 r1.0 r0.1 r1.1
  const std::uint32_t t1 = __byte_perm(r0, r1, 0x7362);  // r0.2 r1.2 r0.3 r1.3
  const std::uint32_t t2 = __byte_perm(r2, r3, 0x5140);  // r2.0 r3.0 r2.1 r3.1
  const std::uint32_t t3 = __byte_perm(r2, r3, 0x7362);  // r2.2 r3.2 r2.3 r3.3
  col[0] = __byte_perm(t0, t2, 0x5410);                  // r0.0 r1.0 r2.0 r3.0
  col[1] = __byte_perm(t0, t2, 0x7632);                  // r0.1 r1.1 r2.1 r3.1
  col[2] = __byte_perm(t1, t3, 0x5410);                  // r0.2 r1.2 r2.2 r3.2
  col[3] = __byte_perm(t1, t3, 0x7632);                  // r0.3 r1.3 r2.3 r3.3
}

// ---------------------------------------------------------------- 4. kernels

// amax: grid-stride over 16-byte vectors, kAmaxUnroll loads in flight per thread (all issued
// before any is used), a block max, then either one atomic per block into *amax_out (zeroed
// by the caller) or, with `partials`, the block's max stored at partials[blockIdx.x] (nothing
// to zero first; the cast that follows reduces them). The amax pass goes forwards, the
// current-scaling cast backwards (see the file header).
constexpr int kAmaxThreads = 1024;
constexpr int kAmaxUnroll = 4;

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const typename In::Storage* __restrict__ src, std::int64_t numel, bool aligned,
                float* amax_out, float* partials) {
  allow_dependent_launch();  // the cast's blocks may take the SMs this grid leaves
  constexpr int N = In::kPerVector;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float running = 0.0f;
  if (aligned) {
    const std::int64_t vectors = numel / N;
    for (std::int64_t base = tid; base < vectors; base += stride * kAmaxUnroll) {
      uint4 raw[kAmaxUnroll];
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        const std::int64_t v = base + u * stride;
        raw[u] = v < vectors ? load16(src + v * N) : make_uint4(0, 0, 0, 0);  // reads 0
      }
#pragma unroll
      for (int u = 0; u < kAmaxUnroll; ++u) {
        float x[N];
        In::decode(raw[u], x);
#pragma unroll
        for (int k = 0; k < N; ++k) running = amax_of(running, x[k]);
      }
    }
    // The last numel % N elements, one per thread.
    const std::int64_t tail = vectors * N + tid;
    if (tail < numel) running = amax_of(running, In::to_f32(src[tail]));
  } else {
    for (std::int64_t i = tid; i < numel; i += stride)
      running = amax_of(running, In::to_f32(src[i]));
  }
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x != 0) return;
  if (partials != nullptr) partials[blockIdx.x] = block;
  else if (block > 0.0f) atomic_max_nonnegative(amax_out, block);
}

// Rowwise cast of a contiguous tensor, as a flat array of 8-element units (one 16-byte load,
// two for f32; one 8-byte store of codes): a warp's load covers 512 (f32: 1024) contiguous
// bytes and its store 256, whole lines. One chunk of kRowwiseThreads x kRowwiseUnits units
// per block (32 KiB of input, like a tile of the transpose kernel), not a persistent grid: the
// hardware hands chunks to SMs as blocks retire, so the faster SMs take more of them (a
// persistent grid-stride version ran 8-10% slower on an H100).
constexpr int kRowwiseThreads = 256;
constexpr int kUnit = 8;           // elements per unit
// Units per thread, all loads issued before the first use: 128 bytes of input in flight
// (8 units of bf16/f16, 4 of f32).
template <class In>
constexpr int kRowwiseUnits = In::kPerVector == 4 ? 4 : 8;

// 8 elements of one unit, loaded as kLoads 16-byte vectors, to FP32.
template <class In>
__device__ __forceinline__ void decode_unit(const uint4 (&raw)[kUnit / In::kPerVector],
                                            float (&x)[kUnit]) {
#pragma unroll
  for (int l = 0; l < kUnit / In::kPerVector; ++l) {
    float part[In::kPerVector];
    In::decode(raw[l], part);
#pragma unroll
    for (int k = 0; k < In::kPerVector; ++k) x[l * In::kPerVector + k] = part[k];
  }
}

// Block b casts chunk b (reverse: the b-th from the end): all kUnits loads of a thread
// (unit u of the chunk at u * kRowwiseThreads + thread) go out before the wait for the kernel
// this launch overlaps (the input is never written by it), then are decoded and stored. The
// ragged end (and unaligned data) goes element by element.
template <class In, class Out, int kUnits>
__global__ void __launch_bounds__(kRowwiseThreads)
    cast_rowwise_kernel(const typename In::Storage* __restrict__ src, std::int64_t numel,
                      bool aligned, bool reverse, std::uint8_t* __restrict__ dst,
                      const CastScalars s) {
  constexpr int kLoads = kUnit / In::kPerVector;
  constexpr std::int64_t kChunk = std::int64_t{kRowwiseThreads} * kUnits * kUnit;  // elements
  const std::int64_t chunk = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const std::int64_t begin = chunk * kChunk;
  const std::int64_t end = begin + kChunk < numel ? begin + kChunk : numel;
  const std::int64_t units = aligned ? numel / kUnit : 0;  // units of the whole tensor
  const int t = static_cast<int>(threadIdx.x);

  uint4 raw[kUnits][kLoads];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const std::int64_t i = begin / kUnit + u * kRowwiseThreads + t;
    if (i < units) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) raw[u][l] = load16(src + i * kUnit + l * In::kPerVector);
    }
  }
  if (s.scale_waits) grid_dependency_wait();
  float tensor_amax;
  const float scale = cast_scale(s, tensor_amax);
  write_block_zero_scalars(s, scale, tensor_amax);

  float running = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const std::int64_t i = begin / kUnit + u * kRowwiseThreads + t;
    if (i < units) {
      float x[kUnit];
      decode_unit<In>(raw[u], x);
#pragma unroll
      for (int k = 0; k < kUnit; ++k) running = amax_of(running, x[k]);
      std::uint32_t words[kUnit / 4];
      encode_words<Out, kUnit>(x, scale, words);
      store8(dst + i * kUnit, words[0], words[1]);
    }
  }
  // Elements of this chunk that no unit covered: the last numel % kUnit, or all (unaligned).
  const std::int64_t first_single = units * kUnit > begin ? units * kUnit : begin;
  for (std::int64_t e = first_single + t; e < end; e += kRowwiseThreads) {
    const float x = In::to_f32(src[e]);
    running = amax_of(running, x);
    dst[e] = Out::encode1(x * scale);
  }
  accumulate_block_amax<kRowwiseThreads>(s, running);
}

// Fused cast + transpose over kRows x kCols tiles of the [rows, cols] input, one tile per
// block (columnwise requested; rowwise optional). One tile per block rather than a persistent
// grid for the same reason as the rowwise chunks (the persistent version ran ~10% slower).
// `reverse`: block b takes the b-th tile from the end.
//
// Phase 1: thread (tx, ty) owns micro-tiles of kMicroRows rows x kVector columns: per row one
// 16-byte load (all kPasses x kMicroRows loads issued first, before the wait for the kernel
// this launch overlaps), the codes of a row go out as one kVector-byte rowwise store, and each
// 4x4 block of codes is transposed in registers into 4 words (4 consecutive rows of one
// column) stored in the shared tile, which holds the tile transposed: tile[c] is the kRows
// codes of column c, as kRows / 4 words.
// Phase 2: each thread copies 16-byte runs of tile[c] (16 consecutive rows of column c) to
// the columnwise output [cols, rows]: 8 threads write one 128-byte run per tile column.
//
// Bank conflicts: a phase-1 store instruction of a warp writes word q = pass * 16 + ty of 32
// different columns (tx = 0..15, two values of ty). Unpadded rows of 32 words would put all
// of them in one bank; the word is therefore stored at q ^ swizzle(c) with swizzle(c) =
// 2 * (c / kVector) = 2 * tx: (q ^ 2tx) takes 32 distinct values over the warp (2tx is even
// and distinct per tx, the two ty differ in bit 0), so stores are conflict-free. Phase 2 reads
// a whole 16-byte group: logical group g sits at physical group g ^ (swizzle >> 2), with its
// words in the order (2, 3, 0, 1) when bit 1 of the swizzle is set; 8 consecutive threads
// read the 8 groups of one column, conflict-free.
template <class In>
struct TileShape {
  static constexpr int kVector = In::kPerVector;                // elements per 16-byte load
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocksPerSm = 4;                     // registers <= 64
  static constexpr int kThreadsX = 16;                          // across a tile row
  static constexpr int kThreadsY = kThreads / kThreadsX;        // 16
  static constexpr int kCols = kThreadsX * kVector;             // 64 (f32) or 128: 256 bytes
  static constexpr int kMicroRows = 4;                          // one 4x4 byte transpose
  static constexpr int kRowsPerPass = kThreadsY * kMicroRows;   // 64
  static constexpr int kPasses = 2;
  static constexpr int kRows = kRowsPerPass * kPasses;          // 128: 128-byte output runs
  static constexpr int kWordsPerCol = kRows / 4;                // 32 words per tile column
  static constexpr int kGroupsPerCol = kRows / 16;              // 8 16-byte runs per column
  static constexpr int kColsPerStorePass = kThreads / kGroupsPerCol;  // 32
  static constexpr int kStorePasses = kCols / kColsPerStorePass;      // 2 (f32) or 4
  // Shared tile: kCols x kRows codes = 8 KiB (f32) or 16 KiB.
  static_assert(kThreads % kThreadsX == 0 && kVector % 4 == 0, "whole 4x4 transposes");
  static_assert(kWordsPerCol == 32, "one tile column is one 128-byte row of 32 banks");
  static_assert(2 * (kThreadsX - 1) < kWordsPerCol, "the swizzle stays inside a column row");
  static_assert(kThreadsY * kPasses == kRows / kMicroRows, "phase-1 passes cover the rows");
  static_assert(kThreads % kGroupsPerCol == 0 && kCols % kColsPerStorePass == 0,
                "phase-2 passes cover the columns");
  static __device__ __forceinline__ int swizzle(int col) { return 2 * (col / kVector); }
  // Byte of row r, column c in the swizzled transposed tile.
  static __device__ __forceinline__ int byte_index(int r, int c) {
    return (c * kWordsPerCol + ((r / 4) ^ swizzle(c))) * 4 + r % 4;
  }
};

struct TileFlags {
  bool vector_rows;     // src 16-byte aligned, cols % kVector == 0, rowwise kVector-aligned
  bool vector_columns;  // columnwise 16-byte aligned and rows % 16 == 0
};

// Edge tiles (or unaligned data), element by element with the same bytes, out of line so the
// vector path keeps its registers. Phase 1: quantizes the in-range elements (rowwise store
// when requested) into the shared tile, out-of-range codes 0 (never stored); returns the
// running amax. Phase 2: stores the in-range codes columnwise.
template <class In, class Out, class T>
__device__ __noinline__ float edge_tile_codes(const typename In::Storage* src, std::int64_t rows,
                                              std::int64_t cols, std::int64_t row0,
                                              std::int64_t col0, float scale,
                                              std::uint8_t* rowwise, std::uint8_t* tile_bytes,
                                              float running) {
  for (int e = static_cast<int>(threadIdx.x); e < T::kRows * T::kCols; e += T::kThreads) {
    const int r = e / T::kCols, c = e % T::kCols;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    std::uint8_t code = 0;
    if (gr < rows && gc < cols) {
      const float x = In::to_f32(src[gr * cols + gc]);
      running = amax_of(running, x);
      code = Out::encode1(x * scale);
      if (rowwise != nullptr) rowwise[gr * cols + gc] = code;
    }
    tile_bytes[T::byte_index(r, c)] = code;
  }
  return running;
}

template <class T>
__device__ __noinline__ void edge_tile_columns(const std::uint8_t* tile_bytes, std::int64_t rows,
                                               std::int64_t cols, std::int64_t row0,
                                               std::int64_t col0, std::uint8_t* columnwise) {
  for (int e = static_cast<int>(threadIdx.x); e < T::kRows * T::kCols; e += T::kThreads) {
    const int c = e / T::kRows, r = e % T::kRows;
    const std::int64_t gr = row0 + r, gc = col0 + c;
    if (gr < rows && gc < cols) columnwise[gc * rows + gr] = tile_bytes[T::byte_index(r, c)];
  }
}

template <class In, class Out>
__global__ void __launch_bounds__(TileShape<In>::kThreads, TileShape<In>::kMinBlocksPerSm)
    cast_transpose_kernel(const typename In::Storage* __restrict__ src, std::int64_t rows,
                          std::int64_t cols, unsigned tiles_per_row, bool reverse,
                          std::uint8_t* __restrict__ rowwise,
                          std::uint8_t* __restrict__ columnwise, const TileFlags flags,
                          const CastScalars s) {
  using T = TileShape<In>;
  constexpr int V = T::kVector;
  __shared__ alignas(16) std::uint32_t tile[T::kCols][T::kWordsPerCol];
  std::uint8_t* const tile_bytes = reinterpret_cast<std::uint8_t*>(&tile[0][0]);

  const unsigned t = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // this block's tile
  const std::int64_t row0 = static_cast<std::int64_t>(t / tiles_per_row) * T::kRows;
  const std::int64_t col0 = static_cast<std::int64_t>(t % tiles_per_row) * T::kCols;
  const bool full_tile = row0 + T::kRows <= rows && col0 + T::kCols <= cols;
  const bool vector_tile = full_tile && flags.vector_rows;
  const int tx = static_cast<int>(threadIdx.x) % T::kThreadsX;
  const int ty = static_cast<int>(threadIdx.x) / T::kThreadsX;
  const int c = tx * V;  // first tile column of this thread (vector path)
  // Element (row0 + ty * kMicroRows, col0 + c): this thread's first vector.
  const std::int64_t first = (row0 + ty * T::kMicroRows) * cols + col0 + c;

  uint4 raw[T::kPasses][T::kMicroRows];
  if (vector_tile) {
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass)
#pragma unroll
      for (int i = 0; i < T::kMicroRows; ++i)
        raw[pass][i] = load16(src + first + (pass * T::kRowsPerPass + i) * cols);
  }
  if (s.scale_waits) grid_dependency_wait();
  float tensor_amax;
  const float scale = cast_scale(s, tensor_amax);
  write_block_zero_scalars(s, scale, tensor_amax);
  float running = 0.0f;

  // Phase 1: quantize, rowwise store, park the codes transposed in the tile.
  if (vector_tile) {
#pragma unroll
    for (int pass = 0; pass < T::kPasses; ++pass) {
      std::uint32_t codes[T::kMicroRows][V / 4];
#pragma unroll
      for (int i = 0; i < T::kMicroRows; ++i) {
        float x[V];
        In::decode(raw[pass][i], x);
#pragma unroll
        for (int e = 0; e < V; ++e) running = amax_of(running, x[e]);
        encode_words<Out, V>(x, scale, codes[i]);
        if (rowwise != nullptr) {
          std::uint8_t* out = rowwise + first + (pass * T::kRowsPerPass + i) * cols;
          if constexpr (V == 8) store8(out, codes[i][0], codes[i][1]);
          else store4(out, codes[i][0]);
        }
      }
      const int q = pass * (T::kRowsPerPass / 4) + ty;  // word of these 4 rows in a column
#pragma unroll
      for (int w = 0; w < V / 4; ++w) {
        std::uint32_t col_words[4];
        transpose_4x4_bytes(codes[0][w], codes[1][w], codes[2][w], codes[3][w], col_words);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int col = c + 4 * w + j;
          tile[col][q ^ T::swizzle(col)] = col_words[j];
        }
      }
    }
  } else {
    running = edge_tile_codes<In, Out, T>(src, rows, cols, row0, col0, scale, rowwise,
                                          tile_bytes, running);
  }
  __syncthreads();

  // Phase 2: columnwise[col0 + c][row0 + r] = code of (r, c).
  if (full_tile && flags.vector_columns) {
    const int g = static_cast<int>(threadIdx.x) % T::kGroupsPerCol;
#pragma unroll
    for (int pass = 0; pass < T::kStorePasses; ++pass) {
      const int col =
          pass * T::kColsPerStorePass + static_cast<int>(threadIdx.x) / T::kGroupsPerCol;
      const int sw = T::swizzle(col);
      uint4 v = reinterpret_cast<const uint4*>(&tile[col][0])[g ^ (sw >> 2)];
      if (sw & 2) {
        const uint4 physical = v;
        v = make_uint4(physical.z, physical.w, physical.x, physical.y);
      }
      store16(columnwise + (col0 + col) * rows + row0 + 16 * g, v);
    }
  } else {
    edge_tile_columns<T>(tile_bytes, rows, cols, row0, col0, columnwise);
  }
  accumulate_block_amax<T::kThreads>(s, running);
}

// Dequantize: one element per thread (grid-stride); the columnwise copy is read transposed.
// Not on the training path (the GEMM consumes the codes); kept simple.
constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeMaxBlocks = 8192;

template <class Out>
__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_kernel(const std::uint8_t* data, bool transposed, std::int64_t rows,
                      std::int64_t cols, const float* scale_inv_ptr, void* dst,
                      qr_dtype dst_dtype) {
  const float scale_inv = *scale_inv_ptr;
  const std::int64_t numel = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < numel; i += stride) {
    const std::int64_t r = i / cols, c = i % cols;
    const std::uint8_t code = transposed ? data[c * rows + r] : data[i];
    const float q = Out::decode(code);
    const float v = num::is_nan(q) ? q : q * scale_inv;  // the reference's decode_scaled
    if (dst_dtype == QR_DTYPE_F32) static_cast<float*>(dst)[i] = v;
    else if (dst_dtype == QR_DTYPE_BF16) static_cast<std::uint16_t*>(dst)[i] = num::f32_to_bf16(v);
    else static_cast<std::uint16_t*>(dst)[i] = num::f32_to_f16(v);
  }
}

// The scalar writes of write_scalars(), in one thread. A cast launched to overlap it starts
// at once and waits for these writes only where it needs them.
__global__ void write_scalars_kernel(float* dst0, float* dst1, float value, float* max_into,
                                     float max_value) {
  allow_dependent_launch();
  if (dst0) *dst0 = value;
  if (dst1) *dst1 = value;
  if (max_into && max_value > 0.0f) atomic_max_nonnegative(max_into, max_value);
}

// ---------------------------------------------------------------- 5. launchers, entries

void check_source_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK_CODE(dtype == QR_DTYPE_F32 || dtype == QR_DTYPE_BF16 || dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "float8 CUDA ", entry,
                ": source dtype code ", static_cast<int>(dtype),
                " is not f32, bf16 or f16; convert the tensor first");
}

void check_data_dtype(qr_dtype dtype, const char* entry) {
  QR_CHECK(dtype == QR_DTYPE_E4M3 || dtype == QR_DTYPE_E5M2, "float8 CUDA ", entry,
           ": data dtype code ", static_cast<int>(dtype), " is not e4m3 or e5m2");
}

// The amax kernel's grid: one wave of resident blocks (fewer for small tensors). With
// partials, the grid size is also the number of per-block maxima the cast reduces.
template <class In>
unsigned amax_blocks(std::int64_t numel) {
  const std::int64_t vectors = (numel + In::kPerVector - 1) / In::kPerVector;
  const unsigned blocks = grid_stride_blocks(reinterpret_cast<const void*>(amax_kernel<In>),
                                             kAmaxThreads, vectors, kAmaxUnroll);
  return blocks < kMaxAmaxPartials ? blocks : kMaxAmaxPartials;
}

template <class In>
void launch_amax(const void* src, std::int64_t numel, float* amax_out, float* partials,
                 unsigned blocks, cudaStream_t stream) {
  using Storage = typename In::Storage;
  launch(amax_kernel<In>, blocks, kAmaxThreads, stream, /*overlap_previous=*/false,
         "amax_kernel", static_cast<const Storage*>(src), numel, is_aligned(src, 16), amax_out,
         partials);
}

CastScalars cast_scalars(const CastTransposeArgs& a) {
  CastScalars s{};
  s.rowwise_scale_inv = a.rowwise_scale_inv;
  s.columnwise_scale_inv = a.columnwise_scale_inv;
  for (int i = 0; i < 3; ++i) s.amax_accumulate[i] = a.amax_accumulate[i];
  s.amax_mirror = a.amax_mirror;
  s.scale = a.scale;
  return s;
}

// How a cast launch runs: its scalars, whether it overlaps our previous launch, and whether
// it walks the tensor backwards.
struct CastLaunch {
  CastScalars scalars;
  bool overlap_previous = false;
  bool reverse = false;
};

template <class In, class Out>
void launch_rowwise(const CastTransposeArgs& a, const CastLaunch& l) {
  using Storage = typename In::Storage;
  const std::int64_t numel = a.rows * a.cols;
  // One chunk per block; an empty tensor still gets one block, which only writes scalars.
  constexpr int kUnits = kRowwiseUnits<In>;
  constexpr std::int64_t kChunk = std::int64_t{kRowwiseThreads} * kUnits * kUnit;
  std::int64_t blocks = (numel + kChunk - 1) / kChunk;
  if (blocks < 1) blocks = 1;
  QR_CHECK(blocks <= INT_MAX, "float8 cast: ", numel, " elements need ", blocks,
           " blocks of ", kChunk, "; at most ", INT_MAX, " fit in one grid");
  // Unit k reads src + 8k elements (16k or 32k bytes) and writes rowwise + 8k bytes.
  const bool aligned = is_aligned(a.src, 16) && is_aligned(a.rowwise, 8);
  launch(cast_rowwise_kernel<In, Out, kUnits>, static_cast<unsigned>(blocks),
         kRowwiseThreads, as_stream(a.stream), l.overlap_previous, "cast_rowwise_kernel",
         static_cast<const Storage*>(a.src), numel, aligned, l.reverse, a.rowwise, l.scalars);
}

template <class In, class Out>
void launch_cast_transpose(const CastTransposeArgs& a, const CastLaunch& l) {
  using Storage = typename In::Storage;
  using T = TileShape<In>;
  const std::int64_t tiles_per_row = a.cols == 0 ? 1 : (a.cols + T::kCols - 1) / T::kCols;
  const std::int64_t tile_rows = (a.rows + T::kRows - 1) / T::kRows;
  // One block per tile; an empty tensor still gets one block, which only writes scalars.
  const std::int64_t tiles = tile_rows * tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "float8 cast_transpose: ", a.rows, " x ", a.cols, " needs ", tiles,
           " tiles of ", T::kRows, "x", T::kCols, "; at most ", INT_MAX, " fit in one grid");
  TileFlags flags;
  flags.vector_rows = is_aligned(a.src, 16) && a.cols % T::kVector == 0 &&
                      (a.rowwise == nullptr || is_aligned(a.rowwise, T::kVector));
  flags.vector_columns = is_aligned(a.columnwise, 16) && a.rows % 16 == 0;
  const auto blocks = static_cast<unsigned>(tiles < 1 ? 1 : tiles);
  launch(cast_transpose_kernel<In, Out>, blocks, T::kThreads, as_stream(a.stream),
         l.overlap_previous, "cast_transpose_kernel", static_cast<const Storage*>(a.src),
         a.rows, a.cols, static_cast<unsigned>(tiles_per_row), l.reverse, a.rowwise,
         a.columnwise, flags, l.scalars);
}

template <class In, class Out>
void dispatch_directions(const CastTransposeArgs& a, const CastLaunch& l) {
  // Rowwise only: a flat elementwise pass (no shared memory, no tiles). Otherwise the tiled
  // pass, which also writes the rowwise bytes when they are requested.
  if (a.columnwise == nullptr) launch_rowwise<In, Out>(a, l);
  else launch_cast_transpose<In, Out>(a, l);
}

// The whole cast of one source dtype: the amax pass or the zeroing launch it needs first,
// then the cast.
template <class In>
void run_cast(const CastTransposeArgs& a) {
  const cudaStream_t stream = as_stream(a.stream);
  CastLaunch l;
  l.scalars = cast_scalars(a);
  std::unique_ptr<StreamScratch> partials;
  if (a.scale.tensor_amax) {
    // Current scaling: amax pass into per-block maxima, then the cast overlapping it, walking
    // backwards into what the pass left in L2.
    const std::int64_t numel = a.rows * a.cols;
    const unsigned blocks = amax_blocks<In>(numel);
    partials = std::make_unique<StreamScratch>(blocks, stream);
    launch_amax<In>(a.src, numel, nullptr, partials->get(), blocks, stream);
    l.scalars.amax_partials = partials->get();
    l.scalars.partial_count = static_cast<int>(blocks);
    l.scalars.scale_waits = true;
    l.scalars.amax_set[0] = a.amax_out[0];
    l.scalars.amax_set[1] = a.amax_out[1];
    l.overlap_previous = true;
    l.reverse = true;
  } else if (a.amax_out[0] != nullptr || a.amax_out[1] != nullptr) {
    // The cast observes the amax: its buffers are zeroed first, by a launch the cast overlaps
    // (it waits for it only before its atomics).
    launch(write_scalars_kernel, 1, 1, stream, /*overlap_previous=*/false,
           "write_scalars_kernel", a.amax_out[0], a.amax_out[1], 0.0f,
           static_cast<float*>(nullptr), 0.0f);
    l.scalars.amax_accumulate[3] = a.amax_out[0];
    l.scalars.amax_accumulate[4] = a.amax_out[1];
    l.overlap_previous = true;
  }
  if (a.data_dtype == QR_DTYPE_E4M3) dispatch_directions<In, E4M3Out>(a, l);
  else dispatch_directions<In, E5M2Out>(a, l);
}

}  // namespace

void compute_amax(const void* src, qr_dtype src_dtype, std::int64_t numel, float* amax_out,
                  int device_index, void* stream) {
  check_source_dtype(src_dtype, "compute_amax");
  QR_CHECK(amax_out != nullptr, "float8 CUDA compute_amax: amax_out is null");
  QR_CHECK(numel == 0 || src != nullptr, "float8 CUDA compute_amax: source of ", numel,
           " elements has a null data pointer");
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  QR_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float), s));
  if (numel == 0) return;
  switch (src_dtype) {
    case QR_DTYPE_F32:
      launch_amax<F32In>(src, numel, amax_out, nullptr, amax_blocks<F32In>(numel), s);
      break;
    case QR_DTYPE_BF16:
      launch_amax<BF16In>(src, numel, amax_out, nullptr, amax_blocks<BF16In>(numel), s);
      break;
    default:
      launch_amax<F16In>(src, numel, amax_out, nullptr, amax_blocks<F16In>(numel), s);
      break;
  }
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  // A stream-ordered temporary, freed on every path (exceptions included).
  struct Scratch {
    float* ptr = nullptr;
    cudaStream_t stream;
    ~Scratch() {
      if (ptr) cudaFreeAsync(ptr, stream);
    }
  } scratch{nullptr, s};
  QR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch.ptr), sizeof(float), s));
  compute_amax(src, src_dtype, numel, scratch.ptr, device_index, stream);
  return read_scalar(scratch.ptr, device_index, stream);
}

void cast_transpose(const CastTransposeArgs& a) {
  check_source_dtype(a.src_dtype, "cast_transpose");
  check_data_dtype(a.data_dtype, "cast_transpose");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "float8 CUDA cast_transpose: negative shape ", a.rows,
           " x ", a.cols);
  QR_CHECK(a.rows * a.cols == 0 || a.src != nullptr,
           "float8 CUDA cast_transpose: the source has a null data pointer");
  QR_CHECK(a.rowwise != nullptr || a.columnwise != nullptr,
           "float8 CUDA cast_transpose: neither rowwise nor columnwise output was given");
  QR_CHECK(a.amax_mirror == nullptr || a.scale.device_amax != nullptr,
           "float8 CUDA cast_transpose: amax_mirror needs scale.device_amax to copy from");
  QR_CHECK(!a.scale.tensor_amax || (a.scale.device_amax == nullptr && a.amax_mirror == nullptr),
           "float8 CUDA cast_transpose: scale.tensor_amax computes the amax itself; leave "
           "scale.device_amax and amax_mirror unset");
  for (const float* acc : a.amax_accumulate)
    QR_CHECK(acc == nullptr || acc != a.scale.device_amax,
             "float8 CUDA cast_transpose: the amax that sets the scale cannot also accumulate "
             "this cast's amax");
  DeviceGuard guard(a.device_index, kFormat);
  switch (a.src_dtype) {
    case QR_DTYPE_F32: run_cast<F32In>(a); break;
    case QR_DTYPE_BF16: run_cast<BF16In>(a); break;
    default: run_cast<F16In>(a); break;
  }
}

void dequantize(const std::uint8_t* data, qr_dtype data_dtype, bool transposed,
                std::int64_t rows, std::int64_t cols, const float* scale_inv, void* dst,
                qr_dtype dst_dtype, int device_index, void* stream) {
  check_data_dtype(data_dtype, "dequantize");
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "float8 CUDA dequantize: output dtype code ",
                static_cast<int>(dst_dtype), " is not f32, bf16 or f16");
  QR_CHECK(scale_inv != nullptr, "float8 CUDA dequantize: scale_inv is null");
  const std::int64_t numel = rows * cols;
  if (numel == 0) return;
  DeviceGuard guard(device_index, kFormat);
  std::int64_t blocks = (numel + kDequantizeThreads - 1) / kDequantizeThreads;
  if (blocks > kDequantizeMaxBlocks) blocks = kDequantizeMaxBlocks;
  const cudaStream_t s = as_stream(stream);
  if (data_dtype == QR_DTYPE_E4M3)
    dequantize_kernel<E4M3Out><<<static_cast<unsigned>(blocks), kDequantizeThreads, 0, s>>>(
        data, transposed, rows, cols, scale_inv, dst, dst_dtype);
  else
    dequantize_kernel<E5M2Out><<<static_cast<unsigned>(blocks), kDequantizeThreads, 0, s>>>(
        data, transposed, rows, cols, scale_inv, dst, dst_dtype);
  QR_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

void write_scalars(float* dst0, float* dst1, float value, float* max_into, float max_value,
                   int device_index, void* stream) {
  DeviceGuard guard(device_index, kFormat);
  write_scalars_kernel<<<1, 1, 0, as_stream(stream)>>>(dst0, dst1, value, max_into, max_value);
  QR_CUDA_CHECK_LAUNCH("write_scalars_kernel");
}

float read_scalar(const float* src, int device_index, void* stream) {
  DeviceGuard guard(device_index, kFormat);
  float value = 0.0f;
  QR_CUDA_CHECK(
      cudaMemcpyAsync(&value, src, sizeof(float), cudaMemcpyDeviceToHost, as_stream(stream)));
  QR_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
  return value;
}

}  // namespace qrecipe::float8::cuda
