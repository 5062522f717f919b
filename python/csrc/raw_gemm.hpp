// qrecipe._C.raw_cublaslt_gemm: one raw cuBLASLt GEMM on torch tensors, for benchmarks only
// (bench/bench_linear.py times a Linear step's floor with it, in the step's own process and
// interleaved with the steps, so both see the same clocks).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace qrecipe::python {

// torch's current CUDA stream of a device, as a cudaStream_t (torch_interop's
// cuda_current_stream, which bind_gemm.cpp passes).
using CurrentStreamFn = void* (*)(int device);

// Adds raw_cublaslt_gemm to `m` in builds whose engine has CUDA GEMMs (QRECIPE_RAW_GEMM is
// defined); adds nothing otherwise, so callers test hasattr(qrecipe._C, "raw_cublaslt_gemm").
void bind_raw_gemm(pybind11::module_& m, CurrentStreamFn current_stream);

}  // namespace qrecipe::python
