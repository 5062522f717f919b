// QuantizerRole: who consumes a tensor (docs/architecture.md, "Core types"). A value type with a
// stable string form "module_type:tensor_type@name" used in logs, caches and `recipe explain`.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "qrecipe/plugin_abi.h"

namespace qrecipe {

struct QuantizerRole {
  std::string module_type;  // linear, layernorm_linear, layernorm_mlp, grouped_linear, ...
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

// The module types the PyTorch adapter gives its roles, each with the family it belongs to.
// TransformerEngine calls every linear-like GEMM's role "linear", so a recipe rule for a
// family matches every type in it: `module_type: linear` covers Linear, LayerNormLinear,
// LayerNormMLP (fc1 and fc2) and GroupedLinear (its experts), while `module_type:
// layernorm_mlp` still names one type. A type not listed here is its own family.
// docs/recipes.md ("Roles") documents the table; keep the two in step.
struct ModuleTypeInfo {
  std::string_view name;
  std::string_view family;  // "" for a family's own name
};
inline constexpr ModuleTypeInfo kModuleTypes[] = {
    {"linear", ""},
    {"layernorm_linear", "linear"},
    {"layernorm_mlp", "linear"},
    {"grouped_linear", "linear"},
};

// Whether a rule's `module_type: rule_type` covers a role of module type `role_type`: the same
// type, or `rule_type` is the family of `role_type`.
inline bool module_type_covers(std::string_view rule_type, std::string_view role_type) {
  if (rule_type == role_type) return true;
  for (const auto& info : kModuleTypes)
    if (info.name == role_type) return info.family == rule_type;
  return false;
}

}  // namespace qrecipe

template <>
struct std::hash<qrecipe::QuantizerRole> {
  std::size_t operator()(const qrecipe::QuantizerRole& r) const noexcept {
    return std::hash<std::string>{}(r.str());
  }
};
