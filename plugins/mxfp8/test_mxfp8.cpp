// doctest suite of the mxfp8 plugin. Everything goes through the engine and the registry (the
// plugin is found through QRECIPE_PLUGIN_PATH), never through mxfp8_ref directly.
//
// Known answers are computed by hand; the comments show the arithmetic. Shorthand:
//   r      = fl32(1/448) = 0x1.24924ap-9 (0x3B124925), 0.375 ulp ABOVE 1/448, so
//            fl32(448 * 2^k * r) = 2^k exactly (the excess is below half an ulp)
//   e      = e8m0_from_f32_round_up(amax * r): the exponent byte; m = 2^(127-e) multiplies on
//            quantize, 2^(e-127) decodes
//   E4M3   code = sign<<7 | exp_field<<3 | mantissa, value 1.mmm * 2^(exp_field-7);
//            448 = 0x7E (max), NaN = 0x7F
//   E5M2   code = sign<<7 | exp_field<<2 | mantissa, value 1.mm * 2^(exp_field-15);
//            57344 = 0x7B (max), NaN = 0x7F
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"

namespace {

using namespace qrecipe;

constexpr std::uint32_t kRow = QR_USAGE_ROWWISE;
constexpr std::uint32_t kCol = QR_USAGE_COLUMNWISE;
constexpr std::uint32_t kBoth = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::shared_ptr<Registry> registry() {
  static const auto reg = std::make_shared<Registry>();
  return reg;
}

QuantizerSpec mxfp8_spec(const std::string& dtype) {
  QuantizerSpec spec;
  spec.format = "mxfp8";
  if (!dtype.empty()) spec.options.emplace_back("dtype", OptionValue::of_string(dtype));
  return spec;
}

// An engine and one quantizer made through it (the engine must outlive the quantizer).
struct Mx {
  explicit Mx(const std::string& dtype = "", const std::string& tensor_type = "input")
      : spec(mxfp8_spec(dtype)),
        engine(Recipe::uniform(spec), registry()),
        q(engine.make_quantizer(spec, {"linear", tensor_type, "layers.0.fc1"})) {
    REQUIRE(q != nullptr);
  }
  QuantizedTensor quantize(std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                           std::uint32_t usage = kBoth) const {
    REQUIRE(static_cast<std::int64_t>(x.size()) == rows * cols);
    return q->quantize(TensorView(x.data(), DType::f32, {rows, cols}), usage);
  }
  QuantizerSpec spec;
  Engine engine;
  std::shared_ptr<Quantizer> q;
};

std::uint8_t data_at(const QuantizedTensor& t, qr_direction d, std::int64_t r, std::int64_t c) {
  return t.data(d).data_as<std::uint8_t>()[r * t.cols() + c];
}
// Scale byte (i, j) of the compact row-major scale array of direction d.
std::uint8_t scale_at(const QuantizedTensor& t, qr_direction d, std::int64_t i, std::int64_t j) {
  const TensorView s = t.scale_inv(d);
  return s.data_as<std::uint8_t>()[i * s.size(1) + j];
}
std::vector<float> dequantize_f32(const Mx& mx, const QuantizedTensor& t, qr_direction d) {
  const Tensor out = mx.q->dequantize(t, d);
  const float* p = out.data_as<float>();
  return std::vector<float>(p, p + out.numel());
}
float f32(std::uint32_t bits) { return num::bits_float(bits); }
std::uint32_t bits_of(float f) { return num::float_bits(f); }

// Runs fn, which must throw qrecipe::Error; returns it for inspection.
Error error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected a qrecipe::Error");
  return Error(QR_STATUS_OK, "", "");
}

// One row of 32 elements: `head` first, zeros after.
std::vector<float> row32(std::initializer_list<float> head) {
  std::vector<float> x(32, 0.0f);
  std::size_t i = 0;
  for (float v : head) x[i++] = v;
  return x;
}

}  // namespace

TEST_CASE("mxfp8: the plugin loads and describes itself") {
  const auto plugin = registry()->find("mxfp8");
  REQUIRE(plugin != nullptr);
  CHECK(plugin->supports(Device::cpu()));
  // CUDA exactly when the plugin was built with its kernels (the descriptor records the
  // CUDA version of such a build, 0 otherwise).
  CHECK(plugin->supports(Device::cuda(0)) == (plugin->cuda_version() != 0));
  REQUIRE(plugin->find_option("dtype") != nullptr);
  CHECK(plugin->find_option("dtype")->default_value == "e4m3");
  Mx e4m3;
  CHECK(e4m3.q->describe() == "mxfp8{dtype=e4m3, block=32, scale=e8m0}");
  // The default stays e4m3 for gradients too (TE's MXFP8BlockScaling default).
  Mx grad("", "grad_output");
  CHECK(grad.q->describe() == "mxfp8{dtype=e4m3, block=32, scale=e8m0}");
  Mx e5m2("e5m2");
  CHECK(e5m2.q->describe() == "mxfp8{dtype=e5m2, block=32, scale=e8m0}");
  // Bad values are refused by the engine against the schema, before the plugin sees them.
  CHECK_THROWS_AS(Mx("e3m4"), Error);
}

