// CUDA kernels of the float8 format, bit-exact with float8_ref.cpp.
//
// Map of this file (STYLE.md rule 11: helpers, kernels, launchers, entries):
//   1. error checking, device guard, element traits (input dtypes, FP8 outputs)
//   2. device helpers: 16-byte run loads, packed code stores, block max, atomic max of a
//      non-negative float
//   3. kernels: amax reduction, fused cast + transpose, dequantize, scalar writes
//   4. launchers (grid arithmetic, dtype dispatch) and the entries declared in
//      float8_kernels.hpp (validation, device selection)
//
// Exactness: every FP8 rounding goes through qrecipe::num (conversions.hpp, __host__
// __device__), the scale comes from qrecipe::scale_from_amax (scaling.hpp), and the plugin is
// compiled with -fmad=false --ftz=false --prec-div=true (QrecipeCompileFlags.cmake), so the
// device performs the same IEEE operations as the reference: q = sat_rne(fp32(x) * scale),
// scale_inv = 1 / scale, decode = fp32(q) * scale_inv. The amax is an exact max, so its
// reduction order does not matter.
#include "float8_kernels.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::cuda {
namespace {

// ---------------------------------------------------------------- 1. checking, traits

void check_cuda(cudaError_t status, const char* call, const std::string& where) {
  if (status == cudaSuccess) return;
  throw Error(QR_STATUS_DEVICE_ERROR, where,
              detail::concat("float8: CUDA call `", call, "` failed with ",
                             cudaGetErrorName(status), " (", cudaGetErrorString(status),
                             "). Check that the tensors live on the device the call names and "
                             "that the CUDA driver supports this build's toolkit"));
}
#define QR_CUDA_CHECK(call) check_cuda((call), #call, QR_WHERE())
// After a <<<...>>> launch: reports a bad configuration (and earlier asynchronous errors).
#define QR_CUDA_CHECK_LAUNCH(kernel_name) \
  check_cuda(cudaGetLastError(), "launch of " kernel_name, QR_WHERE())

// Makes `index` the current device for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) : index_(index) {
    QR_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index_) QR_CUDA_CHECK(cudaSetDevice(index_));
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

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Input element types: storage type and exact widening to FP32 (the reference's load_f32).
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

// FP8 data types: the reference's encode/decode.
struct E4M3Out {
  static __device__ __forceinline__ std::uint8_t encode(float x) { return num::f32_to_e4m3(x); }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e4m3_to_f32(c); }
};
struct E5M2Out {
  static __device__ __forceinline__ std::uint8_t encode(float x) { return num::f32_to_e5m2(x); }
  static __device__ __forceinline__ float decode(std::uint8_t c) { return num::e5m2_to_f32(c); }
};

// ---------------------------------------------------------------- 2. device helpers

// A thread reads runs of consecutive elements with one 16-byte load: 4 f32 or 8 bf16/f16.
template <class In>
inline constexpr int kRunLength = 16 / static_cast<int>(sizeof(typename In::Storage));

template <class Storage, int N>
struct alignas(N * sizeof(Storage)) RunOf {
  Storage v[N];
};

// Loads the run src[offset .. offset + N) holding `valid` (0..N) elements; the missing ones
// read as 0. `aligned`: the whole run is in bounds and 16-byte aligned (one vector load).
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

// Elements of a run that lie inside a dimension of `extent` when the run starts at `start`.
__device__ __forceinline__ int valid_in_run(std::int64_t start, std::int64_t extent, int n) {
  if (start >= extent) return 0;
  return extent - start < n ? static_cast<int>(extent - start) : n;
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

// |x| for the amax: the sign bit cleared, so -0 becomes +0 and bit ordering holds.
__device__ __forceinline__ float amax_of(float running, float x) {
  return fmaxf(running, num::abs_f(x));  // fmaxf ignores NaN, like the reference
}

__device__ __forceinline__ float resolve_scale(const ScaleSource& s) {
  if (s.device_amax != nullptr)
    return scale_from_amax(*s.device_amax, s.fmax, s.pow2_scales, s.amax_epsilon);
  return s.scale;
}

// ---------------------------------------------------------------- 3. kernels

// amax: grid-stride over runs, kAmaxUnroll independent 16-byte loads in flight per thread,
// a block max, then one atomic per block.
constexpr int kAmaxThreads = 256;
constexpr int kAmaxUnroll = 4;
constexpr int kAmaxBlocksPerSM = 2048 / kAmaxThreads;  // a full SM of resident threads: 8

template <class In>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const typename In::Storage* src, std::int64_t numel, bool src_aligned,
                float* amax_out) {
  constexpr int N = kRunLength<In>;
  const std::int64_t runs = (numel + N - 1) / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  float running = 0.0f;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       base < runs; base += stride * kAmaxUnroll) {
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
      for (int k = 0; k < N; ++k) running = amax_of(running, x[u][k]);  // padding reads 0
  }
  const float block = block_max<kAmaxThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) atomic_max_nonnegative(amax_out, block);
}

