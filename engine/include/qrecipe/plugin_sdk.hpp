// Header-only helpers that let a plugin author write an ordinary C++ class and expose it
// through the C ABI of plugin_abi.h. Nothing here is linked from the engine.
//
// How to write a format plugin (docs/plugins.md has the worked example):
//   1. Derive a class from qrecipe::sdk::QuantizerBase and implement layout, compute_amax,
//      quantize, dequantize and describe. Throw qrecipe::Error (QR_CHECK) on bad input.
//   2. Give it a constructor `MyQuantizer(const qr_create_args& args, const sdk::Options& opts)`.
//   3. Declare the option schema as a static array of qr_option_schema (sdk::option_* helpers).
//   4. In exactly one .cpp of the plugin write
//        QR_DEFINE_PLUGIN(MyQuantizer, "myformat", "1.0.0", "what it is", kSchema, devices)
//      which defines and exports `qrecipe_plugin_abi` and `qrecipe_plugin_entry`.
//   5. Optional: give the class a member
//        void quantize_grouped(const qr_tensor_view& src, std::span<const std::int64_t> rows,
//                              const qr_quantize_args& args,
//                              std::span<qr_quantized_tensor* const> dst);
//      and get_proc_address(QR_EXTRA_QUANTIZE_GROUPED) returns it (plugin_abi.h has the
//      contract; check_grouped_call below has already checked the generic arguments when it
//      runs). Likewise the two members
//        void grouped_device_sizes(std::int64_t rows, std::int64_t cols, std::uint32_t groups,
//                                  qr_direction d, std::size_t& data, std::size_t& scales);
//        void quantize_grouped_device(const qr_tensor_view& src, const qr_quantize_args& args,
//                                     qr_grouped_quantized& dst);
//      give QR_EXTRA_GROUPED_DEVICE_SIZES and QR_EXTRA_QUANTIZE_GROUPED_DEVICE (groups whose
//      sizes only the device knows), and the one-read fusion extras (plugin_abi.h,
//      qr_tensor_cast):
//        void prepare_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
//                                 qr_quantized_tensor& dst, qr_tensor_cast& cast);
//        void quantize_with_tensor_cast(const qr_tensor_view& src, const qr_quantize_args& args,
//                                       qr_quantized_tensor* dst, const qr_tensor_cast& cast);
//      (throw qrecipe::Error with QR_STATUS_UNSUPPORTED, before writing anything, for what
//      they cannot do). Likewise the device-amax extras (plugin_abi.h,
//      QR_EXTRA_COMPUTE_AMAX_DEVICE / QR_EXTRA_QUANTIZE_DEVICE_AMAX):
//        void compute_amax_device(const qr_tensor_view& src, void* stream, float* amax_out);
//        void quantize_device_amax(const qr_tensor_view& src, const qr_quantize_args& args,
//                                  const float* amax, qr_quantized_tensor& dst);
//      (the second throws QR_STATUS_UNSUPPORTED, before writing anything, for a quantizer that
//      cannot take a device amax). Likewise quantize-and-decode (plugin_abi.h,
//      QR_EXTRA_QUANTIZE_DECODED; the trampoline has checked the usage and the miss word):
//        void quantize_decoded(const qr_tensor_view& src, const qr_quantize_args& args,
//                              qr_quantized_tensor& dst, const qr_decoded_output& decoded);
//      sdk::decoded_bf16 turns one decoded FP32 value into the BF16 bits the extra writes
//      (the reference of a CPU tensor: quantize, then decode each stored element with it).
//      Other extras come from the function given to QR_DEFINE_PLUGIN_EX.
//   6. A format with QR_SCALE_BLOCK_TENSOR directions gives the class
//        static constexpr float kTensorScaleNumerator = ...;
//      and the descriptor carries it as tensor_scale_numerator (plugin_abi.h says what it
//      means); without the member the descriptor says 0 (no per-tensor decode factor).
// Every call into the class goes through a noexcept trampoline that turns exceptions into
// qr_status values made by the host, so no exception ever crosses the boundary.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "qrecipe/checked.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::sdk {

// The host table given to qrecipe_plugin_entry; one per loaded plugin (hidden visibility).
inline const qr_host_api*& host() {
  static const qr_host_api* h = nullptr;
  return h;
}

