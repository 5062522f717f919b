// qrecipe._C: grouped GEMMs and row groups split on the device (MoE experts; docs/gemm.md
// "Grouped GEMMs"), for python/qrecipe/nn/grouped_linear*.py.
//
//   QuantizedGroups         a GroupedQuantizedTensor, its quantizer and the offsets tensor it
//                           points to (kept alive with it)
//   quantize_grouped_split  Engine::quantize_grouped by an offsets tensor ([G + 1] int64 on the
//                           source's device): on a GPU nothing about the sizes reaches the host
//   gemm_grouped            qrecipe::gemm_grouped: each operand a list (one per group), a
//                           QuantizedGroups or a tensor (split by the offsets); the output a
//                           list or one tensor (split)
//   plan_grouped_linear     whether a grouped linear layer's three GEMMs and its input and
//                           gradient quantizations all run with device splits, and why not
//   grouped_kernels_built   whether this build has the grouped kernels (CUTLASS)
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/gemm_grouped.hpp"

namespace qrecipe::python {
namespace {

struct PyQuantizedGroups {
  std::shared_ptr<GroupedQuantizedTensor> tensor;
  PyQuantizer quantizer;
  at::Tensor offsets;  // what a device-split tensor points to
};

GroupSplits splits_of(const at::Tensor& offsets, std::int64_t total, const char* what) {
  QR_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong && offsets.is_contiguous() &&
               offsets.numel() >= 2,
           what, ": offsets must be a contiguous 1-D torch.int64 tensor of (groups + 1) running "
           "sums starting at 0, got ", c10::toString(offsets.scalar_type()), " of shape ",
           offsets.sizes());
  return GroupSplits::of_offsets(offsets.data_ptr<std::int64_t>(), offsets.numel() - 1, total,
                                 engine_device(offsets.device(), what));
}

PyQuantizedGroups quantize_grouped_split(const PyQuantizer& q, const at::Tensor& src,
                                         const at::Tensor& offsets, std::uint32_t usage,
                                         std::optional<std::uint64_t> rng_offset) {
  QR_CHECK(q.engine != nullptr, "quantize_grouped_split: the quantizer has no engine; take it "
           "from Engine.resolve or plan_linear");
  QR_CHECK(offsets.device() == src.device(), "quantize_grouped_split: the offsets live on ",
           offsets.device().str(), " but the tensor on ", src.device().str());
  const TensorView view = to_view(src, "tensor to quantize grouped");
  const GroupSplits splits = splits_of(offsets, view.rows(), "quantize_grouped_split");
  QuantizeOptions options;
  options.rng_offset = rng_offset;
  options.stream = current_stream(src);
  std::shared_ptr<GroupedQuantizedTensor> out;
  {
    py::gil_scoped_release no_gil;
    out = std::make_shared<GroupedQuantizedTensor>(q.engine->quantize_grouped(
        *q.quantizer, view, splits, usage, options, torch_allocator()));
  }
  return PyQuantizedGroups{out, q, offsets};
}

// One side of a grouped GEMM from Python; `storage` owns the per-group operands the span views.
struct Side {
  std::vector<GemmOperand> groups;
  GroupedOperand op;
  const at::Tensor* offsets = nullptr;  // a QuantizedGroups' offsets
};

Side side_of(const py::handle& obj, const std::string& direction, const char* what) {
  const qr_direction d = parse_direction(direction);
  Side s;
  if (py::isinstance<PyQuantizedGroups>(obj)) {
    const auto& g = obj.cast<const PyQuantizedGroups&>();
    s.op = GroupedOperand::split(*g.tensor, *g.quantizer.quantizer, d);
    s.offsets = &g.offsets;
    return s;
  }
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    std::size_t i = 0;
    for (const py::handle item : obj) {
      try {
        if (py::isinstance<PyQuantized>(item)) {
          const auto& q = item.cast<const PyQuantized&>();
          s.groups.push_back(GemmOperand::quantized(*q.tensor, *q.quantizer.quantizer, d));
        } else {
          const auto t = item.cast<at::Tensor>();
          QR_CHECK(t.dim() == 2, "must be 2-D, got shape ", t.sizes());
          s.groups.push_back(GemmOperand::dense(to_view(t, what), d));
        }
      } catch (const Error& e) {
        QR_THROW_CODE(e.code(), "gemm_grouped ", what, " item ", i, ": ", e.what());
      }
      ++i;
    }
    QR_CHECK(!s.groups.empty(), "gemm_grouped ", what, ": an empty list; pass one operand per group");
    s.op = GroupedOperand::per_group(s.groups);
    return s;
  }
  const auto t = obj.cast<at::Tensor>();
  QR_CHECK(t.dim() == 2, "gemm_grouped ", what, ": a split tensor must be 2-D, got shape ", t.sizes());
  s.op = GroupedOperand::split_dense(to_view(t, what), d);
  return s;
}

