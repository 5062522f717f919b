// doctest suite of the float8 plugin, driven through the engine (registry -> plugin -> C ABI),
// never by calling the plugin's C++ directly (docs/architecture.md, "Conventions", rule 7: tests
// that bypass the plugin interface are an anti-pattern).
//
// Map
//   1. helpers (specs, engines, byte access)
//   2. layout, describe, option validation
//   3. known-answer vectors, current scaling (E4M3, E5M2, pow2, amax_epsilon, bf16/f16/strided)
//   4. edge cases (zeros, NaN, inf, denormals, saturation, -0, single, empty)
//   5. directions (rowwise / columnwise / both), quantize_into, dequantize
//   6. delayed scaling sequences
//   7. the shared conformance suite
//
// FP8 codes in the comments: E4M3 = s eeee mmm, bias 7, value 2^(e-7) * (1 + m/8), subnormal
// m * 2^-9, max 448 = 0x7E, NaN 0x7F. E5M2 = s eeeee mm, bias 15, value 2^(e-15) * (1 + m/4),
// subnormal m * 2^-16, max 57344 = 0x7B. Rounding is to nearest, ties to the even code.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "conformance.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/spec.hpp"
#include "qrecipe/tensor.hpp"

using qrecipe::DType;
using qrecipe::Engine;
using qrecipe::OptionValue;
using qrecipe::QuantizedTensor;
using qrecipe::QuantizeOptions;
using qrecipe::Quantizer;
using qrecipe::QuantizerRole;
using qrecipe::QuantizerSpec;
using qrecipe::Recipe;
using qrecipe::TensorView;

namespace {

// ---------------------------------------------------------------- 1. helpers

constexpr std::uint32_t kRow = QR_USAGE_ROWWISE;
constexpr std::uint32_t kCol = QR_USAGE_COLUMNWISE;
constexpr std::uint32_t kBoth = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
constexpr qr_direction kRowDir = QR_DIRECTION_ROWWISE;
constexpr qr_direction kColDir = QR_DIRECTION_COLUMNWISE;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

std::shared_ptr<qrecipe::Registry> registry() {
  static const auto reg = std::make_shared<qrecipe::Registry>();
  return reg;
}

using Opts = std::vector<std::pair<std::string, OptionValue>>;

QuantizerSpec float8(Opts options = {}) {
  QuantizerSpec spec;
  spec.format = "float8";
  spec.options = std::move(options);
  return spec;
}

QuantizerRole role(const std::string& tensor_type = "input") {
  return {"linear", tensor_type, "layers.0.fc1"};
}

// An engine whose recipe is `spec` everywhere (the spec must be valid).
std::unique_ptr<Engine> engine_for(const QuantizerSpec& spec) {
  return std::make_unique<Engine>(Recipe::uniform(spec), registry());
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<std::uint8_t> bytes(const QuantizedTensor& t, qr_direction d) {
  const TensorView v = t.data(d);
  const auto* p = v.data_as<const std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + v.numel());
}

float scale_inv(const QuantizedTensor& t, qr_direction d) {
  return t.scale_inv(d).data_as<const float>()[0];
}

using Bytes = std::vector<std::uint8_t>;

TensorView f32_view(std::vector<float>& v, std::vector<std::int64_t> shape) {
  return TensorView(v.data(), DType::f32, shape);
}

// Quantizes `x` (f32, shape [rows, cols]) with a fresh engine for `spec` and role `r`.
struct Quantized {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Quantizer> quantizer;
  QuantizedTensor tensor;
};
Quantized quantize_f32(const QuantizerSpec& spec, std::vector<float> x,
                       std::vector<std::int64_t> shape, std::uint32_t usage = kBoth,
                       const QuantizerRole& r = role(), QuantizeOptions options = {}) {
  Quantized out;
  out.engine = engine_for(spec);
  out.quantizer = out.engine->make_quantizer(spec, r);
  REQUIRE(out.quantizer != nullptr);
  out.tensor = out.quantizer->quantize(f32_view(x, shape), usage, options);
  return out;
}

// Checks both directions of a [rows, cols] result against the expected rowwise bytes: the
// columnwise copy must be exactly their transpose, with the same scale_inv and amax.
void check_both(const QuantizedTensor& t, const Bytes& rowwise, std::int64_t rows,
                std::int64_t cols, float expected_scale_inv, float expected_amax) {
  CHECK(bytes(t, kRowDir) == rowwise);
  Bytes transposed(rowwise.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) transposed[c * rows + r] = rowwise[r * cols + c];
  CHECK(bytes(t, kColDir) == transposed);
  for (const qr_direction d : {kRowDir, kColDir}) {
    CHECK(bits(scale_inv(t, d)) == bits(expected_scale_inv));
    CHECK(bits(t.amax(d)) == bits(expected_amax));
  }
}

const qr_scaling_state& state(const Engine& e, std::size_t i = 0) {
  REQUIRE(e.scaling_states().size() > i);
  return e.scaling_states()[i]->c;
}
std::vector<float> history(const Engine& e, std::size_t i = 0) {
  const qr_scaling_state& s = state(e, i);
  return std::vector<float>(s.amax_history, s.amax_history + s.history_len);
}

}  // namespace

// ---------------------------------------------------------------- 2. layout, describe, options

