// GEMM execution: operand decoding and the CPU reference product (see gemm.hpp).
#include "qrecipe/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "qrecipe/conversions.hpp"

#if defined(QRECIPE_WITH_CUDA)
#include "gemm_cuda.hpp"
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

namespace {

// Decode an operand to FP32 laid out [outer, inner] (inner contiguous).
std::vector<float> decode_inner_contiguous(const GemmOperand& op) {
  const std::int64_t rows = op.rows(), cols = op.cols();
  std::vector<float> logical(static_cast<std::size_t>(rows * cols));
  if (op.tensor) {
    QR_CHECK(op.quantizer != nullptr, "quantized GEMM operand ", op.str(),
             " needs the quantizer that made it (to decode it)");
    op.quantizer->dequantize(*op.tensor, op.direction,
                             TensorView(logical.data(), DType::f32, {rows, cols}));
  } else {
    const TensorView& t = op.high_precision;
    QR_CHECK(t.is_contiguous(), "dense GEMM operand ", op.str(), " must be contiguous");
    if (t.dtype() == DType::f32) {
      if (!logical.empty()) std::memcpy(logical.data(), t.data(), logical.size() * sizeof(float));
    } else if (t.dtype() == DType::bf16) {
      const auto* src = t.data_as<const std::uint16_t>();
      for (std::size_t i = 0; i < logical.size(); ++i) logical[i] = num::bf16_to_f32(src[i]);
    } else {
      QR_THROW("dense GEMM operand ", op.str(), " must be f32 or bf16");
    }
  }
  if (op.direction == QR_DIRECTION_ROWWISE) return logical;
  std::vector<float> transposed(logical.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      transposed[static_cast<std::size_t>(c * rows + r)] = logical[static_cast<std::size_t>(r * cols + c)];
  return transposed;
}

// Dot product of two contiguous FP32 runs with 8 independent partial sums (vectorizes; the
// summation order is fixed, so results do not depend on threads).
float dot(const float* a, const float* b, std::int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t r = 0;
  for (; r + 8 <= k; r += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[r + l] * b[r + l];
  for (; r < k; ++r) acc[r & 7] += a[r] * b[r];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void reference_gemm_f32(const float* a, const float* b, float* out, std::int64_t m,
                        std::int64_t n, std::int64_t k) {
  // Tiles of rows of A against tiles of rows of B keep both in cache; threads split A's rows.
  constexpr std::int64_t kTileM = 16, kTileN = 64;
  const auto work = [&](std::int64_t i_begin, std::int64_t i_end) {
    for (std::int64_t j0 = 0; j0 < n; j0 += kTileN) {
      const std::int64_t j1 = std::min(n, j0 + kTileN);
      for (std::int64_t i0 = i_begin; i0 < i_end; i0 += kTileM) {
        const std::int64_t i1 = std::min(i_end, i0 + kTileM);
        for (std::int64_t i = i0; i < i1; ++i)
          for (std::int64_t j = j0; j < j1; ++j) out[i * n + j] = dot(a + i * k, b + j * k, k);
      }
    }
  };
  const std::int64_t flops = m * n * k;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t threads = flops < (1 << 22) ? 1 : std::min<std::int64_t>(hw, m);
  if (threads <= 1) {
    work(0, m);
    return;
  }
  std::vector<std::thread> pool;
  const std::int64_t chunk = (m + threads - 1) / threads;
  for (std::int64_t t = 0; t < threads; ++t) {
    const std::int64_t b0 = t * chunk, b1 = std::min(m, b0 + chunk);
    if (b0 < b1) pool.emplace_back(work, b0, b1);
  }
  for (auto& th : pool) th.join();
}

GemmPlan gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
              const GemmOptions& options) {
  QR_CHECK(a.inner() == b.inner(), "GEMM contraction mismatch: A is ", a.str(), " (contracts over ",
           a.inner(), ") but B is ", b.str(), " (contracts over ", b.inner(), ")");
  const std::int64_t m = a.outer(), n = b.outer(), k = a.inner();
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

  const std::vector<float> fa = decode_inner_contiguous(a);
  const std::vector<float> fb = decode_inner_contiguous(b);
  std::vector<float> acc(static_cast<std::size_t>(m * n));
  reference_gemm_f32(fa.data(), fb.data(), acc.data(), m, n, k);

  // Epilogue, in this order: alpha * AB, + previous out (accumulate), + bias (FP32, a BF16
  // bias widened exactly).
  std::vector<float> bias;
  if (options.bias) {
    bias.resize(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j)
      bias[static_cast<std::size_t>(j)] =
          options.bias_dtype == DType::bf16
              ? num::bf16_to_f32(static_cast<const std::uint16_t*>(options.bias)[j])
              : static_cast<const float*>(options.bias)[j];
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t idx = static_cast<std::size_t>(i * n + j);
      float v = options.alpha * acc[idx];
      if (out.dtype() == DType::f32) {
        float* o = out.data_as<float>();
        if (options.accumulate) v += o[idx];
        if (options.bias) v += bias[static_cast<std::size_t>(j)];
        o[idx] = v;
      } else {
        std::uint16_t* o = out.data_as<std::uint16_t>();
        if (options.accumulate) v += num::bf16_to_f32(o[idx]);
        if (options.bias) v += bias[static_cast<std::size_t>(j)];
        o[idx] = num::f32_to_bf16(v);
      }
    }
  }
  const bool dense = !a.is_quantized() && !b.is_quantized();
  return {dense ? GemmPlan::Path::dense : GemmPlan::Path::reference, false,
          dense ? "both operands unquantized" : "CPU: decoded operands, FP32 accumulation"};
}

}  // namespace qrecipe
