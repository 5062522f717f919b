// Grouped GEMM instantiations: BF16 x BF16 with FP32 accumulation, BF16 and FP32 outputs
// (format none, and every emulated pair after its grouped decode). See grouped_cutlass.hpp.
#include "gemm/cuda/cutlass/grouped_cutlass.cuh"

namespace qrecipe::detail::grouped {
namespace {

using cutlass_impl::BlockwiseGemm;
using cutlass_impl::PlainGemm;

[[noreturn]] void no_kernel(const CutlassArgs& args, const char* unit) {
  QR_THROW_CODE(QR_STATUS_INTERNAL, "grouped GEMM ", args.what, ": ", unit, " has no ",
                grouped_kernel_name(args.kernel), " kernel with a ", args.out_f32 ? "f32" : "bf16",
                " output (gemm/grouped_pairing.cpp and the instantiations disagree)");
}

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
