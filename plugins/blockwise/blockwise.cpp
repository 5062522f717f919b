// The blockwise format plugin: entry point (C descriptor) and the host-side quantizer.
//
// blockwise = FP8 E4M3 data with one FP32 scale per 1x128 block or 128x128 tile (DeepSeek-V3
// style, TransformerEngine's Float8BlockScaling). Numerics and layouts: blockwise_ref.hpp.
//
// Options (validated by the engine against kSchema before the plugin sees them):
//   block        1x128 | 128x128   default by role: 128x128 for tensor_type "weight",
//                                  1x128 for everything else (input, grad_output, no role);
//                                  TE's defaults (w_block_scaling_dim=2, x/grad = 1)
//   pow2_scales  bool, default true (TE's default; rounds every scale down to 2^k)
//   amax_epsilon float >= 0, default 0 (block amaxes below it are raised to it)
//
// Devices: CPU tensors run the reference; CUDA tensors run the kernels of blockwise_kernels.cu
// (both directions in one pass over the source) when the plugin is built with CUDA, and the
// descriptor then declares cpu|cuda. Without CUDA they are refused with QR_STATUS_UNSUPPORTED.
// Grouped quantization (the quantize_grouped extra, MoE experts as one tensor): CPU sources run
// the reference group after group; CUDA sources run every group in ONE launch
// (blockwise_grouped_kernels.cu, the same tile code as the one-tensor kernel).
// There is no silent fallback to the reference for device memory. The kernels need contiguous
// sources (strided CUDA views are UNSUPPORTED); the reference reads any strided host view.
//
// Scaling is local to each block, so a caller-reduced tensor amax (qr_quantize_args::amax,
// for TP/SP/FSDP) plays no role here and is ignored; compute_amax still reports the tensor
// amax (max |x|, NaN ignored) in both slots for callers that want it.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "blockwise_adam_kernels.hpp"
#include "blockwise_ref.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_adam.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
// No CUDA types in these two (their functions are defined only in CUDA builds); the
// device-split size bounds are inline and used by every build.
#include "blockwise_grouped_kernels.hpp"
#include "blockwise_kernels.hpp"

namespace qrecipe::blockwise {
namespace {

constexpr const char* kFormat = "blockwise";

const char* const kBlockChoices[] = {"1x128", "128x128"};

const qr_option_schema kSchema[] = {
    sdk::option_enum("block", "1x128 (128x128 for the weight role)", kBlockChoices,
                     "block shape: 1x128 (one scale per 128 elements of a row) or 128x128 "
                     "(one scale per tile; the columnwise copy is the transpose)"),
    sdk::option_bool("pow2_scales", "true",
                     "round every block scale down to a power of two (TE's default)"),
    sdk::option_float("amax_epsilon", "0", 0.0, FLT_MAX,
                      "lower bound applied to every block amax before the scale is computed"),
};

// The block shape a stored direction was quantized with, from its layout.
ref::BlockShape block_of(const qr_direction_layout& l, qr_direction d) {
  if (l.block_rows == ref::kBlock && l.block_cols == ref::kBlock) return ref::BlockShape::k128x128;
  const bool is_1x128 = d == QR_DIRECTION_ROWWISE
                            ? (l.block_rows == 1 && l.block_cols == ref::kBlock)
                            : (l.block_rows == ref::kBlock && l.block_cols == 1);
  QR_CHECK(is_1x128, "blockwise ", sdk::direction_str(d), " data has block ", l.block_rows, "x",
           l.block_cols, "; expected 1x128 (rowwise), 128x1 (columnwise) or 128x128");
  return ref::BlockShape::k1x128;
}

}  // namespace

class BlockwiseQuantizer final : public sdk::QuantizerBase {
 public:
  BlockwiseQuantizer(const qr_create_args& args, const sdk::Options& opts) {
    const std::string tensor_type =
        args.role && args.role->tensor_type ? args.role->tensor_type : "";
    if (opts.has("block")) {
      const std::string block = opts.get_string("block", "1x128");
      QR_CHECK(block == "1x128" || block == "128x128", "blockwise option block = '", block,
               "'; expected 1x128 or 128x128");
      params_.block = block == "1x128" ? ref::BlockShape::k1x128 : ref::BlockShape::k128x128;
    } else {
      // TE's Float8BlockScaling: weights use 128x128 tiles, activations and gradients 1x128.
      params_.block = tensor_type == "weight" ? ref::BlockShape::k128x128 : ref::BlockShape::k1x128;
      block_from_role_ = true;
    }
    params_.pow2_scales = opts.get_bool("pow2_scales", true);
    const double eps = opts.get_float("amax_epsilon", 0.0);
    QR_CHECK(std::isfinite(eps) && eps >= 0.0 && eps <= FLT_MAX, "blockwise option amax_epsilon = ",
             eps, "; expected a finite value >= 0");
    params_.amax_epsilon = static_cast<float>(eps);
  }

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    return ref::layout(rows, cols, params_.block, direction);
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    sdk::require_supported_device(src.device, kFormat, "compute_amax", "the source");
    float amax = 0.0f;
    if (src.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      sdk::require_contiguous_source(src, kFormat, "compute_amax");
      amax = cuda::compute_amax_to_host(src.data, static_cast<qr_dtype>(src.dtype),
                                        sdk::numel(src), src.device.index, stream);
#endif
    } else {
      (void)stream;
      amax = ref::tensor_amax(ref::load_f32(src));
    }
    amax_out[0] = amax;
    amax_out[1] = amax;
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    sdk::check_quantize_call(src, args, dst, kFormat, "quantize", *this);
    const std::int64_t rows = dst.rows, cols = dst.cols;
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_cuda(src, args, dst, rows, cols);
      return;
    }

