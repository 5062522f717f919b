// float8 format plugin: per-tensor FP8 (E4M3 / E5M2) with current or delayed scaling
// (docs/numerics.md, "float8").
//
// Map of this file
//   1. options: how the validated recipe options resolve (defaults, cross-option checks)
//   2. Float8Quantizer: layout, compute_amax, quantize (CPU reference / CUDA kernels),
//      dequantize, describe; then the option schema the engine validates recipes against
//   3. QR_DEFINE_PLUGIN: the two exported symbols
//
// Layout, for a logical [rows, cols] tensor:
//   rowwise     data e4m3|e5m2 [rows, cols]; scale_inv f32 [1] (QR_SCALE_TENSOR); amax f32
//   columnwise  data e4m3|e5m2 [cols, rows] (data_transposed = 1) holding exactly the
//               transpose of the rowwise bytes, with the same scale_inv and amax
// The stored amax is the tensor's amax (or the caller-reduced one), before amax_epsilon.
//
// Options that do not apply to the chosen scaling are rejected instead of ignored, so a
// recipe never silently carries a setting that has no effect:
//   current only: pow2_scales, amax_epsilon
//   delayed only: amax_history_len, amax_compute_algo, margin
//
// Delayed scaling: the quantizer asks the engine for a shared state (amax history + scale)
// when it is made, in host memory. Each quantize uses the stored scale, writes 1/scale, and
// max-accumulates the tensor amax into history row 0; Engine::update_scaling() rolls the
// history and recomputes the scale between steps. A caller-reduced amax
// (QuantizeOptions::amax) is what accumulates then. The state lives where the tensors are:
// the first CUDA quantize moves it to that device (host scaling_state_move, once), after
// which the kernels read the scale and atomically max-accumulate row 0 on the device, with no
// host round trip or stream synchronization per quantize; a later CPU quantize moves it back.
// Quantize calls of one delayed-scaling quantizer must not run concurrently with each other
// on the CPU, nor with Engine::update_scaling().
//
// A caller-reduced amax under current scaling replaces the plugin's own amax pass. float8 has
// one amax per tensor: it takes amax[0] (rowwise) when rowwise data is requested, else
// amax[1]; compute_amax returns the same value in both.
//
// CUDA tensors run the kernels of float8_kernels.cu when the plugin is built with CUDA and are
// an UNSUPPORTED error otherwise; they never fall back to the CPU reference. The kernels need
// contiguous sources; the CPU reference reads any strided view.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "float8_adam_kernels.hpp"
#include "float8_ref.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_adam.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
// No CUDA types in these two (their functions are defined only in CUDA builds); the
// device-split size bound is inline and used by every build.
#include "float8_grouped_kernels.hpp"
#include "float8_kernels.hpp"

