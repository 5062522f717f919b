// qrecipe._C.Engine: one engine per recipe. Resolves roles to quantizers, plans the GEMMs of
// linear layers, and holds the delayed-scaling states (update, read and load for checkpoints).
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"
#include "qrecipe/registry.hpp"

namespace qrecipe::python {
namespace {

py::object quantizer_or_none(const std::shared_ptr<Engine>& engine,
                             const std::shared_ptr<Quantizer>& q) {
  if (!q) return py::none();
  return py::cast(PyQuantizer{engine, q});
}

// The k-th state of an owner, in creation order: a hybrid quantizer whose two halves both use
// delayed scaling has two states with the same owner ("role format"), always created in the
// same order (rowwise half first), so (owner, k) names a state across engines.
std::vector<std::pair<std::string, int>> state_keys(const Engine& engine) {
  std::vector<std::pair<std::string, int>> keys;
  std::map<std::string, int> seen;
  for (const auto& s : engine.scaling_states()) keys.emplace_back(s->owner, seen[s->owner]++);
  return keys;
}

// The role part of a state's owner, "linear:input@fc float8" -> "linear:input@fc" (the
// quantizer's QuantizerRole::str(), then its format): what module-level checkpoints match.
std::string owner_role_text(const std::string& owner) {
  return owner.substr(0, owner.rfind(' '));  // no space (npos): the whole owner
}

// The same split into its fields ("module_type:tensor_type@name": the first ':' and the first
// '@' after it), for Recipe.load_state_dict, which resolves the roles a checkpoint names.
// The one parser of owners: Python asks it through _C.role_of_owner.
QuantizerRole owner_role(const std::string& owner) {
  const std::string role = owner_role_text(owner);
  const auto colon = role.find(':');
  if (colon == std::string::npos) return {role, "", ""};
  const auto at = role.find('@', colon + 1);
  if (at == std::string::npos) return {role.substr(0, colon), role.substr(colon + 1), ""};
  return {role.substr(0, colon), role.substr(colon + 1, at - colon - 1), role.substr(at + 1)};
}

py::list scaling_states(const Engine& engine,
                        const std::optional<std::vector<std::string>>& roles) {
  py::list out;
  const auto keys = state_keys(engine);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const ScalingState& s = *engine.scaling_states()[i];
    if (roles &&
        std::find(roles->begin(), roles->end(), owner_role_text(s.owner)) == roles->end())
      continue;
    const Engine::ScalingValues v = engine.scaling_values(i);  // CUDA states: copied to the host
    py::dict d;
    d["owner"] = s.owner;
    d["index"] = keys[i].second;
    d["history_len"] = s.c.history_len;
    d["margin"] = s.request.margin;
    d["fp8_max"] = s.request.fp8_max;
    d["device"] = Device::from_c(s.c.device).str();
    d["amax_history"] = v.amax_history;
    d["scale"] = v.scale;
    d["scale_inv"] = v.scale_inv;
    out.append(d);
  }
  return out;
}

// Writes checkpointed states into the engine's states with the same (owner, index): everything
// is checked before anything is written, so a failed load leaves the engine as it was.
void load_scaling_states(Engine& engine, const py::list& states, bool update) {
  const auto keys = state_keys(engine);
  std::vector<std::pair<std::size_t, Engine::ScalingValues>> writes;
  std::map<std::string, int> seen;
  for (const auto& item : states) {
    QR_CHECK(py::isinstance<py::dict>(item), "load_scaling_states takes a list of dicts (as "
             "scaling_states() returns), got an item of type ",
             std::string(py::str(py::type::of(item).attr("__name__"))));
    const auto d = item.cast<py::dict>();
    for (const char* key : {"owner", "amax_history", "scale", "scale_inv"})
      QR_CHECK(d.contains(key), "scaling state to load has no '", key, "' entry; pass the dicts "
               "scaling_states() returns");
    const auto owner = d["owner"].cast<std::string>();
    const int index = d.contains("index") ? d["index"].cast<int>() : seen[owner];
    seen[owner] = index + 1;
    std::size_t found = keys.size();
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i].first == owner && keys[i].second == index) found = i;
    if (found == keys.size()) {
      std::string known;
      for (const auto& [o, k] : keys) known += (known.empty() ? "'" : ", '") + o + "'";
      QR_THROW("the checkpoint holds a delayed-scaling state of '", owner, "'", (index ? " (#" +
               std::to_string(index + 1) + ")" : std::string()), " but recipe '",
               engine.recipe().name(), "' has no such state (its states: ",
               known.empty() ? std::string("none") : known, "). The role must resolve to the "
               "same format with delayed scaling in the new recipe and be resolved before "
               "loading (Recipe.load_state_dict does that); to start the new recipe's scaling "
               "afresh instead, leave the scaling state out of the load");
    }
    Engine::ScalingValues v;
    v.amax_history = d["amax_history"].cast<std::vector<float>>();
    v.scale = d["scale"].cast<float>();
    v.scale_inv = d["scale_inv"].cast<float>();
    const auto expected = static_cast<std::size_t>(engine.scaling_states()[found]->c.history_len);
    QR_CHECK(v.amax_history.size() == expected, "the checkpoint's delayed-scaling state of '",
             owner, "' has an amax history of ", v.amax_history.size(), " steps but recipe '",
             engine.recipe().name(), "' gives that role amax_history_len ", expected,
             "; load it under a recipe with the same amax_history_len");
    engine.check_scaling_values(found, v);  // all checked before any is written
    writes.emplace_back(found, std::move(v));
  }
  std::vector<std::size_t> loaded;
  for (const auto& [index, values] : writes) {
    engine.set_scaling_values(index, values);
    loaded.push_back(index);
  }
  if (update) engine.update_scaling_of(loaded);
}

