// The quantize tile of mxfp8, shared by the kernels of mxfp8_kernels.cu (one tensor) and
// mxfp8_grouped_kernels.cu (every group of a grouped call in one launch), so both run the same
// per-block code: the element codes, the CTA tile geometry, the kernel parameters and their
// host-side setup, and quantize_cta_tile (one 32 x 256 CTA tile, both directions). Moved here
// unchanged from mxfp8_kernels.cu. CUDA only (nvcc).
//
// Exactness: as mxfp8_kernels.cu says (the block exponent, the element scaling and the decode
// are the QR_HD functions of mxfp8_numerics.hpp that the reference calls too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "mxfp8_kernels.hpp"
#include "mxfp8_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::mxfp8::cuda {

// Shared helpers of the tile code (qrecipe/cuda_sdk.cuh).
using sdk::cuda::amax_of;
using sdk::cuda::as_stream;
using sdk::cuda::BF16In;
using sdk::ceil_div;
using sdk::cuda::decode_raw8;
using sdk::cuda::DeviceGuard;
using sdk::cuda::Directions;  // one kernel instance per direction request
using sdk::cuda::F16In;
using sdk::cuda::F32In;
using sdk::cuda::has_columnwise;
using sdk::cuda::has_rowwise;
using sdk::cuda::is_aligned;
using sdk::cuda::load_raw8;
using sdk::cuda::Raw8;
using sdk::cuda::store_bytes8;
using sdk::cuda::valid_in_run;

// FP8 element types: which encoder and which fl32(1/fmax).
struct E4M3Codes {
  static constexpr bool kE4M3 = true;
  static constexpr float kRcp = num_mx::kRcpE4M3;
};
struct E5M2Codes {
  static constexpr bool kE4M3 = false;
  static constexpr float kRcp = num_mx::kRcpE5M2;
};

// No per-tensor cast beside the MX directions (the Cast parameter of the tile code; a cast is
// E4M3Codes or E5M2Codes, whose kE4M3 picks the encoder).
struct NoCast {};

inline constexpr int kBlock = 32;  // elements per MX block (ref::kBlockSize)

// Fused quantize. A warp quantizes a 32 x 32 warp tile (layout: the warp tile section of
// cuda_sdk.cuh: lane 4 rg + cg holds rows 4 rg .., columns 8 cg ..), so a 1x32 rowwise block
// is one row of 4 lanes and a 32x1 columnwise block one column of 8 lanes: both amaxes are
// warp shuffles. A CTA is kWarps warps side by side (a 32 x 256 CTA tile); the one-tensor grid
// is (column tiles, row tiles), the grouped one every group's tiles in a row. The rowwise
// scales of the CTA tile are collected in shared memory and stored at the end, one 8-byte word
// (the kWarps scales of a row) per row.
// CTA tiles that lie inside the tensor with every buffer aligned (all but the edges of the
// tensors the GEMMs use) run a path without bounds checks or scalar fallbacks: fewer
// instructions between a warp's loads and its stores.
template <class In, Directions D>
struct QuantizeTile {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 32;
  static constexpr int kCols = 32 * kWarps;  // 256
  // CTAs an SM (registers: 65536 / (kThreads * kMinBlocksPerSM) a thread). One direction:
  // 4 (64 registers, 32 warps an SM). Both: 3 (80 registers); at 4 the bf16 instance spills
  // and ran 0.66 of the copy ceiling instead of 0.85 (H100, 8192 x 8192), and 5 for rowwise
  // (48 registers) measured 0.941 / 0.970 against 0.954 / 0.984 at 4. f32 runs hold twice the
  // source registers: 3.
  static constexpr int kMinBlocksPerSM = sizeof(typename In::Storage) == 4 ? 3
                                         : D == Directions::kBoth          ? 3
                                                                           : 4;
  static_assert(kBlock == 32, "a warp tile is one block high and one block wide");
  static_assert(kWarps == 8, "a CTA row of rowwise scales is one 8-byte word");
};