TEST_CASE("mxfp8: layouts") {
  Mx mx;
  SUBCASE("rowwise [M, K] = [33, 40]") {
    const qr_direction_layout l = mx.q->layout(33, 40, QR_DIRECTION_ROWWISE);
    CHECK(std::string(l.format) == "mxfp8");
    CHECK(l.data_dtype == QR_DTYPE_E4M3);
    CHECK(l.data_ndim == 2);
    CHECK(l.data_shape[0] == 33);
    CHECK(l.data_shape[1] == 40);
    CHECK(l.data_transposed == 0);
    CHECK(l.scale_mode == QR_SCALE_BLOCK);
    CHECK(l.scale_dtype == QR_DTYPE_E8M0);
    CHECK(l.scale_ndim == 2);
    CHECK(l.scale_shape[0] == 128);  // roundup(33, 128)
    CHECK(l.scale_shape[1] == 4);    // roundup(ceil(40/32) = 2, 4)
    CHECK(l.scale_transposed == 0);
    CHECK(l.block_rows == 1);
    CHECK(l.block_cols == 32);
    CHECK(l.has_amax == 0);
  }
  SUBCASE("columnwise [M, K] = [33, 40]: data not transposed") {
    const qr_direction_layout l = mx.q->layout(33, 40, QR_DIRECTION_COLUMNWISE);
    CHECK(l.data_shape[0] == 33);
    CHECK(l.data_shape[1] == 40);
    CHECK(l.data_transposed == 0);
    CHECK(l.scale_shape[0] == 4);    // roundup(ceil(33/32) = 2, 4)
    CHECK(l.scale_shape[1] == 128);  // roundup(40, 128)
    CHECK(l.block_rows == 32);
    CHECK(l.block_cols == 1);
    CHECK(l.has_amax == 0);
  }
  SUBCASE("larger shapes round up to whole 128x4 tiles") {
    const auto r = mx.q->layout(300, 1000, QR_DIRECTION_ROWWISE);
    CHECK(r.scale_shape[0] == 384);  // roundup(300, 128)
    CHECK(r.scale_shape[1] == 32);   // roundup(ceil(1000/32) = 32, 4)
    const auto c = mx.q->layout(300, 1000, QR_DIRECTION_COLUMNWISE);
    CHECK(c.scale_shape[0] == 12);    // roundup(ceil(300/32) = 10, 4)
    CHECK(c.scale_shape[1] == 1024);  // roundup(1000, 128)
  }
  SUBCASE("e5m2 data") {
    Mx e5("e5m2");
    CHECK(e5.q->layout(1, 32, QR_DIRECTION_ROWWISE).data_dtype == QR_DTYPE_E5M2);
    CHECK(e5.q->layout(1, 32, QR_DIRECTION_COLUMNWISE).data_dtype == QR_DTYPE_E5M2);
  }
}

TEST_CASE("mxfp8: amax exactly 448 * 2^k gives e = 127 + k") {
  Mx mx;
  // amax = 3584 = 448 * 2^3: 3584 * r = 8 exactly, a power of two, no round-up: e = 130 = 0x82,
  // m = 2^-3.
  //   3584 * 2^-3 = 448                                   -> 0x7E
  //   1.0  * 2^-3 = 0.125 = 2^-3, exp field 4             -> 0x20
  //  -2.5  * 2^-3 = -0.3125 = -1.25 * 2^-2, field 5, m 2  -> 0xAA
  //   100  * 2^-3 = 12.5 = 1.5625 * 2^3: mantissa 4.5 ulps is a tie, even 4 -> 1.5 * 2^3 = 12,
  //                                     field 10          -> 0x54 (decodes 12 * 8 = 96)
  std::vector<float> x = row32({3584.0f, 1.0f, -2.5f, 100.0f});
  const QuantizedTensor t = mx.quantize(x, 1, 32, kRow);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x82);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7E);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x20);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0xAA);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 3) == 0x54);
  for (int c = 4; c < 32; ++c) CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, c) == 0x00);
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(y[0] == 3584.0f);
  CHECK(y[1] == 1.0f);
  CHECK(y[2] == -2.5f);
  CHECK(y[3] == 96.0f);
  CHECK(y[4] == 0.0f);
}