std::string gemm_grouped(const py::object& a, const std::string& direction_a, const py::object& b,
                         const std::string& direction_b, const py::object& out,
                         const std::string& kind, bool accumulate, float alpha,
                         const std::optional<at::Tensor>& offsets,
                         const std::optional<py::list>& bias) {
  const Side sa = side_of(a, direction_a, "operand A"), sb = side_of(b, direction_b, "operand B");
  std::vector<TensorView> outs;
  GroupedOutput o;
  at::Tensor first_out;
  if (py::isinstance<py::list>(out) || py::isinstance<py::tuple>(out)) {
    for (const py::handle item : out) {
      const auto t = item.cast<at::Tensor>();
      if (!first_out.defined()) first_out = t;
      outs.push_back(to_view(t, "grouped GEMM output"));
    }
    QR_CHECK(!outs.empty(), "gemm_grouped: an empty output list; pass one output per group");
    o.groups = outs;
  } else {
    first_out = out.cast<at::Tensor>();
    o.split = to_view(first_out, "grouped GEMM output");
  }
  GroupedGemmOptions options;
  for (GemmKind k : {GemmKind::fprop, GemmKind::dgrad, GemmKind::wgrad})
    if (kind == gemm_kind_name(k)) options.kind = k;
  QR_CHECK(kind == gemm_kind_name(options.kind), "gemm_grouped: kind '", kind,
           "' is not known; expected 'fprop', 'dgrad' or 'wgrad'");
  options.accumulate = accumulate;
  options.alpha = alpha;
  options.stream = current_stream(first_out);
  // The splits: the offsets given, or those of a QuantizedGroups operand.
  const at::Tensor* off = offsets ? &*offsets : (sa.offsets ? sa.offsets : sb.offsets);
  std::optional<GroupSplits> splits;
  if (off) {
    std::int64_t total = -1;
    for (const GroupedOperand* op : {&sa.op, &sb.op})
      if (op->is_split() && total < 0) total = op->tensor ? op->tensor->rows() : op->dense.rows();
    if (total < 0 && o.is_split()) total = o.split.rows();
    QR_CHECK(total >= 0, "gemm_grouped: offsets were given but nothing is split by them");
    splits = splits_of(*off, total, "gemm_grouped");
    options.splits = &*splits;
  }
  std::vector<const void*> bias_ptrs;
  if (bias) {
    for (const py::handle item : *bias) {
      if (item.is_none()) {
        bias_ptrs.push_back(nullptr);
        continue;
      }
      const auto t = item.cast<at::Tensor>();
      QR_CHECK((t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.dim() == 1 &&
                   t.is_contiguous(),
               "gemm_grouped: a bias must be a contiguous 1-D torch.float32 or torch.bfloat16 "
               "tensor, got ", c10::toString(t.scalar_type()), " of shape ", t.sizes());
      options.bias_dtype = t.scalar_type() == at::kBFloat16 ? DType::bf16 : DType::f32;
      bias_ptrs.push_back(t.data_ptr());
    }
    options.bias = bias_ptrs;
  }
  py::gil_scoped_release no_gil;
  return qrecipe::gemm_grouped(sa.op, sb.op, o, options).str();
}

py::dict plan_grouped_linear(const std::shared_ptr<Engine>& e, const std::string& module_type,
                             const std::string& name, std::int64_t in_features,
                             std::int64_t out_features, const std::string& out_dtype,
                             const std::string& wgrad_dtype, bool accumulate_wgrad, bool bias) {
  const LinearPlan p = e->plan_linear(module_type, name, in_features, out_features, 128,
                                      GemmTarget::sm90);
  py::dict d;
  bool served = true;
  std::string why;
  const auto add = [&](const LinearPlan::Gemm& g, DType out, bool accumulate, bool with_bias,
                       std::int64_t n, std::int64_t k_or_m) {
    const GroupedGemmPlan plan = plan_gemm_grouped(g.kind, g.a, g.b, out, accumulate, with_bias,
                                                   n, k_or_m, GemmTarget::sm90, true);
    d[gemm_kind_name(g.kind)] = plan.str();
    if (plan.mode != GroupedGemmPlan::Mode::grouped && served) {
      served = false;
      why = std::string(gemm_kind_name(g.kind)) + ": " + plan.reason;
    }
  };
  const DType y = dtype_from_name(out_dtype), dw = dtype_from_name(wgrad_dtype);
  add(p.fprop, y, false, bias, out_features, in_features);
  add(p.dgrad, y, false, false, in_features, out_features);
  add(p.wgrad, dw, accumulate_wgrad, false, in_features, out_features);
  for (const auto* q : {&p.input_q, &p.grad_output_q})
    if (*q && !Engine::has_grouped_device_quantize(**q, Device::cuda(0)) && served) {
      served = false;
      why = (*q)->role().str() + " (" + (*q)->format() + "): no device-split grouped quantization";
    }
  d["served"] = served;
  d["why"] = why;
  return d;
}

}  // namespace

