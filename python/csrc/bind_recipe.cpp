// qrecipe._C: Recipe (parse / load / check / validate, engine messages with file:line:col)
// and the shared registry's plugins and search path (for `qrecipe.plugins()`).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"

namespace qrecipe::python {

void bind_recipe(py::module_& m) {
  py::class_<Recipe, std::shared_ptr<Recipe>>(m, "Recipe")
      .def_static("parse", [](const std::string& text, const std::string& source) {
        return std::make_shared<Recipe>(Recipe::parse(text, source));
      }, py::arg("text"), py::arg("source_name") = "<string>")
      .def_static("load", [](const std::string& path) {
        return std::make_shared<Recipe>(Recipe::load(path));
      }, py::arg("path"))
      .def_property_readonly("name", &Recipe::name)
      .def_property_readonly("version", &Recipe::version)
      .def_property_readonly("source", &Recipe::source)
      .def_property_readonly("validated", &Recipe::validated)
      .def("check", [](const Recipe& r) {
        std::vector<std::string> problems;
        for (const auto& e : r.check(*Registry::shared())) problems.emplace_back(e.what());
        return problems;
      }, "Every validation problem against the loaded plugins (empty list: valid).")
      .def("validate", [](Recipe& r) { r.validate(*Registry::shared()); })
      .def("resolve", [](const Recipe& r, const std::string& module_type,
                         const std::string& tensor_type, const std::string& name) {
        return r.resolve(QuantizerRole{module_type, tensor_type, name}).str();
      }, py::arg("module_type"), py::arg("tensor_type"), py::arg("name") = "")
      .def("rules", [](const Recipe& r) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& rule : r.rules()) out.emplace_back(rule.match.str(), rule.decision_str());
        out.emplace_back("defaults", r.defaults().str());
        return out;
      })
      .def("telemetry", [](const Recipe& r) -> py::object {
        const TelemetrySettings& t = r.telemetry();
        if (!t.enabled()) return py::none();
        py::dict d;
        d["every"] = t.every;
        d["roles"] = t.roles;
        d["location"] = t.location.str();
        return d;
      }, "The recipe's `telemetry:` key as {every, roles, location}, or None without one.");

  m.def("plugins", [] {
    py::list out;
    for (const auto& p : Registry::shared()->plugins()) {
      py::dict d;
      d["name"] = p->name();
      d["version"] = p->version();
      d["path"] = p->path();
      d["devices"] = p->devices_str();
      d["description"] = p->description();
      out.append(d);
    }
    return out;
  }, "The format plugins the shared registry loaded.");
  m.def("plugin_search_path", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& e : Registry::shared()->search_path()) out.emplace_back(e.origin, e.path);
    return out;
  });
  m.def("plugin_failures", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& f : Registry::shared()->failures()) out.emplace_back(f.path, f.cause);
    return out;
  });
}

}  // namespace qrecipe::python
