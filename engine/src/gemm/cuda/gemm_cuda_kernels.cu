// CUDA kernels around the engine's cuBLASLt GEMMs (see gemm_cuda_kernels.hpp).
//
// Map (docs/architecture.md, "Conventions", rule 11): launch checking; the epilogue kernels
// (elementwise, grid-stride; they run only off the fast path: bias with FP8 or BF16 output, BF16
// output of an FP32 GEMM, a mixed-dtype dense GEMM, K = 0); the operand decoders of the emulated
// GEMMs, which also check exactness; the exact GEMM that replaces a BF16 GEMM whose operands
// missed; then the launchers and the entries that size the grids.
//
// The decoders are memory-bound one-pass kernels built like a copy: 8-byte (FP8) or 4-byte
// (E2M1) loads and 16-byte stores, each warp instruction over contiguous memory, 8 units of 8
// elements in flight per thread, one division per unit (for its block scale), and both
// operands in one launch. FP8 codes go through the hardware FP8 -> F16 conversion (exact),
// E2M1 through a byte-permutation table. Every multiplication is a plain multiply of two
// exact values whose product is exact or checked (-fmad=false, no FTZ).
#include "gemm/cuda/gemm_cuda_kernels.hpp"
#include "gemm/cuda/decode_values.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

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

// One element of the reference epilogue (gemm/gemm_cpu.cpp): alpha * AB, + out, + bias, then round.
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
//
// Layout of the fast decoder: a unit is 8 consecutive elements of one stored row (cols % 8 ==
// 0), read as 8 FP8 bytes (or 4 E2M1 bytes) and written as one 16-byte store. Thread t of a
// block handles units first + t + kDecodeThreads * u (u < kUnitsPerThread), so each warp
// instruction reads 256 (or 128) contiguous bytes and writes 512 contiguous bytes, and a
// thread has all its loads in flight before its first conversion:
//   kUnitsPerThread 8 -> 64 FP8 bytes (+ 8 scales) per thread, 16 KiB per 256-thread block.
// Both operands of a GEMM share one launch: blocks [0, first_block[1]) decode job 0, the rest
// job 1.

constexpr int kUnit = 8;             // elements per unit (one 16-byte BF16 store)
constexpr int kUnitsPerThread = 8;   // units per thread, all loaded before the first store
constexpr int kDecodeThreads = 256;  // threads per decode block
constexpr std::int64_t kUnitsPerBlock = std::int64_t{kDecodeThreads} * kUnitsPerThread;
static_assert(kUnit == 8, "one unit is one 16-byte store of 8 BF16 values");

// Where a unit's block scale(s) come from.
enum class ScaleSpan : std::int32_t {
  none,        // per-tensor FP8: no block scale
  unit,        // block_cols >= 8: one scale covers the unit
  contiguous,  // byte scales, block_cols == 1, not transposed: 8 consecutive scale bytes
  element,     // anything else: one scale load per element
};

// One decoder variant (code x block scale x scale span), chosen on the host per operand.
enum class Variant : std::int32_t {
  e4m3, e5m2,
  e4m3_e8m0_unit, e5m2_e8m0_unit, e4m3_e8m0_contiguous, e5m2_e8m0_contiguous,
  e4m3_e8m0_element, e5m2_e8m0_element,
  e4m3_f32_unit, e5m2_f32_unit, e4m3_f32_element, e5m2_f32_element,
  e2m1_unit, e2m1_element,
};

struct UnitJob {
  StoredOperand op;
  std::uint16_t* dst;
  std::int64_t units;  // rows * cols / 8
  Variant variant;
  bool check;
};

// Both operands of one launch (passed as a __grid_constant__ parameter: blocks index it
// without a local copy).
struct UnitBatch {
  UnitJob job[2];
  std::int64_t first_block[2];  // first_block[0] = 0
  Scalars scalars;
  ExactnessFlag flag;
};

