// FormatPlugin: copies what the engine needs out of a plugin's C descriptor.
#include "qrecipe/format_plugin.hpp"

#include <cfloat>
#include <cstddef>
#include <sstream>

#include "qrecipe/error.hpp"
#include "registry/option_table.hpp"

namespace qrecipe {

const char* option_type_name(qr_option_type type) {
  switch (type) {
    case QR_OPTION_BOOL: return "bool";
    case QR_OPTION_INT: return "int";
    case QR_OPTION_FLOAT: return "float";
    case QR_OPTION_ENUM: return "enum";
    case QR_OPTION_STRING: return "string";
    case QR_OPTION_QUANTIZER: return "quantizer";
  }
  return "unknown";
}

std::string OptionSchema::type_name() const { return option_type_name(type); }

std::string OptionSchema::describe() const {
  std::ostringstream os;
  os << key << ": " << type_name();
  if (type == QR_OPTION_ENUM) {
    os << " {";
    for (std::size_t i = 0; i < choices.size(); ++i) os << (i ? ", " : "") << choices[i];
    os << "}";
  }
  if ((type == QR_OPTION_INT || type == QR_OPTION_FLOAT) && (min_value != 0 || max_value != 0))
    os << " in [" << min_value << ", " << max_value << "]";
  if (required) os << " (required)";
  else if (!default_value.empty()) os << " = " << default_value;
  if (!help.empty()) os << "  -- " << help;
  return os.str();
}

namespace {
std::string str_or_empty(const char* s) { return s ? s : ""; }
}  // namespace

FormatPlugin::FormatPlugin(std::string path, const qr_plugin_descriptor* d)
    : path_(std::move(path)), descriptor_(d) {
  QR_CHECK(d != nullptr, "plugin ", path_, " returned a null descriptor");
  QR_CHECK(d->name && *d->name, "plugin ", path_, " has no format name in its descriptor");
  registry_internal::check_format_name(d->name);
  name_ = d->name;
  version_ = str_or_empty(d->version);
  description_ = str_or_empty(d->description);
  devices_ = d->devices;
  cuda_version_ = d->cuda_version;
  cuda_archs_ = str_or_empty(d->cuda_archs);
  QR_CHECK(d->create_quantizer && d->destroy_quantizer && d->layout && d->compute_amax &&
               d->quantize && d->dequantize && d->describe,
           "plugin ", path_, " (format '", name_, "') leaves a required function slot empty");
  // Optional extras, looked up by name once (get_proc_address itself is optional).
  if (d->get_proc_address != nullptr) {
    quantize_grouped_ =
        reinterpret_cast<qr_quantize_grouped_fn>(d->get_proc_address(QR_EXTRA_QUANTIZE_GROUPED));
    grouped_device_sizes_ = reinterpret_cast<qr_grouped_device_sizes_fn>(
        d->get_proc_address(QR_EXTRA_GROUPED_DEVICE_SIZES));
    quantize_grouped_device_ = reinterpret_cast<qr_quantize_grouped_device_fn>(
        d->get_proc_address(QR_EXTRA_QUANTIZE_GROUPED_DEVICE));
    QR_CHECK((grouped_device_sizes_ == nullptr) == (quantize_grouped_device_ == nullptr),
             "plugin ", path_, " (format '", name_, "') provides only one of the extras ",
             QR_EXTRA_GROUPED_DEVICE_SIZES, " and ", QR_EXTRA_QUANTIZE_GROUPED_DEVICE,
             "; plugin_abi.h requires both or neither");
    adam_requantize_ =
        reinterpret_cast<qr_adam_requantize_fn>(d->get_proc_address(QR_EXTRA_ADAM_REQUANTIZE));
    adam_requantize_supports_ = reinterpret_cast<qr_adam_requantize_supports_fn>(
        d->get_proc_address(QR_EXTRA_ADAM_REQUANTIZE_SUPPORTS));
    compute_amax_device_ = reinterpret_cast<qr_compute_amax_device_fn>(
        d->get_proc_address(QR_EXTRA_COMPUTE_AMAX_DEVICE));
    quantize_device_amax_ = reinterpret_cast<qr_quantize_device_amax_fn>(
        d->get_proc_address(QR_EXTRA_QUANTIZE_DEVICE_AMAX));
    quantize_decoded_ = reinterpret_cast<qr_quantize_decoded_fn>(
        d->get_proc_address(QR_EXTRA_QUANTIZE_DECODED));
    // The two come as a pair: a plugin with one of them only is served by the host path.
    if (adam_requantize_ == nullptr || adam_requantize_supports_ == nullptr) {
      adam_requantize_ = nullptr;
      adam_requantize_supports_ = nullptr;
    }
  }
  // Fields appended after v1: read only when the plugin's descriptor reaches them.
  if (d->struct_size >= offsetof(qr_plugin_descriptor, tensor_scale_numerator) + sizeof(float)) {
    const float n = d->tensor_scale_numerator;
    QR_CHECK(n == 0.0f || (n > 0.0f && n <= FLT_MAX), "plugin ", path_, " (format '", name_,
             "') declares tensor_scale_numerator ", n, " in its descriptor; expected 0 (no "
             "per-tensor decode factor) or a finite positive number (plugin_abi.h)");
    tensor_scale_numerator_ = n;
  }
  // Validated before anything reads it (a NULL choices array, an out-of-range type).
  options_ = registry_internal::read_option_table(d->options, d->num_options);
}

std::string FormatPlugin::devices_str() const {
  std::string s;
  if (devices_ & (1u << QR_DEVICE_CPU)) s += "cpu";
  if (devices_ & (1u << QR_DEVICE_CUDA)) s += s.empty() ? "cuda" : ", cuda";
  return s.empty() ? "none" : s;
}

const OptionSchema* FormatPlugin::find_option(const std::string& key) const {
  for (const auto& o : options_)
    if (o.key == key) return &o;
  return nullptr;
}

std::string FormatPlugin::option_keys() const {
  std::string s;
  for (const auto& o : options_) s += (s.empty() ? "" : ", ") + o.key;
  return s.empty() ? "(none)" : s;
}

bool FormatPlugin::takes_quantizers() const {
  for (const auto& o : options_)
    if (o.type == QR_OPTION_QUANTIZER) return true;
  return false;
}

}  // namespace qrecipe