// Turn whatever `fn` throws into a status made by the host.
template <class Fn>
qr_status guard(Fn&& fn) noexcept {
  const qr_host_api* h = host();
  try {
    fn();
    return nullptr;
  } catch (const qrecipe::Error& e) {
    return h ? h->error_new(e.code(), e.where().c_str(), e.message().c_str()) : nullptr;
  } catch (const std::bad_alloc&) {
    return h ? h->error_new(QR_STATUS_OUT_OF_MEMORY, "", "out of memory") : nullptr;
  } catch (const std::exception& e) {
    return h ? h->error_new(QR_STATUS_INTERNAL, "", e.what()) : nullptr;
  } catch (...) {
    return h ? h->error_new(QR_STATUS_INTERNAL, "", "unknown exception in plugin") : nullptr;
  }
}

// Read access to the validated options of a spec. Absent keys return the default given.
class Options {
 public:
  explicit Options(const qr_quantizer_spec* spec) : spec_(spec) {}
  const qr_option* find(std::string_view key) const {
    if (!spec_) return nullptr;
    for (std::uint32_t i = 0; i < spec_->num_options; ++i)
      if (spec_->options[i].key && key == spec_->options[i].key) return &spec_->options[i];
    return nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  bool get_bool(std::string_view key, bool def) const {
    const qr_option* o = find(key);
    return o ? o->bool_value != 0 : def;
  }
  std::int64_t get_int(std::string_view key, std::int64_t def) const {
    const qr_option* o = find(key);
    return o ? o->int_value : def;
  }
  double get_float(std::string_view key, double def) const {
    const qr_option* o = find(key);
    if (!o) return def;
    return o->type == QR_OPTION_INT ? static_cast<double>(o->int_value) : o->float_value;
  }
  std::string get_string(std::string_view key, std::string_view def) const {
    const qr_option* o = find(key);
    return o && o->string_value ? std::string(o->string_value) : std::string(def);
  }
  const qr_quantizer_spec* get_spec(std::string_view key) const {
    const qr_option* o = find(key);
    return o ? o->spec_value : nullptr;
  }

 private:
  const qr_quantizer_spec* spec_;
};

// Schema entry builders (static data; strings must have static storage).
constexpr qr_option_schema option_bool(const char* key, const char* def, const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_BOOL, def, nullptr, 0, 0, 0, help, 0};
}
constexpr qr_option_schema option_int(const char* key, const char* def, double lo, double hi,
                                      const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_INT, def, nullptr, 0, lo, hi, help, 0};
}
constexpr qr_option_schema option_float(const char* key, const char* def, double lo, double hi,
                                        const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_FLOAT, def, nullptr, 0, lo, hi, help, 0};
}
template <std::size_t N>
constexpr qr_option_schema option_enum(const char* key, const char* def,
                                       const char* const (&choices)[N], const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_ENUM, def, choices,
          static_cast<std::uint32_t>(N), 0, 0, help, 0};
}
constexpr qr_option_schema option_string(const char* key, const char* def, const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_STRING, def, nullptr, 0, 0, 0, help, 0};
}
constexpr qr_option_schema option_quantizer(const char* key, const char* def, const char* help) {
  return {sizeof(qr_option_schema), key, QR_OPTION_QUANTIZER, def, nullptr, 0, 0, 0, help, 0};
}
// Marks an entry as required: the engine rejects a spec of the format that does not set it,
// when the recipe is checked (with file:line:column), before the plugin sees it.
constexpr qr_option_schema required(qr_option_schema entry) {
  entry.required = 1;
  return entry;
}

// A layout with struct_size set and everything else zero.
inline qr_direction_layout empty_layout(const char* format) {
  qr_direction_layout l{};
  l.struct_size = sizeof(qr_direction_layout);
  l.format = format;
  return l;
}

// Shape arithmetic for layouts: checked (qrecipe/checked.hpp), so a shape whose padded size
// does not fit in 64 bits is an error, never a wrapped size.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return qrecipe::ceil_div(a, b, "layout"); }
inline std::int64_t round_up(std::int64_t a, std::int64_t m) { return qrecipe::round_up(a, m, "layout"); }