TEST_CASE("mxfp8: amax a few ulp around 448 * 2^k (multiply by the rounded reciprocal)") {
  // One block per row, the amax in column 0, the rest zeros.
  Mx mx;
  const float above_448 = f32(0x43E00001);  // 0x1.c00002p+8 = 448.000031, one ulp above 448
  const float below_448 = f32(0x43DFFFFF);  // 0x1.bffffep+8 = 447.999969, one ulp below
  const float at_2m127 = f32(0x04600000);   // 0x1.cp-119 = 448 * 2^-127
  const float above_2m127 = f32(0x04600001);  // 0x1.c00002p-119, one ulp above 448 * 2^-127
  const float at_2p20 = 469762048.0f;         // 448 * 2^20 = 0x1.cp+28
  const float above_2p20 = f32(0x4DE00001);   // 0x1.c00002p+28, one ulp above
  std::vector<float> x(6 * 32, 0.0f);
  const float amaxes[6] = {above_448, below_448, at_2m127, above_2m127, at_2p20, above_2p20};
  for (int r = 0; r < 6; ++r) x[r * 32] = amaxes[r];
  const QuantizedTensor t = mx.quantize(x, 6, 32, kRow);

  // Row 0: 448(1 + 2^-23/1.75) * r = 1 + 1.89 * 2^-24 -> rounds to 1 + 2^-23 (0x1.000002p+0)
  //        -> mantissa != 0 rounds up to 2: e = 128 = 0x80; m = 1/2: 224.000015 -> 224 = 0x76.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x80);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x76);
  // Row 1: 448(1 - 2^-23/1.75) * r = 1 - 0.39 * 2^-24 -> rounds to exactly 1.0 (an exact
  //        division would give 0x1.fffffep-1; both round up to e = 127 = 0x7F); m = 1:
  //        447.999969 -> RNE 448 = 0x7E.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 1, 0) == 0x7F);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 1, 0) == 0x7E);
  // Row 2: 448 * 2^-127 * r = 2^-127 + 0.19 * 2^-149 -> the FP32 subnormal 0x00400000 = 2^-127
  //        exactly -> e = 0x00 (subnormals round up only above mantissa 0x400000); m = 2^127:
  //        448 -> 0x7E.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 2, 0) == 0x00);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 2, 0) == 0x7E);
  // Row 3, where the multiply decides: 0x1.c00002p-119 * r = 2^-127 + 0.47 * 2^-149 -> rounds
  //        DOWN to 2^-127 (0x00400000): e = 0x00, m = 2^127, element 448.000031 saturates to
  //        0x7E. The exact quotient 0x1.c00002p-119 / 448 is above 2^-127, so an
  //        implementation that divides exactly (in double, or ceil(log2(amax / 448))) takes
  //        e = 0x01, m = 2^126 and writes 224 = 0x76 instead.
  //        Found by an exhaustive scratch search over all finite positive FP32 amaxes: this is
  //        the ONLY amax where the multiply and the exact rule disagree for E4M3
  //        (0x1.c00002p-112 is the only one for E5M2, tested below). A float division
  //        (amax / 448.0f) agrees with the multiply for every FP32 amax, for both dtypes.
  CHECK(static_cast<double>(above_2m127) > std::ldexp(448.0, -127));  // exact rule: e >= 1
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 3, 0) == 0x00);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 3, 0) == 0x7E);
  // Row 4: 448 * 2^20 * r = 2^20 exactly: e = 147 = 0x93, element 448 -> 0x7E.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 4, 0) == 0x93);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 4, 0) == 0x7E);
  // Row 5: one ulp above: (1 + 2^-23) * 2^20 -> rounds up: e = 148 = 0x94; 224.000015 -> 0x76.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 5, 0) == 0x94);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 5, 0) == 0x76);

  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(y[0 * 32] == 448.0f);               // 224 * 2^1
  CHECK(y[1 * 32] == 448.0f);               // 448 * 2^0
  CHECK(y[2 * 32] == at_2m127);             // 448 * 2^-127
  CHECK(y[3 * 32] == at_2m127);             // 448 * 2^-127 (the exact rule: 224 * 2^-126, same)
  CHECK(y[4 * 32] == at_2p20);              // 448 * 2^20
  CHECK(y[5 * 32] == at_2p20);              // 224 * 2^21
}

TEST_CASE("mxfp8: amax 0 gives scale 0x00 and zero elements; the sign of zero is kept") {
  Mx mx;
  std::vector<float> x(32, 0.0f);
  x[3] = -0.0f;
  const QuantizedTensor t = mx.quantize(x, 1, 32, kBoth);
  // amax 0: 0 * r = 0 -> e = 0x00 (m = 2^127); 0 * m = 0 -> 0x00, -0 -> 0x80.
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x00);
  for (int c = 0; c < 32; ++c) {
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, c) == (c == 3 ? 0x80 : 0x00));
    CHECK(scale_at(t, QR_DIRECTION_COLUMNWISE, 0, c) == 0x00);
    CHECK(data_at(t, QR_DIRECTION_COLUMNWISE, 0, c) == (c == 3 ? 0x80 : 0x00));
  }
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(bits_of(y[0]) == 0x00000000u);  // 0 * 2^-127
  CHECK(bits_of(y[3]) == 0x80000000u);  // -0 * 2^-127
}

TEST_CASE("mxfp8: a block of FP32 denormals") {
  Mx mx;
  // amax = 0x007FFFFF (2^-126 - 2^-149, the largest denormal): amax * r = 0x1.2494p-135, a
  // subnormal below 2^-127 -> e = 0x00, m = 2^127.
  //   0x007FFFFF * 2^127 = 2 - 2^-22    -> RNE 2.0, exp field 8         -> 0x40
  //   0x00080000 = 2^-130: * 2^127 = 2^-3, exp field 4                  -> 0x20
  //  -0x00002000 = -2^-136: * 2^127 = -2^-9, the smallest E4M3 subnormal -> 0x81
  //   0x00000200 = 2^-140: * 2^127 = 2^-13, below half of 2^-9          -> 0x00
  //   0x00000001 = 2^-149: * 2^127 = 2^-22                              -> 0x00
  std::vector<float> x = row32({f32(0x007FFFFF), f32(0x00080000), f32(0x80002000),
                                f32(0x00000200), f32(0x00000001)});
  const QuantizedTensor t = mx.quantize(x, 1, 32, kRow);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x00);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x40);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x20);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0x81);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 3) == 0x00);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 4) == 0x00);
  // Decode q * 2^-127: 2 * 2^-127 = 2^-126, 2^-3 * 2^-127 = 2^-130, -2^-9 * 2^-127 = -2^-136.
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(bits_of(y[0]) == 0x00800000u);
  CHECK(bits_of(y[1]) == 0x00080000u);
  CHECK(bits_of(y[2]) == 0x80002000u);
  CHECK(bits_of(y[3]) == 0x00000000u);
}

