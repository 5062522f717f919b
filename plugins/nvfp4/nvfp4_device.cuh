// Device code and kernel parameters that every nvfp4 CUDA pass shares (nvfp4_kernels.cu has
// the map of the passes): the block size, the stochastic-rounding stream, the block scale
// code with the hardware E4M3 conversion, the pitches of the stored arrays, and the
// parameters of the quantize (pass 2) kernels with their host-side setup, used for one tensor
// and for each group of a grouped call alike. CUDA only (nvcc); exactness as
// nvfp4_kernels.cu says.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_kernels.hpp"
#include "nvfp4_rules.hpp"
#include "philox.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_sdk.hpp"

namespace qrecipe::nvfp4::cuda {

inline constexpr const char* kFormat = "nvfp4";  // for QR_CUDA_CHECK (cuda_sdk.cuh)

// Shared helpers of the pass code (qrecipe/cuda_sdk.cuh).
using sdk::cuda::as_stream;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::BF16In;
using sdk::cuda::block_max;
using sdk::ceil_div;  // qrecipe/plugin_sdk.hpp
using sdk::cuda::DeviceGuard;
using sdk::cuda::F16In;
using sdk::cuda::F32In;
using sdk::cuda::is_aligned;
using sdk::cuda::kRunLength;
using sdk::cuda::load_run;  // runs of kRunLength: 16 bytes, alignas(16)
using sdk::cuda::valid_in_run;

inline constexpr int kBlock = rules::kBlockSize;  // 16 elements per block scale

// The Philox key and call offset of stochastic rounding (unused with round-to-nearest).
struct RandomStream {
  std::uint64_t seed;
  std::uint64_t call_offset;
};

// rules::block_scale_code with the hardware E4M3 conversion (== num::f32_to_e4m3 for every
// input, test_gpu_conversions): the same product, s_enc * fl32(1/6) first.
__device__ __forceinline__ std::uint8_t block_scale_code(float block_amax, float s_enc) {
  const float scale_times_sixth = s_enc * rules::kOneSixth;
  return num::fast::f32_to_e4m3(block_amax * scale_times_sixth);
}

// Bytes of one packed data row and the pitch of a scale array (nvfp4_ref.hpp layouts).
inline std::int64_t packed_pitch(std::int64_t data_cols) { return sdk::ceil_div(data_cols, 2); }
inline std::int64_t scale_pitch(std::int64_t data_cols) {
  return sdk::ceil_div(sdk::ceil_div(data_cols, kBlock), 4) * 4;
}

// Quantize (pass 2): the parameters of every quantize kernel (nvfp4_quantize_16bit.cu,
// nvfp4_quantize_tile.cu, nvfp4_grouped_kernels.cu), both requested directions.
struct QuantizeParams {
  const void* src;
  std::int64_t rows, cols;
  std::int64_t tiles_per_row;  // ceil(cols / Tile::kCols)
  bool src_aligned;            // cols % kRun == 0 and src 16-byte aligned
  bool two_d, hadamard;
  RandomStream random;  // stochastic rounding only (the kernel's kStochastic)
  // Rowwise: data [rows, ceil(cols/2)], scales pitch row_spitch; null data: not requested.
  std::uint8_t* row_data;
  std::uint8_t* row_scales;
  const float* row_amax;
  std::int64_t row_pitch, row_spitch;
  bool row_vector_ok;  // row_pitch % 8 == 0 and row_data 8-byte aligned
  // Columnwise: data [cols, ceil(rows/2)], scales pitch col_spitch; null data: not requested.
  std::uint8_t* col_data;
  std::uint8_t* col_scales;
  const float* col_amax;
  std::int64_t col_pitch, col_spitch;
  bool col_vector_ok;  // col_pitch % 8 == 0 and col_data 8-byte aligned
  // quantize_1d_kernel's scale stores: 16 bytes (rowwise) / 4 bytes (columnwise) a data row.
  bool row_scale_vector_ok;  // row_spitch % 16 == 0 and row_scales 16-byte aligned
  bool col_scale_vector_ok;  // col_spitch % 4 == 0 and col_scales 4-byte aligned
  // quantize_16bit_kernel: its tile count, tile order (0: row-major; g > 0: groups of g row
  // tiles visited column by column) and its vector stores.
  std::int64_t tiles;
  std::int64_t tile_group_rows;
  bool row_word_ok;    // row_pitch % 4 == 0 and row_data 4-byte aligned
  bool row_scale8_ok;  // row_spitch % 8 == 0 and row_scales 8-byte aligned
  bool col_chunk_ok;   // col_pitch % 16 == 0 and col_data 16-byte aligned
  // 1024 (see num::fast::e2m1_magnitude_byte_below7): a kernel parameter, so the compiler
  // cannot turn the multiply into an ALU shift (the ALU pipe is the busier one).
  std::uint32_t two_pow_10;
};

// The parameters of the tile kernels for the quantize call `a` describes (its buffers
// already checked): pass 2 of nvfp4_kernels.cu quantize, and each group of a grouped call
// (nvfp4_grouped_kernels.cu).
inline QuantizeParams quantize_params(const QuantizeArgs& a) {
  QuantizeParams p{};
  p.src = a.src;
  p.rows = a.rows;
  p.cols = a.cols;
  const int run = a.src_dtype == QR_DTYPE_F32 ? kRunLength<F32In> : kRunLength<BF16In>;
  p.src_aligned = a.cols % run == 0 && is_aligned(a.src, 16);
  p.two_d = a.two_d;
  p.hadamard = a.hadamard;
  p.random = RandomStream{a.seed, a.call_offset};
  if (a.rowwise) {
    p.row_data = a.rowwise->data;
    p.row_scales = a.rowwise->scales;
    p.row_amax = a.rowwise->amax;
    p.row_pitch = packed_pitch(a.cols);
    p.row_spitch = scale_pitch(a.cols);
    p.row_vector_ok = p.row_pitch % 8 == 0 && is_aligned(p.row_data, 8);
  }
  if (a.columnwise) {
    p.col_data = a.columnwise->data;
    p.col_scales = a.columnwise->scales;
    p.col_amax = a.columnwise->amax;
    p.col_pitch = packed_pitch(a.rows);
    p.col_spitch = scale_pitch(a.rows);
    p.col_vector_ok = p.col_pitch % 8 == 0 && is_aligned(p.col_data, 8);
  }
  p.row_scale_vector_ok = p.row_spitch % 16 == 0 && is_aligned(p.row_scales, 16);
  p.col_scale_vector_ok = p.col_spitch % 4 == 0 && is_aligned(p.col_scales, 4);
  p.row_word_ok = p.row_pitch % 4 == 0 && is_aligned(p.row_data, 4);
  p.row_scale8_ok = p.row_spitch % 8 == 0 && is_aligned(p.row_scales, 8);
  p.col_chunk_ok = p.col_pitch % 16 == 0 && is_aligned(p.col_data, 16);
  return p;
}

}  // namespace qrecipe::nvfp4::cuda