namespace qrecipe::float8 {
namespace {

// ---------------------------------------------------------------- 1. options

constexpr const char* kScalingChoices[] = {"current", "delayed"};
constexpr const char* kDTypeChoices[] = {"e4m3", "e5m2"};
constexpr const char* kAlgoChoices[] = {"max", "most_recent"};

// Option keys that only make sense for one kind of scaling.
constexpr const char* kCurrentOnly[] = {"pow2_scales", "amax_epsilon"};
constexpr const char* kDelayedOnly[] = {"amax_history_len", "amax_compute_algo", "margin"};

constexpr std::int64_t kMaxHistoryLen = 65536;
// exp2i(-margin) must stay a representable power of two: 2^-127 .. 2^127.
constexpr std::int64_t kMaxAbsMargin = 127;

enum class Scaling { current, delayed };

struct Resolved {
  Scaling scaling = Scaling::current;
  qr_dtype dtype = QR_DTYPE_E4M3;
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;
  std::int32_t history_len = 1024;
  bool most_recent = false;
  std::int32_t margin = 0;
};

Resolved resolve_options(const sdk::Options& opts, const qr_role* role) {
  Resolved r;
  const std::string scaling = opts.get_string("scaling", "current");
  QR_CHECK(scaling == "current" || scaling == "delayed", "float8 option scaling: '", scaling,
           "' is not current or delayed");
  r.scaling = scaling == "delayed" ? Scaling::delayed : Scaling::current;

  // TE's HYBRID format: E4M3 for forward tensors, E5M2 for gradients.
  const bool is_grad = role && role->tensor_type && std::string(role->tensor_type) == "grad_output";
  const std::string dtype = opts.get_string("dtype", is_grad ? "e5m2" : "e4m3");
  QR_CHECK(dtype == "e4m3" || dtype == "e5m2", "float8 option dtype: '", dtype,
           "' is not e4m3 or e5m2");
  r.dtype = dtype == "e5m2" ? QR_DTYPE_E5M2 : QR_DTYPE_E4M3;

  const std::span<const char* const> not_here =
      r.scaling == Scaling::current ? std::span<const char* const>(kDelayedOnly)
                                    : std::span<const char* const>(kCurrentOnly);
  for (const char* key : not_here)
    QR_CHECK(!opts.has(key), "float8 option '", key, "' only applies to scaling: ",
             r.scaling == Scaling::current ? "delayed" : "current", ", but this quantizer uses ",
             scaling, " scaling; remove '", key, "' or set scaling: ",
             r.scaling == Scaling::current ? "delayed" : "current");

  r.pow2_scales = opts.get_bool("pow2_scales", false);
  const double eps = opts.get_float("amax_epsilon", 0.0);
  QR_CHECK(std::isfinite(eps) && eps >= 0.0 && eps <= 3.4028234663852886e38,
           "float8 option amax_epsilon: ", eps, " is not a finite FP32 value >= 0");
  r.amax_epsilon = static_cast<float>(eps);

  const std::int64_t len = opts.get_int("amax_history_len", 1024);
  QR_CHECK(len >= 1 && len <= kMaxHistoryLen, "float8 option amax_history_len: ", len,
           " is outside 1..", kMaxHistoryLen);
  r.history_len = static_cast<std::int32_t>(len);
  const std::string algo = opts.get_string("amax_compute_algo", "max");
  QR_CHECK(algo == "max" || algo == "most_recent", "float8 option amax_compute_algo: '", algo,
           "' is not max or most_recent");
  r.most_recent = algo == "most_recent";
  const std::int64_t margin = opts.get_int("margin", 0);
  QR_CHECK(margin >= -kMaxAbsMargin && margin <= kMaxAbsMargin, "float8 option margin: ",
           margin, " is outside ", -kMaxAbsMargin, "..", kMaxAbsMargin);
  r.margin = static_cast<std::int32_t>(margin);
  return r;
}

// ---------------------------------------------------------------- 2. the quantizer

constexpr const char* kFormat = "float8";

using sdk::device_str;
using sdk::same_device;
using sdk::view_cols;
using sdk::view_rows;

class Float8Quantizer final : public sdk::QuantizerBase {
 public:
  Float8Quantizer(const qr_create_args& args, const sdk::Options& opts)
      : o_(resolve_options(opts, args.role)) {
    if (o_.scaling == Scaling::delayed) acquire_state(args);
  }

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    return layout_of(rows, cols, direction, o_.dtype);
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    const float a = tensor_amax(src, stream);
    amax_out[0] = a;
    amax_out[1] = a;
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, dst, kFormat, "quantize", *this);

    // A caller-reduced amax (TP/SP/FSDP), [rowwise, columnwise]. Both directions of float8
    // share one scale, so the rowwise entry decides when rowwise data is requested.
    const bool has_given = args.amax != nullptr;
    const float given = !has_given ? 0.0f
                        : (usage & QR_USAGE_ROWWISE) ? args.amax[0]
                                                     : args.amax[1];
    if (src.device.type == QR_DEVICE_CUDA) {
      quantize_cuda(src, args, dst, has_given, given);
      return;
    }
    quantize_cpu(src, usage, dst, has_given ? given : ref::amax(src));
  }

  // The device-amax extras (plugin_abi.h, QR_EXTRA_COMPUTE_AMAX_DEVICE /
  // QR_EXTRA_QUANTIZE_DEVICE_AMAX): the tensor amax into [rowwise, columnwise] on the device
  // (one amax launch and a device copy), and a quantize whose cast reads the caller's device
  // amax (current: scale = scale_from_amax on the device, as the host path's
  // ref::current_scale; delayed: stored and max-accumulated into history row 0 on the device,
  // as the host path's write_scalars). CPU: the host calls (host memory holds the amax).
  void compute_amax_device(const qr_tensor_view& src, void* stream, float* amax_out) {
    sdk::require_supported_device(src.device, kFormat, "compute_amax_device", "the source");
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::compute_amax_device_cpu(*this, src, stream, amax_out);
      return;
    }
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "compute_amax_device");
    cuda::compute_amax(src.data, static_cast<qr_dtype>(src.dtype), sdk::numel(src), amax_out,
                       src.device.index, stream, amax_out + 1);