TEST_CASE("float8 is loaded through the registry and describes its options") {
  const auto plugin = registry()->find("float8");
  REQUIRE_MESSAGE(plugin != nullptr, "libqrecipe_float8.so not found; set QRECIPE_PLUGIN_PATH");
  CHECK(plugin->supports(qrecipe::Device::cpu()));
  CHECK(plugin->find_option("scaling") != nullptr);
  CHECK(plugin->find_option("margin") != nullptr);

  auto engine = engine_for(float8());
  CHECK(engine->make_quantizer(float8(), role("input"))->describe() ==
        "float8{scaling=current, dtype=e4m3, pow2_scales=false, amax_epsilon=0}");
  // TE's HYBRID default: gradients are E5M2.
  CHECK(engine->make_quantizer(float8(), role("grad_output"))->describe() ==
        "float8{scaling=current, dtype=e5m2, pow2_scales=false, amax_epsilon=0}");
  CHECK(engine->make_quantizer(float8({{"dtype", OptionValue::of_enum("e4m3")}}),
                               role("grad_output"))
            ->describe() ==
        "float8{scaling=current, dtype=e4m3, pow2_scales=false, amax_epsilon=0}");
  CHECK(engine
            ->make_quantizer(float8({{"pow2_scales", OptionValue::of_bool(true)},
                                     {"amax_epsilon", OptionValue::of_float(0.5)}}),
                             role())
            ->describe() ==
        "float8{scaling=current, dtype=e4m3, pow2_scales=true, amax_epsilon=0.5}");
  CHECK(engine->make_quantizer(float8({{"scaling", OptionValue::of_enum("delayed")}}), role())
            ->describe() ==
        "float8{scaling=delayed, dtype=e4m3, amax_history_len=1024, amax_compute_algo=max, "
        "margin=0}");
}

TEST_CASE("float8 layout: per-tensor scale, columnwise stored transposed") {
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  const qr_direction_layout row = q->layout(3, 5, kRowDir);
  CHECK(std::string(row.format) == "float8");
  CHECK(row.data_dtype == QR_DTYPE_E4M3);
  CHECK(row.data_ndim == 2);
  CHECK(row.data_shape[0] == 3);
  CHECK(row.data_shape[1] == 5);
  CHECK(row.data_transposed == 0);
  CHECK(row.scale_mode == QR_SCALE_TENSOR);
  CHECK(row.scale_dtype == QR_DTYPE_F32);
  CHECK(row.scale_ndim == 1);
  CHECK(row.scale_shape[0] == 1);
  CHECK(row.has_amax == 1);
  const qr_direction_layout col = q->layout(3, 5, kColDir);
  CHECK(col.data_shape[0] == 5);
  CHECK(col.data_shape[1] == 3);
  CHECK(col.data_transposed == 1);
  CHECK(col.scale_mode == QR_SCALE_TENSOR);
  CHECK(engine->make_quantizer(float8(), role("grad_output"))->layout(3, 5, kRowDir).data_dtype ==
        QR_DTYPE_E5M2);
}

TEST_CASE("float8 rejects bad options when a quantizer is built through the engine") {
  auto engine = engine_for(QuantizerSpec{});  // recipe: format none everywhere
  auto bad = [&](Opts options) {
    CHECK_THROWS_AS(engine->make_quantizer(float8(std::move(options)), role()), qrecipe::Error);
  };
  // Schema checks (the engine's validator): unknown key, enum choice, bounds, type.
  bad({{"scaling", OptionValue::of_enum("dynamic")}});
  bad({{"dtype", OptionValue::of_enum("e2m1")}});
  bad({{"amax_epsilon", OptionValue::of_float(-1.0)}});
  bad({{"pow2_scales", OptionValue::of_int(1)}});
  bad({{"scaling", OptionValue::of_enum("delayed")}, {"amax_history_len", OptionValue::of_int(0)}});
  bad({{"scaling", OptionValue::of_enum("delayed")},
       {"amax_history_len", OptionValue::of_int(65537)}});
  bad({{"scaling", OptionValue::of_enum("delayed")},
       {"amax_compute_algo", OptionValue::of_enum("mean")}});
  bad({{"scaling", OptionValue::of_enum("delayed")}, {"margin", OptionValue::of_int(200)}});
  bad({{"block_size", OptionValue::of_int(32)}});
  // The plugin's own check: options of the other kind of scaling are errors, not ignored.
  bad({{"margin", OptionValue::of_int(0)}});
  bad({{"amax_history_len", OptionValue::of_int(16)}});
  bad({{"scaling", OptionValue::of_enum("current")},
       {"amax_compute_algo", OptionValue::of_enum("max")}});
  bad({{"scaling", OptionValue::of_enum("delayed")}, {"pow2_scales", OptionValue::of_bool(true)}});
  bad({{"scaling", OptionValue::of_enum("delayed")},
       {"amax_epsilon", OptionValue::of_float(0.0)}});
  // ... and the message says what to do.
  try {
    engine->make_quantizer(float8({{"margin", OptionValue::of_int(1)}}), role());
    FAIL("expected an error");
  } catch (const qrecipe::Error& e) {
    CHECK(std::string(e.what()).find("only applies to scaling: delayed") != std::string::npos);
  }
  // Valid extremes are accepted.
  CHECK(engine->make_quantizer(float8({{"scaling", OptionValue::of_enum("delayed")},
                                       {"amax_history_len", OptionValue::of_int(1)},
                                       {"margin", OptionValue::of_int(-3)}}),
                               role()) != nullptr);
}

// ---------------------------------------------------------------- 3. known answers, current

TEST_CASE("float8 E4M3 current scaling: exact power-of-two scale") {
  // amax = 7 -> scale = 448 / 7 = 64 (exact), scale_inv = 1/64.
  // x * 64 = {64, -128, 224, 32, 448, -16}:
  //   64   = 2^6          e = 6+7 = 13  -> 0 1101 000 = 0x68
  //  -128  = 2^7          e = 14        -> 1 1110 000 = 0xF0
  //   224  = 1.75 * 2^7   e = 14, m = 6 -> 0 1110 110 = 0x76
  //   32   = 2^5          e = 12        -> 0 1100 000 = 0x60
  //   448  = max                        -> 0x7E
  //  -16   = 2^4          e = 11        -> 1 1011 000 = 0xD8
  auto r = quantize_f32(float8(), {1.0f, -2.0f, 3.5f, 0.5f, 7.0f, -0.25f}, {2, 3});
  check_both(r.tensor, {0x68, 0xF0, 0x76, 0x60, 0x7E, 0xD8}, 2, 3, 1.0f / 64.0f, 7.0f);
  CHECK(r.tensor.layout(kRowDir).data_dtype == QR_DTYPE_E4M3);
}

