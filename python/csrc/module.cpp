// qrecipe._C: the pybind11 face of the engine for the PyTorch adapter (python/qrecipe).
//
// Map of this file:
//   exceptions       qrecipe::Error -> qrecipe.QrecipeError, RecipeError -> qrecipe.RecipeError
//   Recipe           parse / load / check / validate a recipe (engine messages, file:line:col)
//   Registry         the loaded plugins and the search path (for `qrecipe.plugins()`)
//   Engine           one per recipe: resolve roles, plan linear layers, delayed-scaling update
//   Quantizer        a resolved quantizer: quantize a torch tensor, describe itself
//   QuantizedTensor  bytes and scales per direction as torch tensors aliasing engine buffers
//   gemm             the engine GEMM on quantized or high-precision operands into a torch tensor
//
// The Python package adds the torch-facing behaviour (autograd, modules, autocast); this file
// only translates types, so every numeric decision stays in the engine and the plugins.
#include <torch/csrc/utils/pybind.h>  // pybind11 with the at::Tensor caster

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "raw_gemm.hpp"
#include "torch_interop.hpp"

namespace py = pybind11;

namespace qrecipe::python {
namespace {

qr_direction parse_direction(const std::string& name) {
  if (name == "rowwise") return QR_DIRECTION_ROWWISE;
  if (name == "columnwise") return QR_DIRECTION_COLUMNWISE;
  QR_THROW("direction '", name, "' is not known; expected 'rowwise' or 'columnwise'");
}

// A quantizer plus the engine whose scaling state it may reference (it must not outlive it).
struct PyQuantizer {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<Quantizer> quantizer;
};

// A quantized tensor plus the quantizer that decodes it. The C++ tensor is shared with every
// torch tensor aliasing its buffers.
struct PyQuantized {
  std::shared_ptr<QuantizedTensor> tensor;
  PyQuantizer quantizer;