// Fused cast + transpose. One block per kRows x kCols tile of the [rows, cols] input.
// Phase 1: each thread loads runs along a row, quantizes them, writes the rowwise bytes, and
// parks the codes in a shared-memory tile. Phase 2 (columnwise requested): each thread reads
// a run of consecutive rows down one column of the tile and writes it as consecutive bytes
// of the transposed [cols, rows] output, so global writes are coalesced in both directions.
template <class In>
struct CastTile {
  static constexpr int kRun = kRunLength<In>;                     // f32: 4, bf16/f16: 8
  static constexpr int kRows = 64;
  static constexpr int kCols = 64;
  static constexpr int kThreads = 256;
  static constexpr int kThreadsPerRow = kCols / kRun;             // 16 or 8
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;  // 16 or 32
  static constexpr int kRowPasses = kRows / kRowsPerPass;         // 4 or 2
  static constexpr int kThreadsPerCol = kRows / kRun;             // 16 or 8
  static constexpr int kColsPerPass = kThreads / kThreadsPerCol;  // 16 or 32
  static constexpr int kColPasses = kCols / kColsPerPass;         // 4 or 2
  // Rows padded by one 32-bit word: 68 bytes keep rows 4-byte aligned for the packed stores
  // and make phase 2's column reads at most 2-way bank conflicted.
  static constexpr int kPitch = kCols + 4;
  static_assert(kCols % kRun == 0 && kRows % kRun == 0, "tiles hold whole runs");
  static_assert(kThreads % kThreadsPerRow == 0 && kRows % kRowsPerPass == 0,
                "phase 1 passes cover the tile exactly");
  static_assert(kThreads % kThreadsPerCol == 0 && kCols % kColsPerPass == 0,
                "phase 2 passes cover the tile exactly");
  static_assert(kPitch % 4 == 0, "tile rows must stay 4-byte aligned");
};

template <class In>
struct CastTransposeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / kCols)
  std::uint8_t* rowwise;       // nullptr: not requested
  std::uint8_t* columnwise;    // nullptr: not requested
  float* rowwise_scale_inv;
  float* columnwise_scale_inv;
  float* amax_accumulate;      // nullptr: no amax
  ScaleSource scale;
  bool load_aligned;              // cols % kRun == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 4 == 0 and rowwise 4-byte aligned
  bool columnwise_store_aligned;  // rows % 4 == 0 and columnwise 4-byte aligned
};

template <class In, class Out>
__global__ void __launch_bounds__(CastTile<In>::kThreads)
    cast_transpose_kernel(const CastTransposeParams<In> p) {
  using T = CastTile<In>;
  constexpr int N = T::kRun;
  __shared__ alignas(4) std::uint8_t tile[T::kRows][T::kPitch];
  const float scale = resolve_scale(p.scale);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float scale_inv = 1.0f / scale;  // IEEE division (--prec-div=true)
    if (p.rowwise_scale_inv) *p.rowwise_scale_inv = scale_inv;
    if (p.columnwise_scale_inv) *p.columnwise_scale_inv = scale_inv;
  }
  const std::int64_t row0 = (blockIdx.x / p.tiles_per_row) * T::kRows;
  const std::int64_t col0 = (blockIdx.x % p.tiles_per_row) * T::kCols;

  // Phase 1: load, quantize, rowwise store, park in the tile.
  const int run_col = static_cast<int>(threadIdx.x % T::kThreadsPerRow) * N;
  const int valid_cols = valid_in_run(col0 + run_col, p.cols, N);
  float running_amax = 0.0f;