// Four E2M1 codes (element i in bits 4i..4i+3 of c) -> four BF16 values, two per word
// (element 0 in the low half of .x). Table lookups by byte permutation: the 3-bit magnitude
// index selects the high byte (0x00, 0x3F x3, 0x40 x4) and the low byte (0x00, 0x00, 0x80,
// 0xC0, 0x00, 0x40, 0x80, 0xC0) of 0, 0.5, 1, 1.5, 2, 3, 4, 6 in BF16; the sign bits are moved
// to bit 7 of each high byte.
__device__ __forceinline__ uint2 e2m1x4_to_bf16x4(std::uint32_t c) {
  const std::uint32_t index = c & 0x7777u;
  std::uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, index);
  const std::uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, index);
  // Bytes [c0, c0, c1, c1]: the signs of elements 0 and 2 sit at bit 3 of bytes 0 and 2, those
  // of elements 1 and 3 at bit 7 of bytes 1 and 3.
  const std::uint32_t spread = __byte_perm(c, 0u, 0x1100u);
  hi |= ((spread << 4) & 0x00800080u) | (spread & 0x80008000u);
  return make_uint2(__byte_perm(lo, hi, 0x5140u), __byte_perm(lo, hi, 0x7362u));
}

// Two BF16 values times one BF16 scale (both halves of s2), as one bf16x2 multiply. Used only
// where the product is exact (E2M1 codes times E4M3 block scales), so its rounding never
// matters.
__device__ __forceinline__ std::uint32_t bf16x2_mul(std::uint32_t x, std::uint32_t s2) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&x),
                                   *reinterpret_cast<const __nv_bfloat162*>(&s2));
  return *reinterpret_cast<const std::uint32_t*>(&r);
}

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

__device__ __forceinline__ std::int64_t scale_index(const StoredOperand& op, std::int64_t bp, std::int64_t bq) {
  return op.scale_transposed ? bq * op.scale_ld + bp : bp * op.scale_ld + bq;
}

// The raw bits of a scale (a byte, or the FP32 bits).
template <BlockScale S>
__device__ __forceinline__ std::uint32_t load_scale_raw(const StoredOperand& op, std::int64_t idx) {
  if constexpr (S == BlockScale::f32)
    return __float_as_uint(__ldg(static_cast<const float*>(op.scales) + idx));
  else
    return __ldg(static_cast<const std::uint8_t*>(op.scales) + idx);
}

template <BlockScale S>
__device__ __forceinline__ float load_scale(const StoredOperand& op, std::int64_t bp, std::int64_t bq) {
  return scale_value<S>(load_scale_raw<S>(op, scale_index(op, bp, bq)));
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
  for (int i = 0; i < 2; ++i) f[i] = factor_value(s.factor[i]);
  const float alpha = s.alpha * (f[0] * f[1]);
  s.out[0] = alpha;  // a GEMM that writes the output
  s.out[1] = s.beta;
  s.out[2] = alpha;  // a GEMM that writes the FP32 product buffer
  s.out[3] = 0.0f;
}

__global__ void write_scalars_kernel(Scalars s) { write_scalars_now(s); }

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

// Lowest code bit 2^-9 (E4M3) or 2^-16 (E5M2): a scale of at least 2^-124 or 2^-117 (biased
// exponent 3 or 10) keeps the products on BF16's grid.
template <Code C>
constexpr std::uint32_t kMinExactExponent = C == Code::e4m3 ? 3u : 10u;

// Whether some finite value of v[0..7] has bits below BF16's 16 high ones. The common case
// (no low bits at all) costs one OR per element.
__device__ __forceinline__ bool inexact8(const float* v) {
  std::uint32_t low = 0;
#pragma unroll
  for (int e = 0; e < kUnit; ++e) low |= __float_as_uint(v[e]) & 0xFFFFu;
  if (low == 0) return false;
  bool miss = false;
#pragma unroll
  for (int e = 0; e < kUnit; ++e) {
    const std::uint32_t u = __float_as_uint(v[e]);
    miss |= (u & 0xFFFFu) != 0 && (u & 0x7F800000u) != 0x7F800000u;  // NaN and inf are exact
  }
  return miss;
}

