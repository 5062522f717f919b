// The CPU back end of qrecipe::gemm: every operand decoded to FP32 through its quantizer (the
// format's reference dequantize), an FP32 product with a fixed summation order, then the
// epilogue. This is the reference every CUDA GEMM is checked against.
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gemm/gemm_cpu.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe {

namespace {

// An operand decoded to FP32 laid out [outer, inner] (inner contiguous): owned here, or the
// copy kept with its tensor (QuantizedTensor::keeps_decoded, docs/gemm.md "Decoded operands
// kept across GEMMs"), shared so it outlives an invalidation during this GEMM.
struct DecodedF32 {
  std::vector<float> own;
  std::shared_ptr<Buffer> kept;
  const float* data() const { return kept ? static_cast<const float*>(kept->data()) : own.data(); }
};

// Decode an operand to FP32 laid out [outer, inner] (inner contiguous) into `dst`.
void decode_inner_contiguous(const GemmOperand& op, float* dst) {
  const std::int64_t rows = op.rows(), cols = op.cols();
  const std::size_t count = static_cast<std::size_t>(rows * cols);
  // A rowwise operand is already [outer, inner]; a columnwise one is decoded aside first.
  std::vector<float> aside(op.direction == QR_DIRECTION_ROWWISE ? 0 : count);
  float* logical = op.direction == QR_DIRECTION_ROWWISE ? dst : aside.data();
  if (op.tensor) {
    QR_CHECK(op.quantizer != nullptr, "quantized GEMM operand ", op.str(),
             " needs the quantizer that made it (to decode it)");
    op.quantizer->dequantize(*op.tensor, op.direction,
                             TensorView(logical, DType::f32, {rows, cols}));
  } else {
    const TensorView& t = op.high_precision;
    QR_CHECK(t.is_contiguous(), "dense GEMM operand ", op.str(), " must be contiguous");
    if (t.dtype() == DType::f32) {
      if (count) std::memcpy(logical, t.data(), count * sizeof(float));
    } else if (t.dtype() == DType::bf16) {
      const auto* src = t.data_as<const std::uint16_t>();
      for (std::size_t i = 0; i < count; ++i) logical[i] = num::bf16_to_f32(src[i]);
    } else {
      QR_THROW("dense GEMM operand ", op.str(), " must be f32 or bf16");
    }
  }
  if (op.direction == QR_DIRECTION_ROWWISE) return;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      dst[static_cast<std::size_t>(c * rows + r)] = logical[static_cast<std::size_t>(r * cols + c)];
}

DecodedF32 decoded_operand(const GemmOperand& op) {
  DecodedF32 out;
  const std::size_t count = static_cast<std::size_t>(op.rows() * op.cols());
  if (op.tensor && op.tensor->keeps_decoded()) {
    DecodedCopy copy = op.tensor->decoded(op.direction);
    if (copy.values && copy.dtype == DType::f32 && copy.values->bytes() >= count * sizeof(float)) {
      out.kept = std::move(copy.values);
      return out;
    }
    const auto& allocator = op.tensor->allocator() ? op.tensor->allocator() : cpu_allocator();
    copy = DecodedCopy{};
    copy.values = std::make_shared<Buffer>(allocator, count * sizeof(float), Device::cpu(),
                                           Buffer::Fill::none);
    copy.dtype = DType::f32;
    decode_inner_contiguous(op, static_cast<float*>(copy.values->data()));
    out.kept = copy.values;
    op.tensor->keep_decoded(op.direction, std::move(copy));
    return out;
  }
  out.own.resize(count);
  decode_inner_contiguous(op, out.own.data());
  return out;
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
  // Only picks the thread count: a double cannot overflow where m * n * k could.
  const double flops = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
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

namespace detail {

GemmPlan gemm_cpu(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                  const GemmOptions& options) {
  const std::int64_t m = a.outer(), n = b.outer(), k = a.inner();
  const DecodedF32 fa = decoded_operand(a);
  const DecodedF32 fb = decoded_operand(b);
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

}  // namespace detail
}  // namespace qrecipe
