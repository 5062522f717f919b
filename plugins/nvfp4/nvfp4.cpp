// nvfp4 format plugin: NVFP4 (E2M1 elements, E4M3 scales per 16 elements, an FP32 tensor
// amax per direction), with optional 16x16 tiles, random Hadamard transform of the wgrad
// operand and stochastic rounding (docs/numerics.md, "nvfp4"; the rules are in
// nvfp4_ref.hpp).
//
// Map of this file
//   1. the option schema and how options resolve
//   2. Nvfp4Quantizer: layout, compute_amax, quantize (CPU reference / CUDA kernels),
//      dequantize, describe
//   3. QR_DEFINE_PLUGIN: the two exported symbols
//
// Layout, for a logical [M, K] tensor (rows = M = prod(leading dims), cols = K):
//   rowwise     data e2m1 [M, K] elements (M rows of ceil(K/2) bytes, even index in the low
//               nibble); scales e4m3 [roundup(M,128), roundup(ceil(K/16),4)]; amax f32 [1];
//               scale_mode QR_SCALE_BLOCK_TENSOR, blocks 1x16
//   columnwise  data e2m1 [K, M] (data_transposed = 1); scales e4m3
//               [roundup(K,128), roundup(ceil(M/16),4)]; amax f32 [1]; blocks 16x1
// With 2d the layout is the same: each scale row of a 16x16 tile repeats the tile's scale
// (as TransformerEngine stores it), so a GEMM consumes a 2d tensor like any other.
//
// Stochastic rounding call offset: the quantizer keeps a counter that starts at 0 and
// advances by one per quantize call that does not pass its own offset. A call with
// qr_quantize_args::has_rng_offset uses rng_offset and leaves the counter alone, so a
// recomputed forward can reuse the offset of the original without disturbing later calls.
//
// CUDA tensors run the kernels of nvfp4_kernels.cu when the plugin is built with CUDA (the
// descriptor then lists cpu and cuda) and are an UNSUPPORTED error otherwise; they never fall
// back to the CPU reference. Both paths run the same checks (ref::check_amax_call,
// ref::check_quantize_call) and take the call offset from the same counter. The kernels need
// contiguous sources; the CPU reference reads any strided view.
//
// Grouped quantization (the quantize_grouped extra, MoE experts as one tensor): CPU sources run
// the reference group after group; CUDA sources with the 1-D options (no 2d, no Hadamard) run
// every group in three launches (nvfp4_grouped_kernels.cu); CUDA sources with 2d or Hadamard
// are quantized one group at a time through quantize (same bytes, no launch saving).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "nvfp4_adam_kernels.hpp"
#include "nvfp4_ref.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_adam.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
#include "nvfp4_grouped_kernels.hpp"
#include "nvfp4_kernels.hpp"
#endif

namespace qrecipe::nvfp4 {
namespace {

// ---------------------------------------------------------------- 1. options

ref::Config resolve_options(const sdk::Options& opts) {
  ref::Config c;
  c.two_d = opts.get_bool("2d", false);
  c.hadamard = opts.get_bool("hadamard", false);
  c.stochastic_rounding = opts.get_bool("stochastic_rounding", false);
  QR_CHECK(c.stochastic_rounding || !opts.has("seed"),
           "nvfp4 option 'seed' only applies with stochastic_rounding: true; remove 'seed' or "
           "set stochastic_rounding: true");
  // Any int64 is a valid seed; its two's-complement bits are the 64-bit Philox key.
  c.seed = static_cast<std::uint64_t>(opts.get_int("seed", 0));
  ref::check_config(c);
  return c;
}

// ---------------------------------------------------------------- 2. the quantizer

constexpr const char* kFormat = "nvfp4";

using sdk::view_cols;
using sdk::view_rows;

class Nvfp4Quantizer final : public sdk::QuantizerBase {
 public:
  // S_dec = 1 / scale_from_amax(amax, 2688): the descriptor's tensor_scale_numerator, so the
  // engine can decode this format's directions itself (plugin_abi.h, plugin_sdk.hpp).
  static constexpr float kTensorScaleNumerator = rules::kTensorScaleNumerator;