__device__ __forceinline__ uint4 pack8(const float* v) {
  return make_uint4(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]), bf16x2_bits(v[4], v[5]),
                    bf16x2_bits(v[6], v[7]));
}

// The units [first, first + kUnitsPerBlock) of one job, kUnitsPerThread per thread: all code
// (and scale) loads first, then the conversions and the 16-byte stores.
template <Code C, BlockScale S, ScaleSpan Span>
__device__ __forceinline__ void decode_units(const UnitJob& job, std::int64_t first, const ExactnessFlag& flag) {
  const StoredOperand& op = job.op;
  constexpr bool kFp4 = C == Code::e2m1;
  using Raw = std::conditional_t<kFp4, std::uint32_t, uint2>;  // the codes of one unit
  Raw raw[kUnitsPerThread];
  std::uint32_t scale_raw[kUnitsPerThread];  // ScaleSpan::unit
  uint2 scale_bytes[kUnitsPerThread];        // ScaleSpan::contiguous
#pragma unroll
  for (int u = 0; u < kUnitsPerThread; ++u) {
    const std::int64_t unit = first + threadIdx.x + std::int64_t{kDecodeThreads} * u;
    if (unit >= job.units) break;
    const std::int64_t e = unit * kUnit;  // element offset (rows are whole units)
    if constexpr (kFp4)
      raw[u] = __ldg(reinterpret_cast<const std::uint32_t*>(static_cast<const std::uint8_t*>(op.data) + e / 2));
    else
      raw[u] = __ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(op.data) + e));
    if constexpr (Span == ScaleSpan::unit || Span == ScaleSpan::contiguous) {
      std::int64_t p, q0;
      divmod(e, op.cols, p, q0);
      const std::int64_t bp = p >> op.block_rows_log2;
      if constexpr (Span == ScaleSpan::unit)
        scale_raw[u] = load_scale_raw<S>(op, scale_index(op, bp, q0 >> op.block_cols_log2));
      else
        scale_bytes[u] = __ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(op.scales) +
                                                              bp * op.scale_ld + q0));
    }
  }
  bool miss = false;
#pragma unroll
  for (int u = 0; u < kUnitsPerThread; ++u) {
    const std::int64_t unit = first + threadIdx.x + std::int64_t{kDecodeThreads} * u;
    if (unit >= job.units) break;
    uint4 out;
    if constexpr (kFp4 && Span == ScaleSpan::unit) {
      // q * s is exact in BF16 (at most 2 x 4 significant bits): multiply in BF16.
      const std::uint32_t s = bf16_bits(scale_value<S>(scale_raw[u]));
      const std::uint32_t s2 = s | (s << 16);
      const uint2 w0 = e2m1x4_to_bf16x4(raw[u] & 0xFFFFu), w1 = e2m1x4_to_bf16x4(raw[u] >> 16);
      out = make_uint4(bf16x2_mul(w0.x, s2), bf16x2_mul(w0.y, s2), bf16x2_mul(w1.x, s2), bf16x2_mul(w1.y, s2));
    } else {
      float v[kUnit];
      if constexpr (kFp4) {
#pragma unroll
        for (int e = 0; e < kUnit; ++e) v[e] = e2m1_to_f32((raw[u] >> (4 * e)) & 0xFu);
      } else {
        const std::uint32_t words[2] = {raw[u].x, raw[u].y};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float2 lo = fp8x2_to_f32x2<C>(static_cast<std::uint16_t>(words[k] & 0xFFFFu));
          const float2 hi = fp8x2_to_f32x2<C>(static_cast<std::uint16_t>(words[k] >> 16));
          v[4 * k] = lo.x, v[4 * k + 1] = lo.y, v[4 * k + 2] = hi.x, v[4 * k + 3] = hi.y;
        }
      }
      if constexpr (Span == ScaleSpan::unit) {
        const float s = scale_value<S>(scale_raw[u]);
#pragma unroll
        for (int e = 0; e < kUnit; ++e) v[e] = v[e] * s;
        if (job.check && !scale_proves_exact(s, kMinExactExponent<C>)) miss |= inexact8(v);
      } else if constexpr (Span == ScaleSpan::contiguous) {
        const std::uint32_t bytes[2] = {scale_bytes[u].x, scale_bytes[u].y};
#pragma unroll
        for (int e = 0; e < kUnit; ++e) v[e] = v[e] * scale_value<S>((bytes[e / 4] >> (8 * (e % 4))) & 0xFFu);
        if (job.check) miss |= inexact8(v);
      } else if constexpr (Span == ScaleSpan::element) {  // rare layouts: scales loaded here
        std::int64_t p, q0;
        divmod(unit * kUnit, op.cols, p, q0);
        const std::int64_t bp = p >> op.block_rows_log2;
#pragma unroll
        for (int e = 0; e < kUnit; ++e) v[e] = v[e] * load_scale<S>(op, bp, (q0 + e) >> op.block_cols_log2);
        if (job.check) miss |= inexact8(v);
      }
      out = pack8(v);
    }
    reinterpret_cast<uint4*>(job.dst)[unit] = out;
  }
  if (miss) *flag.word = flag.epoch;
}

