// CUDA kernels of the float8 format, bit-exact with float8_ref.cpp.
//
// Map of this file (docs/architecture.md, "Conventions", rule 11: helpers, kernels,
// launchers, entries):
//   1. error checking, device guard, launch sizes (resident blocks per device and kernel),
//      launches that overlap the previous kernel (PDL), the memory pool of the amax pass's
//      scratch (sdk::cuda::StreamScratch)
//   2. device helpers of the one-tensor kernels: grid dependency control, the cast's scale
//      and scalars, the block amax (the element traits, loads / stores and the cast tiles
//      are float8_device.cuh's, shared with the grouped kernels)
//   3. kernels: amax, rowwise cast (flat chunks), cast + transpose (tiles), dequantize, scalars
//   4. launchers (grid arithmetic, dtype dispatch) and the entries of float8_kernels.hpp
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
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "float8_device.cuh"
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
using sdk::cuda::check_cuda;

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

// ---------------------------------------------------------------- 2. device helpers

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

// The scale of a rowwise direction with its own codes (CastTransposeArgs::rowwise_own): from
// a device amax by the rule, or a device scale. Read after any grid dependency wait.
__device__ __forceinline__ float own_rowwise_scale(const ScaleSource& r) {
  if (r.device_amax != nullptr)
    return scale_from_amax(__ldcg(r.device_amax), r.fmax, r.pow2_scales, r.amax_epsilon);
  return __ldcg(r.device_scale);
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

// ---------------------------------------------------------------- 3. kernels

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

// Rowwise cast (rowwise requested alone): block b casts chunk b of the flat tensor
// (float8_device.cuh rowwise chunks; reverse: the b-th from the end). All loads of a thread go
// out before the wait for the kernel this launch overlaps (the input is never written by it),
// then are decoded and stored.
template <class In, class Out, int kUnits>
__global__ void __launch_bounds__(kRowwiseThreads)
    cast_rowwise_kernel(const typename In::Storage* __restrict__ src, std::int64_t numel,
                      bool aligned, bool reverse, std::uint8_t* __restrict__ dst,
                      const CastScalars s) {
  const std::int64_t chunk = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const RowwiseChunk k = rowwise_chunk<In, kUnits>(chunk, numel, aligned);
  uint4 raw[kUnits][kUnit / In::kPerVector];
  load_rowwise_chunk<In, kUnits>(src, k, raw);
  if (s.scale_waits) grid_dependency_wait();
  float tensor_amax;
  const float scale = cast_scale(s, tensor_amax);
  write_block_zero_scalars(s, scale, tensor_amax);
  const float running = cast_rowwise_chunk<In, Out, kUnits>(src, k, scale, raw, dst);
  accumulate_block_amax<kRowwiseThreads>(s, running);
}

// Fused cast + transpose (columnwise requested; rowwise optional): block b casts tile b
// (float8_device.cuh cast + transpose tiles; reverse: the b-th from the end). The vector
// loads go out before the wait for the kernel this launch overlaps. RowOut other than
// SameCodes: the rowwise bytes are RowOut codes with the scale of `row` (rowwise_own); those
// encode every run twice and take 3 blocks an SM, 80 registers (ptxas, sm_90a: 40-56 bytes
// of spills in the vector path, L1-resident; at 4 blocks 48-56 bytes; at 2 blocks none, 128
// registers, but half the blocks to overlap one tile's load, barrier and store phases).
template <class In, class Out, class RowOut = SameCodes>
__global__ void __launch_bounds__(TileShape<In>::kThreads,
                                  std::is_same_v<RowOut, SameCodes> ? TileShape<In>::kMinBlocksPerSm
                                                                    : 3)
    cast_transpose_kernel(const typename In::Storage* __restrict__ src, std::int64_t rows,
                          std::int64_t cols, unsigned tiles_per_row, bool reverse,
                          std::uint8_t* __restrict__ rowwise,
                          std::uint8_t* __restrict__ columnwise, const TileFlags flags,
                          const CastScalars s, const ScaleSource row) {
  using T = TileShape<In>;
  __shared__ alignas(16) std::uint32_t tile[T::kCols][T::kWordsPerCol];
  const unsigned t = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // this block's tile
  const CastTile at = cast_tile<In>(t, tiles_per_row, rows, cols, flags);
  uint4 raw[T::kPasses][T::kMicroRows];
  load_cast_tile<In>(src, cols, at, raw);
  if (s.scale_waits) grid_dependency_wait();
  float tensor_amax;
  const float scale = cast_scale(s, tensor_amax);
  write_block_zero_scalars(s, scale, tensor_amax);
  float row_scale = 0.0f;
  if constexpr (!std::is_same_v<RowOut, SameCodes>) {
    grid_dependency_wait();  // whatever wrote the rowwise amax / scale has finished
    row_scale = own_rowwise_scale(row);
  }
  const float running = cast_transpose_tile<In, Out, RowOut>(src, rows, cols, at, scale, raw,
                                                             rowwise, columnwise, rows, flags,
                                                             tile, row_scale);
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

// write_scalars() with the value read from device memory (a caller's device amax): the same
// stores, the same max into history row 0 (skipped unless the value is > 0, so NaN and 0 leave
// it, as for a host value).
__global__ void write_scalars_from_kernel(const float* src, float* dst0, float* dst1,
                                          float* max_into) {
  const float value = *src;
  if (dst0) *dst0 = value;
  if (dst1) *dst1 = value;
  if (max_into && value > 0.0f) atomic_max_nonnegative(max_into, value);
}

// ---------------------------------------------------------------- 4. launchers, entries

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

template <class In, class Out, class RowOut = SameCodes>
void launch_cast_transpose(const CastTransposeArgs& a, const CastLaunch& l) {
  using Storage = typename In::Storage;
  using T = TileShape<In>;
  const std::int64_t tiles_per_row = a.cols == 0 ? 1 : (a.cols + T::kCols - 1) / T::kCols;
  // No columns: no tiles however many rows (issue 19: [2^40, 0] must not launch 2^35 blocks).
  const std::int64_t tile_rows = a.cols == 0 ? 0 : (a.rows + T::kRows - 1) / T::kRows;
  // One block per tile; an empty tensor still gets one block, which only writes scalars.
  const std::int64_t tiles = tile_rows * tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "float8 cast_transpose: ", a.rows, " x ", a.cols, " needs ", tiles,
           " tiles of ", T::kRows, "x", T::kCols, "; at most ", INT_MAX, " fit in one grid");
  TileFlags flags;
  flags.vector_rows = is_aligned(a.src, 16) && a.cols % T::kVector == 0 &&
                      (a.rowwise == nullptr || is_aligned(a.rowwise, T::kVector));
  flags.vector_columns = is_aligned(a.columnwise, 16) && a.rows % 16 == 0;
  const auto blocks = static_cast<unsigned>(tiles < 1 ? 1 : tiles);
  launch(cast_transpose_kernel<In, Out, RowOut>, blocks, T::kThreads, as_stream(a.stream),
         l.overlap_previous, "cast_transpose_kernel", static_cast<const Storage*>(a.src),
         a.rows, a.cols, static_cast<unsigned>(tiles_per_row), l.reverse, a.rowwise,
         a.columnwise, flags, l.scalars, a.rowwise_scale);
}

template <class In, class Out>
void dispatch_directions(const CastTransposeArgs& a, const CastLaunch& l) {
  // Rowwise only: a flat elementwise pass (no shared memory, no tiles). Otherwise the tiled
  // pass, which also writes the rowwise bytes when they are requested.
  if constexpr (sizeof(typename In::Storage) == 2) {  // another format's rowwise cast
    if (a.rowwise_own) {
      if (a.rowwise_dtype == QR_DTYPE_E4M3) launch_cast_transpose<In, Out, E4M3Out>(a, l);
      else launch_cast_transpose<In, Out, E5M2Out>(a, l);
      return;
    }
  }
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
  std::optional<sdk::cuda::StreamScratch<float>> partials;
  if (a.scale.tensor_amax) {
    // Current scaling: amax pass into per-block maxima, then the cast overlapping it, walking
    // backwards into what the pass left in L2.
    const std::int64_t numel = a.rows * a.cols;
    const unsigned blocks = amax_blocks<In>(numel);
    partials.emplace(blocks, stream, kFormat, scratch_pool(current_device()));
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
                  int device_index, void* stream, float* amax_out2) {
  sdk::cuda::check_source_dtype(src_dtype, kFormat, "compute_amax");
  QR_CHECK(amax_out != nullptr, "float8 CUDA compute_amax: amax_out is null");
  QR_CHECK(numel == 0 || src != nullptr, "float8 CUDA compute_amax: source of ", numel,
           " elements has a null data pointer");
  DeviceGuard guard(device_index, kFormat);
  const cudaStream_t s = as_stream(stream);
  QR_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float), s));
  if (numel > 0) {
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
  if (amax_out2 != nullptr)
    QR_CUDA_CHECK(cudaMemcpyAsync(amax_out2, amax_out, sizeof(float), cudaMemcpyDeviceToDevice, s));
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  DeviceGuard guard(device_index, kFormat);
  const sdk::cuda::StreamScratch<float> scratch(1, as_stream(stream), kFormat);
  compute_amax(src, src_dtype, numel, scratch.get(), device_index, stream);
  return read_scalar(scratch.get(), device_index, stream);
}

