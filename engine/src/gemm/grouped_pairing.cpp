// The grouped GEMM plan (gemm_grouped.hpp plan_gemm_grouped): which grouped kernel (or the
// per-group loop) serves a pair of operands, from their traits only, like the dense pairing
// table (gemm/pairing.cpp): no format names.
//
// On sm90 with the grouped kernels built (gemm/grouped_kernels.hpp):
//   native   per-tensor FP8 pairs and FP32 block-scaled 1x128 x 128x128 / 1x128 x 1x128, K-major, with
//            a kernel for the output dtype;
//   emulated every other pair whose operands the grouped decoder writes exactly to BF16 (the
//            dense emulation's decodes, gemm.md), then the BF16 grouped kernel; the per-tensor
//            factors go into each group's alpha;
//   dense    BF16 x BF16 (operands that are not K-major are copied K-major first).
// Everything else (an FP32 operand, a bias, fixed extents that are not multiples of 16, a
// build without CUTLASS) runs one qrecipe::gemm per group when the host knows the shapes, and
// is refused when only the device does.
#include <sstream>

#include "gemm/grouped_kernels.hpp"
#include "qrecipe/gemm_grouped.hpp"

namespace qrecipe {

namespace detail {

bool grouped_kernels_built() {
#if defined(QRECIPE_WITH_CUTLASS)
  return true;
#else
  return false;
#endif
}

bool grouped_kernel_writes(GroupedKernel kernel, DType out) {
  // The instantiations of gemm/cuda/cutlass/*.cu: BF16 outputs everywhere (activations and
  // BF16 weight gradients), FP32 outputs where a wgrad accumulates into FP32 main_grad.
  switch (kernel) {
    case GroupedKernel::none: return false;
    case GroupedKernel::fp8_e4m3_e4m3_fast:
    case GroupedKernel::fp8_e4m3_e4m3:
    case GroupedKernel::block_1x128_128x128: return out == DType::bf16;
    case GroupedKernel::fp8_e5m2_e4m3:
    case GroupedKernel::block_1x128_1x128:
    case GroupedKernel::bf16: return out == DType::bf16 || out == DType::f32;
  }
  return false;
}

const char* grouped_kernel_name(GroupedKernel kernel) {
  switch (kernel) {
    case GroupedKernel::none: return "none";
    case GroupedKernel::fp8_e4m3_e4m3_fast:
      return "CUTLASS grouped FP8 e4m3 x e4m3, tensor scales per group, fast accumulation";
    case GroupedKernel::fp8_e4m3_e4m3:
      return "CUTLASS grouped FP8 e4m3 x e4m3, tensor scales per group, split accumulation";
    case GroupedKernel::fp8_e5m2_e4m3:
      return "CUTLASS grouped FP8 e5m2 x e4m3, tensor scales per group, split accumulation";
    case GroupedKernel::block_1x128_128x128:
      return "CUTLASS grouped FP8 block-scaled 1x128 x 128x128, split accumulation";
    case GroupedKernel::block_1x128_1x128:
      return "CUTLASS grouped FP8 block-scaled 1x128 x 1x128, split accumulation";
    case GroupedKernel::bf16: return "CUTLASS grouped BF16, FP32 accumulation";
  }
  return "?";
}

}  // namespace detail

bool grouped_kernels_built() { return detail::grouped_kernels_built(); }

std::string GroupedGemmPlan::str() const {
  std::string s;
  switch (mode) {
    case Mode::grouped: s = "one launch: "; break;
    case Mode::per_group: s = "per group: "; break;
    case Mode::refused: s = "refused: "; break;
  }
  s += gemm.str();
  if (!reason.empty()) s += "; " + reason;
  return s;
}

namespace {

using detail::GroupedKernel;

bool is_fp8(qr_dtype t) { return t == QR_DTYPE_E4M3 || t == QR_DTYPE_E5M2; }
bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Whether the grouped decoder writes every value of such an operand to BF16 exactly (or
// checks it on the device, with an exact recompute on a miss): the dense emulation's decodes.
bool decodable(const OperandTraits& t) {
  const bool blocks = is_pow2(t.block_outer) && is_pow2(t.block_inner);
  switch (t.scale_mode) {
    case QR_SCALE_NONE: return t.data_dtype == QR_DTYPE_BF16;  // FP32 does not fit BF16
    case QR_SCALE_TENSOR: return is_fp8(t.data_dtype) && t.scale_dtype == QR_DTYPE_F32;
    case QR_SCALE_BLOCK:
      return is_fp8(t.data_dtype) && blocks &&
             (t.scale_dtype == QR_DTYPE_E8M0 || t.scale_dtype == QR_DTYPE_F32);
    case QR_SCALE_BLOCK_TENSOR:
      return t.data_dtype == QR_DTYPE_E2M1 && t.scale_dtype == QR_DTYPE_E4M3 && blocks;
  }
  return false;
}

bool is_block_scaled_f32(const OperandTraits& t) {
  return t.scale_mode == QR_SCALE_BLOCK && t.scale_dtype == QR_DTYPE_F32 &&
         t.data_dtype == QR_DTYPE_E4M3 && t.block_inner == 128 &&
         (t.block_outer == 1 || t.block_outer == 128);
}

}  // namespace

GroupedKernel detail::native_grouped_kernel(GemmKind kind, const OperandTraits& a,
                                            const OperandTraits& b) {
  if (!a.inner_contiguous || !b.inner_contiguous) return GroupedKernel::none;
  if (a.scale_mode == QR_SCALE_TENSOR && b.scale_mode == QR_SCALE_TENSOR &&
      a.scale_dtype == QR_DTYPE_F32 && b.scale_dtype == QR_DTYPE_F32 && is_fp8(a.data_dtype) &&
      is_fp8(b.data_dtype)) {
    if (b.data_dtype != QR_DTYPE_E4M3) return GroupedKernel::none;
    if (kind == GemmKind::fprop)
      return a.data_dtype == QR_DTYPE_E4M3 ? GroupedKernel::fp8_e4m3_e4m3_fast : GroupedKernel::none;
    return a.data_dtype == QR_DTYPE_E4M3 ? GroupedKernel::fp8_e4m3_e4m3
                                         : GroupedKernel::fp8_e5m2_e4m3;
  }
  if (is_block_scaled_f32(a) && is_block_scaled_f32(b) && a.block_outer == 1)
    return b.block_outer == 128 ? GroupedKernel::block_1x128_128x128
                                : GroupedKernel::block_1x128_1x128;
  return GroupedKernel::none;
}

GroupedGemmPlan plan_gemm_grouped(GemmKind kind, const OperandTraits& a, const OperandTraits& b,
                                  DType out, bool accumulate, bool bias, std::int64_t n,
                                  std::int64_t k_or_m, GemmTarget target, bool device_split) {
  (void)accumulate;  // every grouped kernel accumulates (beta = 1, C = D)
  GroupedGemmPlan p;
  const bool dense = a.scale_mode == QR_SCALE_NONE && b.scale_mode == QR_SCALE_NONE;
  if (target == GemmTarget::cpu) {
    p.gemm = plan_gemm(kind, a, b, target, 16, 16, 16);
    p.reason = "CPU: every group is the reference GEMM";
    return p;
  }
  const auto fallback = [&](GemmPlan gemm, const std::string& why) {
    p.gemm = std::move(gemm);
    if (device_split) {
      p.mode = GroupedGemmPlan::Mode::refused;
      p.reason = why + "; with the splits on the device that needs host shapes: pass the splits "
                 "as host sizes (the PyTorch adapter then reads them on the host)";
    } else {
      p.mode = GroupedGemmPlan::Mode::per_group;
      p.reason = why + ", so one GEMM per group";
    }
    return p;
  };
  // The dense pairing table's answer for one group (its extents: the fixed ones, 16 for the
  // varying one), which the per-group loop would run.
  const GemmPlan single = plan_gemm(kind, a, b, target, 16, n > 0 ? n : 16, k_or_m > 0 ? k_or_m : 16);
  if (!detail::grouped_kernels_built())
    return fallback(single, "this build has no grouped kernels (no CUTLASS headers at "
                            "configure time: run tools/setup.sh and reconfigure)");
  if (bias)
    return fallback(single, "the grouped kernels add no bias (the reference adds it in FP32 "
                            "before the one rounding)");
  if (out != DType::bf16 && out != DType::f32)
    return fallback(single, "the output dtype " + std::string(dtype_name(out)) +
                                " is not f32 or bf16");
  if (n % 16 != 0 || k_or_m % 16 != 0) {
    std::ostringstream os;
    os << "the fixed extents " << n << " and " << k_or_m << " are not both multiples of 16 "
       << "(the grouped kernels' 16-byte alignment)";
    return fallback(single, os.str());
  }
  const GroupedKernel native = detail::native_grouped_kernel(kind, a, b);
  if (native != GroupedKernel::none && detail::grouped_kernel_writes(native, out)) {
    p.gemm = {GemmPlan::Path::native, native == GroupedKernel::fp8_e4m3_e4m3_fast,
              detail::grouped_kernel_name(native)};
    return p;
  }
  if (!decodable(a) || !decodable(b)) {
    const OperandTraits& bad = decodable(a) ? b : a;
    return fallback(single, "the grouped decoder has no exact BF16 decode of " + bad.str());
  }
  std::string why;
  if (native != GroupedKernel::none)
    why = std::string("; the native kernel (") + detail::grouped_kernel_name(native) +
          ") has no " + std::string(dtype_name(out)) + " output";
  if (dense) {
    p.gemm = {GemmPlan::Path::dense, false,
              std::string(detail::grouped_kernel_name(GroupedKernel::bf16)) +
                  " (operands that are not K-major copied K-major first)"};
  } else {
    p.gemm = {GemmPlan::Path::emulated, false,
              "every group's operands decoded to BF16 in one launch (per-tensor factors in "
              "each group's alpha), then " +
                  std::string(detail::grouped_kernel_name(GroupedKernel::bf16)) + why};
  }
  return p;
}

}  // namespace qrecipe