  const qr_direction_data& direction(const std::string& name) const {
    return tensor->direction(parse_direction(name));
  }
  std::optional<at::Tensor> buffer(const qr_tensor_view& view) const {
    if (view.data == nullptr) return std::nullopt;
    return alias_tensor(TensorView(view), tensor);
  }
};

py::dict layout_dict(const qr_direction_layout& l) {
  py::dict d;
  d["format"] = l.format ? std::string(l.format) : std::string();
  d["data_dtype"] = std::string(dtype_name(static_cast<DType>(l.data_dtype)));
  d["data_shape"] = std::vector<std::int64_t>(l.data_shape, l.data_shape + l.data_ndim);
  d["data_transposed"] = l.data_transposed != 0;
  static const char* const kScaleModes[] = {"none", "tensor", "block", "block+tensor"};
  d["scale_mode"] = (l.scale_mode >= 0 && l.scale_mode < 4) ? kScaleModes[l.scale_mode] : "unknown";
  d["scale_dtype"] = std::string(dtype_name(static_cast<DType>(l.scale_dtype)));
  d["scale_shape"] = std::vector<std::int64_t>(l.scale_shape, l.scale_shape + l.scale_ndim);
  d["scale_transposed"] = l.scale_transposed != 0;
  d["block"] = py::make_tuple(l.block_rows, l.block_cols);
  d["has_amax"] = l.has_amax != 0;
  return d;
}

py::object quantizer_or_none(const std::shared_ptr<Engine>& engine,
                             const std::shared_ptr<Quantizer>& q) {
  if (!q) return py::none();
  return py::cast(PyQuantizer{engine, q});
}

// torch's current stream on `t`'s device (nullptr for CPU tensors; cuda_current_stream in
// torch_interop). Every engine call on CUDA tensors is ordered on this stream, like torch's
// own kernels.
void* current_stream(const at::Tensor& t) {
  return t.is_cuda() ? cuda_current_stream(t.device().index()) : nullptr;
}

PyQuantized quantize(const PyQuantizer& q, const at::Tensor& src, std::uint32_t usage,
                     std::optional<std::uint64_t> rng_offset) {
  const TensorView view = to_view(src, "tensor to quantize");
  QuantizeOptions options;
  options.rng_offset = rng_offset;
  options.stream = current_stream(src);
  QuantizedTensor out;
  {
    py::gil_scoped_release no_gil;
    out = q.quantizer->quantize(view, usage, options, torch_allocator());
  }
  return PyQuantized{std::make_shared<QuantizedTensor>(std::move(out)), q};
}

// One GEMM operand from Python: a QuantizedTensor or a high-precision torch tensor.
GemmOperand make_operand(const py::handle& obj, const std::string& direction, const char* what) {
  const qr_direction d = parse_direction(direction);
  if (py::isinstance<PyQuantized>(obj)) {
    const auto& q = obj.cast<const PyQuantized&>();
    return GemmOperand::quantized(*q.tensor, *q.quantizer.quantizer, d);
  }
  const auto t = obj.cast<at::Tensor>();
  QR_CHECK(t.dim() == 2, "GEMM ", what, " must be 2-D, got shape ", t.sizes());
  return GemmOperand::dense(to_view(t, what), d);
}

GemmKind parse_gemm_kind(const std::string& name) {
  for (GemmKind k : {GemmKind::fprop, GemmKind::dgrad, GemmKind::wgrad})
    if (name == gemm_kind_name(k)) return k;
  QR_THROW("GEMM kind '", name, "' is not known; expected 'fprop', 'dgrad' or 'wgrad'");
}

// The options of one GEMM into `out` (its stream: torch's current one on out's device).
GemmOptions gemm_options(const at::Tensor& out, bool accumulate, float alpha,
                         const std::optional<std::string>& kind,
                         const std::optional<at::Tensor>& bias) {
  GemmOptions options;
  options.accumulate = accumulate;
  options.alpha = alpha;
  options.stream = current_stream(out);
  if (bias) {
    QR_CHECK((bias->scalar_type() == at::kFloat || bias->scalar_type() == at::kBFloat16) &&
                 bias->dim() == 1 && bias->is_contiguous() && bias->size(0) == out.size(-1) &&
                 bias->device() == out.device(),
             "GEMM bias must be a contiguous 1-D torch.float32 or torch.bfloat16 tensor of ",
             out.size(-1), " elements on ", out.device().str(), ", got ",
             c10::toString(bias->scalar_type()), " of shape ", bias->sizes(), " on ",
             bias->device().str(), " (pass bias.float().contiguous())");
    options.bias = bias->data_ptr();
    options.bias_dtype = bias->scalar_type() == at::kBFloat16 ? DType::bf16 : DType::f32;
  }
  // Which GEMM of a linear layer: decides a native FP8 GEMM's accumulation (fast for fprop).
  if (kind) options.kind = parse_gemm_kind(*kind);
  return options;
}

void gemm(const py::object& a, const std::string& direction_a, const py::object& b,
          const std::string& direction_b, const at::Tensor& out, bool accumulate, float alpha,
          const std::optional<std::string>& kind, const std::optional<at::Tensor>& bias) {
  const GemmOperand oa = make_operand(a, direction_a, "operand A");
  const GemmOperand ob = make_operand(b, direction_b, "operand B");
  const TensorView vout = to_view(out, "GEMM output");
  const GemmOptions options = gemm_options(out, accumulate, alpha, kind, bias);
  py::gil_scoped_release no_gil;
  qrecipe::gemm(oa, ob, vout, options);
}

// gemm() for each i of equally long lists, in order, with one crossing into C++: the experts
// of a GroupedLinear, whose per-call Python cost dominated small experts. Every item's
// arguments are converted (types, dtypes, bias) before the first GEMM runs; the engine's own
// checks (shapes, devices) run item by item. An error names the item.
void gemm_many(const py::list& a, const std::string& direction_a, const py::list& b,
               const std::string& direction_b, const py::list& out, bool accumulate,
               const std::optional<std::string>& kind, const std::optional<py::list>& bias) {
  const std::size_t n = a.size();
  QR_CHECK(b.size() == n && out.size() == n && (!bias || bias->size() == n),
           "gemm_many: the lists must be equally long; got ", n, " A operands, ", b.size(),
           " B operands, ", out.size(), " outputs", bias ? " and " + std::to_string(bias->size()) +
           " biases" : std::string());
  struct Item {
    GemmOperand a, b;
    TensorView out;
    GemmOptions options;
  };
  std::vector<Item> items;
  items.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    try {
      const at::Tensor t = out[i].cast<at::Tensor>();
      std::optional<at::Tensor> item_bias;
      if (bias && !(*bias)[i].is_none()) item_bias = (*bias)[i].cast<at::Tensor>();
      items.push_back({make_operand(a[i], direction_a, "operand A"),
                       make_operand(b[i], direction_b, "operand B"), to_view(t, "GEMM output"),
                       gemm_options(t, accumulate, 1.0f, kind, item_bias)});
    } catch (const Error& e) {
      QR_THROW_CODE(e.code(), "gemm_many item ", i, ": ", e.what());
    }
  }
  py::gil_scoped_release no_gil;
  for (std::size_t i = 0; i < n; ++i) {
    try {
      qrecipe::gemm(items[i].a, items[i].b, items[i].out, items[i].options);
    } catch (const Error& e) {
      QR_THROW_CODE(e.code(), "gemm_many item ", i, ": ", e.what());
    }
  }
}

at::Tensor dequantize(const PyQuantized& q, const std::string& direction, at::ScalarType dtype) {
  QR_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
           "dequantize decodes to torch.float32 or torch.bfloat16, got ", c10::toString(dtype));
  const qr_direction d = parse_direction(direction);
  const auto& data = q.tensor->direction(d).data;  // throws if the direction is absent
  const at::Tensor out = at::empty(
      {q.tensor->rows(), q.tensor->cols()},
      at::TensorOptions().dtype(dtype).device(torch_device(Device::from_c(data.device))));
  void* stream = current_stream(out);
  py::gil_scoped_release no_gil;
  q.quantizer.quantizer->dequantize(*q.tensor, d, to_view(out, "dequantize output"), stream);
  return out;
}