// What a plugin's quantizer implements. The engine guarantees: src is a valid view whose
// logical 2-D shape matches dst->rows x dst->cols; each requested direction of dst has buffers
// of exactly the sizes `layout` reported, zero-filled at allocation.
class QuantizerBase {
 public:
  virtual ~QuantizerBase() = default;
  virtual qr_direction_layout layout(std::int64_t rows, std::int64_t cols,
                                     qr_direction direction) const = 0;
  virtual void compute_amax(const qr_tensor_view& src, void* stream, float amax_out[2]) = 0;
  virtual void quantize(const qr_tensor_view& src, const qr_quantize_args& args,
                        qr_quantized_tensor& dst) = 0;
  virtual void dequantize(const qr_quantized_tensor& src, qr_direction direction,
                          const qr_tensor_view& dst, void* stream) = 0;
  virtual std::string describe() const = 0;
};

// A quantizer class that implements grouped quantization (how-to step 5 above).
template <class Q>
concept HasQuantizeGrouped = requires(Q& q, const qr_tensor_view& src,
                                      std::span<const std::int64_t> rows,
                                      const qr_quantize_args& args,
                                      std::span<qr_quantized_tensor* const> dst) {
  q.quantize_grouped(src, rows, args, dst);
};

// A quantizer class that can describe a direction as a per-tensor cast, or write one while it
// quantizes (the one-read fusion extras of plugin_abi.h; how-to step 5 above).
template <class Q>
concept HasPrepareTensorCast = requires(Q& q, const qr_tensor_view& src,
                                        const qr_quantize_args& args, qr_quantized_tensor& dst,
                                        qr_tensor_cast& cast) {
  q.prepare_tensor_cast(src, args, dst, cast);
};
template <class Q>
concept HasQuantizeWithTensorCast = requires(Q& q, const qr_tensor_view& src,
                                             const qr_quantize_args& args,
                                             qr_quantized_tensor* dst,
                                             const qr_tensor_cast& cast) {
  q.quantize_with_tensor_cast(src, args, dst, cast);
};

// A quantizer class with the device-amax extras (how-to step 5 above).
template <class Q>
concept HasComputeAmaxDevice = requires(Q& q, const qr_tensor_view& src, void* stream,
                                        float* out) { q.compute_amax_device(src, stream, out); };
template <class Q>
concept HasQuantizeDecoded = requires(Q& q, const qr_tensor_view& src,
                                      const qr_quantize_args& args, qr_quantized_tensor& dst,
                                      const qr_decoded_output& decoded) {
  q.quantize_decoded(src, args, dst, decoded);
};

template <class Q>
concept HasQuantizeDeviceAmax = requires(Q& q, const qr_tensor_view& src,
                                         const qr_quantize_args& args, const float* amax,
                                         qr_quantized_tensor& dst) {
  q.quantize_device_amax(src, args, amax, dst);
};

// The descriptor's tensor_scale_numerator of Q (how-to step 6 above): Q's
// kTensorScaleNumerator, or 0 when Q has none.
template <class Q>
constexpr float tensor_scale_numerator_of() {
  if constexpr (requires { Q::kTensorScaleNumerator; })
    return static_cast<float>(Q::kTensorScaleNumerator);
  else
    return 0.0f;
}

// The generic checks of a quantize_grouped call (plugin_abi.h), made before the plugin's own:
// struct sizes, at least one group, a 2-D source whose rows the groups cover exactly, one
// destination of group_rows[g] x cols per group holding the requested usage, no reduced amax.
// `format` names the plugin in the messages.
inline void check_grouped_call(const qr_tensor_view* src, std::uint32_t num_groups,
                               const std::int64_t* group_rows, const qr_quantize_args* args,
                               qr_quantized_tensor* const* dst, const char* format) {
  QR_CHECK(src && args && (num_groups == 0 || (group_rows && dst)), format,
           " quantize_grouped: called with a null source, args, group_rows or dst array");
  QR_CHECK(src->struct_size >= sizeof(qr_tensor_view), format,
           " quantize_grouped: source view struct_size ", src->struct_size, " < ",
           sizeof(qr_tensor_view));
  QR_CHECK(args->struct_size >= sizeof(qr_quantize_args), format,
           " quantize_grouped: qr_quantize_args struct_size ", args->struct_size, " < ",
           sizeof(qr_quantize_args));
  QR_CHECK(num_groups >= 1, format, " quantize_grouped: num_groups is 0; pass at least one "
           "group");
  QR_CHECK(src->ndim == 2, format, " quantize_grouped: the source must be a 2-D [rows, cols] "
           "view, got ndim ", src->ndim, "; flatten the leading dimensions first");
  QR_CHECK(args->amax == nullptr, format, " quantize_grouped: args.amax must be NULL (reduced "
           "amaxes are per group: quantize the groups one by one with their own amax)");
  std::int64_t total = 0;
  for (std::uint32_t g = 0; g < num_groups; ++g) {
    QR_CHECK(group_rows[g] >= 0, format, " quantize_grouped: group ", g, " has ", group_rows[g],
             " rows; row counts must be >= 0");
    total += group_rows[g];
  }
  QR_CHECK(total == src->shape[0], format, " quantize_grouped: the ", num_groups,
           " group row counts sum to ", total, " but the source has ", src->shape[0],
           " rows; the groups must cover every row exactly");
  for (std::uint32_t g = 0; g < num_groups; ++g) {
    QR_CHECK(dst[g] != nullptr && dst[g]->struct_size >= sizeof(qr_quantized_tensor), format,
             " quantize_grouped: destination ", g, " is null or has a short struct_size");
    QR_CHECK(dst[g]->rows == group_rows[g] && dst[g]->cols == src->shape[1], format,
             " quantize_grouped: destination ", g, " is ", dst[g]->rows, " x ", dst[g]->cols,
             " but group ", g, " is ", group_rows[g], " x ", src->shape[1]);
    QR_CHECK((dst[g]->usage & args->usage) == args->usage, format, " quantize_grouped: "
             "destination ", g, " holds usage ", dst[g]->usage, " but ", args->usage,
             " is requested; allocate every group with the requested usage");
  }
}

