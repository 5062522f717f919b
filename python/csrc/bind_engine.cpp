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

// The role part of an owner "linear:input@fc float8" (what the module-level checkpoints match).
std::string owner_role(const std::string& owner) {
  const auto space = owner.rfind(' ');
  return space == std::string::npos ? owner : owner.substr(0, space);
}

py::list scaling_states(const Engine& engine,
                        const std::optional<std::vector<std::string>>& roles) {
  py::list out;
  const auto keys = state_keys(engine);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const ScalingState& s = *engine.scaling_states()[i];
    if (roles && std::find(roles->begin(), roles->end(), owner_role(s.owner)) == roles->end())
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
    writes.emplace_back(found, std::move(v));
  }
  std::vector<std::size_t> loaded;
  for (const auto& [index, values] : writes) {
    engine.set_scaling_values(index, values);
    loaded.push_back(index);
  }
  if (update) engine.update_scaling_of(loaded);
}

}  // namespace

void bind_engine(py::module_& m) {
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
        for (const auto* g : {&p.fprop, &p.dgrad, &p.wgrad})
          d[gemm_kind_name(g->kind)] = g->a.str() + " x " + g->b.str() + ": " + g->plan.str();
        return d;
      }, py::arg("module_type"), py::arg("name"), py::arg("in_features"),
         py::arg("out_features"), py::arg("tokens"), py::arg("target") = "cpu")
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
