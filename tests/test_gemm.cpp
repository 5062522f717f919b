// GEMM: the CPU reference product, the epilogue, shape checks, the pairing table of
// docs/gemm.md, and the three GEMMs of a linear layer on quantized operands against FP64.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"
#include "qrecipe/scaling.hpp"

using namespace qrecipe;

namespace {

std::vector<float> random_normal(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// FP64 product of [m, k] x [n, k]^T (both inner contiguous).
std::vector<double> product_f64(const std::vector<float>& a, const std::vector<float>& b,
                                std::int64_t m, std::int64_t n, std::int64_t k) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t r = 0; r < k; ++r) s += static_cast<double>(a[i * k + r]) * b[j * k + r];
      out[i * n + j] = s;
    }
  return out;
}

// FP32 accumulation of k products: |error| <= k * eps32 * sum |a||b| (a standard bound; the
// factor k is generous for the blocked 8-lane summation we use).
double fp32_accumulation_bound(const std::vector<float>& a, const std::vector<float>& b,
                               std::int64_t i, std::int64_t j, std::int64_t k) {
  double s = 0;
  for (std::int64_t r = 0; r < k; ++r) s += std::fabs(static_cast<double>(a[i * k + r]) * b[j * k + r]);
  return static_cast<double>(k) * 5.96e-8 * s + 1e-30;
}

std::vector<float> transpose(const std::vector<float>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

std::shared_ptr<Registry> registry() { return Registry::shared(); }

}  // namespace

TEST_CASE("reference_gemm_f32 matches FP64 within the FP32 accumulation bound") {
  for (auto [m, n, k] : {std::array<std::int64_t, 3>{1, 1, 1}, {3, 5, 7}, {17, 33, 129},
                         {64, 48, 1000}, {300, 200, 150}}) {
    const auto a = random_normal(static_cast<std::size_t>(m * k), 1);
    const auto b = random_normal(static_cast<std::size_t>(n * k), 2);
    std::vector<float> out(static_cast<std::size_t>(m * n));
    reference_gemm_f32(a.data(), b.data(), out.data(), m, n, k);
    const auto want = product_f64(a, b, m, n, k);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        REQUIRE(std::fabs(out[i * n + j] - want[i * n + j]) <= fp32_accumulation_bound(a, b, i, j, k));
  }
}

TEST_CASE("reference GEMM is deterministic and independent of the thread split") {
  const std::int64_t m = 256, n = 256, k = 256;  // large enough to use threads
  const auto a = random_normal(static_cast<std::size_t>(m * k), 3);
  const auto b = random_normal(static_cast<std::size_t>(n * k), 4);
  std::vector<float> big(static_cast<std::size_t>(m * n)), row(static_cast<std::size_t>(n));
  reference_gemm_f32(a.data(), b.data(), big.data(), m, n, k);
  for (std::int64_t i : {0, 77, 255}) {  // one row at a time runs single-threaded
    reference_gemm_f32(a.data() + i * k, b.data(), row.data(), 1, n, k);
    for (std::int64_t j = 0; j < n; ++j) REQUIRE(row[j] == big[i * n + j]);
  }
}