// A quantizer class that implements device-split grouped quantization (how-to step 5).
template <class Q>
concept HasQuantizeGroupedDevice = requires(Q& q, const qr_tensor_view& src,
                                            const qr_quantize_args& args,
                                            qr_grouped_quantized& dst, std::size_t& bytes) {
  q.grouped_device_sizes(std::int64_t{0}, std::int64_t{0}, std::uint32_t{1}, QR_DIRECTION_ROWWISE,
                         bytes, bytes);
  q.quantize_grouped_device(src, args, dst);
};

// The generic checks of a quantize_grouped_device call (plugin_abi.h), made before the
// plugin's own: struct sizes, a 2-D contiguous source of dst->rows x dst->cols, offsets, the
// requested directions held with their buffers and tables, no reduced amax.
inline void check_grouped_device_call(const qr_tensor_view* src, const qr_quantize_args* args,
                                      const qr_grouped_quantized* dst, const char* format) {
  QR_CHECK(src && args && dst, format, " quantize_grouped_device: called with a null source, "
           "args or destination");
  QR_CHECK(src->struct_size >= sizeof(qr_tensor_view) &&
               args->struct_size >= sizeof(qr_quantize_args) &&
               dst->struct_size >= sizeof(qr_grouped_quantized),
           format, " quantize_grouped_device: a struct is older than this plugin's ABI");
  QR_CHECK(src->ndim == 2 && src->shape[0] == dst->rows && src->shape[1] == dst->cols &&
               (src->shape[0] <= 1 || src->strides[0] == src->shape[1]) &&
               (src->shape[1] <= 1 || src->strides[1] == 1),
           format, " quantize_grouped_device: the source must be a contiguous 2-D [", dst->rows,
           ", ", dst->cols, "] tensor");
  QR_CHECK(dst->num_groups >= 1 && dst->offsets != nullptr, format,
           " quantize_grouped_device: ", dst->num_groups, " groups and ",
           dst->offsets ? "offsets" : "no offsets", "; pass at least one group and its offsets");
  QR_CHECK(args->amax == nullptr, format, " quantize_grouped_device: args.amax must be NULL "
           "(reduced amaxes are per group)");
  QR_CHECK(args->usage != 0 && (dst->usage & args->usage) == args->usage, format,
           " quantize_grouped_device: usage ", args->usage, " requested, destination holds ",
           dst->usage);
  for (const qr_grouped_direction* d : {&dst->rowwise, &dst->columnwise}) {
    const bool wanted = args->usage & (d == &dst->rowwise ? QR_USAGE_ROWWISE : QR_USAGE_COLUMNWISE);
    if (!wanted) continue;
    QR_CHECK(d->struct_size >= sizeof(qr_grouped_direction) && d->data != nullptr &&
                 d->groups != nullptr,
             format, " quantize_grouped_device: the ", d == &dst->rowwise ? "rowwise" : "columnwise",
             " direction has no data buffer or group table");
  }
}

