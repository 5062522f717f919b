// hybrid format plugin: a different format per direction (docs/numerics.md, "hybrid").
//
//   quantizer:
//     format: hybrid
//     rowwise:    {format: float8, scaling: delayed}   # any other plugin's full spec
//     columnwise: {format: mxfp8}
//     columnwise_source: input                         # or rowwise_dequantized
//
// Map of this file
//   1. options: schema and resolution (both sides are required)
//   2. SubQuantizer: RAII owner of one direction's quantizer, made by the host (so stateful
//      formats such as float8 delayed scaling get their state from the engine, like any other)
//   3. direction views and scratch memory from the host table (columnwise_source:
//      rowwise_dequantized): ScratchBuffer, ScratchTensor, ScratchDirection
//   4. HybridQuantizer: layout, compute_amax, quantize, dequantize, describe
//   5. QR_DEFINE_PLUGIN: the two exported symbols
//
// Semantics
//   - Each direction IS the sub-format's own direction: layout(d) is the sub-quantizer's layout
//     for d (its `format` field names the sub-format), the rowwise sub writes the rowwise slot
//     and the columnwise sub the columnwise slot, so a GEMM sees plain sub-format operands and
//     a same-format hybrid gives exactly the plain format's bytes.
//   - Usage decides which sub-quantizer runs: rowwise only never calls the columnwise side (and
//     the engine allocates nothing for it), and the reverse.
//   - A sub-quantizer sees a copy of the destination holding only its direction (usage = that
//     bit, format = the sub-format, the other direction emptied), and quantize args with usage =
//     that bit.
//   - Caller amaxes [rowwise, columnwise] (TP/SP/FSDP): the rowwise sub gets amax[0] and the
//     columnwise sub amax[1], each in both slots of its own [2] array, so a sub that reads
//     either slot (float8 takes the max of the two) sees its direction's value only.
//     compute_amax returns [rowwise sub's [0], columnwise sub's [1]].
//   - columnwise_source: rowwise_dequantized quantizes the rowwise side first (into the
//     destination when rowwise was asked for, else into a scratch direction), decodes it to
//     FP32 through the rowwise sub, and quantizes the columnwise side from those FP32 values.
//     The columnwise side is given the amax of the *input* (the caller's amax[1], or the
//     columnwise sub's compute_amax of the source): then passing compute_amax's result back in
//     changes nothing, and ranks sharing a reduced amax share the columnwise scale. For formats
//     without a tensor amax (mxfp8, blockwise) this makes no difference. CPU and CUDA run the
//     same steps in the same order, each through the sub-quantizers (whose CUDA kernels match
//     their CPU references bit for bit), so the CUDA result is byte-identical to the CPU one.
//     The scratch (the FP32 decode, and the rowwise direction of a columnwise-only request)
//     comes from the host table's scratch_alloc on the source's device: the engine's allocator
//     on the CPU, stream-ordered on the caller's stream on CUDA (no host synchronization);
//     it is freed on every path, errors included.
//   - Both directions from one read (columnwise_source: input, both requested): when one
//     side's plugin offers QR_EXTRA_PREPARE_TENSOR_CAST (float8 current scaling on CUDA) and
//     the other's QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST (mxfp8, nvfp4 1-D, float8 current scaling,
//     on CUDA), the second plugin's kernel writes the first side's per-tensor cast while it
//     quantizes its own direction (quantize_fused); each side's bytes are its plugin's own,
//     so the result is the two-call path's. Anything the extras refuse runs the two calls.
//     QRECIPE_HYBRID_FUSE=0 turns the fusion off.
//   - quantize_into (in-place requantize) is the same call: both subs requantize in place.
//   - Devices: the descriptor declares cpu and cuda; each sub-quantizer enforces its own device
//     support with its own error (no fallback anywhere).
//   - Nesting a hybrid in a hybrid is refused by the engine when it validates the spec (any
//     format that takes quantizer options cannot be nested), with file:line:column.
#include <array>
#include <cstdlib>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qrecipe/dtype.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/plugin_sdk_checks.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::hybrid {
namespace {

// ---------------------------------------------------------------- 1. options

constexpr const char* kSourceChoices[] = {"input", "rowwise_dequantized"};

enum class ColumnwiseSource { input, rowwise_dequantized };

using sdk::direction_data;
using sdk::direction_str;
using sdk::usage_of;

// The sub-spec of one direction; both are required (a hybrid with one side would be the plain
// format, and failing when the quantizer is made beats failing at the first backward GEMM).
const qr_quantizer_spec& required_side(const sdk::Options& opts, qr_direction d) {
  const char* key = direction_str(d);
  const qr_quantizer_spec* spec = opts.get_spec(key);
  QR_CHECK(spec != nullptr, "hybrid: option '", key,
           "' is missing; a hybrid needs both sides, e.g. rowwise: {format: float8} and "
           "columnwise: {format: mxfp8}. To use one format for both directions write that "
           "format instead of hybrid");
  QR_CHECK(spec->struct_size >= sizeof(qr_quantizer_spec), "hybrid: option '", key,
           "' has a qr_quantizer_spec of struct_size ", spec->struct_size, "; expected at least ",
           sizeof(qr_quantizer_spec));
  QR_CHECK(spec->format != nullptr && std::string_view(spec->format) != "none", "hybrid: option '",
           key, "' is format none; both sides of a hybrid must be quantized formats (keeping one "
           "direction in high precision is not supported). Use a quantized format there, or "
           "format none for the whole tensor");
  return *spec;
}

// Checks both sides before either is built, so a bad columnwise side never leaves a rowwise
// sub-quantizer's scaling state behind in the engine; then reads columnwise_source.
ColumnwiseSource resolve_options(const sdk::Options& opts) {
  required_side(opts, QR_DIRECTION_ROWWISE);
  required_side(opts, QR_DIRECTION_COLUMNWISE);
  const std::string s = opts.get_string("columnwise_source", "input");
  if (s == "input") return ColumnwiseSource::input;
  QR_CHECK(s == "rowwise_dequantized", "hybrid option columnwise_source: '", s,
           "' is not input or rowwise_dequantized");
  return ColumnwiseSource::rowwise_dequantized;
}

// ---------------------------------------------------------------- 2. sub-quantizers

// One direction's quantizer, made and destroyed through the host table. The host builds it
// with the engine that is building the hybrid, so its scaling state (if any) is an ordinary
// engine state: listed by Engine::scaling_states() and updated by Engine::update_scaling().
class SubQuantizer {
 public:
  SubQuantizer(const qr_create_args& args, const qr_quantizer_spec& spec, qr_direction side)
      : format_(spec.format),
        context_(std::string("hybrid ") + direction_str(side) + " side (" + spec.format + ")") {
    const qr_host_api* host = sdk::host();
    QR_CHECK(host != nullptr && host->quantizer_create != nullptr,
             "hybrid: the host offers no quantizer_create; cannot build the ", direction_str(side),
             " side");
    QR_CHECK(args.ctx != nullptr, "hybrid: no engine context to build the ", direction_str(side),
             " side (", spec.format, ") with; create hybrid quantizers through qrecipe::Engine");
    sdk::check_host(host->quantizer_create(args.ctx, &spec, args.role, &handle_),
                    "hybrid: building the " + std::string(direction_str(side)) + " side");
    QR_CHECK_CODE(handle_ != nullptr, QR_STATUS_INTERNAL, "hybrid: the host returned success "
                  "but no quantizer for the ", direction_str(side), " side (", spec.format, ")");
  }
  ~SubQuantizer() {
    if (handle_) sdk::host()->quantizer_destroy(handle_);
  }
  SubQuantizer(const SubQuantizer&) = delete;
  SubQuantizer& operator=(const SubQuantizer&) = delete;

