// The small kernels around a grouped GEMM (see grouped_cuda_kernels.hpp).
//
// Map (docs/architecture.md, "Conventions", rule 11): device helpers (group lookup, element decode as the emulation and
// as the reference); the kernels (describe, decode layout + decode, K = 0 epilogue, output
// save, exact recompute); then the launchers. Compiled with the engine's numerics flags
// (-fmad=false, no FTZ): the decodes multiply exact values only, the exact recompute uses
// explicit FMAs like the dense one.
#include "gemm/cuda/grouped_cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "gemm/cuda/decode_values.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::detail::grouped {
namespace {

using gemm_kernels::ExactnessFlag;

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "launch of the grouped GEMM kernel ", kernel, " failed: ",
                cudaGetErrorName(status), " (", cudaGetErrorString(status), "); an earlier "
                "asynchronous error may also surface here: rerun with CUDA_LAUNCH_BLOCKING=1 "
                "to find it");
}

// ---------------------------------------------------------------- device helpers

__device__ __forceinline__ GroupOperand operand_of(const OperandSource& s, const GroupOperand* host,
                                                   int t, int g, const std::int64_t* offsets) {
  GroupOperand o;
  switch (s.source) {
    case Source::host: return host[t];
    case Source::plugin_table: {
      const qr_group_entry& e = s.entries[g];
      o.data = e.data;
      // A tensor scale_inv moves into alpha (the factor); block scales stay with the data.
      o.scales = s.factor == Factor::value ? nullptr : e.scale_inv;
      o.factor = s.factor == Factor::value        ? static_cast<const float*>(e.scale_inv)
                 : s.factor == Factor::from_amax  ? e.amax
                                                  : nullptr;
      o.rows = s.transposed ? s.cols : e.rows;
      o.cols = s.transposed ? e.rows : s.cols;
      o.ld = e.data_ld;
      o.scale_ld = e.scale_ld;
      return o;
    }
    case Source::dense_split: {
      const std::int64_t r0 = offsets[g];
      o.data = static_cast<const char*>(s.base) + r0 * s.cols * s.element_bytes;
      o.rows = offsets[g + 1] - r0;
      o.cols = s.cols;
      o.ld = s.cols;
      return o;
    }
  }
  return o;
}

__device__ __forceinline__ GroupOutput output_of(Source source, void* base, std::int32_t element_bytes,
                                                 std::int64_t cols, const GroupOutput* host, int t,
                                                 int g, const std::int64_t* offsets) {
  if (source == Source::host) return host[t];
  GroupOutput o;
  const std::int64_t r0 = offsets[g];
  o.data = static_cast<char*>(base) + r0 * cols * element_bytes;
  o.rows = offsets[g + 1] - r0;
  o.cols = cols;
  o.ld = cols;
  return o;
}

// The last group whose prefix is <= b (a group without tiles shares its prefix with the next,
// which then owns b), by binary search over prefix[0..groups).
__device__ __forceinline__ int find_group(const std::int64_t* prefix, int groups, std::int64_t b) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ std::int64_t scale_at(const OperandInfo& info, const GroupOperand& op,
                                                 std::int64_t p, std::int64_t q) {
  const std::int64_t bp = p >> info.block_rows_log2, bq = q >> info.block_cols_log2;
  return info.scale_transposed ? bq * op.scale_ld + bp : bp * op.scale_ld + bq;
}

__device__ __forceinline__ float block_scale(const OperandInfo& info, const GroupOperand& op,
                                             std::int64_t p, std::int64_t q) {
  const std::int64_t i = scale_at(info, op, p, q);
  switch (info.scale) {
    case BlockScale::e8m0:
      return gemm_kernels::scale_value<BlockScale::e8m0>(static_cast<const std::uint8_t*>(op.scales)[i]);
    case BlockScale::e4m3:
      return gemm_kernels::scale_value<BlockScale::e4m3>(static_cast<const std::uint8_t*>(op.scales)[i]);
    case BlockScale::f32: return static_cast<const float*>(op.scales)[i];
    case BlockScale::none: break;
  }
  return 1.0f;
}

