// The fused RMSNorm kernels (qrecipe/norm.hpp states the formula; rms_norm_cuda.hpp the
// launchers' contract).
//
// Map:
//   element helpers   T <-> float with round-to-nearest-even, packs of V elements
//   block_reduce      a deterministic block sum or max (shuffle tree, then warps in order)
//   forward_kernel    one block per row: sum of squares, rstd, y (x read from DRAM once: the
//                     second pass over the row hits the cache), and optionally max |y|
//   backward_kernel   one block per `rows_per_block` rows: dr, dx, and this block's dweight
//                     partial sums in shared memory, written out once at the end
//   reduce_kernel     dweight = T(sum of the partials), 32 columns x 8 partial lanes a block
//   launchers         grid, block and pack width; the entries of rms_norm_cuda.hpp
// Every product and sum is an explicit __fmul_rn / __fadd_rn (no contraction, as torch's
// separate elementwise kernels round), and rsqrtf is the function torch's CUDA rsqrt calls.
#include "norm/rms_norm_cuda.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_device_guard.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::detail {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kReduceCols = 32;   // reduce_kernel: one warp of columns ...
constexpr int kReduceLanes = 8;   // ... times 8 lanes over the partials = 256 threads
constexpr int kPackBytes = 16;    // vector loads of 16 bytes where every buffer is aligned

// ---- element helpers ----
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
// The value a torch op with a T output stores, widened back: a product of two T values is
// exact in FP32 (at most 2 x 11 significant bits), so this is torch's one rounding.
template <class T> __device__ __forceinline__ float round_to(float v) {
  return to_f(from_f<T>(v));
}

template <class T, int V> struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <class T, int V> __device__ __forceinline__ Pack<T, V> load(const T* base, std::int64_t p) {
  return reinterpret_cast<const Pack<T, V>*>(base)[p];
}
template <class T, int V> __device__ __forceinline__ void store(T* base, std::int64_t p,
                                                               const Pack<T, V>& v) {
  reinterpret_cast<Pack<T, V>*>(base)[p] = v;
}

