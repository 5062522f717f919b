// The CUDA GEMM path: native cuBLASLt FP8 GEMMs, emulation on the GPU, dense GEMMs
// (docs/gemm.md; gemm.hpp is the contract).
//
// Map of this file
//   1. the transposition convention (below), device guard, scratch buffers per stream
//   2. Op: one operand as the GEMM reads it (pointer, dtype, K-major or not, scales)
//   3. run_product: one cuBLASLt call in column-major terms plus the epilogue strategy
//   4. the three paths: native (per-tensor FP8, FP8 with FP32 block scales), emulated, dense;
//      the emulated path decodes to BF16 (engine decoders, per-tensor factors in a device alpha)
//      where that can be exact, checks on the device where it depends on the data (and
//      recomputes there when it is not), and decodes to FP32 otherwise
//   5. gemm_cuda(): plan, dispatch, and the fallback from native to emulated
//
// Transposition convention. Our operands are "inner contiguous" (K-major): operand A gives the
// rows of the output and is stored [M, K] row-major, operand B gives the columns and is stored
// [N, K] row-major, and out[i, j] = sum_r A(i, r) B(j, r), out being [M, N] row-major.
// cuBLASLt is column-major and computes D (m x n) = op(A_c) op(B_c). A row-major [M, N] buffer
// is the column-major [N, M] matrix out^T, and out^T = B A^T. So:
//   cuBLAS A_c = our B: the [N, K] row-major buffer is column-major K x N with ld K; op T
//                makes it N x K.                                   (m = N)
//   cuBLAS B_c = our A: the [M, K] row-major buffer is column-major K x M with ld K; op N
//                keeps it K x M.                                   (n = M, k = K)
//   D = out: column-major N x M with ld N, i.e. our [M, N] row-major.
// That is the "TN" form, the only one Hopper's FP8 GEMMs accept: both operands K-major.
// Scale pointers follow their data: CUBLASLT_MATMUL_DESC_A_SCALE_* holds our B's scale_inv,
// B_SCALE_* our A's. The bias (one value per output column j < N) is a vector of length m = N
// in cuBLAS terms: what CUBLASLT_EPILOGUE_BIAS adds ("length = rows of D").
// An operand that is not K-major (a dense or dequantized columnwise operand, stored [K, outer])
// flips its op: our B becomes column-major N x K with ld N and op N; our A column-major M x K
// with ld M and op T. Only BF16 and FP32 GEMMs ever see that.
#include "gemm/cuda/gemm_cuda.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "gemm/cuda/cublaslt.hpp"
#include "cuda_device_guard.hpp"
#include "gemm/cuda/gemm_cuda_kernels.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::detail {
namespace {

// ---------------------------------------------------------------- 1. device, scratch

void check_cuda(cudaError_t status, const char* call, const std::string& what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "CUDA call ", call, " failed with ", cudaGetErrorName(status),
                " (", cudaGetErrorString(status), ") during ", what,
                "; check the device with nvidia-smi");
}

using detail::DeviceGuard;

// Device buffers for decoded operands and FP32 products, one set per (thread, device, stream)
// so that GEMMs that may run concurrently never share one; a buffer grows when a GEMM needs more
// (cudaFree of the old one waits for the work that used it) and is kept until the thread exits.
// The set also holds the exactness flag's epoch (see "the emulated path"): the flag word lives in
// kSlotScalars, after the four scalars.
// kSlotSaved holds the output an accumulating GEMM may redo when no decoded operand's scratch
// can (its operands are copies kept with their tensors, which must not be overwritten).
enum Slot { kSlotA = 0, kSlotB = 1, kSlotProduct = 2, kSlotScalars = 3, kSlotBias = 4, kSlotSaved = 5, kSlots = 6 };
constexpr std::size_t kScalarsBytes = 64;  // [alpha, beta, alpha, 0] floats, then the flag word

struct ScratchSet {
  Buffer buffers[kSlots];
  std::uint32_t epoch = 0;  // of the last emulated GEMM that checked exactness
};

ScratchSet& scratch_set(int device, void* stream) {
  thread_local std::map<std::pair<int, void*>, ScratchSet> sets;
  return sets[{device, stream}];
}

void* scratch(int device, void* stream, Slot slot, std::size_t bytes) {
  Buffer& buffer = scratch_set(device, stream).buffers[slot];
  if (buffer.bytes() < bytes || buffer.data() == nullptr)
    buffer = Buffer(cuda_allocator(), bytes, Device::cuda(device));
  return buffer.data();
}