// The stored code (p, q) as FP32 (exact).
__device__ __forceinline__ float code_at(const OperandInfo& info, const GroupOperand& op,
                                         std::int64_t p, std::int64_t q) {
  const auto* bytes = static_cast<const std::uint8_t*>(op.data);
  switch (info.code) {
    case Code::bf16: return num::bf16_to_f32(static_cast<const std::uint16_t*>(op.data)[p * op.ld + q]);
    case Code::e2m1: {
      const std::uint8_t byte = bytes[p * (op.ld / 2) + q / 2];
      return gemm_kernels::e2m1_to_f32((q & 1) ? byte >> 4 : byte & 0xFu);
    }
    case Code::e4m3: return gemm_kernels::fp8x2_to_f32x2<Code::e4m3>(bytes[p * op.ld + q]).x;
    case Code::e5m2: return gemm_kernels::fp8x2_to_f32x2<Code::e5m2>(bytes[p * op.ld + q]).x;
  }
  return 0.0f;
}

// What the emulation's decoders write for (p, q): the code times its block scale, no
// per-tensor factor (that is in alpha).
__device__ __forceinline__ float emulated_value(const OperandInfo& info, const GroupOperand& op,
                                                std::int64_t p, std::int64_t q) {
  const float code = code_at(info, op, p, q);
  return info.scale == BlockScale::none ? code : code * block_scale(info, op, p, q);
}

// What the plugins' reference dequantize gives for (p, q): NaN codes and NaN block scales as
// they are, else code * block scale, then the per-tensor factor (block and tensor scales: (q * s) * factor).
__device__ __forceinline__ float reference_value(const OperandInfo& info, const GroupOperand& op,
                                                 float factor, std::int64_t p, std::int64_t q) {
  const float code = code_at(info, op, p, q);
  if (info.code == Code::bf16) return code;
  if (info.code != Code::e2m1 && num::is_nan(code)) return code;
  if (info.scale == BlockScale::none) return code * factor;  // per-tensor: code * scale_inv
  const float block = block_scale(info, op, p, q);
  if (info.scale != BlockScale::f32 && num::is_nan(block)) return block;
  const float v = code * block;
  return info.factor == Factor::none ? v : v * factor;
}

// ---------------------------------------------------------------- describe

__global__ void describe_kernel(const DescribeArgs args, const __grid_constant__ HostTable host) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= args.count) return;
  const int g = args.first + t;
  args.table_a[g] = operand_of(args.a, host.a, t, g, args.offsets);
  args.table_b[g] = operand_of(args.b, host.b, t, g, args.offsets);
  args.table_out[g] = output_of(args.out.source, args.out.base, args.out.element_bytes,
                                args.out.cols, host.out, t, g, args.offsets);
  if (args.table_old)
    args.table_old[g] = output_of(args.out.source, args.old_base, args.out.element_bytes,
                                  args.out.cols, host.old, t, g, args.offsets);
}

// ---------------------------------------------------------------- decode

constexpr int kLayoutThreads = 1024;
constexpr int kTile = 64;                 // stored tile edge of the decode
constexpr int kDecodeThreads = 256;
constexpr int kPerThread = kTile * kTile / kDecodeThreads;  // 16 elements
constexpr int kDecodedAlign = 8;          // decoded rows padded to 16 bytes (8 BF16)