// C trampolines for a QuantizerBase subclass Q.
template <class Q>
struct Trampolines {
  static Q* self(qr_quantizer* q) { return reinterpret_cast<Q*>(q); }

  static qr_status create(const qr_create_args* args, qr_quantizer** out) noexcept {
    return guard([&] {
      QR_CHECK(args && out, "create_quantizer called with null arguments");
      QR_CHECK(args->struct_size >= sizeof(qr_create_args), "qr_create_args struct_size ",
               args->struct_size, " < ", sizeof(qr_create_args));
      Options opts(args->spec);
      *out = reinterpret_cast<qr_quantizer*>(new Q(*args, opts));
    });
  }
  static void destroy(qr_quantizer* q) noexcept { delete self(q); }
  static qr_status layout(qr_quantizer* q, std::int64_t rows, std::int64_t cols,
                          std::int32_t direction, qr_direction_layout* out) noexcept {
    return guard([&] {
      QR_CHECK(direction == QR_DIRECTION_ROWWISE || direction == QR_DIRECTION_COLUMNWISE,
               "direction ", direction, " is neither rowwise (0) nor columnwise (1)");
      *out = self(q)->layout(rows, cols, static_cast<qr_direction>(direction));
    });
  }
  static qr_status compute_amax(qr_quantizer* q, const qr_tensor_view* src, void* stream,
                                float* amax_out) noexcept {
    return guard([&] { self(q)->compute_amax(*src, stream, amax_out); });
  }
  static qr_status quantize(qr_quantizer* q, const qr_tensor_view* src,
                            const qr_quantize_args* args, qr_quantized_tensor* dst) noexcept {
    return guard([&] { self(q)->quantize(*src, *args, *dst); });
  }
  static qr_status dequantize(qr_quantizer* q, const qr_quantized_tensor* src,
                              std::int32_t direction, const qr_tensor_view* dst,
                              void* stream) noexcept {
    return guard([&] {
      self(q)->dequantize(*src, static_cast<qr_direction>(direction), *dst, stream);
    });
  }
  static qr_status quantize_grouped(qr_quantizer* q, const qr_tensor_view* src,
                                    std::uint32_t num_groups, const std::int64_t* group_rows,
                                    const qr_quantize_args* args,
                                    qr_quantized_tensor* const* dst) noexcept {
    return guard([&] {
      check_grouped_call(src, num_groups, group_rows, args, dst, "plugin");
      self(q)->quantize_grouped(*src, std::span<const std::int64_t>(group_rows, num_groups),
                                *args, std::span<qr_quantized_tensor* const>(dst, num_groups));
    });
  }
  static qr_status grouped_device_sizes(qr_quantizer* q, std::int64_t rows, std::int64_t cols,
                                        std::uint32_t groups, std::int32_t direction,
                                        std::size_t* data, std::size_t* scales) noexcept {
    return guard([&] {
      QR_CHECK(data && scales, "grouped_device_sizes called with null outputs");
      QR_CHECK(rows >= 0 && cols >= 0 && groups >= 1, "grouped_device_sizes: ", rows, " x ", cols,
               " in ", groups, " groups; sizes must be >= 0 and groups >= 1");
      QR_CHECK(direction == QR_DIRECTION_ROWWISE || direction == QR_DIRECTION_COLUMNWISE,
               "direction ", direction, " is neither rowwise (0) nor columnwise (1)");
      self(q)->grouped_device_sizes(rows, cols, groups, static_cast<qr_direction>(direction),
                                    *data, *scales);
    });
  }
  static qr_status quantize_grouped_device(qr_quantizer* q, const qr_tensor_view* src,
                                           const qr_quantize_args* args,
                                           qr_grouped_quantized* dst) noexcept {
    return guard([&] {
      check_grouped_device_call(src, args, dst, "plugin");
      self(q)->quantize_grouped_device(*src, *args, *dst);
    });
  }
  static qr_status prepare_tensor_cast(qr_quantizer* q, const qr_tensor_view* src,
                                       const qr_quantize_args* args, qr_quantized_tensor* dst,
                                       qr_tensor_cast* cast) noexcept {
    return guard([&] {
      QR_CHECK(src && args && dst && cast, "prepare_tensor_cast called with null arguments");
      QR_CHECK(args->struct_size >= sizeof(qr_quantize_args) &&
                   cast->struct_size >= sizeof(qr_tensor_cast),
               "prepare_tensor_cast: qr_quantize_args or qr_tensor_cast struct_size too small");
      self(q)->prepare_tensor_cast(*src, *args, *dst, *cast);
    });
  }
  static qr_status quantize_with_tensor_cast(qr_quantizer* q, const qr_tensor_view* src,
                                             const qr_quantize_args* args,
                                             qr_quantized_tensor* dst,
                                             const qr_tensor_cast* cast) noexcept {
    return guard([&] {
      QR_CHECK(src && args && cast, "quantize_with_tensor_cast called with null arguments");
      QR_CHECK(args->struct_size >= sizeof(qr_quantize_args) &&
                   cast->struct_size >= sizeof(qr_tensor_cast),
               "quantize_with_tensor_cast: qr_quantize_args or qr_tensor_cast struct_size too "
               "small");
      self(q)->quantize_with_tensor_cast(*src, *args, dst, *cast);
    });
  }
  static qr_status compute_amax_device(qr_quantizer* q, const qr_tensor_view* src, void* stream,
                                       float* amax_out) noexcept {
    return guard([&] {
      QR_CHECK(src && amax_out, "compute_amax_device called with a null source or output");
      self(q)->compute_amax_device(*src, stream, amax_out);
    });
  }
  static qr_status quantize_device_amax(qr_quantizer* q, const qr_tensor_view* src,
                                        const qr_quantize_args* args, const float* amax,
                                        qr_quantized_tensor* dst) noexcept {
    return guard([&] {
      QR_CHECK(src && args && amax && dst, "quantize_device_amax called with null arguments");
      QR_CHECK(args->struct_size >= sizeof(qr_quantize_args),
               "quantize_device_amax: qr_quantize_args struct_size too small");
      QR_CHECK(args->amax == nullptr, "quantize_device_amax: args.amax must be NULL (the amax "
               "comes on the device)");
      self(q)->quantize_device_amax(*src, *args, amax, *dst);
    });
  }
  static qr_status quantize_decoded(qr_quantizer* q, const qr_tensor_view* src,
                                    const qr_quantize_args* args, qr_quantized_tensor* dst,
                                    const qr_decoded_output* decoded) noexcept {
    return guard([&] {
      QR_CHECK(src && args && dst && decoded, "quantize_decoded called with null arguments");
      QR_CHECK(args->struct_size >= sizeof(qr_quantize_args),
               "quantize_decoded: qr_quantize_args struct_size too small");
      QR_CHECK(decoded->struct_size >= sizeof(qr_decoded_output),
               "quantize_decoded: qr_decoded_output struct_size ", decoded->struct_size,
               " is smaller than this plugin's ", sizeof(qr_decoded_output));
      for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
        if (decoded->values[d] == nullptr) continue;
        const std::uint32_t bit = d == QR_DIRECTION_ROWWISE ? QR_USAGE_ROWWISE : QR_USAGE_COLUMNWISE;
        QR_CHECK((args->usage & bit) != 0, "quantize_decoded: decoded values of the ",
                 d == QR_DIRECTION_ROWWISE ? "rowwise" : "columnwise",
                 " direction were asked for, but args.usage does not quantize it");
        QR_CHECK(decoded->miss[d] != nullptr, "quantize_decoded: decoded values need a miss word");
      }
      self(q)->quantize_decoded(*src, *args, *dst, *decoded);
    });
  }
  static qr_status describe(qr_quantizer* q, char* buffer, std::size_t capacity) noexcept {
    return guard([&] {
      const std::string s = self(q)->describe();
      if (capacity == 0) return;
      const std::size_t n = s.size() < capacity - 1 ? s.size() : capacity - 1;
      std::memcpy(buffer, s.data(), n);
      buffer[n] = '\0';
    });
  }
};

