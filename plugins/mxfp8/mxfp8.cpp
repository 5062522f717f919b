// mxfp8 format plugin: OCP MX FP8 with TransformerEngine's numerics. Blocks of 32 elements
// share one E8M0 (power-of-two) scale (DESIGN.md section 7, "mxfp8"; the rules themselves are
// in mxfp8_ref.hpp).
//
// Map of this file
//   1. the option schema (dtype only)
//   2. Mxfp8Quantizer: layout, compute_amax, quantize, dequantize, describe
//   3. QR_DEFINE_PLUGIN: the two exported symbols
//
// Layout, for a logical [rows, cols] = [M, K] tensor:
//   rowwise     data e4m3|e5m2 [M, K]; scale_inv e8m0 [roundup(M,128), roundup(ceil(K/32),4)];
//               blocks 1 x 32 (QR_SCALE_BLOCK); no amax
//   columnwise  data e4m3|e5m2 [M, K] (NOT transposed); scale_inv e8m0
//               [roundup(ceil(M/32),4), roundup(K,128)]; blocks 32 x 1; no amax
// Scales are stored compact (row-major) with zero padding; the 128x4 swizzle cuBLASLt wants is
// applied when a GEMM prepares its operands. Both directions are quantized independently
// from the source.
//
// mxfp8 has no tensor-level scale, so a caller-reduced amax (qr_quantize_args::amax) has
// nothing to feed and is ignored; compute_amax still reports max |x| for callers that log it.
//
// CUDA tensors run the kernels of mxfp8_kernels.cu (both directions in one pass over the
// source) when the plugin is built with CUDA; the descriptor then declares cpu|cuda. Without
// CUDA they are an UNSUPPORTED error and the descriptor declares the CPU only. A device tensor
// never falls back to the CPU reference. The kernels need contiguous sources (strided CUDA
// views are UNSUPPORTED); the reference reads any strided host view.
#include <cstdint>
#include <span>
#include <sstream>
#include <string>

#include "mxfp8_ref.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/tensor.hpp"
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
#include "mxfp8_grouped_kernels.hpp"
#include "mxfp8_kernels.hpp"
#endif

