// Tests of the blockwise format plugin, through the engine and the registry (the plugin is
// loaded from QRECIPE_PLUGIN_PATH like any other).
//
// Map:
//   1. helpers (engine setup, tensor fill, bit views)
//   2. known answers, 1x128: rowwise with a partial block, columnwise, pow2 on/off,
//      the power-of-two boundary, amax_epsilon
//   3. known answers, 128x128 (partial tiles) and the transpose relationship
//   4. edge cases: NaN, inf, zeros, denormals, empty, single element, 0-D
//   5. input dtypes: bf16 (value_for_inf), f16
//   6. layouts, padding, transposed scale indexing, an element-wise oracle on 130x200
//   7. 1x128 columnwise == rowwise of the transposed source (strided view), N-D sources
//   8. role-dependent default block, options, describe
//   9. dequantize, errors (CUDA refused without kernels, wrong destination)
//  10. the shared conformance suite over the option sets
//
// Expected E4M3 codes are written as s|eeee|mmm with value 2^(e-7) * (1 + m/8); e.g.
// 0x70 = 2^7 = 128, 0x7E = 1.75 * 2^8 = 448 (the largest), 0x7F = NaN. Scales are checked as
// exact FP32 bit patterns.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/scaling.hpp"

using namespace qrecipe;

namespace {

// ------------------------------------------------------------------------- 1. helpers

constexpr qr_direction kRow = QR_DIRECTION_ROWWISE;
constexpr qr_direction kCol = QR_DIRECTION_COLUMNWISE;
constexpr std::uint32_t kBoth = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;

std::shared_ptr<Registry> registry() {
  static const auto reg = std::make_shared<Registry>();
  return reg;
}

// An engine plus one blockwise quantizer (the engine outlives the quantizer).
struct Setup {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<Quantizer> q;
};

using Options = std::vector<std::pair<std::string, OptionValue>>;

QuantizerSpec spec_of(const Options& options) {
  QuantizerSpec spec;
  spec.format = "blockwise";
  spec.options = options;
  return spec;
}

Setup make(const Options& options = {}, const std::string& tensor_type = "input") {
  const QuantizerSpec spec = spec_of(options);
  Setup s;
  s.engine = std::make_unique<Engine>(Recipe::uniform(spec), registry());
  s.q = s.engine->make_quantizer(spec, QuantizerRole{"linear", tensor_type, "layers.0.fc1"});
  REQUIRE(s.q != nullptr);
  return s;
}

Options block(const char* b, bool pow2 = true) {
  return {{"block", OptionValue::of_enum(b)}, {"pow2_scales", OptionValue::of_bool(pow2)}};
}

std::uint32_t bits(float f) { return num::float_bits(f); }

const std::uint8_t* data_of(const QuantizedTensor& t, qr_direction d) {
  return t.data(d).data_as<std::uint8_t>();
}
const float* scales_of(const QuantizedTensor& t, qr_direction d) {
  return t.scale_inv(d).data_as<float>();
}
std::int64_t scale_count(const QuantizedTensor& t, qr_direction d) {
  return t.scale_inv(d).numel();
}

// Deterministic values spread over many binades, with the occasional zero and tie.
std::vector<float> pseudo_random(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    const int exponent = static_cast<int>((s >> 24) % 24) - 12;  // 2^-12 .. 2^11
    const float mantissa = static_cast<float>((s >> 8) & 0xFFFF) / 65536.0f;
    x = ((s & 1u) ? -1.0f : 1.0f) * mantissa * num::exp2i(exponent);
    if ((s >> 4) % 97 == 0) x = 0.0f;
  }
  return v;
}

Tensor f32_tensor(std::int64_t rows, std::int64_t cols, const std::vector<float>& values = {}) {
  Tensor t(DType::f32, {rows, cols});
  if (!values.empty()) std::memcpy(t.data_as<float>(), values.data(), values.size() * 4);
  return t;
}

// ------------------------------------------------------------------------- 2. 1x128

TEST_CASE("blockwise 1x128 rowwise known answers (partial K block, pow2 on and off)") {
  // x is [2, 130]: two column blocks per row, the second holds only columns 128 and 129.
  Tensor x = f32_tensor(2, 130);
  float* p = x.data_as<float>();
  p[0] = 1.0f; p[1] = -2.0f; p[2] = 3.0f; p[3] = 0.5f;  // row 0, block 0: amax 3
  p[128] = 0.1f; p[129] = -0.05f;                       // row 0, block 1: amax 0.1f
  p[130 + 0] = 3.5f; p[130 + 1] = 1.0f; p[130 + 127] = -0.75f;  // row 1, block 0: amax 3.5
  p[130 + 128] = std::numeric_limits<float>::quiet_NaN();        // row 1, block 1: NaN ignored,
  p[130 + 129] = 2.0f;                                           //   amax 2

  SUBCASE("pow2_scales = true (default)") {
    auto s = make(block("1x128"));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const std::uint8_t* d = data_of(t, kRow);
    const float* si = scales_of(t, kRow);
    // Scales are stored transposed [ceil(130/128) = 2, roundup(2, 4) = 4]: entry [j][i] is
    // (row i, block j); entries [j][2..3] are padding and stay zero.
    REQUIRE(scale_count(t, kRow) == 8);
    // row 0 block 0: 448/3 = 149.33 -> pow2 128; scale_inv 1/128 = 0x3C000000
    CHECK(bits(si[0 * 4 + 0]) == 0x3C000000u);
    // row 1 block 0: 448/3.5 = 128 exactly -> 128
    CHECK(bits(si[0 * 4 + 1]) == 0x3C000000u);
    // row 0 block 1: 448/0.1f = 4480 -> pow2 4096; 1/4096 = 0x39800000
    CHECK(bits(si[1 * 4 + 0]) == 0x39800000u);
    // row 1 block 1: 448/2 = 224 -> pow2 128
    CHECK(bits(si[1 * 4 + 1]) == 0x3C000000u);
    for (int j = 0; j < 2; ++j) {
      CHECK(bits(si[j * 4 + 2]) == 0u);
      CHECK(bits(si[j * 4 + 3]) == 0u);
    }
    // row 0: 1*128 = 128 -> 0x70; -2*128 = -256 -> 0xF8; 3*128 = 384 = 1.5*2^8 -> 0x7C;
    // 0.5*128 = 64 -> 0x68; zeros -> 0x00
    CHECK(d[0] == 0x70); CHECK(d[1] == 0xF8); CHECK(d[2] == 0x7C); CHECK(d[3] == 0x68);
    CHECK(d[4] == 0x00); CHECK(d[127] == 0x00);
    // 0.1f*4096 = 409.6 -> nearest of 384/416 is 416 = 1.625*2^8 -> 0x7D;
    // -0.05f*4096 = -204.8 -> -208 = -1.625*2^7 -> 0xF5
    CHECK(d[128] == 0x7D); CHECK(d[129] == 0xF5);
    // row 1: 3.5*128 = 448 -> 0x7E; 1*128 -> 0x70; -0.75*128 = -96 = -1.5*2^6 -> 0xEC;
    // NaN -> 0x7F; 2*128 = 256 -> 0x78
    CHECK(d[130 + 0] == 0x7E); CHECK(d[130 + 1] == 0x70); CHECK(d[130 + 127] == 0xEC);
    CHECK(d[130 + 128] == 0x7F); CHECK(d[130 + 129] == 0x78);
  }

  SUBCASE("pow2_scales = false") {
    auto s = make(block("1x128", false));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const std::uint8_t* d = data_of(t, kRow);
    const float* si = scales_of(t, kRow);
    // row 0 block 0: scale = fl(448/3) = 149.33333 (0x43155555); scale_inv = fl(1/scale) =
    // 0.0066964286 (0x3BDB6DB7)
    CHECK(bits(si[0]) == 0x3BDB6DB7u);
    // row 1 block 0: 448/3.5 = 128 exactly
    CHECK(bits(si[1]) == 0x3C000000u);
    // row 0 block 1: fl(448/0.1f) = 4480 (0x458C0000); 1/4480 = 0x396A0EA1
    CHECK(bits(si[4]) == 0x396A0EA1u);
    // row 1 block 1: 448/2 = 224; 1/224 = 0.004464286 (0x3B924925)
    CHECK(bits(si[5]) == 0x3B924925u);
    // 1*149.33 -> 144 = 1.125*2^7 -> 0x71; -298.67 -> -288 = -1.125*2^8 -> 0xF9;
    // 3*149.33 = 448 -> 0x7E; 74.67 -> 72 = 1.125*2^6 -> 0x69
    CHECK(d[0] == 0x71); CHECK(d[1] == 0xF9); CHECK(d[2] == 0x7E); CHECK(d[3] == 0x69);
    // 0.1f*4480 = 448 -> 0x7E; -0.05f*4480 = -224 = -1.75*2^7 -> 0xF6
    CHECK(d[128] == 0x7E); CHECK(d[129] == 0xF6);
    // NaN stays NaN; 2*224 = 448 -> 0x7E
    CHECK(d[130 + 128] == 0x7F); CHECK(d[130 + 129] == 0x7E);
  }
}