  const std::string& format() const { return format_; }

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols, qr_direction d) const {
    qr_direction_layout out = sdk::empty_layout(nullptr);
    sdk::check_host(sdk::host()->quantizer_layout(handle_, rows, cols, d, &out), context_);
    if (out.format == nullptr) out.format = format_.c_str();  // the direction is the sub-format's
    return out;
  }
  std::array<float, 2> compute_amax(const qr_tensor_view& src, void* stream) const {
    std::array<float, 2> out{0.0f, 0.0f};
    sdk::check_host(sdk::host()->quantizer_compute_amax(handle_, &src, stream, out.data()),
                    context_);
    return out;
  }
  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) const {
    sdk::check_host(sdk::host()->quantizer_quantize(handle_, &src, &args, &dst), context_);
  }
  void dequantize(const qr_quantized_tensor& src, qr_direction d, const qr_tensor_view& dst,
                  void* stream) const {
    sdk::check_host(sdk::host()->quantizer_dequantize(handle_, &src, d, &dst, stream), context_);
  }
  std::string describe() const {
    char buffer[1024] = {0};
    sdk::check_host(sdk::host()->quantizer_describe(handle_, buffer, sizeof buffer), context_);
    return buffer;
  }
  // The extra `name` of this side's plugin (nullptr when it has none, or the host cannot
  // reach extras), with the plugin's own quantizer handle to call it with.
  void* extra(const char* name, qr_quantizer** inner) const {
    const qr_host_api* host = sdk::host();
    *inner = nullptr;
    if (host == nullptr || host->struct_size < sizeof(qr_host_api) ||
        host->quantizer_extra == nullptr)
      return nullptr;
    void* fn = nullptr;
    sdk::check_host(host->quantizer_extra(handle_, name, &fn, inner), context_);
    return *inner != nullptr ? fn : nullptr;
  }
  const std::string& context() const { return context_; }

 private:
  std::string format_;
  std::string context_;
  qr_host_quantizer* handle_ = nullptr;
};