bool cast_with_own_rowwise_supported(qr_dtype src_dtype, qr_dtype rowwise_dtype) {
  return (src_dtype == QR_DTYPE_BF16 || src_dtype == QR_DTYPE_F16) &&
         (rowwise_dtype == QR_DTYPE_E4M3 || rowwise_dtype == QR_DTYPE_E5M2);
}

void cast_transpose(const CastTransposeArgs& a) {
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "cast_transpose");
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
  QR_CHECK(!a.rowwise_own ||
               (cast_with_own_rowwise_supported(a.src_dtype, a.rowwise_dtype) &&
                a.rowwise != nullptr && a.columnwise != nullptr &&
                a.rowwise_scale_inv == nullptr &&
                (a.rowwise_scale.device_amax != nullptr ||
                 a.rowwise_scale.device_scale != nullptr)),
           "float8 CUDA cast_transpose: rowwise_own needs a bf16 / f16 source, an e4m3 / e5m2 "
           "rowwise type, both data buffers, no rowwise scale_inv and a device amax or scale "
           "for the rowwise codes");
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

void copy_scalar(const float* src, float* dst0, float* dst1, float* max_into, int device_index,
                 void* stream) {
  DeviceGuard guard(device_index, kFormat);
  write_scalars_from_kernel<<<1, 1, 0, as_stream(stream)>>>(src, dst0, dst1, max_into);
  QR_CUDA_CHECK_LAUNCH("write_scalars_from_kernel");
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