template <class Q>
constexpr qr_plugin_descriptor make_descriptor(const char* name, const char* version,
                                               const char* description, std::uint32_t devices,
                                               std::int32_t cuda_version, const char* cuda_archs,
                                               const qr_option_schema* options,
                                               std::uint32_t num_options,
                                               void* (*get_proc_address)(const char*)) {
  return {QR_PLUGIN_ABI_VERSION,
          sizeof(qr_plugin_descriptor),
          name,
          version,
          description,
          devices,
          cuda_version,
          cuda_archs,
          options,
          num_options,
          &Trampolines<Q>::create,
          &Trampolines<Q>::destroy,
          &Trampolines<Q>::layout,
          &Trampolines<Q>::compute_amax,
          &Trampolines<Q>::quantize,
          &Trampolines<Q>::dequantize,
          get_proc_address,
          &Trampolines<Q>::describe,
          tensor_scale_numerator_of<Q>()};
}

// The descriptor's get_proc_address: the extras the SDK itself provides for Q (grouped
// quantization when Q has a quantize_grouped member, the tensor-cast fusion extras when it has
// those members), then whatever `PluginExtras` (the
// plugin's own lookup, QR_DEFINE_PLUGIN_EX) returns.
template <class Q, void* (*PluginExtras)(const char*)>
void* extras(const char* name) {
  if (name == nullptr) return nullptr;
  if constexpr (HasQuantizeGrouped<Q>) {
    if (std::strcmp(name, QR_EXTRA_QUANTIZE_GROUPED) == 0) {
      const qr_quantize_grouped_fn fn = &Trampolines<Q>::quantize_grouped;
      return reinterpret_cast<void*>(fn);  // POSIX: function pointers round-trip through void*
    }
  }
  if constexpr (HasQuantizeGroupedDevice<Q>) {
    if (std::strcmp(name, QR_EXTRA_GROUPED_DEVICE_SIZES) == 0) {
      const qr_grouped_device_sizes_fn fn = &Trampolines<Q>::grouped_device_sizes;
      return reinterpret_cast<void*>(fn);
    }
    if (std::strcmp(name, QR_EXTRA_QUANTIZE_GROUPED_DEVICE) == 0) {
      const qr_quantize_grouped_device_fn fn = &Trampolines<Q>::quantize_grouped_device;
      return reinterpret_cast<void*>(fn);
    }
  }
  if constexpr (HasPrepareTensorCast<Q>) {
    if (std::strcmp(name, QR_EXTRA_PREPARE_TENSOR_CAST) == 0) {
      const qr_prepare_tensor_cast_fn fn = &Trampolines<Q>::prepare_tensor_cast;
      return reinterpret_cast<void*>(fn);
    }
  }
  if constexpr (HasQuantizeWithTensorCast<Q>) {
    if (std::strcmp(name, QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST) == 0) {
      const qr_quantize_with_tensor_cast_fn fn = &Trampolines<Q>::quantize_with_tensor_cast;
      return reinterpret_cast<void*>(fn);
    }
  }
  if constexpr (HasComputeAmaxDevice<Q>) {
    if (std::strcmp(name, QR_EXTRA_COMPUTE_AMAX_DEVICE) == 0) {
      const qr_compute_amax_device_fn fn = &Trampolines<Q>::compute_amax_device;
      return reinterpret_cast<void*>(fn);
    }
  }
  if constexpr (HasQuantizeDecoded<Q>) {
    if (std::strcmp(name, QR_EXTRA_QUANTIZE_DECODED) == 0) {
      const qr_quantize_decoded_fn fn = &Trampolines<Q>::quantize_decoded;
      return reinterpret_cast<void*>(fn);
    }
  }
  if constexpr (HasQuantizeDeviceAmax<Q>) {
    if (std::strcmp(name, QR_EXTRA_QUANTIZE_DEVICE_AMAX) == 0) {
      const qr_quantize_device_amax_fn fn = &Trampolines<Q>::quantize_device_amax;
      return reinterpret_cast<void*>(fn);
    }
  }
  return PluginExtras(name);
}