TEST_CASE("blockwise 1x128 columnwise known answers (transposed data, scales [ceil(M/128), roundup(K,4)])") {
  // x = [[1, 0.1], [-2, -0.05], [3, 0]] (3x2). Columnwise blocks run down the columns.
  Tensor x = f32_tensor(3, 2, {1.0f, 0.1f, -2.0f, -0.05f, 3.0f, 0.0f});
  auto s = make(block("1x128"));
  QuantizedTensor t = s.q->quantize(x.view(), kBoth);

  const qr_direction_layout& l = t.layout(kCol);
  CHECK(l.data_transposed == 1);
  CHECK(l.data_shape[0] == 2); CHECK(l.data_shape[1] == 3);
  CHECK(l.scale_shape[0] == 1); CHECK(l.scale_shape[1] == 4);
  CHECK(l.scale_transposed == 0);
  CHECK(l.block_rows == 128); CHECK(l.block_cols == 1);

  const std::uint8_t* d = data_of(t, kCol);
  const float* si = scales_of(t, kCol);
  // column 0 = [1, -2, 3]: amax 3 -> 448/3 -> pow2 128: 0x70, 0xF8, 0x7C (as rowwise above)
  CHECK(d[0] == 0x70); CHECK(d[1] == 0xF8); CHECK(d[2] == 0x7C);
  // column 1 = [0.1, -0.05, 0]: amax 0.1 -> 4480 -> 4096: 0x7D, 0xF5, 0x00
  CHECK(d[3] == 0x7D); CHECK(d[4] == 0xF5); CHECK(d[5] == 0x00);
  // scales [1][4]: entry [0][k] = column k; [0][2..3] padding
  CHECK(bits(si[0]) == 0x3C000000u);  // 1/128
  CHECK(bits(si[1]) == 0x39800000u);  // 1/4096
  CHECK(bits(si[2]) == 0u); CHECK(bits(si[3]) == 0u);

  // The rowwise copy is quantized independently (its own blocks): rows [1, 0.1] amax 1 ->
  // 448 -> 256: 0x78, 0.1f*256 = 25.6 -> 26 = 1.625*2^4 -> 0x5D; [-2, -0.05] amax 2 -> 128:
  // 0xF8, -6.4 -> -6.5 = -1.625*2^2 -> 0xCD; [3, 0] amax 3 -> 128: 0x7C, 0x00.
  const std::uint8_t* r = data_of(t, kRow);
  const std::uint8_t expected_row[] = {0x78, 0x5D, 0xF8, 0xCD, 0x7C, 0x00};
  for (int i = 0; i < 6; ++i) CHECK(r[i] == expected_row[i]);
  // rowwise scales [ceil(2/128) = 1, roundup(3, 4) = 4]: rows 0..2, then padding
  const float* rs = scales_of(t, kRow);
  CHECK(bits(rs[0]) == 0x3B800000u);  // 1/256
  CHECK(bits(rs[1]) == 0x3C000000u);  // 1/128
  CHECK(bits(rs[2]) == 0x3C000000u);  // 1/128
  CHECK(bits(rs[3]) == 0u);
}

TEST_CASE("blockwise power-of-two boundary: a block amax one ulp around 3.5 (448/3.5 = 128)") {
  // Rows: amax 3.5, nextafter(3.5, +inf) = 3.5000002, nextafter(3.5, 0) = 3.4999998.
  const float up = std::nextafter(3.5f, 10.0f), down = std::nextafter(3.5f, 0.0f);
  Tensor x = f32_tensor(3, 2, {3.5f, 1.0f, up, 1.0f, down, 1.0f});

  SUBCASE("pow2 on: truncation halves the scale one ulp above the boundary") {
    auto s = make(block("1x128"));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const float* si = scales_of(t, kRow);
    const std::uint8_t* d = data_of(t, kRow);
    // 448/3.5 = 128 -> 128
    CHECK(bits(si[0]) == 0x3C000000u);
    // 448/3.5000002 = 127.99999 (0x42FFFFFF) -> clear mantissa -> 64; 1/64 = 0x3C800000
    CHECK(bits(si[1]) == 0x3C800000u);
    // 448/3.4999998 = 128.00002 (0x43000001) -> 128
    CHECK(bits(si[2]) == 0x3C000000u);
    // 3.5*128 = 448 -> 0x7E; 1*128 -> 0x70
    CHECK(d[0] == 0x7E); CHECK(d[1] == 0x70);
    // 3.5000002*64 = 224.00002 -> 224 = 1.75*2^7 -> 0x76; 1*64 = 2^6 -> 0x68
    CHECK(d[2] == 0x76); CHECK(d[3] == 0x68);
    // 3.4999998*128 = 447.99997 -> 448 -> 0x7E; 0x70
    CHECK(d[4] == 0x7E); CHECK(d[5] == 0x70);
  }
  SUBCASE("pow2 off: the exact quotient is kept") {
    auto s = make(block("1x128", false));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const float* si = scales_of(t, kRow);
    const std::uint8_t* d = data_of(t, kRow);
    CHECK(bits(si[0]) == 0x3C000000u);  // 1/128
    CHECK(bits(si[1]) == 0x3C000001u);  // 1/127.99999 = 0.007812501
    CHECK(bits(si[2]) == 0x3BFFFFFEu);  // 1/128.00002 = 0.007812499
    // 3.5000002*127.99999 = 448.0 -> 0x7E; 1*127.99999 -> 128 -> 0x70
    CHECK(d[2] == 0x7E); CHECK(d[3] == 0x70);
    // 3.4999998*128.00002 = 448.00003 -> saturates to 448 -> 0x7E; 128.00002 -> 0x70
    CHECK(d[4] == 0x7E); CHECK(d[5] == 0x70);
  }
}