TEST_CASE("dense operands in every direction combination") {
  const std::int64_t m = 9, n = 7, k = 13;
  const auto a = random_normal(static_cast<std::size_t>(m * k), 5);  // [m, k]
  const auto b = random_normal(static_cast<std::size_t>(n * k), 6);  // [n, k]
  const auto want = product_f64(a, b, m, n, k);
  auto at = transpose(a, m, k);  // [k, m]
  auto bt = transpose(b, n, k);  // [k, n]
  auto a_copy = a;
  auto b_copy = b;
  struct Combo {
    GemmOperand A, B;
  };
  const Combo combos[] = {
      {GemmOperand::dense(TensorView(a_copy.data(), DType::f32, {m, k}), QR_DIRECTION_ROWWISE),
       GemmOperand::dense(TensorView(b_copy.data(), DType::f32, {n, k}), QR_DIRECTION_ROWWISE)},
      {GemmOperand::dense(TensorView(at.data(), DType::f32, {k, m}), QR_DIRECTION_COLUMNWISE),
       GemmOperand::dense(TensorView(b_copy.data(), DType::f32, {n, k}), QR_DIRECTION_ROWWISE)},
      {GemmOperand::dense(TensorView(a_copy.data(), DType::f32, {m, k}), QR_DIRECTION_ROWWISE),
       GemmOperand::dense(TensorView(bt.data(), DType::f32, {k, n}), QR_DIRECTION_COLUMNWISE)},
      {GemmOperand::dense(TensorView(at.data(), DType::f32, {k, m}), QR_DIRECTION_COLUMNWISE),
       GemmOperand::dense(TensorView(bt.data(), DType::f32, {k, n}), QR_DIRECTION_COLUMNWISE)},
  };
  for (const auto& c : combos) {
    std::vector<float> out(static_cast<std::size_t>(m * n));
    gemm(c.A, c.B, TensorView(out.data(), DType::f32, {m, n}));
    for (std::int64_t i = 0; i < m * n; ++i) CHECK(std::fabs(out[i] - want[i]) < 1e-4);
  }
}

TEST_CASE("epilogue: alpha, accumulate, bias, bf16 output") {
  const std::int64_t m = 4, n = 3, k = 5;
  auto a = random_normal(static_cast<std::size_t>(m * k), 7);
  auto b = random_normal(static_cast<std::size_t>(n * k), 8);
  const auto want = product_f64(a, b, m, n, k);
  const auto A = GemmOperand::dense(TensorView(a.data(), DType::f32, {m, k}), QR_DIRECTION_ROWWISE);
  const auto B = GemmOperand::dense(TensorView(b.data(), DType::f32, {n, k}), QR_DIRECTION_ROWWISE);
  std::vector<float> out(static_cast<std::size_t>(m * n), 1.0f);
  const float bias[3] = {10.0f, 20.0f, 30.0f};
  GemmOptions o;
  o.alpha = 0.5f;
  o.accumulate = true;
  o.bias = bias;
  gemm(A, B, TensorView(out.data(), DType::f32, {m, n}), o);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      CHECK(out[i * n + j] == doctest::Approx(0.5 * want[i * n + j] + 1.0 + bias[j]).epsilon(1e-5));
  std::vector<std::uint16_t> out16(static_cast<std::size_t>(m * n));
  gemm(A, B, TensorView(out16.data(), DType::bf16, {m, n}));
  std::vector<float> out32(static_cast<std::size_t>(m * n));
  gemm(A, B, TensorView(out32.data(), DType::f32, {m, n}));
  for (std::int64_t i = 0; i < m * n; ++i) CHECK(out16[i] == num::f32_to_bf16(out32[i]));
}

TEST_CASE("a BF16 bias gives the numbers of its FP32 copy; other bias dtypes are rejected") {
  const std::int64_t m = 5, n = 7, k = 9;
  auto a = random_normal(static_cast<std::size_t>(m * k), 17);
  auto b = random_normal(static_cast<std::size_t>(n * k), 18);
  const auto A = GemmOperand::dense(TensorView(a.data(), DType::f32, {m, k}), QR_DIRECTION_ROWWISE);
  const auto B = GemmOperand::dense(TensorView(b.data(), DType::f32, {n, k}), QR_DIRECTION_ROWWISE);
  std::vector<std::uint16_t> bias16(static_cast<std::size_t>(n));
  std::vector<float> bias32(static_cast<std::size_t>(n));
  const auto values = random_normal(static_cast<std::size_t>(n), 19);
  for (std::size_t j = 0; j < bias16.size(); ++j) {
    bias16[j] = num::f32_to_bf16(values[j] * 3.0f);
    bias32[j] = num::bf16_to_f32(bias16[j]);
  }
  for (const DType out_dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(out_dtype));
    std::vector<float> with16(static_cast<std::size_t>(m * n)), with32(with16.size());
    GemmOptions o16, o32;
    o16.bias = bias16.data();
    o16.bias_dtype = DType::bf16;
    o32.bias = bias32.data();
    gemm(A, B, TensorView(with16.data(), out_dtype, {m, n}), o16);
    gemm(A, B, TensorView(with32.data(), out_dtype, {m, n}), o32);
    const std::size_t bytes = static_cast<std::size_t>(m * n * dtype_bits(out_dtype) / 8);
    CHECK(std::memcmp(with16.data(), with32.data(), bytes) == 0);
  }
  std::vector<float> out(static_cast<std::size_t>(m * n));
  GemmOptions bad;
  bad.bias = bias16.data();
  bad.bias_dtype = DType::f16;
  CHECK_THROWS_WITH_AS(gemm(A, B, TensorView(out.data(), DType::f32, {m, n}), bad),
                       doctest::Contains("GEMM bias must be f32 or bf16, got f16"), Error);
}

