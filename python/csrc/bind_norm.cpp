// qrecipe._C.rms_norm_forward / rms_norm_backward: the engine's fused RMSNorm
// (engine/include/qrecipe/norm.hpp) on torch tensors. Types only: the outputs are allocated
// here with torch (on x's device), the engine checks every tensor and does the arithmetic.
#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "py_types.hpp"
#include "qrecipe/norm.hpp"
#include "torch_interop.hpp"

namespace qrecipe::python {
namespace {

void* stream_of(const at::Tensor& t) {
  return t.is_cuda() ? cuda_current_stream(t.get_device()) : nullptr;
}

// `with_amax`: also max |y| as a float32 tensor of shape (2,) (rowwise, columnwise), else an
// empty one.
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x,
                                                                const at::Tensor& weight,
                                                                double eps, bool with_amax) {
  auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const std::int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  auto rstd = at::empty({n == 0 ? 0 : x.numel() / n}, x.options().dtype(at::kFloat));
  auto amax = with_amax ? at::zeros({2}, x.options().dtype(at::kFloat))
                        : at::empty({0}, x.options().dtype(at::kFloat));
  const TensorView xv = to_view(x, "x of rms_norm_forward");
  const TensorView wv = to_view(weight, "weight of rms_norm_forward");
  const TensorView yv = to_view(y, "y of rms_norm_forward");
  const TensorView rv = to_view(rstd, "rstd of rms_norm_forward");
  const TensorView av = with_amax ? to_view(amax, "amax of rms_norm_forward") : TensorView();
  void* stream = stream_of(x);
  {
    py::gil_scoped_release no_gil;
    qrecipe::rms_norm_forward(xv, wv, eps, yv, rv, av, stream);
  }
  return {y, rstd, amax};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& rstd) {
  auto dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto dw = at::empty_like(weight, at::MemoryFormat::Contiguous);
  const std::int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  const std::int64_t rows = n == 0 ? 0 : x.numel() / n;
  auto workspace = at::empty({qrecipe::rms_norm_backward_partials(rows, std::max<std::int64_t>(n, 1)), n},
                             x.options().dtype(at::kFloat));
  const TensorView dyv = to_view(dy, "dy of rms_norm_backward");
  const TensorView xv = to_view(x, "x of rms_norm_backward");
  const TensorView wv = to_view(weight, "weight of rms_norm_backward");
  const TensorView rv = to_view(rstd, "rstd of rms_norm_backward");
  const TensorView dxv = to_view(dx, "dx of rms_norm_backward");
  const TensorView dwv = to_view(dw, "dweight of rms_norm_backward");
  const TensorView wsv = to_view(workspace, "workspace of rms_norm_backward");
  void* stream = stream_of(x);
  {
    py::gil_scoped_release no_gil;
    qrecipe::rms_norm_backward(dyv, xv, wv, rv, dxv, dwv, wsv, stream);
  }
  return {dx, dw};
}

}  // namespace

void bind_norm(py::module_& m) {
  m.def("rms_norm_forward", &rms_norm_forward, py::arg("x"), py::arg("weight"), py::arg("eps"),
        py::arg("with_amax") = false,
        "(y, rstd, amax): Hugging Face's RMSNorm of x [..., n] (contiguous CUDA float32, "
        "bfloat16 or float16) with weight [n] of x's dtype, the FP32 rstd of each row, and with "
        "with_amax max |y| (NaN ignored) twice as a float32 tensor of shape (2,), else an empty "
        "tensor; one kernel on torch's current stream (engine/include/qrecipe/norm.hpp).");
  m.def("rms_norm_backward", &rms_norm_backward, py::arg("dy"), py::arg("x"), py::arg("weight"),
        py::arg("rstd"),
        "(dx, dweight) of rms_norm_forward, from dy, x, weight and the forward's rstd.");
  m.attr("RMS_NORM_MAX_HIDDEN") = qrecipe::kRmsNormMaxHidden;
}

}  // namespace qrecipe::python