#endif
  }

  void quantize_device_amax(const qr_tensor_view& src, const qr_quantize_args& args,
                            const float* amax, qr_quantized_tensor& dst) {
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::quantize_device_amax_cpu(*this, src, args, amax, dst);
      return;
    }
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, dst, kFormat, "quantize", *this);
    quantize_cuda(src, args, dst, false, 0.0f,
                  (usage & QR_USAGE_ROWWISE) ? amax : amax + 1);
  }

  // Grouped quantization (the descriptor's quantize_grouped extra, plugin_abi.h: every group
  // byte-identical to quantizing its rows alone; plugin_sdk.hpp has checked the generic
  // arguments). CPU: the reference, one group after the other, which is the definition.
  // CUDA: float8_grouped_kernels.cu, one amax launch and one cast launch for all groups (each
  // group's own amax and scale; delayed scaling: the shared state's scale for every group and
  // every group's amax into history row 0, as sequential calls would).
  void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                        const qr_quantize_args& args, std::span<qr_quantized_tensor* const> dst) {
    sdk::check_source_view(src, kFormat);
    sdk::require_supported_device(src.device, kFormat, "quantize_grouped", "the source");
    if (src.device.type != QR_DEVICE_CUDA) {
      sdk::quantize_each_group(*this, src, group_rows, args, dst);
      return;
    }
    quantize_grouped_cuda(src, group_rows, args, dst);
  }

  // Device-split grouped quantization (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE; CUDA
  // only): the packed layout of float8_grouped_kernels.hpp (columnwise rows padded to 16 per
  // group), one scale_inv and amax per group and direction.
  void grouped_device_sizes(std::int64_t rows, std::int64_t cols, std::uint32_t groups,
                            qr_direction d, std::size_t& data, std::size_t& scales) const {
    data = static_cast<std::size_t>(
        d == QR_DIRECTION_ROWWISE ? qrecipe::checked_mul(rows, cols, "device-split grouped data bytes")
                                  : cuda::device_columnwise_bytes(rows, cols, groups));
    scales = sizeof(float) * groups;
  }

  void quantize_grouped_device(const qr_tensor_view& src, const qr_quantize_args& args,
                               qr_grouped_quantized& dst) {
    sdk::check_grouped_device_source(src, kFormat);
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    cuda::DeviceGroupedArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.rows = dst.rows;
    a.cols = dst.cols;
    a.data_dtype = o_.dtype;
    a.groups = static_cast<int>(dst.num_groups);
    a.offsets = dst.offsets;
    if (args.usage & QR_USAGE_ROWWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_ROWWISE, true, kFormat);
      a.rowwise = static_cast<std::uint8_t*>(d.data);
      a.rowwise_scale_inv = static_cast<float*>(d.scale_inv);
      a.rowwise_amax = d.amax;
      a.rowwise_table = d.groups;
    }
    if (args.usage & QR_USAGE_COLUMNWISE) {
      const qr_grouped_direction& d =
          sdk::check_grouped_device_direction(*this, dst, QR_DIRECTION_COLUMNWISE, true, kFormat);
      a.columnwise = static_cast<std::uint8_t*>(d.data);
      a.columnwise_scale_inv = static_cast<float*>(d.scale_inv);
      a.columnwise_amax = d.amax;
      a.columnwise_table = d.groups;
    }
    set_grouped_scaling(a, src.device, args.stream);
    cuda::quantize_grouped_device(a);
#else
    (void)args;  // unreachable: check_grouped_device_source refuses CUDA sources in this build
    (void)dst;
