// CPU reference of the mxfp8 format (see mxfp8_ref.hpp for the rules). Every FP8 and E8M0
// rounding goes through qrecipe::num (conversions.hpp) and the per-block arithmetic through
// mxfp8_numerics.hpp: the code the CUDA kernels (mxfp8_kernels.cu) run.
#include "mxfp8_ref.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "mxfp8_numerics.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"

namespace qrecipe::mxfp8::ref {
namespace {

using sdk::dtype_str;
using sdk::ceil_div;
using sdk::round_up;

// Random access to the logical [rows, cols] view of a strided f32/bf16/f16 source of any
// rank. The offset of every row is computed once, walking the leading dimensions with an
// N-D counter, so any strides (0, negative, permuted) are read correctly.
class Source2D {
 public:
  explicit Source2D(const qr_tensor_view& src) : src_(src) {
    sdk::check_source_view(src, "mxfp8", sdk::SourceDevice::kHostInvalidArgument);
    sdk::matrix_shape(src, rows_, cols_);
    col_stride_ = src.ndim == 0 ? 0 : src.strides[src.ndim - 1];
    const int leading = src.ndim == 0 ? 0 : src.ndim - 1;
    QR_CHECK(src.data != nullptr || rows_ * cols_ == 0, "source has no data pointer");
    if (rows_ == 0 || cols_ == 0) return;  // no element to find: no row table (issue 19)
    row_offset_.resize(static_cast<std::size_t>(rows_));
    std::int64_t index[QR_MAX_DIMS] = {};
    std::int64_t offset = 0;
    for (std::int64_t r = 0; r < rows_; ++r) {
      row_offset_[static_cast<std::size_t>(r)] = offset;
      for (int d = leading - 1; d >= 0; --d) {  // bump the innermost leading dim, carry out
        ++index[d];
        offset += src.strides[d];
        if (index[d] < src.shape[d]) break;
        offset -= src.strides[d] * src.shape[d];
        index[d] = 0;
      }
    }
  }

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }

  // Element (r, c) widened exactly to FP32.
  float at(std::int64_t r, std::int64_t c) const {
    const std::int64_t o = row_offset_[static_cast<std::size_t>(r)] + c * col_stride_;
    return sdk::load_f32(src_.data, src_.dtype, o);
  }

 private:
  const qr_tensor_view& src_;
  std::int64_t rows_ = 0, cols_ = 0, col_stride_ = 0;
  std::vector<std::int64_t> row_offset_;
};

// fmaxf semantics: a NaN operand never wins, so NaN elements never raise the amax.
float max_abs(float running, float x) { return std::fmax(running, num::abs_f(x)); }

}  // namespace

ScaleShape rowwise_scale_shape(std::int64_t rows, std::int64_t cols) {
  return {round_up(rows, kScaleTileLong), round_up(ceil_div(cols, kBlockSize), kScaleTileShort)};
}

ScaleShape columnwise_scale_shape(std::int64_t rows, std::int64_t cols) {
  return {round_up(ceil_div(rows, kBlockSize), kScaleTileShort), round_up(cols, kScaleTileLong)};
}

void check_data_dtype(std::int32_t data_dtype) {
  QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2,
           "mxfp8 data dtype must be e4m3 or e5m2; got ", dtype_str(data_dtype));
}

float reciprocal_max(qr_dtype data_dtype) {
  check_data_dtype(data_dtype);
  // Rounded to FP32 on purpose: TransformerEngine multiplies by this float constant, and the
  // exponent of a block whose amax sits just above 448 * 2^k can depend on that rounding.
  return data_dtype == QR_DTYPE_E4M3 ? num_mx::kRcpE4M3 : num_mx::kRcpE5M2;
}

// The arithmetic itself lives in mxfp8_numerics.hpp, shared with the CUDA kernels.
std::uint8_t block_exponent(float amax, qr_dtype data_dtype) {
  return num_mx::block_exponent(amax, reciprocal_max(data_dtype));
}

std::uint8_t encode(float x, std::uint8_t e, qr_dtype data_dtype) {
  return num_mx::encode(x, e, data_dtype == QR_DTYPE_E4M3);
}

float decode(std::uint8_t q, std::uint8_t e, qr_dtype data_dtype) {
  return num_mx::decode(q, e, data_dtype == QR_DTYPE_E4M3);
}

float amax(const qr_tensor_view& src) {
  const Source2D in(src);
  float result = 0.0f;
  if (in.rows() == 0 || in.cols() == 0) return result;
  for (std::int64_t r = 0; r < in.rows(); ++r)
    for (std::int64_t c = 0; c < in.cols(); ++c) result = max_abs(result, in.at(r, c));
  return result;
}

void quantize(const qr_tensor_view& src, qr_direction direction, qr_dtype data_dtype,
              std::uint8_t* data, std::uint8_t* scale, std::int64_t scale_row_stride) {
  check_data_dtype(data_dtype);
  const Source2D in(src);
  const std::int64_t rows = in.rows(), cols = in.cols();
  if (rows * cols == 0) return;
  QR_CHECK(data != nullptr && scale != nullptr, "mxfp8 quantize needs data and scale buffers");

  if (direction == QR_DIRECTION_ROWWISE) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < ceil_div(cols, kBlockSize); ++j) {
        const std::int64_t begin = j * kBlockSize, end = std::min(begin + kBlockSize, cols);
        float block_amax = 0.0f;
        for (std::int64_t c = begin; c < end; ++c) block_amax = max_abs(block_amax, in.at(r, c));
        const std::uint8_t e = block_exponent(block_amax, data_dtype);
        scale[r * scale_row_stride + j] = e;
        for (std::int64_t c = begin; c < end; ++c)
          data[r * cols + c] = encode(in.at(r, c), e, data_dtype);
      }
    }
    return;
  }

  QR_CHECK(direction == QR_DIRECTION_COLUMNWISE, "direction ", static_cast<int>(direction),
           " is neither rowwise (0) nor columnwise (1)");
  for (std::int64_t i = 0; i < ceil_div(rows, kBlockSize); ++i) {
    const std::int64_t begin = i * kBlockSize, end = std::min(begin + kBlockSize, rows);
    for (std::int64_t c = 0; c < cols; ++c) {
      float block_amax = 0.0f;
      for (std::int64_t r = begin; r < end; ++r) block_amax = max_abs(block_amax, in.at(r, c));
      const std::uint8_t e = block_exponent(block_amax, data_dtype);
      scale[i * scale_row_stride + c] = e;
      for (std::int64_t r = begin; r < end; ++r)
        data[r * cols + c] = encode(in.at(r, c), e, data_dtype);
    }
  }
}

void dequantize(const std::uint8_t* data, const std::uint8_t* scale,
                std::int64_t scale_row_stride, qr_dtype data_dtype, qr_direction direction,
                std::int64_t rows, std::int64_t cols, void* dst, qr_dtype dst_dtype) {
  check_data_dtype(data_dtype);
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16, QR_STATUS_UNSUPPORTED,
                "mxfp8 dequantizes into f32 or bf16; got ", dtype_str(dst_dtype));
  const bool rowwise = direction == QR_DIRECTION_ROWWISE;
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::uint8_t e = rowwise ? scale[r * scale_row_stride + c / kBlockSize]
                                     : scale[(r / kBlockSize) * scale_row_stride + c];
      const float v = decode(data[r * cols + c], e, data_dtype);
      sdk::store_f32_as(dst, dst_dtype, r * cols + c, v);  // dst_dtype is f32 or bf16
    }
  }
}

}  // namespace qrecipe::mxfp8::ref