// "float8 e4m3 [64x32] rowwise x float8 e4m3 [16x32] rowwise: native (cuBLASLt FP8 ...)":
// how one GEMM of a linear layer runs, in words (explain, bench records).
std::string gemm_text(const LinearPlan::Gemm& g) {
  return g.a.str() + " x " + g.b.str() + ": " + g.plan.str();
}

void bind_linear_plan(py::module_& m) {
  py::enum_<GemmPlan::Path>(m, "GemmPath",
                            "How a GEMM runs (GemmPlan::Path, engine/include/qrecipe/gemm.hpp).")
      .value("reference", GemmPlan::Path::reference, "the engine's CPU reference product")
      .value("native", GemmPlan::Path::native, "a low-precision GEMM of the device (cuBLASLt)")
      .value("emulated", GemmPlan::Path::emulated,
             "operands decoded to BF16/FP32, then a high-precision GEMM")
      .value("dense", GemmPlan::Path::dense, "both operands unquantized");
  py::class_<LinearPlan::Gemm>(m, "LinearGemm",
                               "How one GEMM of a linear layer runs (Engine.plan_linear); "
                               "str() is the human text explain() prints.")
      .def_property_readonly("kind", [](const LinearPlan::Gemm& g) {
        return std::string(gemm_kind_name(g.kind));
      })
      .def_property_readonly("path", [](const LinearPlan::Gemm& g) { return g.plan.path; })
      .def_property_readonly("fast_accumulation",
                             [](const LinearPlan::Gemm& g) { return g.plan.fast_accumulation; })
      .def_property_readonly("reason", [](const LinearPlan::Gemm& g) { return g.plan.reason; })
      .def_property_readonly("a", [](const LinearPlan::Gemm& g) { return g.a.str(); })
      .def_property_readonly("b", [](const LinearPlan::Gemm& g) { return g.b.str(); })
      .def_property_readonly("shape", [](const LinearPlan::Gemm& g) {
        return py::make_tuple(g.m, g.n, g.k);
      }, "(m, n, k) of the product")
      .def("__str__", &gemm_text)
      .def("__repr__", [](const LinearPlan::Gemm& g) {
        return "LinearGemm(" + std::string(gemm_kind_name(g.kind)) + ", " + gemm_text(g) + ")";
      });
}

}  // namespace

void bind_engine(py::module_& m) {
  bind_linear_plan(m);
  m.def("role_of_owner", [](const std::string& owner) {
    const QuantizerRole r = owner_role(owner);
    return py::make_tuple(r.module_type, r.tensor_type, r.name);
  }, py::arg("owner"),
     "(module_type, tensor_type, name) of a delayed-scaling state's owner "
     "('linear:input@fc float8' -> ('linear', 'input', 'fc')), as Engine.resolve takes them.");

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init([](const Recipe& recipe) {
        return std::make_shared<Engine>(recipe, Registry::shared(), torch_allocator());
      }), py::arg("recipe"))
      .def_property_readonly("recipe_name", [](const Engine& e) { return e.recipe().name(); })
      .def("resolve", [](const std::shared_ptr<Engine>& e, const std::string& module_type,
                         const std::string& tensor_type, const std::string& name) {
        return quantizer_or_none(e, e->resolve(QuantizerRole{module_type, tensor_type, name}));
      }, py::arg("module_type"), py::arg("tensor_type"), py::arg("name") = "")
      .def("plan_linear", [](const std::shared_ptr<Engine>& e, const std::string& module_type,
                             const std::string& name, std::int64_t in_features,
                             std::int64_t out_features, std::int64_t tokens,
                             const std::string& target) {
        const LinearPlan p = e->plan_linear(module_type, name, in_features, out_features, tokens,
                                            gemm_target_from_name(target));
        py::dict d;
        d["input"] = quantizer_or_none(e, p.input_q);
        d["weight"] = quantizer_or_none(e, p.weight_q);
        d["grad_output"] = quantizer_or_none(e, p.grad_output_q);
        for (const auto* g : {&p.fprop, &p.dgrad, &p.wgrad}) d[gemm_kind_name(g->kind)] = *g;
        return d;
      }, py::arg("module_type"), py::arg("name"), py::arg("in_features"),
         py::arg("out_features"), py::arg("tokens"), py::arg("target") = "cpu",
         "{'input', 'weight', 'grad_output': Quantizer or None (high precision), "
         "'fprop', 'dgrad', 'wgrad': LinearGemm (its path and, as str(), the text)} of a "
         "linear layer on `target` ('cpu' or 'sm90').")
      .def("update_scaling", [](Engine& e) {
        // CUDA states update on torch's current stream of their device, without a sync.
        e.update_scaling_on_streams(cuda_current_stream);
      })
      .def("update_scaling_with", [](Engine& e, const std::vector<float>& amaxes) {
        e.update_scaling(amaxes);
      }, py::arg("reduced_amaxes"))
      .def("current_amaxes", &Engine::current_amaxes)
      .def("scaling_states", &scaling_states, py::arg("roles") = std::nullopt,
           "Every delayed-scaling state as a dict (owner, index among the states of that "
           "owner, amax history, scale, scale_inv, ...), in creation order; with `roles`, only "
           "those whose owner's role (e.g. 'linear:input@fc') is listed. CUDA states are "
           "copied to the host.")
      .def("load_scaling_states", &load_scaling_states, py::arg("states"),
           py::arg("update") = false,
           "Writes states (dicts as scaling_states() returns) into the states with the same "
           "owner and index; all are checked before any is written. update=True then runs the "
           "delayed-scaling update of the loaded states (a checkpoint saved before its step's "
           "update).");
}

}  // namespace qrecipe::python