  Nvfp4Quantizer(const qr_create_args&, const sdk::Options& opts)
      : config_(resolve_options(opts)) {}

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    QR_CHECK(rows >= 0 && cols >= 0, "nvfp4 layout: negative shape ", rows, " x ", cols);
    const bool transposed = direction == QR_DIRECTION_COLUMNWISE;
    const std::int64_t data_rows = transposed ? cols : rows;
    const std::int64_t data_cols = transposed ? rows : cols;
    qr_direction_layout l = sdk::empty_layout("nvfp4");
    l.data_dtype = QR_DTYPE_E2M1;
    l.data_ndim = 2;
    l.data_shape[0] = data_rows;
    l.data_shape[1] = data_cols;  // elements; bytes per row are ceil(data_cols / 2)
    l.data_transposed = transposed ? 1 : 0;
    l.scale_mode = QR_SCALE_BLOCK_TENSOR;
    l.scale_dtype = QR_DTYPE_E4M3;
    l.scale_ndim = 2;
    l.scale_shape[0] = ref::scale_rows(data_rows);
    l.scale_shape[1] = ref::scale_cols(data_cols);
    // Columnwise scales follow the transposed data: scale[k][i] holds block (i, k) of the
    // logical tensor (M-block i, column k), which the ABI calls a transposed scale array.
    l.scale_transposed = transposed ? 1 : 0;
    // Block geometry of the stored scales in the logical [rows, cols] tensor: one scale per
    // 1x16 (rowwise) or 16x1 (columnwise) block. With 2d the 16 rows (columns) of a 16x16
    // tile hold equal copies of the tile's scale, so the storage, and what a GEMM reads, is
    // the same as without 2d.
    const int block = static_cast<int>(ref::kBlockSize);
    l.block_rows = transposed ? block : 1;
    l.block_cols = transposed ? 1 : block;
    l.has_amax = 1;
    return l;
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    sdk::require_supported_device(src.device, kFormat, "compute_amax", "the source");
    if (src.device.type == QR_DEVICE_CUDA) {
      ref::check_amax_call(src, config_);
      sdk::require_contiguous_source(src, kFormat, "compute_amax");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      cuda::compute_amax_to_host(src.data, static_cast<qr_dtype>(src.dtype), view_rows(src),
                                 view_cols(src), config_.hadamard, amax_out, src.device.index,
                                 stream);
#endif
      return;
    }
    (void)stream;
    const auto a = ref::compute_amax(src, config_);
    amax_out[0] = a[0];
    amax_out[1] = a[1];
  }

  // The device-amax extras (plugin_abi.h): the pair into device memory with no host sync, and
  // a quantize whose amax buffers are bit-copies of the caller's device pair (the kernels then
  // read them as they read a host amax's fill). CPU: the host calls. On CUDA the pair is not
  // validated (>= 0, not NaN, equal under 2d: the host path's checks need the host): the scale
  // rules take the values as they are, and 2d uses entry [0] for both directions.
  void compute_amax_device(const qr_tensor_view& src, void* stream, float* amax_out) {
    sdk::require_supported_device(src.device, kFormat, "compute_amax_device", "the source");
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::compute_amax_device_cpu(*this, src, stream, amax_out);
      return;
    }
    ref::check_amax_call(src, config_);
    sdk::require_contiguous_source(src, kFormat, "compute_amax_device");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::compute_amax_device(src.data, static_cast<qr_dtype>(src.dtype), view_rows(src),
                              view_cols(src), config_.hadamard, amax_out, src.device.index,
                              stream);
#endif
  }