TEST_CASE("float8 E4M3 current scaling: inexact scale, order of operations") {
  // amax = 3 -> scale = fl32(448 / 3) = 9786709 * 2^-16 = 149.33332824707031 (0x43155555).
  //   1 * scale = 149.33: in [128, 256) the E4M3 step is 16: 144 (m=1) is 5.33 away, 160 is
  //               10.67 away -> 144 = 1.125 * 2^7 -> 0 1110 001 = 0x71
  //   3 * scale = 29360127 * 2^-16, which is exactly halfway between two FP32 values in
  //               [256, 512) (step 2^-15); ties-to-even gives 448.0 -> 0x7E.
  // scale_inv = fl32(1 / scale) = 0x3BDB6DB7.
  auto r = quantize_f32(float8(), {1.0f, 3.0f}, {1, 2});
  check_both(r.tensor, {0x71, 0x7E}, 1, 2, 1.0f / (448.0f / 3.0f), 3.0f);
  CHECK(bits(scale_inv(r.tensor, kRowDir)) == 0x3BDB6DB7u);
}

TEST_CASE("float8 E4M3 round to nearest even, subnormals") {
  // amax = 448 -> scale = 1.
  //   17: in [16, 32) step 2, halfway between 16 (m=0) and 18 (m=1) -> even m=0 -> 0x58
  //   18: -> 0 1011 001 = 0x59
  //   19: halfway between 18 (m=1) and 20 (m=2) -> m=2 -> 0x5A
  //   2^-10: half of the smallest subnormal 2^-9 -> tie to 0 -> 0x00
  //   3 * 2^-10 = 1.5 * 2^-9: tie between m=1 and m=2 -> 0x02
  //   0.01 / 2^-9 = 5.12 -> m = 5 -> 0x05
  //   7.5 * 2^-9: tie between 7 and 8 -> 8 * 2^-9 = 2^-6, the smallest normal 0 0001 000 = 0x08
  //   -0.0 keeps its sign -> 0x80
  auto r = quantize_f32(float8(),
                        {448.0f, 17.0f, 18.0f, 19.0f, std::ldexp(1.0f, -10),
                         std::ldexp(3.0f, -10), 0.01f, std::ldexp(7.5f, -9), -0.0f},
                        {3, 3});
  check_both(r.tensor, {0x7E, 0x58, 0x59, 0x5A, 0x00, 0x02, 0x05, 0x08, 0x80}, 3, 3, 1.0f,
             448.0f);
}

TEST_CASE("float8 E5M2 is the default for grad_output") {
  // amax = 7 -> scale = 57344 / 7 = 8192 (exact). x * 8192:
  //   57344               -> max 0x7B
  //  -8192  = 2^13        e = 28       -> 1 11100 00 = 0xF0
  //   4096  = 2^12        e = 27       -> 0 11011 00 = 0x6C
  //   24576 = 1.5 * 2^14  e = 29, m=2  -> 0 11101 10 = 0x76
  //   18432 = 1.125 * 2^14: tie between m=0 and m=1 -> m=0 -> 0 11101 00 = 0x74
  //   22528 = 1.375 * 2^14: tie between m=1 and m=2 -> m=2 -> 0x76
  //   0 -> 0x00, -0 -> 0x80
  auto r = quantize_f32(float8(), {7.0f, -1.0f, 0.5f, 3.0f, 2.25f, 2.75f, 0.0f, -0.0f}, {2, 4},
                        kBoth, role("grad_output"));
  CHECK(r.tensor.layout(kRowDir).data_dtype == QR_DTYPE_E5M2);
  check_both(r.tensor, {0x7B, 0xF0, 0x6C, 0x76, 0x74, 0x76, 0x00, 0x80}, 2, 4, 1.0f / 8192.0f,
             7.0f);
}

TEST_CASE("float8 pow2_scales rounds the scale down to a power of two") {
  // amax = 3 -> 448 / 3 = 149.33 -> mantissa cleared -> 128 = 2^7, scale_inv = 2^-7.
  //   3 * 128 = 384 = 1.5 * 2^8  e = 15, m = 4 -> 0 1111 100 = 0x7C (no saturation: pow2 only
  //                                              rounds the scale down)
  //   1 * 128 = 2^7                                -> 0x70
  //  -0.5 * 128 = -64 = -2^6                       -> 1 1101 000 = 0xE8
  auto r = quantize_f32(float8({{"pow2_scales", OptionValue::of_bool(true)}}),
                        {3.0f, 1.0f, -0.5f}, {1, 3});
  check_both(r.tensor, {0x7C, 0x70, 0xE8}, 1, 3, 1.0f / 128.0f, 3.0f);
}

TEST_CASE("float8 amax_epsilon raises a small amax before the scale") {
  // amax = 0.002 < eps = 1 -> amax 1 -> scale 448. The stored amax stays the tensor's 0.002.
  //   0.001 * 448 = 0.448 = 1.792 * 2^-2: m = 0.792 * 8 = 6.34 -> 6 -> 0 0101 110 = 0x2E
  //  -0.002 * 448 = -0.896 = -1.792 * 2^-1: m = 6 -> 1 0110 110 = 0xB6
  auto r = quantize_f32(float8({{"amax_epsilon", OptionValue::of_float(1.0)}}),
                        {0.001f, -0.002f}, {2, 1});
  check_both(r.tensor, {0x2E, 0xB6}, 2, 1, 1.0f / 448.0f, 0.002f);
  // An amax above eps is unaffected: amax 7 -> scale 64 as before.
  auto r2 = quantize_f32(float8({{"amax_epsilon", OptionValue::of_float(1.0)}}), {7.0f, 1.0f},
                         {1, 2});
  check_both(r2.tensor, {0x7E, 0x68}, 1, 2, 1.0f / 64.0f, 7.0f);
}