TEST_CASE("shape and device errors name the operands") {
  std::vector<float> a(12), b(12), out(16);
  const auto A = GemmOperand::dense(TensorView(a.data(), DType::f32, {3, 4}), QR_DIRECTION_ROWWISE);
  const auto B = GemmOperand::dense(TensorView(b.data(), DType::f32, {4, 3}), QR_DIRECTION_ROWWISE);
  CHECK_THROWS_WITH_AS(gemm(A, B, TensorView(out.data(), DType::f32, {3, 4})),
                       doctest::Contains("contraction mismatch"), Error);
  const auto B2 = GemmOperand::dense(TensorView(b.data(), DType::f32, {3, 4}), QR_DIRECTION_ROWWISE);
  CHECK_THROWS_WITH_AS(gemm(A, B2, TensorView(out.data(), DType::f32, {4, 4})),
                       doctest::Contains("give 3x3"), Error);
  const auto Agpu = GemmOperand::dense(TensorView(a.data(), DType::f32, {3, 4}, Device::cuda(0)),
                                       QR_DIRECTION_ROWWISE);
  try {
    gemm(Agpu, B2, TensorView(out.data(), DType::f32, {3, 3}));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(e.what()).find("never falls back") != std::string::npos);
  }
}

namespace {
OperandTraits fp8_tensor(qr_dtype dt) {
  OperandTraits t;
  t.format = "float8";
  t.data_dtype = dt;
  t.scale_mode = QR_SCALE_TENSOR;
  return t;
}
OperandTraits fp8_blocks(int outer, int inner) {
  OperandTraits t;
  t.format = "blockwise";
  t.data_dtype = QR_DTYPE_E4M3;
  t.scale_mode = QR_SCALE_BLOCK;
  t.scale_dtype = QR_DTYPE_F32;
  t.block_outer = outer;
  t.block_inner = inner;
  return t;
}
OperandTraits mx(qr_dtype dt = QR_DTYPE_E4M3) {
  OperandTraits t;
  t.format = "mxfp8";
  t.data_dtype = dt;
  t.scale_mode = QR_SCALE_BLOCK;
  t.scale_dtype = QR_DTYPE_E8M0;
  t.block_inner = 32;
  return t;
}
using P = GemmPlan::Path;
}  // namespace