// ---------------------------------------------------------------- 3. direction views, scratch

qr_direction_data empty_direction() {
  qr_direction_data dd{};
  dd.struct_size = sizeof(qr_direction_data);
  dd.layout.struct_size = sizeof(qr_direction_layout);
  dd.data.struct_size = dd.scale_inv.struct_size = dd.amax.struct_size = sizeof(qr_tensor_view);
  return dd;
}

// A copy of `t` that holds only direction d, as the sub-format's own tensor. The buffers are
// shared (views), so what the sub-quantizer writes lands in `t`.
qr_quantized_tensor single_direction(const qr_quantized_tensor& t, qr_direction d,
                                     const std::string& format) {
  qr_quantized_tensor v = t;
  v.format = format.c_str();
  v.usage = usage_of(d);
  const qr_direction other = d == QR_DIRECTION_ROWWISE ? QR_DIRECTION_COLUMNWISE
                                                       : QR_DIRECTION_ROWWISE;
  direction_data(v, other) = empty_direction();
  return v;
}

// Quantize args for one sub-quantizer: its single usage bit and, when the caller gave amaxes,
// this direction's amax in both slots (see the map at the top). `amax` must outlive the call.
qr_quantize_args sub_args(const qr_quantize_args& args, qr_direction d, const float* given,
                          std::array<float, 2>& amax) {
  qr_quantize_args a = args;
  a.struct_size = sizeof(qr_quantize_args);
  a.usage = usage_of(d);
  if (given != nullptr) {
    amax = {given[0], given[0]};
    a.amax = amax.data();
  } else {
    a.amax = nullptr;
  }
  return a;
}