// The scalars of an emulated GEMM and its exactness flag: kSlotScalars, zeroed (in stream
// order) when first allocated, so the flag word never holds an epoch nobody wrote.
float* scalars_buffer(int device, void* stream, const std::string& what) {
  Buffer& buffer = scratch_set(device, stream).buffers[kSlotScalars];
  if (buffer.data() == nullptr) {
    buffer = Buffer(cuda_allocator(), kScalarsBytes, Device::cuda(device));
    check_cuda(cudaMemsetAsync(buffer.data(), 0, kScalarsBytes, static_cast<cudaStream_t>(stream)),
               "cudaMemsetAsync (GEMM scalars and exactness flag)", what);
  }
  return static_cast<float*>(buffer.data());
}

// The next epoch of the set's flag word. After 2^32 - 1 epochs the word is zeroed again, so an
// epoch that comes round again never meets its old value.
std::uint32_t next_epoch(int device, void* stream, std::uint32_t* word, const std::string& what) {
  ScratchSet& set = scratch_set(device, stream);
  if (++set.epoch == 0) {
    check_cuda(cudaMemsetAsync(word, 0, sizeof(std::uint32_t), static_cast<cudaStream_t>(stream)),
               "cudaMemsetAsync (exactness flag)", what);
    set.epoch = 1;
  }
  return set.epoch;
}

// ---------------------------------------------------------------- 2. operands