    const std::vector<float> x = ref::load_f32(src);
    const auto src_dtype = static_cast<qr_dtype>(src.dtype);
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!(args.usage & sdk::usage_of(d))) continue;
      const qr_direction_data& dd = sdk::direction_data(dst, d);
      ref::quantize(x, rows, cols, params_, src_dtype, d, static_cast<std::uint8_t*>(dd.data.data),
                    static_cast<float*>(dd.scale_inv.data));
    }
  }

  // Grouped quantization (the descriptor's quantize_grouped extra, plugin_abi.h: each group
  // byte-identical to quantizing its rows alone; plugin_sdk.hpp has checked the generic
  // arguments). CPU: quantize, group after group (the definition). CUDA: every group's kernel
  // arguments exactly as quantize builds them for that group alone, all groups in ONE launch
  // (blockwise_grouped_kernels.cu; blockwise has no tensor-level quantity).
  void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                        const qr_quantize_args& args, std::span<qr_quantized_tensor* const> dst) {
    sdk::require_supported_device(src.device, kFormat, "quantize_grouped", "the source");
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::quantize_each_group(*this, src, group_rows, args, dst);
      return;
    }
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize_grouped");
    std::vector<cuda::QuantizeArgs> groups;
    groups.reserve(dst.size());
    sdk::for_each_group(src, group_rows, dst,
                        [&](const qr_tensor_view& group, qr_quantized_tensor& out) {
                          sdk::check_quantize_call(group, args, out, kFormat, "quantize_grouped",
                                                   *this);
                          groups.push_back(cuda_args(group, args, out, out.rows, out.cols,
                                                     "quantize_grouped"));
                        });
    cuda::quantize_grouped(groups);
#endif
  }

  // Device-split grouped quantization (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE; CUDA,
  // 1x128 blocks): the packed layout of blockwise_grouped_kernels.hpp, one launch after a small
  // layout kernel. 128x128 tiles (weights, grouped by host sizes) are refused.
  void grouped_device_sizes(std::int64_t rows, std::int64_t cols, std::uint32_t groups,
                            qr_direction d, std::size_t& data, std::size_t& scales) const {
    const bool columnwise = d == QR_DIRECTION_COLUMNWISE;
    data = static_cast<std::size_t>(cuda::device_data_bytes(rows, cols, groups, columnwise));
    scales = static_cast<std::size_t>(cuda::device_scale_bytes(rows, cols, groups, columnwise));
  }

  void quantize_grouped_device(const qr_tensor_view& src, const qr_quantize_args& args,
                               qr_grouped_quantized& dst) {
    sdk::check_grouped_device_source(src, kFormat);
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DeviceGroupedArgs a;
    a.base = source_args(src, dst.rows, dst.cols, args.stream);
    a.groups = static_cast<int>(dst.num_groups);
    a.offsets = dst.offsets;
    if (args.usage & QR_USAGE_ROWWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_ROWWISE, false, kFormat);
      a.base.rowwise_data = static_cast<std::uint8_t*>(d.data);
      a.base.rowwise_scale_inv = static_cast<float*>(d.scale_inv);
      a.rowwise_table = d.groups;
    }
    if (args.usage & QR_USAGE_COLUMNWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_COLUMNWISE, false, kFormat);
      a.base.columnwise_data = static_cast<std::uint8_t*>(d.data);
      a.base.columnwise_scale_inv = static_cast<float*>(d.scale_inv);
      a.columnwise_table = d.groups;
    }
    cuda::quantize_grouped_device(a);
#else
    (void)args;  // unreachable: check_grouped_device_source refuses CUDA sources in this build
    (void)dst;