// ---- block reductions: the same bits on every thread; `scratch` holds kMaxWarps + 1 floats ----
struct Add {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct Max {  // fmaxf ignores NaN
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class Op>
__device__ float block_reduce(float v, float* scratch) {
  const Op op;
  // xor shuffles: every lane combines the same two values (op is commutative), so all agree.
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = scratch[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = op(r, scratch[w]);
    scratch[kMaxWarps] = r;
  }
  __syncthreads();
  const float out = scratch[kMaxWarps];
  __syncthreads();  // the next call reuses scratch
  return out;
}

// ---- kernels ----
template <class T, int V>
__global__ void __launch_bounds__(kMaxThreads)
forward_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
               float* __restrict__ rstd, float* __restrict__ amax, std::int64_t n, float eps,
               float mean_factor) {
  __shared__ float scratch[kMaxWarps + 1];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  const std::int64_t packs = n / V;
  float squares = 0.0f;
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const auto a = load<T, V>(xr, p);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float h = to_f(a.v[i]);
      squares = __fadd_rn(squares, __fmul_rn(h, h));
    }
  }
  const float var = __fmul_rn(block_reduce<Add>(squares, scratch), mean_factor);
  const float r = rsqrtf(__fadd_rn(var, eps));
  if (threadIdx.x == 0) rstd[row] = r;
  float largest = 0.0f;  // max |y| of this thread's elements (fmaxf: NaN ignored)
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const auto a = load<T, V>(xr, p);
    const auto g = load<T, V>(w, p);
    Pack<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float hb = round_to<T>(__fmul_rn(to_f(a.v[i]), r));
      out.v[i] = from_f<T>(__fmul_rn(to_f(g.v[i]), hb));
      largest = fmaxf(largest, fabsf(to_f(out.v[i])));
    }
    store<T, V>(yr, p, out);
  }
  if (amax != nullptr) {  // the same branch for the whole block (block_reduce synchronizes)
    const float m = block_reduce<Max>(largest, scratch);
    // Non-negative floats order as their bit patterns: an integer max is the float max. A row
    // whose max does not exceed the value already there skips the atomics (one address for
    // every row of the tensor): amax[0] only grows, and a block that raised it raises amax[1]
    // too, so both end at the tensor's max when the kernel completes.
    if (threadIdx.x == 0 && m > *reinterpret_cast<volatile float*>(amax)) {
      atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
      atomicMax(reinterpret_cast<int*>(amax) + 1, __float_as_int(m));
    }
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kMaxThreads)
backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ partials,
                std::int64_t rows, std::int64_t n, std::int64_t rows_per_block, float inv_n) {
  // n values, element i of pack p at [i * packs + p]: for each i the threads of a warp touch
  // consecutive words (no bank conflicts); each value belongs to the thread of its pack.
  extern __shared__ float dw_acc[];
  __shared__ float scratch[kMaxWarps + 1];
  const std::int64_t packs = n / V;
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x)
#pragma unroll
    for (int i = 0; i < V; ++i) dw_acc[i * packs + p] = 0.0f;
  const std::int64_t first = blockIdx.x * rows_per_block;
  const std::int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (std::int64_t row = first; row < last; ++row) {
    const T* dyr = dy + row * n;
    const T* xr = x + row * n;
    const float r = rstd[row];
    float dr_part = 0.0f;
    for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const auto d = load<T, V>(dyr, p);
      const auto a = load<T, V>(xr, p);
      const auto g = load<T, V>(w, p);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float gi = round_to<T>(__fmul_rn(to_f(d.v[i]), to_f(g.v[i])));
        dr_part = __fadd_rn(dr_part, __fmul_rn(gi, to_f(a.v[i])));
      }
    }
    const float dr = block_reduce<Add>(dr_part, scratch);
    // torch: rsqrt' = (-0.5 * grad) * result.pow(3); mean' = grad * (1 / n) (a CUDA scalar
    // division multiplies by the reciprocal); pow(2)' = grad * (2 * h).
    const float r3 = __fmul_rn(__fmul_rn(r, r), r);
    const float c = __fmul_rn(__fmul_rn(__fmul_rn(dr, -0.5f), r3), inv_n);
    for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const auto d = load<T, V>(dyr, p);
      const auto a = load<T, V>(xr, p);
      const auto g = load<T, V>(w, p);
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float h = to_f(a.v[i]);
        const float dyi = to_f(d.v[i]);
        const float gi = round_to<T>(__fmul_rn(dyi, to_f(g.v[i])));
        const float dh = __fadd_rn(__fmul_rn(gi, r), __fmul_rn(c, __fmul_rn(2.0f, h)));
        out.v[i] = from_f<T>(dh);
        const float hb = round_to<T>(__fmul_rn(h, r));
        dw_acc[i * packs + p] = __fadd_rn(dw_acc[i * packs + p], round_to<T>(__fmul_rn(dyi, hb)));
      }
      store<T, V>(dx + row * n, p, out);
    }
  }
  for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x)
#pragma unroll
    for (int i = 0; i < V; ++i) partials[blockIdx.x * n + p * V + i] = dw_acc[i * packs + p];
}

template <class T>
__global__ void __launch_bounds__(kReduceCols * kReduceLanes)
reduce_kernel(const float* __restrict__ partials, std::int64_t count, std::int64_t n,
              T* __restrict__ dw) {
  __shared__ float lanes[kReduceLanes][kReduceCols];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kReduceCols + threadIdx.x;
  float s = 0.0f;
  if (j < n)
    for (std::int64_t b = threadIdx.y; b < count; b += kReduceLanes)
      s = __fadd_rn(s, partials[b * n + j]);
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float t = 0.0f;
    for (int k = 0; k < kReduceLanes; ++k) t = __fadd_rn(t, lanes[k][threadIdx.x]);
    dw[j] = from_f<T>(t);
  }
}

// ---- launchers ----
void check(cudaError_t status, const char* what, const RmsNormCudaArgs& a) {
  QR_CHECK_CODE(status == cudaSuccess, QR_STATUS_DEVICE_ERROR, what, " failed on cuda:",
                a.device, " (RMSNorm of ", a.rows, " rows of ", a.n, "): ",
                cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kPackBytes == 0; }

// Threads for `packs` packs a row: whole warps, at most kMaxThreads.
int threads_for(std::int64_t packs) {
  const std::int64_t warps = std::clamp<std::int64_t>((packs + 31) / 32, 1, kMaxWarps);
  return static_cast<int>(warps * 32);
}

template <class T, int V>
void forward_typed(const RmsNormCudaArgs& a, const void* x, const void* w, float eps, void* y,
                   float* rstd, float* amax) {
  // torch's CUDA mean multiplies the sum by float(outputs) / numel.
  const float mean_factor = static_cast<float>(a.rows) / static_cast<float>(a.rows * a.n);
  forward_kernel<T, V><<<static_cast<unsigned>(a.rows), threads_for(a.n / V), 0,
                         static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, amax, a.n,
      eps, mean_factor);
  check(cudaGetLastError(), "launch of the RMSNorm forward kernel", a);
}