// Bytes from the host table's scratch_alloc (plugin_abi.h) on `device`: zero-filled; on CUDA
// stream-ordered on `stream`. The destructor gives them back on every path, errors included;
// a CUDA free is queued on the same stream, so the work queued before it still sees the bytes.
class ScratchBuffer {
 public:
  ScratchBuffer(qr_host_context* ctx, qr_device device, std::size_t bytes, void* stream)
      : ctx_(ctx), device_(device), bytes_(bytes), stream_(stream) {
    const qr_host_api* host = sdk::host();
    QR_CHECK_CODE(host != nullptr && host->scratch_alloc != nullptr &&
                      host->scratch_free != nullptr,
                  QR_STATUS_UNSUPPORTED, "hybrid: columnwise_source: rowwise_dequantized needs "
                  "scratch memory from the host (scratch_alloc), which this engine does not "
                  "offer; use an engine built with this plugin, or columnwise_source: input");
    sdk::check_host(host->scratch_alloc(ctx_, device_, bytes_, stream_, &ptr_),
                    "hybrid: scratch of " + std::to_string(bytes) + " bytes on " +
                        Device::from_c(device).str() + " (columnwise_source: "
                        "rowwise_dequantized)");
    QR_CHECK_CODE(ptr_ != nullptr, QR_STATUS_INTERNAL, "hybrid: the host returned success but "
                  "no scratch memory (", bytes, " bytes on ", Device::from_c(device).str(), ")");
  }
  ~ScratchBuffer() {
    if (ptr_) sdk::host()->scratch_free(ctx_, ptr_, bytes_, device_, stream_);
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* data() const { return ptr_; }

 private:
  qr_host_context* ctx_;
  qr_device device_;
  std::size_t bytes_;
  void* stream_;
  void* ptr_ = nullptr;
};

// A contiguous scratch tensor: the view and the bytes it points to.
class ScratchTensor {
 public:
  ScratchTensor(qr_host_context* ctx, DType dtype, const std::vector<std::int64_t>& shape,
                Device device, void* stream)
      : view_(nullptr, dtype, shape, device),
        buffer_(ctx, device.to_c(), static_cast<std::size_t>(view_.nbytes()), stream) {
    view_.c().data = buffer_.data();
  }
  const qr_tensor_view& view() const { return view_.c(); }

 private:
  TensorView view_;  // declared before buffer_: its size decides the allocation
  ScratchBuffer buffer_;
};

// One direction allocated from a layout on the source's device (zero-filled, like the engine
// does): the rowwise side of a columnwise-only request in rowwise_dequantized mode.
class ScratchDirection {
 public:
  ScratchDirection(qr_host_context* ctx, const qr_direction_layout& layout, qr_direction d,
                   std::int64_t rows, std::int64_t cols, const std::string& format,
                   Device device, void* stream)
      : format_(format) {
    QR_CHECK(layout.data_ndim >= 1 && layout.data_ndim <= 2, "hybrid: the ", format,
             " layout has a data buffer of ", layout.data_ndim, " dimensions; expected 1 or 2");
    t_.struct_size = sizeof(qr_quantized_tensor);
    t_.format = format_.c_str();
    t_.rows = rows;
    t_.cols = cols;
    t_.usage = usage_of(d);
    t_.rowwise = empty_direction();
    t_.columnwise = empty_direction();
    qr_direction_data& dd = direction_data(t_, d);
    dd.layout = layout;
    dd.layout.format = format_.c_str();
    dd.data = allocate(data_, ctx, static_cast<DType>(layout.data_dtype), layout.data_ndim,
                       layout.data_shape, device, stream);
    if (layout.scale_ndim > 0)
      dd.scale_inv = allocate(scale_, ctx, static_cast<DType>(layout.scale_dtype),
                              layout.scale_ndim, layout.scale_shape, device, stream);
    if (layout.has_amax) {
      const std::int64_t one[2] = {1, 0};
      dd.amax = allocate(amax_, ctx, DType::f32, 1, one, device, stream);
    }
  }
  ScratchDirection(const ScratchDirection&) = delete;
  ScratchDirection& operator=(const ScratchDirection&) = delete;
  qr_quantized_tensor& tensor() { return t_; }

