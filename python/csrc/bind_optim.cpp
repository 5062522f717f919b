// qrecipe._C.adam_step: one step of qrecipe.optim.FusedAdam through the engine's
// qrecipe::adam_step (engine/include/qrecipe/optim.hpp). This file only translates types: the
// Python optimizer decides the tensors (masters, moments, gradients, targets) and the
// hyperparameters; the engine and the plugins do every numeric operation.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/optim.hpp"
#include "torch_interop.hpp"

namespace qrecipe::python {
namespace {

// Element `first` .. `first + n` of a contiguous tensor as a flat engine view.
TensorView slice_view(const at::Tensor& t, std::int64_t first, std::int64_t n, const char* what) {
  const TensorView whole = to_view(t, what);
  char* base = static_cast<char*>(whole.data());
  void* data = base == nullptr ? nullptr : base + first * (dtype_bits(whole.dtype()) / 8);
  return TensorView(n == 0 ? nullptr : data, whole.dtype(), {n}, whole.device());
}

qr_adam_hyper parse_hyper(const py::tuple& h, const std::string& name) {
  QR_CHECK(h.size() == 9, "adam_step: the hyperparameters of ", name, " must be a 9-tuple (lr, "
           "lr_tensor, beta1, beta2, eps, weight_decay, adam_w_mode, step, step_tensor), got ",
           h.size(), " items");
  qr_adam_hyper out{};
  out.struct_size = sizeof(qr_adam_hyper);
  out.lr = h[0].cast<double>();
  if (!h[1].is_none()) {
    const auto lr = h[1].cast<at::Tensor>();
    QR_CHECK(lr.scalar_type() == at::kFloat && lr.numel() == 1, "adam_step: the learning-rate "
             "tensor of ", name, " must hold one torch.float32 value, got ",
             c10::toString(lr.scalar_type()), " of shape ", lr.sizes());
    out.lr_device = lr.data_ptr<float>();
  }
  out.beta1 = h[2].cast<double>();
  out.beta2 = h[3].cast<double>();
  out.eps = h[4].cast<double>();
  out.weight_decay = h[5].cast<double>();
  out.adam_w_mode = h[6].cast<bool>() ? 1 : 0;
  out.step = h[7].cast<std::int64_t>();
  if (!h[8].is_none()) {
    const auto step = h[8].cast<at::Tensor>();
    QR_CHECK(step.scalar_type() == at::kFloat && step.numel() == 1, "adam_step: the step tensor "
             "of ", name, " must hold one torch.float32 value, got ",
             c10::toString(step.scalar_type()), " of shape ", step.sizes());
    out.step_device = step.data_ptr<float>();
  }
  return out;
}

// One entry: (name, param, grad, exp_avg, exp_avg_sq, target, hyper). target is None (the
// param is updated in place), a tensor (written with the new param rounded to its dtype) or a
// list of _C.QuantizedTensor (the row groups of a QuantizedWeight, requantized from the new
// FP32 master: one engine tensor per group, its rows of every buffer).
void add_entry(const py::tuple& entry, std::vector<AdamTensor>& tensors,
               std::vector<std::size_t>& owner, std::size_t index) {
  QR_CHECK(entry.size() == 7, "adam_step: entry ", index, " must be a 7-tuple (name, param, "
           "grad, exp_avg, exp_avg_sq, target, hyper), got ", entry.size(), " items");
  const auto name = entry[0].cast<std::string>();
  const auto param = entry[1].cast<at::Tensor>();
  const auto grad = entry[2].cast<at::Tensor>();
  const auto exp_avg = entry[3].cast<at::Tensor>();
  const auto exp_avg_sq = entry[4].cast<at::Tensor>();
  const qr_adam_hyper hyper = parse_hyper(entry[6].cast<py::tuple>(), name);
  const py::object target = entry[5];
  for (const auto* t : {&grad, &exp_avg, &exp_avg_sq})
    QR_CHECK(t->numel() == param.numel(), "adam_step: ", name, ": a gradient or moment of ",
             t->numel(), " elements for a parameter of ", param.numel());

  if (!py::isinstance<py::list>(target)) {
    AdamTensor t;
    t.name = name;
    t.hyper = hyper;
    t.param = slice_view(param, 0, param.numel(), "parameter");
    t.grad = slice_view(grad, 0, grad.numel(), "gradient");
    t.exp_avg = slice_view(exp_avg, 0, exp_avg.numel(), "exp_avg");
    t.exp_avg_sq = slice_view(exp_avg_sq, 0, exp_avg_sq.numel(), "exp_avg_sq");
    if (!target.is_none()) {
      const auto copy = target.cast<at::Tensor>();
      QR_CHECK(copy.numel() == param.numel(), "adam_step: ", name, ": the parameter to write "
               "has ", copy.numel(), " elements, its master ", param.numel());
      t.copy = slice_view(copy, 0, copy.numel(), "parameter");
    }
    tensors.push_back(std::move(t));
    owner.push_back(index);
    return;
  }
  const auto groups = target.cast<py::list>();
  QR_CHECK(!groups.empty(), "adam_step: ", name, ": an empty list of quantized row groups");
  std::int64_t first = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto& q = groups[g].cast<PyQuantized&>();
    const std::int64_t n = q.tensor->rows() * q.tensor->cols();
    QR_CHECK(first + n <= param.numel(), "adam_step: ", name, ": its quantized row groups hold "
             "more elements than its master (", param.numel(), ")");
    AdamTensor t;
    t.name = groups.size() > 1 ? name + " (row group " + std::to_string(g) + ")" : name;
    t.hyper = hyper;
    t.param = slice_view(param, first, n, "master");
    t.grad = slice_view(grad, first, n, "gradient");
    t.exp_avg = slice_view(exp_avg, first, n, "exp_avg");
    t.exp_avg_sq = slice_view(exp_avg_sq, first, n, "exp_avg_sq");
    t.quantized = q.tensor.get();
    t.quantizer = q.quantizer.quantizer.get();
    tensors.push_back(std::move(t));
    owner.push_back(index);
    first += n;
  }
  QR_CHECK(first == param.numel(), "adam_step: ", name, ": its quantized row groups hold ",
           first, " elements but its master ", param.numel());
}

// The step of `entries` (all on one device); returns each entry's path ("plain", "fused",
// "two_pass"; a grouped weight's groups share their quantizer, hence their path).
std::vector<std::string> adam_step(const py::list& entries, bool fused, bool capturable) {
  std::vector<AdamTensor> tensors;
  std::vector<std::size_t> owner;
  for (std::size_t i = 0; i < entries.size(); ++i)
    add_entry(entries[i].cast<py::tuple>(), tensors, owner, i);
  std::vector<std::string> paths(entries.size(), adam_path_name(AdamPath::plain));
  if (tensors.empty()) return paths;
  AdamStepOptions options;
  options.fused = fused;
  options.capturable = capturable;
  const Device device = tensors[0].param.device();
  options.stream = device.is_cuda() ? cuda_current_stream(device.index) : nullptr;
  std::vector<AdamPath> result;
  {
    py::gil_scoped_release no_gil;
    result = qrecipe::adam_step(tensors, options);
  }
  for (std::size_t k = 0; k < result.size(); ++k) paths[owner[k]] = adam_path_name(result[k]);
  return paths;
}

}  // namespace

