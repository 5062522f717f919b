// doctest suite of the hybrid plugin, driven through the engine (registry -> plugin -> C ABI
// -> host table -> sub-plugins), never by calling plugin code directly.
//
// The reference for a hybrid is the plain sub-formats themselves: each direction of a hybrid
// must be byte for byte what the plain sub-format makes for that direction (data, scale_inv,
// amax, layout), so most checks quantize the same input both ways and compare bytes.
//
// Map
//   1. helpers (specs, engines, inputs, byte comparison)
//   2. every ordered pair of formats x usage {rowwise, columnwise, both}, two shapes
//   3. same-format hybrids equal the plain format
//   4. usage decides which side runs (state counters, a side that would fail)
//   5. caller amaxes, compute_amax, quantize_into
//   6. columnwise_source: rowwise_dequantized
//   7. stateful sub-quantizer (float8 delayed) updated by Engine::update_scaling()
//   8. describe, errors (nesting, missing side, unknown sub-format, none), scratch
//      memory of rowwise_dequantized (host table, freed on errors; CUDA sources)
//   9. the seed scenario (recipes/hybrid_seed.yaml) and recipes/hybrid_fp8_mx.yaml, GEMMs
//  10. the shared conformance suite
// A sub-format whose plugin is not built is reported with MESSAGE("not supported: ...").
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "conformance.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"
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
using qrecipe::Tensor;
using qrecipe::TensorView;

namespace {

// ---------------------------------------------------------------- 1. helpers

constexpr std::uint32_t kRow = QR_USAGE_ROWWISE;
constexpr std::uint32_t kCol = QR_USAGE_COLUMNWISE;
constexpr std::uint32_t kBoth = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
constexpr qr_direction kRowDir = QR_DIRECTION_ROWWISE;
constexpr qr_direction kColDir = QR_DIRECTION_COLUMNWISE;
const char* const kFormats[] = {"float8", "mxfp8", "nvfp4", "blockwise"};

std::shared_ptr<qrecipe::Registry> registry() {
  static const auto reg = std::make_shared<qrecipe::Registry>();
  return reg;
}

bool have(const std::string& format) { return registry()->find(format) != nullptr; }

// True when every format is loaded; otherwise reports "not supported" for the missing ones.
bool have_all(std::initializer_list<const char*> formats) {
  bool ok = true;
  for (const char* f : formats) {
    if (!have(f)) {
      MESSAGE("not supported: the ", f, " plugin is not built (loaded: ",
              registry()->loaded_names(), ")");
      ok = false;
    }
  }
  return ok;
}

using TextOptions = std::vector<std::pair<std::string, std::string>>;

// A spec whose option values are YAML text, validated by the engine like a recipe's.
QuantizerSpec spec(const std::string& format, const TextOptions& options = {}) {
  QuantizerSpec s;
  s.format = format;
  for (const auto& [k, v] : options) s.options.emplace_back(k, OptionValue::of_string(v));
  return s;
}

QuantizerSpec hybrid(const QuantizerSpec& rowwise, const QuantizerSpec& columnwise,
                     const std::string& source = "") {
  QuantizerSpec s;
  s.format = "hybrid";
  s.options.emplace_back("rowwise", OptionValue::of_spec(rowwise));
  s.options.emplace_back("columnwise", OptionValue::of_spec(columnwise));
  if (!source.empty()) s.options.emplace_back("columnwise_source", OptionValue::of_string(source));
  return s;
}

QuantizerRole role(const std::string& tensor_type = "input") {
  return {"linear", tensor_type, "layers.0.fc1"};
}

// An engine with an all-high-precision recipe; quantizers come from make_quantizer.
std::unique_ptr<Engine> make_engine() {
  return std::make_unique<Engine>(Recipe::uniform(QuantizerSpec{}), registry());
}

// Deterministic data with magnitudes over several binades (so block scales differ), signs
// mixed, and a few exact zeros.
Tensor make_input(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  Tensor t(DType::f32, {rows, cols});
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-6, 6);
  float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < rows * cols; ++i)
    p[i] = (i % 97 == 5) ? 0.0f : normal(rng) * std::ldexp(1.0f, binade(rng));
  return t;
}