TEST_CASE("pairing table on Hopper (docs/gemm.md)") {
  const auto sm90 = GemmTarget::sm90;
  const auto e4 = fp8_tensor(QR_DTYPE_E4M3), e5 = fp8_tensor(QR_DTYPE_E5M2);
  auto fp = plan_gemm(GemmKind::fprop, e4, e4, sm90, 64, 64, 64);
  CHECK(fp.path == P::native);
  CHECK(fp.fast_accumulation);
  auto dg = plan_gemm(GemmKind::dgrad, e5, e4, sm90, 64, 64, 64);
  CHECK(dg.path == P::native);
  CHECK_FALSE(dg.fast_accumulation);
  CHECK(plan_gemm(GemmKind::wgrad, e4, e5, sm90, 64, 64, 64).path == P::native);
  CHECK(plan_gemm(GemmKind::wgrad, e5, e5, sm90, 64, 64, 64).path == P::emulated);
  // Blockwise: 1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128 native; 128x128 x 128x128 not.
  CHECK(plan_gemm(GemmKind::fprop, fp8_blocks(1, 128), fp8_blocks(128, 128), sm90, 256, 256, 256).path == P::native);
  CHECK(plan_gemm(GemmKind::fprop, fp8_blocks(128, 128), fp8_blocks(1, 128), sm90, 256, 256, 256).path == P::native);
  CHECK(plan_gemm(GemmKind::wgrad, fp8_blocks(1, 128), fp8_blocks(1, 128), sm90, 256, 256, 256).path == P::native);
  CHECK_FALSE(plan_gemm(GemmKind::wgrad, fp8_blocks(1, 128), fp8_blocks(1, 128), sm90, 256, 256, 256).fast_accumulation);
  CHECK(plan_gemm(GemmKind::fprop, fp8_blocks(128, 128), fp8_blocks(128, 128), sm90, 256, 256, 256).path == P::emulated);
  // MXFP8 / NVFP4 / mixed formats: emulated, never an error.
  const auto mxp = plan_gemm(GemmKind::fprop, mx(), mx(), sm90, 256, 256, 256);
  CHECK(mxp.path == P::emulated);
  CHECK(mxp.reason.find("Hopper has no tensor cores for E8M0-scaled or E2M1 operands") !=
        std::string::npos);
  CHECK(plan_gemm(GemmKind::fprop, e4, mx(), sm90, 256, 256, 256).path == P::emulated);
  CHECK(plan_gemm(GemmKind::fprop, e4, fp8_blocks(1, 128), sm90, 256, 256, 256).path == P::emulated);
  // Shapes not divisible by 16, and non-K-major data, are emulated.
  CHECK(plan_gemm(GemmKind::fprop, e4, e4, sm90, 64, 64, 72 + 1).path == P::emulated);
  auto not_kmajor = e4;
  not_kmajor.inner_contiguous = false;
  CHECK(plan_gemm(GemmKind::fprop, not_kmajor, e4, sm90, 64, 64, 64).path == P::emulated);
  // Dense and half-dense.
  const auto bf16 = OperandTraits::high_precision(DType::bf16);
  CHECK(plan_gemm(GemmKind::fprop, bf16, bf16, sm90, 64, 64, 64).path == P::dense);
  CHECK(plan_gemm(GemmKind::fprop, bf16, e4, sm90, 64, 64, 64).path == P::emulated);
  // On the CPU every quantized GEMM is the reference.
  CHECK(plan_gemm(GemmKind::fprop, e4, e4, GemmTarget::cpu, 64, 64, 64).path == P::reference);
  CHECK(plan_gemm(GemmKind::fprop, bf16, bf16, GemmTarget::cpu, 64, 64, 64).path == P::dense);
}