__device__ __forceinline__ void decode_job(const UnitJob& job, std::int64_t first, const ExactnessFlag& flag) {
  switch (job.variant) {
    case Variant::e4m3: return decode_units<Code::e4m3, BlockScale::none, ScaleSpan::none>(job, first, flag);
    case Variant::e5m2: return decode_units<Code::e5m2, BlockScale::none, ScaleSpan::none>(job, first, flag);
    case Variant::e4m3_e8m0_unit:
      return decode_units<Code::e4m3, BlockScale::e8m0, ScaleSpan::unit>(job, first, flag);
    case Variant::e5m2_e8m0_unit:
      return decode_units<Code::e5m2, BlockScale::e8m0, ScaleSpan::unit>(job, first, flag);
    case Variant::e4m3_e8m0_contiguous:
      return decode_units<Code::e4m3, BlockScale::e8m0, ScaleSpan::contiguous>(job, first, flag);
    case Variant::e5m2_e8m0_contiguous:
      return decode_units<Code::e5m2, BlockScale::e8m0, ScaleSpan::contiguous>(job, first, flag);
    case Variant::e4m3_e8m0_element:
      return decode_units<Code::e4m3, BlockScale::e8m0, ScaleSpan::element>(job, first, flag);
    case Variant::e5m2_e8m0_element:
      return decode_units<Code::e5m2, BlockScale::e8m0, ScaleSpan::element>(job, first, flag);
    case Variant::e4m3_f32_unit:
      return decode_units<Code::e4m3, BlockScale::f32, ScaleSpan::unit>(job, first, flag);
    case Variant::e5m2_f32_unit:
      return decode_units<Code::e5m2, BlockScale::f32, ScaleSpan::unit>(job, first, flag);
    case Variant::e4m3_f32_element:
      return decode_units<Code::e4m3, BlockScale::f32, ScaleSpan::element>(job, first, flag);
    case Variant::e5m2_f32_element:
      return decode_units<Code::e5m2, BlockScale::f32, ScaleSpan::element>(job, first, flag);
    case Variant::e2m1_unit: return decode_units<Code::e2m1, BlockScale::e4m3, ScaleSpan::unit>(job, first, flag);
    case Variant::e2m1_element:
      return decode_units<Code::e2m1, BlockScale::e4m3, ScaleSpan::element>(job, first, flag);
  }
}

__global__ void __launch_bounds__(kDecodeThreads) decode_units_kernel(const __grid_constant__ UnitBatch batch) {
  if (batch.scalars.out && blockIdx.x == 0 && threadIdx.x == 0) write_scalars_now(batch.scalars);
  const int j = static_cast<std::int64_t>(blockIdx.x) < batch.first_block[1] ? 0 : 1;
  const std::int64_t first = (static_cast<std::int64_t>(blockIdx.x) - batch.first_block[j]) * kUnitsPerBlock;
  decode_job(batch.job[j], first, batch.flag);
}