__device__ __forceinline__ std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// layout[0..groups] = prefix of decoded elements, layout[groups + 1 .. 2 groups + 1] = prefix of
// stored tiles; out[g] = the decoded group. One block: a chunked Hillis-Steele scan.
__global__ void __launch_bounds__(kLayoutThreads) decode_layout_kernel(const DecodeArgs args) {
  __shared__ std::int64_t elements[kLayoutThreads], tiles[kLayoutThreads];
  __shared__ std::int64_t carry[2];
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  std::int64_t* prefix_elements = args.layout;
  std::int64_t* prefix_tiles = args.layout + args.groups + 1;
  for (int base = 0; base < args.groups; base += kLayoutThreads) {
    const int g = base + static_cast<int>(threadIdx.x);
    std::int64_t e = 0, t = 0;
    GroupOperand in;
    if (g < args.groups) {
      in = args.in[g];
      const std::int64_t outer = outer_of(in, args.info.k_major), inner = inner_of(in, args.info.k_major);
      e = outer * ceil_div(inner, kDecodedAlign) * kDecodedAlign;
      t = ceil_div(in.rows, kTile) * ceil_div(in.cols, kTile);
    }
    __syncthreads();
    elements[threadIdx.x] = e;
    tiles[threadIdx.x] = t;
    __syncthreads();
    for (int step = 1; step < kLayoutThreads; step *= 2) {  // inclusive scan
      const std::int64_t pe = threadIdx.x >= step ? elements[threadIdx.x - step] : 0;
      const std::int64_t pt = threadIdx.x >= step ? tiles[threadIdx.x - step] : 0;
      __syncthreads();
      elements[threadIdx.x] += pe;
      tiles[threadIdx.x] += pt;
      __syncthreads();
    }
    if (g < args.groups) {
      const std::int64_t first_e = carry[0] + elements[threadIdx.x] - e;
      prefix_elements[g] = first_e;
      prefix_tiles[g] = carry[1] + tiles[threadIdx.x] - t;
      GroupOperand o;
      const std::int64_t outer = outer_of(in, args.info.k_major), inner = inner_of(in, args.info.k_major);
      o.rows = outer;
      o.cols = inner;
      o.ld = ceil_div(inner, kDecodedAlign) * kDecodedAlign;
      o.factor = in.factor;
      // A group that would not fit (the host sized dst for every split) gets no data: the
      // decode skips it and raises the flag, so the exact recompute writes its output.
      o.data = first_e + e <= args.dst_elements ? args.dst + first_e : nullptr;
      args.out[g] = o;
    }
    __syncthreads();
    if (threadIdx.x == kLayoutThreads - 1) {
      carry[0] += elements[kLayoutThreads - 1];
      carry[1] += tiles[kLayoutThreads - 1];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    prefix_elements[args.groups] = carry[0];
    prefix_tiles[args.groups] = carry[1];
  }
}

// ---- eight stored elements per access (the common case: 1-byte FP8 codes, 4-bit E2M1 pairs,
// BF16; rows and both arrays aligned for it). The same values as emulated_value: each code
// decoded alone, times the block scale the eight share (blocks of at least 8 columns).
constexpr int kVec = 8;
constexpr int kVecPerThread = kTile * kTile / kVec / kDecodeThreads;  // 2 vectors

__device__ __forceinline__ bool aligned(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Whether group (in -> out) can take the vector path: whole vectors share one block scale and
// every vector access is aligned (the stored rows, the decoded rows, both bases).
__device__ __forceinline__ bool vector_path(const OperandInfo& info, const GroupOperand& in,
                                            const GroupOperand& out) {
  if (out.data == nullptr || out.ld % kVec != 0 || !aligned(out.data, 16) || in.ld % kVec != 0) return false;
  if (info.scale != BlockScale::none && info.block_cols_log2 < 3) return false;
  switch (info.code) {
    case Code::e4m3:
    case Code::e5m2: return aligned(in.data, 8);
    case Code::e2m1: return aligned(in.data, 4);
    case Code::bf16: return aligned(in.data, 16);
  }
  return false;
}

// The eight codes of stored row p from column q (q a multiple of 8, all eight inside), as FP32.
__device__ __forceinline__ void codes8(const OperandInfo& info, const GroupOperand& op, std::int64_t p,
                                       std::int64_t q, float (&v)[kVec]) {
  const auto* bytes = static_cast<const std::uint8_t*>(op.data);
  switch (info.code) {
    case Code::e4m3:
    case Code::e5m2: {
      const uint2 w = *reinterpret_cast<const uint2*>(bytes + p * op.ld + q);
      const std::uint32_t words[2] = {w.x, w.y};
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const std::uint16_t code = (words[j / 4] >> (8 * (j % 4))) & 0xFFu;
        v[j] = info.code == Code::e4m3 ? gemm_kernels::fp8x2_to_f32x2<Code::e4m3>(code).x
                                       : gemm_kernels::fp8x2_to_f32x2<Code::e5m2>(code).x;
      }
      return;
    }
    case Code::e2m1: {
      const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(bytes + p * (op.ld / 2) + q / 2);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = gemm_kernels::e2m1_to_f32((w >> (4 * j)) & 0xFu);
      return;
    }
    case Code::bf16: {
      const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(op.data) + p * op.ld + q);
      const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        v[j] = num::bf16_to_f32(static_cast<std::uint16_t>((words[j / 2] >> (16 * (j % 2))) & 0xFFFFu));
      return;
    }
  }
}

__device__ __forceinline__ bool inexact_in_bf16(float v) {
  const std::uint32_t u = __float_as_uint(v);
  return (u & 0xFFFFu) != 0 && (u & 0x7F800000u) != 0x7F800000u;  // NaN, inf are exact
}

