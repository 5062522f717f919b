// fp8_per_row: a small but complete qrecipe format plugin, built out of tree against an
// installed qrecipe (docs/plugins.md walks through it line by line).
//
// Format: FP8 E4M3 codes with one FP32 scale per row (rowwise) or per column (columnwise).
//   rowwise     amax_i    = max_j |x[i][j]|                      (NaN ignored, like fmaxf)
//               scale_i   = scale_from_amax(amax_i, 448, pow2_scales, 0)   (1.0 for 0 / inf)
//               q[i][j]   = e4m3(fp32(x[i][j]) * scale_i)        (round to nearest even, saturate)
//               scale_inv = 1 / scale_i                          (IEEE division)
//               data e4m3 [rows, cols], scale_inv f32 [rows]; blocks of 1 x cols
//   columnwise  the same per column j; the data is stored transposed, [cols, rows], so each
//               stored row shares one scale; scale_inv f32 [cols]; blocks of rows x 1
//   decode      e4m3_to_f32(q) * scale_inv, then rounded to the output dtype (f32 or bf16)
// A caller-reduced tensor amax (QuantizeOptions::amax) means nothing for per-row scales, so
// it is refused as UNSUPPORTED rather than silently ignored.
//
// Map: 1. option schema  2. reading a strided source  3. the quantizer  4. QR_DEFINE_PLUGIN
#include <algorithm>
#include <cstdint>
#include <string>

#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/scaling.hpp"
#include "qrecipe/tensor.hpp"

