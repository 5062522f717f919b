// qrecipe._C, recipes in Python (docs/recipes.md "Recipes in Python"): the engine's factory
// resolver hook, recipes made from a factory, module-type families, where a role's spec came
// from, and the coverage check of a recipe against a model's roles.
//
// The engine never sees Python: a factory reaches it as a FactoryResolver (engine.hpp), a C++
// function that calls the Python resolver qrecipe/factories.py builds and converts its answer
// (a spec dictionary) into a QuantizerSpec, which the engine validates like any recipe's.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/recipe.hpp"

namespace qrecipe::python {
namespace {

// A spec dictionary ({"format": ..., option: value, nested: {...}}) as a QuantizerSpec whose
// option values are text, exactly as the YAML parser leaves them: the validator then converts
// and checks a factory's `margin=0.5` with the very words it has for `margin: 0.5` in a file.
// (Python's repr of a float reads back as the same double; a bool is true/false.)
// qrecipe/factories.py has checked the structure; this still refuses what it cannot
// represent, naming `where`.
QuantizerSpec spec_from_dict(const py::dict& d, const std::string& where, const std::string& path) {
  QuantizerSpec spec;
  bool has_format = false;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k);
    const std::string key_path = path + "." + key;
    if (key == "format") {
      QR_CHECK(py::isinstance<py::str>(v), where, ": ", key_path, ": expected a format name");
      spec.format = v.cast<std::string>();
      has_format = true;
      continue;
    }
    OptionValue value;
    if (py::isinstance<py::bool_>(v)) {
      value = OptionValue::of_string(v.cast<bool>() ? "true" : "false");
    } else if (py::isinstance<py::int_>(v) || py::isinstance<py::str>(v)) {
      value = OptionValue::of_string(py::str(v));
    } else if (py::isinstance<py::float_>(v)) {
      value = OptionValue::of_string(py::repr(v));
    } else if (py::isinstance<py::dict>(v)) {
      value = OptionValue::of_spec(spec_from_dict(v.cast<py::dict>(), where, key_path));
    } else {
      QR_THROW(where, ": ", key_path, ": an option value is a bool, int, float, str or a nested "
               "spec, got ", std::string(py::str(py::type::of(v).attr("__name__"))));
    }
    spec.options.emplace_back(key, std::move(value));
  }
  QR_CHECK(has_format, where, ": ", path, ": the spec has no 'format'");
  return spec;
}

// Holds a Python callable so that copies and the last release happen with the GIL: the
// engine may drop its resolver from any thread.
struct PyCallable {
  std::shared_ptr<py::object> fn;
  explicit PyCallable(py::object f)
      : fn(new py::object(std::move(f)), [](py::object* p) {
          py::gil_scoped_acquire gil;
          delete p;
        }) {}
};

FactoryResolver make_resolver(py::object fn) {
  PyCallable callable(std::move(fn));
  return [callable](const FactoryCall& call) {
    py::gil_scoped_acquire gil;
    // Python errors (the factory raised, returned a wrong type) propagate as they are.
    const py::tuple answer = (*callable.fn)(call.factory, call.rule, call.role.module_type,
                                            call.role.tensor_type, call.role.name);
    QR_CHECK(answer.size() == 2, "the factory resolver must return (spec dict, origin)");
    FactorySpec out;
    out.origin = answer[1].cast<std::string>();
    out.spec = spec_from_dict(answer[0].cast<py::dict>(), out.origin + ", role " + call.role.str(),
                              "quantizer");
    return out;
  };
}

}  // namespace

void bind_factories(py::module_& m) {
  m.def("module_types", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& info : kModuleTypes) out.emplace_back(info.name, info.family);
    return out;
  }, "The module types of the adapter's roles, each with its family ('' for a family's own "
     "name): a rule for a family matches every type in it.");
  m.def("module_type_covers", [](const std::string& rule_type, const std::string& role_type) {
    return module_type_covers(rule_type, role_type);
  }, py::arg("rule_type"), py::arg("role_type"),
     "Whether a rule's module_type matches a role of module type `role_type`.");
  m.def("recipe_from_factory", [](const std::string& factory, const std::string& name,
                                  const std::string& source) {
    return std::make_shared<Recipe>(Recipe::from_factory(factory, name, source));
  }, py::arg("factory"), py::arg("name"), py::arg("source"),
     "A recipe whose one rule delegates every role to `factory` (a reference the resolver "
     "knows).");
  m.def("recipe_factories", [](const Recipe& recipe) {
    std::vector<std::tuple<int, std::string, std::string>> out;
    for (std::size_t i = 0; i < recipe.rules().size(); ++i)
      if (recipe.rules()[i].delegates())
        out.emplace_back(static_cast<int>(i), recipe.rules()[i].factory,
                         recipe.rules()[i].location.str());
    return out;
  }, py::arg("recipe"), "(rule index, factory reference, location) of each delegating rule.");
  m.def("recipe_coverage", [](const Recipe& recipe,
                              const std::vector<std::tuple<std::string, std::string, std::string>>& roles) {
    std::vector<QuantizerRole> list;
    for (const auto& [module_type, tensor_type, name] : roles)
      list.push_back({module_type, tensor_type, name});
    return recipe.coverage(list);
  }, py::arg("recipe"), py::arg("roles"),
     "Recipe::coverage: rules that match none of the (module_type, tensor_type, name) roles "
     "or never decide one, and roles a quantizing rule nearly covers.");
  m.def("set_factory_resolver", [](Engine& engine, py::object resolver) {
    engine.set_factory_resolver(make_resolver(std::move(resolver)));
  }, py::arg("engine"), py::arg("resolver"),
     "Installs resolver(factory, rule, module_type, tensor_type, name) -> (spec dict, origin) "
     "as the engine's factory resolver.");
  m.def("engine_origin", [](Engine& engine, const std::string& module_type,
                            const std::string& tensor_type, const std::string& name) {
    return engine.origin(QuantizerRole{module_type, tensor_type, name});
  }, py::arg("engine"), py::arg("module_type"), py::arg("tensor_type"), py::arg("name") = "",
     "Where the role's spec came from (a rule, the defaults, or a factory); resolves it.");
}

}  // namespace qrecipe::python