// Eight decoded values as eight BF16 in one 16-byte store.
__device__ __forceinline__ void store8(std::uint16_t* dst, const float (&v)[kVec]) {
  std::uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = gemm_kernels::bf16_bits(v[2 * j]) | (gemm_kernels::bf16_bits(v[2 * j + 1]) << 16);
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// The tile (p0, q0) of decode_kernel by vectors; returns whether a value missed BF16.
__device__ __forceinline__ bool decode_tile_vectors(const OperandInfo& info, const GroupOperand& in,
                                                    const GroupOperand& out, std::int64_t p0, std::int64_t q0,
                                                    float (&tile)[kTile][kTile + 1]) {
  auto* dst = static_cast<std::uint16_t*>(const_cast<void*>(out.data));  // vector_path: not null
  bool miss = false;
#pragma unroll
  for (int i = 0; i < kVecPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kDecodeThreads * i;
    const int r = idx / (kTile / kVec), c = idx % (kTile / kVec) * kVec;  // consecutive threads: consecutive vectors
    const std::int64_t p = p0 + r, q = q0 + c;
    float v[kVec];
    if (p < in.rows && q + kVec <= in.cols) {
      codes8(info, in, p, q, v);
      if (info.scale != BlockScale::none) {
        const float s = block_scale(info, in, p, q);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = v[j] * s;
      }
    } else {  // the tile's ragged edge: element by element
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = p < in.rows && q + j < in.cols ? emulated_value(info, in, p, q + j) : 0.0f;
    }
    if (info.check && p < in.rows) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) miss |= q + j < in.cols && inexact_in_bf16(v[j]);
    }
    if (info.k_major) {
      if (p < in.rows) {
        if (q + kVec <= in.cols) {
          store8(dst + p * out.ld + q, v);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            if (q + j < in.cols) dst[p * out.ld + q + j] = static_cast<std::uint16_t>(gemm_kernels::bf16_bits(v[j]));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) tile[r][c + j] = v[j];
    }
  }
  if (!info.k_major) {
    __syncthreads();
    // Decoded row = stored column q, decoded column = stored row p: eight stored rows per store.
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int idx = static_cast<int>(threadIdx.x) + kDecodeThreads * i;
      const int c = idx / (kTile / kVec), r = idx % (kTile / kVec) * kVec;
      const std::int64_t p = p0 + r, q = q0 + c;
      if (q >= in.cols) continue;
      float v[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = tile[r + j][c];
      if (p + kVec <= in.rows) {
        store8(dst + q * out.ld + p, v);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (p + j < in.rows) dst[q * out.ld + p + j] = static_cast<std::uint16_t>(gemm_kernels::bf16_bits(v[j]));
      }
    }
  }
  return miss;
}

// One 64 x 64 tile of one group's stored array per block, decoded and written K-major: as it
// is when the array is K-major, transposed through shared memory otherwise.
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(const DecodeArgs args) {
  __shared__ float tile[kTile][kTile + 1];
  const std::int64_t* prefix_tiles = args.layout + args.groups + 1;
  const std::int64_t b = blockIdx.x;
  if (b >= prefix_tiles[args.groups]) return;
  const int g = find_group(prefix_tiles, args.groups, b);
  const GroupOperand in = args.in[g];
  const GroupOperand out = args.out[g];
  const std::int64_t local = b - prefix_tiles[g];
  const std::int64_t tiles_c = ceil_div(in.cols, kTile);
  const std::int64_t p0 = local / tiles_c * kTile, q0 = local % tiles_c * kTile;
  if (vector_path(args.info, in, out)) {
    if (decode_tile_vectors(args.info, in, out, p0, q0, tile)) *args.flag.word = args.flag.epoch;
    return;
  }
  auto* dst = static_cast<std::uint16_t*>(const_cast<void*>(out.data));
  bool miss = dst == nullptr;
  const bool k_major = args.info.k_major;
#pragma unroll 4
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + kDecodeThreads * i;
    const int r = idx / kTile, c = idx % kTile;  // consecutive threads: consecutive stored columns
    const std::int64_t p = p0 + r, q = q0 + c;
    float v = 0.0f;
    if (p < in.rows && q < in.cols) {
      v = emulated_value(args.info, in, p, q);
      if (args.info.check) miss |= inexact_in_bf16(v);
      if (k_major && dst) dst[p * out.ld + q] = static_cast<std::uint16_t>(gemm_kernels::bf16_bits(v));
    }
    if (!k_major) tile[r][c] = v;
  }
  if (!k_major) {
    __syncthreads();
    // Decoded row = stored column q, decoded column = stored row p.
#pragma unroll 4
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = static_cast<int>(threadIdx.x) + kDecodeThreads * i;
      const int c = idx / kTile, r = idx % kTile;
      const std::int64_t p = p0 + r, q = q0 + c;
      if (dst && p < in.rows && q < in.cols)
        dst[q * out.ld + p] = static_cast<std::uint16_t>(gemm_kernels::bf16_bits(tile[r][c]));
    }
  }
  if (miss) *args.flag.word = args.flag.epoch;
}