// One operand as the GEMM reads it: `outer` rows of `inner` values, K-major (stored
// [outer, inner] row-major) or not (stored [inner, outer] row-major).
struct Op {
  const void* data = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  bool k_major = true;
  std::int64_t outer = 0, inner = 0;
  const void* scale = nullptr;
  cublasLtMatmulMatrixScale_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

cudaDataType_t cuda_type(qr_dtype t) {
  switch (t) {
    case QR_DTYPE_F32: return CUDA_R_32F;
    case QR_DTYPE_BF16: return CUDA_R_16BF;
    case QR_DTYPE_E4M3: return CUDA_R_8F_E4M3;
    case QR_DTYPE_E5M2: return CUDA_R_8F_E5M2;
    default: QR_THROW_CODE(QR_STATUS_INTERNAL, "no cuBLASLt type for dtype ", static_cast<int>(t));
  }
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

OperandTraits traits_of(const GemmOperand& op) {
  if (op.tensor) return OperandTraits::of(op.tensor->direction(op.direction).layout, op.direction);
  return OperandTraits::high_precision(op.high_precision.dtype());
}

// cuBLAS A_c from our B (see the convention at the top of the file).
cublaslt::Matrix as_cublas_a(const Op& ours_b) {
  cublaslt::Matrix x;
  x.data = ours_b.data;
  x.type = ours_b.type;
  x.scale = ours_b.scale;
  x.scale_mode = ours_b.scale_mode;
  if (ours_b.k_major) {  // column-major K x N, op T -> N x K
    x.op = CUBLAS_OP_T;
    x.rows = ours_b.inner;
    x.cols = ours_b.outer;
    x.ld = ours_b.inner;
  } else {               // column-major N x K already
    x.op = CUBLAS_OP_N;
    x.rows = ours_b.outer;
    x.cols = ours_b.inner;
    x.ld = ours_b.outer;
  }
  return x;
}

// cuBLAS B_c from our A.
cublaslt::Matrix as_cublas_b(const Op& ours_a) {
  cublaslt::Matrix x;
  x.data = ours_a.data;
  x.type = ours_a.type;
  x.scale = ours_a.scale;
  x.scale_mode = ours_a.scale_mode;
  if (ours_a.k_major) {  // column-major K x M, op N
    x.op = CUBLAS_OP_N;
    x.rows = ours_a.inner;
    x.cols = ours_a.outer;
    x.ld = ours_a.inner;
  } else {               // column-major M x K, op T -> K x M
    x.op = CUBLAS_OP_T;
    x.rows = ours_a.outer;
    x.cols = ours_a.inner;
    x.ld = ours_a.outer;
  }
  return x;
}

struct Context {
  const GemmOperand& a;
  const GemmOperand& b;
  const TensorView& out;
  const GemmOptions& options;
  int device = 0;
  std::int64_t m = 0, n = 0, k = 0;
  // "fprop e4m3 [1024x512] rowwise x e4m3 [256x512] rowwise -> f32 [1024x256]", built only for
  // messages.
  std::string what() const;
};

// ---------------------------------------------------------------- 3. one product

// The bias as FP32 for the engine's own epilogue kernels: the caller's FP32 bias, or its BF16
// bias widened (exactly) into scratch on the GEMM's stream; nullptr without a bias.
const float* f32_bias(const Context& c) {
  if (!c.options.bias) return nullptr;
  if (c.options.bias_dtype == DType::f32) return static_cast<const float*>(c.options.bias);
  auto* widened = static_cast<float*>(
      scratch(c.device, c.options.stream, kSlotBias, static_cast<std::size_t>(c.n) * sizeof(float)));
  gemm_kernels::bf16_to_f32(static_cast<const std::uint16_t*>(c.options.bias), widened, c.n,
                            c.options.stream);
  return widened;
}

// out = alpha * A B^T (+ out) (+ bias) through cuBLASLt. The epilogue runs inside cuBLASLt when
// it can do exactly what the reference does: the bias in the output's type, which cuBLASLt
// takes there (an FP32 bias with non-FP8 inputs and an FP32 output; a BF16 bias, exact by
// construction, with FP8 inputs and a BF16 output: FP32 epilogue math, one rounding).
// Otherwise the product goes to an FP32 buffer (or to the FP32 output itself) and a small
// kernel applies the reference epilogue, so the result never depends on a BF16-rounded bias
// or a double rounding.
//
// device_scalars (nullptr: the host alpha) is the 4-float array gemm_kernels::Scalars fills:
// [alpha, beta] for a GEMM that writes the output, [alpha, 0] for one that writes the FP32
// product buffer.
cublaslt::Outcome run_product(const Context& c, const Op& a, const Op& b, bool fast_accumulation,
                              std::string& why, const float* device_scalars = nullptr) {
  const bool fp8 = is_fp8(a.type) || is_fp8(b.type);
  const bool out_bf16 = c.out.dtype() == DType::bf16;
  // cuBLASLt's FP32 GEMM writes FP32 only: a BF16 output goes through the FP32 buffer below.
  const bool direct_ok = !(a.type == CUDA_R_32F && out_bf16);
  const void* bias = c.options.bias;
  const bool bias_bf16 = bias && c.options.bias_dtype == DType::bf16;
  cublaslt::MatmulArgs x;
  x.device = c.device;
  x.stream = c.options.stream;
  x.a = as_cublas_a(b);
  x.b = as_cublas_b(a);
  x.m = c.n;
  x.n = c.m;
  x.k = c.k;
  x.ldd = c.n;
  x.alpha = c.options.alpha;
  x.fast_accumulation = fast_accumulation;
  x.what = [&c] { return c.what(); };

  const bool bias_native = bias && (bias_bf16 ? fp8 && out_bf16 : !fp8 && !out_bf16);
  if (direct_ok && (!bias || bias_native || !out_bf16)) {
    x.d = c.out.data();
    x.d_type = out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    x.beta = c.options.accumulate ? 1.0f : 0.0f;
    x.bias = bias_native ? bias : nullptr;
    x.bias_type = bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    x.device_scalars = device_scalars;
    if (cublaslt::matmul(x, &why) == cublaslt::Outcome::done) {
      if (bias && !bias_native)  // FP32 output: add the bias last, as the reference does
        gemm_kernels::add_bias_f32(static_cast<float*>(c.out.data()), f32_bias(c), c.m, c.n,
                                   c.options.stream);
      return cublaslt::Outcome::done;
    }
  }
  // The product in FP32, then the reference epilogue in one pass.
  x.d = scratch(c.device, c.options.stream, kSlotProduct,
                static_cast<std::size_t>(c.m * c.n) * sizeof(float));
  x.d_type = CUDA_R_32F;
  x.beta = 0.0f;
  x.bias = nullptr;
  x.device_scalars = device_scalars ? device_scalars + 2 : nullptr;
  if (cublaslt::matmul(x, &why) == cublaslt::Outcome::unsupported) return cublaslt::Outcome::unsupported;
  gemm_kernels::finish(c.out.data(), out_bf16, static_cast<const float*>(x.d), c.options.alpha,
                       c.options.accumulate, f32_bias(c), c.m, c.n, c.options.stream);
  return cublaslt::Outcome::done;
}

// ---------------------------------------------------------------- 4. paths

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

// Whether a direction's FP32 block scales are laid out as cuBLASLt reads them (the
// GEMM-ready layouts of docs/numerics.md, TransformerEngine's on Hopper), in the operand frame
// (o = block along the output dimension, kb = block along K):
//   1x128   (VEC128_32F):     scale(o, kb) at kb * ld + o, ld = outer ("outer-dim-major",
//                              ceil(K/128) x outer; outer is a multiple of 16 here)
//   128x128 (BLK128x128_32F): scale(ob, kb) at ob * ld + kb, ld = roundup(ceil(K/128), 4)
// The layout says where logical block (a, b) of the [rows, cols] tensor lives
// (scale_transposed: b * ld + a, else a * ld + b); rowwise (a, b) = (o, kb), columnwise (kb, o).
bool block_scales_fit(const qr_direction_data& dd, qr_direction direction, std::int64_t outer,
                      std::int64_t inner, bool blk128x128, std::string& why) {
  const qr_direction_layout& l = dd.layout;
  if (l.scale_dtype != QR_DTYPE_F32 || l.scale_ndim != 2 || dd.scale_inv.data == nullptr) {
    why = "block scales are not a 2-D FP32 buffer";
    return false;
  }
  const std::int64_t ld = l.scale_shape[1];
  const bool transposed = l.scale_transposed != 0;
  const bool rowwise = direction == QR_DIRECTION_ROWWISE;
  // Strides of (o, kb) in the stored buffer.
  const bool o_is_fast = rowwise ? transposed : !transposed;  // o stride 1, kb stride ld
  const std::int64_t kb = ceil_div(inner, 128), ob = ceil_div(outer, 128);
  bool ok;
  if (blk128x128)
    ok = !o_is_fast && ld == round_up(kb, 4) && l.scale_shape[0] >= ob;
  else
    ok = o_is_fast && ld == outer && l.scale_shape[0] >= kb;
  if (!ok) {
    std::ostringstream os;
    os << "scale buffer [" << l.scale_shape[0] << ", " << l.scale_shape[1] << "] (scale_transposed "
       << l.scale_transposed << ") is not the " << (blk128x128 ? "BLK128x128_32F" : "VEC128_32F")
       << " layout cuBLASLt reads";
    why = os.str();
  }
  return ok;
}

// A native FP8 operand: the stored data (K-major, the plan checked it) and its scales.
Op native_operand(const GemmOperand& g, const OperandTraits& t) {
  const qr_direction_data& dd = g.tensor->direction(g.direction);
  Op op;
  op.data = dd.data.data;
  op.type = cuda_type(t.data_dtype);
  op.k_major = true;
  op.outer = g.outer();
  op.inner = g.inner();
  op.scale = dd.scale_inv.data;
  if (t.scale_mode == QR_SCALE_TENSOR)
    op.scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  else
    op.scale_mode = t.block_outer == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                       : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  QR_CHECK_CODE(op.data != nullptr && op.scale != nullptr, QR_STATUS_INTERNAL, "native GEMM operand ",
                g.str(), " has no data or no scale_inv buffer");
  return op;
}

// Runs a pair the table marks native. Returns false (with why) when it must be emulated instead.
bool run_native(const Context& c, const GemmPlan& plan, const OperandTraits& ta,
                const OperandTraits& tb, std::string& why) {
  for (const auto* side : {&c.a, &c.b}) {
    const OperandTraits& t = side == &c.a ? ta : tb;
    if (t.scale_mode != QR_SCALE_BLOCK) continue;
    if (!block_scales_fit(side->tensor->direction(side->direction), side->direction, side->outer(),
                          side->inner(), t.block_outer == 128, why)) {
      why = side->str() + ": " + why;
      return false;
    }
  }
  const Op a = native_operand(c.a, ta), b = native_operand(c.b, tb);
  std::string status;
  if (run_product(c, a, b, plan.fast_accumulation, status) == cublaslt::Outcome::done) return true;
  why = "cuBLASLt (" + cublaslt::library_description() + ") has no algorithm for " + ta.str() +
        " x " + tb.str() + " -> " + std::string(dtype_name(c.out.dtype())) + " at " +
        std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + ": " + status;
  return false;
}

// ---- the emulated path
//
// Each operand goes to BF16 when every decoded value is exact there (gemm_cuda_kernels.hpp
// says which layouts the engine's decoders know and why each is exact), with what BF16 cannot
// carry (a per-tensor scale_inv, the tensor factor of a block-and-tensor scaled direction)
// moved into alpha, which then lives in device memory: the GEMM is alpha' * sum(a' b') with
// a' = a / factor_a, alpha' = alpha * factor_a * factor_b, within FP32-accumulation tolerance
// of the reference (which multiplies the factors into each decoded element). Exactness
// depends on the data only for FP8 codes with E8M0 or FP32 block scales: a tiny scale times a
// small code can fall below BF16's subnormal grid (2^-133), and a non-power-of-two FP32 scale
// gives products of up to 28 significant bits. For those operands the decoders test every
// value they write and, on a miss, set a device flag to this GEMM's epoch. Nothing waits for that flag on the host:
//   decode A and B (one launch; scalars and flag written on the device)
//   [accumulate only] copy the output aside if flagged (into a decoded operand's buffer,
//                     whose BF16 values no longer matter then)
//   the BF16 GEMM and its epilogue, as for exact operands
//   the exact GEMM if flagged: the whole output recomputed from the stored operands, each
//     element decoded as the reference does (factors included), FP32 accumulation, the
//     reference epilogue on the saved (or untouched) output
// so a GEMM of exact operands pays two short launches that return at once, and one with a
// miss gets the reference's result from a slower SIMT kernel. Everything else (a dense FP32
// operand, a layout the decoders do not know, a block-and-tensor scaled direction whose
// format gives no tensor_scale_numerator) takes the FP32 path: both operands decoded to FP32
// by their plugins' CUDA dequantize, then a cuBLASLt FP32 GEMM.

int log2_exact(std::int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int k = 0;
  while ((std::int64_t{1} << k) < v) ++k;
  return k;
}

// How one operand reaches BF16: not at all (ok false), as is (dense BF16), or through the
// engine decoder.
struct Bf16Plan {
  bool ok = false;
  bool dense = false;
  bool needs_check = false;
  gemm_kernels::StoredOperand stored;
  gemm_kernels::FactorSource factor;
};

Bf16Plan bf16_plan_of(const GemmOperand& g, const OperandTraits& t) {
  using gemm_kernels::BlockScale;
  using gemm_kernels::Code;
  Bf16Plan plan;
  if (!g.tensor) {
    plan.ok = plan.dense = g.high_precision.dtype() == DType::bf16;
    return plan;
  }
  const qr_direction_data& dd = g.tensor->direction(g.direction);
  const qr_direction_layout& l = dd.layout;
  gemm_kernels::StoredOperand& s = plan.stored;
  switch (l.data_dtype) {
    case QR_DTYPE_E4M3: s.code = Code::e4m3; break;
    case QR_DTYPE_E5M2: s.code = Code::e5m2; break;
    case QR_DTYPE_E2M1: s.code = Code::e2m1; break;
    default: return plan;
  }
  s.data = dd.data.data;
  s.rows = l.data_shape[0];
  s.cols = l.data_shape[1];
  // The stored array must be [outer, inner] (K-major) or [inner, outer], as the Op says.
  const bool k_major = t.inner_contiguous;
  if (l.data_ndim != 2 || s.rows != (k_major ? g.outer() : g.inner()) ||
      s.cols != (k_major ? g.inner() : g.outer()) || (s.data == nullptr && s.rows * s.cols != 0))
    return plan;
  const bool fp8 = s.code != Code::e2m1;
  if (l.scale_mode == QR_SCALE_TENSOR) {
    if (!fp8 || l.scale_dtype != QR_DTYPE_F32 || dd.scale_inv.data == nullptr) return plan;
    s.scale = BlockScale::none;
    plan.factor = {gemm_kernels::Factor::value, static_cast<const float*>(dd.scale_inv.data)};
    plan.ok = true;
    return plan;
  }
  if (l.scale_mode == QR_SCALE_BLOCK && fp8 && l.scale_dtype == QR_DTYPE_E8M0) {
    s.scale = BlockScale::e8m0;
    plan.needs_check = true;
  } else if (l.scale_mode == QR_SCALE_BLOCK && fp8 && l.scale_dtype == QR_DTYPE_F32) {
    s.scale = BlockScale::f32;
    plan.needs_check = true;
  } else if (l.scale_mode == QR_SCALE_BLOCK_TENSOR && !fp8 && l.scale_dtype == QR_DTYPE_E4M3 &&
             l.has_amax && dd.amax.data != nullptr) {
    // q * s exact in BF16; the tensor factor into alpha, as the owning format's descriptor
    // says (0: it gives none, and the operand takes the FP32 path through its dequantize).
    const float numerator = g.quantizer->direction_plugin(l).tensor_scale_numerator();
    if (numerator == 0.0f) return plan;
    s.scale = BlockScale::e4m3;
    plan.factor = {gemm_kernels::Factor::from_amax, static_cast<const float*>(dd.amax.data), numerator};
  } else {
    return plan;
  }
  const bool transposed = l.data_transposed != 0;
  const int bp = log2_exact(transposed ? l.block_cols : l.block_rows);
  const int bq = log2_exact(transposed ? l.block_rows : l.block_cols);
  if (bp < 0 || bq < 0 || l.scale_ndim != 2 || (dd.scale_inv.data == nullptr && s.rows * s.cols != 0))
    return plan;
  s.block_rows_log2 = bp;
  s.block_cols_log2 = bq;
  s.scales = dd.scale_inv.data;
  s.scale_ld = l.scale_shape[1];
  // The layout's scale_transposed is about logical blocks; in the stored frame a transposed
  // data array swaps the roles once more.
  s.scale_transposed = (l.scale_transposed != 0) != transposed;
  plan.ok = true;
  return plan;
}

// The operand as cuBLASLt reads it after the BF16 plan: dense data as is, or `buffer`.
Op bf16_operand(const GemmOperand& g, const OperandTraits& t, const void* data) {
  Op op;
  op.type = CUDA_R_16BF;
  op.data = data;
  op.outer = g.outer();
  op.inner = g.inner();
  op.k_major = g.tensor ? t.inner_contiguous : g.direction == QR_DIRECTION_ROWWISE;
  return op;
}

// One operand decoded (or converted) to FP32 on the device, as [rows, cols] row-major, by its
// quantizer's CUDA dequantize: the reference decode.
Op f32_operand(const Context& c, const GemmOperand& g, Slot slot) {
  Op op;
  op.type = CUDA_R_32F;
  op.k_major = g.direction == QR_DIRECTION_ROWWISE;
  op.outer = g.outer();
  op.inner = g.inner();
  const std::int64_t rows = g.rows(), cols = g.cols();
  if (g.tensor) {
    void* buffer = scratch(c.device, c.options.stream, slot, static_cast<std::size_t>(rows * cols) * 4);
    try {
      g.quantizer->dequantize(*g.tensor, g.direction,
                              TensorView(buffer, DType::f32, {rows, cols}, Device::cuda(c.device)),
                              c.options.stream);
    } catch (const Error& e) {
      if (e.code() != QR_STATUS_UNSUPPORTED) throw;
      QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "emulated GEMM ", c.what(), " decodes ", g.str(),
                    " on cuda:", c.device, " with its format's CUDA dequantize, which failed: ",
                    e.what(), ". A CUDA operand never falls back to the CPU: use a format whose "
                    "plugin supports cuda for GPU GEMMs, or run this GEMM on CPU tensors");
    }
    op.data = buffer;
    return op;
  }
  const TensorView& t = g.high_precision;
  QR_CHECK(t.is_contiguous(), "dense GEMM operand ", g.str(), " must be contiguous");
  QR_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "dense GEMM operand ", g.str(),
           " must be f32 or bf16");
  if (t.dtype() == DType::f32) {
    op.data = t.data();
    return op;
  }
  void* buffer = scratch(c.device, c.options.stream, slot, static_cast<std::size_t>(rows * cols) * 4);
  gemm_kernels::bf16_to_f32(static_cast<const std::uint16_t*>(t.data()), static_cast<float*>(buffer),
                            rows * cols, c.options.stream);
  op.data = buffer;
  return op;
}