template <class In>
struct QuantizeParams {
  const typename In::Storage* src;
  std::int64_t rows, cols;
  std::int64_t row_tiles;      // ceil(rows / kRows)
  std::uint8_t* rowwise_data;  // nullptr: rowwise not requested
  std::uint8_t* rowwise_scale;
  std::int64_t rowwise_scale_ld;
  std::uint8_t* columnwise_data;  // nullptr: columnwise not requested
  std::uint8_t* columnwise_scale;
  std::int64_t columnwise_scale_ld;
  bool load_aligned;              // cols % 8 == 0 and src 16-byte aligned
  bool rowwise_store_aligned;     // cols % 8 == 0 and rowwise data 8-byte aligned
  bool columnwise_store_aligned;  // cols % 8 == 0 and columnwise data 8-byte aligned
  bool rowwise_scale_aligned;     // rowwise_scale_ld % 8 == 0 and rowwise scale 8-byte aligned
  bool all_aligned;               // every flag above that the request uses
  // The per-tensor cast of QuantizeArgs::cast (mxfp8_kernels.hpp; kernels with a Cast only):
  // data [rows, cols] and where its scale comes from.
  std::uint8_t* cast_data;
  const float* cast_scale;
  const float* cast_amax;
  float cast_fmax;
  bool cast_pow2_scales;
  float cast_amax_epsilon;
  bool cast_store_aligned;        // cols % 8 == 0 and cast data 8-byte aligned
  // Decoded outputs (kernels with kDecoded only; QuantizeArgs::*_decoded): BF16 [rows, cols].
  std::uint16_t* rowwise_decoded;
  std::uint32_t* rowwise_miss;
  std::uint16_t* columnwise_decoded;
  std::uint32_t* columnwise_miss;
  bool decoded_store_aligned;     // cols % 8 == 0 and every decoded buffer 16-byte aligned
};

// The decoded value of one code (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED): num_mx::decode's
// arithmetic with the block's factor 2^(e-127) already made (num::e8m0_to_f32): a NaN code or
// factor as it is, else one FP32 multiply.
__device__ __forceinline__ float decode_code(std::uint8_t q, float factor, bool e4m3) {
  const float element = e4m3 ? num::e4m3_to_f32(q) : num::e5m2_to_f32(q);
  if (num::is_nan(element)) return element;
  if (num::is_nan(factor)) return factor;
  return element * factor;
}

// Writes the decoded values of one run of 8 codes (lo, hi as encode_run made them; `valid`
// of them exist) at dst + offset, and notes a miss (sdk::decoded_bf16).
__device__ __forceinline__ void store_decoded_run(std::uint16_t* dst, std::int64_t offset,
                                                  int valid, bool vector_ok, std::uint32_t lo,
                                                  std::uint32_t hi, const float (&factor)[8],
                                                  bool e4m3, std::uint32_t& miss) {
  std::uint16_t v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const std::uint8_t q = static_cast<std::uint8_t>(((k < 4 ? lo : hi) >> (8 * (k % 4))) & 0xFFu);
    v[k] = sdk::decoded_bf16(decode_code(q, factor[k], e4m3), miss);
  }
  if (vector_ok) {
    uint4 word;
    word.x = v[0] | (static_cast<std::uint32_t>(v[1]) << 16);
    word.y = v[2] | (static_cast<std::uint32_t>(v[3]) << 16);
    word.z = v[4] | (static_cast<std::uint32_t>(v[5]) << 16);
    word.w = v[6] | (static_cast<std::uint32_t>(v[7]) << 16);
    *reinterpret_cast<uint4*>(dst + offset) = word;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) dst[offset + k] = v[k];
  }
}

// The scale of the per-tensor cast: *cast_scale, or scale_from_amax of the device amax (the
// rule of qrecipe/scaling.hpp that float8 applies, so the codes are float8's own).
template <class In>
__device__ __forceinline__ float cast_scale_of(const QuantizeParams<In>& p) {
  if (p.cast_scale != nullptr) return __ldcg(p.cast_scale);
  return scale_from_amax(__ldcg(p.cast_amax), p.cast_fmax, p.cast_pow2_scales,
                         p.cast_amax_epsilon);
}

