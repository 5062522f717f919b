// Grouped GEMM instantiations: FP8 e4m3 with FP32 block scales, split accumulation (the scales
// applied at every 128-K promotion): 1x128 x 128x128 (fprop, dgrad) to BF16, 1x128 x 1x128
// (wgrad) to BF16 and FP32. See grouped_cutlass.hpp.
#include "gemm/cuda/cutlass/grouped_cutlass.cuh"

namespace qrecipe::detail::grouped {
namespace {

using cutlass_impl::BlockScaledGemm;
using cutlass_impl::no_kernel;
using cutlass_impl::PlainGemm;

using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using WeightsBf16 = BlockScaledGemm<cutlass::bfloat16_t, 128, Tile, Cluster>;
using RowsBf16 = BlockScaledGemm<cutlass::bfloat16_t, 1, Tile, Cluster>;
using RowsF32 = BlockScaledGemm<float, 1, Tile, Cluster>;

}  // namespace

void run_block_scaled(const CutlassArgs& args) {
  if (args.kernel == GroupedKernel::block_1x128_128x128 && !args.out_f32)
    return cutlass_impl::run<WeightsBf16>(args);
  if (args.kernel == GroupedKernel::block_1x128_1x128)
    return args.out_f32 ? cutlass_impl::run<RowsF32>(args) : cutlass_impl::run<RowsBf16>(args);
  no_kernel(args, "block_scaled.cu");
}

}  // namespace qrecipe::detail::grouped
