// CUDA kernels around the engine's cuBLASLt GEMMs (see gemm_cuda_kernels.hpp).
//
// Map (STYLE.md rule 11): launch checking; the epilogue kernels (elementwise, grid-stride;
// they run only off the fast path: bias with FP8 or BF16 output, BF16 output of an FP32 GEMM,
// a mixed-dtype dense GEMM, K = 0); the operand decoders of the emulated GEMMs and their
// exactness check; then the entries that size the grids and launch.
//
// The decoders are memory-bound one-pass kernels: each thread turns 16 stored elements (16
// FP8 bytes or 8 E2M1 bytes, one load) into 16 BF16 values (two 16-byte stores); FP8 codes go
// through the hardware FP8 -> F16 conversion (exact), E2M1 through a few integer operations.
// Every multiplication is a plain FP32 multiply of two exact values (-fmad=false, no FTZ).
#include "gemm_cuda_kernels.hpp"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::detail::gemm_kernels {
namespace {

constexpr int kThreads = 256;       // threads per block
constexpr int kMaxBlocks = 65535;   // enough to cover an H100 many times (132 SMs x 8 blocks)

void check_launch(const char* kernel, std::int64_t n) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "launch of the GEMM helper kernel ", kernel, " over ", n,
                " elements failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                "); an earlier asynchronous error may also surface here: rerun with "
                "CUDA_LAUNCH_BLOCKING=1 to find it");
}

int blocks_for(std::int64_t n) {
  return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// ---------------------------------------------------------------- epilogue kernels

__global__ void bf16_to_f32_kernel(const std::uint16_t* __restrict__ src, float* __restrict__ dst,
                                   std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = num::bf16_to_f32(src[i]);
}

// One element of the reference epilogue (gemm.cpp): alpha * AB, + out, + bias, then round.
__device__ __forceinline__ float epilogue(float product, float old, bool accumulate, float bias,
                                          bool has_bias) {
  float v = product;
  if (accumulate) v = v + old;
  if (has_bias) v = v + bias;
  return v;
}

// Four consecutive elements of one row per thread (cols % 4 == 0): 16-byte loads of the FP32
// product and output, one column computation per four elements.
// `product` may be `out` itself (FP32, no accumulate: the bias pass), hence no __restrict__.
__global__ void finish4_kernel(void* out, bool out_bf16, const float* product,
                               float alpha, bool accumulate, const float* __restrict__ bias,
                               std::int64_t n4, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n4;
       t += stride) {
    const std::int64_t i = t * 4;
    const std::int64_t col = i % cols;
    float p[4];
    if (product) {
      const float4 v = reinterpret_cast<const float4*>(product)[t];
      p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
    } else {
      for (int e = 0; e < 4; ++e) p[e] = alpha * 0.0f;  // K = 0: the empty sum is +0
    }
    float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (bias) {
      const float4 v = *reinterpret_cast<const float4*>(bias + col);
      b[0] = v.x, b[1] = v.y, b[2] = v.z, b[3] = v.w;
    }
    if (out_bf16) {
      auto* o = reinterpret_cast<uint2*>(out) + t;
      uint2 old = accumulate ? *o : make_uint2(0, 0);
      const std::uint16_t in[4] = {static_cast<std::uint16_t>(old.x), static_cast<std::uint16_t>(old.x >> 16),
                                   static_cast<std::uint16_t>(old.y), static_cast<std::uint16_t>(old.y >> 16)};
      std::uint16_t r[4];
      for (int e = 0; e < 4; ++e)
        r[e] = num::f32_to_bf16(epilogue(p[e], num::bf16_to_f32(in[e]), accumulate, b[e], bias != nullptr));
      *o = make_uint2(r[0] | (static_cast<std::uint32_t>(r[1]) << 16),
                      r[2] | (static_cast<std::uint32_t>(r[3]) << 16));
    } else {
      auto* o = reinterpret_cast<float4*>(out) + t;
      const float4 old = accumulate ? *o : make_float4(0, 0, 0, 0);
      *o = make_float4(epilogue(p[0], old.x, accumulate, b[0], bias != nullptr),
                       epilogue(p[1], old.y, accumulate, b[1], bias != nullptr),
                       epilogue(p[2], old.z, accumulate, b[2], bias != nullptr),
                       epilogue(p[3], old.w, accumulate, b[3], bias != nullptr));
    }
  }
}

