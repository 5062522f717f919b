// qrecipe._C.gemm / gemm_many: the engine GEMM on quantized or high-precision operands into a
// torch tensor (one GEMM, or a list of them in one call), and the benchmarks' raw cuBLASLt
// GEMM (raw_gemm.cpp).
#include <pybind11/stl.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/gemm.hpp"
#include "raw_gemm.hpp"

namespace qrecipe::python {
namespace {

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

}  // namespace

void bind_gemm(py::module_& m) {
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

  // ---- benchmarks only: raw cuBLASLt GEMMs for bench/bench_linear.py's floor (raw_gemm.cpp;
  // CUDA builds only).
  bind_raw_gemm(m, cuda_current_stream);
}

}  // namespace qrecipe::python