TEST_CASE("mxfp8: a NaN element stays NaN and does not touch the block scale") {
  Mx mx;
  // Block 0 of the row: [NaN, 1, 3, 0...]: amax ignores NaN -> 3; 3 * r = 0x1.b6db7p-8, in
  // (2^-8, 2^-7) -> rounds up to 2^-7: e = 120 = 0x78, m = 2^7.
  //   NaN -> 0x7F; 1 * 128 = 2^7, field 14 -> 0x70; 3 * 128 = 384 = 1.5 * 2^8, field 15 -> 0x7C
  // Block 1 (cols 32..63): [2, 0...]: 2 * r in (2^-8, 2^-7) -> e = 0x78 too; 256 -> 0x78.
  std::vector<float> x(64, 0.0f);
  x[0] = kNaN;
  x[1] = 1.0f;
  x[2] = 3.0f;
  x[32] = 2.0f;
  const QuantizedTensor t = mx.quantize(x, 1, 64, kBoth);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x78);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x78);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7F);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x70);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0x7C);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 32) == 0x78);
  // Columnwise: each column is its own (partial, 1-row) block. Column 0 holds only NaN:
  // amax 0 -> e = 0x00, the element still encodes as NaN 0x7F.
  CHECK(scale_at(t, QR_DIRECTION_COLUMNWISE, 0, 0) == 0x00);
  CHECK(data_at(t, QR_DIRECTION_COLUMNWISE, 0, 0) == 0x7F);
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 1.0f);
  CHECK(y[2] == 3.0f);
  CHECK(y[32] == 2.0f);
  for (int c = 1; c < 64; ++c) CHECK_FALSE(std::isnan(y[c]));  // only that element
  const std::vector<float> yc = dequantize_f32(mx, t, QR_DIRECTION_COLUMNWISE);
  CHECK(std::isnan(yc[0]));
  for (int c = 1; c < 64; ++c) CHECK_FALSE(std::isnan(yc[c]));
}

TEST_CASE("mxfp8: an inf element gives e = 0xFE and saturates") {
  Mx mx;
  // amax inf -> inf * r = inf -> e = 0xFE, m = 2^-127 (the FP32 subnormal 0x00400000).
  //   inf * 2^-127 = inf -> saturates to 448 = 0x7E; -inf -> 0xFE
  //   2^127 * 2^-127 = 1, field 7 -> 0x38;  1.0 * 2^-127 is far below E4M3's range -> 0x00
  std::vector<float> x = row32({kInf, -kInf, std::ldexp(1.0f, 127), 1.0f});
  const QuantizedTensor t = mx.quantize(x, 1, 32, kRow);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0xFE);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7E);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0xFE);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0x38);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 3) == 0x00);
  // Decode: 448 * 2^127 overflows FP32 -> +-inf; 1 * 2^127 = 2^127; 0.
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(y[0] == kInf);
  CHECK(y[1] == -kInf);
  CHECK(y[2] == std::ldexp(1.0f, 127));
  CHECK(y[3] == 0.0f);
}

TEST_CASE("mxfp8: partial rowwise blocks (K = 40) and zero scale padding") {
  Mx mx;
  // Row 0: block 0 = cols 0..31 all 1.0; block 1 = cols 32..39 (8 valid) all 0.5.
  // Row 1: block 0 all 448; block 1 = [-6, 0...].
  //   1.0: 1 * r = 0x1.24924ap-9 -> e = 119 = 0x77, m = 2^8: 256 -> 0x78
  //   0.5: 0.5 * r -> 2^-9 * 1.14 -> e = 118 = 0x76, m = 2^9: 256 -> 0x78
  //   448: 448 * r = 1 -> e = 0x7F, m = 1: 448 -> 0x7E
  //   6:   6 * r = 0x1.b6db7p-7 -> e = 121 = 0x79, m = 2^6: -384 = -1.5 * 2^8 -> 0xFC
  std::vector<float> x(2 * 40, 0.0f);
  for (int c = 0; c < 32; ++c) x[c] = 1.0f, x[40 + c] = 448.0f;
  for (int c = 32; c < 40; ++c) x[c] = 0.5f;
  x[40 + 32] = -6.0f;
  QuantizedTensor t = mx.quantize(x, 2, 40, kRow);
  const TensorView s = t.scale_inv(QR_DIRECTION_ROWWISE);
  REQUIRE(s.size(0) == 128);
  REQUIRE(s.size(1) == 4);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x77);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x76);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 1, 0) == 0x7F);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 1, 1) == 0x79);
  // Every other one of the 512 scale bytes is padding and reads 0.
  int nonzero_padding = 0;
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 4; ++j)
      if ((i >= 2 || j >= 2) && scale_at(t, QR_DIRECTION_ROWWISE, i, j) != 0) ++nonzero_padding;
  CHECK(nonzero_padding == 0);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x78);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 39) == 0x78);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 1, 31) == 0x7E);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 1, 32) == 0xFC);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 1, 39) == 0x00);

  // The plugin never writes padding (the engine zero-fills it once): poison the padding,
  // requantize in place, and the poison must survive while the valid bytes are rewritten.
  auto* sp = static_cast<std::uint8_t*>(t.c().rowwise.scale_inv.data);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 4; ++j) sp[i * 4 + j] = (i >= 2 || j >= 2) ? 0xAA : 0x11;
  mx.q->quantize_into(TensorView(x.data(), DType::f32, {2, 40}), t);
  CHECK(sp[0] == 0x77);
  CHECK(sp[1] == 0x76);
  CHECK(sp[4] == 0x7F);
  CHECK(sp[5] == 0x79);
  int poisoned = 0;
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 4; ++j)
      if ((i >= 2 || j >= 2) && sp[i * 4 + j] == 0xAA) ++poisoned;
  CHECK(poisoned == 512 - 4);

  // Dequantize: 256 * 2^-8 = 1, 256 * 2^-9 = 0.5, 448, -384 * 2^-6 = -6.
  const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
  CHECK(y[0] == 1.0f);
  CHECK(y[39] == 0.5f);
  CHECK(y[40] == 448.0f);
  CHECK(y[72] == -6.0f);
}