#endif
  }

  // The fused Adam + requantize extra (plugin_sdk_adam.hpp, float8_adam_kernels.cu): this
  // quantizer's scaling as the fused kernels read it; a delayed-scaling state first moves to
  // the tensors' device, as a quantize there would move it (so capture a capturable step after
  // an eager warm-up step).
  cuda::AdamPlan adam_plan(const qr_adam_tensor& t) {
    cuda::AdamPlan p;
    p.data_dtype = o_.dtype;
    p.fmax = ref::fp8_max(o_.dtype);
    p.pow2_scales = o_.pow2_scales;
    p.amax_epsilon = o_.amax_epsilon;
    if (o_.scaling == Scaling::delayed) {
      ensure_state_on(t.master.device);
      p.delayed_scale = state_.scale;
      p.history_row0 = state_.amax_history;
    }
    return p;
  }

  // The hybrid fusion extra QR_EXTRA_PREPARE_TENSOR_CAST (plugin_abi.h): everything quantize
  // does for one direction except the cast, which another plugin's kernel then writes from its
  // own read of the source (the hybrid format's two directions in one read). Current scaling
  // on CUDA only: the amax pass (or the caller's amax) into the direction's amax buffer, and
  // scale_inv written from it on the device by the same scalar code the cast kernels run; the
  // cast is q = sat_rne(x * scale_from_amax(amax, fmax, pow2_scales, amax_epsilon)), which is
  // exactly what quantize_cuda's kernels compute. Delayed scaling (the cast would have to
  // accumulate the amax into the history) and CPU tensors are UNSUPPORTED, before anything is
  // written.
  void prepare_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
                           qr_quantized_tensor& dst, qr_tensor_cast& cast) {
    QR_CHECK_CODE(o_.scaling == Scaling::current, QR_STATUS_UNSUPPORTED, "float8 "
                  "prepare_tensor_cast: delayed scaling observes the amax while it casts; "
                  "quantize the directions apart");
    QR_CHECK_CODE(src.device.type == QR_DEVICE_CUDA && sdk::kHasCuda, QR_STATUS_UNSUPPORTED,
                  "float8 prepare_tensor_cast: CUDA tensors only (the CPU reference quantizes "
                  "the directions apart)");
    QR_CHECK(args.usage == QR_USAGE_ROWWISE || args.usage == QR_USAGE_COLUMNWISE,
             "float8 prepare_tensor_cast: usage ", args.usage, " must name exactly one direction");
    const std::uint32_t usage =
        sdk::check_quantize_call(src, args, dst, kFormat, "prepare_tensor_cast", *this);
    sdk::require_contiguous_source(src, kFormat, "prepare_tensor_cast");
    const qr_direction d =
        usage == QR_USAGE_ROWWISE ? QR_DIRECTION_ROWWISE : QR_DIRECTION_COLUMNWISE;
    qr_direction_data& dd = sdk::direction_data(dst, d);
    auto* amax = static_cast<float*>(dd.amax.data);
    cast = qr_tensor_cast{};
    cast.struct_size = sizeof(qr_tensor_cast);
    cast.dtype = o_.dtype;
    cast.transposed = d == QR_DIRECTION_COLUMNWISE ? 1 : 0;
    cast.data = static_cast<std::uint8_t*>(dd.data.data);
    cast.scale = nullptr;
    cast.amax = amax;
    cast.fmax = ref::fp8_max(o_.dtype);
    cast.pow2_scales = o_.pow2_scales ? 1 : 0;
    cast.amax_epsilon = o_.amax_epsilon;
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    const int device = src.device.index;
    const bool has_given = args.amax != nullptr;
    if (has_given) {
      const float given = d == QR_DIRECTION_ROWWISE ? args.amax[0] : args.amax[1];
      cuda::write_scalars(amax, nullptr, given, nullptr, 0.0f, device, args.stream);
    } else {
      cuda::compute_amax(src.data, static_cast<qr_dtype>(src.dtype), sdk::numel(src), amax,
                         device, args.stream);
      cast.source_amax = amax;  // max |x| of this very source
    }
    // scale_inv from the device amax: a cast of an empty tensor writes only its scalars.
    cuda::CastTransposeArgs a;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.data_dtype = o_.dtype;
    (d == QR_DIRECTION_ROWWISE ? a.rowwise : a.columnwise) = cast.data;
    (d == QR_DIRECTION_ROWWISE ? a.rowwise_scale_inv : a.columnwise_scale_inv) =
        static_cast<float*>(dd.scale_inv.data);
    a.scale.device_amax = amax;
    a.scale.fmax = cast.fmax;
    a.scale.pow2_scales = o_.pow2_scales;
    a.scale.amax_epsilon = o_.amax_epsilon;
    a.device_index = device;
    a.stream = args.stream;
    cuda::cast_transpose(a);
#endif
  }

  // The hybrid fusion extra QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST (plugin_abi.h): quantize the
  // columnwise (transposed) direction and write another format's untransposed per-tensor cast
  // (a float8 rowwise side of another dtype or scale) in the same cast + transpose tiles
  // (float8_device.cuh, RowOut): one read of the source after the partner's amax pass. With
  // the cast's source_amax (max |x| of this very source) and no caller amax, this direction's
  // amax is that value, so its own amax pass goes too. Supported: current scaling, CUDA, a
  // contiguous bf16 / f16 source, usage columnwise alone, an untransposed e4m3 / e5m2 cast.
  // Anything else is UNSUPPORTED before a byte is written.
  void quantize_with_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
                                 qr_quantized_tensor* dst, const qr_tensor_cast& cast) {
    bool supported = o_.scaling == Scaling::current && src.device.type == QR_DEVICE_CUDA &&
                     sdk::kHasCuda && sdk::is_contiguous(src) &&
                     args.usage == QR_USAGE_COLUMNWISE && cast.transposed == 0;
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    supported = supported && cuda::cast_with_own_rowwise_supported(
                                 static_cast<qr_dtype>(src.dtype), static_cast<qr_dtype>(cast.dtype));
#endif
    QR_CHECK_CODE(supported, QR_STATUS_UNSUPPORTED, "float8 quantize_with_tensor_cast: needs "
                  "current scaling, a contiguous bf16 / f16 CUDA source, usage columnwise alone "
                  "and an untransposed e4m3 / e5m2 cast; got ",
                  o_.scaling == Scaling::current ? "current" : "delayed", " scaling, ",
                  sdk::dtype_str(static_cast<qr_dtype>(src.dtype)), " on ",
                  sdk::device_str(src.device), ", usage ", args.usage, ", cast dtype ",
                  sdk::dtype_str(static_cast<qr_dtype>(cast.dtype)),
                  (cast.transposed ? " transposed" : ""));
    if (dst == nullptr) return;  // a probe
    sdk::check_quantize_call(src, args, *dst, kFormat, "quantize_with_tensor_cast", *this);
    QR_CHECK(cast.data != nullptr && (cast.scale != nullptr || cast.amax != nullptr),
             "float8 quantize_with_tensor_cast: the cast has no data buffer, or neither a scale "
             "nor an amax");
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    const int device = src.device.index;
    auto* amax_col = static_cast<float*>(dst->columnwise.amax.data);
    cuda::CastTransposeArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.rows = dst->rows;
    a.cols = dst->cols;
    a.data_dtype = o_.dtype;
    a.rowwise = cast.data;
    a.columnwise = static_cast<std::uint8_t*>(dst->columnwise.data.data);
    a.columnwise_scale_inv = static_cast<float*>(dst->columnwise.scale_inv.data);
    a.rowwise_own = true;
    a.rowwise_dtype = static_cast<qr_dtype>(cast.dtype);
    a.rowwise_scale.device_scale = cast.scale;
    a.rowwise_scale.device_amax = cast.scale != nullptr ? nullptr : cast.amax;
    a.rowwise_scale.fmax = cast.fmax;
    a.rowwise_scale.pow2_scales = cast.pow2_scales != 0;
    a.rowwise_scale.amax_epsilon = cast.amax_epsilon;
    a.device_index = device;
    a.stream = args.stream;
    // This direction's scale, as quantize_cuda's current scaling derives it.
    if (args.amax != nullptr) {
      const float given = args.amax[1];
      cuda::write_scalars(amax_col, nullptr, given, nullptr, 0.0f, device, args.stream);
      a.scale.scale = ref::current_scale(given, o_.dtype, o_.pow2_scales, o_.amax_epsilon);
    } else {
      a.scale.fmax = ref::fp8_max(o_.dtype);
      a.scale.pow2_scales = o_.pow2_scales;
      a.scale.amax_epsilon = o_.amax_epsilon;
      if (cast.source_amax != nullptr) {
        a.scale.device_amax = cast.source_amax;  // max |x| of this source: no amax pass
        a.amax_mirror = amax_col;
      } else {
        a.scale.tensor_amax = true;
        a.amax_out[0] = amax_col;
      }
    }
    cuda::cast_transpose(a);
#endif
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    const qr_direction_data& dd = sdk::check_dequantize_call(src, direction, dst, kFormat);
    // Decode with the dtype the data was made with (e5m2 for gradients, say).
    const auto data_dtype = static_cast<qr_dtype>(dd.layout.data_dtype);
    QR_CHECK(data_dtype == QR_DTYPE_E4M3 || data_dtype == QR_DTYPE_E5M2,
             "float8 dequantize: ", sdk::direction_str(direction), " data has dtype ",
             sdk::dtype_str(data_dtype), "; expected e4m3 or e5m2 (was it made by another "
             "format?)");
    sdk::check_stored(dd, layout_of(src.rows, src.cols, direction, data_dtype), direction,
                      dst.device, kFormat);
    const bool transposed = dd.layout.data_transposed != 0;
    const auto dst_dtype = static_cast<qr_dtype>(dst.dtype);
    if (dst.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      cuda::dequantize(static_cast<const std::uint8_t*>(dd.data.data), data_dtype, transposed,
                       src.rows, src.cols, static_cast<const float*>(dd.scale_inv.data), dst.data,
                       dst_dtype, dst.device.index, stream);
#endif
      return;
    }
    (void)stream;
    ref::dequantize(static_cast<const std::uint8_t*>(dd.data.data), data_dtype, src.rows,
                    src.cols, transposed, *static_cast<const float*>(dd.scale_inv.data),
                    dst.data, dst_dtype);
  }

  std::string describe() const override {
    std::ostringstream os;
    os.precision(9);
    os << "float8{scaling=" << (o_.scaling == Scaling::current ? "current" : "delayed")
       << ", dtype=" << (o_.dtype == QR_DTYPE_E4M3 ? "e4m3" : "e5m2");
    if (o_.scaling == Scaling::current)
      os << ", pow2_scales=" << (o_.pow2_scales ? "true" : "false")
         << ", amax_epsilon=" << o_.amax_epsilon;
    else
      os << ", amax_history_len=" << o_.history_len
         << ", amax_compute_algo=" << (o_.most_recent ? "most_recent" : "max")
         << ", margin=" << o_.margin;
    os << "}";
    return os.str();
  }

 private:
  // The layout of a [rows, cols] tensor with `data_dtype` elements (this quantizer's, or the
  // one a stored tensor was made with).
  static qr_direction_layout layout_of(std::int64_t rows, std::int64_t cols,
                                       qr_direction direction, qr_dtype data_dtype) {
    QR_CHECK(rows >= 0 && cols >= 0, "float8 layout: negative shape ", rows, " x ", cols);
    qr_direction_layout l = sdk::empty_layout(kFormat);
    const bool transposed = direction == QR_DIRECTION_COLUMNWISE;
    l.data_dtype = data_dtype;
    l.data_ndim = 2;
    l.data_shape[0] = transposed ? cols : rows;
    l.data_shape[1] = transposed ? rows : cols;
    l.data_transposed = transposed ? 1 : 0;
    l.scale_mode = QR_SCALE_TENSOR;
    l.scale_dtype = QR_DTYPE_F32;
    l.scale_ndim = 1;
    l.scale_shape[0] = 1;
    l.scale_transposed = 0;
    // One scale covers the whole tensor: the "block" is the tensor itself.
    l.block_rows = 0;
    l.block_cols = 0;
    l.has_amax = 1;
    return l;
  }


  // The engine's state follows the tensors: moved (values kept) when they are elsewhere.
  void ensure_state_on(const qr_device& device) {
    if (same_device(state_.device, device)) return;
    const qr_host_api* host = sdk::host();
    QR_CHECK_CODE(host != nullptr && host->scaling_state_move != nullptr, QR_STATUS_UNSUPPORTED,
                  "float8 delayed scaling: the amax history lives on ", device_str(state_.device),
                  " but the tensor on ", device_str(device), ", and this engine cannot move "
                  "scaling states (no scaling_state_move); use an engine built with this plugin");
    sdk::check_host(host->scaling_state_move(ctx_, &state_, device),
                    "float8 delayed scaling: moving the amax history to " + device_str(device));
    QR_CHECK_CODE(same_device(state_.device, device) && state_.amax_history != nullptr &&
                      state_.scale != nullptr,
                  QR_STATUS_INTERNAL, "float8 delayed scaling: the engine moved the state to ",
                  device_str(state_.device), "; expected ", device_str(device));
  }

  void acquire_state(const qr_create_args& args) {
    const qr_host_api* host = sdk::host();
    QR_CHECK(host != nullptr && host->scaling_state_acquire != nullptr,
             "float8 delayed scaling needs the host's scaling_state_acquire");
    QR_CHECK(args.ctx != nullptr, "float8 delayed scaling needs an engine context to own the "
             "amax history; create the quantizer through qrecipe::Engine");
    qr_scaling_request request{};
    request.struct_size = sizeof(qr_scaling_request);
    request.history_len = o_.history_len;
    request.algo_most_recent = o_.most_recent ? 1 : 0;
    request.margin = o_.margin;
    request.fp8_max = ref::fp8_max(o_.dtype);
    request.device = {QR_DEVICE_CPU, 0};  // moved to the tensors' device on first use
    state_.struct_size = sizeof(qr_scaling_state);
    sdk::check_host(host->scaling_state_acquire(args.ctx, &request, &state_),
                    "float8 delayed scaling: acquiring the amax history from the engine");
    ctx_ = args.ctx;
    QR_CHECK_CODE(state_.amax_history != nullptr && state_.scale != nullptr &&
                      state_.history_len == o_.history_len &&
                      state_.device.type == QR_DEVICE_CPU,
                  QR_STATUS_INTERNAL, "float8 delayed scaling: the engine returned a state "
                  "with history_len ", state_.history_len, " on ", device_str(state_.device),
                  "; expected ", o_.history_len, " on cpu");
  }

  float tensor_amax(const qr_tensor_view& src, void* stream) const {
    sdk::require_supported_device(src.device, kFormat, "compute_amax", "the source");
    if (src.device.type == QR_DEVICE_CUDA) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
      sdk::require_contiguous_source(src, kFormat, "compute_amax");
      return cuda::compute_amax_to_host(src.data, static_cast<qr_dtype>(src.dtype),
                                        sdk::numel(src), src.device.index, stream);
#endif
    }
    (void)stream;
    return ref::amax(src);
  }

  // Delayed scaling: this quantize's amax joins the step's running max in history row 0.
  void accumulate_amax(float amax) {
    // Atomic: quantize calls with this quantizer may run on several threads at once, and
    // max is order-independent, so the step amax is the same however they interleave.
    std::atomic_ref<float> row0(state_.amax_history[0]);
    float seen = row0.load(std::memory_order_relaxed);
    while (std::fmax(seen, amax) != seen &&
           !row0.compare_exchange_weak(seen, std::fmax(seen, amax), std::memory_order_relaxed)) {
    }
  }

  void quantize_cpu(const qr_tensor_view& src, std::uint32_t usage, qr_quantized_tensor& dst,
                    float amax) {
    float scale;
    if (o_.scaling == Scaling::current) {
      scale = ref::current_scale(amax, o_.dtype, o_.pow2_scales, o_.amax_epsilon);
    } else {
      ensure_state_on(src.device);
      scale = *state_.scale;
      accumulate_amax(amax);
    }
    const float scale_inv = 1.0f / scale;
    const std::int64_t rows = dst.rows, cols = dst.cols;
    std::vector<std::uint8_t> scratch;
    const std::uint8_t* rowwise_bytes = nullptr;
    if (usage & QR_USAGE_ROWWISE) {
      auto* out = static_cast<std::uint8_t*>(dst.rowwise.data.data);
      ref::quantize_rowwise(src, scale, o_.dtype, out);
      rowwise_bytes = out;
    }
    if (usage & QR_USAGE_COLUMNWISE) {
      if (!rowwise_bytes) {  // columnwise only: quantize rowwise into scratch, then transpose
        scratch.resize(static_cast<std::size_t>(rows * cols));
        ref::quantize_rowwise(src, scale, o_.dtype, scratch.data());
        rowwise_bytes = scratch.data();
      }
      ref::transpose_bytes(rowwise_bytes, rows, cols,
                           static_cast<std::uint8_t*>(dst.columnwise.data.data));
    }
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      if (!(usage & sdk::usage_of(d))) continue;
      qr_direction_data& dd = sdk::direction_data(dst, d);
      *static_cast<float*>(dd.scale_inv.data) = scale_inv;
      *static_cast<float*>(dd.amax.data) = amax;
    }
  }

  // `device_given`: the caller's amax on the device (current scaling), or nullptr.
  void quantize_cuda(const qr_tensor_view& src, const qr_quantize_args& args,
                     qr_quantized_tensor& dst, bool has_given, float given,
                     const float* device_given = nullptr) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize");
    const std::uint32_t usage = args.usage;
    const int device = src.device.index;
    const bool rowwise = (usage & QR_USAGE_ROWWISE) != 0;
    const bool columnwise = (usage & QR_USAGE_COLUMNWISE) != 0;
    float* amax_row = rowwise ? static_cast<float*>(dst.rowwise.amax.data) : nullptr;
    float* amax_col = columnwise ? static_cast<float*>(dst.columnwise.amax.data) : nullptr;
    // Both directions store the same amax: the first buffer is the main one, the other (both
    // requested) receives the same value from the same launch.
    float* amax_main = rowwise ? amax_row : amax_col;
    float* amax_other = rowwise && columnwise ? amax_col : nullptr;

    cuda::CastTransposeArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.rows = dst.rows;
    a.cols = dst.cols;
    a.data_dtype = o_.dtype;
    a.rowwise = rowwise ? static_cast<std::uint8_t*>(dst.rowwise.data.data) : nullptr;
    a.columnwise = columnwise ? static_cast<std::uint8_t*>(dst.columnwise.data.data) : nullptr;
    a.rowwise_scale_inv = rowwise ? static_cast<float*>(dst.rowwise.scale_inv.data) : nullptr;
    a.columnwise_scale_inv =
        columnwise ? static_cast<float*>(dst.columnwise.scale_inv.data) : nullptr;
    a.device_index = device;
    a.stream = args.stream;

    // Every path is stream-ordered device work: no host synchronization.
    if (o_.scaling == Scaling::current) {
      if (device_given != nullptr) {
        // Stored as given (a bit copy, like write_scalars of the host value); the cast derives
        // the scale from it on the device.
        cuda::copy_scalar(device_given, amax_main, amax_other, nullptr, device, args.stream);
        a.scale.device_amax = device_given;
        a.scale.fmax = ref::fp8_max(o_.dtype);
        a.scale.pow2_scales = o_.pow2_scales;
        a.scale.amax_epsilon = o_.amax_epsilon;
      } else if (has_given) {
        cuda::write_scalars(amax_main, amax_other, given, nullptr, 0.0f, device, args.stream);
        a.scale.scale = ref::current_scale(given, o_.dtype, o_.pow2_scales, o_.amax_epsilon);
      } else {
        // The entry runs the amax pass, derives the scale on the device and stores the amax.
        a.scale.tensor_amax = true;
        a.scale.fmax = ref::fp8_max(o_.dtype);
        a.scale.pow2_scales = o_.pow2_scales;
        a.scale.amax_epsilon = o_.amax_epsilon;
        a.amax_out[0] = amax_main;
        a.amax_out[1] = amax_other;
      }
    } else {
      ensure_state_on(src.device);
      a.scale.device_scale = state_.scale;
      if (device_given != nullptr) {
        // The same from the caller's device amax.
        cuda::copy_scalar(device_given, amax_main, amax_other, state_.amax_history, device,
                          args.stream);
      } else if (has_given) {
        // The caller's amax is stored and joins history row 0 (the reference's fmax).
        cuda::write_scalars(amax_main, amax_other, given, state_.amax_history, given, device,
                            args.stream);
      } else {
        // The cast observes the tensor amax into both amax buffers (zeroed by the entry) and
        // history row 0.
        a.amax_out[0] = amax_main;
        a.amax_out[1] = amax_other;
        a.amax_accumulate[0] = state_.amax_history;
      }
    }
    cuda::cast_transpose(a);