#pragma unroll
  for (int pass = 0; pass < T::kRowPasses; ++pass) {
    const int r = static_cast<int>(threadIdx.x / T::kThreadsPerRow) + pass * T::kRowsPerPass;
    std::uint8_t codes[N] = {};
    if (row0 + r < p.rows && valid_cols > 0) {
      const std::int64_t offset = (row0 + r) * p.cols + col0 + run_col;
      float x[N];
      load_run<In, N>(p.src, offset, valid_cols, p.load_aligned && valid_cols == N, x);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (k < valid_cols) running_amax = amax_of(running_amax, x[k]);
        codes[k] = Out::encode(x[k] * scale);
      }
      if (p.rowwise)
        store_codes<N>(p.rowwise, offset, valid_cols,
                       p.rowwise_store_aligned && valid_cols == N, codes);
    }
    if (p.columnwise) store_codes<N>(&tile[r][0], run_col, N, true, codes);
  }
  if (p.amax_accumulate) {
    const float block = block_max<T::kThreads>(running_amax);
    if (threadIdx.x == 0 && block > 0.0f) atomic_max_nonnegative(p.amax_accumulate, block);
  }
  if (!p.columnwise) return;
  __syncthreads();

  // Phase 2: columnwise[c][r] = tile[r][c], a run of N consecutive r per thread.
  const int run_row = static_cast<int>(threadIdx.x % T::kThreadsPerCol) * N;
  const int valid_rows = valid_in_run(row0 + run_row, p.rows, N);
  if (valid_rows == 0) return;
#pragma unroll
  for (int pass = 0; pass < T::kColPasses; ++pass) {
    const int c = static_cast<int>(threadIdx.x / T::kThreadsPerCol) + pass * T::kColsPerPass;
    if (col0 + c >= p.cols) break;  // later passes only go further right
    std::uint8_t codes[N];
#pragma unroll
    for (int k = 0; k < N; ++k) codes[k] = tile[run_row + k][c];
    store_codes<N>(p.columnwise, (col0 + c) * p.rows + row0 + run_row, valid_rows,
                   p.columnwise_store_aligned && valid_rows == N, codes);
  }
}

// Dequantize: one element per thread (grid-stride); the columnwise copy is read transposed.
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

__global__ void fill_scalar_kernel(float* dst, float value) { *dst = value; }

// ---------------------------------------------------------------- 4. launchers, entries

bool is_aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

std::int64_t blocks_for(std::int64_t work_items, int threads, std::int64_t max_blocks) {
  const std::int64_t blocks = (work_items + threads - 1) / threads;
  return blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks);
}

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

