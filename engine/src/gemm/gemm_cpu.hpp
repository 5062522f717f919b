// The CPU back end of qrecipe::gemm (gemm_cpu.cpp). Internal to the engine.
#pragma once

#include "internal_visibility.hpp"

#include "qrecipe/gemm.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

// The product on the CPU: operands decoded to FP32, FP32 accumulation, then alpha, accumulate
// and bias in that order. Shapes and dtypes were checked by qrecipe::gemm.
GemmPlan gemm_cpu(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                  const GemmOptions& options);

}  // namespace qrecipe::detail
QR_INTERNAL_END