TEST_CASE("float8 bf16 and f16 sources give the bytes of the same values in f32") {
  // Same values as the first known-answer test: {1, -2, 3.5, 0.5, 7, -0.25}.
  const Bytes expected = {0x68, 0xF0, 0x76, 0x60, 0x7E, 0xD8};
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  std::vector<std::uint16_t> bf16 = {0x3F80, 0xC000, 0x4060, 0x3F00, 0x40E0, 0xBE80};
  auto t = q->quantize(TensorView(bf16.data(), DType::bf16, {2, 3}), kBoth);
  check_both(t, expected, 2, 3, 1.0f / 64.0f, 7.0f);
  std::vector<std::uint16_t> f16 = {0x3C00, 0xC000, 0x4300, 0x3800, 0x4700, 0xB400};
  auto t2 = q->quantize(TensorView(f16.data(), DType::f16, {2, 3}), kBoth);
  check_both(t2, expected, 2, 3, 1.0f / 64.0f, 7.0f);
}

TEST_CASE("float8 reads strided and N-D sources in logical order") {
  // Storage [3, 2] = {{1, 0.5}, {-2, 7}, {3.5, -0.25}}; the view is its transpose [2, 3] with
  // strides {1, 2}: logical rows {1, -2, 3.5} and {0.5, 7, -0.25}.
  std::vector<float> storage = {1.0f, 0.5f, -2.0f, 7.0f, 3.5f, -0.25f};
  TensorView view(storage.data(), DType::f32, {2, 3});
  view.c().strides[0] = 1;
  view.c().strides[1] = 2;
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  check_both(q->quantize(view, kBoth), {0x68, 0xF0, 0x76, 0x60, 0x7E, 0xD8}, 2, 3, 1.0f / 64.0f,
             7.0f);
  // A 3-D tensor [2, 1, 3] is the 2-D [2, 3].
  auto r = quantize_f32(float8(), {1.0f, -2.0f, 3.5f, 0.5f, 7.0f, -0.25f}, {2, 1, 3});
  CHECK(r.tensor.rows() == 2);
  CHECK(r.tensor.cols() == 3);
  check_both(r.tensor, {0x68, 0xF0, 0x76, 0x60, 0x7E, 0xD8}, 2, 3, 1.0f / 64.0f, 7.0f);
}

TEST_CASE("float8 compute_amax ignores NaN and takes |x|") {
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  std::vector<float> x = {kNaN, -3.0f, 2.0f, -kNaN};
  const auto a = q->compute_amax(f32_view(x, {4}));
  CHECK(a[0] == 3.0f);
  CHECK(a[1] == 3.0f);
  std::vector<float> empty;
  CHECK(q->compute_amax(TensorView(nullptr, DType::f32, {0, 5}))[0] == 0.0f);
}

TEST_CASE("float8 current scaling uses a caller-reduced amax") {
  // Reduced amax 4 (another rank held the 4) -> scale 448 / 4 = 112.
  //   1 * 112 = 1.75 * 2^6  e = 13, m = 6 -> 0 1101 110 = 0x6E
  //   2 * 112 = 224         -> 0x76
  QuantizeOptions options;
  options.amax = std::array<float, 2>{4.0f, 4.0f};
  auto r = quantize_f32(float8(), {1.0f, 2.0f}, {1, 2}, kBoth, role(), options);
  check_both(r.tensor, {0x6E, 0x76}, 1, 2, 1.0f / 112.0f, 4.0f);
  // The entry of the requested direction decides: rowwise -> amax[0], columnwise only ->
  // amax[1] (a hybrid may pass another format's columnwise amax in the other slot).
  options.amax = std::array<float, 2>{4.0f, 999.0f};
  auto rw = quantize_f32(float8(), {1.0f, 2.0f}, {1, 2}, kRow, role(), options);
  CHECK(bytes(rw.tensor, kRowDir) == Bytes{0x6E, 0x76});
  CHECK(rw.tensor.amax(kRowDir) == 4.0f);
  options.amax = std::array<float, 2>{999.0f, 4.0f};
  auto cw = quantize_f32(float8(), {1.0f, 2.0f}, {2, 1}, kCol, role(), options);
  CHECK(bytes(cw.tensor, kColDir) == Bytes{0x6E, 0x76});
  CHECK(scale_inv(cw.tensor, kColDir) == 1.0f / 112.0f);
  // A reduced amax smaller than the tensor's saturates: amax 448 -> scale 1,
  // 1000 -> 0x7E, -1000 -> 0xFE, 1 -> 2^0: e = 7 -> 0 0111 000 = 0x38.
  options.amax = std::array<float, 2>{448.0f, 448.0f};
  auto s = quantize_f32(float8(), {1000.0f, -1000.0f, 1.0f}, {1, 3}, kBoth, role(), options);
  check_both(s.tensor, {0x7E, 0xFE, 0x38}, 1, 3, 1.0f, 448.0f);
}

// ---------------------------------------------------------------- 4. edge cases

TEST_CASE("float8 edge: all zeros give scale 1 and keep the sign of zero") {
  auto r = quantize_f32(float8(), {0.0f, -0.0f, 0.0f, 0.0f}, {2, 2});
  check_both(r.tensor, {0x00, 0x80, 0x00, 0x00}, 2, 2, 1.0f, 0.0f);
}

TEST_CASE("float8 edge: NaN stays NaN and does not count in the amax") {
  // amax = 2 (NaN ignored) -> scale 224. NaN -> 0x7F; 2 * 224 = 448 -> 0x7E;
  // -1 * 224 = -1.75 * 2^7 -> 1 1110 110 = 0xF6.
  auto r = quantize_f32(float8(), {kNaN, 2.0f, -1.0f}, {3, 1});
  check_both(r.tensor, {0x7F, 0x7E, 0xF6}, 3, 1, 1.0f / 224.0f, 2.0f);
  // E5M2 NaN is 0x7F too (the satfinite canonical NaN).
  auto e = quantize_f32(float8(), {kNaN, 7.0f}, {1, 2}, kBoth, role("grad_output"));
  check_both(e.tensor, {0x7F, 0x7B}, 1, 2, 1.0f / 8192.0f, 7.0f);
  // Only NaN: amax 0 -> scale 1.
  auto n = quantize_f32(float8(), {kNaN}, {1, 1});
  check_both(n.tensor, {0x7F}, 1, 1, 1.0f, 0.0f);
}