TEST_CASE("mxfp8: columnwise blocks (M = 33: a partial block) and their scale indices") {
  Mx mx;
  // [33, 3]; columnwise blocks are rows 0..31 and row 32 (a 1-row partial block) of each column.
  //   col 0: rows 0..31 = 1.0; row 32 = 448
  //   col 1: rows 0..31 zero except row 5 = 6.0; row 32 = -3.5
  //   col 2: row r = r / 4 (0 .. 7.75); row 32 = 8.0
  std::vector<float> x(33 * 3, 0.0f);
  for (int r = 0; r < 32; ++r) {
    x[r * 3 + 0] = 1.0f;
    x[r * 3 + 2] = static_cast<float>(r) * 0.25f;
  }
  x[5 * 3 + 1] = 6.0f;
  x[32 * 3 + 0] = 448.0f;
  x[32 * 3 + 1] = -3.5f;
  x[32 * 3 + 2] = 8.0f;
  const QuantizedTensor t = mx.quantize(x, 33, 3, kBoth);
  const auto C = QR_DIRECTION_COLUMNWISE;
  const TensorView s = t.scale_inv(C);
  REQUIRE(s.size(0) == 4);    // roundup(ceil(33/32), 4)
  REQUIRE(s.size(1) == 128);  // roundup(3, 128); scale (i, c) is byte i * 128 + c
  // Block (0, 0): amax 1 -> e = 0x77 (m = 2^8): 1 -> 256 -> 0x78.
  // Block (1, 0): amax 448 -> 448 * r = 1 -> e = 0x7F: 448 -> 0x7E.
  // Block (0, 1): amax 6 -> 6 * r = 0x1.b6db7p-7 -> e = 121 = 0x79 (m = 2^6): 384 -> 0x7C.
  // Block (1, 1): amax 3.5 = 448 * 2^-7 -> 3.5 * r = 2^-7 exactly: e = 120 = 0x78, m = 2^7:
  //               -3.5 * 128 = -448 -> 0xFE.
  // Block (0, 2): amax 7.75 -> 7.75 * r = 0x1.1b6db8p-6 -> e = 122 = 0x7A, m = 2^5:
  //               r/4 * 32 = 8r: r = 1 -> 8 = 2^3 -> 0x50; r = 3 -> 24 = 1.5 * 2^4 -> 0x5C;
  //               r = 31 -> 248 = 1.9375 * 2^7: mantissa 7.5 is a tie, even 8 carries -> 256
  //               -> 0x78
  // Block (1, 2): amax 8 -> 8 * r = 0x1.24924ap-6 -> e = 0x7A: 8 * 32 = 256 -> 0x78.
  CHECK(s.data_as<std::uint8_t>()[0 * 128 + 0] == 0x77);
  CHECK(s.data_as<std::uint8_t>()[1 * 128 + 0] == 0x7F);
  CHECK(s.data_as<std::uint8_t>()[0 * 128 + 1] == 0x79);
  CHECK(s.data_as<std::uint8_t>()[1 * 128 + 1] == 0x78);
  CHECK(s.data_as<std::uint8_t>()[0 * 128 + 2] == 0x7A);
  CHECK(s.data_as<std::uint8_t>()[1 * 128 + 2] == 0x7A);
  int nonzero_padding = 0;
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 128; ++c)
      if ((i >= 2 || c >= 3) && scale_at(t, C, i, c) != 0) ++nonzero_padding;
  CHECK(nonzero_padding == 0);
  // Data stays [33, 3] row-major (not transposed).
  CHECK(data_at(t, C, 0, 0) == 0x78);
  CHECK(data_at(t, C, 31, 0) == 0x78);
  CHECK(data_at(t, C, 32, 0) == 0x7E);
  CHECK(data_at(t, C, 5, 1) == 0x7C);
  CHECK(data_at(t, C, 4, 1) == 0x00);
  CHECK(data_at(t, C, 32, 1) == 0xFE);
  CHECK(data_at(t, C, 0, 2) == 0x00);
  CHECK(data_at(t, C, 1, 2) == 0x50);
  CHECK(data_at(t, C, 3, 2) == 0x5C);
  CHECK(data_at(t, C, 31, 2) == 0x78);
  CHECK(data_at(t, C, 32, 2) == 0x78);

  // The rowwise copy is quantized independently from the source: row 32 = [448, -3.5, 8] is one
  // partial block with amax 448 -> e = 0x7F, m = 1: 448 -> 0x7E; -3.5 = -1.75 * 2^1 -> 0xC6;
  // 8 -> 0x50. Row 5 = [1, 6, 1.25]: amax 6 -> e = 0x79, m = 2^6: 64 = 2^6 -> 0x68, 384 -> 0x7C,
  // 80 = 1.25 * 2^6 -> 0x6A.
  const auto R = QR_DIRECTION_ROWWISE;
  CHECK(scale_at(t, R, 32, 0) == 0x7F);
  CHECK(data_at(t, R, 32, 0) == 0x7E);
  CHECK(data_at(t, R, 32, 1) == 0xC6);
  CHECK(data_at(t, R, 32, 2) == 0x50);
  CHECK(scale_at(t, R, 5, 0) == 0x79);
  CHECK(data_at(t, R, 5, 0) == 0x68);
  CHECK(data_at(t, R, 5, 1) == 0x7C);
  CHECK(data_at(t, R, 5, 2) == 0x6A);

  // Columnwise decode: 256 * 2^-8 = 1; 448; -448 * 2^-7 = -3.5; 256 * 2^-5 = 8 (row 31:
  // 7.75 rounded to 8; row 32: 8).
  const std::vector<float> y = dequantize_f32(mx, t, C);
  CHECK(y[0 * 3 + 0] == 1.0f);
  CHECK(y[32 * 3 + 0] == 448.0f);
  CHECK(y[32 * 3 + 1] == -3.5f);
  CHECK(y[5 * 3 + 1] == 6.0f);
  CHECK(y[3 * 3 + 2] == 0.75f);
  CHECK(y[31 * 3 + 2] == 8.0f);
  CHECK(y[32 * 3 + 2] == 8.0f);
}