#endif
  }

  // The fused Adam + requantize extra (plugin_sdk_adam.hpp, blockwise_adam_kernels.cu): what
  // the fused kernel needs (t's destination is checked against layout() already).
  cuda::AdamPlan adam_plan(const qr_adam_tensor& t) const {
    cuda::AdamPlan p;
    p.tile_128x128 = params_.block == ref::BlockShape::k128x128;
    p.pow2_scales = params_.pow2_scales;
    p.amax_epsilon = params_.amax_epsilon;
    p.rowwise_scale_ld = t.dst->rowwise.layout.scale_shape[1];
    p.columnwise_scale_ld = t.dst->columnwise.layout.scale_shape[1];
    return p;
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    const qr_direction_data& dd = sdk::check_dequantize_call(src, direction, dst, kFormat);
    // Decode with the block shape the tensor was made with (it may come from another
    // blockwise quantizer, e.g. an FSDP gather), after checking its buffers agree with it.
    const ref::BlockShape block = block_of(dd.layout, direction);
    const qr_direction_layout expected = ref::layout(src.rows, src.cols, block, direction);
    sdk::check_stored(dd, expected, direction, dst.device, kFormat);
    const std::int64_t rows = src.rows, cols = src.cols;
    if (rows == 0 || cols == 0) return;
    if (dst.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      cuda::DequantizeArgs a;
      a.data = static_cast<const std::uint8_t*>(dd.data.data);
      a.scale_inv = static_cast<const float*>(dd.scale_inv.data);
      a.rows = rows;
      a.cols = cols;
      a.block_rows = expected.block_rows;
      a.block_cols = expected.block_cols;
      a.scale_ld = expected.scale_shape[1];
      a.scale_transposed = expected.scale_transposed != 0;
      a.data_transposed = expected.data_transposed != 0;
      a.dst = dst.data;
      a.dst_dtype = static_cast<qr_dtype>(dst.dtype);
      a.device_index = dst.device.index;
      a.stream = stream;
      cuda::dequantize(a);
#endif
      return;
    }
    (void)stream;
    ref::dequantize(static_cast<const std::uint8_t*>(dd.data.data),
                    static_cast<const float*>(dd.scale_inv.data), rows, cols, block, direction,
                    dst.data, static_cast<qr_dtype>(dst.dtype));
  }

  std::string describe() const override {
    std::ostringstream os;
    os.precision(9);
    os << kFormat << "{block=" << ref::block_shape_name(params_.block)
       << (block_from_role_ ? " (role default)" : "")
       << ", pow2_scales=" << (params_.pow2_scales ? "true" : "false")
       << ", amax_epsilon=" << params_.amax_epsilon << "}";
    return os.str();
  }

 private:

  // Both requested directions in one kernel pass; the destinations were checked already.
  void quantize_cuda(const qr_tensor_view& src, const qr_quantize_args& args,
                     qr_quantized_tensor& dst, std::int64_t rows, std::int64_t cols) const {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::quantize(cuda_args(src, args, dst, rows, cols, "quantize"));
#else
    (void)src;
    (void)args;
    (void)dst;
    (void)rows;
    (void)cols;
#endif
  }

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  // The kernel arguments of one checked quantize call (one tensor, or one group of a grouped
  // call: the same arguments either way, hence the same bytes).
  cuda::QuantizeArgs cuda_args(const qr_tensor_view& src, const qr_quantize_args& args,
                               qr_quantized_tensor& dst, std::int64_t rows, std::int64_t cols,
                               const char* op) const {
    sdk::require_contiguous_source(src, kFormat, op);
    cuda::QuantizeArgs a = source_args(src, rows, cols, args.stream);
    if (args.usage & QR_USAGE_ROWWISE) {
      a.rowwise_data = static_cast<std::uint8_t*>(dst.rowwise.data.data);
      a.rowwise_scale_inv = static_cast<float*>(dst.rowwise.scale_inv.data);
      a.rowwise_scale_ld = dst.rowwise.layout.scale_shape[1];
    }
    if (args.usage & QR_USAGE_COLUMNWISE) {
      a.columnwise_data = static_cast<std::uint8_t*>(dst.columnwise.data.data);
      a.columnwise_scale_inv = static_cast<float*>(dst.columnwise.scale_inv.data);
      a.columnwise_scale_ld = dst.columnwise.layout.scale_shape[1];
    }
    return a;
  }

  // The kernel arguments of a [rows, cols] source without its destination buffers.
  cuda::QuantizeArgs source_args(const qr_tensor_view& src, std::int64_t rows, std::int64_t cols,
                                 void* stream) const {
    const auto src_dtype = static_cast<qr_dtype>(src.dtype);
    cuda::QuantizeArgs a;
    a.src = src.data;
    a.src_dtype = src_dtype;
    a.rows = rows;
    a.cols = cols;
    a.tile_128x128 = params_.block == ref::BlockShape::k128x128;
    a.pow2_scales = params_.pow2_scales;
    a.amax_epsilon = params_.amax_epsilon;
    a.value_for_inf = ref::value_for_inf(src_dtype);  // throws for other dtypes
    a.device_index = src.device.index;
    a.stream = stream;
    return a;
  }
#endif

  ref::Params params_;
  bool block_from_role_ = false;
};

}  // namespace qrecipe::blockwise

QR_DEFINE_PLUGIN_EX(qrecipe::blockwise::BlockwiseQuantizer, "blockwise", "1.0.0",
                    "FP8 E4M3 with one FP32 scale per 1x128 block or 128x128 tile "
                    "(DeepSeek-style)",
                    qrecipe::blockwise::kSchema, ::qrecipe::sdk::kBuiltDevices,
                    &qrecipe::sdk::adam_extras<qrecipe::blockwise::BlockwiseQuantizer>)