// One element per thread, any shape (rows that are not whole units).
template <Code C, BlockScale S>
__global__ void decode1_kernel(StoredOperand op, std::uint16_t* __restrict__ dst, Scalars scalars, bool check,
                               ExactnessFlag flag) {
  if (scalars.out && blockIdx.x == 0 && threadIdx.x == 0) write_scalars_now(scalars);
  const std::int64_t n = op.rows * op.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  bool miss = false;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    std::int64_t p, q;
    divmod(i, op.cols, p, q);
    float v = load_code<C>(op, p, q);
    if constexpr (S != BlockScale::none)
      v = v * load_scale<S>(op, p >> op.block_rows_log2, q >> op.block_cols_log2);
    const std::uint32_t u = __float_as_uint(v);
    if (check) miss |= (u & 0xFFFFu) != 0 && (u & 0x7F800000u) != 0x7F800000u;
    dst[i] = static_cast<std::uint16_t>(bf16_bits(v));
  }
  if (miss) *flag.word = flag.epoch;
}

__global__ void inherit_misses_kernel(const std::uint32_t* a, const std::uint32_t* b, ExactnessFlag flag) {
  if ((a != nullptr && *a != 0) || (b != nullptr && *b != 0)) *flag.word = flag.epoch;
}

__global__ void copy_if_flagged_kernel(std::uint8_t* __restrict__ dst, const std::uint8_t* __restrict__ src,
                                       std::int64_t bytes, ExactnessFlag flag) {
  if (*flag.word != flag.epoch) return;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) % 16 == 0;
  std::int64_t done = 0;
  if (aligned) {
    const std::int64_t vectors = bytes / 16;
    for (std::int64_t i = first; i < vectors; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    done = vectors * 16;
  }
  for (std::int64_t i = done + first; i < bytes; i += stride) dst[i] = src[i];
}

// ---------------------------------------------------------------- the exact GEMM
//
// A persistent SIMT GEMM: each block computes 128 x 128 output tiles (tile t, t + gridDim.x,
// ...), 256 threads as 16 x 16, each thread 8 x 8 outputs (rows 4 ty + {0..3} and 64 + 4 ty +
// {0..3}, columns likewise with tx, so the shared-memory reads are float4s without bank
// conflicts). K advances 8 at a time: each thread decodes 4 elements of each operand into
// shared memory (the reference decode, per element), then 8 x 64 FMAs.

constexpr int kExactTile = 128;    // output tile edge
constexpr int kExactTileK = 8;     // K per shared-memory stage
constexpr int kExactThreads = 256; // 16 x 16 threads
constexpr int kExactPad = 4;       // row padding: conflict-free stores of K-major tiles
static_assert(kExactTile * kExactTileK == 4 * kExactThreads, "each thread decodes 4 elements per operand");


// Element (o, r) of the logical [outer, inner] operand, decoded as the plugins' reference
// dequantize does: NaN codes and NaN scales as they are, else code * scale (* factor).
__device__ float exact_element(const ExactOperand& x, float factor, std::int64_t o, std::int64_t r) {
  const StoredOperand& s = x.stored;
  const std::int64_t p = x.k_major ? o : r, q = x.k_major ? r : o;
  if (s.code == Code::bf16) return num::bf16_to_f32(static_cast<const std::uint16_t*>(s.data)[p * s.cols + q]);
  if (s.code == Code::e2m1) {
    const float code = load_code<Code::e2m1>(s, p, q);
    const float block = load_scale<BlockScale::e4m3>(s, p >> s.block_rows_log2, q >> s.block_cols_log2);
    if (num::is_nan(block)) return block;
    return (code * block) * factor;  // (q * s) * tensor factor
  }
  const float code = s.code == Code::e4m3 ? load_code<Code::e4m3>(s, p, q) : load_code<Code::e5m2>(s, p, q);
  if (num::is_nan(code)) return code;
  switch (s.scale) {
    case BlockScale::e8m0: {
      const float block = load_scale<BlockScale::e8m0>(s, p >> s.block_rows_log2, q >> s.block_cols_log2);
      return num::is_nan(block) ? block : code * block;
    }
    case BlockScale::f32:
      return code * load_scale<BlockScale::f32>(s, p >> s.block_rows_log2, q >> s.block_cols_log2);
    default: return code * factor;  // per-tensor: code * scale_inv
  }
}