TEST_CASE("mxfp8: e5m2 known answers") {
  Mx mx("e5m2");
  SUBCASE("a block at 57344 * 2^1") {
    // r5 = fl32(1/57344) = 0x1.24924ap-16. amax 114688 = 57344 * 2: * r5 = 2 exactly ->
    // e = 128 = 0x80, m = 1/2.
    //   114688 / 2 = 57344 -> 0x7B;  1 / 2 = 2^-1, field 14 -> 0x38;
    //   -3 / 2 = -1.5, field 15, m 2 -> 0xBE;  100 / 2 = 50 = 1.5625 * 2^5: mantissa 2.25 ->
    //   2, field 20 -> 0x52 (decodes 48 * 2 = 96);  NaN -> 0x7F
    std::vector<float> x = row32({114688.0f, 1.0f, -3.0f, 100.0f, kNaN});
    const QuantizedTensor t = mx.quantize(x, 1, 32, kRow);
    CHECK(t.data(QR_DIRECTION_ROWWISE).dtype() == DType::e5m2);
    CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x80);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7B);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x38);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0xBE);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 3) == 0x52);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 4) == 0x7F);
    const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
    CHECK(y[0] == 114688.0f);
    CHECK(y[1] == 1.0f);
    CHECK(y[2] == -3.0f);
    CHECK(y[3] == 96.0f);
    CHECK(std::isnan(y[4]));
  }
  SUBCASE("the one E5M2 amax where the multiply and the exact rule disagree") {
    // 0x1.c00002p-112 = one ulp above 57344 * 2^-127: * r5 rounds down to 2^-127 -> e = 0x00,
    // m = 2^127: 57344.004 saturates to 0x7B. (Exact rule: e = 0x01, 28672 -> 0x77.)
    std::vector<float> x = row32({f32(0x07E00001)});
    const QuantizedTensor t = mx.quantize(x, 1, 32, kRow);
    CHECK(static_cast<double>(x[0]) > std::ldexp(57344.0, -127));
    CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x00);
    CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7B);
  }
}

TEST_CASE("mxfp8: bf16 and f16 sources, bf16 output") {
  Mx mx;
  // bf16 [256, 1, -5, 0x3DCD = 0.10009765625, 0...]: amax 256 -> 256 * r = 0x1.24924ap-1 ->
  // rounds up to 1: e = 0x7F, m = 1.
  //   256 -> 0x78;  1 -> 0x38;  -5 = -1.25 * 2^2 -> 0xCA;
  //   0.10009765625 = 1.6015625 * 2^-4: mantissa 4.8125 -> 5, field 3 -> 0x1D (1.625 * 2^-4)
  std::vector<std::uint16_t> x(32, 0);
  x[0] = 0x4380;
  x[1] = 0x3F80;
  x[2] = 0xC0A0;
  x[3] = 0x3DCD;
  const QuantizedTensor t = mx.q->quantize(TensorView(x.data(), DType::bf16, {1, 32}), kBoth);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7F);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x78);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 1) == 0x38);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 2) == 0xCA);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 3) == 0x1D);
  // Columnwise: one 1-row block per column. Column 3: amax 0.10009765625 -> * r = 0x1.c...p-13
  // in (2^-13, 2^-12) -> e = 115 = 0x73, m = 2^12: 410 = 1.6015625 * 2^8 -> mantissa 4.8125 -> 5:
  // 1.625 * 2^8 = 416 -> 0x7D.
  CHECK(scale_at(t, QR_DIRECTION_COLUMNWISE, 0, 3) == 0x73);
  CHECK(data_at(t, QR_DIRECTION_COLUMNWISE, 0, 3) == 0x7D);

  // Dequantize to bf16: 0x1D -> 0.1015625 = 1.101b * 2^-4 -> bf16 0x3DD0; -5 -> 0xC0A0.
  std::vector<std::uint16_t> y(32, 0xFFFF);
  mx.q->dequantize(t, QR_DIRECTION_ROWWISE, TensorView(y.data(), DType::bf16, {1, 32}));
  CHECK(y[0] == 0x4380);
  CHECK(y[1] == 0x3F80);
  CHECK(y[2] == 0xC0A0);
  CHECK(y[3] == 0x3DD0);
  CHECK(y[4] == 0x0000);
  // Columnwise column 3: 416 * 2^-12 = 0.1015625 as well.
  mx.q->dequantize(t, QR_DIRECTION_COLUMNWISE, TensorView(y.data(), DType::bf16, {1, 32}));
  CHECK(y[3] == 0x3DD0);

  // f16 [1.5 (0x3E00), -0.25 (0xB400), 0...]: amax 1.5 -> 1.5 * r = 0x1.b6db7p-9 -> e = 0x77,
  // m = 2^8: 384 -> 0x7C; -64 = -2^6, field 13 -> 0xE8.
  std::vector<std::uint16_t> h(32, 0);
  h[0] = 0x3E00;
  h[1] = 0xB400;
  const QuantizedTensor th = mx.q->quantize(TensorView(h.data(), DType::f16, {1, 32}), kRow);
  CHECK(scale_at(th, QR_DIRECTION_ROWWISE, 0, 0) == 0x77);
  CHECK(data_at(th, QR_DIRECTION_ROWWISE, 0, 0) == 0x7C);
  CHECK(data_at(th, QR_DIRECTION_ROWWISE, 0, 1) == 0xE8);
}

