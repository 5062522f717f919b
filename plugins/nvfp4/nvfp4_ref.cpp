// CPU reference of the nvfp4 format (see nvfp4_ref.hpp for the rules and layouts). The scalar
// rules (nvfp4_rules.hpp), the Hadamard transform (hadamard.hpp) and the Philox generator
// (philox.hpp) are __host__ __device__ code that the CUDA kernels (nvfp4_kernels.cu) share.
#include "nvfp4_ref.hpp"

#include <cmath>
#include <cstring>

#include "hadamard.hpp"
#include "philox.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::nvfp4::ref {
namespace {

using sdk::dtype_str;
using sdk::shape_str;
using sdk::ceil_div;
using sdk::matrix_shape;
using sdk::round_up;

// What the reference itself needs beyond check_source_view: host memory.
void check_host_source(const qr_tensor_view& src) { sdk::check_host_source(src, "nvfp4"); }

// max |x| and whether a NaN was seen, over x[begin..end) with stride `step`.
struct BlockAmax {
  float amax = 0.0f;
  bool has_nan = false;
  void add(float v) {
    if (num::is_nan(v)) {
      has_nan = true;
      return;
    }
    amax = std::fmax(amax, num::abs_f(v));
  }
};

// Element `col` of data row `row` (rows of `cols` elements) of the direction being written:
// stochastic rounding draws its word from the Philox group of (row, col) (philox.hpp).
std::uint8_t round_element(float v, const Rounding& rounding, std::int64_t row, std::int64_t cols,
                           std::int64_t col) {
  if (!rounding.stochastic) return round_nearest(v);
  return round_stochastic(v, sr_random_word(rounding.seed, rounding.call_offset,
                                            static_cast<std::uint64_t>(row),
                                            static_cast<std::uint64_t>(cols),
                                            static_cast<std::uint64_t>(col)));
}

void set_nibble(std::uint8_t* row, std::int64_t c, std::uint8_t code) {
  const int shift = (c & 1) ? 4 : 0;  // even index in the low nibble
  row[c / 2] = static_cast<std::uint8_t>(row[c / 2] | ((code & 0xFu) << shift));
}

std::uint8_t get_nibble(const std::uint8_t* row, std::int64_t c) {
  return static_cast<std::uint8_t>((row[c / 2] >> ((c & 1) ? 4 : 0)) & 0xFu);
}

// Zero the data bytes and the whole (padded) scale array of one direction, so padding nibbles
// and padding scales are zero even when requantizing into a used tensor.
void clear_direction(const DirectionOut& out, std::int64_t data_rows, std::int64_t data_cols) {
  const auto data_bytes = static_cast<std::size_t>(data_rows * packed_row_bytes(data_cols));
  const auto scale_bytes = static_cast<std::size_t>(scale_rows(data_rows) * scale_cols(data_cols));
  if (data_bytes) std::memset(out.data, 0, data_bytes);
  if (scale_bytes) std::memset(out.scales, 0, scale_bytes);
}

}  // namespace

// ---------------------------------------------------------------- 1. scalar rules
// The rules themselves are nvfp4_rules.hpp (shared with the CUDA kernels).

float encode_scale(float tensor_amax) { return rules::encode_scale(tensor_amax); }

float decode_scale(float tensor_amax) { return rules::decode_scale(tensor_amax); }

std::uint8_t block_scale_code(float block_amax, float s_enc) {
  return rules::block_scale_code(block_amax, s_enc);
}

float element_encode_factor(std::uint8_t scale_code, float s_dec) {
  return rules::element_encode_factor(scale_code, s_dec);
}

std::uint8_t round_nearest(float v) { return rules::round_nearest(v); }

std::uint8_t round_stochastic(float v, std::uint32_t r) { return rules::round_stochastic(v, r); }

float decode_element(std::uint8_t q, std::uint8_t scale_code, float s_dec) {
  return rules::decode_element(q, scale_code, s_dec);
}

// ---------------------------------------------------------------- 2. layouts

std::int64_t packed_row_bytes(std::int64_t data_cols) { return ceil_div(data_cols, 2); }
std::int64_t scale_rows(std::int64_t data_rows) { return round_up(data_rows, kScaleRowAlign); }
std::int64_t scale_cols(std::int64_t data_cols) {
  return round_up(ceil_div(data_cols, kBlockSize), kScaleColAlign);
}

// ---------------------------------------------------------------- 3. host matrix helpers

void check_source_view(const qr_tensor_view& src) { sdk::check_source_view(src, "nvfp4"); }

std::vector<float> load_matrix(const qr_tensor_view& src, std::int64_t& rows,
                               std::int64_t& cols) {
  check_source_view(src);
  check_host_source(src);
  matrix_shape(src, rows, cols);
  return sdk::gather_f32(src);  // rows * cols elements, any strides
}

float amax(const float* x, std::int64_t n) {
  BlockAmax a;
  for (std::int64_t i = 0; i < n; ++i) a.add(x[i]);
  return a.amax;
}

std::vector<float> transpose(const float* x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  if (rows == 0 || cols == 0) return out;  // no data: no work, however many rows (issue 19)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
  return out;
}

