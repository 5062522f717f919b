// FormatPlugin: the engine's view of one loaded plugin (its C descriptor plus the library it
// came from). Made only by the Registry. The library is never unloaded (objects a plugin made
// may outlive any "unload"), so a FormatPlugin and everything it returns stay valid for the
// life of the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qrecipe/plugin_abi.h"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

// "bool", "int", "float", "enum", "string", "quantizer" ("unknown" for a value out of range).
const char* option_type_name(qr_option_type type);

struct OptionSchema {
  std::string key;
  qr_option_type type = QR_OPTION_STRING;
  std::string default_value;
  std::vector<std::string> choices;  // ENUM
  double min_value = 0, max_value = 0;  // INT/FLOAT; both 0 = unbounded
  std::string help;
  bool required = false;  // a spec must set it

  std::string type_name() const;  // "bool", "int", "float", "enum", "string", "quantizer"
  std::string describe() const;   // "dtype: enum {e4m3, e5m2} = e4m3 -- help"
};

class FormatPlugin {
 public:
  FormatPlugin(std::string path, const qr_plugin_descriptor* descriptor);

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& description() const { return description_; }
  const std::string& path() const { return path_; }
  bool supports(Device device) const { return (devices_ >> device.type) & 1u; }
  std::string devices_str() const;  // "cpu, cuda"
  int cuda_version() const { return cuda_version_; }
  const std::string& cuda_archs() const { return cuda_archs_; }
  const std::vector<OptionSchema>& options() const { return options_; }
  const OptionSchema* find_option(const std::string& key) const;
  std::string option_keys() const;  // "dtype, scaling, ..." for error messages
  // True if some option takes a nested quantizer (such formats may not be nested themselves).
  bool takes_quantizers() const;
  const qr_plugin_descriptor& c() const { return *descriptor_; }
  // The grouped-quantization extra (plugin_abi.h, QR_EXTRA_QUANTIZE_GROUPED), looked up once at
  // load; nullptr when the plugin does not provide it (Engine::quantize_grouped then loops).
  qr_quantize_grouped_fn quantize_grouped_extra() const { return quantize_grouped_; }
  // The device-split grouped quantization extras (plugin_abi.h, QR_EXTRA_GROUPED_DEVICE_SIZES and
  // QR_EXTRA_QUANTIZE_GROUPED_DEVICE; both or neither); nullptr when absent.
  qr_grouped_device_sizes_fn grouped_device_sizes_extra() const { return grouped_device_sizes_; }
  qr_quantize_grouped_device_fn quantize_grouped_device_extra() const {
    return quantize_grouped_device_;
  }
  // The fused Adam + requantize extras (plugin_abi.h, QR_EXTRA_ADAM_REQUANTIZE and its
  // _SUPPORTS query), looked up once at load; both nullptr unless the plugin has both (the
  // optimizer step then updates and quantizes in two passes: qrecipe/optim.hpp).
  qr_adam_requantize_fn adam_requantize_extra() const { return adam_requantize_; }
  qr_adam_requantize_supports_fn adam_requantize_supports_extra() const {
    return adam_requantize_supports_;
  }
  // The device-amax extras (plugin_abi.h, QR_EXTRA_COMPUTE_AMAX_DEVICE and
  // QR_EXTRA_QUANTIZE_DEVICE_AMAX), looked up once at load; nullptr when the plugin lacks one
  // (Quantizer::compute_amax_into / a device amax then take the host-copy fallback).
  qr_compute_amax_device_fn compute_amax_device_extra() const { return compute_amax_device_; }
  qr_quantize_device_amax_fn quantize_device_amax_extra() const { return quantize_device_amax_; }
  // The quantize-and-decode extra (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED), looked up once at
  // load; nullptr when the plugin lacks it (GEMMs then decode the bytes in a kernel of their own).
  qr_quantize_decoded_fn quantize_decoded_extra() const { return quantize_decoded_; }
  // The descriptor's tensor_scale_numerator (plugin_abi.h): how the per-tensor decode factor
  // of this format's QR_SCALE_BLOCK_TENSOR directions follows from their amax
  // (tensor_decode_factor in scaling.hpp). 0: the format gives none (also for a plugin whose
  // descriptor predates the field), and such directions are decoded only by the plugin.
  float tensor_scale_numerator() const { return tensor_scale_numerator_; }

 private:
  std::string path_, name_, version_, description_, cuda_archs_;
  std::uint32_t devices_ = 0;
  int cuda_version_ = 0;
  std::vector<OptionSchema> options_;
  const qr_plugin_descriptor* descriptor_;
  qr_quantize_grouped_fn quantize_grouped_ = nullptr;
  qr_grouped_device_sizes_fn grouped_device_sizes_ = nullptr;
  qr_quantize_grouped_device_fn quantize_grouped_device_ = nullptr;
  qr_adam_requantize_fn adam_requantize_ = nullptr;
  qr_adam_requantize_supports_fn adam_requantize_supports_ = nullptr;
  qr_compute_amax_device_fn compute_amax_device_ = nullptr;
  qr_quantize_device_amax_fn quantize_device_amax_ = nullptr;
  qr_quantize_decoded_fn quantize_decoded_ = nullptr;
  float tensor_scale_numerator_ = 0.0f;
};

}  // namespace qrecipe