void bind_optim(py::module_& m) {
  m.def("adam_step", &adam_step, py::arg("entries"), py::arg("fused") = true,
        py::arg("capturable") = false,
        "One step of the master-weight Adam over `entries` (tuples (name, param, grad, exp_avg, "
        "exp_avg_sq, target, hyper), all on one device; hyper = (lr, lr_tensor, beta1, beta2, "
        "eps, weight_decay, adam_w_mode, step, step_tensor)). target: None, a tensor written "
        "with the new param, or the list of _C.QuantizedTensor row groups requantized from the "
        "new FP32 master. Returns each entry's path: 'plain', 'fused' or 'two_pass'. CUDA work "
        "runs on torch's current stream.");
  m.def("adam_path", [](const PyQuantizer& q, const std::string& device, bool capturable) {
        std::string why;
        const Device d = device == "cpu" ? Device::cpu()
                                         : engine_device(at::Device(device), "adam_path device");
        const AdamPath path = qrecipe::adam_path(*q.quantizer, d, true, capturable, &why);
        return py::make_tuple(adam_path_name(path), why);
      }, py::arg("quantizer"), py::arg("device"), py::arg("capturable") = false,
      "(path, reason): how the optimizer step requantizes a weight of this quantizer on "
      "`device` ('fused' or 'two_pass'; the reason of a two-pass choice).");
}

}  // namespace qrecipe::python
