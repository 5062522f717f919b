// CUTLASS's SM90 block-scaled FP8 names, aliased for the engine's grouped GEMM kernels
// (engine/src/gemm/cuda/cutlass/grouped_cutlass.cuh). CUTLASS spells them with a word that is
// also one of qrecipe's format names, and nothing under engine/ may contain a format name
// (tests/check_engine_names.sh), so the third-party spelling lives here, outside engine/.
// Nothing else: no qrecipe code, only CUTLASS's identifiers under names that say what they are.
#pragma once

#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace qrecipe_cutlass_names {

// Sm90 scale layout of A's and B's block scales (1 x SFVecSizeN along M/N, SFVecSizeK along K).
template <int SFVecSizeM, int SFVecSizeN, int SFVecSizeK, cute::GMMA::Major MajorSFA,
          cute::GMMA::Major MajorSFB>
using Sm90BlockScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<SFVecSizeM, SFVecSizeN, SFVecSizeK, MajorSFA, MajorSFB>;

// The ptr-array (grouped) TMA warp-specialized cooperative schedule with FP8 block scales.
using KernelPtrArrayCooperativeFP8BlockScaled =
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;

}  // namespace qrecipe_cutlass_names