// The same, one element per thread, for any shape.
__global__ void finish_kernel(void* out, bool out_bf16, const float* product,
                              float alpha, bool accumulate, const float* __restrict__ bias,
                              std::int64_t n, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float p = product ? product[i] : alpha * 0.0f;  // K = 0: the empty sum is +0
    const float b = bias ? bias[i % cols] : 0.0f;
    if (out_bf16) {
      auto* o = static_cast<std::uint16_t*>(out);
      o[i] = num::f32_to_bf16(epilogue(p, accumulate ? num::bf16_to_f32(o[i]) : 0.0f, accumulate, b,
                                       bias != nullptr));
    } else {
      auto* o = static_cast<float*>(out);
      o[i] = epilogue(p, accumulate ? o[i] : 0.0f, accumulate, b, bias != nullptr);
    }
  }
}

// ---------------------------------------------------------------- operand decoders

// FP8 codes -> FP32 through the hardware FP8 -> F16 conversion (exact: F16 holds every E4M3
// and E5M2 value, NaN stays NaN).
template <Code C>
__device__ __forceinline__ float2 fp8x2_to_f32x2(std::uint16_t pair) {
  constexpr __nv_fp8_interpretation_t kind = C == Code::e4m3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), kind);
  return __half22float2(__half2(raw));
}

// E2M1 code (sign in bit 3) -> FP32 from its bits: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_f32(std::uint32_t c) {
  const std::uint32_t e = (c >> 1) & 3u, m = c & 1u;
  std::uint32_t bits;
  if (e == 0)
    bits = m ? 0x3F000000u : 0u;  // 0.5 or 0
  else
    bits = ((e + 126u) << 23) | (m << 22);
  return __uint_as_float(bits | ((c & 8u) << 28));
}

// Decoded FP32 -> BF16 bits. Callers only pass values that are exact in BF16 (or that a check
// has already sent to the FP32 path), so dropping the low half is exact. A NaN stays a NaN:
// every NaN here has high mantissa bits (the F16 NaN of an FP8 or E4M3 NaN code, the E8M0 NaN
// 0x7FC00000, or the canonical 0x7FFFFFFF a multiplication returns for any NaN operand).
__device__ __forceinline__ std::uint32_t bf16_bits(float v) { return __float_as_uint(v) >> 16; }

// Two decoded values -> one word of two BF16 (lo in the low half), one byte permute.
__device__ __forceinline__ std::uint32_t bf16x2_bits(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

// q = n / d and r = n - q * d, in 32 bits when both fit (a 64-bit division is a long
// instruction sequence on the GPU).
__device__ __forceinline__ void divmod(std::int64_t n, std::int64_t d, std::int64_t& q, std::int64_t& r) {
  if (((n | d) >> 32) == 0) {
    const auto q32 = static_cast<std::uint32_t>(n) / static_cast<std::uint32_t>(d);
    q = q32;
  } else {
    q = n / d;
  }
  r = n - q * d;
}

template <BlockScale S>
__device__ __forceinline__ float load_scale(const StoredOperand& op, std::int64_t bp, std::int64_t bq) {
  const std::int64_t idx = op.scale_transposed ? bq * op.scale_ld + bp : bp * op.scale_ld + bq;
  if constexpr (S == BlockScale::e8m0) {
    return num::e8m0_to_f32(static_cast<const std::uint8_t*>(op.scales)[idx]);
  } else if constexpr (S == BlockScale::e4m3) {
    const __half_raw raw =
        __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(op.scales)[idx], __NV_E4M3);
    return __half2float(__half(raw));
  } else {
    return static_cast<const float*>(op.scales)[idx];
  }
}

// The stored element (p, q) as FP32, codes only.
template <Code C>
__device__ __forceinline__ float load_code(const StoredOperand& op, std::int64_t p, std::int64_t q) {
  if constexpr (C == Code::e2m1) {
    const std::int64_t row_bytes = (op.cols + 1) / 2;
    const std::uint8_t byte = static_cast<const std::uint8_t*>(op.data)[p * row_bytes + q / 2];
    return e2m1_to_f32((q & 1) ? byte >> 4 : byte & 0xFu);
  } else {
    const std::uint8_t byte = static_cast<const std::uint8_t*>(op.data)[p * op.cols + q];
    return fp8x2_to_f32x2<C>(byte).x;
  }
}

