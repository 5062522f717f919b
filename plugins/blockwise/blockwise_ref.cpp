// CPU reference of the blockwise format (see blockwise_ref.hpp for the rules and layouts).
// Every FP8 rounding goes through qrecipe::num (conversions.hpp) and every scale through
// qrecipe::scale_from_amax (scaling.hpp), both via blockwise_numerics.hpp: the same code the
// CUDA kernels (blockwise_kernels.cu) run.
//
// All four (block shape, direction) cases run through one loop over the logical block grid:
// a direction is fully described by its block geometry, where its scale for block (a, b)
// lives, and whether its data is stored transposed. That keeps the 128x128 columnwise copy
// the exact transpose of the rowwise one by construction (same tiles, same amax, same scale).
#include "blockwise_ref.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "blockwise_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::blockwise::ref {
namespace {

using sdk::dtype_str;
using sdk::ceil_div;
using sdk::round_up;

// Where the pieces of one direction live, derived from its layout.
struct DirectionGeometry {
  std::int64_t rows = 0, cols = 0;            // logical tensor
  std::int64_t block_rows = 1, block_cols = 1; // block in the logical tensor
  std::int64_t grid_rows = 0, grid_cols = 0;  // logical block grid
  std::int64_t scale_ld = 0;                  // stored inner (padded) scale dimension
  bool scale_transposed = false;
  bool data_transposed = false;

  std::int64_t scale_offset(std::int64_t a, std::int64_t b) const {
    return scale_transposed ? b * scale_ld + a : a * scale_ld + b;
  }
  std::int64_t data_offset(std::int64_t r, std::int64_t c) const {
    return data_transposed ? c * rows + r : r * cols + c;
  }
};

DirectionGeometry geometry(std::int64_t rows, std::int64_t cols, BlockShape block,
                           qr_direction direction) {
  const qr_direction_layout l = layout(rows, cols, block, direction);
  DirectionGeometry g;
  g.rows = rows;
  g.cols = cols;
  g.block_rows = l.block_rows;
  g.block_cols = l.block_cols;
  g.grid_rows = ceil_div(rows, g.block_rows);
  g.grid_cols = ceil_div(cols, g.block_cols);
  g.scale_ld = l.scale_shape[1];
  g.scale_transposed = l.scale_transposed != 0;
  g.data_transposed = l.data_transposed != 0;
  return g;
}

void check_source_dtype(std::int32_t dtype) { sdk::check_source_dtype(dtype, "blockwise"); }

}  // namespace

const char* block_shape_name(BlockShape shape) {
  return shape == BlockShape::k1x128 ? "1x128" : "128x128";
}

float value_for_inf(qr_dtype src_dtype) {
  switch (src_dtype) {
    case QR_DTYPE_F32: return FLT_MAX;
    case QR_DTYPE_BF16: return num::bf16_to_f32(0x7F7F);  // 3.3895314e38, largest finite bf16
    case QR_DTYPE_F16: return num::F16Traits::kMax;       // 65504
    default: check_source_dtype(src_dtype); return FLT_MAX;
  }
}

float block_scale(float amax, const Params& params, qr_dtype src_dtype) {
  return num_bw::block_scale(amax, params.pow2_scales, params.amax_epsilon,
                            value_for_inf(src_dtype));
}

