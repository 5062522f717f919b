// mxfp8 format plugin: OCP MX FP8 with TransformerEngine's numerics. Blocks of 32 elements
// share one E8M0 (power-of-two) scale (docs/numerics.md, "mxfp8"; the rules themselves are
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
#include <vector>

#include "mxfp8_adam_kernels.hpp"
#include "mxfp8_numerics.hpp"
#include "mxfp8_ref.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_adam.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
// No CUDA types in these two (their functions are defined only in CUDA builds); the
// device-split size bounds are inline and used by every build.
#include "mxfp8_grouped_kernels.hpp"
#include "mxfp8_kernels.hpp"

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

constexpr const char* kFormat = "mxfp8";

using sdk::view_cols;
using sdk::view_rows;

class Mxfp8Quantizer final : public sdk::QuantizerBase {
 public:
  Mxfp8Quantizer(const qr_create_args&, const sdk::Options& opts)
      : data_dtype_(resolve_dtype(opts)) {}

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    return layout_of(rows, cols, direction, data_dtype_);
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    sdk::require_supported_device(src.device, kFormat, "compute_amax", "the source");
    float a = 0.0f;
    if (src.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      sdk::require_contiguous_source(src, kFormat, "compute_amax");
      a = cuda::compute_amax_to_host(src.data, static_cast<qr_dtype>(src.dtype),
                                     sdk::numel(src), src.device.index, stream);
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
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, dst, kFormat, "quantize", *this);
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_cuda(src, usage, dst, args.stream);
      return;
    }
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!(usage & sdk::usage_of(d))) continue;
      qr_direction_data& dd = sdk::direction_data(dst, d);
      ref::quantize(src, d, data_dtype_, static_cast<std::uint8_t*>(dd.data.data),
                    static_cast<std::uint8_t*>(dd.scale_inv.data), dd.scale_inv.shape[1]);
    }
  }

  // Quantize and decode in one pass (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED; the trampoline
  // checked usage and miss words). CPU: the reference, i.e. the definition: quantize, then each
  // stored element's q * 2^(e-127) (num_mx::decode, the engine decoder's one FP32 multiply)
  // as sdk::decoded_bf16 writes it. CUDA: the quantize kernel writes them from the codes it
  // has just made (mxfp8_kernels.cu, same arithmetic).
  void quantize_decoded(const qr_tensor_view& src, const qr_quantize_args& args,
                        qr_quantized_tensor& dst, const qr_decoded_output& decoded) {
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_decoded_cuda(src, args, dst, decoded);
      return;
    }
    quantize(src, args, dst);
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (decoded.values[d] == nullptr) continue;
      const qr_direction_data& dd = sdk::direction_data(dst, d);
      const auto* codes = static_cast<const std::uint8_t*>(dd.data.data);
      const auto* scales = static_cast<const std::uint8_t*>(dd.scale_inv.data);
      const std::int64_t ld = dd.scale_inv.shape[1], rows = dst.rows, cols = dst.cols;
      const bool rowwise = d == QR_DIRECTION_ROWWISE, e4m3 = data_dtype_ == QR_DTYPE_E4M3;
      std::uint32_t miss = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::uint8_t e = rowwise ? scales[r * ld + c / ref::kBlockSize]
                                         : scales[(r / ref::kBlockSize) * ld + c];
          decoded.values[d][r * cols + c] =
              sdk::decoded_bf16(num_mx::decode(codes[r * cols + c], e, e4m3), miss);
        }
      if (miss) *decoded.miss[d] = miss;
    }
  }

  // Measured on an H100 (test_gpu_grouped, BF16, both directions) with the grouped kernel's
  // former 32 x 128 tiles: 8 groups of 2048 x 1024 took 0.080 ms grouped against 0.056 ms
  // group by group, while 64 of 256 x 1024 took 0.084 against 0.28 and 128 of 64 x 512 0.03
  // against 0.49. Group by group when the groups average at least 1024 rows. (The grouped
  // kernel now runs the one-tensor tile: re-measure before changing the threshold.)
  static bool few_large_groups(std::span<const std::int64_t> group_rows) {
    std::int64_t rows = 0;
    for (const std::int64_t r : group_rows) rows += r;
    return rows >= 1024 * static_cast<std::int64_t>(group_rows.size());
  }

  // Grouped quantization (the descriptor's quantize_grouped extra, plugin_abi.h: each group
  // byte-identical to quantizing its rows alone; plugin_sdk.hpp has checked the generic
  // arguments). CPU: the reference, group after group. CUDA: every group's kernel arguments
  // exactly as quantize builds them for that group alone, all groups in ONE launch
  // (mxfp8_grouped_kernels.cu; mxfp8 has no tensor-level quantity), unless the groups are few
  // and large (few_large_groups).
  void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                        const qr_quantize_args& args, std::span<qr_quantized_tensor* const> dst) {
    sdk::check_source_view(src, kFormat);
    sdk::require_supported_device(src.device, kFormat, "quantize_grouped", "the source");
    // On CUDA, large groups take the one-tensor kernel each (same bytes): its launches are too
    // few to matter there.
    if (src.device.type != QR_DEVICE_CUDA || few_large_groups(group_rows)) {
      sdk::quantize_each_group(*this, src, group_rows, args, dst);
      return;
    }
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize_grouped");
    std::vector<cuda::QuantizeArgs> groups;
    groups.reserve(dst.size());
    sdk::for_each_group(src, group_rows, dst,
                        [&](const qr_tensor_view& rows, qr_quantized_tensor& out) {
                          const std::uint32_t usage = sdk::check_quantize_call(
                              rows, args, out, kFormat, "quantize_grouped", *this);
                          groups.push_back(cuda_args(rows, usage, out, args.stream));
                        });
    cuda::quantize_grouped(groups);
#endif
  }

  // Device-split grouped quantization (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE; CUDA):
  // the packed layout of mxfp8_grouped_kernels.hpp, one launch after a small layout kernel.
  void grouped_device_sizes(std::int64_t rows, std::int64_t cols, std::uint32_t groups,
                            qr_direction d, std::size_t& data, std::size_t& scales) const {
    const bool columnwise = d == QR_DIRECTION_COLUMNWISE;
    const std::int64_t ld = columnwise ? ref::columnwise_scale_shape(0, cols).cols
                                       : ref::rowwise_scale_shape(0, cols).cols;
    data = static_cast<std::size_t>(qrecipe::checked_mul(rows, cols, "device-split grouped data bytes"));
    scales = static_cast<std::size_t>(cuda::device_scale_bytes(rows, ld, groups, columnwise));
  }

  void quantize_grouped_device(const qr_tensor_view& src, const qr_quantize_args& args,
                               qr_grouped_quantized& dst) {
    sdk::check_grouped_device_source(src, kFormat);
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DeviceGroupedArgs a;
    cuda::QuantizeArgs& b = a.base;
    b.src = src.data;
    b.src_dtype = static_cast<qr_dtype>(src.dtype);
    b.rows = dst.rows;
    b.cols = dst.cols;
    b.data_dtype = data_dtype_;
    b.device_index = src.device.index;
    b.stream = args.stream;
    a.groups = static_cast<int>(dst.num_groups);
    a.offsets = dst.offsets;
    if (args.usage & QR_USAGE_ROWWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_ROWWISE, false, kFormat);
      b.rowwise_data = static_cast<std::uint8_t*>(d.data);
      b.rowwise_scale = static_cast<std::uint8_t*>(d.scale_inv);
      b.rowwise_scale_ld = ref::rowwise_scale_shape(0, dst.cols).cols;
      a.rowwise_table = d.groups;
    }
    if (args.usage & QR_USAGE_COLUMNWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_COLUMNWISE, false, kFormat);
      b.columnwise_data = static_cast<std::uint8_t*>(d.data);
      b.columnwise_scale = static_cast<std::uint8_t*>(d.scale_inv);
      b.columnwise_scale_ld = ref::columnwise_scale_shape(0, dst.cols).cols;
      a.columnwise_table = d.groups;
    }
    cuda::quantize_grouped_device(a);