 private:
  static qr_tensor_view allocate(std::unique_ptr<ScratchTensor>& storage, qr_host_context* ctx,
                                 DType dtype, int ndim, const std::int64_t* shape, Device device,
                                 void* stream) {
    QR_CHECK(ndim >= 1 && ndim <= 2, "hybrid: scratch buffer of ", ndim,
             " dimensions; expected 1 or 2");
    storage = std::make_unique<ScratchTensor>(
        ctx, dtype, std::vector<std::int64_t>(shape, shape + ndim), device, stream);
    return storage->view();
  }
  std::string format_;
  std::unique_ptr<ScratchTensor> data_, scale_, amax_;
  qr_quantized_tensor t_{};
};

// ---------------------------------------------------------------- 4. the quantizer

using sdk::usage_name;
using sdk::view_cols;
using sdk::view_rows;

class HybridQuantizer final : public sdk::QuantizerBase {
 public:
  HybridQuantizer(const qr_create_args& args, const sdk::Options& opts)
      : ctx_(args.ctx),
        source_(resolve_options(opts)),
        rowwise_(args, required_side(opts, QR_DIRECTION_ROWWISE), QR_DIRECTION_ROWWISE),
        columnwise_(args, required_side(opts, QR_DIRECTION_COLUMNWISE), QR_DIRECTION_COLUMNWISE) {}

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                             qr_direction direction) const override {
    return side(direction).layout(rows, cols, direction);
  }