TEST_CASE("blockwise amax_epsilon raises small block amaxes") {
  // Rows: all zeros (with -0), amax 0.1 (< eps 0.25), amax 1 (> eps).
  Tensor x = f32_tensor(3, 2, {0.0f, -0.0f, 0.1f, -0.05f, 1.0f, 0.1f});
  Options opts = block("1x128");
  opts.emplace_back("amax_epsilon", OptionValue::of_float(0.25));

  SUBCASE("pow2 on") {
    auto s = make(opts);
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const float* si = scales_of(t, kRow);
    const std::uint8_t* d = data_of(t, kRow);
    // zeros: amax 0 -> eps 0.25 -> 448/0.25 = 1792 -> pow2 1024; 1/1024 = 0x3A800000
    // (without eps an all-zero block gets scale 1; see the edge-case test)
    CHECK(bits(si[0]) == 0x3A800000u);
    CHECK(d[0] == 0x00); CHECK(d[1] == 0x80);  // the sign of zero is kept
    // amax 0.1 -> 0.25 -> 1024: 0.1f*1024 = 102.4 -> 104 = 1.625*2^6 -> 0x6D;
    // -0.05f*1024 = -51.2 -> -52 = -1.625*2^5 -> 0xE5
    CHECK(bits(si[1]) == 0x3A800000u);
    CHECK(d[2] == 0x6D); CHECK(d[3] == 0xE5);
    // amax 1 > eps: 448 -> 256: 0x78, 0.1f*256 = 25.6 -> 0x5D
    CHECK(bits(si[2]) == 0x3B800000u);
    CHECK(d[4] == 0x78); CHECK(d[5] == 0x5D);
  }
  SUBCASE("pow2 off") {
    opts[1].second = OptionValue::of_bool(false);
    auto s = make(opts);
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const float* si = scales_of(t, kRow);
    const std::uint8_t* d = data_of(t, kRow);
    // 448/0.25 = 1792; 1/1792 = 0.00055803574 (0x3A124925)
    CHECK(bits(si[0]) == 0x3A124925u);
    CHECK(bits(si[1]) == 0x3A124925u);
    // 0.1f*1792 = 179.2 -> 176 = 1.375*2^7 -> 0x73; -0.05f*1792 = -89.6 -> -88 -> 0xEB
    CHECK(d[2] == 0x73); CHECK(d[3] == 0xEB);
    // amax 1: 448; 1/448 = 0x3B124925; 1*448 -> 0x7E; 0.1f*448 = 44.8 -> 44 = 1.375*2^5 -> 0x63
    CHECK(bits(si[2]) == 0x3B124925u);
    CHECK(d[4] == 0x7E); CHECK(d[5] == 0x63);
  }
}

// ------------------------------------------------------------------------- 3. 128x128

TEST_CASE("blockwise 128x128 known answers with partial tiles; columnwise is the transpose") {
  // x is [130, 130]: tiles (0,0) 128x128, (0,1) 128x2, (1,0) 2x128, (1,1) 2x2.
  const std::int64_t n = 130;
  Tensor x = f32_tensor(n, n);
  float* p = x.data_as<float>();
  p[0 * n + 0] = 3.0f;                            // tile (0,0): amax 3 -> 128
  p[5 * n + 7] = -2.0f;
  p[127 * n + 129] = 0.5f;                        // tile (0,1): amax 0.5 -> 896 -> 512
  p[129 * n + 0] = std::nextafter(3.5f, 10.0f);   // tile (1,0): 127.99999 -> 64
  p[128 * n + 127] = 1.0f;
  // tile (1,1): all zeros -> scale 1

  auto s = make(block("128x128"));
  QuantizedTensor t = s.q->quantize(x.view(), kBoth);
  const qr_direction_layout& rl = t.layout(kRow);
  const qr_direction_layout& cl = t.layout(kCol);
  CHECK(rl.block_rows == 128); CHECK(rl.block_cols == 128);
  CHECK(rl.scale_shape[0] == 2); CHECK(rl.scale_shape[1] == 4);  // [ceil(130/128), roundup(2,4)]
  CHECK(rl.scale_transposed == 0);
  CHECK(cl.scale_shape[0] == 2); CHECK(cl.scale_shape[1] == 4);
  CHECK(cl.scale_transposed == 1);
  CHECK(cl.data_transposed == 1);

  const float* rs = scales_of(t, kRow);
  // rowwise [i][j] = tile (i, j)
  CHECK(bits(rs[0 * 4 + 0]) == 0x3C000000u);  // 1/128
  CHECK(bits(rs[0 * 4 + 1]) == 0x3B000000u);  // 1/512
  CHECK(bits(rs[1 * 4 + 0]) == 0x3C800000u);  // 1/64
  CHECK(bits(rs[1 * 4 + 1]) == 0x3F800000u);  // 1
  for (int i = 0; i < 2; ++i) {
    CHECK(bits(rs[i * 4 + 2]) == 0u);
    CHECK(bits(rs[i * 4 + 3]) == 0u);
  }
  const float* cs = scales_of(t, kCol);
  // columnwise [j][i] = tile (i, j)
  CHECK(bits(cs[0 * 4 + 0]) == 0x3C000000u);
  CHECK(bits(cs[0 * 4 + 1]) == 0x3C800000u);  // tile (1,0)
  CHECK(bits(cs[1 * 4 + 0]) == 0x3B000000u);  // tile (0,1)
  CHECK(bits(cs[1 * 4 + 1]) == 0x3F800000u);
  for (int j = 0; j < 2; ++j) {
    CHECK(bits(cs[j * 4 + 2]) == 0u);
    CHECK(bits(cs[j * 4 + 3]) == 0u);
  }

  const std::uint8_t* rd = data_of(t, kRow);
  CHECK(rd[0] == 0x7C);              // 3*128 = 384 -> 0x7C
  CHECK(rd[5 * n + 7] == 0xF8);      // -2*128 = -256 -> 0xF8
  CHECK(rd[127 * n + 129] == 0x78);  // 0.5*512 = 256 -> 0x78
  CHECK(rd[129 * n + 0] == 0x76);    // 3.5000002*64 = 224.00002 -> 0x76
  CHECK(rd[128 * n + 127] == 0x68);  // 1*64 -> 0x68

  // Columnwise data [K, M] is exactly the transpose of the rowwise bytes.
  const std::uint8_t* cd = data_of(t, kCol);
  int mismatches = 0;
  for (std::int64_t m = 0; m < n; ++m)
    for (std::int64_t k = 0; k < n; ++k) mismatches += cd[k * n + m] != rd[m * n + k];
  CHECK(mismatches == 0);
}