// The GPU GEMM decodes a QR_SCALE_BLOCK_TENSOR direction itself: (code * block scale) *
// tensor_decode_factor(amax, numerator), the numerator being the owning format's descriptor
// field tensor_scale_numerator (plugin_abi.h), found through Quantizer::direction_plugin. That
// decode must be the plugin's dequantize bit for bit, for every such direction of every
// shipped recipe (a sub-format's direction inside a composite format included).
TEST_CASE("block-and-tensor directions decode with their format's tensor_scale_numerator as "
          "their dequantize does") {
  const char* root = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_SOURCE_DIR is not set (run through ctest)");
  auto reg = registry();
  const std::int64_t rows = 48, cols = 80;  // several 16-element blocks per row and column
  std::vector<std::uint16_t> src(static_cast<std::size_t>(rows * cols));
  const auto normal = random_normal(src.size(), 31, 3.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = num::f32_to_bf16(normal[i]);
  int checked = 0, through_sub_format = 0;
  for (const char* name : {"default", "float8_delayed", "mxfp8", "nvfp4", "blockwise",
                           "hybrid_seed", "hybrid_fp8_mx"}) {
    Engine engine(Recipe::load(std::string(root) + "/recipes/" + name + ".yaml"), reg);
    for (const char* tensor_type : {"input", "weight", "grad_output"}) {
      const auto q = engine.resolve({"linear", tensor_type, "layers.0.fc1"});
      if (!q) continue;
      const auto t = q->quantize(TensorView(src.data(), DType::bf16, {rows, cols}),
                                 QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
      for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
        const qr_direction_layout& l = t.layout(d);
        const FormatPlugin& owner = q->direction_plugin(l);
        CHECK(owner.name() == l.format);
        if (l.scale_mode != QR_SCALE_BLOCK_TENSOR) continue;
        CAPTURE(std::string(name) + " " + tensor_type + " " + direction_name(d));
        // The engine's decoder knows E2M1 data with E4M3 block scales and one FP32 amax.
        REQUIRE(l.data_dtype == QR_DTYPE_E2M1);
        REQUIRE(l.scale_dtype == QR_DTYPE_E4M3);
        REQUIRE(t.has_amax(d));
        const float numerator = owner.tensor_scale_numerator();
        REQUIRE(numerator > 0.0f);
        const float factor = tensor_decode_factor(t.amax(d), numerator);
        const auto* data = static_cast<const std::uint8_t*>(t.direction(d).data.data);
        const auto* scales = static_cast<const std::uint8_t*>(t.direction(d).scale_inv.data);
        const std::int64_t row_bytes = (l.data_shape[1] + 1) / 2;
        const Tensor reference = q->dequantize(t, d);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < cols; ++c) {
            const std::int64_t p = l.data_transposed ? c : r, s = l.data_transposed ? r : c;
            const std::uint8_t byte = data[p * row_bytes + s / 2];
            const float code = num::e2m1_to_f32((s & 1) ? byte >> 4 : byte & 0xF);
            const std::int64_t bi = r / l.block_rows, bj = c / l.block_cols;
            const float block = num::e4m3_to_f32(
                scales[l.scale_transposed ? bj * l.scale_shape[1] + bi : bi * l.scale_shape[1] + bj]);
            const float engine_decode = (code * block) * factor;
            const float plugin_decode = reference.data_as<float>()[r * cols + c];
            REQUIRE(num::float_bits(engine_decode) == num::float_bits(plugin_decode));
          }
        ++checked;
        if (owner.name() != q->format()) ++through_sub_format;
      }
    }
  }
  if (!reg->find("nvfp4")) {
    MESSAGE("not supported: no plugin with block-and-tensor directions built");
    return;
  }
  // nvfp4.yaml: 3 tensors x 2 directions; hybrid_seed: nvfp4 columnwise sides of input and
  // grad_output.
  CHECK(checked >= 6);
  if (reg->find("hybrid")) CHECK(through_sub_format >= 2);
  CHECK(reg->get("nvfp4").tensor_scale_numerator() == 448.0f * 6.0f);
  for (const char* other : {"float8", "mxfp8", "blockwise", "hybrid"})
    if (auto p = reg->find(other)) CHECK(p->tensor_scale_numerator() == 0.0f);
}

TEST_CASE("OperandTraits reads block geometry along the contraction from the layout") {
  qr_direction_layout l{};
  l.struct_size = sizeof l;
  l.format = "blockwise";
  l.data_dtype = QR_DTYPE_E4M3;
  l.scale_mode = QR_SCALE_BLOCK;
  l.scale_dtype = QR_DTYPE_F32;
  l.block_rows = 128;  // a columnwise 1x128 direction: blocks of 128 rows down a column
  l.block_cols = 1;
  l.data_transposed = 1;
  const auto t = OperandTraits::of(l, QR_DIRECTION_COLUMNWISE);
  CHECK(t.block_inner == 128);
  CHECK(t.block_outer == 1);
  CHECK(t.inner_contiguous);
  const auto r = OperandTraits::of(l, QR_DIRECTION_ROWWISE);
  CHECK_FALSE(r.inner_contiguous);
}