// A spec as the dictionary a recipe rule's quantizer would be written as (nested for the
// hybrid format's halves): Recipe.from_dict({"defaults": spec_dict(...)}) makes it again.
py::dict spec_dict(const QuantizerSpec& spec) {
  py::dict d;
  d["format"] = spec.format;
  for (const auto& [key, value] : spec.options) {
    switch (value.type) {
      case QR_OPTION_BOOL: d[key.c_str()] = value.bool_value; break;
      case QR_OPTION_INT: d[key.c_str()] = value.int_value; break;
      case QR_OPTION_FLOAT: d[key.c_str()] = value.float_value; break;
      case QR_OPTION_QUANTIZER:
        if (value.spec) {
          d[key.c_str()] = spec_dict(*value.spec);
        } else {
          py::dict none;
          none["format"] = "none";
          d[key.c_str()] = none;
        }
        break;
      default: d[key.c_str()] = value.string_value; break;
    }
  }
  return d;
}

// A quantized tensor of `q`'s layout whose buffers are copies of `buffers` ({direction:
// {"data", "scale_inv", "amax": tensor or None}}): how a pickled or deep-copied quantized
// weight is rebuilt from its plain tensors. Sizes and dtypes are checked against the layout.
PyQuantized from_buffers(const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                         std::uint32_t usage, const py::dict& buffers, const at::Device& device) {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0,
           "from_buffers: usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  std::array<qr_direction_layout, 2> layouts{};
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (usage & usage_bit(d)) layouts[d] = q.quantizer->layout(rows, cols, d);
  auto tensor = std::make_shared<QuantizedTensor>(q.quantizer->format(), rows, cols, usage,
                                                  layouts, engine_device(device, "from_buffers"),
                                                  torch_allocator());
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & usage_bit(d))) continue;
    const char* dname = direction_name(d);
    QR_CHECK(buffers.contains(dname), "from_buffers: no '", dname, "' buffers given");
    const auto given = buffers[dname].cast<py::dict>();
    const auto& dd = tensor->direction(d);
    const std::pair<const char*, const qr_tensor_view*> kinds[] = {
        {"data", &dd.data}, {"scale_inv", &dd.scale_inv}, {"amax", &dd.amax}};
    for (const auto& [kind, view] : kinds) {
      if (view->data == nullptr) continue;
      QR_CHECK(given.contains(kind) && !given[kind].is_none(), "from_buffers: the layout of ",
               dname, " has a '", kind, "' buffer but none was given");
      const auto src = given[kind].cast<at::Tensor>();
      at::Tensor dst = alias_tensor(TensorView(*view), tensor);
      QR_CHECK(src.scalar_type() == dst.scalar_type() && src.numel() == dst.numel(),
               "from_buffers: ", dname, " ", kind, " must be ", c10::toString(dst.scalar_type()),
               " with ", dst.numel(), " elements (layout ", dst.sizes(), "), got ",
               c10::toString(src.scalar_type()), " of shape ", src.sizes());
      dst.copy_(src.reshape(dst.sizes()));
    }
  }
  return PyQuantized{tensor, q};
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

