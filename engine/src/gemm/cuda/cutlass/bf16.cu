// Grouped GEMM instantiations: BF16 x BF16 with FP32 accumulation, BF16 and FP32 outputs
// (format none, and every emulated pair after its grouped decode). See grouped_cutlass.hpp.
#include "gemm/cuda/cutlass/grouped_cutlass.cuh"

namespace qrecipe::detail::grouped {
namespace {

using cutlass_impl::BlockScaledGemm;
using cutlass_impl::no_kernel;
using cutlass_impl::PlainGemm;

using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using ToBf16 = PlainGemm<cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::bfloat16_t, Tile, Cluster,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
using ToF32 = PlainGemm<cutlass::bfloat16_t, cutlass::bfloat16_t, float, Tile, Cluster,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;

}  // namespace

void run_bf16(const CutlassArgs& args) {
  if (args.kernel != GroupedKernel::bf16) no_kernel(args, "bf16.cu");
  if (args.out_f32) return cutlass_impl::run<ToF32>(args);
  cutlass_impl::run<ToBf16>(args);
}

}  // namespace qrecipe::detail::grouped
