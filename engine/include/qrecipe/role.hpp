// QuantizerRole: who consumes a tensor (DESIGN.md section 3). A value type with a stable string
// form "module_type:tensor_type@name" used in logs, caches and `recipe explain`.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "qrecipe/plugin_abi.h"

namespace qrecipe {

struct QuantizerRole {
  std::string module_type;  // linear, grouped_linear, layernorm_linear, layernorm_mlp, ...
  std::string tensor_type;  // input, weight, grad_output
  std::string name;         // dotted module path; may be empty

  std::string str() const { return module_type + ":" + tensor_type + "@" + name; }
  // Pointers into this object: valid while it lives and is not modified.
  qr_role to_c() const {
    return {sizeof(qr_role), module_type.c_str(), tensor_type.c_str(), name.c_str()};
  }
  static QuantizerRole from_c(const qr_role& r) {
    return {r.module_type ? r.module_type : "", r.tensor_type ? r.tensor_type : "",
            r.name ? r.name : ""};
  }
  friend bool operator==(const QuantizerRole&, const QuantizerRole&) = default;
};

// The tensor types a GEMM of a linear layer consumes.
inline constexpr std::string_view kTensorTypes[] = {"input", "weight", "grad_output"};

}  // namespace qrecipe

template <>
struct std::hash<qrecipe::QuantizerRole> {
  std::size_t operator()(const qrecipe::QuantizerRole& r) const noexcept {
    return std::hash<std::string>{}(r.str());
  }
};