// ---------------------------------------------------------------- K = 0, saves

constexpr int kEpilogueThreads = 256;
constexpr int kMaxBlocksPerGroup = 64;

__device__ __forceinline__ void store_out(const GroupOutput& o, std::int64_t i, std::int64_t j,
                                          bool bf16, float v) {
  if (bf16) static_cast<std::uint16_t*>(o.data)[i * o.ld + j] = num::f32_to_bf16(v);
  else static_cast<float*>(o.data)[i * o.ld + j] = v;
}

__device__ __forceinline__ float load_out(const GroupOutput& o, std::int64_t i, std::int64_t j, bool bf16) {
  if (bf16) return num::bf16_to_f32(static_cast<const std::uint16_t*>(o.data)[i * o.ld + j]);
  return static_cast<const float*>(o.data)[i * o.ld + j];
}

__global__ void __launch_bounds__(kEpilogueThreads) empty_sums_kernel(const EmptySumArgs args) {
  const int g = static_cast<int>(blockIdx.y);
  if (inner_of(args.a[g], args.a_k_major) != 0) return;
  const GroupOutput o = args.out[g];
  const std::int64_t n = o.rows * o.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t i = e / o.cols, j = e % o.cols;
    float v = args.alpha * 0.0f;  // the empty sum is +0
    if (args.accumulate) v = v + load_out(o, i, j, args.out_bf16);
    store_out(o, i, j, args.out_bf16, v);
  }
}

__global__ void __launch_bounds__(kEpilogueThreads)
    save_outputs_kernel(const GroupOutput* out, const GroupOutput* old, bool bf16, ExactnessFlag flag) {
  if (*flag.word != flag.epoch) return;
  const int g = static_cast<int>(blockIdx.y);
  const GroupOutput o = out[g], s = old[g];
  const std::int64_t n = o.rows * o.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t i = e / o.cols, j = e % o.cols;
    if (bf16) static_cast<std::uint16_t*>(s.data)[i * s.ld + j] = static_cast<const std::uint16_t*>(o.data)[i * o.ld + j];
    else static_cast<float*>(s.data)[i * s.ld + j] = static_cast<const float*>(o.data)[i * o.ld + j];
  }
}

// ---------------------------------------------------------------- exact recompute
//
// A persistent SIMT GEMM over every group's 64 x 64 output tiles (the groups' tiles counted in
// order, tile t handled by block t mod grid): 256 threads as 16 x 16, 4 x 4 outputs each, K in
// steps of 16 through shared memory, every element decoded as the reference decodes it.

constexpr int kExactTile = 64;
constexpr int kExactK = 16;
constexpr int kExactThreads = 256;

__device__ __forceinline__ void exact_stage(float (*stage)[kExactTile + 1], const OperandInfo& info,
                                            const GroupOperand& op, float factor, std::int64_t o0,
                                            std::int64_t outer, std::int64_t k0, std::int64_t k) {
  for (int idx = static_cast<int>(threadIdx.x); idx < kExactTile * kExactK; idx += kExactThreads) {
    const int o = info.k_major ? idx / kExactK : idx % kExactTile;
    const int r = info.k_major ? idx % kExactK : idx / kExactTile;
    const std::int64_t go = o0 + o, gr = k0 + r;
    float v = 0.0f;
    if (go < outer && gr < k)
      v = info.k_major ? reference_value(info, op, factor, go, gr) : reference_value(info, op, factor, gr, go);
    stage[r][o] = v;
  }
}