void check_decoded_product(const Context& c, cublaslt::Outcome outcome, DType type, const std::string& status) {
  QR_CHECK_CODE(outcome == cublaslt::Outcome::done, QR_STATUS_DEVICE_ERROR, "cuBLASLt (",
                cublaslt::library_description(), ") has no ", dtype_name(type), " GEMM algorithm for ",
                c.what(), " (", status, "); this should not happen on a supported GPU");
}

// The exact GEMM's view of an operand of a BF16 plan (stored array, orientation, factor).
gemm_kernels::ExactOperand exact_operand(const GemmOperand& g, const OperandTraits& t, const Bf16Plan& p) {
  gemm_kernels::ExactOperand x;
  if (p.dense) {
    x.stored.data = g.high_precision.data();
    x.stored.code = gemm_kernels::Code::bf16;
    x.stored.rows = g.rows();
    x.stored.cols = g.cols();
    x.k_major = g.direction == QR_DIRECTION_ROWWISE;
    return x;
  }
  x.stored = p.stored;
  x.k_major = t.inner_contiguous;
  x.factor = p.factor;
  return x;
}

// The BF16 copy of a quantized operand kept with its tensor (QuantizedTensor::keeps_decoded;
// docs/gemm.md, "Decoded operands kept across GEMMs"): the kept one when it was written on this
// stream, else decoded now by the same decoder into memory from the tensor's allocator, with
// its own miss word (set by the check, as a GEMM's flag would be, with epoch 1), and kept.
DecodedCopy kept_bf16(const Context& c, const GemmOperand& g, const Bf16Plan& p) {
  const auto& st = p.stored;
  const std::size_t bytes = static_cast<std::size_t>(st.rows * st.cols) * 2;
  const Device device = Device::cuda(c.device);
  DecodedCopy copy = g.tensor->decoded(g.direction);
  if (copy.values && copy.dtype == DType::bf16 && copy.stream == c.options.stream &&
      copy.values->device() == device && copy.values->bytes() >= bytes && (copy.miss || !p.needs_check))
    return copy;
  const std::shared_ptr<Allocator> allocator = g.tensor->allocator() ? g.tensor->allocator() : cuda_allocator();
  copy = DecodedCopy{};
  copy.values = std::make_shared<Buffer>(allocator, bytes, device, Buffer::Fill::none);
  copy.dtype = DType::bf16;
  copy.stream = c.options.stream;
  gemm_kernels::ExactnessFlag own;
  if (p.needs_check) {
    copy.miss = std::make_shared<Buffer>(allocator, sizeof(std::uint32_t), device, Buffer::Fill::zero);
    own.word = static_cast<std::uint32_t*>(copy.miss->data());
    own.epoch = 1;
  }
  gemm_kernels::DecodeJob job;
  job.op = st;
  job.dst = static_cast<std::uint16_t*>(copy.values->data());
  job.check = p.needs_check;
  gemm_kernels::decode_to_bf16(&job, 1, gemm_kernels::Scalars{}, own, c.options.stream);
  g.tensor->keep_decoded(g.direction, copy);
  return copy;
}