// The [kExactTileK][kExactTile] stage of one operand: rows o0.. of the tile, K from k0.
__device__ __forceinline__ void load_exact_stage(float (*stage)[kExactTile + kExactPad], const ExactOperand& x,
                                                 float factor, std::int64_t o0, std::int64_t outer,
                                                 std::int64_t k0, std::int64_t k) {
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const int idx = threadIdx.x + kExactThreads * l;
    // Consecutive threads walk the stored array's contiguous dimension.
    const int o = x.k_major ? idx / kExactTileK : idx % kExactTile;
    const int r = x.k_major ? idx % kExactTileK : idx / kExactTile;
    const bool inside = o0 + o < outer && k0 + r < k;
    stage[r][o] = inside ? exact_element(x, factor, o0 + o, k0 + r) : 0.0f;
  }
}

__global__ void __launch_bounds__(kExactThreads) exact_gemm_kernel(const __grid_constant__ ExactGemm g,
                                                                   ExactnessFlag flag) {
  if (*flag.word != flag.epoch) return;
  __shared__ __align__(16) float as[kExactTileK][kExactTile + kExactPad];
  __shared__ __align__(16) float bs[kExactTileK][kExactTile + kExactPad];
  const float fa = factor_value(g.a.factor), fb = factor_value(g.b.factor);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int64_t tiles_n = (g.n + kExactTile - 1) / kExactTile;
  const std::int64_t tiles = (g.m + kExactTile - 1) / kExactTile * tiles_n;
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t i0 = tile / tiles_n * kExactTile, j0 = tile % tiles_n * kExactTile;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    for (std::int64_t k0 = 0; k0 < g.k; k0 += kExactTileK) {
      load_exact_stage(as, g.a, fa, i0, g.m, k0, g.k);
      load_exact_stage(bs, g.b, fb, j0, g.n, k0, g.k);
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kExactTileK; ++kk) {
        const float4 a0 = *reinterpret_cast<const float4*>(&as[kk][4 * ty]);
        const float4 a1 = *reinterpret_cast<const float4*>(&as[kk][64 + 4 * ty]);
        const float4 b0 = *reinterpret_cast<const float4*>(&bs[kk][4 * tx]);
        const float4 b1 = *reinterpret_cast<const float4*>(&bs[kk][64 + 4 * tx]);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
        // Explicit FMAs (the build forbids contraction): FP32 accumulation as cuBLASLt's.
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
      }
      __syncthreads();
    }
    // The reference epilogue: alpha * AB, + old output, + bias, then round (gemm/gemm_cpu.cpp).
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::int64_t row = i0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + (i - 4));
      if (row >= g.m) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::int64_t col = j0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + (j - 4));
        if (col >= g.n) continue;
        const std::int64_t idx = row * g.n + col;
        float v = g.alpha * acc[i][j];
        if (g.out_bf16) {
          if (g.accumulate) v = v + num::bf16_to_f32(static_cast<const std::uint16_t*>(g.old)[idx]);
          if (g.bias) v = v + g.bias[col];
          static_cast<std::uint16_t*>(g.out)[idx] = num::f32_to_bf16(v);
        } else {
          if (g.accumulate) v = v + static_cast<const float*>(g.old)[idx];
          if (g.bias) v = v + g.bias[col];
          static_cast<float*>(g.out)[idx] = v;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- launchers

// The unit decoder for an operand, or false when its rows are not whole aligned units.
bool unit_variant(const StoredOperand& op, const std::uint16_t* dst, Variant& variant) {
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool fp4 = op.code == Code::e2m1;
  if (op.cols % kUnit != 0 || address(dst) % 16 != 0 || address(op.data) % (fp4 ? 4 : 8) != 0) return false;
  const bool e4 = op.code == Code::e4m3;
  const bool per_unit = op.block_cols_log2 >= 3;  // a block spans every unit it touches
  switch (op.scale) {
    case BlockScale::none:
      if (fp4) return false;
      variant = e4 ? Variant::e4m3 : Variant::e5m2;
      return true;
    case BlockScale::e8m0:
      if (fp4) return false;
      if (per_unit)
        variant = e4 ? Variant::e4m3_e8m0_unit : Variant::e5m2_e8m0_unit;
      else if (op.block_cols_log2 == 0 && !op.scale_transposed && op.scale_ld % 8 == 0 && address(op.scales) % 8 == 0)
        variant = e4 ? Variant::e4m3_e8m0_contiguous : Variant::e5m2_e8m0_contiguous;
      else
        variant = e4 ? Variant::e4m3_e8m0_element : Variant::e5m2_e8m0_element;
      return true;
    case BlockScale::f32:
      if (fp4) return false;
      variant = per_unit ? (e4 ? Variant::e4m3_f32_unit : Variant::e5m2_f32_unit)
                         : (e4 ? Variant::e4m3_f32_element : Variant::e5m2_f32_element);
      return true;
    case BlockScale::e4m3:
      if (!fp4) return false;
      variant = per_unit ? Variant::e2m1_unit : Variant::e2m1_element;
      return true;
  }
  return false;
}

template <Code C, BlockScale S>
void launch_decode1(const DecodeJob& job, const Scalars& scalars, const ExactnessFlag& flag, cudaStream_t stream) {
  const std::int64_t n = job.op.rows * job.op.cols;
  decode1_kernel<C, S><<<std::max(blocks_for(n), 1), kThreads, 0, stream>>>(job.op, job.dst, scalars, job.check,
                                                                          flag);
  check_launch("decode_to_bf16 (one element per thread)", n);
}

void decode1(const DecodeJob& job, const Scalars& scalars, const ExactnessFlag& flag, cudaStream_t stream) {
  const StoredOperand& op = job.op;
  const bool e4 = op.code == Code::e4m3;
  switch (op.code) {
    case Code::e2m1:
      if (op.scale == BlockScale::e4m3) return launch_decode1<Code::e2m1, BlockScale::e4m3>(job, scalars, flag, stream);
      break;
    case Code::e4m3:
    case Code::e5m2:
      switch (op.scale) {
        case BlockScale::none:
          return e4 ? launch_decode1<Code::e4m3, BlockScale::none>(job, scalars, flag, stream)
                    : launch_decode1<Code::e5m2, BlockScale::none>(job, scalars, flag, stream);
        case BlockScale::e8m0:
          return e4 ? launch_decode1<Code::e4m3, BlockScale::e8m0>(job, scalars, flag, stream)
                    : launch_decode1<Code::e5m2, BlockScale::e8m0>(job, scalars, flag, stream);
        case BlockScale::f32:
          return e4 ? launch_decode1<Code::e4m3, BlockScale::f32>(job, scalars, flag, stream)
                    : launch_decode1<Code::e5m2, BlockScale::f32>(job, scalars, flag, stream);
        case BlockScale::e4m3: break;
      }
      break;
    case Code::bf16: break;
  }
  QR_THROW_CODE(QR_STATUS_INTERNAL, "decode_to_bf16: no decoder for code ", static_cast<int>(op.code),
                " with block scale ", static_cast<int>(op.scale));
}

}  // namespace

