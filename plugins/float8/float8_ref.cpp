// CPU reference of the float8 format (see float8_ref.hpp for the rules). Every FP8 rounding
// goes through qrecipe::num (conversions.hpp), the same code the CUDA kernels run.
#include "float8_ref.hpp"

#include <cmath>

#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::ref {
namespace {

void check_fp8_dtype(qr_dtype data_dtype) {
  QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2,
           "float8 data dtype must be e4m3 or e5m2; got ", dtype_str(data_dtype));
}

// Reads element `offset` (in elements) of a f32/bf16/f16 buffer as FP32 (exact widening).
float load_f32(const void* base, std::int32_t dtype, std::int64_t offset) {
  switch (dtype) {
    case QR_DTYPE_F32: return static_cast<const float*>(base)[offset];
    case QR_DTYPE_BF16: return num::bf16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
    default: return num::f16_to_f32(static_cast<const std::uint16_t*>(base)[offset]);
  }
}

void check_source(const qr_tensor_view& src) {
  QR_CHECK(src.struct_size >= sizeof(qr_tensor_view), "source view struct_size ",
           src.struct_size, " is smaller than this build's ", sizeof(qr_tensor_view));
  QR_CHECK(src.ndim >= 0 && src.ndim <= QR_MAX_DIMS, "source view has ndim ", src.ndim,
           "; expected 0..", QR_MAX_DIMS);
  QR_CHECK_CODE(src.dtype == QR_DTYPE_F32 || src.dtype == QR_DTYPE_BF16 ||
                    src.dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "float8 quantizes f32, bf16 or f16 sources; got ",
                dtype_str(src.dtype), ". Convert the tensor to one of those first");
  QR_CHECK(src.device.type == QR_DEVICE_CPU,
           "the float8 CPU reference reads host memory; the source is on cuda:", src.device.index);
  for (int d = 0; d < src.ndim; ++d)
    QR_CHECK(src.shape[d] >= 0, "source dimension ", d, " is negative (", src.shape[d], ")");
}

std::int64_t numel(const qr_tensor_view& v) {
  std::int64_t n = 1;
  for (int d = 0; d < v.ndim; ++d) n *= v.shape[d];
  return n;
}

// Calls fn(value) for every element of src in logical row-major order. Strided views are
// walked with an N-D counter, so any strides (including 0 and negative) are fine.
template <class Fn>
void for_each_element(const qr_tensor_view& src, Fn&& fn) {
  const std::int64_t n = numel(src);
  if (n == 0) return;
  std::int64_t index[QR_MAX_DIMS] = {};
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    fn(load_f32(src.data, src.dtype, offset));
    // Advance the counter: bump the last dimension, carrying into earlier ones.
    for (int d = src.ndim - 1; d >= 0; --d) {
      ++index[d];
      offset += src.strides[d];
      if (index[d] < src.shape[d]) break;
      offset -= src.strides[d] * src.shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace

const char* dtype_str(std::int32_t dtype) {
  if (dtype < QR_DTYPE_F32 || dtype > QR_DTYPE_F64) return "unknown dtype";
  return dtype_name(static_cast<DType>(dtype)).data();  // names are NUL-terminated literals
}

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
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::uint8_t code = transposed ? data[c * rows + r] : data[r * cols + c];
      const float v = decode_scaled(code, data_dtype, scale_inv);
      const std::int64_t o = r * cols + c;
      switch (dst_dtype) {
        case QR_DTYPE_F32: static_cast<float*>(dst)[o] = v; break;
        case QR_DTYPE_BF16: static_cast<std::uint16_t*>(dst)[o] = num::f32_to_bf16(v); break;
        default: static_cast<std::uint16_t*>(dst)[o] = num::f32_to_f16(v); break;
      }
    }
  }
}

}  // namespace qrecipe::float8::ref