TEST_CASE("linear layer fprop/dgrad/wgrad on float8 operands equal FP64 on the decoded operands") {
  auto reg = registry();
  if (!reg->find("float8")) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  const Recipe recipe = Recipe::parse(R"(
version: 1
name: gemm-test
rules:
  - match: {tensor_type: [input, weight]}
    quantizer: {format: float8, scaling: current, dtype: e4m3}
  - match: {tensor_type: grad_output}
    quantizer: {format: float8, scaling: current, dtype: e5m2}
)");
  Engine engine(recipe, reg);
  const std::int64_t M = 24, K = 40, N = 16;  // tokens, in, out
  auto x = random_normal(static_cast<std::size_t>(M * K), 11);
  auto w = random_normal(static_cast<std::size_t>(N * K), 12, 0.1f);
  auto dy = random_normal(static_cast<std::size_t>(M * N), 13, 0.01f);
  const auto qx = engine.resolve({"linear", "input", "l"});
  const auto qw = engine.resolve({"linear", "weight", "l"});
  const auto qdy = engine.resolve({"linear", "grad_output", "l"});
  const auto both = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
  const auto tx = qx->quantize(TensorView(x.data(), DType::f32, {M, K}), both);
  const auto tw = qw->quantize(TensorView(w.data(), DType::f32, {N, K}), both);
  const auto tdy = qdy->quantize(TensorView(dy.data(), DType::f32, {M, N}), both);
  const auto dx_ = qx->dequantize(tx, QR_DIRECTION_ROWWISE);
  const auto dw_ = qw->dequantize(tw, QR_DIRECTION_ROWWISE);
  const auto ddy_ = qdy->dequantize(tdy, QR_DIRECTION_ROWWISE);
  auto vec = [](const Tensor& t) { return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel()); };
  const auto X = vec(dx_), W = vec(dw_), DY = vec(ddy_);
  auto check = [&](const std::vector<float>& got, const std::vector<float>& a,
                   const std::vector<float>& b, std::int64_t m, std::int64_t n, std::int64_t k) {
    const auto want = product_f64(a, b, m, n, k);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        REQUIRE(std::fabs(got[i * n + j] - want[i * n + j]) <= fp32_accumulation_bound(a, b, i, j, k));
  };
  std::vector<float> y(static_cast<std::size_t>(M * N)), dx(static_cast<std::size_t>(M * K)),
      dw(static_cast<std::size_t>(N * K));
  gemm(GemmOperand::quantized(tx, *qx, QR_DIRECTION_ROWWISE),
       GemmOperand::quantized(tw, *qw, QR_DIRECTION_ROWWISE), TensorView(y.data(), DType::f32, {M, N}));
  check(y, X, W, M, N, K);
  gemm(GemmOperand::quantized(tdy, *qdy, QR_DIRECTION_ROWWISE),
       GemmOperand::quantized(tw, *qw, QR_DIRECTION_COLUMNWISE), TensorView(dx.data(), DType::f32, {M, K}));
  check(dx, DY, transpose(W, N, K), M, K, N);
  gemm(GemmOperand::quantized(tdy, *qdy, QR_DIRECTION_COLUMNWISE),
       GemmOperand::quantized(tx, *qx, QR_DIRECTION_COLUMNWISE), TensorView(dw.data(), DType::f32, {N, K}));
  check(dw, transpose(DY, M, N), transpose(X, M, K), N, K, M);
  // And the quantized product is close to the unquantized one (FP8 error, loose).
  const auto exact = product_f64(x, w, M, N, K);
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    err += (y[i] - exact[i]) * (y[i] - exact[i]);
    ref += exact[i] * exact[i];
  }
  CHECK(std::sqrt(err / ref) < 0.1);
}

TEST_CASE("plan_linear reports GEMM paths and rejects roles that cannot serve a GEMM") {
  auto reg = registry();
  if (!reg->find("float8")) {
    MESSAGE("not supported: float8 plugin not built");
    return;
  }
  Engine engine(Recipe::parse(R"(
version: 1
rules:
  - match: {name: "fp8.*"}
    quantizer: {format: float8}
)"),
                reg);
  const auto p = engine.plan_linear("linear", "fp8.fc1", 256, 512, 1024, GemmTarget::sm90);
  CHECK(p.fprop.plan.path == P::native);
  CHECK(p.fprop.plan.fast_accumulation);
  CHECK(p.dgrad.plan.path == P::native);  // grad_output e5m2 x weight e4m3
  CHECK(p.wgrad.plan.path == P::native);
  CHECK(p.fprop.m == 1024);
  CHECK(p.fprop.n == 512);
  CHECK(p.fprop.k == 256);
  CHECK(p.dgrad.n == 256);
  CHECK(p.wgrad.m == 512);
  CHECK(p.wgrad.k == 1024);
  const auto hp = engine.plan_linear("linear", "other", 256, 512, 1024, GemmTarget::sm90);
  CHECK(hp.input_q == nullptr);
  CHECK(hp.fprop.plan.path == P::dense);
  CHECK_THROWS_AS(engine.plan_linear("linear", "x", 0, 512, 1024, GemmTarget::cpu), Error);
}