// Multiprocessors of `device` (cached; 132, an H100's, if the query fails: only a grid size).
int multiprocessor_count(int device) {
  static std::atomic<int> counts[64] = {};
  if (device < 0 || device >= 64) return 132;
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();
      n = 132;
    }
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

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

void decode_to_bf16(const DecodeJob* jobs, int count, const Scalars& scalars, const ExactnessFlag& flag,
                    void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  QR_CHECK_CODE(count >= 0 && count <= 2, QR_STATUS_INTERNAL, "decode_to_bf16: ", count, " operands");
  Scalars pending = scalars;  // written by the first launch
  UnitBatch batch{};
  batch.flag = flag;
  int fused = 0;
  std::int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    const DecodeJob& job = jobs[i];
    QR_CHECK_CODE(!job.check || flag.word != nullptr, QR_STATUS_INTERNAL, "decode_to_bf16: a check needs a flag");
    if (job.op.rows * job.op.cols == 0) continue;
    Variant variant{};
    if (!unit_variant(job.op, job.dst, variant)) {
      decode1(job, pending, flag, s);
      pending.out = nullptr;
      continue;
    }
    UnitJob& u = batch.job[fused];
    u.op = job.op;
    u.dst = job.dst;
    u.units = job.op.rows * job.op.cols / kUnit;
    u.variant = variant;
    u.check = job.check;
    batch.first_block[fused] = blocks;
    blocks += (u.units + kUnitsPerBlock - 1) / kUnitsPerBlock;
    ++fused;
  }
  if (fused == 0) {
    if (pending.out) write_scalars(pending, stream);
    return;
  }
  if (fused == 1) batch.first_block[1] = blocks;  // every block decodes job 0
  batch.scalars = pending;
  QR_CHECK_CODE(blocks <= 0x7FFFFFFF, QR_STATUS_INTERNAL, "decode_to_bf16: ", blocks, " blocks");
  decode_units_kernel<<<static_cast<unsigned>(blocks), kDecodeThreads, 0, s>>>(batch);
  check_launch("decode_to_bf16", blocks * kUnitsPerBlock * kUnit);
}