Tensor to_bf16(const Tensor& x) {
  Tensor t(DType::bf16, x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    t.data_as<std::uint16_t>()[i] = qrecipe::num::f32_to_bf16(x.data_as<float>()[i]);
  return t;
}

std::vector<std::uint8_t> bytes_of(const TensorView& v) {
  if (v.data() == nullptr) return {};
  const auto* p = static_cast<const std::uint8_t*>(v.data());
  return std::vector<std::uint8_t>(p, p + v.nbytes());
}

std::vector<std::uint8_t> bytes_of(const Tensor& t) { return bytes_of(t.view()); }

// Direction d of `got` (a hybrid's) is exactly direction d of `want` (the plain format's).
void check_same_direction(const QuantizedTensor& got, const QuantizedTensor& want, qr_direction d) {
  INFO("direction ", std::string(qrecipe::direction_name(d)), " of ", want.format());
  REQUIRE(got.has(d));
  REQUIRE(want.has(d));
  const qr_direction_layout& lg = got.layout(d);
  const qr_direction_layout& lw = want.layout(d);
  REQUIRE(lg.format != nullptr);
  REQUIRE(lw.format != nullptr);
  CHECK(std::string(lg.format) == std::string(lw.format));  // plain: the sub-format's own name
  CHECK(lg.data_dtype == lw.data_dtype);
  CHECK(lg.data_ndim == lw.data_ndim);
  CHECK(lg.data_shape[0] == lw.data_shape[0]);
  CHECK(lg.data_shape[1] == lw.data_shape[1]);
  CHECK(lg.data_transposed == lw.data_transposed);
  CHECK(lg.scale_mode == lw.scale_mode);
  CHECK(lg.scale_dtype == lw.scale_dtype);
  CHECK(lg.scale_ndim == lw.scale_ndim);
  CHECK(lg.scale_shape[0] == lw.scale_shape[0]);
  CHECK(lg.scale_shape[1] == lw.scale_shape[1]);
  CHECK(lg.scale_transposed == lw.scale_transposed);
  CHECK(lg.block_rows == lw.block_rows);
  CHECK(lg.block_cols == lw.block_cols);
  CHECK(lg.has_amax == lw.has_amax);
  CHECK(bytes_of(got.data(d)) == bytes_of(want.data(d)));
  CHECK(bytes_of(got.scale_inv(d)) == bytes_of(want.scale_inv(d)));
  REQUIRE(got.has_amax(d) == want.has_amax(d));
  if (want.has_amax(d))
    CHECK(bytes_of(TensorView(got.direction(d).amax)) == bytes_of(TensorView(want.direction(d).amax)));
}

// Both decode direction d to the same FP32 bytes (the hybrid delegates to the sub-format).
void check_same_decode(const Quantizer& hq, const QuantizedTensor& h, const Quantizer& pq,
                       const QuantizedTensor& p, qr_direction d) {
  CHECK(bytes_of(hq.dequantize(h, d)) == bytes_of(pq.dequantize(p, d)));
}

std::uint32_t bit(qr_direction d) { return qrecipe::usage_bit(d); }

// ---------------------------------------------------------------- 2. every pair x usage

// Options of each format worth crossing: its defaults and one non-default variant.
std::vector<QuantizerSpec> variants(const std::string& format) {
  if (format == "float8") return {spec("float8"), spec("float8", {{"dtype", "e5m2"}, {"pow2_scales", "true"}})};
  if (format == "mxfp8") return {spec("mxfp8"), spec("mxfp8", {{"dtype", "e5m2"}})};
  if (format == "nvfp4") return {spec("nvfp4"), spec("nvfp4", {{"2d", "true"}})};
  return {spec("blockwise"), spec("blockwise", {{"block", "128x128"}})};
}

// Quantizes x with the hybrid and with the plain sub-formats and compares every direction the
// usage asks for; also checks that nothing else was allocated.
void check_pair(Engine& engine, const QuantizerSpec& row, const QuantizerSpec& col,
                const Tensor& x, std::uint32_t usage, const QuantizerRole& r) {
  INFO("hybrid rowwise=", row.str(), " columnwise=", col.str(), " usage=",
       qrecipe::usage_str(usage), " shape=", x.view().shape_str(), " role=", r.str());
  const auto hq = engine.make_quantizer(hybrid(row, col), r);
  const auto rq = engine.make_quantizer(row, r);
  const auto cq = engine.make_quantizer(col, r);
  const QuantizedTensor h = hq->quantize(x.view(), usage);
  CHECK(h.format() == "hybrid");
  CHECK(h.usage() == usage);
  for (const qr_direction d : {kRowDir, kColDir}) {
    if (!(usage & bit(d))) {
      CHECK_FALSE(h.has(d));  // the other side is neither run nor allocated
      continue;
    }
    const Quantizer& plain = d == kRowDir ? *rq : *cq;
    const QuantizedTensor p = plain.quantize(x.view(), bit(d));
    check_same_direction(h, p, d);
    check_same_decode(*hq, h, plain, p, d);
  }
}

TEST_CASE("hybrid: every ordered pair of formats, every usage, equals the plain sub-formats") {
  auto engine = make_engine();
  // 64x256: whole blocks for every format; 40x200: partial blocks everywhere (32-element MX
  // blocks down 40 rows, 16-element NVFP4 blocks along 200, 128 blockwise blocks along 200).
  const Tensor whole = make_input(64, 256, 1);
  const Tensor partial = make_input(40, 200, 2);
  for (const char* a : kFormats) {
    for (const char* b : kFormats) {
      if (!have_all({a, b})) continue;
      for (const auto& row : variants(a)) {
        for (const auto& col : variants(b)) {
          for (const std::uint32_t usage : {kRow, kCol, kBoth}) {
            check_pair(*engine, row, col, whole, usage, role("input"));
            check_pair(*engine, row, col, partial, usage, role("input"));
          }
        }
      }
      // The sub-quantizers see the hybrid's role (float8 E5M2 and blockwise defaults by role).
      check_pair(*engine, spec(a), spec(b), whole, kBoth, role("grad_output"));
      check_pair(*engine, spec(a), spec(b), whole, kBoth, role("weight"));
    }
  }
}

TEST_CASE("hybrid: a bf16 source gives the sub-formats' bf16 bytes") {
  if (!have_all({"float8", "mxfp8", "nvfp4"})) return;
  auto engine = make_engine();
  const Tensor x = to_bf16(make_input(32, 64, 3));
  const auto hq = engine->make_quantizer(hybrid(spec("mxfp8"), spec("nvfp4")), role());
  const QuantizedTensor h = hq->quantize(x.view(), kBoth);
  const auto rq = engine->make_quantizer(spec("mxfp8"), role());
  const auto cq = engine->make_quantizer(spec("nvfp4"), role());
  check_same_direction(h, rq->quantize(x.view(), kRow), kRowDir);
  check_same_direction(h, cq->quantize(x.view(), kCol), kColDir);
}

// ---------------------------------------------------------------- 3. same-format hybrids

TEST_CASE("hybrid: a same-format hybrid gives bytes identical to the plain format") {
  auto engine = make_engine();
  const Tensor x = make_input(48, 160, 4);
  for (const char* f : kFormats) {
    if (!have_all({f})) continue;
    for (const auto& s : variants(f)) {
      for (const std::string source : {"input", "rowwise_dequantized"}) {
        // Decoding a block-scaled format and re-quantizing it generally moves values, so only
        // float8 (per-tensor: q * scale_inv * scale rounds back to q) is claimed identical
        // under rowwise_dequantized; the others are covered in section 6.
        if (source == "rowwise_dequantized" && std::string(f) != "float8") continue;
        INFO(s.str(), " both sides, columnwise_source=", source);
        const auto hq = engine->make_quantizer(hybrid(s, s, source), role());
        const auto pq = engine->make_quantizer(s, role());
        const QuantizedTensor h = hq->quantize(x.view(), kBoth);
        const QuantizedTensor p = pq->quantize(x.view(), kBoth);
        check_same_direction(h, p, kRowDir);
        check_same_direction(h, p, kColDir);
      }
    }
  }
}

TEST_CASE("hybrid: float8 on both sides equals plain float8 (explicit bytes)") {
  if (!have_all({"float8"})) return;
  auto engine = make_engine();
  // x = [[1, -2], [3, 448]]: amax 448, scale = 448/448 = 1, scale_inv = 1. E4M3 codes:
  // 1 = 0x38, -2 = 0xC0, 3 = 0x44, 448 = 0x7E. Columnwise is the transpose: 0x38 0x44 0xC0 0x7E.
  Tensor x(DType::f32, {2, 2});
  const float v[4] = {1.0f, -2.0f, 3.0f, 448.0f};
  std::memcpy(x.data_as<float>(), v, sizeof v);
  const auto hq = engine->make_quantizer(hybrid(spec("float8"), spec("float8")), role());
  const QuantizedTensor h = hq->quantize(x.view(), kBoth);
  CHECK(bytes_of(h.data(kRowDir)) == std::vector<std::uint8_t>{0x38, 0xC0, 0x44, 0x7E});
  CHECK(bytes_of(h.data(kColDir)) == std::vector<std::uint8_t>{0x38, 0x44, 0xC0, 0x7E});
  CHECK(*h.scale_inv(kRowDir).data_as<float>() == 1.0f);
  CHECK(*h.scale_inv(kColDir).data_as<float>() == 1.0f);
  CHECK(h.amax(kRowDir) == 448.0f);
  CHECK(h.amax(kColDir) == 448.0f);
}

// ---------------------------------------------------------------- 4. usage decides

TEST_CASE("hybrid: rowwise only never runs the columnwise side, and the reverse") {
  if (!have_all({"float8"})) return;
  const Tensor x = make_input(16, 32, 5);
  const float amax = [&] {
    float a = 0.0f;
    for (std::int64_t i = 0; i < x.numel(); ++i) a = std::fmax(a, std::fabs(x.data_as<float>()[i]));
    return a;
  }();
  const QuantizerSpec delayed = spec("float8", {{"scaling", "delayed"}, {"amax_history_len", "4"}});
  const QuantizerSpec current = spec("float8");

  SUBCASE("a delayed columnwise side keeps an empty history under rowwise-only use") {
    auto engine = make_engine();
    const auto hq = engine->make_quantizer(hybrid(current, delayed), role());
    REQUIRE(engine->scaling_states().size() == 1);  // only the columnwise side is stateful
    const QuantizedTensor h = hq->quantize(x.view(), kRow);
    CHECK_FALSE(h.has(kColDir));
    CHECK(engine->current_amaxes() == std::vector<float>{0.0f});
    hq->quantize(x.view(), kCol);
    CHECK(engine->current_amaxes() == std::vector<float>{amax});
  }
  SUBCASE("a delayed rowwise side keeps an empty history under columnwise-only use") {
    auto engine = make_engine();
    const auto hq = engine->make_quantizer(hybrid(delayed, current), role());
    REQUIRE(engine->scaling_states().size() == 1);
    const QuantizedTensor h = hq->quantize(x.view(), kCol);
    CHECK_FALSE(h.has(kRowDir));
    CHECK(engine->current_amaxes() == std::vector<float>{0.0f});
  }
  SUBCASE("rowwise_dequantized runs the rowwise side even for columnwise only (documented)") {
    auto engine = make_engine();
    const auto hq = engine->make_quantizer(hybrid(delayed, current, "rowwise_dequantized"), role());
    const QuantizedTensor h = hq->quantize(x.view(), kCol);
    CHECK_FALSE(h.has(kRowDir));
    CHECK(engine->current_amaxes() == std::vector<float>{amax});
  }
}

TEST_CASE("hybrid: a columnwise side that would fail is not touched by rowwise-only use") {
  if (!have_all({"float8", "nvfp4"})) return;
  auto engine = make_engine();
  // nvfp4 with hadamard needs a bf16 source for its columnwise direction: an f32 source fails
  // there, and only there.
  const auto hq = engine->make_quantizer(
      hybrid(spec("float8"), spec("nvfp4", {{"hadamard", "true"}})), role());
  const Tensor x = make_input(16, 32, 6);
  const QuantizedTensor h = hq->quantize(x.view(), kRow);
  CHECK(h.has(kRowDir));
  CHECK_FALSE(h.has(kColDir));
  try {
    hq->quantize(x.view(), kCol);
    FAIL("columnwise quantize of an f32 source with nvfp4 hadamard should fail");
  } catch (const qrecipe::Error& e) {
    const std::string what = e.what();
    INFO(what);
    // The sub-quantizer's own message survives, with the hybrid side named.
    CHECK(what.find("hybrid columnwise side (nvfp4)") != std::string::npos);
    CHECK(what.find("bf16") != std::string::npos);
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
  }
  // A bf16 source serves both directions.
  const Tensor xb = to_bf16(x);
  const QuantizedTensor hb = hq->quantize(xb.view(), kBoth);
  const auto cq = engine->make_quantizer(spec("nvfp4", {{"hadamard", "true"}}), role());
  check_same_direction(hb, cq->quantize(xb.view(), kCol), kColDir);
}

// ---------------------------------------------------------------- 5. amax, quantize_into

TEST_CASE("hybrid: compute_amax takes [0] from the rowwise side and [1] from the columnwise") {
  if (!have_all({"float8", "nvfp4"})) return;
  auto engine = make_engine();
  const Tensor x = to_bf16(make_input(32, 48, 7));
  const QuantizerSpec had = spec("nvfp4", {{"hadamard", "true"}});
  const auto hq = engine->make_quantizer(hybrid(spec("float8"), had), role());
  const auto a = hq->compute_amax(x.view());
  const auto r = engine->make_quantizer(spec("float8"), role())->compute_amax(x.view());
  const auto c = engine->make_quantizer(had, role())->compute_amax(x.view());
  CHECK(a[0] == r[0]);
  CHECK(a[1] == c[1]);
  CHECK(c[0] != c[1]);  // the Hadamard transform changes the columnwise amax: the test bites
}

TEST_CASE("hybrid: caller amaxes go to their own side only") {
  if (!have_all({"float8", "nvfp4", "mxfp8"})) return;
  auto engine = make_engine();
  const Tensor x = make_input(32, 64, 8);
  // Amaxes 2x and 3x the real ones: each side must use its own. float8 takes the max of both
  // slots it is given, and nvfp4 2d insists the two slots agree, so a hybrid that forwarded
  // [amax0, amax1] unchanged would fail this.
  const std::vector<std::pair<QuantizerSpec, QuantizerSpec>> pairs = {
      {spec("float8"), spec("nvfp4")},
      {spec("nvfp4", {{"2d", "true"}}), spec("float8")},
      {spec("float8"), spec("float8", {{"dtype", "e5m2"}})},
      {spec("mxfp8"), spec("nvfp4", {{"2d", "true"}})}};
  for (const auto& pair : pairs) {
    // Not a structured binding: INFO captures by a lambda, which clang 14 does not allow on
    // one (the clang sanitizer build compiles this file).
    const QuantizerSpec& row = pair.first;
    const QuantizerSpec& col = pair.second;
    INFO(row.str(), " / ", col.str());
    const auto hq = engine->make_quantizer(hybrid(row, col), role());
    const auto rq = engine->make_quantizer(row, role());
    const auto cq = engine->make_quantizer(col, role());
    const auto real = hq->compute_amax(x.view());
    QuantizeOptions given;
    given.amax = std::array<float, 2>{2.0f * real[0], 3.0f * real[1]};
    const QuantizedTensor h = hq->quantize(x.view(), kBoth, given);
    QuantizeOptions row_given, col_given;
    row_given.amax = std::array<float, 2>{2.0f * real[0], 2.0f * real[0]};
    col_given.amax = std::array<float, 2>{3.0f * real[1], 3.0f * real[1]};
    check_same_direction(h, rq->quantize(x.view(), kRow, row_given), kRowDir);
    check_same_direction(h, cq->quantize(x.view(), kCol, col_given), kColDir);

    // Passing compute_amax's own result changes nothing.
    QuantizeOptions same;
    same.amax = real;
    const QuantizedTensor h1 = hq->quantize(x.view(), kBoth, same);
    const QuantizedTensor h2 = hq->quantize(x.view(), kBoth);
    check_same_direction(h1, h2, kRowDir);
    check_same_direction(h1, h2, kColDir);
  }
}

TEST_CASE("hybrid: quantize_into requantizes both sides in place") {
  if (!have_all({"float8", "mxfp8", "nvfp4", "blockwise"})) return;
  auto engine = make_engine();
  const Tensor x1 = make_input(64, 128, 9);
  const Tensor x2 = make_input(64, 128, 10);
  for (const std::string source : {"input", "rowwise_dequantized"}) {
    for (const auto& pair : std::vector<std::pair<QuantizerSpec, QuantizerSpec>>{
             {spec("float8"), spec("mxfp8")}, {spec("blockwise"), spec("nvfp4")}}) {
      const QuantizerSpec& row = pair.first;
      const QuantizerSpec& col = pair.second;
      INFO(row.str(), " / ", col.str(), " ", source);
      const auto hq = engine->make_quantizer(hybrid(row, col, source), role("weight"));
      QuantizedTensor h = hq->quantize(x1.view(), kBoth);
      const void* row_data = h.data(kRowDir).data();
      const void* col_data = h.data(kColDir).data();
      hq->quantize_into(x2.view(), h);
      CHECK(h.data(kRowDir).data() == row_data);  // same buffers: in place
      CHECK(h.data(kColDir).data() == col_data);
      const QuantizedTensor fresh = hq->quantize(x2.view(), kBoth);
      check_same_direction(h, fresh, kRowDir);
      check_same_direction(h, fresh, kColDir);
      // quantize_into only touches what the tensor holds.
      QuantizedTensor r = hq->quantize(x1.view(), kRow);
      hq->quantize_into(x2.view(), r);
      CHECK_FALSE(r.has(kColDir));
      check_same_direction(r, fresh, kRowDir);
    }
  }
}

// ---------------------------------------------------------------- 6. rowwise_dequantized

TEST_CASE("hybrid: columnwise_source rowwise_dequantized quantizes the decoded rowwise data") {
  auto engine = make_engine();
  const Tensor x = make_input(64, 160, 11);
  for (const char* a : kFormats) {
    for (const char* b : kFormats) {
      if (!have_all({a, b})) continue;
      const QuantizerSpec row = spec(a), col = spec(b);
      INFO("rowwise=", a, " columnwise=", b);
      const auto hq = engine->make_quantizer(hybrid(row, col, "rowwise_dequantized"), role());
      const auto rq = engine->make_quantizer(row, role());
      const auto cq = engine->make_quantizer(col, role());

      // The definition, step by step with the plain formats: quantize rowwise, decode it to
      // FP32, quantize that columnwise with the columnwise amax of the input.
      const QuantizedTensor p_row = rq->quantize(x.view(), kRow);
      const Tensor decoded = rq->dequantize(p_row, kRowDir);
      const float input_amax = cq->compute_amax(x.view())[1];
      QuantizeOptions amax_of_input;
      amax_of_input.amax = std::array<float, 2>{input_amax, input_amax};
      const QuantizedTensor p_col = cq->quantize(decoded.view(), kCol, amax_of_input);

      const QuantizedTensor h = hq->quantize(x.view(), kBoth);
      check_same_direction(h, p_row, kRowDir);
      check_same_direction(h, p_col, kColDir);
      // Columnwise only: the rowwise side runs into scratch, same columnwise bytes.
      const QuantizedTensor hc = hq->quantize(x.view(), kCol);
      CHECK_FALSE(hc.has(kRowDir));
      check_same_direction(hc, p_col, kColDir);
      // Rowwise only: just the rowwise side.
      check_same_direction(hq->quantize(x.view(), kRow), p_row, kRowDir);
      // Formats without a tensor amax equal a plain quantize of the decoded data outright.
      if (std::string(b) == "mxfp8" || std::string(b) == "blockwise")
        check_same_direction(h, cq->quantize(decoded.view(), kCol), kColDir);
      // And the mode matters: the input mode differs for a lossy rowwise side (nvfp4).
      if (std::string(a) == "nvfp4") {
        const auto iq = engine->make_quantizer(hybrid(row, col), role());
        CHECK(bytes_of(iq->quantize(x.view(), kCol).data(kColDir)) !=
              bytes_of(hc.data(kColDir)));
      }
    }
  }
}

// ---------------------------------------------------------------- 7. delayed scaling

TEST_CASE("hybrid: a delayed-scaling float8 side gets its history updated by the engine") {
  if (!have_all({"float8", "mxfp8"})) return;
  const QuantizerSpec delayed = spec("float8", {{"scaling", "delayed"}, {"amax_history_len", "4"}});
  Engine engine(Recipe::uniform(hybrid(delayed, spec("mxfp8"))), registry());
  Engine plain_engine(Recipe::uniform(delayed), registry());
  const auto hq = engine.resolve(role());
  const auto pq = plain_engine.resolve(role());
  REQUIRE(engine.scaling_states().size() == 1);
  const auto& state = engine.scaling_states()[0]->c;
  REQUIRE(state.history_len == 4);

  const Tensor x1 = make_input(32, 64, 12);
  const Tensor x2 = make_input(32, 64, 13);
  const float a1 = plain_engine.make_quantizer(spec("float8"), role())->compute_amax(x1.view())[0];

  // Step 1: scale 1.0 (fresh state), the amax lands in history row 0.
  QuantizedTensor h = hq->quantize(x1.view(), kBoth);
  check_same_direction(h, pq->quantize(x1.view(), kRow), kRowDir);
  CHECK(*h.scale_inv(kRowDir).data_as<float>() == 1.0f);
  CHECK(state.amax_history[0] == a1);

  // Update: history [a1, 0, 0, 0] rolls to [0, 0, 0, a1]; scale = 448 / max(0, 0, 0, a1).
  engine.update_scaling();
  plain_engine.update_scaling();
  CHECK(state.amax_history[0] == 0.0f);
  CHECK(state.amax_history[3] == a1);
  CHECK(*state.scale == 448.0f / a1);

  // Step 2 uses the updated scale, exactly like the plain delayed quantizer.
  const QuantizedTensor h2 = hq->quantize(x2.view(), kBoth);
  const QuantizedTensor p2 = pq->quantize(x2.view(), kRow);
  check_same_direction(h2, p2, kRowDir);
  CHECK(*h2.scale_inv(kRowDir).data_as<float>() == 1.0f / (448.0f / a1));
  CHECK(engine.current_amaxes() == plain_engine.current_amaxes());
}

// ---------------------------------------------------------------- 8. describe, errors

TEST_CASE("hybrid: describe names both sides' resolved options and the source") {
  if (!have_all({"float8", "mxfp8"})) return;
  auto engine = make_engine();
  const auto hq = engine->make_quantizer(hybrid(spec("float8"), spec("mxfp8")), role());
  const std::string f8 = engine->make_quantizer(spec("float8"), role())->describe();
  const std::string mx = engine->make_quantizer(spec("mxfp8"), role())->describe();
  CHECK(f8.rfind("float8{", 0) == 0);
  CHECK(mx.rfind("mxfp8{", 0) == 0);
  CHECK(hq->describe() ==
        "hybrid{rowwise=" + f8 + ", columnwise=" + mx + ", columnwise_source=input}");
  const auto dq = engine->make_quantizer(
      hybrid(spec("float8"), spec("mxfp8"), "rowwise_dequantized"), role());
  CHECK(dq->describe() ==
        "hybrid{rowwise=" + f8 + ", columnwise=" + mx + ", columnwise_source=rowwise_dequantized}");
}

TEST_CASE("hybrid: layout is each side's own layout") {
  if (!have_all({"float8", "nvfp4"})) return;
  auto engine = make_engine();
  const auto hq = engine->make_quantizer(hybrid(spec("float8"), spec("nvfp4")), role());
  const auto row = hq->layout(32, 64, kRowDir);
  const auto col = hq->layout(32, 64, kColDir);
  CHECK(std::string(row.format) == "float8");
  CHECK(row.data_dtype == QR_DTYPE_E4M3);
  CHECK(row.scale_mode == QR_SCALE_TENSOR);
  CHECK(std::string(col.format) == "nvfp4");
  CHECK(col.data_dtype == QR_DTYPE_E2M1);
  CHECK(col.scale_mode == QR_SCALE_BLOCK_TENSOR);
  CHECK(col.data_transposed == 1);
}

std::string recipe_error(const std::string& yaml, const std::string& file) {
  try {
    Engine engine(Recipe::parse(yaml, file), registry());
  } catch (const qrecipe::RecipeError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("hybrid: nesting a hybrid in a hybrid is a clear error naming file:line:column") {
  if (!have_all({"float8", "mxfp8"})) return;
  const std::string yaml =
      "version: 1\n"
      "rules:\n"
      "  - match: {tensor_type: weight}\n"
      "    quantizer:\n"
      "      format: hybrid\n"
      "      rowwise: {format: float8}\n"
      "      columnwise:\n"
      "        format: hybrid\n"  // line 8
      "        rowwise: {format: float8}\n"
      "        columnwise: {format: mxfp8}\n";
  const std::string what = recipe_error(yaml, "nested.yaml");
  INFO(what);
  REQUIRE_FALSE(what.empty());
  CHECK(what.find("nested.yaml:8:9") != std::string::npos);  // the nested spec's map
  CHECK(what.find("a nested spec cannot nest again: format 'hybrid' takes nested quantizers "
                  "itself") != std::string::npos);
  CHECK(what.find("(loaded: ") != std::string::npos);  // the formats that can be nested
  CHECK(what.find("columnwise") != std::string::npos);  // the key path

  // The same through code: validate_spec refuses it too.
  CHECK_THROWS_WITH_AS(
      qrecipe::validate_spec(hybrid(spec("float8"), hybrid(spec("float8"), spec("mxfp8"))),
                             *registry()),
      doctest::Contains("a nested spec cannot nest again"), qrecipe::RecipeError);
}

TEST_CASE("hybrid: a missing or unusable side is a clear error") {
  if (!have_all({"float8"})) return;
  auto engine = make_engine();
  SUBCASE("missing columnwise") {
    QuantizerSpec s;
    s.format = "hybrid";
    s.options.emplace_back("rowwise", OptionValue::of_spec(spec("float8", {{"scaling", "delayed"}})));
    CHECK_THROWS_WITH_AS(engine->make_quantizer(s, role()),
                         doctest::Contains("format 'hybrid' requires option 'columnwise'"),
                         qrecipe::RecipeError);
    // Both sides are checked before either is built: no orphan scaling state in the engine.
    CHECK(engine->scaling_states().empty());
  }
  SUBCASE("missing rowwise") {
    QuantizerSpec s;
    s.format = "hybrid";
    s.options.emplace_back("columnwise", OptionValue::of_spec(spec("float8")));
    CHECK_THROWS_WITH_AS(engine->make_quantizer(s, role()),
                         doctest::Contains("format 'hybrid' requires option 'rowwise'"),
                         qrecipe::RecipeError);
  }
  SUBCASE("missing side in a recipe file: reported by the check, with its location") {
    const std::string yaml =
        "version: 1\n"
        "defaults:\n"
        "  format: hybrid\n"  // line 3: the spec that lacks a side
        "  rowwise: {format: float8}\n";
    const std::string what = recipe_error(yaml, "oneside.yaml");
    INFO(what);
    CHECK(what.find("oneside.yaml:3:") != std::string::npos);
    CHECK(what.find("defaults.columnwise") != std::string::npos);
    CHECK(what.find("requires option 'columnwise'") != std::string::npos);
  }
  SUBCASE("format none on one side") {
    CHECK_THROWS_WITH_AS(engine->make_quantizer(hybrid(spec("float8"), spec("none")), role()),
                         doctest::Contains("option 'columnwise' is format none"), qrecipe::Error);
  }
  SUBCASE("a sub-format that is not loaded, from YAML") {
    const std::string yaml =
        "version: 1\n"
        "defaults:\n"
        "  format: hybrid\n"
        "  rowwise: {format: float8}\n"
        "  columnwise: {format: float9}\n";  // line 5
    const std::string what = recipe_error(yaml, "missing.yaml");
    INFO(what);
    CHECK(what.find("missing.yaml:5:") != std::string::npos);
    CHECK(what.find("unknown format 'float9'") != std::string::npos);
    CHECK(what.find("float8") != std::string::npos);  // lists what is loaded
  }
  SUBCASE("a bad option inside a side names the nested key") {
    const std::string yaml =
        "version: 1\n"
        "defaults:\n"
        "  format: hybrid\n"
        "  rowwise: {format: float8, scaling: sometimes}\n"  // line 4
        "  columnwise: {format: float8}\n";
    const std::string what = recipe_error(yaml, "bad.yaml");
    INFO(what);
    CHECK(what.find("bad.yaml:4:") != std::string::npos);
    CHECK(what.find("'sometimes' is not a valid scaling") != std::string::npos);
  }
  SUBCASE("an error of a side at creation keeps the side's message") {
    // float8 refuses an option of the other scaling mode when the quantizer is made.
    CHECK_THROWS_WITH_AS(
        engine->make_quantizer(
            hybrid(spec("float8", {{"margin", "1"}}), spec("float8")), role()),
        doctest::Contains("only applies to scaling: delayed"), qrecipe::Error);
  }
  SUBCASE("columnwise_source must be a known choice") {
    CHECK_THROWS_WITH_AS(
        engine->make_quantizer(hybrid(spec("float8"), spec("float8"), "rowwise"), role()),
        doctest::Contains("rowwise_dequantized"), qrecipe::RecipeError);
  }
}

// Counts what the engine's allocator hands out: the hybrid's CPU scratch comes from it through
// the host table (scratch_alloc), so a leak on any path shows as live != 0.
class CountingAllocator final : public qrecipe::Allocator {
 public:
  void* allocate(std::size_t bytes, qrecipe::Device device) override {
    void* p = base_->allocate(bytes, device);
    ++allocations;
    ++live;
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, qrecipe::Device device) noexcept override {
    --live;
    base_->deallocate(ptr, bytes, device);
  }
  void zero(void* ptr, std::size_t bytes, qrecipe::Device device) override {
    base_->zero(ptr, bytes, device);
  }
  int allocations = 0;
  int live = 0;

 private:
  std::shared_ptr<qrecipe::Allocator> base_ = qrecipe::cpu_allocator();
};

TEST_CASE("hybrid: rowwise_dequantized scratch comes from the host table and is always freed") {
  if (!have_all({"float8", "mxfp8", "nvfp4"})) return;
  const auto counting = std::make_shared<CountingAllocator>();
  // Stateless sides (current scaling), so the engine's allocator serves the scratch only.
  Engine engine(Recipe::uniform(QuantizerSpec{}), registry(), counting);
  const Tensor x = make_input(32, 64, 15);

  SUBCASE("both directions: one FP32 decode buffer, freed") {
    const auto hq = engine.make_quantizer(
        hybrid(spec("float8"), spec("mxfp8"), "rowwise_dequantized"), role("weight"));
    const QuantizedTensor h = hq->quantize(x.view(), kBoth);
    CHECK(counting->allocations == 1);
    CHECK(counting->live == 0);
  }
  SUBCASE("columnwise only: the rowwise direction's buffers too, all freed") {
    const auto hq = engine.make_quantizer(
        hybrid(spec("float8"), spec("mxfp8"), "rowwise_dequantized"), role("weight"));
    const QuantizedTensor h = hq->quantize(x.view(), kCol);
    // float8's rowwise direction: data, scale_inv (+ amax when its layout has one); + decode.
    CHECK(counting->allocations >= 3);
    CHECK(counting->live == 0);
  }
  SUBCASE("a columnwise side that fails after the scratch exists: freed, its error kept") {
    // nvfp4 hadamard needs a bf16 source; the decoded rowwise data is FP32 (as on the CPU
    // path always), so its columnwise quantize fails after both scratch allocations.
    const auto hq = engine.make_quantizer(
        hybrid(spec("float8"), spec("nvfp4", {{"hadamard", "true"}}), "rowwise_dequantized"),
        role("weight"));
    const Tensor xb = to_bf16(make_input(32, 64, 16));
    try {
      hq->quantize(xb.view(), kCol);
      FAIL("nvfp4 hadamard must refuse the FP32 decode");
    } catch (const qrecipe::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("hybrid columnwise side (nvfp4)") != std::string::npos);
      CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    }
    CHECK(counting->allocations >= 3);
    CHECK(counting->live == 0);
  }
}

TEST_CASE("hybrid: rowwise_dequantized on a CUDA source runs on the device, no hybrid refusal") {
  if (!have_all({"float8"})) return;
  if (registry()->find("float8")->supports(qrecipe::Device::cuda())) {
    // A view that only claims cuda:0 would reach real kernels here; the CUDA path is checked
    // byte for byte against the CPU by tests/gpu/test_gpu_parity.cpp (hybrid option sets).
    MESSAGE("not supported: this build has CUDA kernels; the CUDA path is covered by "
            "test_gpu_parity (hybrid */rowwise_dequantized)");
    return;
  }
  auto engine = make_engine();
  const auto hq = engine->make_quantizer(
      hybrid(spec("float8"), spec("float8"), "rowwise_dequantized"), role());
  // A view that claims to live on cuda:0: the hybrid no longer refuses it itself; the request
  // goes to the device, where this CPU-only build says what is missing.
  const Tensor host = make_input(4, 8, 14);
  const TensorView cuda_view(host.view().data(), DType::f32, {4, 8}, qrecipe::Device::cuda(0));
  SUBCASE("the columnwise sub-quantizer's device check (its amax of the input runs first)") {
    QuantizedTensor dst = hq->quantize(host.view(), kBoth);
    try {
      hq->quantize_into(cuda_view, dst);
      FAIL("a CUDA source must be refused by this CPU-only build");
    } catch (const qrecipe::Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(e.code() == QR_STATUS_UNSUPPORTED);
      CHECK(what.find("hybrid columnwise side (float8)") != std::string::npos);
      CHECK(what.find("supports cpu only") != std::string::npos);
      CHECK(what.find("host scratch") == std::string::npos);  // the old refusal is gone
    }
  }
  SUBCASE("the scratch is asked for on the source's device (given amaxes, columnwise only)") {
    QuantizedTensor dst = hq->quantize(host.view(), kCol);
    QuantizeOptions given;
    given.amax = std::array<float, 2>{1.0f, 1.0f};
    try {
      hq->quantize_into(cuda_view, dst, given);
      FAIL("a CUDA source must be refused by this CPU-only build");
    } catch (const qrecipe::Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(e.code() == QR_STATUS_UNSUPPORTED);
      CHECK(what.find("hybrid: scratch of") != std::string::npos);
      CHECK(what.find("on cuda:0") != std::string::npos);
      CHECK(what.find("has no CUDA") != std::string::npos);
    }
  }
}

// ---------------------------------------------------------------- 9. recipes, GEMMs

std::string source_path(const std::string& relative) {
  return std::string(QRECIPE_SOURCE_DIR) + "/" + relative;
}

// The one-read extras (plugin_abi.h, qr_tensor_cast): which plugins offer them, and their
// refusals. Their bytes on CUDA sources are checked by test_gpu_parity (the hybrid pairs there
// take the fused path for bf16 sources and must equal the CPU reference).
TEST_CASE("hybrid: tensor-cast fusion extras are offered by float8, mxfp8 and nvfp4") {
  if (!have_all({"float8", "mxfp8", "nvfp4", "blockwise"})) return;
  auto engine = make_engine();
  const auto f8 = engine->make_quantizer(spec("float8"), role());
  const auto delayed = engine->make_quantizer(spec("float8", {{"scaling", "delayed"}}), role());
  const auto mx = engine->make_quantizer(spec("mxfp8"), role());
  const auto nv = engine->make_quantizer(spec("nvfp4"), role());
  const auto bw = engine->make_quantizer(spec("blockwise"), role());
  auto extra = [](const Quantizer& q, const char* name) {
    return q.plugin().c().get_proc_address(name);
  };
  const auto prepare = reinterpret_cast<qr_prepare_tensor_cast_fn>(
      extra(*f8, QR_EXTRA_PREPARE_TENSOR_CAST));
  REQUIRE(static_cast<bool>(prepare));
  CHECK(extra(*mx, QR_EXTRA_PREPARE_TENSOR_CAST) == nullptr);
  CHECK(extra(*nv, QR_EXTRA_PREPARE_TENSOR_CAST) == nullptr);
  CHECK(extra(*bw, QR_EXTRA_PREPARE_TENSOR_CAST) == nullptr);
  CHECK(extra(*bw, QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST) == nullptr);

  // The status an extra returned: its code (released).
  auto code_of = [](qr_status status) {
    if (status == nullptr) return QR_STATUS_OK;
    try {
      qrecipe::throw_if_error(status, "extra");
    } catch (const qrecipe::Error& e) {
      return e.code();
    }
    return QR_STATUS_INTERNAL;
  };
  const Tensor x = make_input(32, 64, 7);
  qr_tensor_cast cast{};
  cast.struct_size = sizeof(qr_tensor_cast);
  cast.dtype = QR_DTYPE_E4M3;
  qr_quantize_args args{};
  args.struct_size = sizeof(qr_quantize_args);
  for (const auto& q : {f8, mx, nv}) {
    INFO("fusing plugin ", q->format());
    const auto fuse = reinterpret_cast<qr_quantize_with_tensor_cast_fn>(
        extra(*q, QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST));
    REQUIRE(static_cast<bool>(fuse));
    // CPU sources are refused (probe and call alike), before anything is written.
    args.usage = kCol;
    CHECK(code_of(fuse(q->handle(), &x.view().c(), &args, nullptr, &cast)) ==
          QR_STATUS_UNSUPPORTED);
    QuantizedTensor t = q->quantize(x.view(), kCol);
    const std::vector<std::uint8_t> before = bytes_of(t.data(kColDir));
    CHECK(code_of(fuse(q->handle(), &x.view().c(), &args, &t.c(), &cast)) ==
          QR_STATUS_UNSUPPORTED);
    CHECK(bytes_of(t.data(kColDir)) == before);
  }
  // float8: CPU tensors and delayed scaling are refused untouched.
  args.usage = kRow;
  QuantizedTensor t = f8->quantize(x.view(), kRow);
  const std::vector<std::uint8_t> before = bytes_of(t.scale_inv(kRowDir));
  CHECK(code_of(prepare(f8->handle(), &x.view().c(), &args, &t.c(), &cast)) ==
        QR_STATUS_UNSUPPORTED);
  CHECK(code_of(prepare(delayed->handle(), &x.view().c(), &args, &t.c(), &cast)) ==
        QR_STATUS_UNSUPPORTED);
  // A delayed-scaling float8 does not fuse a cast either (probe), whatever the device.
  const auto fuse_f8 = reinterpret_cast<qr_quantize_with_tensor_cast_fn>(
      extra(*delayed, QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST));
  REQUIRE(static_cast<bool>(fuse_f8));
  args.usage = kCol;
  CHECK(code_of(fuse_f8(delayed->handle(), &x.view().c(), &args, nullptr, &cast)) ==
        QR_STATUS_UNSUPPORTED);
  args.usage = kRow;
  CHECK(bytes_of(t.scale_inv(kRowDir)) == before);
  // On the CPU a hybrid of a fusable pair runs the two calls: the plain sub-formats' bytes.
  const auto hq = engine->make_quantizer(hybrid(spec("float8"), spec("mxfp8")), role());
  const QuantizedTensor h = hq->quantize(x.view(), kBoth);
  check_same_direction(h, f8->quantize(x.view(), kRow), kRowDir);
  check_same_direction(h, mx->quantize(x.view(), kCol), kColDir);
}

TEST_CASE("hybrid: the shipped hybrid recipes are valid") {
  if (!have_all({"float8", "mxfp8", "nvfp4"})) return;
  for (const char* file : {"recipes/hybrid_seed.yaml", "recipes/hybrid_fp8_mx.yaml"}) {
    INFO(file);
    const Recipe recipe = Recipe::load(source_path(file));
    const auto errors = recipe.check(*registry());
    for (const auto& e : errors) MESSAGE(e.what());
    CHECK(errors.empty());
  }
}

TEST_CASE("hybrid: the seed scenario parses, quantizes, and its GEMMs see plain operands") {
  if (!have_all({"float8", "mxfp8", "nvfp4"})) return;
  Engine engine(Recipe::load(source_path("recipes/hybrid_seed.yaml")), registry());
  const QuantizerRole w_role{"linear", "weight", "layers.0.fc1"};
  const QuantizerRole x_role{"linear", "input", "layers.0.fc1"};
  const QuantizerRole dy_role{"linear", "grad_output", "layers.0.fc1"};
  const auto wq = engine.resolve(w_role);
  const auto xq = engine.resolve(x_role);
  const auto dyq = engine.resolve(dy_role);
  REQUIRE(wq);
  REQUIRE(xq);
  REQUIRE(dyq);
  CHECK(wq->format() == "hybrid");

  // y = x W^T with x [M=32, K=64], W [N=48, K=64], dy [M=32, N=48].
  const Tensor x = make_input(32, 64, 20);
  const Tensor w = make_input(48, 64, 21);
  const Tensor dy = make_input(32, 48, 22);
  const QuantizedTensor xh = xq->quantize(x.view(), kBoth);
  const QuantizedTensor wh = wq->quantize(w.view(), kBoth);
  const QuantizedTensor dyh = dyq->quantize(dy.view(), kBoth);
  const auto format_of = [](const QuantizedTensor& t, qr_direction d) {
    return std::string(t.layout(d).format);
  };
  CHECK(format_of(wh, kRowDir) == "float8");
  CHECK(format_of(wh, kColDir) == "mxfp8");
  CHECK(format_of(xh, kRowDir) == "float8");
  CHECK(format_of(xh, kColDir) == "nvfp4");
  CHECK(format_of(dyh, kRowDir) == "mxfp8");
  CHECK(format_of(dyh, kColDir) == "nvfp4");
  CHECK(dyh.layout(kRowDir).data_dtype == QR_DTYPE_E5M2);  // the recipe's dtype: e5m2

  // The plain sub-format quantizers of each side, for the same roles.
  const auto plain = [&](const char* format, const TextOptions& o, const QuantizerRole& r) {
    return engine.make_quantizer(spec(format, o), r);
  };
  const auto w_row = plain("float8", {{"scaling", "current"}, {"dtype", "e4m3"}}, w_role);
  const auto w_col = plain("mxfp8", {{"dtype", "e4m3"}}, w_role);
  const auto x_row = plain("float8", {{"scaling", "current"}, {"dtype", "e4m3"}}, x_role);
  const auto x_col = plain("nvfp4", {}, x_role);
  const auto dy_row = plain("mxfp8", {{"dtype", "e5m2"}}, dy_role);
  const auto dy_col = plain("nvfp4", {}, dy_role);
  const QuantizedTensor wr = w_row->quantize(w.view(), kRow), wc = w_col->quantize(w.view(), kCol);
  const QuantizedTensor xr = x_row->quantize(x.view(), kRow), xc = x_col->quantize(x.view(), kCol);
  const QuantizedTensor dyr = dy_row->quantize(dy.view(), kRow);
  const QuantizedTensor dyc = dy_col->quantize(dy.view(), kCol);
  check_same_direction(wh, wr, kRowDir);
  check_same_direction(wh, wc, kColDir);
  check_same_direction(xh, xr, kRowDir);
  check_same_direction(xh, xc, kColDir);
  check_same_direction(dyh, dyr, kRowDir);
  check_same_direction(dyh, dyc, kColDir);

  // Each GEMM with hybrid operands equals the GEMM with the plain sub-format operands.
  using qrecipe::GemmOperand;
  const auto run = [](const GemmOperand& a, const GemmOperand& b, std::int64_t m,
                      std::int64_t n) {
    Tensor out(DType::f32, {m, n});
    qrecipe::gemm(a, b, out.view());
    return out;
  };
  const auto op = GemmOperand::quantized;
  // fprop y [32, 48] = x rowwise . W rowwise
  CHECK(bytes_of(run(op(xh, *xq, kRowDir), op(wh, *wq, kRowDir), 32, 48)) ==
        bytes_of(run(op(xr, *x_row, kRowDir), op(wr, *w_row, kRowDir), 32, 48)));
  // dgrad dx [32, 64] = dy rowwise . W columnwise
  CHECK(bytes_of(run(op(dyh, *dyq, kRowDir), op(wh, *wq, kColDir), 32, 64)) ==
        bytes_of(run(op(dyr, *dy_row, kRowDir), op(wc, *w_col, kColDir), 32, 64)));
  // wgrad dW [48, 64] = dy columnwise . x columnwise
  CHECK(bytes_of(run(op(dyh, *dyq, kColDir), op(xh, *xq, kColDir), 48, 64)) ==
        bytes_of(run(op(dyc, *dy_col, kColDir), op(xc, *x_col, kColDir), 48, 64)));
}

TEST_CASE("hybrid: recipes/hybrid_fp8_mx.yaml resolves every role") {
  if (!have_all({"float8", "mxfp8"})) return;
  Engine engine(Recipe::load(source_path("recipes/hybrid_fp8_mx.yaml")), registry());
  const Tensor t = make_input(64, 64, 23);
  for (const char* tensor_type : {"input", "weight", "grad_output"}) {
    INFO(tensor_type);
    const auto q = engine.resolve({"linear", tensor_type, "model.layers.3.fc2"});
    REQUIRE(q);
    const QuantizedTensor h = q->quantize(t.view(), kBoth);
    CHECK(std::string(h.layout(kRowDir).format) == "float8");
    CHECK(std::string(h.layout(kColDir).format) == "mxfp8");
    const bool weight = std::string(tensor_type) == "weight";
    CHECK((q->describe().find("columnwise_source=rowwise_dequantized") != std::string::npos) ==
          weight);
  }
}

// ---------------------------------------------------------------- 10. conformance

TEST_CASE("hybrid conformance") {
  if (!have_all({"float8", "mxfp8", "nvfp4", "blockwise"})) return;
  namespace conf = qrecipe::conformance;
  // Bounds are derived per direction from each side's layout (conf::derive_bound): a hybrid
  // direction is exactly the sub-format's, so the sub-format's bound applies unchanged.
  conf::run({.format = "hybrid",
             .cases = {{.spec = hybrid(spec("float8"), spec("mxfp8"))},
                       {.spec = hybrid(spec("nvfp4"), spec("blockwise"))},
                       {.spec = hybrid(spec("mxfp8"), spec("float8", {{"dtype", "e5m2"}})),
                        .role = role("grad_output")},
                       // Same format both sides: float8's columnwise is its rowwise transposed.
                       {.spec = hybrid(spec("float8"), spec("float8")),
                        .properties = {.columnwise_is_transpose = true}},
                       {.spec = hybrid(spec("float8"), spec("float8"), "rowwise_dequantized"),
                        .properties = {.columnwise_is_transpose = true}}},
             .registry = registry()});
}

}  // namespace