TEST_CASE("mxfp8: leading dimensions flatten and strided sources read correctly") {
  Mx mx;
  // A [2, 3, 40] view is the 2-D [6, 40] tensor.
  std::vector<float> x(6 * 40);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 37.0f;
  const QuantizedTensor flat = mx.quantize(x, 6, 40, kBoth);
  const QuantizedTensor nd = mx.q->quantize(TensorView(x.data(), DType::f32, {2, 3, 40}), kBoth);
  REQUIRE(nd.rows() == 6);
  REQUIRE(nd.cols() == 40);
  // A transposed view of the [40, 6] transpose is the same logical [6, 40] tensor.
  std::vector<float> xt(40 * 6);
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 40; ++c) xt[c * 6 + r] = x[r * 40 + c];
  TensorView strided(xt.data(), DType::f32, {6, 40});
  strided.c().strides[0] = 1;
  strided.c().strides[1] = 6;
  const QuantizedTensor st = mx.q->quantize(strided, kBoth);
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    const auto bytes = [&](const TensorView& v) {
      const auto* p = v.data_as<std::uint8_t>();
      return std::vector<std::uint8_t>(p, p + v.nbytes());
    };
    CHECK(bytes(nd.data(d)) == bytes(flat.data(d)));
    CHECK(bytes(nd.scale_inv(d)) == bytes(flat.scale_inv(d)));
    CHECK(bytes(st.data(d)) == bytes(flat.data(d)));
    CHECK(bytes(st.scale_inv(d)) == bytes(flat.scale_inv(d)));
  }
}

TEST_CASE("mxfp8: single-element and empty tensors") {
  Mx mx;
  // [1, 1] = 3: 3 * r in (2^-8, 2^-7) -> e = 0x78, m = 2^7: 384 -> 0x7C, in both directions.
  std::vector<float> one{3.0f};
  const QuantizedTensor t = mx.quantize(one, 1, 1, kBoth);
  CHECK(t.scale_inv(QR_DIRECTION_ROWWISE).numel() == 128 * 4);
  CHECK(t.scale_inv(QR_DIRECTION_COLUMNWISE).numel() == 4 * 128);
  CHECK(scale_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x78);
  CHECK(scale_at(t, QR_DIRECTION_COLUMNWISE, 0, 0) == 0x78);
  CHECK(data_at(t, QR_DIRECTION_ROWWISE, 0, 0) == 0x7C);
  CHECK(data_at(t, QR_DIRECTION_COLUMNWISE, 0, 0) == 0x7C);
  CHECK(dequantize_f32(mx, t, QR_DIRECTION_COLUMNWISE)[0] == 3.0f);

  std::vector<float> none;
  const QuantizedTensor e = mx.quantize(none, 0, 40, kBoth);
  CHECK(e.data(QR_DIRECTION_ROWWISE).numel() == 0);
  CHECK(e.scale_inv(QR_DIRECTION_ROWWISE).numel() == 0);  // [roundup(0, 128), 4]
  CHECK(e.scale_inv(QR_DIRECTION_COLUMNWISE).numel() == 0);  // [roundup(0, 4), 128]
  CHECK(mx.q->dequantize(e, QR_DIRECTION_ROWWISE).numel() == 0);
  CHECK(mx.q->compute_amax(TensorView(none.data(), DType::f32, {0, 40}))[0] == 0.0f);
}

TEST_CASE("mxfp8: compute_amax ignores NaN; a given amax changes nothing") {
  Mx mx;
  std::vector<float> x = row32({kNaN, -7.5f, 2.0f});
  const auto a = mx.q->compute_amax(TensorView(x.data(), DType::f32, {1, 32}));
  CHECK(a[0] == 7.5f);
  CHECK(a[1] == 7.5f);
  // mxfp8 has no tensor scale: a caller-reduced amax must not alter the bytes.
  const QuantizedTensor plain = mx.quantize(x, 1, 32, kBoth);
  QuantizeOptions opts;
  opts.amax = std::array<float, 2>{1000.0f, 1000.0f};
  const QuantizedTensor given =
      mx.q->quantize(TensorView(x.data(), DType::f32, {1, 32}), kBoth, opts);
  for (int c = 0; c < 32; ++c) {
    CHECK(data_at(given, QR_DIRECTION_ROWWISE, 0, c) ==
          data_at(plain, QR_DIRECTION_ROWWISE, 0, c));
    CHECK(data_at(given, QR_DIRECTION_COLUMNWISE, 0, c) ==
          data_at(plain, QR_DIRECTION_COLUMNWISE, 0, c));
  }
  CHECK(scale_at(given, QR_DIRECTION_ROWWISE, 0, 0) == scale_at(plain, QR_DIRECTION_ROWWISE, 0, 0));
}