__device__ void write_scalars_now(const Scalars& s) {
  float f[2];
  for (int i = 0; i < 2; ++i) {
    switch (s.kind[i]) {
      case Factor::none: f[i] = 1.0f; break;
      case Factor::value: f[i] = *s.factor[i]; break;
      case Factor::nvfp4_amax:
        f[i] = 1.0f / scale_from_amax(*s.factor[i], 2688.0f, /*pow2=*/false, /*eps=*/0.0f);
        break;
    }
  }
  const float alpha = s.alpha * (f[0] * f[1]);
  s.out[0] = alpha;  // a GEMM that writes the output
  s.out[1] = s.beta;
  s.out[2] = alpha;  // a GEMM that writes the FP32 product buffer
  s.out[3] = 0.0f;
}

__global__ void write_scalars_kernel(Scalars s) { write_scalars_now(s); }

// 16 stored elements: codes in v[0..15] as FP32 (bytes at `src`, 16-byte aligned for FP8,
// 8-byte for E2M1).
template <Code C>
__device__ __forceinline__ void decode_codes16(const std::uint8_t* src, float* v) {
  if constexpr (C == Code::e2m1) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = e2m1_to_f32((w.x >> (4 * e)) & 0xFu);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[8 + e] = e2m1_to_f32((w.y >> (4 * e)) & 0xFu);
  } else {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(src));
    const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 lo = fp8x2_to_f32x2<C>(static_cast<std::uint16_t>(words[k] & 0xFFFFu));
      const float2 hi = fp8x2_to_f32x2<C>(static_cast<std::uint16_t>(words[k] >> 16));
      v[4 * k] = lo.x, v[4 * k + 1] = lo.y, v[4 * k + 2] = hi.x, v[4 * k + 3] = hi.y;
    }
  }
}

// kVec (16 or 32) stored elements per thread along a row; requires cols % kVec == 0 (so every
// row starts aligned and one block scale covers each 16 elements when block_cols >= 16). All
// loads of a thread are issued before its first conversion, its stores are 16 bytes wide.
template <Code C, BlockScale S, int kVec>
__global__ void __launch_bounds__(kThreads) decode_vec_kernel(StoredOperand op, std::uint16_t* __restrict__ dst,
                                                               Scalars scalars) {
  constexpr int kSub = kVec / 16;
  constexpr int kCodeBytes = C == Code::e2m1 ? 8 : 16;  // bytes of 16 codes
  if (scalars.out && blockIdx.x == 0 && threadIdx.x == 0) write_scalars_now(scalars);
  const std::int64_t groups_per_row = op.cols / kVec;
  const std::int64_t groups = op.rows * groups_per_row;
  const std::int64_t row_bytes = C == Code::e2m1 ? op.cols / 2 : op.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    std::int64_t p, q0;
    divmod(g, groups_per_row, p, q0);
    q0 *= kVec;
    const std::uint8_t* src = static_cast<const std::uint8_t*>(op.data) + p * row_bytes + (C == Code::e2m1 ? q0 / 2 : q0);
    float v[kVec];
#pragma unroll
    for (int k = 0; k < kSub; ++k) decode_codes16<C>(src + k * kCodeBytes, v + 16 * k);
    if constexpr (S != BlockScale::none) {
      const std::int64_t bp = p >> op.block_rows_log2;
      if (op.block_cols_log2 >= 4) {
#pragma unroll
        for (int k = 0; k < kSub; ++k) {
          const float s = load_scale<S>(op, bp, (q0 + 16 * k) >> op.block_cols_log2);
#pragma unroll
          for (int e = 0; e < 16; ++e) v[16 * k + e] = v[16 * k + e] * s;
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[e] = v[e] * load_scale<S>(op, bp, (q0 + e) >> op.block_cols_log2);
      }
    }
    uint4* out = reinterpret_cast<uint4*>(dst + p * op.cols + q0);
#pragma unroll
    for (int k = 0; k < kVec / 8; ++k) {
      const float* w = v + 8 * k;
      out[k] = make_uint4(bf16x2_bits(w[0], w[1]), bf16x2_bits(w[2], w[3]), bf16x2_bits(w[4], w[5]),
                          bf16x2_bits(w[6], w[7]));
    }
  }
}