TEST_CASE("every shipped recipe: the three GEMMs equal FP64 on the decoded operands") {
  const char* root = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_SOURCE_DIR is not set (run through ctest)");
  auto reg = registry();
  const std::int64_t M = 32, K = 48, N = 32;  // tokens (multiple of 16 for Hadamard), in, out
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<std::uint16_t> b(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) b[i] = num::f32_to_bf16(v[i]);
    return b;
  };
  auto x = to_bf16(random_normal(static_cast<std::size_t>(M * K), 21));
  auto w = to_bf16(random_normal(static_cast<std::size_t>(N * K), 22, 0.1f));
  auto dy = to_bf16(random_normal(static_cast<std::size_t>(M * N), 23, 0.01f));
  for (const char* name : {"default", "float8_delayed", "mxfp8", "nvfp4", "blockwise", "hybrid_seed",
                           "hybrid_fp8_mx"}) {
    CAPTURE(std::string(name));
    Engine engine(Recipe::load(std::string(root) + "/recipes/" + name + ".yaml"), reg);
    const auto qx = engine.resolve({"linear", "input", "layers.0.fc1"});
    const auto qw = engine.resolve({"linear", "weight", "layers.0.fc1"});
    const auto qdy = engine.resolve({"linear", "grad_output", "layers.0.fc1"});
    REQUIRE((qx && qw && qdy));
    const auto both = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
    const auto tx = qx->quantize(TensorView(x.data(), DType::bf16, {M, K}), both);
    const auto tw = qw->quantize(TensorView(w.data(), DType::bf16, {N, K}), both);
    const auto tdy = qdy->quantize(TensorView(dy.data(), DType::bf16, {M, N}), both);
    // Decoded operands, each in the direction its GEMM reads, as [outer, inner].
    auto decoded = [](const Quantizer& q, const QuantizedTensor& t, qr_direction d) {
      const Tensor f = q.dequantize(t, d);
      std::vector<float> v(f.data_as<float>(), f.data_as<float>() + f.numel());
      return d == QR_DIRECTION_ROWWISE ? v : transpose(v, t.rows(), t.cols());
    };
    struct G {
      const Quantizer& qa; const QuantizedTensor& ta; qr_direction da;
      const Quantizer& qb; const QuantizedTensor& tb; qr_direction db;
    };
    const auto R = QR_DIRECTION_ROWWISE, C = QR_DIRECTION_COLUMNWISE;
    const G gemms[] = {{*qx, tx, R, *qw, tw, R}, {*qdy, tdy, R, *qw, tw, C}, {*qdy, tdy, C, *qx, tx, C}};
    for (const auto& g : gemms) {
      const auto A = GemmOperand::quantized(g.ta, g.qa, g.da);
      const auto B = GemmOperand::quantized(g.tb, g.qb, g.db);
      const std::int64_t m = A.outer(), n = B.outer(), k = A.inner();
      std::vector<float> out(static_cast<std::size_t>(m * n));
      gemm(A, B, TensorView(out.data(), DType::f32, {m, n}));
      const auto a = decoded(g.qa, g.ta, g.da), b = decoded(g.qb, g.tb, g.db);
      const auto want = product_f64(a, b, m, n, k);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          REQUIRE(std::fabs(out[i * n + j] - want[i * n + j]) <= fp32_accumulation_bound(a, b, i, j, k));
    }
  }
}