TEST_CASE("float8 edge: inf amax gives scale 1 and inf saturates") {
  // amax = inf -> scale 1.0. inf -> 0x7E, 1 -> 0x38, -inf -> 0xFE. The amax stored is inf.
  auto r = quantize_f32(float8(), {kInf, 1.0f, -kInf}, {1, 3});
  check_both(r.tensor, {0x7E, 0x38, 0xFE}, 1, 3, 1.0f, kInf);
  // E5M2: inf -> 0x7B, 1 = 2^0: e = 15 -> 0 01111 00 = 0x3C, -inf -> 0xFB.
  auto e = quantize_f32(float8(), {kInf, 1.0f, -kInf}, {1, 3}, kBoth, role("grad_output"));
  check_both(e.tensor, {0x7B, 0x3C, 0xFB}, 1, 3, 1.0f, kInf);
}

TEST_CASE("float8 edge: denormal inputs and an overflowing scale") {
  // amax 448 -> scale 1; FP32 denormals +-1e-40 are far below half the smallest E4M3
  // subnormal (2^-10) -> +-0.
  auto r = quantize_f32(float8(), {1e-40f, -1e-40f, 448.0f}, {1, 3});
  check_both(r.tensor, {0x00, 0x80, 0x7E}, 1, 3, 1.0f, 448.0f);
  // amax = 2^-130 (an FP32 denormal): 448 / 2^-130 overflows -> scale = FLT_MAX,
  // scale_inv = 1 / FLT_MAX (a denormal, kept: no flush to zero).
  // 2^-130 * FLT_MAX = 2^-130 * (2^128 - 2^104) = 2^-2 - 2^-26 (exact in FP32), which
  // rounds up to 2^-2 in E4M3 (m = 7.99... -> carry) -> e = 5 -> 0 0101 000 = 0x28; -x -> 0xA8.
  const float tiny = std::ldexp(1.0f, -130);
  auto d = quantize_f32(float8(), {tiny, -tiny}, {2, 1});
  check_both(d.tensor, {0x28, 0xA8}, 2, 1, 1.0f / FLT_MAX, tiny);
  CHECK(scale_inv(d.tensor, kRowDir) > 0.0f);
}

TEST_CASE("float8 edge: single element and empty tensors") {
  // amax 5 -> scale = fl32(448 / 5) = 89.599998474121094; -5 * scale = -447.99999237 rounds in
  // FP32 (step 2^-15 in [256, 512)) to -448.0 -> 0xFE.
  auto r = quantize_f32(float8(), {-5.0f}, {1});
  CHECK(r.tensor.rows() == 1);
  CHECK(r.tensor.cols() == 1);
  check_both(r.tensor, {0xFE}, 1, 1, 1.0f / (448.0f / 5.0f), 5.0f);

  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{0, 4}, std::vector<std::int64_t>{3, 0},
        std::vector<std::int64_t>{0}}) {
    auto engine = engine_for(float8());
    auto q = engine->make_quantizer(float8(), role());
    auto t = q->quantize(TensorView(nullptr, DType::f32, shape), kBoth);
    CHECK(bytes(t, kRowDir).empty());
    CHECK(bytes(t, kColDir).empty());
    CHECK(scale_inv(t, kRowDir) == 1.0f);
    CHECK(scale_inv(t, kColDir) == 1.0f);
    CHECK(t.amax(kRowDir) == 0.0f);
    auto out = q->dequantize(t, kColDir);
    CHECK(out.numel() == 0);
  }
}

TEST_CASE("float8 edge: CUDA tensors never fall back to the CPU reference") {
  const auto plugin = registry()->find("float8");
  REQUIRE(plugin != nullptr);
  if (plugin->supports(qrecipe::Device::cuda(0))) return;  // covered by the GPU suite
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  std::vector<float> x = {1.0f, 2.0f};
  TensorView on_gpu(x.data(), DType::f32, {1, 2}, qrecipe::Device::cuda(0));
  CHECK_THROWS_AS(q->quantize(on_gpu, kRow, {}, qrecipe::cpu_allocator()), qrecipe::Error);
  CHECK_THROWS_AS(q->compute_amax(on_gpu), qrecipe::Error);
}

// ---------------------------------------------------------------- 5. directions, into, dequantize

TEST_CASE("float8 usage: rowwise only, columnwise only, both") {
  const std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.5f, 7.0f, -0.25f};  // [3, 2]
  const Bytes rowwise = {0x68, 0xF0, 0x76, 0x60, 0x7E, 0xD8};
  const Bytes columnwise = {0x68, 0x76, 0x7E, 0xF0, 0x60, 0xD8};  // [2, 3]: the transpose

  auto row = quantize_f32(float8(), x, {3, 2}, kRow);
  CHECK(row.tensor.has(kRowDir));
  CHECK_FALSE(row.tensor.has(kColDir));
  CHECK(bytes(row.tensor, kRowDir) == rowwise);
  CHECK(scale_inv(row.tensor, kRowDir) == 1.0f / 64.0f);

  auto col = quantize_f32(float8(), x, {3, 2}, kCol);
  CHECK_FALSE(col.tensor.has(kRowDir));
  REQUIRE(col.tensor.has(kColDir));
  CHECK(col.tensor.data(kColDir).shape() == std::vector<std::int64_t>{2, 3});
  CHECK(bytes(col.tensor, kColDir) == columnwise);
  CHECK(scale_inv(col.tensor, kColDir) == 1.0f / 64.0f);
  CHECK(col.tensor.amax(kColDir) == 7.0f);

  auto both = quantize_f32(float8(), x, {3, 2}, kBoth);
  CHECK(bytes(both.tensor, kRowDir) == rowwise);
  CHECK(bytes(both.tensor, kColDir) == columnwise);
}