// One element per thread, any shape (cols % 16 != 0).
template <Code C, BlockScale S>
__global__ void decode1_kernel(StoredOperand op, std::uint16_t* __restrict__ dst, Scalars scalars) {
  if (scalars.out && blockIdx.x == 0 && threadIdx.x == 0) write_scalars_now(scalars);
  const std::int64_t n = op.rows * op.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    std::int64_t p, q;
    divmod(i, op.cols, p, q);
    float v = load_code<C>(op, p, q);
    if constexpr (S != BlockScale::none)
      v = v * load_scale<S>(op, p >> op.block_rows_log2, q >> op.block_cols_log2);
    dst[i] = static_cast<std::uint16_t>(bf16_bits(v));
  }
}

// Whether every element of a block whose scale is `s` decodes exactly in BF16, judged from
// the scale alone: a power-of-two scale of at least 2^(min_exponent - 127) keeps every
// product of a code (lowest bit 2^-9 for E4M3, 2^-16 for E5M2) on BF16's grid (>= 2^-133).
// inf, NaN and zero scales give inf, NaN and zero products: exact too.
__device__ __forceinline__ bool scale_proves_exact(float s, std::uint32_t min_exponent) {
  const std::uint32_t u = __float_as_uint(s) & 0x7FFFFFFFu;
  const std::uint32_t exponent = u >> 23, mantissa = u & 0x7FFFFFu;
  if (u == 0 || exponent == 0xFFu) return true;
  return mantissa == 0 && exponent >= min_exponent;
}

// One thread per stored block: the scale decides, or the block's codes are multiplied out.
template <Code C, BlockScale S>
__global__ void check_kernel(StoredOperand op, std::uint32_t* flag) {
  const std::int64_t bp_count = (op.rows + (std::int64_t{1} << op.block_rows_log2) - 1) >> op.block_rows_log2;
  const std::int64_t bq_count = (op.cols + (std::int64_t{1} << op.block_cols_log2) - 1) >> op.block_cols_log2;
  const std::int64_t n = bp_count * bq_count;
  // Lowest code bit 2^-9 (E4M3) or 2^-16 (E5M2): the scale must be >= 2^-124 or 2^-117,
  // biased exponent 3 or 10.
  constexpr std::uint32_t kMinExponent = C == Code::e4m3 ? 3u : 10u;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < n;
       b += stride) {
    std::int64_t bp, bq;
    divmod(b, bq_count, bp, bq);
    const float s = load_scale<S>(op, bp, bq);
    if (scale_proves_exact(s, kMinExponent)) continue;
    const std::int64_t p0 = bp << op.block_rows_log2, q0 = bq << op.block_cols_log2;
    const std::int64_t p1 = min(op.rows, p0 + (std::int64_t{1} << op.block_rows_log2));
    const std::int64_t q1 = min(op.cols, q0 + (std::int64_t{1} << op.block_cols_log2));
    bool exact = true;
    for (std::int64_t p = p0; p < p1 && exact; ++p)
      for (std::int64_t q = q0; q < q1; ++q) {
        const float v = load_code<C>(op, p, q) * s;
        const std::uint32_t u = __float_as_uint(v);
        if ((u & 0xFFFFu) != 0 && (u & 0x7FFFFFFFu) <= 0x7F800000u) {
          exact = false;
          break;
        }
      }
    if (!exact) atomicOr(flag, 1u);
  }
}

template <Code C, BlockScale S>
void launch_decode(const StoredOperand& op, std::uint16_t* dst, const Scalars& scalars, cudaStream_t stream) {
  // The 16-element path loads 16 FP8 bytes (8 E2M1 bytes) and stores 32 bytes per thread:
  // rows must keep that alignment.
  const auto address = reinterpret_cast<std::uintptr_t>(op.data) | reinterpret_cast<std::uintptr_t>(dst);
  const auto blocks_of = [](std::int64_t groups) {
    return std::max(1, static_cast<int>(std::min<std::int64_t>((groups + kThreads - 1) / kThreads, 1 << 20)));
  };
  if (op.cols % 32 == 0 && address % 16 == 0) {
    decode_vec_kernel<C, S, 32><<<blocks_of(op.rows * (op.cols / 32)), kThreads, 0, stream>>>(op, dst, scalars);
  } else if (op.cols % 16 == 0 && address % 16 == 0) {
    decode_vec_kernel<C, S, 16><<<blocks_of(op.rows * (op.cols / 16)), kThreads, 0, stream>>>(op, dst, scalars);
  } else {
    decode1_kernel<C, S><<<std::max(blocks_for(op.rows * op.cols), 1), kThreads, 0, stream>>>(op, dst, scalars);
  }
  check_launch("decode_to_bf16", op.rows * op.cols);
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, void* stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  check_launch("bf16_to_f32", n);
}