TEST_CASE("blockwise 128x128 columnwise == transpose, and == rowwise of the transposed source") {
  const std::int64_t m = 300, k = 200;  // 3x2 tiles, partial in both dimensions
  const std::vector<float> v = pseudo_random(m * k, 7);
  Tensor x = f32_tensor(m, k, v);
  std::vector<float> vt(v.size());
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t c = 0; c < k; ++c) vt[c * m + r] = v[r * k + c];
  Tensor xt = f32_tensor(k, m, vt);

  for (bool pow2 : {true, false}) {
    CAPTURE(pow2);
    auto s = make(block("128x128", pow2));
    QuantizedTensor t = s.q->quantize(x.view(), kBoth);
    QuantizedTensor tt = s.q->quantize(xt.view(), QR_USAGE_ROWWISE);
    const std::uint8_t* rd = data_of(t, kRow);
    const std::uint8_t* cd = data_of(t, kCol);
    int mismatches = 0;
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t c = 0; c < k; ++c) mismatches += cd[c * m + r] != rd[r * k + c];
    CHECK(mismatches == 0);
    // scales: rowwise [3][4], columnwise [2][4]; cs[j][i] == rs[i][j]
    const float* rs = scales_of(t, kRow);
    const float* cs = scales_of(t, kCol);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) CHECK(bits(cs[j * 4 + i]) == bits(rs[i * 4 + j]));
    // tile (i, j) of x is tile (j, i) of x^T: identical bytes and scales, padding included
    REQUIRE(t.data(kCol).nbytes() == tt.data(kRow).nbytes());
    CHECK(std::memcmp(cd, data_of(tt, kRow), static_cast<std::size_t>(m * k)) == 0);
    REQUIRE(scale_count(t, kCol) == scale_count(tt, kRow));
    CHECK(std::memcmp(cs, scales_of(tt, kRow), static_cast<std::size_t>(scale_count(t, kCol)) * 4) == 0);
  }
}

// ------------------------------------------------------------------------- 4. edge cases

TEST_CASE("blockwise edge cases: NaN, inf, zeros, denormals") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = 1e-40f;  // FP32 subnormal, 71362 * 2^-149
  // Five rows of one 1x128 block each (K = 4).
  Tensor x = f32_tensor(5, 4, {
      nan, 2.0f, -1.0f, 0.0f,         // NaN: amax 2 from the rest
      inf, 2.0f, -inf, -0.5f,         // inf: amax inf -> scale 1
      0.0f, -0.0f, 0.0f, 0.0f,        // zeros: amax 0 -> scale 1
      denorm, -denorm, 0.0f, 0.0f,    // denormal amax: 448/amax overflows -> FLT_MAX
      denorm, -denorm, 1.0f, 0.0f});  // denormals next to a normal amax flush to +-0

  SUBCASE("pow2 on") {
    auto s = make(block("1x128"));
    QuantizedTensor t = s.q->quantize(x.view(), kBoth);
    const std::uint8_t* d = data_of(t, kRow);
    const float* si = scales_of(t, kRow);
    // NaN row: 448/2 = 224 -> 128; NaN -> 0x7F, 2*128 = 256 -> 0x78, -128 -> 0xF0, 0
    CHECK(bits(si[0]) == 0x3C000000u);
    CHECK(d[0] == 0x7F); CHECK(d[1] == 0x78); CHECK(d[2] == 0xF0); CHECK(d[3] == 0x00);
    // inf row: scale 1, scale_inv 1; inf -> 448 (0x7E), 2 -> 0x40, -inf -> 0xFE, -0.5 -> 0xB0
    CHECK(bits(si[1]) == 0x3F800000u);
    CHECK(d[4] == 0x7E); CHECK(d[5] == 0x40); CHECK(d[6] == 0xFE); CHECK(d[7] == 0xB0);
    // zeros: scale 1; -0 keeps its sign (0x80)
    CHECK(bits(si[2]) == 0x3F800000u);
    CHECK(d[8] == 0x00); CHECK(d[9] == 0x80); CHECK(d[10] == 0x00);
    // denormal amax: 448/1e-40 = inf -> FLT_MAX (f32 input) -> pow2 2^127 (0x7F000000);
    // scale_inv 2^-127 = 0x00400000 (an FP32 subnormal, exact);
    // 1e-40 * 2^127 = 0.017014 = 1.089 * 2^-6 -> 1.125 * 2^-6 -> 0x09 (and 0x89)
    CHECK(bits(si[3]) == 0x00400000u);
    CHECK(d[12] == 0x09); CHECK(d[13] == 0x89);
    // denormal beside amax 1: scale 256; 1e-40*256 = 2.6e-38 -> +-0 (0x00 / 0x80); 1 -> 0x78
    CHECK(bits(si[4]) == 0x3B800000u);
    CHECK(d[16] == 0x00); CHECK(d[17] == 0x80); CHECK(d[18] == 0x78);
    // The columnwise blocks mix rows: column 0 = [NaN, inf, 0, d, d] has amax inf -> scale 1
    // (only that block), NaN -> 0x7F, inf -> 0x7E, denormals -> 0.
    const std::uint8_t* c = data_of(t, kCol);
    const float* cs = scales_of(t, kCol);
    CHECK(bits(cs[0]) == 0x3F800000u);
    CHECK(c[0] == 0x7F); CHECK(c[1] == 0x7E); CHECK(c[3] == 0x00);
    // column 3 = [0, -0.5, 0, 0, 0]: amax 0.5 -> 896 -> 512, -0.5*512 = -256 -> 0xF8
    CHECK(bits(cs[3]) == 0x3B000000u);
    CHECK(c[3 * 5 + 1] == 0xF8);
  }
  SUBCASE("pow2 off") {
    auto s = make(block("1x128", false));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const std::uint8_t* d = data_of(t, kRow);
    const float* si = scales_of(t, kRow);
    // denormal amax: scale FLT_MAX (0x7F7FFFFF); 1/FLT_MAX = 2^-128 rounded = 0x00200000;
    // 1e-40 * FLT_MAX = 0.034028 = 1.089 * 2^-5 -> 1.125 * 2^-5 -> 0x11
    CHECK(bits(si[3]) == 0x00200000u);
    CHECK(d[12] == 0x11); CHECK(d[13] == 0x91);
    // inf block still uses scale 1 (pow2 does not matter)
    CHECK(bits(si[1]) == 0x3F800000u);
  }
}