// The codes of x[k] * factor[k] (num_mx::encode: one FP32 multiply by 2^(127-e), then
// sat_rne), as two little-endian words. The hardware conversion equals num::f32_to_e4m3 /
// f32_to_e5m2 on every non-NaN input (test_gpu_conversions); `has_nan` (some x[k] is NaN, so
// some product is: the factors are finite) adds the reference's canonical NaN 0x7F, exactly
// as num::fast::f32x2_to_e4m3x2 does.
template <class Codes>
__device__ __forceinline__ void encode_run(const float (&x)[8], const float (&factor)[8],
                                           bool has_nan, std::uint32_t& lo, std::uint32_t& hi) {
  float y[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) y[k] = x[k] * factor[k];
  std::uint32_t pair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    pair[k] = Codes::kE4M3 ? num::fast::hardware_e4m3x2(y[2 * k], y[2 * k + 1])
                           : num::fast::hardware_e5m2x2(y[2 * k], y[2 * k + 1]);
  if (has_nan) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      pair[k] = num::fast::canonical_nan_pair(pair[k], y[2 * k], y[2 * k + 1]);
  }
  lo = pair[0] | (pair[1] << 16);
  hi = pair[2] | (pair[3] << 16);
}

// Quantizes the CTA tile at rows row0 .., columns cta_col .. . kInterior: the tile lies inside
// the tensor and every buffer is aligned (p.all_aligned), so every run is a whole vector.
// Cast (NoCast, E4M3Codes, E5M2Codes): also the per-tensor cast of p.cast_* into p.cast_data,
// stored at the rowwise data's offsets (the hybrid fusion extra).
// kDecoded: also the decoded values of every requested direction (p.*_decoded; no cast).
template <bool kInterior, class In, class Codes, Directions D, class Cast = NoCast,
          bool kDecoded = false>
__device__ __forceinline__ void quantize_cta_tile(const QuantizeParams<In>& p, std::int64_t row0,
                                                  std::int64_t cta_col,
                                                  std::uint8_t (*row_scales)[8]) {
  using T = QuantizeTile<In, D>;
  constexpr bool kRowwise = has_rowwise(D), kColumnwise = has_columnwise(D);
  constexpr bool kCast = !std::is_same_v<Cast, NoCast>;
  constexpr int R = sdk::cuda::kTileRowsPerLane, C = sdk::cuda::kTileColsPerLane;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int rg = lane / 4, cg = lane % 4;
  const std::int64_t tile_col = cta_col + warp * 32;
  const std::int64_t col = tile_col + cg * C;  // this lane's first column
  const std::int64_t lane_row = row0 + rg * R;
  const std::int64_t lane_offset = lane_row * p.cols + col;  // element (lane_row, col)
  const int valid_cols = kInterior ? C : valid_in_run(col, p.cols, C);
  // Run i (row lane_row + i): whole in the interior, else `valid` elements of it exist.
  auto run_valid = [&](int i) { return lane_row + i < p.rows ? valid_cols : 0; };

  Raw8<In> raw[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = lane_offset + i * p.cols;
    if constexpr (kInterior) {
      load_raw8<In>(p.src, offset, C, true, raw[i]);
    } else {
      const int valid = run_valid(i);
      load_raw8<In>(p.src, offset, valid, p.load_aligned && valid == C, raw[i]);
    }
  }
  float x[R][C];
  bool has_nan = false;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    decode_raw8<In>(raw[i], x[i]);
#pragma unroll
    for (int k = 0; k < C; ++k) has_nan |= x[i][k] != x[i][k];
  }

  // Rowwise: each row's 1x32 block amax over its 4 lanes, then its exponent.
  static_assert(!(kDecoded && !std::is_same_v<Cast, NoCast>), "decoded outputs come without a cast");
  float row_factor[R];
  [[maybe_unused]] float row_decode[R];  // 2^(e-127) of each row's block (kDecoded)
  if constexpr (kRowwise) {
    std::uint8_t e[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < C; ++k) amax = amax_of(amax, x[i][k]);
      amax = sdk::cuda::max_over_row_lanes(amax);
      e[i] = num_mx::block_exponent(amax, Codes::kRcp);
      row_factor[i] = num::e8m0_encode_factor(e[i]);
      if constexpr (kDecoded) row_decode[i] = num::e8m0_to_f32(e[i]);
    }
    // Lane cg parks the scale of its row group's row cg (the 4 lanes agree on all 4).
    std::uint8_t my_e = e[0];