#else
    (void)src;  // unreachable: check_quantize_call refuses CUDA sources in this build
    (void)args;
    (void)dst;
    (void)has_given;
    (void)given;
    (void)device_given;
#endif
  }

#if defined(QRECIPE_PLUGIN_HAS_CUDA)
  // The scaling fields, device and stream both grouped entries pass (GroupedCastArgs,
  // DeviceGroupedArgs): current scaling's parameters, or the delayed state on the source's
  // device.
  template <class Args>
  void set_grouped_scaling(Args& a, const qr_device& device, void* stream) {
    if (o_.scaling == Scaling::current) {
      a.fmax = ref::fp8_max(o_.dtype);
      a.pow2_scales = o_.pow2_scales;
      a.amax_epsilon = o_.amax_epsilon;
    } else {
      ensure_state_on(device);
      a.delayed_scale = state_.scale;
      a.history_row0 = state_.amax_history;
    }
    a.device_index = device.index;
    a.stream = stream;
  }
#endif

  void quantize_grouped_cuda(const qr_tensor_view& src, std::span<const std::int64_t> group_rows,
                             const qr_quantize_args& args,
                             std::span<qr_quantized_tensor* const> dst) {
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
    sdk::require_contiguous_source(src, kFormat, "quantize_grouped");
    cuda::GroupedCastArgs a;
    a.src = src.data;
    a.src_dtype = static_cast<qr_dtype>(src.dtype);
    a.cols = view_cols(src);
    a.data_dtype = o_.dtype;
    a.groups.resize(dst.size());
    std::size_t g = 0;
    sdk::for_each_group(src, group_rows, dst, [&](const qr_tensor_view& rows,
                                                  qr_quantized_tensor& t) {
      const std::uint32_t usage =
          sdk::check_quantize_call(rows, args, t, kFormat, "quantize_grouped", *this);
      cuda::GroupOutputs& o = a.groups[g++];
      o.rows = rows.shape[0];
      if (usage & QR_USAGE_ROWWISE) {
        o.rowwise = static_cast<std::uint8_t*>(t.rowwise.data.data);
        o.rowwise_scale_inv = static_cast<float*>(t.rowwise.scale_inv.data);
        o.rowwise_amax = static_cast<float*>(t.rowwise.amax.data);
      }
      if (usage & QR_USAGE_COLUMNWISE) {
        o.columnwise = static_cast<std::uint8_t*>(t.columnwise.data.data);
        o.columnwise_scale_inv = static_cast<float*>(t.columnwise.scale_inv.data);
        o.columnwise_amax = static_cast<float*>(t.columnwise.amax.data);
      }
    });
    set_grouped_scaling(a, src.device, args.stream);
    cuda::quantize_grouped(a);
#else
    (void)src;  // unreachable: quantize_grouped refuses CUDA sources in this build
    (void)group_rows;
    (void)args;
    (void)dst;
#endif
  }

  Resolved o_;
  qr_scaling_state state_{};  // delayed scaling only; owned by the engine
  qr_host_context* ctx_ = nullptr;  // the engine that owns state_ (delayed scaling only)
};