TEST_CASE("float8 columnwise is the transpose of rowwise on a larger random-ish tensor") {
  // 37 x 70 (not multiples of anything): values spread over many binades, with a few specials.
  const std::int64_t rows = 37, cols = 70;
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  std::uint32_t state = 12345u;
  for (auto& v : x) {
    state = state * 1664525u + 1013904223u;  // LCG: deterministic, no <random> differences
    const float mantissa = static_cast<float>(state >> 8) / 16777216.0f;  // [0, 1)
    const int exponent = static_cast<int>((state >> 3) % 24) - 12;
    v = std::ldexp(mantissa, exponent) * ((state & 1u) ? -1.0f : 1.0f);
  }
  x[5] = kNaN;
  x[77] = -0.0f;
  auto r = quantize_f32(float8(), x, {rows, cols}, kBoth);
  const Bytes row = bytes(r.tensor, kRowDir), col = bytes(r.tensor, kColDir);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      REQUIRE(col[j * rows + i] == row[i * cols + j]);
  CHECK(row[5] == 0x7F);
  CHECK(row[77] == 0x80);
  // Columnwise-only makes the same bytes.
  auto c = quantize_f32(float8(), x, {rows, cols}, kCol);
  CHECK(bytes(c.tensor, kColDir) == col);
}

TEST_CASE("float8 quantize_into requantizes in place") {
  auto engine = engine_for(float8());
  auto q = engine->make_quantizer(float8(), role());
  std::vector<float> a = {1.0f, -2.0f, 3.5f, 0.5f, 7.0f, -0.25f};
  auto t = q->quantize(f32_view(a, {2, 3}), kBoth);
  const void* row_ptr = t.data(kRowDir).data();
  // New values, same shape: amax 3 -> scale 149.33 (see the inexact-scale test):
  //   3 -> 0x7E, 1 -> 0x71, 0 -> 0x00, -1 -> 0xF1, -3 -> 0xFE, 0 -> 0x00
  std::vector<float> b = {3.0f, 1.0f, 0.0f, -1.0f, -3.0f, 0.0f};
  q->quantize_into(f32_view(b, {2, 3}), t);
  CHECK(t.data(kRowDir).data() == row_ptr);
  check_both(t, {0x7E, 0x71, 0x00, 0xF1, 0xFE, 0x00}, 2, 3, 1.0f / (448.0f / 3.0f), 3.0f);
  // A source of another shape is refused.
  std::vector<float> c = {1.0f, 2.0f};
  CHECK_THROWS_AS(q->quantize_into(f32_view(c, {1, 2}), t), qrecipe::Error);
}

TEST_CASE("float8 dequantize: q * scale_inv, either direction, f32 or bf16") {
  // Exact values come back exactly (scale 64, codes exact).
  const std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.5f, 7.0f, -0.25f};
  auto r = quantize_f32(float8(), x, {2, 3}, kBoth);
  for (const qr_direction d : {kRowDir, kColDir}) {
    auto out = r.quantizer->dequantize(r.tensor, d);
    REQUIRE(out.shape() == std::vector<std::int64_t>{2, 3});
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(bits(out.data_as<float>()[i]) == bits(x[i]));
  }
  // Rounded values decode to the FP8 grid value times scale_inv (one FP32 multiply).
  auto t = quantize_f32(float8(), {1.0f, 3.0f, kNaN, -5.0f}, {2, 2}, kBoth);
  // amax 5 -> scale 89.6: 1 * 89.6 = 1.4 * 2^6 -> m = 3.2 -> 3 -> 88 (0x6B);
  // 3 * 89.6 = 268.8 = 1.05 * 2^8 -> m = 0.4 -> 0 -> 256 (0x78); NaN -> 0x7F; -5 -> -448 (0xFE).
  check_both(t.tensor, {0x6B, 0x78, 0x7F, 0xFE}, 2, 2, 1.0f / (448.0f / 5.0f), 5.0f);
  const float si5 = 1.0f / (448.0f / 5.0f);
  for (const qr_direction d : {kRowDir, kColDir}) {
    auto o = t.quantizer->dequantize(t.tensor, d);
    CHECK(bits(o.data_as<float>()[0]) == bits(88.0f * si5));
    CHECK(bits(o.data_as<float>()[1]) == bits(256.0f * si5));
    CHECK(bits(o.data_as<float>()[2]) == 0x7FC00000u);  // the quiet NaN, no payload games
    CHECK(bits(o.data_as<float>()[3]) == bits(-448.0f * si5));
  }
  // bf16 output rounds the FP32 product to nearest even (si5 = 0x3C36DB6E):
  //   88 * si5  = 0x3F7B6DB7 -> low half 0x6DB7 < 0x8000 -> 0x3F7B
  //   256 * si5 = 0x4036DB6E -> low half 0xDB6E > 0x8000 -> 0x4037
  //   NaN -> 0x7FC0;  -448 * si5 = -5.0 = 0xC0A00000 -> 0xC0A0
  std::vector<std::uint16_t> rounded(4);
  t.quantizer->dequantize(t.tensor, kColDir, TensorView(rounded.data(), DType::bf16, {2, 2}));
  CHECK(rounded == std::vector<std::uint16_t>{0x3F7B, 0x4037, 0x7FC0, 0xC0A0});
  // Exact values in bf16: 7 -> 0x40E0, -0.25 -> 0xBE80, ...
  std::vector<std::uint16_t> bf(6);
  r.quantizer->dequantize(r.tensor, kRowDir, TensorView(bf.data(), DType::bf16, {2, 3}));
  CHECK(bf == std::vector<std::uint16_t>{0x3F80, 0xC000, 0x4060, 0x3F00, 0x40E0, 0xBE80});
}

// ---------------------------------------------------------------- 6. delayed scaling

