// qrecipe._C: the pybind11 face of the engine for the PyTorch adapter (python/qrecipe).
//
// Map of the bindings, one translation unit per area (py_types.hpp: the shared wrappers):
//   module.cpp         the module and its exceptions: qrecipe::Error -> qrecipe.QrecipeError,
//                      RecipeError -> qrecipe.RecipeError
//   bind_recipe.cpp    Recipe (parse / load / check / validate; file:line:col messages),
//                      the registry's plugins and search path (for `qrecipe.plugins()`)
//   bind_engine.cpp    Engine, one per recipe: resolve roles, plan linear layers,
//                      delayed-scaling update and checkpointed states
//   bind_quantize.cpp  Quantizer (quantize a torch tensor, describe itself), QuantizedTensor
//                      (bytes and scales per direction as torch tensors aliasing engine
//                      buffers), grouped quantization
//   bind_gemm.cpp      gemm / gemm_many: the engine GEMM into a torch tensor; the benchmarks'
//                      raw cuBLASLt GEMM (raw_gemm.cpp)
//   bind_factories.cpp recipes in Python: the engine's factory resolver, recipes made from a
//                      factory, module-type families, role origins, coverage warnings
//   bind_grouped_gemm.cpp  gemm_grouped, QuantizedGroups and quantize_grouped_split (splits on
//                      the device), plan_grouped_linear, grouped_kernels_built
//   bind_optim.cpp     adam_step / adam_path: the step of qrecipe.optim.FusedAdam
//   bind_norm.cpp      rms_norm_forward / rms_norm_backward: the fused RMSNorm
//
// The Python package adds the torch-facing behaviour (autograd, modules, autocast); the
// bindings only translate types, so every numeric decision stays in the engine and the plugins.
#include "py_types.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/recipe.hpp"

namespace qrecipe::python {
namespace {

void bind_exceptions(py::module_& m) {
  // RecipeError is registered last so its translator is tried first.
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
}

}  // namespace
}  // namespace qrecipe::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "qrecipe engine bindings for the PyTorch adapter";
  namespace qp = qrecipe::python;
  qp::bind_exceptions(m);
  qp::bind_recipe(m);
  qp::bind_engine(m);
  qp::bind_quantize(m);
  qp::bind_gemm(m);
  qp::bind_factories(m);
  qp::bind_grouped_gemm(m);
  qp::bind_optim(m);
  qp::bind_norm(m);
}
