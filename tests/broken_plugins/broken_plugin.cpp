// One source, many broken plugins: BROKEN_CASE_<name> selects which rule to break.
// The "good" case is a minimal valid format ("toy": a copy of the input as f32, no scale)
// that the registry tests use as a known-good neighbour of the broken ones.
#include <cstring>
#include <stdexcept>
#include <string>

#include "qrecipe/plugin_sdk.hpp"
#include "qrecipe/tensor.hpp"

namespace {

class ToyQuantizer final : public qrecipe::sdk::QuantizerBase {
 public:
  ToyQuantizer(const qr_create_args&, const qrecipe::sdk::Options&) {
#if defined(BROKEN_CASE_throwing_factory)
    throw std::runtime_error("toy factory failed on purpose");
#endif
  }
  qr_direction_layout layout(std::int64_t rows, std::int64_t cols, qr_direction) const override {
    auto l = qrecipe::sdk::empty_layout("toy");
    l.data_dtype = QR_DTYPE_F32;
    l.data_ndim = 2;
    l.data_shape[0] = rows;
    l.data_shape[1] = cols;
    l.scale_mode = QR_SCALE_NONE;
    return l;
  }
  void compute_amax(const qr_tensor_view&, void*, float amax[2]) override { amax[0] = amax[1] = 0; }
  void quantize(const qr_tensor_view& src, const qr_quantize_args&, qr_quantized_tensor& dst) override {
    qrecipe::TensorView s(src);
    QR_CHECK(s.dtype() == qrecipe::DType::f32 && s.is_contiguous(), "toy takes contiguous f32");
    if (dst.usage & QR_USAGE_ROWWISE)
      std::memcpy(dst.rowwise.data.data, s.data(), static_cast<std::size_t>(s.nbytes()));
  }
  void dequantize(const qr_quantized_tensor& src, qr_direction, const qr_tensor_view& dst, void*) override {
    std::memcpy(dst.data, src.rowwise.data.data, static_cast<std::size_t>(src.rows * src.cols * 4));
  }
  std::string describe() const override { return "toy"; }
};

constexpr qr_option_schema kSchema[] = {
    qrecipe::sdk::option_bool("flag", "false", "a toy option"),
};

}  // namespace

#if defined(BROKEN_CASE_good) || defined(BROKEN_CASE_duplicate) || defined(BROKEN_CASE_renamed) || \
    defined(BROKEN_CASE_throwing_factory) || defined(BROKEN_CASE_missing_dependency)
#if defined(BROKEN_CASE_missing_dependency)
extern "C" int qrecipe_test_missing_dep_value();
static int g_dep = qrecipe_test_missing_dep_value();
#endif
QR_DEFINE_PLUGIN(ToyQuantizer, "toy", "1.0.0", "toy format for registry tests", kSchema,
                 1u << QR_DEVICE_CPU)

#elif defined(BROKEN_CASE_no_abi_symbol)
extern "C" QR_PLUGIN_EXPORT int some_unrelated_function() { return 1; }

#elif defined(BROKEN_CASE_no_entry_symbol)
extern "C" QR_PLUGIN_EXPORT const uint32_t qrecipe_plugin_abi = QR_PLUGIN_ABI_VERSION;

#elif defined(BROKEN_CASE_wrong_abi)
extern "C" QR_PLUGIN_EXPORT const uint32_t qrecipe_plugin_abi = 999;
extern "C" QR_PLUGIN_EXPORT const qr_plugin_descriptor* qrecipe_plugin_entry(const qr_host_api*) {
  // Must never run: the registry reads the ABI number first.
  __builtin_trap();
}

#elif defined(BROKEN_CASE_entry_returns_null)
extern "C" QR_PLUGIN_EXPORT const uint32_t qrecipe_plugin_abi = QR_PLUGIN_ABI_VERSION;
extern "C" QR_PLUGIN_EXPORT const qr_plugin_descriptor* qrecipe_plugin_entry(const qr_host_api*) {
  return nullptr;
}

#else  // cases that return a tampered descriptor
// Malformed option tables (the loader validates the table after the entry returns: a bad one
// is a load failure naming the entry, never a crash).
constexpr const char* kChoices[] = {"a", "b"};
constexpr const char* kChoicesWithNull[] = {"a", nullptr};
constexpr const char* kChoicesTwice[] = {"a", "a"};
constexpr qr_option_schema kEnumNullChoices[] = {
    {sizeof(qr_option_schema), "mode", QR_OPTION_ENUM, "a", nullptr, 3, 0, 0, "help", 0}};