namespace {
QuantizerSpec delayed(Opts extra = {}) {
  Opts o = {{"scaling", OptionValue::of_enum("delayed")}};
  for (auto& e : extra) o.push_back(std::move(e));
  return float8(std::move(o));
}

// Quantizes `x` as a [1, n] tensor with q, both directions; returns the tensor.
QuantizedTensor run(const Quantizer& q, std::vector<float> x, QuantizeOptions options = {}) {
  return q.quantize(TensorView(x.data(), DType::f32, {1, static_cast<std::int64_t>(x.size())}),
                    kBoth, options);
}
}  // namespace

TEST_CASE("float8 delayed scaling: history roll with amax_compute_algo max") {
  const QuantizerSpec spec = delayed({{"amax_history_len", OptionValue::of_int(4)}});
  auto engine = engine_for(spec);
  auto q = engine->make_quantizer(spec, role());
  REQUIRE(engine->scaling_states().size() == 1);
  CHECK(*state(*engine).scale == 1.0f);  // history zeros, scale 1 before the first update
  CHECK(history(*engine) == std::vector<float>{0, 0, 0, 0});

  // Step 1: scale 1. {2, -1} -> 2 = 2^1: e = 8 -> 0x40; -1 -> 1 0111 000 = 0xB8.
  auto t = run(*q, {2.0f, -1.0f});
  check_both(t, {0x40, 0xB8}, 1, 2, 1.0f, 2.0f);
  CHECK(history(*engine)[0] == 2.0f);
  // A second tensor in the same step max-accumulates into row 0; it does not change the scale.
  auto t2 = run(*q, {4.0f});
  check_both(t2, {0x48}, 1, 1, 1.0f, 4.0f);  // 4 = 2^2: e = 9 -> 0 1001 000 = 0x48
  CHECK(history(*engine)[0] == 4.0f);
  run(*q, {3.0f});
  CHECK(history(*engine)[0] == 4.0f);
  // Update: last = 4, amax = max(0, 0, 0, 4) = 4, scale = 448 / 4 = 112; roll.
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 0, 0, 4});
  CHECK(*state(*engine).scale == 112.0f);

  // Step 2 uses 112: 1 * 112 = 1.75 * 2^6 -> 0x6E; 8 * 112 = 896 saturates -> 0x7E.
  t = run(*q, {1.0f, 8.0f});
  check_both(t, {0x6E, 0x7E}, 1, 2, 1.0f / 112.0f, 8.0f);
  engine->update_scaling();  // last 8: amax = max(0, 0, 4, 8) = 8 -> scale 56
  CHECK(history(*engine) == std::vector<float>{0, 0, 4, 8});
  CHECK(*state(*engine).scale == 56.0f);

  // Step 3: an all-zero step changes nothing.
  run(*q, {0.0f, -0.0f});
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 0, 4, 8});
  CHECK(*state(*engine).scale == 56.0f);
  // ... and neither does a step without any quantize.
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 0, 4, 8});

  // Step 4: 2 * 56 = 112 -> 0x6E. Update: amax = max(0, 4, 8, 2) = 8 -> scale stays 56.
  t = run(*q, {2.0f});
  check_both(t, {0x6E}, 1, 1, 1.0f / 56.0f, 2.0f);
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 4, 8, 2});
  CHECK(*state(*engine).scale == 56.0f);
  // Steps 5 and 6 (amax 1): the 8 is still inside the window (rows 1..3 plus last).
  run(*q, {1.0f});
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 8, 2, 1});
  CHECK(*state(*engine).scale == 56.0f);
  run(*q, {1.0f});
  engine->update_scaling();  // amax = max(8, 2, 1, 1) = 8: old row 1 counts one last time
  CHECK(history(*engine) == std::vector<float>{0, 2, 1, 1});
  CHECK(*state(*engine).scale == 56.0f);
  // Step 7: the 8 has dropped out: amax = max(2, 1, 1, 1) = 2 -> scale 224.
  run(*q, {1.0f});
  engine->update_scaling();
  CHECK(history(*engine) == std::vector<float>{0, 1, 1, 1});
  CHECK(*state(*engine).scale == 224.0f);
  CHECK(*state(*engine).scale_inv == 1.0f / 224.0f);
}