TEST_CASE("mxfp8: misuse is a clear error") {
  Mx mx;
  Mx e5("e5m2");
  std::vector<float> x(2 * 40, 1.0f);
  const TensorView src(x.data(), DType::f32, {2, 40});
  SUBCASE("requantizing into a tensor of another dtype") {
    QuantizedTensor t = e5.q->quantize(src, kRow);
    const Error err = error_of([&] { mx.q->quantize_into(src, t); });
    CHECK(err.code() == QR_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(err.what()).find("e5m2") != std::string::npos);
  }
  SUBCASE("dequantize decodes with the dtype the data was made with") {
    const QuantizedTensor t = e5.q->quantize(src, kRow);
    const std::vector<float> y = dequantize_f32(mx, t, QR_DIRECTION_ROWWISE);
    CHECK(y[0] == 1.0f);
  }
  SUBCASE("a missing direction") {
    const QuantizedTensor t = mx.q->quantize(src, kRow);
    CHECK_THROWS_AS(mx.q->dequantize(t, QR_DIRECTION_COLUMNWISE), Error);
  }
}

TEST_CASE("mxfp8: CUDA tensors are refused without CUDA kernels, never run on the CPU") {
  Mx mx;
  // A plugin built with CUDA runs its kernels instead: tests/gpu/test_gpu_parity.cpp holds
  // them to the reference, byte for byte.
  if (mx.q->plugin().supports(Device::cuda(0))) return;
  float fake = 0.0f;  // never dereferenced: the checks run before any data access
  TensorView cuda_src(&fake, DType::f32, {1, 1}, Device::cuda(0));
  SUBCASE("through the engine (the descriptor declares the CPU only)") {
    const Error err = error_of([&] { (void)mx.q->quantize(cuda_src, kRow); });
    CHECK(err.code() == QR_STATUS_UNSUPPORTED);
  }
  SUBCASE("through the plugin's C table") {
    const qr_plugin_descriptor& c = mx.q->plugin().c();
    std::vector<float> host{1.0f};
    QuantizedTensor dst = mx.quantize(host, 1, 1, kRow);
    qr_quantize_args args{};
    args.struct_size = sizeof(qr_quantize_args);
    args.usage = kRow;
    const Error q = error_of([&] {
      throw_if_error(c.quantize(mx.q->handle(), &cuda_src.c(), &args, &dst.c()), "quantize");
    });
    CHECK(q.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(q.what()).find("built without CUDA kernels") != std::string::npos);
    float amax[2] = {0, 0};
    const Error a = error_of([&] {
      throw_if_error(c.compute_amax(mx.q->handle(), &cuda_src.c(), nullptr, amax), "amax");
    });
    CHECK(a.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(a.what()).find("built without CUDA kernels") != std::string::npos);
    const Error d = error_of([&] {
      throw_if_error(c.dequantize(mx.q->handle(), &dst.c(), QR_DIRECTION_ROWWISE, &cuda_src.c(),
                                  nullptr),
                     "dequantize");
    });
    CHECK(d.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(d.what()).find("built without CUDA kernels") != std::string::npos);
  }
}

TEST_CASE("mxfp8 passes the shared conformance suite") {
  namespace conf = qrecipe::conformance;
  // Error of one decoded element (no slack: every product in mxfp8 is by a power of two, so
  // the only roundings are the FP8 cast and, for bf16 output, the final bf16 rounding that
  // the suite checks separately):
  //   element  RNE into E4M3 (3 mantissa bits): half an ulp is at most 2^-4 of |x|;
  //            E5M2 (2 bits): 2^-3 of |x|. Saturation only happens for the single amax
  //            0x1.c00002p-119 (E4M3) / 0x1.c00002p-112 (E5M2), where x * m = max + 1 ulp of
  //            FP32 (relative error ~2^-24).
  //   block    below the smallest subnormal (E4M3 2^-9, E5M2 2^-16) an element rounds by at
  //            most half of it, times the decode factor 2^(e-127). The multiply rule never
  //            picks a larger exponent than the exact one (exhaustive scratch search over all
  //            FP32 amaxes), so for e >= 1: 2^(e-127) < 2 * amax / fmax, giving
  //            E4M3 2^-10 * 2 / 448 = 2^-9 / 448 and E5M2 2^-17 * 2 / 57344 = 2^-16 / 57344
  //            of the block amax.
  //   abs      e clamped at 0 (amax * r <= 2^-127): the decode factor is 2^-127, so the floor
  //            is E4M3 2^-10 * 2^-127 = 2^-137, E5M2 2^-17 * 2^-127 = 2^-144.
  const conf::ErrorBound e4m3{.rel_element = 0x1p-4, .rel_block = 0x1p-9 / 448, .abs = 0x1p-137};
  const conf::ErrorBound e5m2{.rel_element = 0x1p-3, .rel_block = 0x1p-16 / 57344,
                              .abs = 0x1p-144};
  const QuantizerRole input{"linear", "input", "conformance"};
  const QuantizerRole weight{"linear", "weight", "conformance"};
  const QuantizerRole grad{"linear", "grad_output", "conformance"};
  conf::run({.format = "mxfp8",
             .cases = {{.spec = conf::spec("mxfp8"), .role = input, .bound = e4m3},
                       {.spec = conf::spec("mxfp8"), .role = grad, .bound = e4m3},
                       {.spec = conf::spec("mxfp8", {{"dtype", "e4m3"}}), .role = weight,
                        .bound = e4m3},
                       {.spec = conf::spec("mxfp8", {{"dtype", "e5m2"}}), .role = grad,
                        .bound = e5m2},
                       {.spec = conf::spec("mxfp8", {{"dtype", "e5m2"}}), .role = input,
                        .bound = e5m2}},
             .registry = registry()});
}