int sm_count() {
  int device = 0, count = 0;
  QR_CUDA_CHECK(cudaGetDevice(&device));
  QR_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

template <class In>
void launch_amax(const void* src, std::int64_t numel, float* amax_out, cudaStream_t stream) {
  using Storage = typename In::Storage;
  constexpr int N = kRunLength<In>;
  // Enough blocks to fill every SM once; the grid-stride loop covers the rest.
  const std::int64_t runs = (numel + N - 1) / N;
  const auto blocks = static_cast<unsigned>(
      blocks_for(runs, kAmaxThreads * kAmaxUnroll,
                 static_cast<std::int64_t>(sm_count()) * kAmaxBlocksPerSM));
  amax_kernel<In><<<blocks, kAmaxThreads, 0, stream>>>(
      static_cast<const Storage*>(src), numel, is_aligned(src, 16), amax_out);
  QR_CUDA_CHECK_LAUNCH("amax_kernel");
}

template <class In, class Out>
void launch_cast_transpose(const CastTransposeArgs& a) {
  using Storage = typename In::Storage;
  using T = CastTile<In>;
  CastTransposeParams<In> p{};
  p.src = static_cast<const Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_per_row = a.cols == 0 ? 1 : (a.cols + T::kCols - 1) / T::kCols;
  p.rowwise = a.rowwise;
  p.columnwise = a.columnwise;
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.amax_accumulate = a.amax_accumulate;
  p.scale = a.scale;
  p.load_aligned = a.cols % T::kRun == 0 && is_aligned(a.src, 16);
  // Codes go out as 32-bit words: a run starts 4-byte aligned when the row length is a
  // multiple of 4 (runs start at multiples of kRun, itself a multiple of 4).
  p.rowwise_store_aligned = a.cols % 4 == 0 && is_aligned(a.rowwise, 4);
  p.columnwise_store_aligned = a.rows % 4 == 0 && is_aligned(a.columnwise, 4);
  // One block per tile; an empty tensor still gets one block, which only writes scale_inv.
  const std::int64_t tile_rows = (a.rows + T::kRows - 1) / T::kRows;
  const std::int64_t tiles = tile_rows * p.tiles_per_row;
  QR_CHECK(tiles <= INT_MAX, "float8 cast_transpose: ", a.rows, " x ", a.cols, " needs ", tiles,
           " tiles of ", T::kRows, "x", T::kCols, "; at most ", INT_MAX, " fit in one grid");
  const auto blocks = static_cast<unsigned>(tiles < 1 ? 1 : tiles);
  cast_transpose_kernel<In, Out><<<blocks, T::kThreads, 0, as_stream(a.stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("cast_transpose_kernel");
}

template <class In>
void dispatch_cast_transpose(const CastTransposeArgs& a) {
  if (a.data_dtype == QR_DTYPE_E4M3) launch_cast_transpose<In, E4M3Out>(a);
  else launch_cast_transpose<In, E5M2Out>(a);
}

}  // namespace

void compute_amax(const void* src, qr_dtype src_dtype, std::int64_t numel, float* amax_out,
                  int device_index, void* stream) {
  check_source_dtype(src_dtype, "compute_amax");
  QR_CHECK(amax_out != nullptr, "float8 CUDA compute_amax: amax_out is null");
  QR_CHECK(numel == 0 || src != nullptr, "float8 CUDA compute_amax: source of ", numel,
           " elements has a null data pointer");
  DeviceGuard guard(device_index);
  const cudaStream_t s = as_stream(stream);
  QR_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float), s));
  if (numel == 0) return;
  switch (src_dtype) {
    case QR_DTYPE_F32: launch_amax<F32In>(src, numel, amax_out, s); break;
    case QR_DTYPE_BF16: launch_amax<BF16In>(src, numel, amax_out, s); break;
    default: launch_amax<F16In>(src, numel, amax_out, s); break;
  }
}

float compute_amax_to_host(const void* src, qr_dtype src_dtype, std::int64_t numel,
                           int device_index, void* stream) {
  DeviceGuard guard(device_index);
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
  QR_CHECK(a.scale.device_amax == nullptr || a.scale.device_amax != a.amax_accumulate,
           "float8 CUDA cast_transpose: the amax that sets the scale cannot also accumulate "
           "this cast's amax");
  DeviceGuard guard(a.device_index);
  switch (a.src_dtype) {
    case QR_DTYPE_F32: dispatch_cast_transpose<F32In>(a); break;
    case QR_DTYPE_BF16: dispatch_cast_transpose<BF16In>(a); break;
    default: dispatch_cast_transpose<F16In>(a); break;
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
  DeviceGuard guard(device_index);
  const auto blocks =
      static_cast<unsigned>(blocks_for(numel, kDequantizeThreads, kDequantizeMaxBlocks));
  const cudaStream_t s = as_stream(stream);
  if (data_dtype == QR_DTYPE_E4M3)
    dequantize_kernel<E4M3Out><<<blocks, kDequantizeThreads, 0, s>>>(
        data, transposed, rows, cols, scale_inv, dst, dst_dtype);
  else
    dequantize_kernel<E5M2Out><<<blocks, kDequantizeThreads, 0, s>>>(
        data, transposed, rows, cols, scale_inv, dst, dst_dtype);
  QR_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

void fill_scalar(float* dst, float value, int device_index, void* stream) {
  DeviceGuard guard(device_index);
  fill_scalar_kernel<<<1, 1, 0, as_stream(stream)>>>(dst, value);
  QR_CUDA_CHECK_LAUNCH("fill_scalar_kernel");
}

void copy_scalar(float* dst, const float* src, int device_index, void* stream) {
  DeviceGuard guard(device_index);
  QR_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, sizeof(float), cudaMemcpyDeviceToDevice, as_stream(stream)));
}

float read_scalar(const float* src, int device_index, void* stream) {
  DeviceGuard guard(device_index);
  float value = 0.0f;
  QR_CUDA_CHECK(
      cudaMemcpyAsync(&value, src, sizeof(float), cudaMemcpyDeviceToHost, as_stream(stream)));
  QR_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
  return value;
}

}  // namespace qrecipe::float8::cuda