// ---------------------------------------------------------------- grouped quantization
// Engine::quantize_grouped on a torch tensor (GroupedLinear's single grouped weight): one
// QuantizedTensor per row group, each byte-identical to quantizer.quantize(rows of that group),
// in ONE plugin call when the format fills the quantize_grouped extra (plugin_abi.h), otherwise
// through the engine's per-group loop.
std::vector<PyQuantized> quantize_grouped(const PyQuantizer& q, const at::Tensor& src,
                                          const std::vector<std::int64_t>& group_rows,
                                          std::uint32_t usage,
                                          std::optional<std::uint64_t> rng_offset) {
  QR_CHECK(q.engine != nullptr, "quantize_grouped: the quantizer has no engine; take it from "
           "Engine.resolve or plan_linear");
  const TensorView view = to_view(src, "tensor to quantize grouped");
  QuantizeOptions options;
  options.rng_offset = rng_offset;
  options.stream = current_stream(src);
  std::vector<QuantizedTensor> out;
  {
    py::gil_scoped_release no_gil;
    out = q.engine->quantize_grouped(*q.quantizer, view, group_rows, usage, options,
                                     torch_allocator());
  }
  std::vector<PyQuantized> result;
  result.reserve(out.size());
  for (auto& t : out) result.push_back(PyQuantized{std::make_shared<QuantizedTensor>(std::move(t)), q});
  return result;
}

void bind_grouped(py::module_& m) {
  m.def("quantize_grouped", &quantize_grouped, py::arg("quantizer"), py::arg("tensor"),
        py::arg("group_rows"), py::arg("usage"), py::arg("rng_offset") = std::nullopt,
        "One QuantizedTensor per row group of `tensor` ([sum(group_rows), cols], leading dims "
        "flattened), each byte-identical to quantizer.quantize(rows of that group); group g "
        "uses rng_offset + g when an offset is given. One plugin call when the format has the "
        "grouped extra (has_grouped_quantize), else one quantize per group.");
  m.def("has_grouped_quantize", [](const PyQuantizer& q) { return Engine::has_grouped_quantize(*q.quantizer); },
        py::arg("quantizer"),
        "Whether the quantizer's plugin quantizes all groups in one call (the optional "
        "quantize_grouped extra) rather than through the engine's per-group loop.");
}

}  // namespace

