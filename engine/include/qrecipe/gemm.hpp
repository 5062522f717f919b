// Quantized GEMMs and the pairing table that says which run natively (docs/gemm.md).
//
// One general product covers the three GEMMs of a linear layer y = x W^T:
//   out[i, j] = alpha * sum_r opA(i, r) * opB(j, r)  (+ beta * out)  (+ bias[j])
// where an operand used ROWWISE contracts over its columns (opX = X) and one used COLUMNWISE
// contracts over its rows (opX = X^T):
//   fprop  y  [M, N] = x  rowwise    . W  rowwise       (x [M, K], W [N, K])
//   dgrad  dx [M, K] = dy rowwise    . W  columnwise    (dy [M, N])
//   wgrad  dW [N, K] = dy columnwise . x  columnwise
// An operand is either one direction of a QuantizedTensor (with the Quantizer that made it, which
// decodes it) or a high-precision F32/BF16 tensor with the same meaning of direction.
//
// Execution: on the CPU every GEMM is the reference path (both operands decoded to FP32, FP32
// accumulation, blocked and multi-threaded, deterministic). On CUDA
// (engine/src/gemm/cuda/gemm_cuda.cpp), pairs the table marks native go to cuBLASLt (loaded
// lazily, see engine/src/gemm/cuda/cublaslt.hpp) and all others are emulated on the GPU: each
// operand decoded to BF16 by the engine's own layout-driven decoders, the per-tensor factors
// (FP8 scale_inv, the tensor factor of a block-and-tensor scaled direction from its format's
// tensor_scale_numerator, plugin_abi.h) moved into a device-side alpha, then one BF16
// cuBLASLt GEMM with FP32 accumulation (docs/gemm.md). For FP8 operands with E8M0 or
// FP32 block scales the decoders check on the device that BF16 held every value; where one
// did not, a device kernel recomputes the output exactly (FP32-decoded operands, FP32
// accumulation) with no host wait. Dense FP32 operands and layouts without an
// engine decoder are decoded to FP32 by their quantizers' CUDA dequantize for an FP32 cuBLASLt
// GEMM. A CUDA operand never falls back to the CPU; operands and output on different devices
// are an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

enum class GemmKind { fprop, dgrad, wgrad };
const char* gemm_kind_name(GemmKind kind);

struct GemmOperand {
  // Quantized: one direction of `tensor`, decoded by `quantizer`.
  const QuantizedTensor* tensor = nullptr;
  const Quantizer* quantizer = nullptr;
  // High precision (F32 or BF16, 2-D logical [rows, cols], contiguous) when tensor is null.
  TensorView high_precision;
  qr_direction direction = QR_DIRECTION_ROWWISE;

  static GemmOperand quantized(const QuantizedTensor& t, const Quantizer& q, qr_direction d) {
    GemmOperand o;
    o.tensor = &t;
    o.quantizer = &q;
    o.direction = d;
    return o;
  }
  static GemmOperand dense(const TensorView& t, qr_direction d) {
    GemmOperand o;
    o.high_precision = t;
    o.direction = d;
    return o;
  }
  bool is_quantized() const { return tensor != nullptr; }
  std::int64_t rows() const { return tensor ? tensor->rows() : high_precision.rows(); }
  std::int64_t cols() const { return tensor ? tensor->cols() : high_precision.cols(); }
  // Extent of the output dimension this operand provides, and of the contraction.
  std::int64_t outer() const { return direction == QR_DIRECTION_ROWWISE ? rows() : cols(); }
  std::int64_t inner() const { return direction == QR_DIRECTION_ROWWISE ? cols() : rows(); }
  Device device() const;
  std::string str() const;  // "myformat e4m3 [1024x512] rowwise" or "bf16 [1024x512] columnwise"
};

struct GemmOptions {
  float alpha = 1.0f;
  bool accumulate = false;       // out = alpha*AB + out (beta = 1)
  // [outer(B)] of bias_dtype, FP32 or BF16: host memory for the CPU path, device memory on the
  // output's device for the CUDA path. A BF16 bias is widened exactly, so it gives the numbers
  // of its FP32 copy; it lets a native FP8 GEMM with a BF16 output add the bias inside
  // cuBLASLt's epilogue (which takes the output's type there) instead of a separate pass.
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* stream = nullptr;        // cudaStream_t for CUDA operands (nullptr: legacy default)
  // Which GEMM of a linear layer this is. It decides the accumulation of a native FP8 GEMM:
  // fast accumulation for fprop only (docs/gemm.md); unset means split accumulation.
  std::optional<GemmKind> kind;
};

// Operand description used by the pairing table: what the data and scales are, not who made it.
struct OperandTraits {
  std::string format;            // "none" for high precision
  qr_dtype data_dtype = QR_DTYPE_F32;
  qr_scale_mode scale_mode = QR_SCALE_NONE;
  qr_dtype scale_dtype = QR_DTYPE_F32;
  int block_outer = 1;           // block extent along the output dimension
  int block_inner = 1;           // block extent along the contraction
  bool inner_contiguous = true;  // data laid out K-major (what a TN cuBLASLt GEMM reads)
  std::string str() const;       // "e4m3 tensor-scaled", "e4m3 1x128 blocks", "bf16"
  static OperandTraits of(const qr_direction_layout& layout, qr_direction direction);
  static OperandTraits high_precision(DType dtype);
};

// Where a GEMM can run and how.
enum class GemmTarget { cpu, sm90 };
GemmTarget gemm_target_from_name(const std::string& name);  // "cpu", "sm90"
const char* gemm_target_name(GemmTarget target);

struct GemmPlan {
  enum class Path { reference, native, emulated, dense };
  Path path = Path::reference;
  bool fast_accumulation = false;  // native FP8: fprop only
  std::string reason;              // why native / why emulated
  std::string str() const;         // "native (cuBLASLt FP8 e4m3 x e4m3, tensor scales, fast accum)"
};

// The pairing table: how `kind` with these operands runs on `target` for an [m, n, k] product.
GemmPlan plan_gemm(GemmKind kind, const OperandTraits& a, const OperandTraits& b, GemmTarget target,
                   std::int64_t m, std::int64_t n, std::int64_t k);

// out [outer(A), outer(B)] (F32 or BF16, contiguous) = the product above. Throws on a shape
// mismatch (naming both operands), a missing direction or operands on different devices.
// Returns the plan that ran: on CUDA a pair the table marks native runs emulated instead (and
// the returned plan says so and why) only when the loaded cuBLASLt has no algorithm for it.
// CUDA GEMMs are asynchronous on options.stream.
GemmPlan gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
              const GemmOptions& options = {});

// The CPU reference product of two FP32 matrices both stored inner-contiguous:
// out[i, j] = sum_r a[i*k + r] * b[j*k + r], FP32 accumulation in a fixed order (deterministic,
// independent of the thread count).
void reference_gemm_f32(const float* a, const float* b, float* out, std::int64_t m,
                        std::int64_t n, std::int64_t k);

}  // namespace qrecipe