TEST_CASE("blockwise empty, single-element and 0-D tensors") {
  for (const char* b : {"1x128", "128x128"}) {
    CAPTURE(b);
    auto s = make(block(b));
    for (auto shape : {std::vector<std::int64_t>{0, 5}, std::vector<std::int64_t>{4, 0},
                       std::vector<std::int64_t>{0, 0}}) {
      Tensor x(DType::f32, shape);
      QuantizedTensor t = s.q->quantize(x.view(), kBoth);
      CHECK(t.data(kRow).numel() == 0);
      CHECK(t.data(kCol).numel() == 0);
      Tensor back = s.q->dequantize(t, kCol);
      CHECK(back.numel() == 0);
    }
    // [1, 1]: 2 -> 448/2 = 224 -> 128 -> 256 (0x78); scales [1, 4] with 3 padding zeros in both
    // directions (1x128: [ceil(1/128), roundup(1,4)]; 128x128: [1, roundup(1,4)])
    Tensor one = f32_tensor(1, 1, {2.0f});
    QuantizedTensor t = s.q->quantize(one.view(), kBoth);
    for (qr_direction d : {kRow, kCol}) {
      CHECK(data_of(t, d)[0] == 0x78);
      REQUIRE(scale_count(t, d) == 4);
      CHECK(bits(scales_of(t, d)[0]) == 0x3C000000u);
      for (int i = 1; i < 4; ++i) CHECK(bits(scales_of(t, d)[i]) == 0u);
    }
    // 0-D tensor is [1, 1]
    Tensor scalar(DType::f32, std::vector<std::int64_t>{});
    *scalar.data_as<float>() = -2.0f;
    QuantizedTensor ts = s.q->quantize(scalar.view(), kBoth);
    CHECK(ts.rows() == 1); CHECK(ts.cols() == 1);
    CHECK(data_of(ts, kRow)[0] == 0xF8);
    CHECK(data_of(ts, kCol)[0] == 0xF8);
  }
}

// ------------------------------------------------------------------------- 5. input dtypes

TEST_CASE("blockwise bf16 input: an infinite scale becomes the bf16 max, not FLT_MAX") {
  // bf16 0x0001 = 2^-133 (subnormal), 0x8001 = -2^-133. 448 / 2^-133 overflows FP32.
  Tensor x(DType::bf16, {1, 2});
  x.data_as<std::uint16_t>()[0] = 0x0001;
  x.data_as<std::uint16_t>()[1] = 0x8001;

  SUBCASE("pow2 off") {
    auto s = make(block("1x128", false));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    // scale = bf16 max 0x7F7F = 3.3895314e38 (FP32 0x7F7F0000); 1/scale = 0x00202020;
    // 2^-133 * (2^128 - 2^120) = 2^-5 - 2^-13 = 0.0311279 = 1.992 * 2^-6 -> rounds up to 2^-5
    // -> 0x10 (and 0x90)
    CHECK(bits(scales_of(t, kRow)[0]) == 0x00202020u);
    CHECK(data_of(t, kRow)[0] == 0x10);
    CHECK(data_of(t, kRow)[1] == 0x90);
    // The same value as an f32 input uses FLT_MAX: 1/FLT_MAX = 0x00200000.
    Tensor xf = f32_tensor(1, 2, {num::bf16_to_f32(0x0001), num::bf16_to_f32(0x8001)});
    QuantizedTensor tf = s.q->quantize(xf.view(), QR_USAGE_ROWWISE);
    CHECK(bits(scales_of(tf, kRow)[0]) == 0x00200000u);
    CHECK(data_of(tf, kRow)[0] == 0x10);
  }
  SUBCASE("pow2 on") {
    auto s = make(block("1x128"));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    // bf16 max 0x7F7F0000 -> clear the mantissa -> 2^127; 1/2^127 = 0x00400000;
    // 2^-133 * 2^127 = 2^-6 -> 0x08
    CHECK(bits(scales_of(t, kRow)[0]) == 0x00400000u);
    CHECK(data_of(t, kRow)[0] == 0x08);
    CHECK(data_of(t, kRow)[1] == 0x88);
  }
}

TEST_CASE("blockwise f16 input") {
  // f16 [1, -2, 3, 0.5] (0x3C00, 0xC000, 0x4200, 0x3800): as the f32 row in the first test,
  // amax 3 -> 128 -> 0x70, 0xF8, 0x7C, 0x68. (f16's value_for_inf, 65504, is unreachable:
  // its smallest subnormal 2^-24 gives a finite 448 * 2^24.)
  Tensor x(DType::f16, {1, 4});
  const std::uint16_t h[] = {0x3C00, 0xC000, 0x4200, 0x3800};
  std::memcpy(x.data_as<std::uint16_t>(), h, sizeof h);
  for (const char* b : {"1x128", "128x128"}) {
    auto s = make(block(b));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    const std::uint8_t expected[] = {0x70, 0xF8, 0x7C, 0x68};
    for (int i = 0; i < 4; ++i) CHECK(data_of(t, kRow)[i] == expected[i]);
    CHECK(bits(scales_of(t, kRow)[0]) == 0x3C000000u);
  }
}

// ------------------------------------------------------------------------- 6. layouts

TEST_CASE("blockwise layouts for 130x200 (M not a multiple of 4, K not a multiple of 128)") {
  auto s1 = make(block("1x128"));
  auto s2 = make(block("128x128"));
  struct Expect {
    const Setup* s;
    qr_direction d;
    std::int64_t data0, data1, scale0, scale1;
    int data_t, scale_t, br, bc;
  };
  const Expect cases[] = {
      {&s1, kRow, 130, 200, 2, 132, 0, 1, 1, 128},    // [ceil(200/128), roundup(130,4)]
      {&s1, kCol, 200, 130, 2, 200, 1, 0, 128, 1},    // [ceil(130/128), roundup(200,4)]
      {&s2, kRow, 130, 200, 2, 4, 0, 0, 128, 128},    // [ceil(130/128), roundup(2,4)]
      {&s2, kCol, 200, 130, 2, 4, 1, 1, 128, 128},    // [ceil(200/128), roundup(2,4)]
  };
  for (const Expect& e : cases) {
    CAPTURE(e.d);
    CAPTURE(e.br);
    const qr_direction_layout l = e.s->q->layout(130, 200, e.d);
    CHECK(std::string(l.format) == "blockwise");
    CHECK(l.data_dtype == QR_DTYPE_E4M3);
    CHECK(l.data_ndim == 2);
    CHECK(l.data_shape[0] == e.data0); CHECK(l.data_shape[1] == e.data1);
    CHECK(l.data_transposed == e.data_t);
    CHECK(l.scale_mode == QR_SCALE_BLOCK);
    CHECK(l.scale_dtype == QR_DTYPE_F32);
    CHECK(l.scale_ndim == 2);
    CHECK(l.scale_shape[0] == e.scale0); CHECK(l.scale_shape[1] == e.scale1);
    CHECK(l.scale_transposed == e.scale_t);
    CHECK(l.block_rows == e.br); CHECK(l.block_cols == e.bc);
    CHECK(l.has_amax == 0);
  }
  // Columnwise 1x128 padding along K: 3x6 -> scales [1, roundup(6,4) = 8].
  const qr_direction_layout l = s1.q->layout(3, 6, kCol);
  CHECK(l.scale_shape[0] == 1); CHECK(l.scale_shape[1] == 8);
}