qr_direction_layout layout(std::int64_t rows, std::int64_t cols, BlockShape block,
                           qr_direction direction) {
  QR_CHECK(rows >= 0 && cols >= 0, "blockwise layout of a ", rows, "x", cols,
           " tensor: dimensions must be non-negative");
  qr_direction_layout l{};
  l.struct_size = sizeof(qr_direction_layout);
  l.format = "blockwise";
  l.data_dtype = QR_DTYPE_E4M3;
  l.data_ndim = 2;
  l.scale_mode = QR_SCALE_BLOCK;
  l.scale_dtype = QR_DTYPE_F32;
  l.scale_ndim = 2;
  l.has_amax = 0;
  const bool rowwise = direction == QR_DIRECTION_ROWWISE;
  l.data_transposed = rowwise ? 0 : 1;
  l.data_shape[0] = rowwise ? rows : cols;
  l.data_shape[1] = rowwise ? cols : rows;
  if (block == BlockShape::k1x128) {
    if (rowwise) {  // blocks along K; scales stored transposed
      l.block_rows = 1;
      l.block_cols = kBlock;
      l.scale_shape[0] = ceil_div(cols, kBlock);
      l.scale_shape[1] = round_up(rows, kScalePad);
      l.scale_transposed = 1;
    } else {        // blocks down M
      l.block_rows = kBlock;
      l.block_cols = 1;
      l.scale_shape[0] = ceil_div(rows, kBlock);
      l.scale_shape[1] = round_up(cols, kScalePad);
      l.scale_transposed = 0;
    }
  } else {
    l.block_rows = kBlock;
    l.block_cols = kBlock;
    const std::int64_t grid_rows = ceil_div(rows, kBlock), grid_cols = ceil_div(cols, kBlock);
    l.scale_shape[0] = rowwise ? grid_rows : grid_cols;
    l.scale_shape[1] = round_up(rowwise ? grid_cols : grid_rows, kScalePad);
    l.scale_transposed = rowwise ? 0 : 1;
  }
  return l;
}

std::vector<float> load_f32(const qr_tensor_view& src) {
  sdk::check_source_view(src, "blockwise", sdk::SourceDevice::kHostUnsupported);
  const std::int64_t n = sdk::numel(src);
  if (n == 0) return {};
  QR_CHECK(src.data != nullptr, "source view of ", n, " elements has no data pointer");
  return sdk::gather_f32(src);  // any strides (0, negative, padded rows)
}

float tensor_amax(const std::vector<float>& x) {
  float result = 0.0f;
  // fmax returns the other operand when one is NaN, so NaN elements never win.
  for (float v : x) result = std::fmax(result, num::abs_f(v));
  return result;
}

void quantize(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
              const Params& params, qr_dtype src_dtype, qr_direction direction,
              std::uint8_t* data, float* scale_inv) {
  QR_CHECK(static_cast<std::int64_t>(x.size()) == rows * cols, "blockwise quantize: ",
           x.size(), " source values for a ", rows, "x", cols, " tensor");
  if (rows == 0 || cols == 0) return;
  QR_CHECK(data != nullptr && scale_inv != nullptr,
           "blockwise quantize: the destination has no data or scale_inv buffer");
  const DirectionGeometry g = geometry(rows, cols, params.block, direction);
  for (std::int64_t a = 0; a < g.grid_rows; ++a) {
    const std::int64_t r0 = a * g.block_rows, r1 = std::min(rows, r0 + g.block_rows);
    for (std::int64_t b = 0; b < g.grid_cols; ++b) {
      const std::int64_t c0 = b * g.block_cols, c1 = std::min(cols, c0 + g.block_cols);
      // amax over the valid elements of this block only (partial blocks allowed).
      float amax = 0.0f;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c)
          amax = std::fmax(amax, num::abs_f(x[static_cast<std::size_t>(r * cols + c)]));
      const float scale = block_scale(amax, params, src_dtype);
      scale_inv[g.scale_offset(a, b)] = 1.0f / scale;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c)
          data[g.data_offset(r, c)] =
              num_bw::encode(x[static_cast<std::size_t>(r * cols + c)], scale);
    }
  }
}

void dequantize(const std::uint8_t* data, const float* scale_inv, std::int64_t rows,
                std::int64_t cols, BlockShape block, qr_direction direction, void* dst,
                qr_dtype dst_dtype) {
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "blockwise dequantizes into f32, bf16 or f16; got ",
                dtype_str(dst_dtype));
  if (rows == 0 || cols == 0) return;
  const DirectionGeometry g = geometry(rows, cols, block, direction);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const float s = scale_inv[g.scale_offset(r / g.block_rows, c / g.block_cols)];
      const float v = num_bw::decode(data[g.data_offset(r, c)], s);
      sdk::store_f32_as(dst, dst_dtype, r * cols + c, v);
    }
  }
}

}  // namespace qrecipe::blockwise::ref