namespace fp8_per_row {
namespace {

namespace num = qrecipe::num;
namespace sdk = qrecipe::sdk;

constexpr const char* kFormat = "fp8_per_row";
constexpr float kE4M3Max = 448.0f;

// ---------------------------------------------------------------- 1. options

// Static data: the engine validates recipes against it before the plugin sees an option.
constexpr qr_option_schema kSchema[] = {
    sdk::option_bool("pow2_scales", "false",
                     "round each scale down to a power of two, so scale_inv is exact"),
};

// ---------------------------------------------------------------- 2. source access

// Element (i, j) of the logical 2-D view [prod(leading dims), last dim] of any strided view.
float load(const qr_tensor_view& v, std::int64_t i, std::int64_t j) {
  std::int64_t offset = v.ndim >= 1 ? j * v.strides[v.ndim - 1] : 0;
  for (int d = v.ndim - 2; d >= 0; --d) {
    offset += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  switch (v.dtype) {
    case QR_DTYPE_F32: return static_cast<const float*>(v.data)[offset];
    case QR_DTYPE_BF16: return num::bf16_to_f32(static_cast<const std::uint16_t*>(v.data)[offset]);
    case QR_DTYPE_F16: return num::f16_to_f32(static_cast<const std::uint16_t*>(v.data)[offset]);
    default: QR_THROW(kFormat, ": source dtype code ", v.dtype, " is not f32, bf16 or f16");
  }
}

// ---------------------------------------------------------------- 3. the quantizer

class Quantizer final : public sdk::QuantizerBase {
 public:
  Quantizer(const qr_create_args&, const sdk::Options& options)
      : pow2_scales_(options.get_bool("pow2_scales", false)) {}

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    const bool rowwise = direction == QR_DIRECTION_ROWWISE;
    qr_direction_layout l = sdk::empty_layout(kFormat);
    l.data_dtype = QR_DTYPE_E4M3;
    l.data_ndim = 2;
    l.data_shape[0] = rowwise ? rows : cols;
    l.data_shape[1] = rowwise ? cols : rows;
    l.data_transposed = rowwise ? 0 : 1;
    l.scale_mode = QR_SCALE_BLOCK;
    l.scale_dtype = QR_DTYPE_F32;
    l.scale_ndim = 1;
    l.scale_shape[0] = rowwise ? rows : cols;  // one scale per line
    l.block_rows = rowwise ? 1 : std::max<std::int64_t>(rows, 1);
    l.block_cols = rowwise ? std::max<std::int64_t>(cols, 1) : 1;
    return l;
  }

  void compute_amax(const qr_tensor_view& src, void*, float amax_out[2]) override {
    const qrecipe::TensorView view(src);
    float amax = 0.0f;
    for (std::int64_t i = 0; i < view.rows(); ++i)
      for (std::int64_t j = 0; j < view.cols(); ++j) {
        const float a = num::abs_f(load(src, i, j));
        if (a > amax) amax = a;  // false for NaN: NaN is ignored
      }
    amax_out[0] = amax_out[1] = amax;  // informational: scales come from each line
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    QR_CHECK_CODE(args.amax == nullptr, QR_STATUS_UNSUPPORTED, kFormat,
                  " scales each row (column) by its own amax; a caller-reduced tensor amax "
                  "cannot be applied. Reduce the source instead, or use a per-tensor format");
    if (args.usage & QR_USAGE_ROWWISE) quantize_lines(src, dst.rows, dst.cols, true, dst.rowwise);
    if (args.usage & QR_USAGE_COLUMNWISE)
      quantize_lines(src, dst.rows, dst.cols, false, dst.columnwise);
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void*) override {
    const bool rowwise = direction == QR_DIRECTION_ROWWISE;
    const qr_direction_data& d = rowwise ? src.rowwise : src.columnwise;
    const auto* q = static_cast<const std::uint8_t*>(d.data.data);
    const auto* scale_inv = static_cast<const float*>(d.scale_inv.data);
    const std::int64_t len = rowwise ? src.cols : src.rows;  // elements per stored line
    for (std::int64_t i = 0; i < src.rows; ++i)
      for (std::int64_t j = 0; j < src.cols; ++j) {
        const std::int64_t line = rowwise ? i : j, k = rowwise ? j : i;
        const float v = num::e4m3_to_f32(q[line * len + k]) * scale_inv[line];
        if (dst.dtype == QR_DTYPE_BF16)
          static_cast<std::uint16_t*>(dst.data)[i * src.cols + j] = num::f32_to_bf16(v);
        else
          static_cast<float*>(dst.data)[i * src.cols + j] = v;
      }
  }

  std::string describe() const override {
    return std::string(kFormat) + "{pow2_scales=" + (pow2_scales_ ? "true" : "false") + "}";
  }

 private:
  // One scale per line: rows when `rowwise`, else columns (stored transposed).
  void quantize_lines(const qr_tensor_view& src, std::int64_t rows, std::int64_t cols,
                      bool rowwise, qr_direction_data& out) const {
    auto* q = static_cast<std::uint8_t*>(out.data.data);
    auto* scale_inv = static_cast<float*>(out.scale_inv.data);
    const std::int64_t lines = rowwise ? rows : cols, len = rowwise ? cols : rows;
    for (std::int64_t line = 0; line < lines; ++line) {
      auto at = [&](std::int64_t k) { return rowwise ? load(src, line, k) : load(src, k, line); };
      float amax = 0.0f;
      for (std::int64_t k = 0; k < len; ++k) {
        const float a = num::abs_f(at(k));
        if (a > amax) amax = a;
      }
      const float scale = qrecipe::scale_from_amax(amax, kE4M3Max, pow2_scales_, 0.0f);
      for (std::int64_t k = 0; k < len; ++k) q[line * len + k] = num::f32_to_e4m3(at(k) * scale);
      scale_inv[line] = 1.0f / scale;
    }
  }

  bool pow2_scales_;
};

}  // namespace
}  // namespace fp8_per_row

// ---------------------------------------------------------------- 4. the two exported symbols

QR_DEFINE_PLUGIN(fp8_per_row::Quantizer, "fp8_per_row", "1.0.0",
                 "FP8 E4M3 with one FP32 scale per row (rowwise) or column (columnwise); "
                 "an example out-of-tree plugin",
                 fp8_per_row::kSchema, 1u << QR_DEVICE_CPU)