std::vector<float> hadamard_transpose(const float* x, std::int64_t rows, std::int64_t cols) {
  QR_CHECK(rows % kHadamardSize == 0, "hadamard_transpose needs rows divisible by ",
           kHadamardSize, "; got ", rows);
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  if (rows == 0 || cols == 0) return out;
  float v[kHadamardSize];
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t r0 = 0; r0 < rows; r0 += kHadamardSize) {
      for (int i = 0; i < kHadamardSize; ++i) v[i] = x[(r0 + i) * cols + c];
      hadamard16_bf16(v);
      for (int i = 0; i < kHadamardSize; ++i) out[c * rows + r0 + i] = v[i];
    }
  }
  return out;
}

// ---------------------------------------------------------------- 4. one direction

void quantize_1d(const float* x, std::int64_t rows, std::int64_t cols, float tensor_amax,
                 const Rounding& rounding, const DirectionOut& out) {
  clear_direction(out, rows, cols);
  *out.amax = tensor_amax;
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  const float s_enc = encode_scale(tensor_amax);
  const float s_dec = 1.0f / s_enc;
  const std::int64_t pitch = packed_row_bytes(cols);
  const std::int64_t spitch = scale_cols(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    std::uint8_t* data_row = out.data + r * pitch;
    for (std::int64_t b = 0; b * kBlockSize < cols; ++b) {
      const std::int64_t begin = b * kBlockSize;
      const std::int64_t end = begin + kBlockSize < cols ? begin + kBlockSize : cols;
      BlockAmax block;
      for (std::int64_t c = begin; c < end; ++c) block.add(xr[c]);
      const std::uint8_t code = block_scale_code(block.amax, s_enc);
      const float enc = element_encode_factor(code, s_dec);
      for (std::int64_t c = begin; c < end; ++c)
        set_nibble(data_row, c, round_element(xr[c] * enc, rounding, r, cols, c));
      out.scales[r * spitch + b] = block.has_nan ? kNanScaleCode : code;
    }
  }
}

void quantize_2d(const float* x, std::int64_t rows, std::int64_t cols, float tensor_amax,
                 const Rounding& rounding, const DirectionOut* rowwise,
                 const DirectionOut* columnwise) {
  if (rowwise) {
    clear_direction(*rowwise, rows, cols);
    *rowwise->amax = tensor_amax;
  }
  if (columnwise) {
    clear_direction(*columnwise, cols, rows);
    *columnwise->amax = tensor_amax;
  }
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  const float s_enc = encode_scale(tensor_amax);
  const float s_dec = 1.0f / s_enc;
  const std::int64_t row_pitch = packed_row_bytes(cols), row_spitch = scale_cols(cols);
  const std::int64_t col_pitch = packed_row_bytes(rows), col_spitch = scale_cols(rows);
  for (std::int64_t tr = 0; tr * kBlockSize < rows; ++tr) {
    const std::int64_t r0 = tr * kBlockSize;
    const std::int64_t r1 = r0 + kBlockSize < rows ? r0 + kBlockSize : rows;
    for (std::int64_t tc = 0; tc * kBlockSize < cols; ++tc) {
      const std::int64_t c0 = tc * kBlockSize;
      const std::int64_t c1 = c0 + kBlockSize < cols ? c0 + kBlockSize : cols;
      // One amax for the tile; NaN marks per stored block: the tile's row r (rowwise 1x16
      // block) and column c (columnwise 16x1 block) that hold the NaN.
      BlockAmax tile;
      bool row_nan[kBlockSize] = {}, col_nan[kBlockSize] = {};
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) {
          const float v = x[r * cols + c];
          tile.add(v);
          if (num::is_nan(v)) row_nan[r - r0] = col_nan[c - c0] = true;
        }
      const std::uint8_t code = block_scale_code(tile.amax, s_enc);
      const float enc = element_encode_factor(code, s_dec);
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          // The rowwise element's word for both directions: the codes are drawn once.
          const std::uint8_t q = round_element(x[r * cols + c] * enc, rounding, r, cols, c);
          if (rowwise) set_nibble(rowwise->data + r * row_pitch, c, q);
          if (columnwise) set_nibble(columnwise->data + c * col_pitch, r, q);
        }
      }
      // Every data row of the tile carries the tile's scale, in both directions.
      if (rowwise)
        for (std::int64_t r = r0; r < r1; ++r)
          rowwise->scales[r * row_spitch + tc] = row_nan[r - r0] ? kNanScaleCode : code;
      if (columnwise)
        for (std::int64_t c = c0; c < c1; ++c)
          columnwise->scales[c * col_spitch + tr] = col_nan[c - c0] ? kNanScaleCode : code;
    }
  }
}