  void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) override {
    amax_out[0] = rowwise_.compute_amax(src, stream)[0];
    amax_out[1] = columnwise_.compute_amax(src, stream)[1];
  }

  void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                qr_quantized_tensor& dst) override {
    // Devices and buffers are each sub-quantizer's to check (both devices are declared here).
    const std::uint32_t usage = sdk::check_quantize_usage(args, dst, "hybrid");
    QR_CHECK(dst.rows == view_rows(src) && dst.cols == view_cols(src), "hybrid quantize: the "
             "source is ", view_rows(src), " x ", view_cols(src), " (as 2-D) but the destination "
             "is ", dst.rows, " x ", dst.cols);
    const bool want_rowwise = (usage & QR_USAGE_ROWWISE) != 0;
    const bool want_columnwise = (usage & QR_USAGE_COLUMNWISE) != 0;
    const float* given_row = args.amax ? &args.amax[0] : nullptr;
    const float* given_col = args.amax ? &args.amax[1] : nullptr;

    if (source_ == ColumnwiseSource::input && want_rowwise && want_columnwise && fusion_enabled() &&
        quantize_fused(src, args, given_row, given_col, dst))
      return;
    if (source_ == ColumnwiseSource::input || !want_columnwise) {
      if (want_rowwise) quantize_side(QR_DIRECTION_ROWWISE, src, args, given_row, dst);
      if (want_columnwise) quantize_side(QR_DIRECTION_COLUMNWISE, src, args, given_col, dst);
      return;
    }
    quantize_from_rowwise_dequantized(src, args, dst, want_rowwise, given_row, given_col);
  }

  void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                  const qr_tensor_view& dst, void* stream) override {
    QR_CHECK(src.usage & usage_of(direction), "hybrid dequantize: the tensor holds ",
             usage_name(src.usage), " data, not ", direction_str(direction));
    const SubQuantizer& sub = side(direction);
    sub.dequantize(single_direction(src, direction, sub.format()), direction, dst, stream);
  }

  std::string describe() const override {
    return "hybrid{rowwise=" + rowwise_.describe() + ", columnwise=" + columnwise_.describe() +
           ", columnwise_source=" +
           (source_ == ColumnwiseSource::input ? "input" : "rowwise_dequantized") + "}";
  }

 private:
  const SubQuantizer& side(qr_direction d) const {
    return d == QR_DIRECTION_ROWWISE ? rowwise_ : columnwise_;
  }

  // Runs direction d's sub-quantizer on `src` into d's slot of `dst`.
  void quantize_side(qr_direction d, const qr_tensor_view& src, const qr_quantize_args& args,
                     const float* given, qr_quantized_tensor& dst) const {
    const SubQuantizer& sub = side(d);
    std::array<float, 2> amax{};
    const qr_quantize_args a = sub_args(args, d, given, amax);
    qr_quantized_tensor view = single_direction(dst, d, sub.format());
    sub.quantize(src, a, view);
  }

  // Both directions from one read of the source (plugin_abi.h, qr_tensor_cast): when one
  // side's plugin can describe its direction as a per-tensor cast (prepare: its amax pass and
  // scalars) and the other side's plugin can write such a cast while it quantizes its own
  // direction, the second plugin's kernel writes both. Tried with the rowwise side as the cast
  // first, then the columnwise side. Each side's bytes are exactly its plugin's own (the
  // contracts of the two extras), so the result equals the two-call path's. Returns false,
  // having left dst to the two-call path, when no pair of extras accepts the call.
  bool quantize_fused(const qr_tensor_view& src, const qr_quantize_args& args,
                      const float* given_row, const float* given_col,
                      qr_quantized_tensor& dst) const {
    for (const qr_direction cast_side : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      const qr_direction own_side =
          cast_side == QR_DIRECTION_ROWWISE ? QR_DIRECTION_COLUMNWISE : QR_DIRECTION_ROWWISE;
      const SubQuantizer& caster = side(cast_side);
      const SubQuantizer& fuser = side(own_side);
      qr_quantizer* caster_q = nullptr;
      qr_quantizer* fuser_q = nullptr;
      const auto prepare = reinterpret_cast<qr_prepare_tensor_cast_fn>(
          caster.extra(QR_EXTRA_PREPARE_TENSOR_CAST, &caster_q));
      const auto fuse = reinterpret_cast<qr_quantize_with_tensor_cast_fn>(
          fuser.extra(QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST, &fuser_q));
      if (prepare == nullptr || fuse == nullptr) continue;
      const float* given_cast = cast_side == QR_DIRECTION_ROWWISE ? given_row : given_col;
      const float* given_own = own_side == QR_DIRECTION_ROWWISE ? given_row : given_col;
      std::array<float, 2> cast_amax{}, own_amax{};
      const qr_quantize_args cast_args = sub_args(args, cast_side, given_cast, cast_amax);
      const qr_quantize_args own_args = sub_args(args, own_side, given_own, own_amax);
      // Probe the fusing side with the cast's dtype and orientation before anything runs.
      const qr_direction_layout cast_layout = caster.layout(dst.rows, dst.cols, cast_side);
      qr_tensor_cast cast{};
      cast.struct_size = sizeof(qr_tensor_cast);
      cast.dtype = cast_layout.data_dtype;
      cast.transposed = cast_layout.data_transposed;
      if (!accepted(fuse(fuser_q, &src, &own_args, nullptr, &cast), fuser.context())) continue;
      qr_quantized_tensor cast_view = single_direction(dst, cast_side, caster.format());
      if (!accepted(prepare(caster_q, &src, &cast_args, &cast_view, &cast), caster.context()))
        continue;
      qr_quantized_tensor own_view = single_direction(dst, own_side, fuser.format());
      // The probe accepted this call, so UNSUPPORTED here would break the extra's contract;
      // should it happen anyway, the two-call path rewrites both directions.
      if (accepted(fuse(fuser_q, &src, &own_args, &own_view, &cast), fuser.context()))
        return true;
    }
    return false;
  }

  // True for success, false for QR_STATUS_UNSUPPORTED (released); any other error is thrown
  // with `context`.
  static bool accepted(qr_status status, const std::string& context) {
    if (status == nullptr) return true;
    const qr_host_api* host = sdk::host();
    if (host->error_code(status) == QR_STATUS_UNSUPPORTED) {
      host->error_free(status);
      return false;
    }
    sdk::check_host(status, context);
    return false;  // unreachable: check_host threw
  }

  // QRECIPE_HYBRID_FUSE=0 turns the one-read path off (the two-call path then runs every
  // time, e.g. to time both); unset or 1: on.
  static bool fusion_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("QRECIPE_HYBRID_FUSE");
      const std::string s = v ? v : "";
      QR_CHECK(s.empty() || s == "0" || s == "1", "QRECIPE_HYBRID_FUSE='", s,
               "' is not 0 or 1 (unset it for the default, 1)");
      return s != "0";
    }();
    return on;
  }

  // columnwise_source: rowwise_dequantized with the columnwise side requested. One sequence
  // for every device: the sub-quantizers run on the source's device, and the scratch lives
  // there too (stream-ordered on args.stream for CUDA), so CUDA gives the CPU's bytes.
  void quantize_from_rowwise_dequantized(const qr_tensor_view& src, const qr_quantize_args& args,
                                         qr_quantized_tensor& dst, bool want_rowwise,
                                         const float* given_row, const float* given_col) const {
    const std::int64_t rows = dst.rows, cols = dst.cols;
    const Device device = Device::from_c(src.device);

    // The columnwise side's amax is that of the input (see the map at the top); take it
    // before the rowwise side runs, so a caller-free call equals one given compute_amax.
    float input_col_amax = 0.0f;
    if (given_col == nullptr) {
      input_col_amax = columnwise_.compute_amax(src, args.stream)[1];
      given_col = &input_col_amax;
    }

    // 1. Rowwise: into the destination when asked for, else into scratch on the device.
    std::array<float, 2> row_amax{};
    const qr_quantize_args row_args = sub_args(args, QR_DIRECTION_ROWWISE, given_row, row_amax);
    std::unique_ptr<ScratchDirection> scratch;
    qr_quantized_tensor rowwise_view;
    if (want_rowwise) {
      rowwise_view = single_direction(dst, QR_DIRECTION_ROWWISE, rowwise_.format());
    } else {
      scratch = std::make_unique<ScratchDirection>(
          ctx_, rowwise_.layout(rows, cols, QR_DIRECTION_ROWWISE), QR_DIRECTION_ROWWISE, rows,
          cols, rowwise_.format(), device, args.stream);
      rowwise_view = scratch->tensor();
    }
    rowwise_.quantize(src, row_args, rowwise_view);

    // 2. Decode it to FP32 (always FP32, whatever the source dtype) through the rowwise format.
    const ScratchTensor decoded(ctx_, DType::f32, {rows, cols}, device, args.stream);
    rowwise_.dequantize(rowwise_view, QR_DIRECTION_ROWWISE, decoded.view(), args.stream);

    // 3. Columnwise from the decoded values.
    quantize_side(QR_DIRECTION_COLUMNWISE, decoded.view(), args, given_col, dst);
  }

  qr_host_context* ctx_;  // the engine that made this quantizer (outlives it): scratch memory
  ColumnwiseSource source_;
  SubQuantizer rowwise_;     // made first: its scaling state (if any) precedes the columnwise one
  SubQuantizer columnwise_;
};