template <class T, int V>
void backward_typed(const RmsNormCudaArgs& a, const void* dy, const void* x, const void* w,
                    const float* rstd, void* dx, void* dw, float* partials, std::int64_t count) {
  const auto s = static_cast<cudaStream_t>(a.stream);
  const std::size_t shared = static_cast<std::size_t>(a.n) * sizeof(float);
  auto* kernel = backward_kernel<T, V>;
  constexpr std::size_t kDefaultShared = 48 * 1024;  // more must be asked for per kernel
  if (shared > kDefaultShared)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared)),
          "cudaFuncSetAttribute (dynamic shared memory of the RMSNorm backward)", a);
  const std::int64_t per_block = (a.rows + count - 1) / count;
  kernel<<<static_cast<unsigned>(count), threads_for(a.n / V), shared, s>>>(
      static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd,
      static_cast<T*>(dx), partials, a.rows, a.n, per_block, 1.0f / static_cast<float>(a.n));
  check(cudaGetLastError(), "launch of the RMSNorm backward kernel", a);
  const dim3 block(kReduceCols, kReduceLanes);
  reduce_kernel<T><<<static_cast<unsigned>((a.n + kReduceCols - 1) / kReduceCols), block, 0, s>>>(
      partials, count, a.n, static_cast<T*>(dw));
  check(cudaGetLastError(), "launch of the RMSNorm dweight reduction kernel", a);
}

// Calls f.template operator()<T, V>() for the dtype and the widest pack every buffer allows.
template <class F>
void dispatch(const RmsNormCudaArgs& a, bool all_aligned, F&& f) {
  auto by_width = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kPackBytes / static_cast<int>(sizeof(T));
    if (all_aligned && a.n % kVec == 0) f.template operator()<T, kVec>();
    else f.template operator()<T, 1>();
  };
  switch (a.dtype) {
    case QR_DTYPE_F32: by_width(float{}); break;
    case QR_DTYPE_BF16: by_width(__nv_bfloat16{}); break;
    case QR_DTYPE_F16: by_width(__half{}); break;
    default: QR_THROW("RMSNorm CUDA kernels: dtype code ", a.dtype, " is not F32, BF16 or F16");
  }
}

}  // namespace

void rms_norm_forward_cuda(const RmsNormCudaArgs& a, const void* x, const void* weight,
                           float eps, void* y, float* rstd, float* amax) {
  if (a.rows == 0) return;
  DeviceGuard on(a.device, "the RMSNorm forward");
  const bool all_aligned = aligned(x) && aligned(weight) && aligned(y);
  dispatch(a, all_aligned, [&]<class T, int V>() {
    forward_typed<T, V>(a, x, weight, eps, y, rstd, amax);
  });
}

void rms_norm_backward_cuda(const RmsNormCudaArgs& a, const void* dy, const void* x,
                            const void* weight, const float* rstd, void* dx, void* dweight,
                            float* partials, std::int64_t count) {
  if (a.n == 0) return;
  DeviceGuard on(a.device, "the RMSNorm backward");
  if (a.rows == 0) {  // dweight of no rows is zero
    check(cudaMemsetAsync(dweight, 0, static_cast<std::size_t>(a.n) *
                          (a.dtype == QR_DTYPE_F32 ? 4 : 2), static_cast<cudaStream_t>(a.stream)),
          "cudaMemsetAsync of dweight", a);
    return;
  }
  const bool all_aligned = aligned(dy) && aligned(x) && aligned(weight) && aligned(dx);
  dispatch(a, all_aligned, [&]<class T, int V>() {
    backward_typed<T, V>(a, dy, x, weight, rstd, dx, dweight, partials, count);
  });
}

}  // namespace qrecipe::detail