constexpr qr_option_schema kEnumNullChoice[] = {
    {sizeof(qr_option_schema), "mode", QR_OPTION_ENUM, "a", kChoicesWithNull, 2, 0, 0, "help", 0}};
constexpr qr_option_schema kEnumNoChoices[] = {
    {sizeof(qr_option_schema), "mode", QR_OPTION_ENUM, "a", kChoices, 0, 0, 0, "help", 0}};
constexpr qr_option_schema kEnumChoiceTwice[] = {
    {sizeof(qr_option_schema), "mode", QR_OPTION_ENUM, "a", kChoicesTwice, 2, 0, 0, "help", 0}};
constexpr qr_option_schema kTypeOutOfRange[] = {
    {sizeof(qr_option_schema), "odd", 99, "", nullptr, 0, 0, 0, "help", 0}};
constexpr qr_option_schema kDuplicateKeys[] = {
    qrecipe::sdk::option_bool("flag", "false", "first"),
    qrecipe::sdk::option_int("flag", "0", 0, 4, "second"),
};
constexpr qr_option_schema kMinAboveMax[] = {
    qrecipe::sdk::option_int("count", "0", 8, 2, "min 8 > max 2")};
constexpr qr_option_schema kNanBound[] = {
    qrecipe::sdk::option_float("ratio", "0", 0, __builtin_nan(""), "NaN max")};
constexpr qr_option_schema kNullKey[] = {
    {sizeof(qr_option_schema), nullptr, QR_OPTION_BOOL, "false", nullptr, 0, 0, 0, "help", 0}};
constexpr qr_option_schema kFormatKey[] = {qrecipe::sdk::option_bool("format", "false", "x")};

extern "C" QR_PLUGIN_EXPORT const uint32_t qrecipe_plugin_abi = QR_PLUGIN_ABI_VERSION;
extern "C" QR_PLUGIN_EXPORT const qr_plugin_descriptor* qrecipe_plugin_entry(const qr_host_api* host) {
  static qr_plugin_descriptor d = qrecipe::sdk::make_descriptor<ToyQuantizer>(
      "tampered", "0.0.1", "tampered descriptor", 1u, 0, "", kSchema, 1, &qrecipe::sdk::no_extras);
  qrecipe::sdk::host() = host;
#if defined(BROKEN_CASE_v1_descriptor)
  // Not broken: what a plugin built before the fields appended after v1 hands the engine. The
  // bytes past its struct_size are not its own, so they hold garbage the engine must not read.
  d.name = "oldtoy";
  d.struct_size = QR_PLUGIN_DESCRIPTOR_SIZE_V1;
  d.tensor_scale_numerator = -1.0f;
#elif defined(BROKEN_CASE_bad_numerator)
  d.tensor_scale_numerator = -2688.0f;
#elif defined(BROKEN_CASE_descriptor_abi)
  d.abi_version = 7;
#elif defined(BROKEN_CASE_small_descriptor)
  d.struct_size = 16;
#elif defined(BROKEN_CASE_missing_slot)
  d.quantize = nullptr;
#elif defined(BROKEN_CASE_named_none)
  d.name = "none";
#elif defined(BROKEN_CASE_null_options)
  d.options = nullptr;
  d.num_options = 2;
#elif defined(BROKEN_CASE_huge_option_count)
  d.num_options = 0xFFFFFFFFu;  // the table has 1 entry: the count alone must be refused
#else
#define BROKEN_TABLE(name) d.options = name; d.num_options = sizeof(name) / sizeof(name[0]);
#if defined(BROKEN_CASE_enum_null_choices)
  BROKEN_TABLE(kEnumNullChoices)
#elif defined(BROKEN_CASE_enum_null_choice)
  BROKEN_TABLE(kEnumNullChoice)
#elif defined(BROKEN_CASE_enum_no_choices)
  BROKEN_TABLE(kEnumNoChoices)
#elif defined(BROKEN_CASE_enum_choice_twice)
  BROKEN_TABLE(kEnumChoiceTwice)
#elif defined(BROKEN_CASE_option_type_99)
  BROKEN_TABLE(kTypeOutOfRange)
#elif defined(BROKEN_CASE_duplicate_option_keys)
  BROKEN_TABLE(kDuplicateKeys)
#elif defined(BROKEN_CASE_min_above_max)
  BROKEN_TABLE(kMinAboveMax)
#elif defined(BROKEN_CASE_nan_bound)
  BROKEN_TABLE(kNanBound)
#elif defined(BROKEN_CASE_null_option_key)
  BROKEN_TABLE(kNullKey)
#elif defined(BROKEN_CASE_format_option_key)
  BROKEN_TABLE(kFormatKey)
#endif
#undef BROKEN_TABLE
#endif
  return &d;
}
#endif