void add_bias_f32(float* out, const float* bias, std::int64_t rows, std::int64_t cols, void* stream) {
  finish(out, false, out, 1.0f, false, bias, rows, cols, stream);
}

void finish(void* out, bool out_bf16, const float* product, float alpha, bool accumulate,
            const float* bias, std::int64_t rows, std::int64_t cols, void* stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto aligned16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (cols % 4 == 0 && aligned16(out) && (!product || aligned16(product)) && (!bias || aligned16(bias))) {
    finish4_kernel<<<blocks_for(n / 4), kThreads, 0, s>>>(out, out_bf16, product, alpha, accumulate, bias,
                                                          n / 4, cols);
  } else {
    finish_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, out_bf16, product, alpha, accumulate, bias, n, cols);
  }
  check_launch("finish", n);
}

void decode_to_bf16(const StoredOperand& op, std::uint16_t* dst, const Scalars& scalars, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (op.rows * op.cols == 0) {
    if (scalars.out) write_scalars(scalars, stream);
    return;
  }
  switch (op.code) {
    case Code::e2m1:
      QR_CHECK_CODE(op.scale == BlockScale::e4m3, QR_STATUS_INTERNAL, "decode_to_bf16: E2M1 needs E4M3 block scales");
      return launch_decode<Code::e2m1, BlockScale::e4m3>(op, dst, scalars, s);
    case Code::e4m3:
    case Code::e5m2: {
      const bool e4 = op.code == Code::e4m3;
      switch (op.scale) {
        case BlockScale::none:
          return e4 ? launch_decode<Code::e4m3, BlockScale::none>(op, dst, scalars, s)
                    : launch_decode<Code::e5m2, BlockScale::none>(op, dst, scalars, s);
        case BlockScale::e8m0:
          return e4 ? launch_decode<Code::e4m3, BlockScale::e8m0>(op, dst, scalars, s)
                    : launch_decode<Code::e5m2, BlockScale::e8m0>(op, dst, scalars, s);
        case BlockScale::f32:
          return e4 ? launch_decode<Code::e4m3, BlockScale::f32>(op, dst, scalars, s)
                    : launch_decode<Code::e5m2, BlockScale::f32>(op, dst, scalars, s);
        case BlockScale::e4m3: break;
      }
      break;
    }
  }
  QR_THROW_CODE(QR_STATUS_INTERNAL, "decode_to_bf16: no decoder for code ", static_cast<int>(op.code),
                " with block scale ", static_cast<int>(op.scale));
}

void write_scalars(const Scalars& scalars, void* stream) {
  write_scalars_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scalars);
  check_launch("write_scalars", 1);
}

void check_bf16_exact(const StoredOperand& op, std::uint32_t* flag, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const std::int64_t blocks = ((op.rows + (std::int64_t{1} << op.block_rows_log2) - 1) >> op.block_rows_log2) *
                              ((op.cols + (std::int64_t{1} << op.block_cols_log2) - 1) >> op.block_cols_log2);
  if (blocks == 0) return;
  const bool e4 = op.code == Code::e4m3;
  QR_CHECK_CODE(op.code != Code::e2m1 && (op.scale == BlockScale::e8m0 || op.scale == BlockScale::f32),
                QR_STATUS_INTERNAL, "check_bf16_exact: only FP8 codes with E8M0 or FP32 block scales need it");
  const int grid = blocks_for(blocks);
  if (op.scale == BlockScale::e8m0) {
    if (e4) check_kernel<Code::e4m3, BlockScale::e8m0><<<grid, kThreads, 0, s>>>(op, flag);
    else check_kernel<Code::e5m2, BlockScale::e8m0><<<grid, kThreads, 0, s>>>(op, flag);
  } else {
    if (e4) check_kernel<Code::e4m3, BlockScale::f32><<<grid, kThreads, 0, s>>>(op, flag);
    else check_kernel<Code::e5m2, BlockScale::f32><<<grid, kThreads, 0, s>>>(op, flag);
  }
  check_launch("check_bf16_exact", blocks);
}

}  // namespace qrecipe::detail::gemm_kernels