// ---------------------------------------------------------------- option schema

constexpr qr_option_schema kSchema[] = {
    sdk::option_enum("scaling", "current", kScalingChoices,
                     "current: scale from this tensor's amax; delayed: scale from the amax "
                     "history of previous steps"),
    sdk::option_enum("dtype", "e4m3 (e5m2 for grad_output)", kDTypeChoices,
                     "FP8 element type (E4M3 max 448, E5M2 max 57344)"),
    sdk::option_bool("pow2_scales", "false",
                     "current scaling: round the scale down to a power of two"),
    sdk::option_float("amax_epsilon", "0", 0.0, 3.4028234663852886e38,
                      "current scaling: amaxes below this are raised to it before the scale is "
                      "computed"),
    sdk::option_int("amax_history_len", "1024", 1, static_cast<double>(kMaxHistoryLen),
                    "delayed scaling: steps of amax history"),
    sdk::option_enum("amax_compute_algo", "max", kAlgoChoices,
                     "delayed scaling: amax from the max over the history or the most recent"),
    sdk::option_int("margin", "0", -static_cast<double>(kMaxAbsMargin),
                    static_cast<double>(kMaxAbsMargin),
                    "delayed scaling: scale = (fp8_max * 2^-margin) / amax"),
};

}  // namespace
}  // namespace qrecipe::float8

// ---------------------------------------------------------------- 3. exported symbols

QR_DEFINE_PLUGIN_EX(qrecipe::float8::Float8Quantizer, "float8", "1.0.0",
                    "per-tensor FP8 (E4M3/E5M2), current or delayed scaling",
                    qrecipe::float8::kSchema, ::qrecipe::sdk::kBuiltDevices,
                    &qrecipe::sdk::adam_extras<qrecipe::float8::Float8Quantizer>)
