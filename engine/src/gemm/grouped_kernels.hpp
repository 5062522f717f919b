// The grouped GEMM kernels a CUDA build has (internal; gemm/grouped_pairing.cpp chooses among
// them, gemm/cuda/grouped_cuda.cpp runs them). Keyed by operand traits, never by format names.
//
// Each kernel is one CUTLASS SM90 ptr-array grouped GEMM instantiated in
// gemm/cuda/cutlass/*.cu (few on purpose: each costs about a minute of nvcc time). Operands
// are K-major ("TN"), the output row-major; the accumulation mode is fixed per kernel:
//   fp8 ... fast     FP8 tensor cores accumulating in their own FP32 accumulator (fprop, as
//                    the dense path's CUBLASLT_MATMUL_DESC_FAST_ACCUM)
//   fp8 ... (split)  partial sums promoted into an FP32 register accumulator every 128 of K
//                    (dgrad and wgrad, as TransformerEngine's split accumulation)
//   block ...        FP8 with 1x128 / 128x128 FP32 block scales applied at every 128-K
//                    promotion (always split)
//   bf16             BF16 tensor cores, FP32 accumulation (format none, and every emulated
//                    pair after one grouped decode to BF16)
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>

#include "qrecipe/dtype.hpp"
#include "qrecipe/gemm.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

enum class GroupedKernel : std::int32_t {
  none = -1,
  fp8_e4m3_e4m3_fast = 0,  // fprop: e4m3 x e4m3, fast accumulation
  fp8_e4m3_e4m3 = 1,       // dgrad/wgrad of an all-E4M3 recipe: split accumulation
  fp8_e5m2_e4m3 = 2,       // dgrad/wgrad with E5M2 gradients x E4M3 operands: split accumulation
  block_1x128_128x128 = 3, // FP32 1x128 x 128x128 block scales: fprop, dgrad (activations x weights)
  block_1x128_1x128 = 4,   // FP32 1x128 x 1x128 block scales: wgrad (gradients x activations)
  bf16 = 5,                // BF16 x BF16 (format none, emulated pairs after their decode)
};
inline constexpr int kGroupedKernels = 6;

// Whether this build has the grouped kernels (a CUDA build with CUTLASS headers,
// cmake/QrecipeCutlass.cmake).
bool grouped_kernels_built();

// Whether `kernel` was instantiated with output dtype `out` (F32 or BF16).
bool grouped_kernel_writes(GroupedKernel kernel, DType out);

const char* grouped_kernel_name(GroupedKernel kernel);  // "CUTLASS grouped FP8 e4m3 x e4m3, ..."

// The native grouped kernel of a pair of K-major quantized operands (none when the pair has
// none; the output dtype is not considered here).
GroupedKernel native_grouped_kernel(GemmKind kind, const OperandTraits& a, const OperandTraits& b);

}  // namespace qrecipe::detail
QR_INTERNAL_END
