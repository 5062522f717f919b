// Grouped GEMM instantiations: FP8 e4m3 x e4m3 with per-group tensor scales, BF16 output; fast
// accumulation (fprop) and split accumulation (dgrad, wgrad of all-E4M3 recipes). See
// grouped_cutlass.hpp.
#include "gemm/cuda/cutlass/grouped_cutlass.cuh"

namespace qrecipe::detail::grouped {
namespace {

using cutlass_impl::BlockScaledGemm;
using cutlass_impl::no_kernel;
using cutlass_impl::PlainGemm;

// Split accumulation keeps a second FP32 accumulator per thread (the promotion target): with
// the fast kernel's 256x128 tile that is more registers than a thread has, and the grouped
// dgrad/wgrad ran 3x slower than fprop on an H200 (bench/profile_grouped_linear.py), so the
// split kernels take the 128x128 tile the block-scaled kernels use.
using FastTile = cute::Shape<cute::_256, cute::_128, cute::_128>;
using SplitTile = cute::Shape<cute::_128, cute::_128, cute::_128>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using Fast = PlainGemm<cutlass::float_e4m3_t, cutlass::float_e4m3_t, cutlass::bfloat16_t, FastTile, Cluster,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum>;
using Split = PlainGemm<cutlass::float_e4m3_t, cutlass::float_e4m3_t, cutlass::bfloat16_t, SplitTile, Cluster,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;

}  // namespace

void run_fp8_e4m3(const CutlassArgs& args) {
  if (args.out_f32) no_kernel(args, "fp8_e4m3.cu");
  if (args.kernel == GroupedKernel::fp8_e4m3_e4m3_fast) return cutlass_impl::run<Fast>(args);
  if (args.kernel == GroupedKernel::fp8_e4m3_e4m3) return cutlass_impl::run<Split>(args);
  no_kernel(args, "fp8_e4m3.cu");
}

}  // namespace qrecipe::detail::grouped
