// Grouped GEMM instantiations: FP8 e5m2 x e4m3 (gradients x weights or activations) with
// per-group tensor scales, split accumulation, BF16 and FP32 outputs (dgrad, wgrad; FP32 for a
// wgrad accumulating into main_grad). See grouped_cutlass.hpp.
#include "gemm/cuda/cutlass/grouped_cutlass.cuh"

namespace qrecipe::detail::grouped {
namespace {

using cutlass_impl::BlockScaledGemm;
using cutlass_impl::no_kernel;
using cutlass_impl::PlainGemm;

// 128x128: split accumulation's second accumulator does not fit a 256x128 tile's registers
// (see fp8_e4m3.cu).
using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using ToBf16 = PlainGemm<cutlass::float_e5m2_t, cutlass::float_e4m3_t, cutlass::bfloat16_t, Tile, Cluster,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
using ToF32 = PlainGemm<cutlass::float_e5m2_t, cutlass::float_e4m3_t, float, Tile, Cluster,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;

}  // namespace

void run_fp8_e5m2(const CutlassArgs& args) {
  if (args.kernel != GroupedKernel::fp8_e5m2_e4m3) no_kernel(args, "fp8_e5m2.cu");
  if (args.out_f32) return cutlass_impl::run<ToF32>(args);
  cutlass_impl::run<ToBf16>(args);
}

}  // namespace qrecipe::detail::grouped
