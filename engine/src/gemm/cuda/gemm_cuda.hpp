// The CUDA GEMM path (internal header; gemm_cuda.cpp is compiled only with CUDA).
#pragma once

#include "internal_visibility.hpp"

#include "qrecipe/gemm.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

// gemm() for operands and output that all live on one CUDA device (gemm/dispatch.cpp has checked the
// shapes, the output dtype and contiguity, and that the devices agree). Returns the plan that ran.
GemmPlan gemm_cuda(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                   const GemmOptions& options);

}  // namespace qrecipe::detail
QR_INTERNAL_END