void write_scalars(const Scalars& scalars, void* stream) {
  write_scalars_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(scalars);
  check_launch("write_scalars", 1);
}

void inherit_misses(const std::uint32_t* a, const std::uint32_t* b, const ExactnessFlag& flag, void* stream) {
  if (a == nullptr && b == nullptr) return;
  QR_CHECK_CODE(flag.word != nullptr, QR_STATUS_INTERNAL, "inherit_misses needs a flag");
  inherit_misses_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(a, b, flag);
  check_launch("inherit_misses", 1);
}

void copy_if_flagged(void* dst, const void* src, std::int64_t bytes, const ExactnessFlag& flag, void* stream) {
  if (bytes == 0) return;
  QR_CHECK_CODE(flag.word != nullptr, QR_STATUS_INTERNAL, "copy_if_flagged needs a flag");
  const int grid = std::max(1, std::min(blocks_for(bytes / 16 + 1), 1024));
  copy_if_flagged_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<std::uint8_t*>(dst), static_cast<const std::uint8_t*>(src), bytes, flag);
  check_launch("copy_if_flagged", bytes);
}

void exact_gemm_if_flagged(const ExactGemm& gemm, const ExactnessFlag& flag, int device, void* stream) {
  if (gemm.m == 0 || gemm.n == 0) return;
  QR_CHECK_CODE(flag.word != nullptr, QR_STATUS_INTERNAL, "exact_gemm_if_flagged needs a flag");
  QR_CHECK_CODE(!gemm.accumulate || gemm.old != nullptr, QR_STATUS_INTERNAL,
                "exact_gemm_if_flagged: accumulate needs the old output");
  const std::int64_t tiles = ((gemm.m + kExactTile - 1) / kExactTile) * ((gemm.n + kExactTile - 1) / kExactTile);
  const int grid = static_cast<int>(std::min<std::int64_t>(tiles, 2 * std::int64_t{multiprocessor_count(device)}));
  exact_gemm_kernel<<<grid, kExactThreads, 0, static_cast<cudaStream_t>(stream)>>>(gemm, flag);
  check_launch("exact_gemm_if_flagged", gemm.m * gemm.n);
}

}  // namespace qrecipe::detail::gemm_kernels
