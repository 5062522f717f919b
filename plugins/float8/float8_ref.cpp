// CPU reference of the float8 format (see float8_ref.hpp for the rules). Every FP8 rounding
// goes through qrecipe::num (conversions.hpp), the same code the CUDA kernels run.
#include "float8_ref.hpp"

#include <cmath>

#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::ref {
namespace {

using sdk::dtype_str;
using sdk::for_each_element;

void check_fp8_dtype(qr_dtype data_dtype) {
  QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2,
           "float8 data dtype must be e4m3 or e5m2; got ", dtype_str(data_dtype));
}

void check_source(const qr_tensor_view& src) {
  sdk::check_source_view(src, "float8", sdk::SourceDevice::kHostInvalidArgument);
}

}  // namespace

float fp8_max(qr_dtype data_dtype) {
  check_fp8_dtype(data_dtype);
  return data_dtype == QR_DTYPE_E4M3 ? num::E4M3Traits::kMax : num::E5M2Traits::kMax;
}

std::uint8_t encode(float x, qr_dtype data_dtype) {
  return data_dtype == QR_DTYPE_E4M3 ? num::f32_to_e4m3(x) : num::f32_to_e5m2(x);
}

float decode(std::uint8_t code, qr_dtype data_dtype) {
  return data_dtype == QR_DTYPE_E4M3 ? num::e4m3_to_f32(code) : num::e5m2_to_f32(code);
}

float decode_scaled(std::uint8_t code, qr_dtype data_dtype, float scale_inv) {
  const float q = decode(code, data_dtype);
  // NaN codes skip the multiply: x86 keeps a NaN's payload through arithmetic while CUDA
  // returns its own canonical NaN, so the decoded NaN (0x7FC00000) is written as is.
  return num::is_nan(q) ? q : q * scale_inv;
}

float amax(const qr_tensor_view& src) {
  check_source(src);
  float result = 0.0f;
  // fmaxf returns the other operand when one is NaN, so NaN elements never win.
  for_each_element(src, [&](float v) { result = std::fmax(result, num::abs_f(v)); });
  return result;
}

float current_scale(float amax, qr_dtype data_dtype, bool pow2_scales, float amax_epsilon) {
  return scale_from_amax(amax, fp8_max(data_dtype), pow2_scales, amax_epsilon);
}

void quantize_rowwise(const qr_tensor_view& src, float scale, qr_dtype data_dtype,
                      std::uint8_t* out) {
  check_source(src);
  check_fp8_dtype(data_dtype);
  std::int64_t i = 0;
  for_each_element(src, [&](float v) { out[i++] = encode(v * scale, data_dtype); });
}

void transpose_bytes(const std::uint8_t* in, std::int64_t rows, std::int64_t cols,
                     std::uint8_t* out) {
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

void dequantize(const std::uint8_t* data, qr_dtype data_dtype, std::int64_t rows,
                std::int64_t cols, bool transposed, float scale_inv, void* dst,
                qr_dtype dst_dtype) {
  check_fp8_dtype(data_dtype);
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "float8 dequantizes into f32, bf16 or f16; got ",
                dtype_str(dst_dtype));
  if (rows == 0 || cols == 0) return;  // no data: no work, however many rows (issue 19)
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::uint8_t code = transposed ? data[c * rows + r] : data[r * cols + c];
      const float v = decode_scaled(code, data_dtype, scale_inv);
      sdk::store_f32_as(dst, dst_dtype, r * cols + c, v);
    }
  }
}

}  // namespace qrecipe::float8::ref