  void quantize_device_amax(const qr_tensor_view& src, const qr_quantize_args& args,
                            const float* amax, qr_quantized_tensor& dst) {
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::quantize_device_amax_cpu(*this, src, args, amax, dst);
      return;
    }
    ref::DirectionOut out[2];
    const ref::Request request = checked_request(src, args, dst, "quantize", out);
    check_cuda_call(src, request, "quantize");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DirectionBuffers buffers[2];
    cuda::QuantizeArgs a = cuda_args(src, request, args.stream, buffers);
    a.given_amax_device = amax;
    cuda::quantize(a);
#else
    (void)amax;
#endif
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    ref::DirectionOut out[2];
    const ref::Request request = checked_request(src, args, dst, "quantize", out);
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_cuda(src, request, args.stream);
      return;
    }
    ref::quantize(src, config_, request);
  }

  // Quantize and decode in one pass (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED; the trampoline
  // checked usage and miss words). CPU: the reference, i.e. the definition: quantize, then
  // each stored element's q * s (rules::decode_element without S_dec, which the engine puts
  // in alpha; exact in FP32 and BF16, the scale's NaN as 0x7FFF) as sdk::decoded_bf16
  // writes it. CUDA: not fused yet, so UNSUPPORTED before anything is written (the engine
  // then quantizes and decodes in two kernels, with the same values).
  void quantize_decoded(const qr_tensor_view& src, const qr_quantize_args& args,
                        qr_quantized_tensor& dst, const qr_decoded_output& decoded) {
    QR_CHECK_CODE(src.device.type != QR_DEVICE_CUDA, QR_STATUS_UNSUPPORTED,
                  "nvfp4 quantize_decoded: the CUDA kernels do not write decoded values yet; "
                  "quantize, then decode in a second kernel");
    quantize(src, args, dst);
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (decoded.values[d] == nullptr) continue;
      const qr_direction_data& dd = sdk::direction_data(dst, d);
      const auto* codes = static_cast<const std::uint8_t*>(dd.data.data);
      const auto* scales = static_cast<const std::uint8_t*>(dd.scale_inv.data);
      const std::int64_t data_rows = dd.layout.data_shape[0], data_cols = dd.layout.data_shape[1];
      const std::int64_t pitch = ref::packed_row_bytes(data_cols), spitch = dd.scale_inv.shape[1];
      std::uint32_t miss = 0;
      for (std::int64_t i = 0; i < data_rows; ++i)
        for (std::int64_t j = 0; j < data_cols; ++j) {
          const std::uint8_t byte = codes[i * pitch + j / 2];
          const std::uint8_t q = (j & 1) ? byte >> 4 : byte & 0xFu;
          const float s = num::e4m3_to_f32(scales[i * spitch + j / ref::kBlockSize]);
          const float v = num::is_nan(s) ? s : num::e2m1_to_f32(q) * s;
          decoded.values[d][i * data_cols + j] = sdk::decoded_bf16(v, miss);
        }
      if (miss) *decoded.miss[d] = miss;  // unreachable for nvfp4 (exact), kept for the rule
    }
  }

  // The hybrid fusion extra QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST (plugin_abi.h): quantize the
  // columnwise direction and write another format's per-tensor cast (float8's rowwise side of
  // a hybrid) from the same read of the source, in the 16-bit kernel's tiles
  // (nvfp4_quantize_16bit.cu, Cast). When the cast carries source_amax (max |x| of this
  // source, computed by the partner's prepare) and no amax was given, it is this direction's
  // tensor amax, so the amax pass is skipped too: one read of the source for both directions
  // after the partner's amax pass. Supported: CUDA, a contiguous bf16 / f16 source, the
  // columnwise direction alone, 1-D blocks (no 2d, no Hadamard), round to nearest, an
  // untransposed e4m3 / e5m2 cast. Anything else is UNSUPPORTED before a byte is written (and
  // before the stochastic-rounding counter moves).
  void quantize_with_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
                                 qr_quantized_tensor* dst, const qr_tensor_cast& cast) {
    bool supported = src.device.type == QR_DEVICE_CUDA && sdk::kHasCuda &&
                     sdk::is_contiguous(src) && cast.transposed == 0;
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    supported = supported && cuda::quantize_with_cast_supported(
                                 static_cast<qr_dtype>(src.dtype),
                                 (args.usage & QR_USAGE_ROWWISE) != 0,
                                 (args.usage & QR_USAGE_COLUMNWISE) != 0, config_.two_d,
                                 config_.hadamard, config_.stochastic_rounding,
                                 static_cast<qr_dtype>(cast.dtype));
#endif
    QR_CHECK_CODE(supported, QR_STATUS_UNSUPPORTED, "nvfp4 quantize_with_tensor_cast: needs a "
                  "contiguous bf16 / f16 CUDA source, usage columnwise alone, 1-D blocks with "
                  "round to nearest and an untransposed e4m3 / e5m2 cast; got ",
                  sdk::dtype_str(static_cast<qr_dtype>(src.dtype)), " on ",
                  sdk::device_str(src.device), ", usage ", args.usage, ", cast dtype ",
                  sdk::dtype_str(static_cast<qr_dtype>(cast.dtype)),
                  (cast.transposed ? " transposed" : ""));
    if (dst == nullptr) return;  // a probe
    QR_CHECK(cast.data != nullptr && (cast.scale != nullptr || cast.amax != nullptr),
             "nvfp4 quantize_with_tensor_cast: the cast has no data buffer, or neither a scale "
             "nor an amax");
    ref::DirectionOut out[2];
    const ref::Request request =
        checked_request(src, args, *dst, "quantize_with_tensor_cast", out);
    check_cuda_call(src, request, "quantize_with_tensor_cast");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DirectionBuffers buffers[2];
    cuda::QuantizeArgs a = cuda_args(src, request, args.stream, buffers);
    if (request.amax == nullptr) a.device_amax = cast.source_amax;
    a.cast = cast;
    cuda::quantize(a);
#endif
  }

  // Grouped quantization (the descriptor's quantize_grouped extra, plugin_abi.h: each group
  // byte-identical to quantizing its rows alone, one call after the other; plugin_sdk.hpp has
  // checked the generic arguments). Group g takes call offset rng_offset + g, or the next
  // num_groups offsets of the counter, as sequential quantize calls would. CPU: quantize,
  // group after group (the definition). CUDA, 1-D options: every group's kernel arguments
  // exactly as quantize builds them for that group alone, all groups in three launches
  // (nvfp4_grouped_kernels.cu). CUDA with 2d or Hadamard: one quantize per group, still the
  // contract's bytes (their tile kernels have no grouped form yet).
  void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                        const qr_quantize_args& args, std::span<qr_quantized_tensor* const> dst) {
    sdk::require_supported_device(src.device, kFormat, "quantize_grouped", "the source");
    const std::uint64_t first_offset =
        args.has_rng_offset ? args.rng_offset : next_offset_.fetch_add(dst.size());
    qr_quantize_args per_group = args;
    per_group.has_rng_offset = 1;
    std::uint64_t offset = first_offset;
    if (src.device.type != QR_DEVICE_CUDA || config_.two_d || config_.hadamard) {
      sdk::for_each_group(src, group_rows, dst,
                          [&](const qr_tensor_view& rows, qr_quantized_tensor& out) {
                            per_group.rng_offset = offset++;
                            quantize(rows, per_group, out);
                          });
      return;
    }
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize_grouped");
    std::vector<cuda::QuantizeArgs> groups(dst.size());
    std::vector<GroupBuffers> buffers(dst.size());  // what groups[g] points to
    std::size_t g = 0;
    sdk::for_each_group(src, group_rows, dst,
                        [&](const qr_tensor_view& rows, qr_quantized_tensor& out) {
                          per_group.rng_offset = offset++;
                          ref::DirectionOut outs[2];
                          const ref::Request request =
                              checked_request(rows, per_group, out, "quantize_grouped", outs);
                          check_cuda_call(rows, request, "quantize_grouped");
                          groups[g] = cuda_args(rows, request, args.stream, buffers[g].d);
                          ++g;
                        });
    cuda::quantize_grouped(groups);
#endif
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    const qr_direction_data& dd = sdk::check_dequantize_call(src, direction, dst, kFormat);
    sdk::check_stored(dd, layout(src.rows, src.cols, direction), direction, dst.device, kFormat);
    if (dst.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      cuda::dequantize(static_cast<const std::uint8_t*>(dd.data.data),
                       static_cast<const std::uint8_t*>(dd.scale_inv.data),
                       static_cast<const float*>(dd.amax.data), src.rows, src.cols,
                       dd.layout.data_transposed != 0, dst.data,
                       static_cast<qr_dtype>(dst.dtype), dst.device.index, stream);
#endif
      return;
    }
    (void)stream;
    ref::dequantize(static_cast<const std::uint8_t*>(dd.data.data),
                    static_cast<const std::uint8_t*>(dd.scale_inv.data),
                    *static_cast<const float*>(dd.amax.data), src.rows, src.cols,
                    dd.layout.data_transposed != 0, dst.data, dst.dtype);
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "nvfp4{2d=" << (config_.two_d ? "true" : "false")
       << ", hadamard=" << (config_.hadamard ? "true" : "false")
       << ", stochastic_rounding=" << (config_.stochastic_rounding ? "true" : "false");
    if (config_.stochastic_rounding)
      os << ", seed=" << static_cast<std::int64_t>(config_.seed);
    os << "}";
    return os.str();
  }

  // The fused Adam + requantize extra (plugin_sdk_adam.hpp, nvfp4_adam_kernels.cu). The kernels
  // round to nearest and quantize the master as it is: a Hadamard transform or stochastic
  // rounding (whose call offsets come from this quantizer's counter) takes the host's
  // two-pass path, which quantizes through quantize.
  bool adam_fusable(const qr_device&, bool, std::string& why) const {
    if (config_.hadamard) why = "the Hadamard transform of the columnwise operand is not fused";
    else if (config_.stochastic_rounding) why = "stochastic rounding is not fused";
    return why.empty();
  }

  // What the fused kernels need (t's destination is checked against layout() already).
  cuda::AdamPlan adam_plan(const qr_adam_tensor& t) const {
    cuda::AdamPlan p;
    p.two_d = config_.two_d;
    p.rowwise_scale_ld = t.dst->rowwise.layout.scale_shape[1];
    p.columnwise_scale_ld = t.dst->columnwise.layout.scale_shape[1];
    return p;
  }

 private:
  // The checks of a quantize call (usage, shape, destinations against this quantizer's layout)
  // and its request: the destinations in `out`, the call offset (taken from the counter
  // unless args has one).
  ref::Request checked_request(const qr_tensor_view& src, const qr_quantize_args& args,
                               qr_quantized_tensor& dst, const char* op,
                               ref::DirectionOut (&out)[2]) {
    const std::uint32_t usage = sdk::check_quantize_call(src, args, dst, kFormat, op, *this);
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!(usage & sdk::usage_of(d))) continue;
      qr_direction_data& dd = sdk::direction_data(dst, d);
      out[d].data = static_cast<std::uint8_t*>(dd.data.data);
      out[d].scales = static_cast<std::uint8_t*>(dd.scale_inv.data);
      out[d].amax = static_cast<float*>(dd.amax.data);
    }

    ref::Request request;
    request.amax = args.amax;
    request.call_offset = args.has_rng_offset ? args.rng_offset : next_offset_.fetch_add(1);
    request.rowwise = (usage & QR_USAGE_ROWWISE) ? &out[QR_DIRECTION_ROWWISE] : nullptr;
    request.columnwise = (usage & QR_USAGE_COLUMNWISE) ? &out[QR_DIRECTION_COLUMNWISE] : nullptr;
    return request;
  }

  // The reference's checks of a CUDA call (nothing is written when they throw).
  void check_cuda_call(const qr_tensor_view& src, const ref::Request& request,
                       const char* op) const {
    ref::check_quantize_call(src, config_, request);
    sdk::require_contiguous_source(src, kFormat, op);
  }

  // The CUDA path of quantize: the checks, then the kernels. request.amax is a host pointer;
  // the kernels take its values.
  void quantize_cuda(const qr_tensor_view& src, const ref::Request& request, void* stream) {
    check_cuda_call(src, request, "quantize");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DirectionBuffers buffers[2];
    cuda::quantize(cuda_args(src, request, stream, buffers));
#else
    (void)stream;  // unreachable: checked_request refuses CUDA sources in this build
#endif
  }

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  // The direction buffers one group's kernel arguments point to.
  struct GroupBuffers {
    cuda::DirectionBuffers d[2];
  };

  // The kernel arguments of one checked CUDA quantize call (one tensor, or one group of a
  // grouped call: the same arguments either way, hence the same bytes); they point into
  // `buffers`.
  cuda::QuantizeArgs cuda_args(const qr_tensor_view& src, const ref::Request& request,
                               void* stream, cuda::DirectionBuffers (&buffers)[2]) const {
    const ref::DirectionOut* outs[2] = {request.rowwise, request.columnwise};
    for (int d = 0; d < 2; ++d) {
      if (!outs[d]) continue;
      buffers[d].data = outs[d]->data;
      buffers[d].scales = outs[d]->scales;
      buffers[d].amax = outs[d]->amax;
    }
    cuda::QuantizeArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.rows = view_rows(src);
    a.cols = view_cols(src);
    a.two_d = config_.two_d;
    a.hadamard = config_.hadamard;
    a.stochastic_rounding = config_.stochastic_rounding;
    a.seed = config_.seed;
    a.call_offset = request.call_offset;
    a.given_amax = request.amax;
    a.rowwise = request.rowwise ? &buffers[0] : nullptr;
    a.columnwise = request.columnwise ? &buffers[1] : nullptr;
    a.device_index = src.device.index;
    a.stream = stream;
    return a;
  }