// The CPU side of the device-amax extras for a quantizer whose CPU path is its reference:
// host memory holds the amax, so both are the host calls (the definition of the result).
template <class Q>
void compute_amax_device_cpu(Q& q, const qr_tensor_view& src, void* stream, float* amax_out) {
  q.compute_amax(src, stream, amax_out);
}
template <class Q>
void quantize_device_amax_cpu(Q& q, const qr_tensor_view& src, const qr_quantize_args& args,
                              const float* amax, qr_quantized_tensor& dst) {
  const float values[2] = {amax[0], amax[1]};
  qr_quantize_args given = args;
  given.amax = values;
  q.quantize(src, given, dst);
}

// Devices this build of a plugin serves: its CPU reference always, CUDA when the plugin was
// compiled with its kernels (QRECIPE_PLUGIN_HAS_CUDA, set by qrecipe_add_plugin).
#if defined(QRECIPE_PLUGIN_HAS_CUDA)
inline constexpr bool kHasCuda = true;
#else
inline constexpr bool kHasCuda = false;
#endif
inline constexpr std::uint32_t kBuiltDevices =
    (1u << QR_DEVICE_CPU) | (kHasCuda ? 1u << QR_DEVICE_CUDA : 0u);

inline void* no_extras(const char*) { return nullptr; }