TEST_CASE("blockwise 1x128 rowwise scales are transposed: entry [j][i] is (row i, block j)") {
  // M = 5, K = 384 (3 blocks per row). Block (i, j) holds one value 2^-(i + 5j) at column
  // j*128 + (i + j) % 128, so its pow2 scale is 448 * 2^(i+5j) -> 256 * 2^(i+5j) and its
  // scale_inv 2^-(8 + i + 5j); the stored array is [3, roundup(5, 4) = 8].
  const std::int64_t m = 5, k = 384;
  Tensor x = f32_tensor(m, k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < 3; ++j) x.data_as<float>()[i * k + j * 128 + (i + j) % 128] = num::exp2i(-(i + 5 * j));
  auto s = make(block("1x128"));
  QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
  REQUIRE(scale_count(t, kRow) == 3 * 8);
  const float* si = scales_of(t, kRow);
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 8; ++i) {
      CAPTURE(i);
      CAPTURE(j);
      if (i < m) {
        CHECK(si[j * 8 + i] == num::exp2i(-(8 + i + 5 * j)));
        CHECK(data_of(t, kRow)[i * k + j * 128 + (i + j) % 128] == 0x78);  // 2^-(i+5j) * 256 * 2^(i+5j) = 256
      } else {
        CHECK(bits(si[j * 8 + i]) == 0u);  // padding rows 5..7
      }
    }
  }
}

// An oracle written straight from docs/numerics.md ("blockwise"), independent of the plugin's loop
// structure: block amaxes from a scan of each block's element range, then, for every element,
// the data byte and the scale at the positions the layout table names.
void check_against_oracle(const std::vector<float>& v, std::int64_t m, std::int64_t k,
                          bool tile, bool pow2, const QuantizedTensor& t) {
  for (qr_direction d : {kRow, kCol}) {
    const std::int64_t br = tile ? 128 : (d == kRow ? 1 : 128);
    const std::int64_t bc = tile ? 128 : (d == kRow ? 128 : 1);
    const std::int64_t grid_r = (m + br - 1) / br, grid_c = (k + bc - 1) / bc;
    std::vector<float> block_amax(static_cast<std::size_t>(grid_r * grid_c), 0.0f);
    for (std::int64_t a = 0; a < grid_r; ++a)
      for (std::int64_t b = 0; b < grid_c; ++b)
        for (std::int64_t r = a * br; r < std::min(m, a * br + br); ++r)
          for (std::int64_t c = b * bc; c < std::min(k, b * bc + bc); ++c)
            block_amax[a * grid_c + b] = std::fmax(block_amax[a * grid_c + b], std::fabs(v[r * k + c]));
    const std::uint8_t* data = data_of(t, d);
    const float* scales = scales_of(t, d);
    const std::int64_t ld = t.layout(d).scale_shape[1];
    std::vector<char> written(static_cast<std::size_t>(scale_count(t, d)), 0);
    int bad_data = 0, bad_scale = 0;
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t c = 0; c < k; ++c) {
        const std::int64_t a = r / br, b = c / bc;
        const float scale = scale_from_amax(block_amax[a * grid_c + b], 448.0f, pow2, 0.0f, FLT_MAX);
        // stored scale index: 1x128 rowwise [b][r]; 1x128 columnwise [a][c];
        // 128x128 rowwise [a][b]; 128x128 columnwise [b][a]
        std::int64_t si;
        if (!tile) si = d == kRow ? b * ld + r : a * ld + c;
        else si = d == kRow ? a * ld + b : b * ld + a;
        written[static_cast<std::size_t>(si)] = 1;
        bad_scale += bits(scales[si]) != bits(1.0f / scale);
        const std::int64_t di = d == kRow ? r * k + c : c * m + r;
        bad_data += data[di] != num::f32_to_e4m3(v[r * k + c] * scale);
      }
    }
    int bad_padding = 0;
    for (std::size_t i = 0; i < written.size(); ++i) bad_padding += !written[i] && bits(scales[i]) != 0u;
    CAPTURE(d);
    CHECK(bad_data == 0);
    CHECK(bad_scale == 0);
    CHECK(bad_padding == 0);
  }
}

TEST_CASE("blockwise matches an element-wise oracle on 130x200 (all blocks, both pow2 modes)") {
  const std::int64_t m = 130, k = 200;
  std::vector<float> v = pseudo_random(m * k, 11);
  v[3 * k + 150] = std::numeric_limits<float>::quiet_NaN();
  v[129 * k + 199] = -std::numeric_limits<float>::infinity();
  Tensor x = f32_tensor(m, k, v);
  for (const char* b : {"1x128", "128x128"}) {
    for (bool pow2 : {true, false}) {
      CAPTURE(b);
      CAPTURE(pow2);
      auto s = make(block(b, pow2));
      QuantizedTensor t = s.q->quantize(x.view(), kBoth);
      check_against_oracle(v, m, k, std::string(b) == "128x128", pow2, t);
    }
  }
}

// ------------------------------------------------------------------------- 7. transposes