void bind(py::module_& m) {
  // Exceptions: RecipeError is registered last so its translator is tried first.
  static py::exception<Error> qrecipe_error(m, "QrecipeError", PyExc_RuntimeError);
  static py::exception<RecipeError> recipe_error(m, "RecipeError", qrecipe_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const RecipeError& e) {
      py::set_error(recipe_error, e.what());
    } catch (const Error& e) {
      py::set_error(qrecipe_error, e.what());
    }
  });

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
        for (const auto& rule : r.rules()) out.emplace_back(rule.match.str(), rule.quantizer.str());
        out.emplace_back("defaults", r.defaults().str());
        return out;
      });

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

  py::class_<PyQuantizer>(m, "Quantizer")
      .def_property_readonly("format", [](const PyQuantizer& q) { return q.quantizer->format(); })
      .def_property_readonly("role", [](const PyQuantizer& q) { return q.quantizer->role().str(); })
      .def_property_readonly("spec", [](const PyQuantizer& q) { return q.quantizer->spec().str(); })
      .def("describe", [](const PyQuantizer& q) { return q.quantizer->describe(); })
      .def("layout", [](const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                        const std::string& direction) {
        return layout_dict(q.quantizer->layout(rows, cols, parse_direction(direction)));
      })
      .def("quantize", &quantize, py::arg("tensor"), py::arg("usage"),
           py::arg("rng_offset") = std::nullopt)
      .def("spec_dict", [](const PyQuantizer& q) { return spec_dict(q.quantizer->spec()); },
           "The quantizer's spec as a recipe-rule dictionary (format plus options).")
      .def("from_buffers", &from_buffers, py::arg("rows"), py::arg("cols"), py::arg("usage"),
           py::arg("buffers"), py::arg("device"),
           "A quantized tensor of this quantizer's layout holding copies of `buffers`.");

  py::class_<PyQuantized>(m, "QuantizedTensor")
      .def_property_readonly("format", [](const PyQuantized& q) { return q.tensor->format(); })
      .def_property_readonly("rows", [](const PyQuantized& q) { return q.tensor->rows(); })
      .def_property_readonly("cols", [](const PyQuantized& q) { return q.tensor->cols(); })
      .def_property_readonly("usage",
                             [](const PyQuantized& q) { return usage_str(q.tensor->usage()); })
      .def_property_readonly("quantizer", [](const PyQuantized& q) { return q.quantizer; })
      .def("has", [](const PyQuantized& q, const std::string& d) {
        return q.tensor->has(parse_direction(d));
      })
      .def("layout", [](const PyQuantized& q, const std::string& d) {
        return layout_dict(q.direction(d).layout);
      })
      .def("data", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).data);
      })
      .def("scale_inv", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).scale_inv);
      })
      .def("amax", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).amax);
      })
      .def("drop", [](PyQuantized& q, const std::string& d) { q.tensor->drop(parse_direction(d)); })
      .def("requantize", [](PyQuantized& q, const at::Tensor& src) {
        // In place, into the buffers it holds: every alias of the bytes sees the new values.
        const TensorView view = to_view(src, "tensor to requantize");
        QuantizeOptions options;
        options.stream = current_stream(src);
        py::gil_scoped_release no_gil;
        q.quantizer.quantizer->quantize_into(view, *q.tensor, options);
      }, py::arg("tensor"), "Quantizes `tensor` (same shape) into the directions held now.")
      .def("dequantize", &dequantize, py::arg("direction"), py::arg("dtype"));

  m.def("gemm", &gemm, py::arg("a"), py::arg("direction_a"), py::arg("b"),
        py::arg("direction_b"), py::arg("out"), py::arg("accumulate") = false,
        py::arg("alpha") = 1.0f, py::arg("kind") = std::nullopt, py::arg("bias") = std::nullopt,
        "out = alpha * opA . opB^T (+ out) (+ bias): see engine/include/qrecipe/gemm.hpp. kind: "
        "'fprop', 'dgrad' or 'wgrad' when the GEMM belongs to a linear layer; bias: FP32 "
        "[outer(B)] on the output's device. CUDA work runs on torch's current stream.");
  m.def("gemm_many", &gemm_many, py::arg("a"), py::arg("direction_a"), py::arg("b"),
        py::arg("direction_b"), py::arg("out"), py::arg("accumulate") = false,
        py::arg("kind") = std::nullopt, py::arg("bias") = std::nullopt,
        "gemm(a[i], direction_a, b[i], direction_b, out[i], ...) for each i, in order, in one "
        "call (lists of equal length; bias: a list of tensors or None). Types and dtypes are "
        "checked before the first GEMM runs, shapes item by item; errors name the item.");
  m.def("live_allocations", [] { return torch_allocator()->live_allocations(); },
        "Buffers the adapter's torch-backed allocator holds now (for leak tests).");
  bind_grouped(m);

  // ---- benchmarks only: raw cuBLASLt GEMMs for bench/bench_linear.py's floor (raw_gemm.cpp;
  // CUDA builds only).
  bind_raw_gemm(m, cuda_current_stream);
}

}  // namespace qrecipe::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "qrecipe engine bindings for the PyTorch adapter";
  qrecipe::python::bind(m);
}