void dequantize(const std::uint8_t* data, const std::uint8_t* scales, float tensor_amax,
                std::int64_t rows, std::int64_t cols, bool transposed, void* dst,
                std::int32_t dst_dtype) {
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "nvfp4 dequantizes into f32, bf16 or f16; got ",
                dtype_str(dst_dtype));
  const float s_dec = decode_scale(tensor_amax);
  // The data matrix: [rows, cols] rowwise, [cols, rows] columnwise.
  const std::int64_t data_rows = transposed ? cols : rows;
  const std::int64_t data_cols = transposed ? rows : cols;
  const std::int64_t pitch = packed_row_bytes(data_cols);
  const std::int64_t spitch = scale_cols(data_cols);
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  for (std::int64_t i = 0; i < data_rows; ++i) {
    for (std::int64_t j = 0; j < data_cols; ++j) {
      const std::uint8_t q = get_nibble(data + i * pitch, j);
      const float v = decode_element(q, scales[i * spitch + j / kBlockSize], s_dec);
      sdk::store_f32_as(dst, dst_dtype, transposed ? j * cols + i : i * cols + j, v);
    }
  }
}

// ---------------------------------------------------------------- 5. the whole call

void check_config(const Config& config) {
  QR_CHECK(!(config.hadamard && config.two_d),
           "nvfp4 options 'hadamard' and '2d' cannot be combined: 2d makes the columnwise data "
           "the transpose of the rowwise data, while hadamard transforms the columnwise operand "
           "only. Set one of them to false");
}

void check_hadamard_source(const qr_tensor_view& src, std::int64_t rows, std::int64_t cols) {
  QR_CHECK_CODE(src.dtype == QR_DTYPE_BF16, QR_STATUS_UNSUPPORTED,
                "nvfp4 with hadamard=true needs a bf16 source for its columnwise direction "
                "(the transform's output is rounded to bf16, as in TransformerEngine); got ",
                dtype_str(src.dtype), shape_str(src),
                ". Cast the tensor to bf16, or set hadamard: false");
  QR_CHECK(rows % kBlockSize == 0, "nvfp4 with hadamard=true transforms runs of ", kBlockSize,
           " rows (along M) of the columnwise operand, so M must be a multiple of ", kBlockSize,
           "; got a tensor of shape ", shape_str(src), " (as 2-D: M=", rows, ", K=", cols,
           "). Pad M to a multiple of ", kBlockSize, " or set hadamard: false");
}

void check_amax_call(const qr_tensor_view& src, const Config& config) {
  check_config(config);
  check_source_view(src);
  if (!config.hadamard) return;
  std::int64_t rows = 0, cols = 0;
  matrix_shape(src, rows, cols);
  check_hadamard_source(src, rows, cols);
}

void check_quantize_call(const qr_tensor_view& src, const Config& config,
                         const Request& request) {
  check_config(config);
  check_source_view(src);
  std::int64_t rows = 0, cols = 0;
  matrix_shape(src, rows, cols);
  if (config.hadamard && request.columnwise) check_hadamard_source(src, rows, cols);
  if (!request.amax) return;
  for (int d = 0; d < 2; ++d)
    QR_CHECK(!(request.amax[d] < 0.0f) && !num::is_nan(request.amax[d]),
             "nvfp4 quantize got a caller-reduced ", d == 0 ? "rowwise" : "columnwise",
             " amax of ", request.amax[d], "; an amax must be >= 0 (inf allowed), not NaN");
  // 2d: one tensor amax for both directions (they are transposes of each other).
  QR_CHECK(!config.two_d || request.amax[0] == request.amax[1],
           "nvfp4 with 2d=true shares one tensor amax between the two directions, but the "
           "caller passed rowwise amax ", request.amax[0], " and columnwise amax ",
           request.amax[1], ". Pass the same reduced amax twice");
}

std::array<float, 2> compute_amax(const qr_tensor_view& src, const Config& config) {
  check_amax_call(src, config);
  std::int64_t rows = 0, cols = 0;
  const std::vector<float> x = load_matrix(src, rows, cols);
  const float rowwise = amax(x.data(), rows * cols);
  if (!config.hadamard) return {rowwise, rowwise};
  const std::vector<float> t = hadamard_transpose(x.data(), rows, cols);
  return {rowwise, amax(t.data(), rows * cols)};
}

void quantize(const qr_tensor_view& src, const Config& config, const Request& request) {
  // Validate everything before the first byte is written.
  check_quantize_call(src, config, request);
  std::int64_t rows = 0, cols = 0;
  const std::vector<float> x = load_matrix(src, rows, cols);
  const Rounding rounding{config.stochastic_rounding, config.seed, request.call_offset};

  if (config.two_d) {
    const float a = request.amax ? request.amax[0] : amax(x.data(), rows * cols);
    if (request.rowwise || request.columnwise)
      quantize_2d(x.data(), rows, cols, a, rounding, request.rowwise, request.columnwise);
    return;
  }

  if (request.rowwise) {
    const float a = request.amax ? request.amax[0] : amax(x.data(), rows * cols);
    quantize_1d(x.data(), rows, cols, a, rounding, *request.rowwise);
  }
  if (request.columnwise) {
    std::vector<float> t;
    t = config.hadamard ? hadamard_transpose(x.data(), rows, cols)
                        : transpose(x.data(), rows, cols);
    const float a = request.amax ? request.amax[1] : amax(t.data(), rows * cols);
    quantize_1d(t.data(), cols, rows, a, rounding, *request.columnwise);
  }
}

}  // namespace qrecipe::nvfp4::ref