#endif

  ref::Config config_;
  std::atomic<std::uint64_t> next_offset_{0};  // stochastic-rounding call offset
};

// ---------------------------------------------------------------- schema

constexpr qr_option_schema kSchema[] = {
    sdk::option_bool("2d", "false",
                     "16x16 tiles share one block scale, so the columnwise data is the "
                     "transpose of the rowwise data (the shipped recipe sets it for weights)"),
    sdk::option_bool("hadamard", "false",
                     "columnwise (wgrad) operand only, bf16 sources, M a multiple of 16: "
                     "multiply each run of 16 elements along M by D*H16/4 before quantizing"),
    sdk::option_bool("stochastic_rounding", "false",
                     "round each element to a neighbouring E2M1 value with probability "
                     "proportional to its distance (Philox4x32-10 words)"),
    sdk::option_int("seed", "0", 0, 0,  // unbounded: any int64, used as 64 key bits
                    "stochastic rounding: the Philox key"),
};

}  // namespace
}  // namespace qrecipe::nvfp4

// ---------------------------------------------------------------- 3. exported symbols

QR_DEFINE_PLUGIN_EX(qrecipe::nvfp4::Nvfp4Quantizer, "nvfp4", "1.0.0",
                    "NVFP4: E2M1 data, E4M3 scales per 16 elements, FP32 tensor amax; optional "
                    "16x16 tiles, Hadamard (wgrad) and stochastic rounding",
                    qrecipe::nvfp4::kSchema, ::qrecipe::sdk::kBuiltDevices,
                    &qrecipe::sdk::adam_extras<qrecipe::nvfp4::Nvfp4Quantizer>)