__global__ void __launch_bounds__(kExactThreads) exact_grouped_kernel(const ExactGroupedArgs args) {
  if (*args.flag.word != args.flag.epoch) return;
  __shared__ float as[kExactK][kExactTile + 1];
  __shared__ float bs[kExactK][kExactTile + 1];
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  std::int64_t first_tile = 0;
  for (int g = 0; g < args.groups; ++g) {
    const GroupOperand a = args.a[g], b = args.b[g];
    const GroupOutput out = args.out[g];
    const std::int64_t m = out.rows, n = out.cols, k = inner_of(a, args.info_a.k_major);
    const std::int64_t tiles_n = (n + kExactTile - 1) / kExactTile;
    const std::int64_t tiles = (m + kExactTile - 1) / kExactTile * tiles_n;
    const float fa = gemm_kernels::factor_value({args.info_a.factor, a.factor, args.info_a.numerator});
    const float fb = gemm_kernels::factor_value({args.info_b.factor, b.factor, args.info_b.numerator});
    // This block's first tile of the group: the next t >= first_tile with t % grid == block.
    std::int64_t t = first_tile + ((blockIdx.x - first_tile % gridDim.x) + gridDim.x) % gridDim.x;
    for (; t < first_tile + tiles; t += gridDim.x) {
      const std::int64_t local = t - first_tile;
      const std::int64_t i0 = local / tiles_n * kExactTile, j0 = local % tiles_n * kExactTile;
      float acc[4][4] = {};
      for (std::int64_t k0 = 0; k0 < k; k0 += kExactK) {
        exact_stage(as, args.info_a, a, fa, i0, m, k0, k);
        exact_stage(bs, args.info_b, b, fb, j0, n, k0, k);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kExactK; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              acc[i][j] = __fmaf_rn(as[kk][ty + 16 * i], bs[kk][tx + 16 * j], acc[i][j]);
        __syncthreads();
      }
      // The reference epilogue: alpha * AB, + old output, then one rounding.
      for (int i = 0; i < 4; ++i) {
        const std::int64_t row = i0 + ty + 16 * i;
        if (row >= m) continue;
        for (int j = 0; j < 4; ++j) {
          const std::int64_t col = j0 + tx + 16 * j;
          if (col >= n) continue;
          float v = args.alpha * acc[i][j];
          if (args.accumulate) v = v + load_out(args.old[g], row, col, args.out_bf16);
          store_out(out, row, col, args.out_bf16, v);
        }
      }
    }
    first_tile += tiles;
  }
}

unsigned blocks_per_group(std::int64_t max_elements) {
  const std::int64_t blocks = (max_elements + kEpilogueThreads * 4 - 1) / (kEpilogueThreads * 4);
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocksPerGroup));
}

}  // namespace

// ---------------------------------------------------------------- launchers

void describe(const DescribeArgs& args, const HostTable& host, void* stream) {
  QR_CHECK_CODE(args.count >= 1 && args.count <= kHostGroupsPerLaunch, QR_STATUS_INTERNAL,
                "grouped describe: ", args.count, " groups in one launch");
  describe_kernel<<<1, kHostGroupsPerLaunch, 0, static_cast<cudaStream_t>(stream)>>>(args, host);
  check_launch("describe");
}

void decode_to_bf16(const DecodeArgs& args, void* stream) {
  if (args.groups == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  decode_layout_kernel<<<1, kLayoutThreads, 0, s>>>(args);
  check_launch("decode layout");
  if (args.max_tiles == 0) return;
  QR_CHECK_CODE(args.max_tiles <= 0x7FFFFFFF, QR_STATUS_INTERNAL, "grouped decode: ", args.max_tiles,
                " tiles");
  decode_kernel<<<static_cast<unsigned>(args.max_tiles), kDecodeThreads, 0, s>>>(args);
  check_launch("decode_to_bf16");
}

void finish_empty_sums(const EmptySumArgs& args, void* stream) {
  if (args.groups == 0 || args.max_elements == 0) return;
  const dim3 grid(blocks_per_group(args.max_elements), static_cast<unsigned>(args.groups));
  empty_sums_kernel<<<grid, kEpilogueThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  check_launch("finish_empty_sums");
}

void save_outputs_if_flagged(const GroupOutput* out, const GroupOutput* old, int groups,
                             bool out_bf16, std::int64_t max_elements,
                             const gemm_kernels::ExactnessFlag& flag, void* stream) {
  if (groups == 0 || max_elements == 0) return;
  const dim3 grid(blocks_per_group(max_elements), static_cast<unsigned>(groups));
  save_outputs_kernel<<<grid, kEpilogueThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, old,
                                                                                       out_bf16, flag);
  check_launch("save_outputs_if_flagged");
}

void exact_grouped_if_flagged(const ExactGroupedArgs& args, void* stream) {
  if (args.groups == 0) return;
  QR_CHECK_CODE(!args.accumulate || args.old != nullptr, QR_STATUS_INTERNAL,
                "exact grouped GEMM: accumulate needs the saved outputs");
  exact_grouped_kernel<<<2 * gemm_kernels::multiprocessor_count(args.device), kExactThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(args);
  check_launch("exact_grouped_if_flagged");
}

}  // namespace qrecipe::detail::grouped