#pragma unroll
    for (int i = 1; i < R; ++i) my_e = cg == i ? e[i] : my_e;
    row_scales[rg * R + cg][warp] = my_e;
  }

  // Columnwise: each column's 32x1 block amax over its 8 lanes (reduce-scatter: this lane
  // ends with column 8 cg + rg), exponent, then every lane gathers its 8 columns' factors.
  float col_factor[C];
  [[maybe_unused]] float col_decode[C];  // 2^(e-127) of each of this lane's columns (kDecoded)
  if constexpr (kColumnwise) {
    float colmax[C];
#pragma unroll
    for (int k = 0; k < C; ++k) {
      colmax[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < R; ++i) colmax[k] = amax_of(colmax[k], x[i][k]);
    }
    const float amax = sdk::cuda::max_over_column_lanes_scatter(colmax);
    const std::uint8_t e = num_mx::block_exponent(amax, Codes::kRcp);
    const std::int64_t my_col = tile_col + cg * C + rg;
    if (kInterior || my_col < p.cols)  // row0 < rows: the CTA exists
      p.columnwise_scale[(row0 / kBlock) * p.columnwise_scale_ld + my_col] = e;
    sdk::cuda::gather_column_values(num::e8m0_encode_factor(e), col_factor);
    if constexpr (kDecoded) sdk::cuda::gather_column_values(num::e8m0_to_f32(e), col_decode);
  }

  float cast_scale = 0.0f;
  if constexpr (kCast) cast_scale = cast_scale_of(p);
  [[maybe_unused]] std::uint32_t row_miss = 0, col_miss = 0;

  // Codes, row by row: both directions of a row are encoded and stored before the next, so
  // each row's elements die early (fewer live registers than one direction after the other).
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t offset = lane_offset + i * p.cols;
    const int valid = kInterior ? C : run_valid(i);
    if constexpr (kRowwise) {
      const float f[C] = {row_factor[i], row_factor[i], row_factor[i], row_factor[i],
                          row_factor[i], row_factor[i], row_factor[i], row_factor[i]};
      std::uint32_t lo, hi;
      encode_run<Codes>(x[i], f, has_nan, lo, hi);
      if (kInterior || valid > 0)
        store_bytes8(p.rowwise_data, offset, valid,
                     kInterior || (p.rowwise_store_aligned && valid == C), lo, hi);
      if constexpr (kDecoded) {
        if (p.rowwise_decoded != nullptr && (kInterior || valid > 0)) {
          const float g[C] = {row_decode[i], row_decode[i], row_decode[i], row_decode[i],
                              row_decode[i], row_decode[i], row_decode[i], row_decode[i]};
          store_decoded_run(p.rowwise_decoded, offset, valid,
                            kInterior || (p.decoded_store_aligned && valid == C), lo, hi, g,
                            Codes::kE4M3, row_miss);
        }
      }
    }
    if constexpr (kColumnwise) {
      std::uint32_t lo, hi;
      encode_run<Codes>(x[i], col_factor, has_nan, lo, hi);
      if (kInterior || valid > 0)
        store_bytes8(p.columnwise_data, offset, valid,
                     kInterior || (p.columnwise_store_aligned && valid == C), lo, hi);
      if constexpr (kDecoded) {
        if (p.columnwise_decoded != nullptr && (kInterior || valid > 0))
          store_decoded_run(p.columnwise_decoded, offset, valid,
                            kInterior || (p.decoded_store_aligned && valid == C), lo, hi,
                            col_decode, Codes::kE4M3, col_miss);
      }
    }
    if constexpr (kCast) {
      const float f[C] = {cast_scale, cast_scale, cast_scale, cast_scale,
                          cast_scale, cast_scale, cast_scale, cast_scale};
      std::uint32_t lo, hi;
      encode_run<Cast>(x[i], f, has_nan, lo, hi);  // sat_rne(x * s), NaN -> 0x7F
      if (kInterior || valid > 0)
        store_bytes8(p.cast_data, offset, valid,
                     kInterior || (p.cast_store_aligned && valid == C), lo, hi);
    }
  }

  if constexpr (kDecoded) {
    // Every writer stores the same 1: no atomics needed.
    if (row_miss != 0) *p.rowwise_miss = 1u;
    if (col_miss != 0) *p.columnwise_miss = 1u;
  }
  if constexpr (kRowwise) {
    __syncthreads();
    const int tr = static_cast<int>(threadIdx.x);
    const std::int64_t r = row0 + tr;
    const std::int64_t first_block = cta_col / kBlock;
    if (tr < T::kRows && (kInterior || r < p.rows)) {
      const uint2 word = *reinterpret_cast<const uint2*>(row_scales[tr]);
      if constexpr (kInterior) {
        store_bytes8(p.rowwise_scale, r * p.rowwise_scale_ld + first_block, T::kWarps, true,
                     word.x, word.y);
      } else {
        // Blocks of this CTA that exist in the row.
        const int blocks =
            (valid_in_run(cta_col, p.cols, T::kCols) + kBlock - 1) / kBlock;
        store_bytes8(p.rowwise_scale, r * p.rowwise_scale_ld + first_block, blocks,
                     p.rowwise_scale_aligned && blocks == T::kWarps, word.x, word.y);
      }
    }
  }
}

