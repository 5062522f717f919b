// Decoded copies kept with a quantized tensor (QuantizedTensor::keeps_decoded; docs/gemm.md,
// "Decoded operands kept across GEMMs"): GEMMs that reuse them give the results of GEMMs that
// decode again, bit for bit; every change of the bytes through the engine drops them; keeping
// is off by default and turning it off drops what is kept. The CPU back end keeps the
// reference decode (FP32); tests/gpu/test_gpu_gemm.cpp checks the CUDA back end's BF16 copies.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"

using namespace qrecipe;

namespace {

std::vector<float> random_normal(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Recipe recipe_for(const std::string& weight_quantizer) {
  return Recipe::parse("version: 1\nname: decoded-copies\ndefaults: {format: none}\nrules:\n"
                       "  - match: {tensor_type: [input, weight, grad_output]}\n    quantizer: " +
                       weight_quantizer + "\n");
}

}  // namespace

TEST_CASE("kept decoded copies give the GEMMs of fresh decodes, bit for bit, and never go stale") {
  auto reg = Registry::shared();
  for (const std::string quantizer : {"{format: mxfp8, dtype: e4m3}", "{format: nvfp4}",
                                      "{format: float8, scaling: current, dtype: e4m3}"}) {
    CAPTURE(quantizer);
    const std::string format = quantizer.substr(9, quantizer.find_first_of(",}") - 9);
    if (!reg->find(format)) {
      MESSAGE("not supported: ", format, " plugin not built");
      continue;
    }
    Engine engine(recipe_for(quantizer), reg);
    // Odd extents: a partial block along both dimensions.
    const std::int64_t M = 40, K = 96, N = 48;
    auto x = random_normal(static_cast<std::size_t>(M * K), 21, 1.0f);
    auto w = random_normal(static_cast<std::size_t>(N * K), 22, 0.1f);
    auto dy = random_normal(static_cast<std::size_t>(M * N), 23, 0.01f);
    const auto qx = engine.resolve({"linear", "input", "l"});
    const auto qw = engine.resolve({"linear", "weight", "l"});
    const auto qdy = engine.resolve({"linear", "grad_output", "l"});
    const auto both = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
    const auto tx = qx->quantize(TensorView(x.data(), DType::f32, {M, K}), QR_USAGE_ROWWISE);
    const auto tdy = qdy->quantize(TensorView(dy.data(), DType::f32, {M, N}), QR_USAGE_ROWWISE);
    auto plain = qw->quantize(TensorView(w.data(), DType::f32, {N, K}), both);
    auto kept = qw->quantize(TensorView(w.data(), DType::f32, {N, K}), both);
    CHECK_FALSE(kept.keeps_decoded());  // off by default
    kept.set_keep_decoded(true);

    // fprop y = x W^T and dgrad dx = dy W, each three times (micro-batches).
    auto fprop = [&](const QuantizedTensor& t) {
      std::vector<float> y(static_cast<std::size_t>(M * N));
      gemm(GemmOperand::quantized(tx, *qx, QR_DIRECTION_ROWWISE),
           GemmOperand::quantized(t, *qw, QR_DIRECTION_ROWWISE), TensorView(y.data(), DType::f32, {M, N}));
      return y;
    };
    auto dgrad = [&](const QuantizedTensor& t) {
      std::vector<float> dx(static_cast<std::size_t>(M * K));
      gemm(GemmOperand::quantized(tdy, *qdy, QR_DIRECTION_ROWWISE),
           GemmOperand::quantized(t, *qw, QR_DIRECTION_COLUMNWISE), TensorView(dx.data(), DType::f32, {M, K}));
      return dx;
    };
    const auto y_ref = fprop(plain), dx_ref = dgrad(plain);
    CHECK_FALSE(plain.decoded(QR_DIRECTION_ROWWISE).values);  // nothing kept when off
    for (int micro = 0; micro < 3; ++micro) {
      CHECK(same_bits(fprop(kept), y_ref));
      REQUIRE(kept.decoded(QR_DIRECTION_ROWWISE).values);
      CHECK(kept.decoded(QR_DIRECTION_ROWWISE).dtype == DType::f32);
      CHECK(same_bits(dgrad(kept), dx_ref));
      REQUIRE(kept.decoded(QR_DIRECTION_COLUMNWISE).values);
    }
    // The same copy is reused (not decoded again) while the bytes stay.
    const void* rowwise_copy = kept.decoded(QR_DIRECTION_ROWWISE).values->data();
    (void)fprop(kept);
    CHECK(kept.decoded(QR_DIRECTION_ROWWISE).values->data() == rowwise_copy);

    // Requantize in place (an optimizer step's new weight): the copies go, and the GEMMs
    // give the new weight's results.
    for (auto& v : w) v *= -1.5f;
    const QuantizeOptions options;
    qw->quantize_into(TensorView(w.data(), DType::f32, {N, K}), kept, options);
    CHECK_FALSE(kept.decoded(QR_DIRECTION_ROWWISE).values);
    CHECK_FALSE(kept.decoded(QR_DIRECTION_COLUMNWISE).values);
    qw->quantize_into(TensorView(w.data(), DType::f32, {N, K}), plain, options);
    CHECK(same_bits(fprop(kept), fprop(plain)));
    CHECK(same_bits(dgrad(kept), dgrad(plain)));
    CHECK(kept.decoded(QR_DIRECTION_COLUMNWISE).values);

    // Dropping a direction drops its copy only.
    kept.drop(QR_DIRECTION_COLUMNWISE);
    CHECK_FALSE(kept.decoded(QR_DIRECTION_COLUMNWISE).values);
    CHECK(kept.decoded(QR_DIRECTION_ROWWISE).values);

    // Moving carries the copies; the moved-from tensor keeps nothing.
    QuantizedTensor moved = std::move(kept);
    CHECK(moved.keeps_decoded());
    CHECK(moved.decoded(QR_DIRECTION_ROWWISE).values);
    CHECK_FALSE(kept.keeps_decoded());  // NOLINT(bugprone-use-after-move): checked on purpose
    CHECK_FALSE(kept.decoded(QR_DIRECTION_ROWWISE).values);

    // Explicit invalidation, and the off switch.
    moved.invalidate_decoded();
    CHECK_FALSE(moved.decoded(QR_DIRECTION_ROWWISE).values);
    CHECK(same_bits(fprop(moved), fprop(plain)));
    CHECK(moved.decoded(QR_DIRECTION_ROWWISE).values);
    moved.set_keep_decoded(false);
    CHECK_FALSE(moved.decoded(QR_DIRECTION_ROWWISE).values);
    CHECK(same_bits(fprop(moved), fprop(plain)));
    CHECK_FALSE(moved.decoded(QR_DIRECTION_ROWWISE).values);
  }
}

TEST_CASE("a dense operand and an operand without keeping never keep anything") {
  auto reg = Registry::shared();
  if (!reg->find("mxfp8")) {
    MESSAGE("not supported: mxfp8 plugin not built");
    return;
  }
  Engine engine(recipe_for("{format: mxfp8, dtype: e4m3}"), reg);
  const std::int64_t M = 8, K = 64, N = 16;
  auto x = random_normal(static_cast<std::size_t>(M * K), 31, 1.0f);
  auto w = random_normal(static_cast<std::size_t>(N * K), 32, 0.1f);
  const auto qw = engine.resolve({"linear", "weight", "l"});
  auto tw = qw->quantize(TensorView(w.data(), DType::f32, {N, K}), QR_USAGE_ROWWISE);
  tw.set_keep_decoded(true);
  std::vector<float> y(static_cast<std::size_t>(M * N));
  gemm(GemmOperand::dense(TensorView(x.data(), DType::f32, {M, K}), QR_DIRECTION_ROWWISE),
       GemmOperand::quantized(tw, *qw, QR_DIRECTION_ROWWISE), TensorView(y.data(), DType::f32, {M, N}));
  CHECK(tw.decoded(QR_DIRECTION_ROWWISE).values);
  // A copy for a direction the tensor does not hold is refused quietly (nothing to decode).
  tw.keep_decoded(QR_DIRECTION_COLUMNWISE, DecodedCopy{});
  CHECK_FALSE(tw.decoded(QR_DIRECTION_COLUMNWISE).values);
}
