// QuantizerSpec: a format name plus typed, validated options (what a recipe rule resolves to),
// and CSpec, its C mirror for the plugin boundary. Header-only.
//
// Options are ordered as the recipe wrote them. A spec whose format is "none" means "keep high
// precision". Nested specs (options of type quantizer) are held by shared_ptr so specs stay
// cheap to copy.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe {

struct SourceLocation {
  std::string file;
  int line = 0;    // 1-based; 0 when unknown (specs made in code)
  int column = 0;  // 1-based
  std::string str() const {
    if (line == 0) return file.empty() ? "<code>" : file;
    return file + ":" + std::to_string(line) + ":" + std::to_string(column);
  }
};

struct QuantizerSpec;

struct OptionValue {
  qr_option_type type = QR_OPTION_STRING;
  bool bool_value = false;
  std::int64_t int_value = 0;
  double float_value = 0.0;
  std::string string_value;                   // ENUM and STRING
  std::shared_ptr<const QuantizerSpec> spec;  // QUANTIZER
  SourceLocation location;

  static OptionValue of_bool(bool v) { OptionValue o; o.type = QR_OPTION_BOOL; o.bool_value = v; return o; }
  static OptionValue of_int(std::int64_t v) { OptionValue o; o.type = QR_OPTION_INT; o.int_value = v; return o; }
  static OptionValue of_float(double v) { OptionValue o; o.type = QR_OPTION_FLOAT; o.float_value = v; return o; }
  static OptionValue of_enum(std::string v) { OptionValue o; o.type = QR_OPTION_ENUM; o.string_value = std::move(v); return o; }
  static OptionValue of_string(std::string v) { OptionValue o; o.type = QR_OPTION_STRING; o.string_value = std::move(v); return o; }
  static OptionValue of_spec(QuantizerSpec v);
  std::string str() const;
};

// The key a spec uses to name a shared scaling state (`share: NAME`, beside `format`): an
// engine key, never passed to the plugin. Roles whose specs give the same name keep one
// delayed-scaling state (amax history and scale); see Engine::acquire_scaling_state.
inline constexpr const char* kShareKey = "share";

struct QuantizerSpec {
  std::string format = "none";
  std::vector<std::pair<std::string, OptionValue>> options;
  SourceLocation location;
  std::string share;  // the shared scaling state's name ("" = the role's own state)

  bool is_none() const { return format == "none"; }
  const OptionValue* find(const std::string& key) const {
    for (const auto& [k, v] : options)
      if (k == key) return &v;
    return nullptr;
  }
  // Stable, compact form: "myformat{scaling=delayed, margin=0}" or "none"; a shared state's
  // name comes last ("...{scaling=delayed, share=weights}").
  std::string str() const {
    if (options.empty() && share.empty()) return format;
    std::string s = format + "{";
    for (std::size_t i = 0; i < options.size(); ++i)
      s += (i ? ", " : "") + options[i].first + "=" + options[i].second.str();
    if (!share.empty()) s += (options.empty() ? "" : ", ") + std::string(kShareKey) + "=" + share;
    return s + "}";
  }
};

inline OptionValue OptionValue::of_spec(QuantizerSpec v) {
  OptionValue o;
  o.type = QR_OPTION_QUANTIZER;
  o.spec = std::make_shared<const QuantizerSpec>(std::move(v));
  return o;
}

inline std::string OptionValue::str() const {
  switch (type) {
    case QR_OPTION_BOOL: return bool_value ? "true" : "false";
    case QR_OPTION_INT: return std::to_string(int_value);
    case QR_OPTION_FLOAT: {
      std::ostringstream os;
      os.precision(9);
      os << float_value;
      return os.str();
    }
    case QR_OPTION_QUANTIZER: return spec ? spec->str() : "none";
    default: return string_value;
  }
}

// Owns the C mirror of a QuantizerSpec (strings and arrays stay valid while it lives).
class CSpec {
 public:
  explicit CSpec(const QuantizerSpec& spec) : spec_(spec) {
    for (const auto& [key, value] : spec_.options) {
      if (value.type == QR_OPTION_QUANTIZER && value.spec)
        nested_.push_back(std::make_unique<CSpec>(*value.spec));
    }
    std::size_t next_nested = 0;
    for (const auto& [key, value] : spec_.options) {
      qr_option o{};
      o.struct_size = sizeof(qr_option);
      o.key = key.c_str();
      o.type = value.type;
      o.bool_value = value.bool_value ? 1 : 0;
      o.int_value = value.int_value;
      o.float_value = value.float_value;
      o.string_value = value.string_value.c_str();
      o.spec_value = (value.type == QR_OPTION_QUANTIZER && value.spec)
                         ? nested_[next_nested++]->get()
                         : nullptr;
      options_.push_back(o);
    }
    c_.struct_size = sizeof(qr_quantizer_spec);
    c_.format = spec_.format.c_str();
    c_.options = options_.empty() ? nullptr : options_.data();
    c_.num_options = static_cast<std::uint32_t>(options_.size());
  }
  CSpec(const CSpec&) = delete;
  CSpec& operator=(const CSpec&) = delete;
  const qr_quantizer_spec* get() const { return &c_; }

  // Rebuild a C++ spec from a C one (used when a plugin asks the host for a sub-quantizer).
  static QuantizerSpec to_cpp(const qr_quantizer_spec& c) {
    QR_CHECK(c.struct_size >= sizeof(qr_quantizer_spec), "qr_quantizer_spec struct_size ",
             c.struct_size, " is smaller than this build's ", sizeof(qr_quantizer_spec));
    QuantizerSpec s;
    s.format = c.format ? c.format : "none";
    for (std::uint32_t i = 0; i < c.num_options; ++i) {
      const qr_option& o = c.options[i];
      OptionValue v;
      v.type = static_cast<qr_option_type>(o.type);
      v.bool_value = o.bool_value != 0;
      v.int_value = o.int_value;
      v.float_value = o.float_value;
      v.string_value = o.string_value ? o.string_value : "";
      if (o.type == QR_OPTION_QUANTIZER && o.spec_value)
        v.spec = std::make_shared<const QuantizerSpec>(to_cpp(*o.spec_value));
      s.options.emplace_back(o.key ? o.key : "", std::move(v));
    }
    return s;
  }

 private:
  QuantizerSpec spec_;
  std::vector<std::unique_ptr<CSpec>> nested_;
  std::vector<qr_option> options_;
  qr_quantizer_spec c_{};
};

}  // namespace qrecipe