// QR_EXTRA_QUANTIZE_DECODED's value of one element (plugin_abi.h): `v` = code value times
// block scale in FP32, written as its high 16 bits, every NaN as 0x7FFF; `miss` becomes
// nonzero when a finite v has nonzero low bits. QR_HD, so CUDA kernels apply the same rule.
QR_HD std::uint16_t decoded_bf16(float v, std::uint32_t& miss) {
  const std::uint32_t u = num::float_bits(v);
  const bool special = (u & 0x7F800000u) == 0x7F800000u;
  if (special && (u & 0x7FFFFFu) != 0) return 0x7FFFu;  // NaN
  if (!special && (u & 0xFFFFu) != 0) miss = 1u;
  return static_cast<std::uint16_t>(u >> 16);
}

// Turns the status of a host call (e.g. a sub-quantizer's quantize) into a thrown
// qrecipe::Error that keeps the original code, where and message, prefixed by `context`
// ("rowwise sub-quantizer (myformat)"). Frees the status. No-op for success.
inline void check_host(qr_status status, std::string_view context) {
  if (status == nullptr) return;
  const qr_host_api* h = host();
  if (h == nullptr || h->error_code == nullptr || h->error_message == nullptr ||
      h->error_where == nullptr || h->error_free == nullptr) {
    // Unreachable with a host that passed the entry's struct_size check; never leak silently.
    throw qrecipe::Error(QR_STATUS_INTERNAL, "",
                         std::string(context) + ": a host call failed and this host cannot "
                                                "report why (host table too old)");
  }
  const auto code = static_cast<qr_status_code>(h->error_code(status));
  std::string where = h->error_where(status);
  std::string message = h->error_message(status);
  h->error_free(status);
  throw qrecipe::Error(code, std::move(where),
                       context.empty() ? message : std::string(context) + ": " + message);
}
}  // namespace qrecipe::sdk

#if defined(QRECIPE_PLUGIN_CUDA_VERSION)
#define QR_SDK_CUDA_VERSION QRECIPE_PLUGIN_CUDA_VERSION
#else
#define QR_SDK_CUDA_VERSION 0
#endif
#if defined(QRECIPE_PLUGIN_CUDA_ARCHS)
#define QR_SDK_CUDA_ARCHS QRECIPE_PLUGIN_CUDA_ARCHS
#else
#define QR_SDK_CUDA_ARCHS ""
#endif

// Defines the two exported symbols of a plugin. `devices` is a bit mask of (1 << qr_device_type).
#define QR_DEFINE_PLUGIN_EX(QuantizerClass, name, version, description, schema, devices,        \
                            get_proc)                                                           \
  extern "C" QR_PLUGIN_EXPORT const uint32_t qrecipe_plugin_abi = QR_PLUGIN_ABI_VERSION;        \
  extern "C" QR_PLUGIN_EXPORT const qr_plugin_descriptor* qrecipe_plugin_entry(                  \
      const qr_host_api* host) {                                                                \
    static const qr_plugin_descriptor descriptor = ::qrecipe::sdk::make_descriptor<QuantizerClass>( \
        name, version, description, devices, QR_SDK_CUDA_VERSION, QR_SDK_CUDA_ARCHS, schema,    \
        static_cast<uint32_t>(sizeof(schema) / sizeof((schema)[0])),                            \
        &::qrecipe::sdk::extras<QuantizerClass, get_proc>);                                     \
    if (host == nullptr || host->abi_version != QR_PLUGIN_ABI_VERSION ||                        \
        host->struct_size < sizeof(qr_host_api))                                                \
      return nullptr;                                                                           \
    /* Written once: later loads (another Registry) pass the same table, and a write would   \
       race with the reads of quantize calls running on other threads. */                     \
    if (::qrecipe::sdk::host() != host) ::qrecipe::sdk::host() = host;                         \
    return &descriptor;                                                                         \
  }

#define QR_DEFINE_PLUGIN(QuantizerClass, name, version, description, schema, devices)          \
  QR_DEFINE_PLUGIN_EX(QuantizerClass, name, version, description, schema, devices,              \
                      &::qrecipe::sdk::no_extras)