TEST_CASE("float8 delayed scaling: most_recent, margin, history_len 1") {
  SUBCASE("most_recent follows the last step only") {
    const QuantizerSpec spec = delayed({{"amax_history_len", OptionValue::of_int(4)},
                                        {"amax_compute_algo", OptionValue::of_enum("most_recent")}});
    auto engine = engine_for(spec);
    auto q = engine->make_quantizer(spec, role());
    run(*q, {4.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 112.0f);  // 448 / 4
    run(*q, {8.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 56.0f);  // 448 / 8
    run(*q, {2.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 224.0f);  // 448 / 2 (max would have kept 56)
    CHECK(history(*engine) == std::vector<float>{0, 4, 8, 2});
  }
  SUBCASE("margin divides fp8_max by 2^margin") {
    const QuantizerSpec spec = delayed({{"margin", OptionValue::of_int(1)}});
    auto engine = engine_for(spec);
    auto q = engine->make_quantizer(spec, role());
    run(*q, {4.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 56.0f);  // (448 * 2^-1) / 4
    // 4 * 56 = 224 -> 0x76: half the range is left as headroom.
    check_both(run(*q, {4.0f}), {0x76}, 1, 1, 1.0f / 56.0f, 4.0f);
  }
  SUBCASE("E5M2 gradients use 57344") {
    const QuantizerSpec spec = delayed();
    auto engine = engine_for(spec);
    auto q = engine->make_quantizer(spec, role("grad_output"));
    run(*q, {7.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 8192.0f);  // 57344 / 7
    check_both(run(*q, {7.0f, -1.0f}), {0x7B, 0xF0}, 1, 2, 1.0f / 8192.0f, 7.0f);
  }
  SUBCASE("history_len 1: the amax is the last step's") {
    const QuantizerSpec spec = delayed({{"amax_history_len", OptionValue::of_int(1)}});
    auto engine = engine_for(spec);
    auto q = engine->make_quantizer(spec, role());
    run(*q, {4.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 112.0f);
    CHECK(history(*engine) == std::vector<float>{0});
    run(*q, {8.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 56.0f);
    run(*q, {2.0f});
    engine->update_scaling();
    CHECK(*state(*engine).scale == 224.0f);
  }
}

TEST_CASE("float8 delayed scaling: reduced amaxes and infinities") {
  const QuantizerSpec spec = delayed({{"amax_history_len", OptionValue::of_int(2)}});
  auto engine = engine_for(spec);
  auto q = engine->make_quantizer(spec, role());
  // A caller-reduced amax passed to quantize is what accumulates (the tensor's is not computed).
  QuantizeOptions options;
  options.amax = std::array<float, 2>{16.0f, 16.0f};
  check_both(run(*q, {1.0f}, options), {0x38}, 1, 1, 1.0f, 16.0f);
  CHECK(history(*engine)[0] == 16.0f);
  // The amax reduced across ranks at update time wins over row 0.
  engine->update_scaling({32.0f});
  CHECK(*state(*engine).scale == 14.0f);  // 448 / 32
  CHECK(history(*engine) == std::vector<float>{0, 32});
  // An infinite amax enters the history but keeps the scale (not finite).
  run(*q, {kInf});
  CHECK(history(*engine)[0] == kInf);
  engine->update_scaling();
  CHECK(*state(*engine).scale == 14.0f);
  // A NaN element does not count; it is encoded as NaN with the stored scale.
  auto t = run(*q, {kNaN, 1.0f});  // 1 * 14 = 1.75 * 2^3 -> e = 10, m = 6 -> 0x56
  check_both(t, {0x7F, 0x56}, 1, 2, 1.0f / 14.0f, 1.0f);
  CHECK(history(*engine)[0] == 1.0f);
}

TEST_CASE("float8 delayed scaling: one state per quantizer, owned by the engine") {
  const QuantizerSpec spec = delayed({{"amax_history_len", OptionValue::of_int(3)}});
  auto engine = engine_for(spec);
  auto input = engine->resolve(role("input"));
  auto grad = engine->resolve(role("grad_output"));
  CHECK(engine->resolve(role("input")) == input);  // cached per role: no new state
  REQUIRE(engine->scaling_states().size() == 2);
  run(*input, {4.0f});
  run(*grad, {7.0f});
  CHECK(engine->current_amaxes() == std::vector<float>{4.0f, 7.0f});
  engine->update_scaling();
  CHECK(*state(*engine, 0).scale == 112.0f);   // E4M3: 448 / 4
  CHECK(*state(*engine, 1).scale == 8192.0f);  // E5M2: 57344 / 7
}

// ---------------------------------------------------------------- 7. conformance suite

TEST_CASE("float8 passes the shared conformance suite") {
  namespace conf = qrecipe::conformance;
  // Bounds, for x with tensor amax A (per-tensor scaling: the "block" is the whole tensor):
  //   rel_element  RNE to 1 + kMan mantissa bits: half an ulp is 2^-(kMan+1) of |x| (E4M3
  //                2^-4, E5M2 2^-3), plus 2^-20 for the two FP32 roundings (x * scale and
  //                q * scale_inv, 2^-24 each, with room to spare).
  //   rel_block    below the smallest normal the step is the smallest subnormal s (E4M3
  //                2^-9, E5M2 2^-16); half of it, divided by the scale fmax / A, is
  //                (s / 2) / fmax * A. A scale rounded down to a power of two (pow2_scales),
  //                or fmax halved by margin 1, at most doubles that: s / fmax * A.
  //   abs          a scale capped at FLT_MAX (A below fmax / FLT_MAX, FP32 subnormals):
  //                the decode floor is s / 2 * (1 / FLT_MAX) < 2^-137 (E4M3) or 2^-144 (E5M2).
  //                amax_epsilon e raises A to e for tiny tensors: add (s / 2) / fmax * e.
  const conf::ErrorBound e4m3{.rel_element = 0x1p-4 + 0x1p-20,
                              .rel_block = 0x1p-10 / 448.0,
                              .abs = 0x1p-137};
  const conf::ErrorBound e4m3_pow2{.rel_element = 0x1p-4 + 0x1p-20,
                                   .rel_block = 0x1p-9 / 448.0,
                                   .abs = 0x1p-137};
  const conf::ErrorBound e5m2{.rel_element = 0x1p-3 + 0x1p-20,
                              .rel_block = 0x1p-17 / 57344.0,
                              .abs = 0x1p-144};
  conf::ErrorBound e4m3_eps = e4m3;
  e4m3_eps.abs = 0x1p-137 + 0x1p-10 / 448.0 * 1e-6;
  const conf::Properties props{.columnwise_is_transpose = true};
  const QuantizerRole grad{"linear", "grad_output", "conformance"};

  conf::run({.format = "float8",
             .cases = {
                 {.spec = conf::spec("float8"), .bound = e4m3, .properties = props},
                 {.spec = conf::spec("float8"), .role = grad, .bound = e5m2,
                  .properties = props},
                 {.spec = conf::spec("float8", {{"pow2_scales", "true"}}), .bound = e4m3_pow2,
                  .properties = props},
                 {.spec = conf::spec("float8", {{"amax_epsilon", "1e-6"}}), .bound = e4m3_eps,
                  .properties = props},
                 {.spec = conf::spec("float8", {{"scaling", "delayed"}}), .bound = e4m3,
                  .properties = props},
                 {.spec = conf::spec("float8", {{"scaling", "delayed"},
                                                {"amax_compute_algo", "most_recent"},
                                                {"margin", "1"},
                                                {"amax_history_len", "16"}}),
                  .bound = e4m3_pow2, .properties = props},
                 {.spec = conf::spec("float8", {{"scaling", "delayed"}}), .role = grad,
                  .bound = e5m2, .properties = props},
             },
             .registry = registry()});
}