TEST_CASE("blockwise 1x128 columnwise == rowwise quantization of the transposed source") {
  // M = 300 (row blocks 128, 128, 44), K = 262 (roundup(262,4) = 264: padding in the scales).
  const std::int64_t m = 300, k = 262;
  const std::vector<float> v = pseudo_random(m * k, 3);
  Tensor x = f32_tensor(m, k, v);
  // x^T as a strided view of the same memory: shape [K, M], strides [1, K].
  TensorView xt(x.data_as<float>(), DType::f32, {k, m});
  xt.c().strides[0] = 1;
  xt.c().strides[1] = k;
  for (bool pow2 : {true, false}) {
    CAPTURE(pow2);
    auto s = make(block("1x128", pow2));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_COLUMNWISE);
    QuantizedTensor tt = s.q->quantize(xt, QR_USAGE_ROWWISE);
    // data: [K, M] both
    REQUIRE(t.data(kCol).numel() == tt.data(kRow).numel());
    CHECK(std::memcmp(data_of(t, kCol), data_of(tt, kRow), static_cast<std::size_t>(m * k)) == 0);
    // scales: columnwise of x is [ceil(M/128), roundup(K,4)] = [3, 264]; rowwise of x^T is
    // [ceil(M/128), roundup(K,4)] too, with the same meaning (block j of row k of x^T =
    // row block j of column k of x), padding included.
    REQUIRE(scale_count(t, kCol) == 3 * 264);
    REQUIRE(scale_count(tt, kRow) == 3 * 264);
    CHECK(std::memcmp(scales_of(t, kCol), scales_of(tt, kRow), 3 * 264 * 4) == 0);
  }
}

TEST_CASE("blockwise flattens leading dimensions of N-D sources") {
  const std::vector<float> v = pseudo_random(6 * 130, 5);
  Tensor x3(DType::f32, {2, 3, 130});
  std::memcpy(x3.data_as<float>(), v.data(), v.size() * 4);
  Tensor x2 = f32_tensor(6, 130, v);
  for (const char* b : {"1x128", "128x128"}) {
    auto s = make(block(b));
    QuantizedTensor a = s.q->quantize(x3.view(), kBoth);
    QuantizedTensor c = s.q->quantize(x2.view(), kBoth);
    CHECK(a.rows() == 6);
    for (qr_direction d : {kRow, kCol}) {
      CHECK(std::memcmp(data_of(a, d), data_of(c, d), 6 * 130) == 0);
      CHECK(std::memcmp(scales_of(a, d), scales_of(c, d),
                        static_cast<std::size_t>(scale_count(a, d)) * 4) == 0);
    }
  }
}

// ------------------------------------------------------------------------- 8. roles, options

TEST_CASE("blockwise default block depends on the role; an explicit block wins") {
  auto block_of = [](const Setup& s) {
    const qr_direction_layout l = s.q->layout(256, 256, kRow);
    return std::to_string(l.block_rows) + "x" + std::to_string(l.block_cols);
  };
  CHECK(block_of(make({}, "weight")) == "128x128");
  CHECK(block_of(make({}, "input")) == "1x128");
  CHECK(block_of(make({}, "grad_output")) == "1x128");
  CHECK(block_of(make({}, "")) == "1x128");  // no role decides: 1x128 (docs/recipes.md)
  CHECK(block_of(make(block("1x128"), "weight")) == "1x128");
  CHECK(block_of(make(block("128x128"), "input")) == "128x128");

  CHECK(make({}, "weight").q->describe() ==
        "blockwise{block=128x128 (role default), pow2_scales=true, amax_epsilon=0}");
  Options o = block("1x128", false);
  o.emplace_back("amax_epsilon", OptionValue::of_float(0.25));
  CHECK(make(o, "weight").q->describe() ==
        "blockwise{block=1x128, pow2_scales=false, amax_epsilon=0.25}");
}

TEST_CASE("blockwise option validation happens in the engine") {
  auto reject = [](const Options& options) {
    const QuantizerSpec spec = spec_of(options);
    CHECK_THROWS_AS(Engine(Recipe::uniform(spec), registry()), RecipeError);
  };
  reject({{"block", OptionValue::of_enum("64x64")}});
  reject({{"amax_epsilon", OptionValue::of_float(-1.0)}});
  reject({{"pow2", OptionValue::of_bool(true)}});  // unknown key
}

// ------------------------------------------------------------------------- 9. dequantize, errors

TEST_CASE("blockwise dequantize: q * scale_inv per block, both directions") {
  Tensor x = f32_tensor(1, 4, {1.0f, -2.0f, 3.0f, 0.5f});
  SUBCASE("pow2 on: this row is exactly representable") {
    auto s = make(block("1x128"));
    QuantizedTensor t = s.q->quantize(x.view(), kBoth);
    for (qr_direction d : {kRow, kCol}) {
      Tensor back = s.q->dequantize(t, d);
      for (int i = 0; i < 4; ++i) CHECK(back.data_as<float>()[i] == x.data_as<float>()[i]);
    }
  }
  SUBCASE("pow2 off") {
    auto s = make(block("1x128", false));
    QuantizedTensor t = s.q->quantize(x.view(), QR_USAGE_ROWWISE);
    Tensor back = s.q->dequantize(t, kRow);
    // codes 0x71 (144), 0xF9 (-288), 0x7E (448), 0x69 (72) times 1/149.33333 (0x3BDB6DB7):
    // 144 * 0.0066964286 = 0.96428573 (0x3F76DB6E), -1.9285715 (0xBFF6DB6E), 3.0, 0.48214287
    const std::uint32_t expected[] = {0x3F76DB6Eu, 0xBFF6DB6Eu, 0x40400000u, 0x3EF6DB6Eu};
    for (int i = 0; i < 4; ++i) CHECK(bits(back.data_as<float>()[i]) == expected[i]);
    // bf16 destination: 0.96428573 rounds to bf16 0x3F77
    Tensor bf(DType::bf16, {1, 4});
    s.q->dequantize(t, kRow, bf.view());
    CHECK(bf.data_as<std::uint16_t>()[0] == 0x3F77);
    CHECK(bf.data_as<std::uint16_t>()[2] == 0x4040);
  }
  SUBCASE("NaN decodes to NaN; 128x128 decodes through a 1x128 quantizer") {
    Tensor y = f32_tensor(2, 2, {std::numeric_limits<float>::quiet_NaN(), 2.0f, -1.0f, 0.0f});
    auto tile = make(block("128x128"));
    QuantizedTensor t = tile.q->quantize(y.view(), kBoth);
    auto vec = make(block("1x128"));
    for (qr_direction d : {kRow, kCol}) {
      Tensor back = vec.q->dequantize(t, d);  // the tensor's own layout says 128x128
      const float* b = back.data_as<float>();
      CHECK(std::isnan(b[0]));
      CHECK(b[1] == 2.0f); CHECK(b[2] == -1.0f); CHECK(b[3] == 0.0f);
    }
  }
}