// Emulated and dense GEMMs (CUBLAS_COMPUTE_32F, no TF32: the reference accumulates FP32 products
// of the decoded values). Returns the operand type and, in `note`, why FP32 when it is, or
// which operands the device checks.
DType run_decoded(const Context& c, const OperandTraits& ta, const OperandTraits& tb, std::string& note) {
  const Bf16Plan pa = bf16_plan_of(c.a, ta), pb = bf16_plan_of(c.b, tb);
  if (pa.ok && pb.ok) {
    void* stream = c.options.stream;
    const std::string what = c.what();
    float* small = nullptr;  // [alpha, beta, alpha, 0] then the flag word
    const bool check = pa.needs_check || pb.needs_check;
    const bool factors =
        pa.factor.kind != gemm_kernels::Factor::none || pb.factor.kind != gemm_kernels::Factor::none;
    if (check || factors) small = scalars_buffer(c.device, stream, what);
    gemm_kernels::ExactnessFlag flag;
    if (check) {
      flag.word = reinterpret_cast<std::uint32_t*>(small + 4);
      flag.epoch = next_epoch(c.device, stream, flag.word, what);
    }
    gemm_kernels::Scalars scalars;
    if (factors) {
      scalars.out = small;
      scalars.alpha = c.options.alpha;
      scalars.beta = c.options.accumulate ? 1.0f : 0.0f;
      scalars.factor[0] = pa.factor;
      scalars.factor[1] = pb.factor;
    }
    // An accumulating GEMM that may be redone keeps the output as it was in the first checked
    // operand's buffer (grown to hold it): its BF16 values are garbage once the flag is set.
    const bool save = check && c.options.accumulate;
    const std::size_t out_bytes = static_cast<std::size_t>(c.out.nbytes());
    const void* data[2] = {nullptr, nullptr};
    void* saved = nullptr;
    const Bf16Plan* plans[2] = {&pa, &pb};
    const GemmOperand* ops[2] = {&c.a, &c.b};
    gemm_kernels::DecodeJob jobs[2];
    DecodedCopy kept[2];  // held until the GEMM is enqueued
    const std::uint32_t* misses[2] = {nullptr, nullptr};
    int count = 0;
    for (int i = 0; i < 2; ++i) {
      if (plans[i]->dense) {
        data[i] = ops[i]->high_precision.data();
        continue;
      }
      if (plans[i]->needs_check)
        note += std::string(note.empty() ? "" : "; ") + "exactness of " + ops[i]->str() + " checked on the device";
      if (ops[i]->tensor->keeps_decoded()) {
        kept[i] = kept_bf16(c, *ops[i], *plans[i]);
        data[i] = kept[i].values->data();
        if (kept[i].miss) misses[i] = static_cast<const std::uint32_t*>(kept[i].miss->data());
        note += std::string(note.empty() ? "" : "; ") + ops[i]->str() + " decoded once and kept with its tensor";
        continue;
      }
      const auto& st = plans[i]->stored;
      std::size_t bytes = static_cast<std::size_t>(st.rows * st.cols) * 2;
      const bool save_here = save && saved == nullptr && plans[i]->needs_check;
      if (save_here) bytes = std::max(bytes, out_bytes);
      auto* buffer = static_cast<std::uint16_t*>(scratch(c.device, stream, i == 0 ? kSlotA : kSlotB, bytes));
      if (save_here) saved = buffer;
      jobs[count].op = st;
      jobs[count].dst = buffer;
      jobs[count].check = plans[i]->needs_check;
      ++count;
      data[i] = buffer;
    }
    if (save && saved == nullptr) saved = scratch(c.device, stream, kSlotSaved, out_bytes);
    gemm_kernels::decode_to_bf16(jobs, count, scalars, flag, stream);
    if (check) gemm_kernels::inherit_misses(misses[0], misses[1], flag, stream);
    if (save) gemm_kernels::copy_if_flagged(saved, c.out.data(), static_cast<std::int64_t>(out_bytes), flag, stream);
    const Op a = bf16_operand(c.a, ta, data[0]), b = bf16_operand(c.b, tb, data[1]);
    std::string status;
    check_decoded_product(c, run_product(c, a, b, false, status, factors ? small : nullptr), DType::bf16, status);
    if (check) {
      gemm_kernels::ExactGemm exact;
      exact.a = exact_operand(c.a, ta, pa);
      exact.b = exact_operand(c.b, tb, pb);
      exact.m = c.m;
      exact.n = c.n;
      exact.k = c.k;
      exact.alpha = c.options.alpha;
      exact.accumulate = c.options.accumulate;
      exact.old = saved;
      exact.bias = f32_bias(c);
      exact.out = c.out.data();
      exact.out_bf16 = c.out.dtype() == DType::bf16;
      gemm_kernels::exact_gemm_if_flagged(exact, flag, c.device, stream);
      note += "; a value BF16 cannot hold (a tiny or non-power-of-two block scale) makes the device recompute "
              "the output from FP32-decoded operands";
    }
    return DType::bf16;
  }
  for (const auto* p : {&pa, &pb})
    if (!p->ok) {
      const GemmOperand& g = p == &pa ? c.a : c.b;
      note += std::string(note.empty() ? "" : "; ") + g.str() +
              (g.tensor ? " has no BF16 decoder in the engine" : " is FP32");
    }
  const Op a = f32_operand(c, c.a, kSlotA), b = f32_operand(c, c.b, kSlotB);
  std::string status;
  check_decoded_product(c, run_product(c, a, b, false, status), DType::f32, status);
  return DType::f32;
}