// The edge tiles, out of line: their bounds checks and scalar fallbacks keep more values live,
// and as a separate function they get their own register allocation (spills there, if any,
// stay off the interior path).
template <class In, class Codes, Directions D, class Cast = NoCast, bool kDecoded = false>
__device__ __noinline__ void quantize_edge_tile(const QuantizeParams<In> p, std::int64_t row0,
                                                std::int64_t cta_col,
                                                std::uint8_t (*row_scales)[8]) {
  quantize_cta_tile<false, In, Codes, D, Cast, kDecoded>(p, row0, cta_col, row_scales);
}

// The parameters of quantize_cta_tile for one tensor (one group of a grouped call) described
// by `a`, its buffers already checked (mxfp8_kernels.cu quantize). Also made on the device, for
// device-split groups (mxfp8_grouped_kernels.cu).
template <class In, Directions D>
__host__ __device__ QuantizeParams<In> quantize_params(const QuantizeArgs& a) {
  using T = QuantizeTile<In, D>;
  QuantizeParams<In> p{};
  p.src = static_cast<const typename In::Storage*>(a.src);
  p.rows = a.rows;
  p.cols = a.cols;
  p.row_tiles = (a.rows + T::kRows - 1) / T::kRows;
  p.rowwise_data = a.rowwise_data;
  p.rowwise_scale = a.rowwise_scale;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_data = a.columnwise_data;
  p.columnwise_scale = a.columnwise_scale;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  // Runs start at multiples of 8 within a row: with cols % 8 == 0 every run starts 16-byte
  // (source, 2- or 4-byte elements) and 8-byte (codes) aligned when the buffers do.
  p.load_aligned = a.cols % 8 == 0 && is_aligned(a.src, 16);
  p.rowwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.rowwise_data, 8);
  p.columnwise_store_aligned = a.cols % 8 == 0 && is_aligned(a.columnwise_data, 8);
  // A CTA's scales start at block kWarps * (CTA column), a multiple of 8.
  p.rowwise_scale_aligned = a.rowwise_scale_ld % 8 == 0 && is_aligned(a.rowwise_scale, 8);
  p.cast_data = a.cast.data;
  p.cast_scale = a.cast.scale;
  p.cast_amax = a.cast.amax;
  p.cast_fmax = a.cast.fmax;
  p.cast_pow2_scales = a.cast.pow2_scales != 0;
  p.cast_amax_epsilon = a.cast.amax_epsilon;
  p.cast_store_aligned = a.cols % 8 == 0 && is_aligned(a.cast.data, 8);
  p.rowwise_decoded = has_rowwise(D) ? a.rowwise_decoded : nullptr;
  p.rowwise_miss = a.rowwise_miss;
  p.columnwise_decoded = has_columnwise(D) ? a.columnwise_decoded : nullptr;
  p.columnwise_miss = a.columnwise_miss;
  p.decoded_store_aligned = a.cols % 8 == 0 && is_aligned(a.rowwise_decoded, 16) &&
                            is_aligned(a.columnwise_decoded, 16);
  p.all_aligned = p.load_aligned &&
                  ((p.rowwise_decoded == nullptr && p.columnwise_decoded == nullptr) ||
                   p.decoded_store_aligned) &&
                  (!has_rowwise(D) || (p.rowwise_store_aligned && p.rowwise_scale_aligned)) &&
                  (!has_columnwise(D) || p.columnwise_store_aligned) &&
                  (a.cast.data == nullptr || p.cast_store_aligned);
  return p;
}

}  // namespace qrecipe::mxfp8::cuda