TEST_CASE("blockwise round trip stays within half an E4M3 ulp of each block") {
  const std::int64_t m = 130, k = 200;
  const std::vector<float> v = pseudo_random(m * k, 19);
  Tensor x = f32_tensor(m, k, v);
  for (const char* b : {"1x128", "128x128"}) {
    auto s = make(block(b, false));
    QuantizedTensor t = s.q->quantize(x.view(), kBoth);
    for (qr_direction d : {kRow, kCol}) {
      Tensor back = s.q->dequantize(t, d);
      int bad = 0;
      for (std::int64_t i = 0; i < m * k; ++i) {
        // Relative error of E4M3 normals is <= 2^-4; below 2^-6 * scale_inv the absolute
        // error is <= 2^-10 * scale_inv, and scale_inv <= amax/448 <= 2^11/448 < 2^3 here.
        const float err = std::fabs(back.data_as<float>()[i] - v[i]);
        bad += !(err <= std::fabs(v[i]) * 0.0625f + num::exp2i(-10 + 3));
      }
      CAPTURE(b);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("blockwise without CUDA kernels refuses CUDA tensors with UNSUPPORTED") {
  auto s = make();
  // A plugin built with CUDA runs its kernels instead (no silent fallback either way):
  // tests/gpu/test_gpu_parity.cpp holds them to the reference, byte for byte.
  if (s.q->plugin().supports(Device::cuda(0))) {
    CHECK(s.q->plugin().cuda_version() != 0);
    return;
  }
  float fake = 0.0f;
  TensorView cuda_view(&fake, DType::f32, {1, 1}, Device::cuda(0));
  // Through the engine: the plugin declares CPU only, so the engine refuses first.
  try {
    (void)s.q->quantize(cuda_view, QR_USAGE_ROWWISE);
    FAIL("quantize of a CUDA tensor did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
  }
  // Directly through the plugin's descriptor (what a host that skips the engine's check
  // reaches): the plugin's own refusal, with its message.
  const qr_plugin_descriptor& desc = s.q->plugin().c();
  CHECK((desc.devices & (1u << QR_DEVICE_CUDA)) == 0);
  float amax[2] = {0, 0};
  qr_status status = desc.compute_amax(s.q->handle(), &cuda_view.c(), nullptr, amax);
  REQUIRE(status != nullptr);
  try {
    throw_if_error(status, "");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(e.message().find("built without CUDA kernels") != std::string::npos);
  }
  Tensor cpu = f32_tensor(1, 1, {1.0f});
  QuantizedTensor t = s.q->quantize(cpu.view(), QR_USAGE_ROWWISE);
  qr_quantize_args args{};
  args.struct_size = sizeof args;
  args.usage = QR_USAGE_ROWWISE;
  status = desc.quantize(s.q->handle(), &cuda_view.c(), &args, &t.c());
  REQUIRE(status != nullptr);
  try {
    throw_if_error(status, "");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(e.message().find("built without CUDA kernels") != std::string::npos);
  }
}

TEST_CASE("blockwise quantize_into checks the destination; compute_amax ignores NaN") {
  Tensor x = f32_tensor(130, 130, pseudo_random(130 * 130, 23));
  auto tile = make(block("128x128"));
  auto vec = make(block("1x128"));
  QuantizedTensor t = tile.q->quantize(x.view(), kBoth);
  // Requantize in place with the same quantizer: same bytes.
  QuantizedTensor again = tile.q->quantize(x.view(), kBoth);
  tile.q->quantize_into(x.view(), again);
  CHECK(std::memcmp(data_of(t, kRow), data_of(again, kRow), 130 * 130) == 0);
  // A 1x128 quantizer cannot write into a tensor laid out for 128x128.
  try {
    vec.q->quantize_into(x.view(), t);
    FAIL("quantize_into with a mismatched block shape did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_INVALID_ARGUMENT);
    CHECK(e.message().find("allocate the destination from this quantizer's layout") != std::string::npos);
  }

  Tensor y = f32_tensor(1, 3, {std::numeric_limits<float>::quiet_NaN(), -5.0f, 2.0f});
  const auto amax = vec.q->compute_amax(y.view());
  CHECK(amax[0] == 5.0f);
  CHECK(amax[1] == 5.0f);
}

// ------------------------------------------------------------------------- 10. conformance

namespace conf = qrecipe::conformance;

// Error bounds, from the rules in blockwise_ref.hpp:
//   element: E4M3 round to nearest is within half an ulp, 2^-4 of |x*scale|; the FP32
//            products x*scale, q*scale_inv and 1/scale add a few 2^-24: 2^-4 + 2^-20.
//   block:   below E4M3's smallest normal the spacing is 2^-9, so the error is <= 2^-10 in
//            scaled units, i.e. 2^-10 * scale_inv. scale_inv is amax/448 without pow2 and up
//            to 2 * amax/448 with pow2 (the scale is rounded down by less than 2): 2^-9/448
//            covers both.
//   abs:     a denormal block amax makes 448/amax overflow; the scale is then the input dtype's
//            max (FLT_MAX, bf16 0x7F7F) or 2^127 with pow2, so scale_inv <= 2^-127 and the
//            floor is 2^-10 * 2^-127 = 2^-137.
//   amax_epsilon e: a block whose amax is below e is scaled as if its amax were e, so its
//            subnormal floor is 2^-9/448 * e instead.
constexpr double kElement = 0x1p-4 + 0x1p-20;
constexpr double kBlock = 0x1p-9 / 448;
constexpr double kAbs = 0x1p-137;
constexpr double kEpsilon = 0x1p-12;

TEST_CASE("blockwise conformance") {
  const conf::ErrorBound bound{.rel_element = kElement, .rel_block = kBlock, .abs = kAbs};
  const conf::ErrorBound eps_bound{.rel_element = kElement, .rel_block = kBlock,
                                   .abs = kAbs + kBlock * kEpsilon};
  const QuantizerRole input{"linear", "input", "conformance"};
  const QuantizerRole weight{"linear", "weight", "conformance"};
  const QuantizerRole grad{"linear", "grad_output", "conformance"};
  // 128x128 tiles: the columnwise copy is the transposed rowwise codes.
  const conf::Properties tiles{.columnwise_is_transpose = true};
  conf::run({.format = "blockwise",
             .cases = {
                 // role defaults: 1x128 for input and grad_output, 128x128 for weight
                 {.spec = conf::spec("blockwise"), .role = input, .bound = bound},
                 {.spec = conf::spec("blockwise"), .role = grad, .bound = bound},
                 {.spec = conf::spec("blockwise"), .role = weight, .bound = bound,
                  .properties = tiles},
                 // every block shape with and without power-of-two scales
                 {.spec = conf::spec("blockwise", {{"block", "1x128"}, {"pow2_scales", "false"}}),
                  .role = input, .bound = bound},
                 {.spec = conf::spec("blockwise", {{"block", "128x128"}, {"pow2_scales", "false"}}),
                  .role = input, .bound = bound, .properties = tiles},
                 {.spec = conf::spec("blockwise", {{"block", "128x128"}}), .role = input,
                  .bound = bound, .properties = tiles},
                 {.spec = conf::spec("blockwise", {{"block", "1x128"}}), .role = weight,
                  .bound = bound},
                 // amax_epsilon = 2^-12
                 {.spec = conf::spec("blockwise", {{"amax_epsilon", "0.000244140625"}}),
                  .role = input, .bound = eps_bound},
             }});
}

}  // namespace