constexpr qr_option_schema kSchema[] = {
    sdk::required(sdk::option_quantizer(
        "rowwise", "", "quantizer spec of the rowwise direction (blocks along the last "
        "dimension: fprop operands, dgrad's grad_output), e.g. {format: float8}; "
        "any format except one that takes quantizers itself")),
    sdk::required(sdk::option_quantizer(
        "columnwise", "", "quantizer spec of the columnwise direction (blocks along the first "
        "dimension: dgrad's weight, wgrad operands), e.g. {format: mxfp8}")),
    sdk::option_enum("columnwise_source", "input", kSourceChoices,
                     "input: quantize the columnwise side from the input; rowwise_dequantized: "
                     "from the decoded rowwise data, so both directions hold the same values "
                     "(useful for weights)"),
};

constexpr std::uint32_t kDevices = (1u << QR_DEVICE_CPU) | (1u << QR_DEVICE_CUDA);

}  // namespace
}  // namespace qrecipe::hybrid

// ---------------------------------------------------------------- 5. exported symbols

QR_DEFINE_PLUGIN(qrecipe::hybrid::HybridQuantizer, "hybrid", "1.0.0",
                 "a different format per direction: rowwise and columnwise are full quantizer "
                 "specs of other plugins",
                 qrecipe::hybrid::kSchema, qrecipe::hybrid::kDevices)