void bind_grouped_gemm(py::module_& m) {
  py::class_<PyQuantizedGroups>(m, "QuantizedGroups")
      .def_property_readonly("format", [](const PyQuantizedGroups& g) { return g.tensor->format(); })
      .def_property_readonly("num_groups", [](const PyQuantizedGroups& g) { return g.tensor->num_groups(); })
      .def_property_readonly("rows", [](const PyQuantizedGroups& g) { return g.tensor->rows(); })
      .def_property_readonly("cols", [](const PyQuantizedGroups& g) { return g.tensor->cols(); })
      .def_property_readonly("device_split", [](const PyQuantizedGroups& g) { return g.tensor->device_split(); })
      .def_property_readonly("usage", [](const PyQuantizedGroups& g) { return usage_str(g.tensor->usage()); })
      .def_property_readonly("quantizer", [](const PyQuantizedGroups& g) { return g.quantizer; })
      .def_property_readonly("offsets", [](const PyQuantizedGroups& g) { return g.offsets; })
      .def("has", [](const PyQuantizedGroups& g, const std::string& d) {
        return g.tensor->has(parse_direction(d));
      })
      .def("drop", [](PyQuantizedGroups& g, const std::string& d) { g.tensor->drop(parse_direction(d)); })
      .def("groups", [](const PyQuantizedGroups& g) {
        // Host-known groups only: each as a QuantizedTensor sharing this object's buffers.
        py::list out;
        auto& groups = g.tensor->groups();
        for (std::size_t i = 0; i < groups.size(); ++i) {
          auto alias = std::shared_ptr<QuantizedTensor>(g.tensor, const_cast<QuantizedTensor*>(&groups[i]));
          out.append(PyQuantized{alias, g.quantizer});
        }
        return out;
      }, "The groups as QuantizedTensors (splits the host could read only).");
  m.def("quantize_grouped_split", &quantize_grouped_split, py::arg("quantizer"), py::arg("tensor"),
        py::arg("offsets"), py::arg("usage"), py::arg("rng_offset") = std::nullopt,
        "The row groups of `tensor` cut by `offsets` ([groups + 1] int64 running sums on the "
        "tensor's device) quantized each as a tensor of its own: Engine::quantize_grouped with "
        "GroupSplits. On a GPU the sizes are read only by kernels (no host synchronization); "
        "a format without device-split quantization is an error saying so.");
  m.def("gemm_grouped", &gemm_grouped, py::arg("a"), py::arg("direction_a"), py::arg("b"),
        py::arg("direction_b"), py::arg("out"), py::arg("kind"), py::arg("accumulate") = false,
        py::arg("alpha") = 1.0f, py::arg("offsets") = std::nullopt, py::arg("bias") = std::nullopt,
        "qrecipe::gemm_grouped: out_g = alpha * opA_g . opB_g^T (+ out_g) (+ bias_g) for every "
        "group, one launch on the GPU where a grouped kernel serves the operands. a, b: a list "
        "(one operand per group), a QuantizedGroups, or a tensor split by `offsets`; out: a "
        "list or one tensor split by the offsets. Returns the plan that ran.");
  m.def("plan_grouped_linear", &plan_grouped_linear, py::arg("engine"), py::arg("module_type"),
        py::arg("name"), py::arg("in_features"), py::arg("out_features"), py::arg("out_dtype"),
        py::arg("wgrad_dtype"), py::arg("accumulate_wgrad"), py::arg("bias"),
        "{'served': bool, 'why': str, 'fprop'|'dgrad'|'wgrad': plan}: whether the grouped "
        "linear layer's GEMMs and its input and gradient quantizations all run with the splits "
        "on a GPU (one launch each, no host synchronization).");
  m.def("grouped_kernels_built", &grouped_kernels_built,
        "Whether this build has the grouped GEMM kernels (CUDA with CUTLASS).");
}

}  // namespace qrecipe::python
