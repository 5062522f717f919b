// The Python-side wrappers of engine objects and the helpers every binding area shares
// (python/csrc/bind_*.cpp), plus the entry of each area.
//
//   PyQuantizer      a quantizer plus the engine whose scaling state it may reference
//   PyQuantized      a quantized tensor plus the quantizer that decodes it
//   parse_direction  "rowwise" / "columnwise" -> qr_direction (an error names both)
//   current_stream   torch's current stream on a tensor's device (nullptr on the CPU)
//   bind_<area>      adds one area's classes and functions to the module (module.cpp calls
//                    them in order: recipe, engine, quantize, gemm, factories, optim)
//
// How to add a binding: put it in the area it belongs to (or a new bind_<area>.cpp listed in
// python/CMakeLists.txt and called from module.cpp); types shared by several areas live here.
#pragma once

#include <torch/csrc/utils/pybind.h>  // pybind11 with the at::Tensor caster

#include <memory>
#include <optional>
#include <string>

#include "qrecipe/engine.hpp"
#include "qrecipe/quantizer.hpp"
#include "torch_interop.hpp"

namespace qrecipe::python {

namespace py = pybind11;

inline qr_direction parse_direction(const std::string& name) {
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

// torch's current stream on `t`'s device (nullptr for CPU tensors; cuda_current_stream in
// torch_interop). Every engine call on CUDA tensors is ordered on this stream, like torch's
// own kernels.
inline void* current_stream(const at::Tensor& t) {
  return t.is_cuda() ? cuda_current_stream(t.device().index()) : nullptr;
}

void bind_recipe(py::module_& m);    // bind_recipe.cpp: Recipe, the registry's plugins
void bind_engine(py::module_& m);    // bind_engine.cpp: Engine, delayed-scaling states
void bind_quantize(py::module_& m);  // bind_quantize.cpp: Quantizer, QuantizedTensor, grouped
void bind_gemm(py::module_& m);      // bind_gemm.cpp: gemm, gemm_many, raw cuBLASLt GEMM
void bind_factories(py::module_& m); // bind_factories.cpp: factory resolver, coverage, origins
void bind_grouped_gemm(py::module_& m);  // bind_grouped_gemm.cpp: grouped GEMMs, device splits
void bind_optim(py::module_& m);     // bind_optim.cpp: the optimizer step (qrecipe.optim)
void bind_norm(py::module_& m);      // bind_norm.cpp: the fused RMSNorm (qrecipe.nn.RMSNorm)

}  // namespace qrecipe::python
