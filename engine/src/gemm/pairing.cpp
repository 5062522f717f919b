// The pairing table (docs/gemm.md, "Paths"): which (operand, operand, device) GEMMs run natively.
//
// Keyed by what the operands are (data dtype, scale mode and dtype, block shape along the output
// and the contraction, K-major or not), never by format names, so a new plugin whose layout
// matches a native pair gets the native GEMM without any engine change.
#include <sstream>

#include "qrecipe/gemm.hpp"

namespace qrecipe {

OperandTraits OperandTraits::of(const qr_direction_layout& l, qr_direction direction) {
  OperandTraits t;
  t.format = l.format ? l.format : "?";
  t.data_dtype = static_cast<qr_dtype>(l.data_dtype);
  t.scale_mode = static_cast<qr_scale_mode>(l.scale_mode);
  t.scale_dtype = static_cast<qr_dtype>(l.scale_dtype);
  const bool rowwise = direction == QR_DIRECTION_ROWWISE;
  // A rowwise operand contracts over the logical columns, a columnwise one over the rows.
  t.block_outer = rowwise ? l.block_rows : l.block_cols;
  t.block_inner = rowwise ? l.block_cols : l.block_rows;
  // K-major: rowwise data untransposed, or columnwise data stored transposed.
  t.inner_contiguous = rowwise ? !l.data_transposed : l.data_transposed != 0;
  return t;
}

OperandTraits OperandTraits::high_precision(DType dtype) {
  OperandTraits t;
  t.format = "none";
  t.data_dtype = static_cast<qr_dtype>(dtype);
  return t;
}

std::string OperandTraits::str() const {
  std::ostringstream os;
  os << dtype_name(static_cast<DType>(data_dtype));
  switch (scale_mode) {
    case QR_SCALE_NONE: break;
    case QR_SCALE_TENSOR: os << " tensor-scaled"; break;
    case QR_SCALE_BLOCK:
    case QR_SCALE_BLOCK_TENSOR:
      os << " " << block_outer << "x" << block_inner << " blocks ("
         << dtype_name(static_cast<DType>(scale_dtype)) << " scales"
         << (scale_mode == QR_SCALE_BLOCK_TENSOR ? " + tensor" : "") << ")";
      break;
  }
  return os.str();
}

GemmTarget gemm_target_from_name(const std::string& name) {
  if (name == "cpu") return GemmTarget::cpu;
  if (name == "sm90" || name == "hopper" || name == "h100" || name == "h200") return GemmTarget::sm90;
  QR_THROW("unknown GEMM target '", name, "'; expected cpu or sm90 (Hopper)");
}

const char* gemm_target_name(GemmTarget target) {
  return target == GemmTarget::cpu ? "cpu" : "sm90";
}

std::string GemmPlan::str() const {
  std::string s;
  switch (path) {
    case Path::reference: s = "reference"; break;
    case Path::native: s = "native"; break;
    case Path::emulated: s = "emulated"; break;
    case Path::dense: s = "high precision"; break;
  }
  return reason.empty() ? s : s + " (" + reason + ")";
}

namespace {

bool is_fp8(qr_dtype t) { return t == QR_DTYPE_E4M3 || t == QR_DTYPE_E5M2; }
bool is_high_precision(const OperandTraits& t) { return t.scale_mode == QR_SCALE_NONE; }
// E4M3 with FP32 scales per 1x128 or 128x128 block: cuBLASLt's block-scaled FP8 GEMM on Hopper.
bool is_fp32_block_scaled_e4m3(const OperandTraits& t) {
  return t.scale_mode == QR_SCALE_BLOCK && t.scale_dtype == QR_DTYPE_F32 &&
         t.data_dtype == QR_DTYPE_E4M3 && t.block_inner == 128 &&
         (t.block_outer == 1 || t.block_outer == 128);
}
std::string block_name(const OperandTraits& t) {
  return std::to_string(t.block_outer) + "x" + std::to_string(t.block_inner);
}

GemmPlan emulated(std::string why) { return {GemmPlan::Path::emulated, false, std::move(why)}; }

}  // namespace

GemmPlan plan_gemm(GemmKind kind, const OperandTraits& a, const OperandTraits& b, GemmTarget target,
                   std::int64_t m, std::int64_t n, std::int64_t k) {
  const bool dense = is_high_precision(a) && is_high_precision(b);
  if (target == GemmTarget::cpu) {
    if (dense) return {GemmPlan::Path::dense, false, "both operands unquantized"};
    return {GemmPlan::Path::reference, false, "CPU: decoded operands, FP32 accumulation"};
  }
  // Hopper (sm_90) with cuBLASLt 13.
  if (dense) return {GemmPlan::Path::dense, false, "both operands unquantized"};
  if (is_high_precision(a) != is_high_precision(b))
    return emulated("one operand unquantized: the other is decoded to BF16/FP32");
  if (!a.inner_contiguous || !b.inner_contiguous)
    return emulated("an operand is not K-major (" + a.str() + " x " + b.str() + ")");
  if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0)
    return emulated("dimensions " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                    std::to_string(k) + " are not all multiples of 16");

  if (a.scale_mode == QR_SCALE_TENSOR && b.scale_mode == QR_SCALE_TENSOR && is_fp8(a.data_dtype) &&
      is_fp8(b.data_dtype)) {
    if (a.data_dtype == QR_DTYPE_E5M2 && b.data_dtype == QR_DTYPE_E5M2)
      return emulated("cuBLASLt has no E5M2 x E5M2 FP8 GEMM");
    const bool fast = kind == GemmKind::fprop;
    return {GemmPlan::Path::native, fast,
            std::string("cuBLASLt FP8 ") + a.str() + " x " + b.str() +
                (fast ? ", fast accumulation" : ", split accumulation")};
  }
  if (is_fp32_block_scaled_e4m3(a) && is_fp32_block_scaled_e4m3(b)) {
    if (a.block_outer == 128 && b.block_outer == 128)
      return emulated("cuBLASLt has no 128x128 x 128x128 block-scaled GEMM");
    return {GemmPlan::Path::native, false,
            "cuBLASLt FP8 block-scaled " + block_name(a) + " x " + block_name(b) +
                ", split accumulation"};
  }
  if (a.scale_dtype == QR_DTYPE_E8M0 || b.scale_dtype == QR_DTYPE_E8M0 ||
      a.data_dtype == QR_DTYPE_E2M1 || b.data_dtype == QR_DTYPE_E2M1)
    return emulated("Hopper has no tensor cores for E8M0-scaled or E2M1 operands: " + a.str() +
                    " x " + b.str() +
                    " decoded to BF16");
  return emulated("no native pairing for " + a.str() + " x " + b.str());
}

}  // namespace qrecipe