namespace qrecipe::mxfp8 {
namespace {

// ---------------------------------------------------------------- 1. options

constexpr const char* kDTypeChoices[] = {"e4m3", "e5m2"};

constexpr qr_option_schema kSchema[] = {
    sdk::option_enum("dtype", "e4m3", kDTypeChoices,
                     "FP8 element type (E4M3 max 448, E5M2 max 57344); the block scale is "
                     "E8M0 either way"),
};

qr_dtype resolve_dtype(const sdk::Options& opts) {
  const std::string dtype = opts.get_string("dtype", "e4m3");
  QR_CHECK(dtype == "e4m3" || dtype == "e5m2", "mxfp8 option dtype: '", dtype,
           "' is not e4m3 or e5m2");
  return dtype == "e5m2" ? QR_DTYPE_E5M2 : QR_DTYPE_E4M3;
}

// ---------------------------------------------------------------- 2. the quantizer

const char* direction_str(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? "rowwise" : "columnwise";
}
std::uint32_t usage_bit(qr_direction d) {
  return d == QR_DIRECTION_ROWWISE ? QR_USAGE_ROWWISE : QR_USAGE_COLUMNWISE;
}
using sdk::device_str;
using sdk::usage_name;
using sdk::view_cols;
using sdk::view_rows;

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
constexpr bool kHasCuda = true;
#else
constexpr bool kHasCuda = false;
#endif

// Every entry point calls this for the tensor that decides where it runs: CPU tensors go to
// the reference, CUDA tensors to the kernels (or an UNSUPPORTED error in a build without
// them). No silent CPU fallback.
void require_supported_device(const qr_device& device, const char* op, const char* what) {
  QR_CHECK_CODE(device.type != QR_DEVICE_CUDA || kHasCuda, QR_STATUS_UNSUPPORTED, "mxfp8 ", op,
                ": ", what, " is on cuda:", device.index,
                " but this mxfp8 plugin was built without CUDA kernels; rebuild with "
                "-DQRECIPE_CUDA=ON, or quantize on the CPU (there is no silent CPU fallback)");
  QR_CHECK_CODE(device.type == QR_DEVICE_CPU || device.type == QR_DEVICE_CUDA,
                QR_STATUS_UNSUPPORTED, "mxfp8 ", op, ": ", what, " is on unknown device type ",
                device.type);
}

// Every buffer of one call lives where the tensor that decides the device lives.
void require_same_device(const qr_device& device, const qr_device& expected, const char* op,
                         const char* what) {
  QR_CHECK(device.type == expected.type &&
               (device.type == QR_DEVICE_CPU || device.index == expected.index),
           "mxfp8 ", op, ": ", what, " is on ", device_str(device), " but the ",
           (std::string(op) == "quantize" ? "source" : "destination"), " is on ",
           device_str(expected), "; allocate it on the same device");
}

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
// The CUDA kernels read the source as contiguous row-major [rows, cols].
void require_contiguous_cuda_source(const qr_tensor_view& src, const char* op) {
  QR_CHECK_CODE(TensorView(src).is_contiguous(), QR_STATUS_UNSUPPORTED, "mxfp8 ", op,
                ": the CUDA kernels need a contiguous source, got shape ",
                TensorView(src).shape_str(), " with non-default strides; make it contiguous "
                "first (tensor.contiguous())");
}
#endif

class Mxfp8Quantizer final : public sdk::QuantizerBase {
 public:
  Mxfp8Quantizer(const qr_create_args&, const sdk::Options& opts)
      : data_dtype_(resolve_dtype(opts)) {}

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    QR_CHECK(rows >= 0 && cols >= 0, "mxfp8 layout: negative shape ", rows, " x ", cols);
    const bool rowwise = direction == QR_DIRECTION_ROWWISE;
    const ref::ScaleShape s =
        rowwise ? ref::rowwise_scale_shape(rows, cols) : ref::columnwise_scale_shape(rows, cols);
    qr_direction_layout l = sdk::empty_layout("mxfp8");
    l.data_dtype = data_dtype_;
    l.data_ndim = 2;
    l.data_shape[0] = rows;  // both directions keep the logical [M, K] order
    l.data_shape[1] = cols;
    l.data_transposed = 0;
    l.scale_mode = QR_SCALE_BLOCK;
    l.scale_dtype = QR_DTYPE_E8M0;
    l.scale_ndim = 2;
    l.scale_shape[0] = s.rows;
    l.scale_shape[1] = s.cols;
    l.scale_transposed = 0;
    l.block_rows = rowwise ? 1 : static_cast<std::int32_t>(ref::kBlockSize);
    l.block_cols = rowwise ? static_cast<std::int32_t>(ref::kBlockSize) : 1;
    l.has_amax = 0;
    return l;
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    require_supported_device(src.device, "compute_amax", "the source");
    float a = 0.0f;
    if (src.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      require_contiguous_cuda_source(src, "compute_amax");
      a = cuda::compute_amax_to_host(src.data, static_cast<qr_dtype>(src.dtype),
                                     TensorView(src).numel(), src.device.index, stream);
#endif
    } else {
      (void)stream;
      a = ref::amax(src);
    }
    amax_out[0] = a;  // both directions see the same elements
    amax_out[1] = a;
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    const std::uint32_t usage = sdk::check_quantize_usage(args, dst, "mxfp8");
    require_supported_device(src.device, "quantize", "the source");
    const std::int64_t rows = view_rows(src), cols = view_cols(src);
    QR_CHECK(dst.rows == rows && dst.cols == cols, "mxfp8 quantize: the source is ", rows, " x ",
             cols, " (as 2-D) but the destination is ", dst.rows, " x ", dst.cols);
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
      if (usage & usage_bit(d))
        check_buffers(direction_data(dst, d), d, rows, cols, data_dtype_, "quantize",
                      src.device);
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_cuda(src, usage, dst, args.stream);
      return;
    }
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!(usage & usage_bit(d))) continue;
      qr_direction_data& dd = direction_data(dst, d);
      ref::quantize(src, d, data_dtype_, static_cast<std::uint8_t*>(dd.data.data),
                    static_cast<std::uint8_t*>(dd.scale_inv.data), dd.scale_inv.shape[1]);
    }
  }

  // Measured on an H100 (test_gpu_grouped, BF16, both directions): 8 groups of 2048 x 1024
  // took 0.080 ms grouped against 0.056 ms group by group, while 64 of 256 x 1024 took 0.084
  // against 0.28 and 128 of 64 x 512 0.03 against 0.49. Group by group when the groups
  // average at least 1024 rows.
  static bool few_large_groups(std::span<const std::int64_t> group_rows) {
    std::int64_t rows = 0;
    for (const std::int64_t r : group_rows) rows += r;
    return rows >= 1024 * static_cast<std::int64_t>(group_rows.size());
  }

  // Grouped quantization (the descriptor's quantize_grouped extra, plugin_abi.h: each group
  // byte-identical to quantizing its rows alone; plugin_sdk.hpp has checked the generic
  // arguments). CPU: the reference, group after group. CUDA: mxfp8_grouped_kernels.cu, ONE
  // launch for all groups and both directions (mxfp8 has no tensor-level quantity), unless
  // the groups are few and large (few_large_groups).
  void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                        const qr_quantize_args& args, std::span<qr_quantized_tensor* const> dst) {
    sdk::check_source_view(src, "mxfp8");
    require_supported_device(src.device, "quantize_grouped", "the source");
    // On CUDA, large groups take the one-tensor kernel each: its tuned tiles outrun the
    // grouped kernel's simple ones there, and its launches are too few to matter (same bytes).
    if (src.device.type != QR_DEVICE_CUDA || few_large_groups(group_rows)) {
      sdk::quantize_each_group(*this, src, group_rows, args, dst);
      return;
    }
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    require_contiguous_cuda_source(src, "quantize_grouped");
    const std::int64_t cols = view_cols(src);
    cuda::GroupedQuantizeArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.cols = cols;
    a.data_dtype = data_dtype_;
    a.rowwise = (args.usage & QR_USAGE_ROWWISE) != 0;
    a.columnwise = (args.usage & QR_USAGE_COLUMNWISE) != 0;
    a.rowwise_scale_ld = ref::rowwise_scale_shape(0, cols).cols;
    a.columnwise_scale_ld = ref::columnwise_scale_shape(0, cols).cols;
    a.groups.resize(dst.size());
    for (std::size_t g = 0; g < dst.size(); ++g) {
      qr_quantized_tensor& t = *dst[g];
      const std::uint32_t usage = sdk::check_quantize_usage(args, t, "mxfp8");
      for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
        if (usage & usage_bit(d))
          check_buffers(direction_data(t, d), d, group_rows[g], cols, data_dtype_,
                        "quantize_grouped", src.device);
      cuda::GroupOutputs& o = a.groups[g];
      o.rows = group_rows[g];
      if (a.rowwise) {
        o.rowwise_data = static_cast<std::uint8_t*>(t.rowwise.data.data);
        o.rowwise_scale = static_cast<std::uint8_t*>(t.rowwise.scale_inv.data);
      }
      if (a.columnwise) {
        o.columnwise_data = static_cast<std::uint8_t*>(t.columnwise.data.data);
        o.columnwise_scale = static_cast<std::uint8_t*>(t.columnwise.scale_inv.data);
      }
    }
    a.device_index = src.device.index;
    a.stream = args.stream;
    cuda::quantize_grouped(a);
#endif
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    const char* dir = direction_str(direction);
    QR_CHECK(src.usage & usage_bit(direction), "mxfp8 dequantize: the tensor holds ",
             usage_name(src.usage), " data, not ", dir);
    const qr_direction_data& dd = direction_data(src, direction);
    const auto data_dtype = static_cast<qr_dtype>(dd.data.dtype);
    QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2, "mxfp8 dequantize: ",
             dir, " data has dtype ", ref::dtype_str(data_dtype),
             "; expected e4m3 or e5m2 (was it made by another format?)");
    // Decode with the dtype the data was made with, which may differ from this quantizer's.
    QR_CHECK(dd.layout.data_transposed == 0 && dd.layout.scale_mode == QR_SCALE_BLOCK &&
                 dd.scale_inv.dtype == QR_DTYPE_E8M0,
             "mxfp8 dequantize: ", dir, " data is not in the mxfp8 layout (transposed ",
             dd.layout.data_transposed, ", scale mode ", dd.layout.scale_mode, ", scale dtype ",
             ref::dtype_str(dd.scale_inv.dtype), "); was it made by another format?");
    require_supported_device(dst.device, "dequantize", "the destination");
    check_buffers(dd, direction, src.rows, src.cols, data_dtype, "dequantize", dst.device);
    const auto dst_dtype = static_cast<qr_dtype>(dst.dtype);
    QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16, QR_STATUS_UNSUPPORTED,
                  "mxfp8 dequantize: the destination must be f32 or bf16; got ",
                  ref::dtype_str(dst_dtype));
    QR_CHECK(view_rows(dst) == src.rows && view_cols(dst) == src.cols,
             "mxfp8 dequantize: destination is ", view_rows(dst), " x ", view_cols(dst),
             " (as 2-D) but the tensor is ", src.rows, " x ", src.cols);
    QR_CHECK(TensorView(dst).is_contiguous(),
             "mxfp8 dequantize: the destination must be contiguous");
    QR_CHECK(dst.data != nullptr || src.rows * src.cols == 0,
             "mxfp8 dequantize: the destination has no data pointer");
    if (dst.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      cuda::dequantize(static_cast<const std::uint8_t*>(dd.data.data),
                       static_cast<const std::uint8_t*>(dd.scale_inv.data), dd.scale_inv.shape[1],
                       data_dtype, direction, src.rows, src.cols, dst.data, dst_dtype,
                       dst.device.index, stream);
#endif
      return;
    }
    (void)stream;
    ref::dequantize(static_cast<const std::uint8_t*>(dd.data.data),
                    static_cast<const std::uint8_t*>(dd.scale_inv.data), dd.scale_inv.shape[1],
                    data_dtype, direction, src.rows, src.cols, dst.data, dst_dtype);
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "mxfp8{dtype=" << (data_dtype_ == QR_DTYPE_E4M3 ? "e4m3" : "e5m2")
       << ", block=" << ref::kBlockSize << ", scale=e8m0}";
    return os.str();
  }

 private:
  static const qr_direction_data& direction_data(const qr_quantized_tensor& t, qr_direction d) {
    return d == QR_DIRECTION_ROWWISE ? t.rowwise : t.columnwise;
  }
  static qr_direction_data& direction_data(qr_quantized_tensor& t, qr_direction d) {
    return d == QR_DIRECTION_ROWWISE ? t.rowwise : t.columnwise;
  }

  // The buffers of one direction must be exactly what `layout` describes (dtype, shapes,
  // contiguous, on `device`): the reference and the kernels index them with those shapes.
  void check_buffers(const qr_direction_data& dd, qr_direction d, std::int64_t rows,
                     std::int64_t cols, qr_dtype data_dtype, const char* op,
                     const qr_device& device) const {
    const char* dir = direction_str(d);
    const qr_direction_layout want = layout(rows, cols, d);
    QR_CHECK(dd.struct_size >= sizeof(qr_direction_data), "mxfp8 ", op, ": ", dir,
             " qr_direction_data struct_size ", dd.struct_size, " is smaller than this build's ",
             sizeof(qr_direction_data));
    require_same_device(dd.data.device, device, op, "the data buffer");
    require_same_device(dd.scale_inv.device, device, op, "the scale buffer");
    QR_CHECK(dd.data.dtype == data_dtype, "mxfp8 ", op, ": ", dir, " data has dtype ",
             ref::dtype_str(dd.data.dtype), "; expected ", ref::dtype_str(data_dtype),
             ". Allocate it from this quantizer's layout");
    const TensorView data(dd.data), scale(dd.scale_inv);
    QR_CHECK(data.ndim() == 2 && data.size(0) == rows && data.size(1) == cols &&
                 data.is_contiguous(),
             "mxfp8 ", op, ": ", dir, " data is ", data.shape_str(),
             (data.is_contiguous() ? "" : " strided"),
             "; expected contiguous [", rows, ", ", cols, "] (not transposed)");
    QR_CHECK(scale.dtype() == DType::e8m0 && scale.ndim() == 2 &&
                 scale.size(0) == want.scale_shape[0] && scale.size(1) == want.scale_shape[1] &&
                 scale.is_contiguous(),
             "mxfp8 ", op, ": ", dir, " scale_inv is ", scale.str(), "; expected contiguous e8m0[",
             want.scale_shape[0], ", ", want.scale_shape[1], "] for a ", rows, " x ", cols,
             " tensor. Allocate it from this quantizer's layout");
    QR_CHECK((dd.data.data != nullptr && dd.scale_inv.data != nullptr) || rows * cols == 0,
             "mxfp8 ", op, ": ", dir, " data or scale_inv pointer is null");
  }

  // Both requested directions in one kernel pass; buffers were checked by the caller.
  void quantize_cuda(const qr_tensor_view& src, std::uint32_t usage, qr_quantized_tensor& dst,
                     void* stream) const {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    require_contiguous_cuda_source(src, "quantize");
    cuda::QuantizeArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.rows = dst.rows;
    a.cols = dst.cols;
    a.data_dtype = data_dtype_;
    if (usage & QR_USAGE_ROWWISE) {
      a.rowwise_data = static_cast<std::uint8_t*>(dst.rowwise.data.data);
      a.rowwise_scale = static_cast<std::uint8_t*>(dst.rowwise.scale_inv.data);
      a.rowwise_scale_ld = dst.rowwise.scale_inv.shape[1];
    }
    if (usage & QR_USAGE_COLUMNWISE) {
      a.columnwise_data = static_cast<std::uint8_t*>(dst.columnwise.data.data);
      a.columnwise_scale = static_cast<std::uint8_t*>(dst.columnwise.scale_inv.data);
      a.columnwise_scale_ld = dst.columnwise.scale_inv.shape[1];
    }
    a.device_index = src.device.index;
    a.stream = stream;
    cuda::quantize(a);
#else
    (void)src;
    (void)usage;
    (void)dst;
    (void)stream;
#endif
  }

  qr_dtype data_dtype_;
};

constexpr std::uint32_t kDevices = sdk::kBuiltDevices;

}  // namespace
}  // namespace qrecipe::mxfp8

// ---------------------------------------------------------------- 3. exported symbols

QR_DEFINE_PLUGIN(qrecipe::mxfp8::Mxfp8Quantizer, "mxfp8", "1.0.0",
                 "MXFP8: E4M3/E5M2 elements in blocks of 32 sharing an E8M0 scale",
                 qrecipe::mxfp8::kSchema, qrecipe::mxfp8::kDevices)
