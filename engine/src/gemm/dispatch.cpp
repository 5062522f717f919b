// GEMM dispatch (see gemm.hpp): checks the operands and the output, then hands the product to
// the back end of their device: gemm_cpu.cpp (the reference) or cuda/gemm_cuda.cpp (cuBLASLt).
#include "qrecipe/gemm.hpp"

#include <sstream>

#include "gemm/gemm_cpu.hpp"

#if defined(QRECIPE_WITH_CUDA)
#include "gemm/cuda/gemm_cuda.hpp"
#endif

namespace qrecipe {

const char* gemm_kind_name(GemmKind kind) {
  switch (kind) {
    case GemmKind::fprop: return "fprop";
    case GemmKind::dgrad: return "dgrad";
    case GemmKind::wgrad: return "wgrad";
  }
  return "?";
}

Device GemmOperand::device() const {
  if (tensor) return Device::from_c(tensor->direction(direction).data.device);
  return high_precision.device();
}

std::string GemmOperand::str() const {
  std::ostringstream os;
  if (tensor) {
    const auto& l = tensor->direction(direction).layout;
    os << (l.format ? l.format : tensor->format().c_str()) << " "
       << dtype_name(static_cast<DType>(l.data_dtype));
  } else {
    os << dtype_name(high_precision.dtype());
  }
  os << " [" << rows() << "x" << cols() << "] " << direction_name(direction);
  return os.str();
}

GemmPlan gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
              const GemmOptions& options) {
  QR_CHECK(a.inner() == b.inner(), "GEMM contraction mismatch: A is ", a.str(), " (contracts over ",
           a.inner(), ") but B is ", b.str(), " (contracts over ", b.inner(), ")");
  const std::int64_t m = a.outer(), n = b.outer();
  QR_CHECK(out.rows() == m && out.cols() == n, "GEMM output is ", out.rows(), "x", out.cols(),
           " but A=", a.str(), " and B=", b.str(), " give ", m, "x", n);
  QR_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::bf16,
           "GEMM output must be f32 or bf16, got ", dtype_name(out.dtype()));
  QR_CHECK(out.is_contiguous(), "GEMM output must be contiguous");
  QR_CHECK(options.bias_dtype == DType::f32 || options.bias_dtype == DType::bf16,
           "GEMM bias must be f32 or bf16, got ", dtype_name(options.bias_dtype));
  const Device da = a.device(), db = b.device(), dout = out.device();
  if (!(da.is_cpu() && db.is_cpu() && dout.is_cpu())) {
    QR_CHECK_CODE(da == db && db == dout, QR_STATUS_UNSUPPORTED, "GEMM with A=", a.str(), " on ",
                  da.str(), ", B=", b.str(), " on ", db.str(), " and the output on ", dout.str(),
                  ": operands and output must live on one device (move them there first); a "
                  "CUDA operand never falls back to the CPU");
#if defined(QRECIPE_WITH_CUDA)
    return detail::gemm_cuda(a, b, out, options);
#else
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "GEMM on ", dout.str(), " (A=", a.str(), ", B=", b.str(),
                  "): this build of qrecipe has no CUDA (QRECIPE_CUDA=OFF); rebuild with "
                  "-DQRECIPE_CUDA=ON or keep the tensors on the CPU. A CUDA operand never "
                  "falls back to the CPU");
#endif
  }

  return detail::gemm_cpu(a, b, out, options);
}

}  // namespace qrecipe