#else
    (void)args;  // unreachable: check_grouped_device_source refuses CUDA sources in this build
    (void)dst;
#endif
  }

  // The fused Adam + requantize extra (plugin_sdk_adam.hpp, mxfp8_adam_kernels.cu): what the
  // fused kernel needs (t's destination is checked against layout() already).
  cuda::AdamPlan adam_plan(const qr_adam_tensor& t) const {
    cuda::AdamPlan p;
    p.data_dtype = data_dtype_;
    p.rowwise_scale_ld = t.dst->rowwise.layout.scale_shape[1];
    p.columnwise_scale_ld = t.dst->columnwise.layout.scale_shape[1];
    return p;
  }

  // The hybrid fusion extra QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST (plugin_abi.h): quantize the
  // columnwise direction and write another format's per-tensor cast (float8's rowwise side of
  // a hybrid) from the same read of the source: the CTA tile that makes the 32x1 blocks also
  // casts its elements with the one scale (mxfp8_device.cuh, Cast). Supported: CUDA, a
  // contiguous bf16 / f16 source, this quantizer's columnwise direction alone, an e4m3 / e5m2
  // cast that is not transposed (the cast shares the source's [rows, cols] order, as the MX
  // data does). Anything else is UNSUPPORTED before a byte is written.
  void quantize_with_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
                                 qr_quantized_tensor* dst, const qr_tensor_cast& cast) {
    const bool cuda_source = src.device.type == QR_DEVICE_CUDA && sdk::kHasCuda;
    bool supported = cuda_source && sdk::is_contiguous(src) && cast.transposed == 0;
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    supported = supported && cuda::quantize_with_cast_supported(
                                 static_cast<qr_dtype>(src.dtype),
                                 (args.usage & QR_USAGE_ROWWISE) != 0,
                                 (args.usage & QR_USAGE_COLUMNWISE) != 0,
                                 static_cast<qr_dtype>(cast.dtype));
#endif
    QR_CHECK_CODE(supported, QR_STATUS_UNSUPPORTED, "mxfp8 quantize_with_tensor_cast: needs a "
                  "contiguous bf16 / f16 CUDA source, usage columnwise alone and an untransposed "
                  "e4m3 / e5m2 cast; got ", sdk::dtype_str(static_cast<qr_dtype>(src.dtype)),
                  " on ", sdk::device_str(src.device), ", usage ", args.usage, ", cast dtype ",
                  sdk::dtype_str(static_cast<qr_dtype>(cast.dtype)), (cast.transposed ?
                  " transposed" : ""));
    if (dst == nullptr) return;  // a probe
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, *dst, kFormat, "quantize_with_tensor_cast", *this);
    QR_CHECK(cast.data != nullptr && (cast.scale != nullptr || cast.amax != nullptr),
             "mxfp8 quantize_with_tensor_cast: the cast has no data buffer, or neither a scale "
             "nor an amax");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::QuantizeArgs a = cuda_args(src, usage, *dst, args.stream);
    a.cast = cast;
    cuda::quantize(a);