void check_bias(const Context& c) {
  if (!c.options.bias) return;
  cudaPointerAttributes attr{};
  check_cuda(cudaPointerGetAttributes(&attr, c.options.bias), "cudaPointerGetAttributes", "the bias check");
  QR_CHECK((attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
               attr.device == c.device,
           "GEMM ", c.what(), ": the bias must be device memory on cuda:", c.device,
           " (FP32 or BF16, one value per output column) for a CUDA GEMM; got a ",
           attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeUnregistered
               ? "host pointer"
               : "pointer on cuda:" + std::to_string(attr.device));
}

std::string describe(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                     const GemmOptions& o) {
  std::ostringstream os;
  if (o.kind) os << gemm_kind_name(*o.kind) << " ";
  os << a.str() << " x " << b.str() << " -> " << dtype_name(out.dtype()) << " [" << out.rows() << "x"
     << out.cols() << "]";
  return os.str();
}

std::string Context::what() const { return describe(a, b, out, options); }

}  // namespace

// ---------------------------------------------------------------- 5. entry

GemmPlan gemm_cuda(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                   const GemmOptions& options) {
  Context c{a, b, out, options};
  c.device = out.device().index;
  c.m = a.outer();
  c.n = b.outer();
  c.k = a.inner();
  QR_CHECK(!a.is_quantized() || a.quantizer, "quantized GEMM operand ", a.str(), " needs its quantizer");
  QR_CHECK(!b.is_quantized() || b.quantizer, "quantized GEMM operand ", b.str(), " needs its quantizer");

  const OperandTraits ta = traits_of(a), tb = traits_of(b);
  // Without a kind the accumulation is split (the accurate choice): only fprop is fast.
  GemmPlan plan = plan_gemm(options.kind.value_or(GemmKind::wgrad), ta, tb, GemmTarget::sm90, c.m,
                            c.n, c.k);
  DeviceGuard guard(c.device, "a GEMM");
  check_bias(c);
  if (c.m == 0 || c.n == 0) return plan;
  if (c.k == 0) {  // an empty sum: only the epilogue
    gemm_kernels::finish(out.data(), out.dtype() == DType::bf16, nullptr, options.alpha,
                         options.accumulate, f32_bias(c), c.m, c.n, options.stream);
    return plan;
  }
  if (plan.path == GemmPlan::Path::native) {
    std::string why;
    if (run_native(c, plan, ta, tb, why)) return plan;
    plan = {GemmPlan::Path::emulated, false, why + "; emulated instead"};
  }
  std::string note;
  const DType decoded = run_decoded(c, ta, tb, note);
  plan.reason += std::string(plan.reason.empty() ? "" : "; ") + "operands " +
                 (plan.path == GemmPlan::Path::dense ? "as " : "decoded to ") +
                 std::string(dtype_name(decoded)) + " on cuda:" + std::to_string(c.device) +
                 ", FP32 accumulation" + (note.empty() ? "" : " (" + note + ")");
  return plan;
}

}  // namespace qrecipe::detail