#else
    (void)usage;
#endif
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    const qr_direction_data& dd = sdk::check_dequantize_call(src, direction, dst, kFormat);
    // Decode with the dtype the data was made with, which may differ from this quantizer's.
    const auto data_dtype = static_cast<qr_dtype>(dd.layout.data_dtype);
    QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2, "mxfp8 dequantize: ",
             sdk::direction_str(direction), " data has dtype ", sdk::dtype_str(data_dtype),
             "; expected e4m3 or e5m2 (was it made by another format?)");
    sdk::check_stored(dd, layout_of(src.rows, src.cols, direction, data_dtype), direction,
                      dst.device, kFormat);
    const auto dst_dtype = static_cast<qr_dtype>(dst.dtype);
    QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16, QR_STATUS_UNSUPPORTED,
                  "mxfp8 dequantize: the destination must be f32 or bf16; got ",
                  sdk::dtype_str(dst_dtype));
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
  // The layout of a [rows, cols] tensor with `data_dtype` elements (this quantizer's, or the
  // one a stored tensor was made with).
  static qr_direction_layout layout_of(std::int64_t rows, std::int64_t cols,
                                       qr_direction direction, qr_dtype data_dtype) {
    QR_CHECK(rows >= 0 && cols >= 0, "mxfp8 layout: negative shape ", rows, " x ", cols);
    const bool rowwise = direction == QR_DIRECTION_ROWWISE;
    const ref::ScaleShape s =
        rowwise ? ref::rowwise_scale_shape(rows, cols) : ref::columnwise_scale_shape(rows, cols);
    qr_direction_layout l = sdk::empty_layout(kFormat);
    l.data_dtype = data_dtype;
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


  // Both requested directions in one kernel pass; buffers were checked by the caller.
  void quantize_cuda(const qr_tensor_view& src, std::uint32_t usage, qr_quantized_tensor& dst,
                     void* stream) const {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize");
    cuda::quantize(cuda_args(src, usage, dst, stream));
#else
    (void)src;  // unreachable: check_quantize_call refuses CUDA sources in this build
    (void)usage;
    (void)dst;
    (void)stream;
#endif
  }

  // The CUDA side of quantize_decoded: the one quantize launch, with the decoded outputs.
  void quantize_decoded_cuda(const qr_tensor_view& src, const qr_quantize_args& args,
                             qr_quantized_tensor& dst, const qr_decoded_output& decoded) const {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, dst, kFormat, "quantize_decoded", *this);
    sdk::require_contiguous_source(src, kFormat, "quantize_decoded");
    cuda::QuantizeArgs a = cuda_args(src, usage, dst, args.stream);
    a.rowwise_decoded = decoded.values[QR_DIRECTION_ROWWISE];
    a.rowwise_miss = decoded.miss[QR_DIRECTION_ROWWISE];
    a.columnwise_decoded = decoded.values[QR_DIRECTION_COLUMNWISE];
    a.columnwise_miss = decoded.miss[QR_DIRECTION_COLUMNWISE];
    cuda::quantize(a);
#else
    (void)args;
    (void)dst;
    (void)decoded;
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "mxfp8 quantize_decoded: this build of the plugin has "
                  "no CUDA kernels, so it cannot serve a tensor on cuda:", src.device.index);
#endif
  }

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  // The kernel arguments of one checked quantize call (one tensor, or one group of a grouped
  // call: the same arguments either way, hence the same bytes).
  cuda::QuantizeArgs cuda_args(const qr_tensor_view& src, std::uint32_t usage,
                               qr_quantized_tensor& dst, void* stream) const {
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
    return a;
  }
#endif

  qr_dtype data_dtype_;
};

}  // namespace
}  // namespace qrecipe::mxfp8

// ---------------------------------------------------------------- 3. exported symbols

QR_DEFINE_PLUGIN_EX(qrecipe::mxfp8::Mxfp8Quantizer, "mxfp8", "1.0.0",
                    "MXFP8: E4M3/E5M2 elements in blocks of 32 sharing an E8M0 scale",
                    qrecipe::mxfp8::kSchema, ::qrecipe::sdk::kBuiltDevices,
                    &qrecipe::sdk::adam_extras<qrecipe::mxfp8::Mxfp8Quantizer>)
