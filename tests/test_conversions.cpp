// Exhaustive tests of conversions.hpp and scaling.hpp against an oracle written here from the
// definitions, not from the code under test.
//
// Map:
//   1. Oracle: a narrow format is described by (exponent bits, mantissa bits, bias, specials,
//      saturation).
//      Every code is decoded in double with the textbook formula (1 + m/2^M) * 2^(e - bias)
//      (subnormals m/2^M * 2^(1 - bias)); encoding a float searches the sorted list of all
//      finite values for the nearest one, ties to the code whose mantissa is even. IEEE formats
//      (f16, bf16) get one extra "value" 2^(emax+1) standing for inf, which makes IEEE overflow
//      (round to inf at max + half an ulp, ties to even) fall out of the same search.
//   2. Every code: decode matches the oracle, encode(decode(c)) gives c back.
//   3. Every midpoint between adjacent values, and the FP32 neighbours of each midpoint.
//   4. Two million random floats per format from a fixed seed.
//   5. Hand-written boundaries (saturation, overflow, NaN payloads, signed zero, underflow).
//   6. E8M0, exp2i, round_half_even.
//   7. scale_from_amax and delayed_scaling_update (scaling.hpp) with hand-computed cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/scaling.hpp"

namespace {

using namespace qrecipe::num;

// ------------------------------------------------------------------ helpers

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kQNaN = from_bits(0x7FC00000u);

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", v);
  return buf;
}
std::string describe(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (bits 0x%08X)", static_cast<double>(x), bits_of(x));
  return buf;
}

// Collects the first few failures of a large loop so one CHECK reports them all.
struct Mismatches {
  std::size_t count = 0;
  std::string first;
  void add(const std::string& what) {
    if (count++ < 8) first += "  " + what + "\n";
  }
};

// ------------------------------------------------------------------ 1. oracle

enum class Specials {
  none,  // E2M1: every code is a finite number
  fn,    // E4M3 ("finite, NaN"): only S.1111.111 is NaN, no inf
  ieee,  // E5M2, F16, BF16: exponent all ones is inf (mantissa 0) or NaN
};

struct FormatSpec {
  const char* name;
  int exp_bits, man_bits, bias;
  Specials specials;
  bool saturate;  // beyond max (and inf) -> +-max; otherwise IEEE overflow to inf
};

class Oracle {
 public:
  explicit Oracle(FormatSpec spec) : spec_(spec) {
    const std::uint32_t n = 1u << (spec.exp_bits + spec.man_bits);  // non-negative codes
    std::vector<std::pair<double, std::uint32_t>> finite;
    for (std::uint32_t c = 0; c < n; ++c) {
      const double v = decode(c);
      if (std::isfinite(v)) finite.emplace_back(v, c);
      if (std::isinf(v)) inf_code_ = c;
    }
    std::sort(finite.begin(), finite.end());
    finite_count_ = 2 * finite.size();  // both signs
    if (!spec.saturate) {
      // IEEE rounds as if the exponent range were unbounded: the next value past max would
      // be 2^(emax+1), and anything that rounds to it overflows to inf.
      const int emax = (1 << spec.exp_bits) - 2 - spec.bias;
      finite.emplace_back(std::ldexp(1.0, emax + 1), inf_code_);
    }
    for (const auto& [v, c] : finite) {
      values_.push_back(v);
      codes_.push_back(c);
    }
  }

  int sign_shift() const { return spec_.exp_bits + spec_.man_bits; }
  std::uint32_t code_count() const { return 2u << sign_shift(); }
  std::size_t finite_count() const { return finite_count_; }
  // Non-negative finite values in increasing order (plus the inf stand-in for IEEE formats).
  const std::vector<double>& values() const { return values_; }
  const std::vector<std::uint32_t>& codes() const { return codes_; }

  // Textbook decode; NaN codes give NaN, inf codes give +-inf.
  double decode(std::uint32_t code) const {
    const int m_bits = spec_.man_bits;
    const std::uint32_t exp_all = (1u << spec_.exp_bits) - 1;
    const std::uint32_t man_all = (1u << m_bits) - 1;
    const bool neg = (code >> sign_shift()) & 1u;
    const std::uint32_t e = (code >> m_bits) & exp_all;
    const std::uint32_t m = code & man_all;
    double v;
    if (spec_.specials == Specials::ieee && e == exp_all) {
      v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    } else if (spec_.specials == Specials::fn && e == exp_all && m == man_all) {
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      v = (m / std::ldexp(1.0, m_bits)) * std::ldexp(1.0, 1 - spec_.bias);
    } else {
      v = (1.0 + m / std::ldexp(1.0, m_bits)) * std::ldexp(1.0, static_cast<int>(e) - spec_.bias);
    }
    return neg ? -v : v;
  }

  // Nearest code to a non-NaN float: the sign is copied, the magnitude goes to the nearest
  // value (saturating at the top of the list), ties to the even code.
  std::uint32_t encode(float x) const {
    const std::uint32_t sign = std::signbit(x) ? (1u << sign_shift()) : 0u;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= values_.back()) return sign | codes_.back();
    const std::size_t hi =
        static_cast<std::size_t>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin());
    const std::size_t lo = hi - 1;
    if (values_[lo] == a) return sign | codes_[lo];
    // Compare 2a with lo + hi: both are exact in double (a float times 2; two neighbours
    // with at most 11 significant bits), so the tie test is exact.
    const double twice = 2.0 * a, sum = values_[lo] + values_[hi];
    std::size_t pick;
    if (twice < sum) pick = lo;
    else if (twice > sum) pick = hi;
    else pick = (codes_[lo] & 1u) == 0 ? lo : hi;
    return sign | codes_[pick];
  }

 private:
  FormatSpec spec_;
  std::vector<double> values_;
  std::vector<std::uint32_t> codes_;
  std::uint32_t inf_code_ = 0;
  std::size_t finite_count_ = 0;
};

// A format under test: its oracle, the header's functions, and what NaN must encode to.
struct Format {
  FormatSpec spec;
  std::uint32_t (*encode)(float);
  float (*decode)(std::uint32_t);
  std::uint32_t (*nan_code)(float);  // the code a NaN input must produce
};

const Format kE4M3{{"e4m3", 4, 3, 7, Specials::fn, true},
                   [](float x) -> std::uint32_t { return f32_to_e4m3(x); },
                   [](std::uint32_t c) { return e4m3_to_f32(static_cast<std::uint8_t>(c)); },
                   [](float) -> std::uint32_t { return 0x7F; }};
const Format kE5M2{{"e5m2", 5, 2, 15, Specials::ieee, true},
                   [](float x) -> std::uint32_t { return f32_to_e5m2(x); },
                   [](std::uint32_t c) { return e5m2_to_f32(static_cast<std::uint8_t>(c)); },
                   [](float) -> std::uint32_t { return 0x7F; }};
const Format kE2M1{{"e2m1", 2, 1, 1, Specials::none, true},
                   [](float x) -> std::uint32_t { return f32_to_e2m1(x); },
                   [](std::uint32_t c) { return e2m1_to_f32(static_cast<std::uint8_t>(c)); },
                   [](float) -> std::uint32_t { return 0x7; }};  // +6: E2M1 has no NaN
const Format kF16{{"f16", 5, 10, 15, Specials::ieee, false},
                  [](float x) -> std::uint32_t { return f32_to_f16(x); },
                  [](std::uint32_t c) { return f16_to_f32(static_cast<std::uint16_t>(c)); },
                  // canonical quiet NaN with the input's sign
                  [](float x) -> std::uint32_t { return (std::signbit(x) ? 0x8000u : 0u) | 0x7E00u; }};
const Format kBF16{{"bf16", 8, 7, 127, Specials::ieee, false},
                   [](float x) -> std::uint32_t { return f32_to_bf16(x); },
                   [](std::uint32_t c) { return bf16_to_f32(static_cast<std::uint16_t>(c)); },
                   // the top half of the FP32 NaN (sign and upper payload kept), made quiet
                   [](float x) -> std::uint32_t { return (bits_of(x) >> 16) | 0x40u; }};

const Format* const kAllFormats[] = {&kE4M3, &kE5M2, &kE2M1, &kF16, &kBF16};

// The header's encode, checked against the oracle (NaN inputs against the format's NaN rule).
std::uint32_t expected_code(const Format& f, const Oracle& o, float x) {
  return std::isnan(x) ? f.nan_code(x) : o.encode(x);
}

void check_encode(const Format& f, const Oracle& o, float x, Mismatches& bad) {
  const std::uint32_t want = expected_code(f, o, x), got = f.encode(x);
  if (want != got)
    bad.add(std::string(f.spec.name) + "(" + describe(x) + ") = " + hex(got) + ", oracle " + hex(want));
}

// ------------------------------------------------------------------ oracle sanity

TEST_CASE("oracle: known values and code counts of each format") {
  // Facts from the format definitions (OCP MX spec v1.0, IEEE 754), checked so a bug in the
  // oracle cannot hide a bug in the header.
  const Oracle e4m3(kE4M3.spec), e5m2(kE5M2.spec), e2m1(kE2M1.spec), f16(kF16.spec), bf16(kBF16.spec);
  CHECK(e4m3.decode(0x7E) == 448.0);
  CHECK(e4m3.decode(0x38) == 1.0);
  CHECK(e4m3.decode(0x01) == std::ldexp(1.0, -9));
  CHECK(e4m3.decode(0x08) == std::ldexp(1.0, -6));
  CHECK(std::isnan(e4m3.decode(0x7F)));
  CHECK(e4m3.decode(0x78) == 256.0);  // exponent 1111 is a normal binade in E4M3
  CHECK(e4m3.finite_count() == 254);
  CHECK(e5m2.decode(0x7B) == 57344.0);
  CHECK(e5m2.decode(0x3C) == 1.0);
  CHECK(e5m2.decode(0x01) == std::ldexp(1.0, -16));
  CHECK(std::isinf(e5m2.decode(0x7C)));
  CHECK(std::isnan(e5m2.decode(0x7D)));
  CHECK(e5m2.finite_count() == 248);
  const double e2m1_values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (std::uint32_t c = 0; c < 8; ++c) {
    CHECK(e2m1.decode(c) == e2m1_values[c]);
    CHECK(e2m1.decode(c | 8u) == -e2m1_values[c]);
  }
  CHECK(e2m1.finite_count() == 16);
  CHECK(f16.decode(0x3C00) == 1.0);
  CHECK(f16.decode(0x7BFF) == 65504.0);
  CHECK(f16.decode(0x0001) == std::ldexp(1.0, -24));
  CHECK(f16.decode(0xC000) == -2.0);
  CHECK(f16.finite_count() == 65536 - 2048);
  CHECK(bf16.decode(0x3F80) == 1.0);
  CHECK(bf16.decode(0x7F7F) == static_cast<double>(from_bits(0x7F7F0000u)));
  CHECK(bf16.decode(0x0001) == std::ldexp(1.0, -133));
  CHECK(bf16.finite_count() == 65536 - 256);
  // Tie handling of the oracle itself: 2.5 lies between 2 (0x4) and 3 (0x5) -> 2.
  CHECK(e2m1.encode(2.5f) == 0x4);
  CHECK(f16.encode(65520.0f) == 0x7C00);  // max + half ulp -> inf (the even neighbour)
}

// ------------------------------------------------------------------ 2. every code

TEST_CASE("every code: decode matches the oracle and encode(decode(c)) round-trips") {
  for (const Format* f : kAllFormats) {
    SUBCASE(f->spec.name) {
      const Oracle o(f->spec);
      Mismatches bad;
      const std::uint32_t sign_bit = 1u << o.sign_shift();
      for (std::uint32_t c = 0; c < o.code_count(); ++c) {
        const double want = o.decode(c);
        const float got = f->decode(c);
        const std::uint32_t back = f->encode(got);
        if (std::isnan(want)) {
          if (!std::isnan(got)) bad.add(std::string("decode ") + hex(c) + " = " + describe(got) + ", want NaN");
          else if (back != f->nan_code(got)) bad.add("encode(decode NaN " + hex(c) + ") = " + hex(back));
          continue;
        }
        if (!(static_cast<double>(got) == want) || std::signbit(got) != std::signbit(want)) {
          bad.add(std::string("decode ") + hex(c) + " = " + describe(got) + ", oracle " + std::to_string(want));
          continue;
        }
        // inf codes of the saturating E5M2 cannot come back: inf encodes to +-max.
        const std::uint32_t want_back =
            std::isinf(want) && f == &kE5M2 ? ((c & sign_bit) | 0x7Bu) : c;
        if (back != want_back) bad.add("encode(decode " + hex(c) + ") = " + hex(back) + ", want " + hex(want_back));
      }
      INFO(bad.first);
      CHECK(bad.count == 0);
    }
  }
}

TEST_CASE("e2m1 decode reads only the low nibble") {
  for (std::uint32_t c = 0; c < 256; ++c)
    CHECK(bits_of(e2m1_to_f32(static_cast<std::uint8_t>(c))) ==
          bits_of(e2m1_to_f32(static_cast<std::uint8_t>(c & 0xF))));
}

// ------------------------------------------------------------------ 3. midpoints

TEST_CASE("every midpoint between neighbours, and one FP32 ulp either side, rounds as the oracle") {
  for (const Format* f : kAllFormats) {
    SUBCASE(f->spec.name) {
      const Oracle o(f->spec);
      const auto& v = o.values();
      std::vector<double> points(v.begin(), v.end());
      if (f->spec.saturate) {
        // Saturating formats: also probe halfway to the value the next code would have had
        // (E4M3 464 between 448 and 480, E5M2 61440, E2M1 7).
        const double max = v.back(), below = v[v.size() - 2];
        points.push_back(max + (max - below));
      }
      Mismatches bad;
      std::size_t probes = 0;
      for (std::size_t i = 0; i + 1 < points.size(); ++i) {
        const double mid_d = (points[i] + points[i + 1]) / 2;
        const float mid = static_cast<float>(mid_d);
        REQUIRE(static_cast<double>(mid) == mid_d);  // every midpoint is an FP32 value
        for (float x : {mid, next_down(mid), next_up(mid)}) {
          for (float s : {x, -x}) {
            check_encode(*f, o, s, bad);
            ++probes;
          }
        }
        // The midpoint itself is a tie: it must land on an even code (or inf's, which is even);
        // not so halfway to the saturating formats' missing next value, which is no tie.
        const bool real_tie = i + 2 < points.size() || !f->spec.saturate;
        if (real_tie && (o.encode(mid) & 1u) != 0) bad.add("oracle picked an odd code at " + describe(mid));
      }
      INFO(bad.first);
      CHECK(bad.count == 0);
      CHECK(probes == 6 * (points.size() - 1));
    }
  }
}

// ------------------------------------------------------------------ 4. random floats

// Deterministic sample: raw mt19937 words (its output sequence is fixed by the standard),
// no distributions (their algorithms are implementation-defined).
//   i % 4 == 0: any 32-bit pattern (all exponents, both signs, inf/NaN with payloads)
//   i % 4 == 1: exponents in and just around the format's range
//   i % 4 == 2: FP32 subnormals
//   i % 4 == 3: around the format's rounding ties (the bit below its mantissa set, +-2 ulp)
float sample(std::mt19937& rng, std::uint32_t i, const FormatSpec& spec) {
  const auto r = static_cast<std::uint32_t>(rng()), r2 = static_cast<std::uint32_t>(rng());
  const std::uint32_t sign = r & 0x80000000u;
  const int min_sub_exp = 1 - spec.bias - spec.man_bits;
  const int max_exp = (1 << spec.exp_bits) - 1 - spec.bias;
  const int lo = std::max(min_sub_exp - 3, -127), hi = std::min(max_exp + 2, 127);
  const int k = lo + static_cast<int>(r2 % static_cast<std::uint32_t>(hi - lo + 1));
  const std::uint32_t exp_field = k < -126 ? 0u : static_cast<std::uint32_t>(k + 127);
  switch (i % 4) {
    case 0: return from_bits(r ^ (r2 << 7));
    case 1: return from_bits(sign | (exp_field << 23) | (r & 0x7FFFFFu));
    case 2: return from_bits(sign | (r & 0x7FFFFFu));
    default: {
      const int tie_bit = 22 - spec.man_bits;  // for bf16 (M = 7) bit 15
      const std::uint32_t top = (r & 0x7FFFFFu) & ~((2u << tie_bit) - 1u);
      const std::uint32_t base = sign | (exp_field << 23) | top | (1u << tie_bit);
      const int delta = static_cast<int>((r2 >> 16) % 5u) - 2;
      return from_bits(base + static_cast<std::uint32_t>(delta));
    }
  }
}

TEST_CASE("two million random floats per format match the oracle") {
  for (const Format* f : kAllFormats) {
    SUBCASE(f->spec.name) {
      const Oracle o(f->spec);
      std::mt19937 rng(0x5EED1234u);
      Mismatches bad;
      std::size_t nan_inputs = 0, subnormal_inputs = 0, negative_inputs = 0;
      constexpr std::uint32_t kSamples = 2'000'000;
      for (std::uint32_t i = 0; i < kSamples; ++i) {
        const float x = sample(rng, i, f->spec);
        nan_inputs += std::isnan(x);
        subnormal_inputs += std::fpclassify(x) == FP_SUBNORMAL;
        negative_inputs += std::signbit(x);
        check_encode(*f, o, x, bad);
      }
      INFO(bad.first);
      CHECK(bad.count == 0);
      // The sample really covers what it claims to.
      CHECK(nan_inputs > 1000);
      CHECK(subnormal_inputs > kSamples / 5);
      CHECK(negative_inputs > kSamples / 3);
    }
  }
}

// ------------------------------------------------------------------ 5. boundaries by hand

TEST_CASE("e4m3 saturation, NaN, zero and underflow") {
  // Neighbours at the top: 416 = 0x7D (1.101b * 2^8), 448 = 0x7E (1.110b * 2^8); 0x7F is NaN.
  CHECK(f32_to_e4m3(448.0f) == 0x7E);
  CHECK(f32_to_e4m3(next_down(448.0f)) == 0x7E);
  CHECK(f32_to_e4m3(next_up(448.0f)) == 0x7E);
  CHECK(f32_to_e4m3(464.0f) == 0x7E);  // halfway to the 480 E4M3 does not have
  CHECK(f32_to_e4m3(next_down(464.0f)) == 0x7E);
  CHECK(f32_to_e4m3(next_up(464.0f)) == 0x7E);
  CHECK(f32_to_e4m3(480.0f) == 0x7E);
  CHECK(f32_to_e4m3(1e30f) == 0x7E);
  CHECK(f32_to_e4m3(FLT_MAX) == 0x7E);
  CHECK(f32_to_e4m3(kInf) == 0x7E);
  CHECK(f32_to_e4m3(-kInf) == 0xFE);
  CHECK(f32_to_e4m3(-448.0f) == 0xFE);
  CHECK(f32_to_e4m3(-464.0f) == 0xFE);
  CHECK(f32_to_e4m3(432.0f) == 0x7E);  // (416 + 448) / 2: tie, 0x7E has the even mantissa 110
  CHECK(f32_to_e4m3(next_down(432.0f)) == 0x7D);
  CHECK(f32_to_e4m3(-next_down(432.0f)) == 0xFD);
  // NaN of either sign, quiet or signalling, any payload: the canonical 0x7F.
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu})
    CHECK(f32_to_e4m3(from_bits(nan)) == 0x7F);
  CHECK(f32_to_e4m3(0.0f) == 0x00);
  CHECK(f32_to_e4m3(-0.0f) == 0x80);
  CHECK(f32_to_e4m3(from_bits(1)) == 0x00);           // 2^-149, the smallest FP32 denormal
  CHECK(f32_to_e4m3(from_bits(0x80000001u)) == 0x80); // -2^-149 keeps its sign
  // Smallest E4M3 subnormal 2^-9: half of it (2^-10) ties to zero, anything above goes up.
  CHECK(f32_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);
  CHECK(f32_to_e4m3(next_down(std::ldexp(1.0f, -10))) == 0x00);
  CHECK(f32_to_e4m3(next_up(std::ldexp(1.0f, -10))) == 0x01);
  CHECK(f32_to_e4m3(-next_up(std::ldexp(1.0f, -10))) == 0x81);
  CHECK(f32_to_e4m3(1.5f * std::ldexp(1.0f, -9)) == 0x02);  // between 0x01 and 0x02: even
  CHECK(f32_to_e4m3(std::ldexp(1.0f, -6)) == 0x08);         // smallest normal
  CHECK(f32_to_e4m3(7.5f * std::ldexp(1.0f, -9)) == 0x08);  // 0x07 (7 * 2^-9) vs 0x08: even
  CHECK(f32_to_e4m3(1.0f) == 0x38);
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
}

TEST_CASE("e5m2 saturation, NaN, inf codes and underflow") {
  // Top: 49152 = 0x7A (1.10b * 2^15), 57344 = 0x7B (1.11b * 2^15); 0x7C is inf.
  CHECK(f32_to_e5m2(57344.0f) == 0x7B);
  CHECK(f32_to_e5m2(next_up(57344.0f)) == 0x7B);
  CHECK(f32_to_e5m2(61440.0f) == 0x7B);  // halfway to 65536: saturates, does not overflow
  CHECK(f32_to_e5m2(next_up(61440.0f)) == 0x7B);
  CHECK(f32_to_e5m2(65536.0f) == 0x7B);
  CHECK(f32_to_e5m2(kInf) == 0x7B);
  CHECK(f32_to_e5m2(-kInf) == 0xFB);
  CHECK(f32_to_e5m2(-61440.0f) == 0xFB);
  CHECK(f32_to_e5m2(53248.0f) == 0x7A);  // (49152 + 57344) / 2: tie to the even mantissa 10
  CHECK(f32_to_e5m2(next_up(53248.0f)) == 0x7B);
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u})
    CHECK(f32_to_e5m2(from_bits(nan)) == 0x7F);
  CHECK(f32_to_e5m2(-0.0f) == 0x80);
  CHECK(f32_to_e5m2(from_bits(1)) == 0x00);
  CHECK(f32_to_e5m2(std::ldexp(1.0f, -17)) == 0x00);  // half the smallest subnormal 2^-16
  CHECK(f32_to_e5m2(next_up(std::ldexp(1.0f, -17))) == 0x01);
  CHECK(f32_to_e5m2(1.0f) == 0x3C);
  // Decoding follows the format: 0x7C/0xFC are +-inf, 0x7D..0x7F NaN.
  CHECK(e5m2_to_f32(0x7C) == kInf);
  CHECK(e5m2_to_f32(0xFC) == -kInf);
  CHECK(std::isnan(e5m2_to_f32(0x7D)));
  CHECK(std::isnan(e5m2_to_f32(0x7F)));
  CHECK(e5m2_to_f32(0x7B) == 57344.0f);
}

TEST_CASE("e2m1 saturation, ties and NaN") {
  // Values 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0..7; the sign is bit 3.
  struct Case { float x; std::uint8_t code; };
  const Case cases[] = {
      {0.25f, 0x0},             // tie 0 / 0.5 -> 0 (even)
      {next_up(0.25f), 0x1},
      {0.75f, 0x2},             // tie 0.5 (0x1) / 1 (0x2) -> 0x2
      {next_down(0.75f), 0x1},
      {1.25f, 0x2},             // tie 1 (0x2) / 1.5 (0x3) -> 0x2
      {1.75f, 0x4},             // tie 1.5 (0x3) / 2 (0x4) -> 0x4
      {2.5f, 0x4},              // tie 2 (0x4) / 3 (0x5) -> 0x4
      {next_up(2.5f), 0x5},
      {3.5f, 0x6},              // tie 3 (0x5) / 4 (0x6) -> 0x6
      {5.0f, 0x6},              // tie 4 (0x6) / 6 (0x7) -> 0x6
      {next_down(5.0f), 0x6},
      {next_up(5.0f), 0x7},
      {6.0f, 0x7},
      {next_up(6.0f), 0x7},
      {7.0f, 0x7},              // halfway to the 8 E2M1 does not have: saturates
      {1e30f, 0x7},
      {kInf, 0x7},
      {-kInf, 0xF},
      {-5.0f, 0xE},
      {-next_up(5.0f), 0xF},
      {0.0f, 0x0},
      {-0.0f, 0x8},
      {from_bits(1), 0x0},
      {-0.25f, 0x8},            // rounds to zero, keeps the sign
  };
  for (const auto& c : cases) {
    INFO(describe(c.x));
    CHECK(f32_to_e2m1(c.x) == c.code);
  }
  // No NaN in E2M1: documented as +6 (0x7) whatever the NaN's sign.
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u})
    CHECK(f32_to_e2m1(from_bits(nan)) == 0x7);
}

TEST_CASE("f16 overflow to inf, NaN and underflow") {
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(65519.99f) == 0x7BFF);  // 65519.9921875, the float just below 65520
  CHECK(f32_to_f16(next_down(65520.0f)) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);   // max + half ulp (16): IEEE rounds to inf
  CHECK(f32_to_f16(-65520.0f) == 0xFC00);
  CHECK(f32_to_f16(65536.0f) == 0x7C00);
  CHECK(f32_to_f16(FLT_MAX) == 0x7C00);
  CHECK(f32_to_f16(kInf) == 0x7C00);
  CHECK(f32_to_f16(-kInf) == 0xFC00);
  CHECK(f32_to_f16(65488.0f) == 0x7BFE);   // tie 65472 (0x7BFE) / 65504 (0x7BFF) -> even
  // NaN stays NaN with its sign (canonical quiet payload).
  CHECK(f32_to_f16(from_bits(0x7FC00000u)) == 0x7E00);
  CHECK(f32_to_f16(from_bits(0xFFC00000u)) == 0xFE00);
  CHECK(f32_to_f16(from_bits(0x7F800001u)) == 0x7E00);  // signalling, tiny payload
  CHECK(f32_to_f16(from_bits(0xFF800001u)) == 0xFE00);
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(from_bits(1)) == 0x0000);
  CHECK(f32_to_f16(from_bits(0x80000001u)) == 0x8000);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // half the smallest subnormal 2^-24
  CHECK(f32_to_f16(next_up(std::ldexp(1.0f, -25))) == 0x0001);
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(f32_to_f16(std::ldexp(1023.5f, -24)) == 0x0400);  // tie 0x03FF / 0x0400 -> even
  CHECK(f16_to_f32(0x7C00) == kInf);
  CHECK(f16_to_f32(0xFC00) == -kInf);
  CHECK(std::isnan(f16_to_f32(0x7C01)));
  CHECK(std::signbit(f16_to_f32(0xFE00)));
}

TEST_CASE("bf16 rounding, overflow and NaN") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(from_bits(0x3F808000u)) == 0x3F80);  // 1 + 2^-8: tie -> even 0x3F80
  CHECK(f32_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
  CHECK(f32_to_bf16(from_bits(0x3F818000u)) == 0x3F82);  // tie 0x3F81 / 0x3F82 -> 0x3F82
  CHECK(f32_to_bf16(from_bits(0x3F817FFFu)) == 0x3F81);
  CHECK(f32_to_bf16(from_bits(0x7F7F7FFFu)) == 0x7F7F);  // just under max + half ulp
  CHECK(f32_to_bf16(from_bits(0x7F7F8000u)) == 0x7F80);  // max + half ulp -> inf
  CHECK(f32_to_bf16(FLT_MAX) == 0x7F80);
  CHECK(f32_to_bf16(-FLT_MAX) == 0xFF80);
  CHECK(f32_to_bf16(kInf) == 0x7F80);
  CHECK(f32_to_bf16(-kInf) == 0xFF80);
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  CHECK(f32_to_bf16(from_bits(1)) == 0x0000);
  CHECK(f32_to_bf16(from_bits(0x00008000u)) == 0x0000);  // tie 0 / 2^-133 -> 0
  CHECK(f32_to_bf16(from_bits(0x00008001u)) == 0x0001);
  CHECK(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);
  CHECK(f32_to_bf16(from_bits(0x807F8000u)) == 0x8080);  // largest subnormal rounds up to -2^-126
  // NaN: stays NaN, keeps its sign, is quiet, even when the payload is below bit 16.
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FA00000u, 0xFFFFFFFFu}) {
    const std::uint16_t b = f32_to_bf16(from_bits(nan));
    INFO(hex(nan), " -> ", hex(b));
    CHECK((b & 0x7F80u) == 0x7F80u);
    CHECK((b & 0x007Fu) != 0);
    CHECK((b & 0x0040u) != 0);
    CHECK((b >> 15) == (nan >> 31));
    CHECK(std::isnan(bf16_to_f32(b)));
  }
  CHECK(bits_of(round_to_bf16(from_bits(0x3F818000u))) == 0x3F820000u);
}

// ------------------------------------------------------------------ 6. e8m0, exp2i, rounding

TEST_CASE("exp2i is 2^k for every k in [-149, 127]") {
  for (int k = -149; k <= 127; ++k) {
    INFO("k = ", k);
    CHECK(bits_of(exp2i(k)) == bits_of(std::ldexp(1.0f, k)));
  }
}

TEST_CASE("e8m0_to_f32 for all 256 codes") {
  CHECK(bits_of(e8m0_to_f32(0x00)) == 0x00400000u);  // 2^-127, an FP32 subnormal
  CHECK(static_cast<double>(e8m0_to_f32(0x00)) == std::ldexp(1.0, -127));
  for (int e = 1; e <= 254; ++e) {
    INFO("e = ", e);
    CHECK(static_cast<double>(e8m0_to_f32(static_cast<std::uint8_t>(e))) == std::ldexp(1.0, e - 127));
  }
  CHECK(e8m0_to_f32(127) == 1.0f);
  CHECK(e8m0_to_f32(254) == std::ldexp(1.0f, 127));
  CHECK(std::isnan(e8m0_to_f32(0xFF)));
}

// Smallest e with 2^(e-127) >= v, clamped to [0, 254]; from frexp, not from bits.
std::uint8_t oracle_e8m0_round_up(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0x00;
  int k;
  const double f = std::frexp(static_cast<double>(std::fabs(v)), &k);  // |v| = f * 2^k, f in [0.5, 1)
  const int e = (f == 0.5 ? k - 1 : k) + 127;
  return static_cast<std::uint8_t>(std::clamp(e, 0, 254));
}

TEST_CASE("e8m0_from_f32_round_up: powers of two, values above them, specials") {
  for (int k = -126; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    INFO("k = ", k);
    CHECK(e8m0_from_f32_round_up(p) == k + 127);  // exact powers map to their exponent
    const int up = std::min(k + 128, 254);         // anything above rounds up (saturating)
    CHECK(e8m0_from_f32_round_up(next_up(p)) == up);
    CHECK(e8m0_from_f32_round_up(1.5f * p) == (k == 127 ? 254 : up));
    if (k > -126) CHECK(e8m0_from_f32_round_up(next_down(p)) == k + 127);
  }
  CHECK(e8m0_from_f32_round_up(from_bits(0x00400000u)) == 0x00);  // 2^-127 is code 0 itself
  CHECK(e8m0_from_f32_round_up(from_bits(0x00400001u)) == 0x01);
  CHECK(e8m0_from_f32_round_up(from_bits(0x007FFFFFu)) == 0x01);
  CHECK(e8m0_from_f32_round_up(from_bits(1)) == 0x00);
  CHECK(e8m0_from_f32_round_up(from_bits(0x00800000u)) == 0x01);  // 2^-126
  CHECK(e8m0_from_f32_round_up(from_bits(0x00800001u)) == 0x02);
  CHECK(e8m0_from_f32_round_up(0.0f) == 0x00);
  CHECK(e8m0_from_f32_round_up(-0.0f) == 0x00);
  CHECK(e8m0_from_f32_round_up(FLT_MAX) == 0xFE);
  CHECK(e8m0_from_f32_round_up(kInf) == 0xFE);
  CHECK(e8m0_from_f32_round_up(1.0f) == 127);
  CHECK(e8m0_from_f32_round_up(3.0f) == 129);   // 3 -> 4 = 2^2
  CHECK(e8m0_from_f32_round_up(0.75f) == 127);  // 0.75 -> 1
  for (std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu})
    CHECK(e8m0_from_f32_round_up(from_bits(nan)) == 0xFF);
}

TEST_CASE("e8m0_from_f32_round_up: every FP32 subnormal and a wide sample match the oracle") {
  Mismatches bad;
  // FP32 subnormals: mantissa <= 0x400000 -> 0x00, above -> 0x01.
  for (std::uint32_t m = 0; m <= 0x7FFFFFu; ++m) {
    const std::uint8_t got = e8m0_from_f32_round_up(from_bits(m));
    const std::uint8_t want = m <= 0x400000u ? 0x00 : 0x01;
    if (got != want || got != oracle_e8m0_round_up(from_bits(m)))
      bad.add("subnormal " + hex(m) + " -> " + hex(got));
  }
  std::mt19937 rng(77);
  for (int i = 0; i < 2'000'000; ++i) {
    const float v = from_bits(rng() & 0x7FFFFFFFu);  // non-negative, any exponent, NaN/inf too
    const std::uint8_t got = e8m0_from_f32_round_up(v), want = oracle_e8m0_round_up(v);
    if (got != want) bad.add(describe(v) + " -> " + hex(got) + ", oracle " + hex(want));
  }
  INFO(bad.first);
  CHECK(bad.count == 0);
}

TEST_CASE("e8m0_encode_factor is the exact reciprocal of the decoded scale") {
  for (int e = 0; e <= 253; ++e) {
    const auto c = static_cast<std::uint8_t>(e);
    INFO("e = ", e);
    CHECK(static_cast<double>(e8m0_encode_factor(c)) == std::ldexp(1.0, 127 - e));
    CHECK(e8m0_encode_factor(c) * e8m0_to_f32(c) == 1.0f);
  }
  CHECK(bits_of(e8m0_encode_factor(254)) == 0x00400000u);  // 2^-127, subnormal
  CHECK(e8m0_encode_factor(254) * e8m0_to_f32(254) == 1.0f);
  CHECK(std::isnan(e8m0_encode_factor(255)));
}

TEST_CASE("round_half_even") {
  struct Case { float v, want; };
  const Case cases[] = {
      {0.0f, 0.0f},  {0.5f, 0.0f},  {1.5f, 2.0f},  {2.5f, 2.0f},  {3.5f, 4.0f},
      {6.5f, 6.0f},  {7.5f, 8.0f},  {0.49999997f, 0.0f},       {2.5000002f, 3.0f},
      {1.0f, 1.0f},  {from_bits(1), 0.0f},                        // 2^-149
      {4194304.5f, 4194304.0f},     // 2^22 + 0.5: tie, 2^22 is even
      {4194305.5f, 4194306.0f},
      {8388607.5f, 8388608.0f},     // 2^23 - 0.5: tie between 8388607 and 8388608 (even)
      {8388607.0f, 8388607.0f},
  };
  for (const auto& c : cases) {
    INFO(describe(c.v));
    CHECK(bits_of(round_half_even(c.v)) == bits_of(c.want));
  }
}

// ------------------------------------------------------------------ 7. scaling.hpp

using qrecipe::delayed_scaling_update;
using qrecipe::scale_from_amax;

TEST_CASE("scale_from_amax") {
  CHECK(scale_from_amax(2.0f, 448.0f, false, 0.0f) == 224.0f);     // 448 / 2
  CHECK(scale_from_amax(448.0f, 448.0f, false, 0.0f) == 1.0f);
  CHECK(scale_from_amax(3.0f, 448.0f, false, 0.0f) == 448.0f / 3.0f);
  CHECK(bits_of(scale_from_amax(3.0f, 448.0f, false, 0.0f)) == 0x43155555u);  // 149.333328
  CHECK(scale_from_amax(3.0f, 448.0f, true, 0.0f) == 128.0f);      // 149.33 -> 2^7
  CHECK(scale_from_amax(1000.0f, 448.0f, true, 0.0f) == 0.25f);    // 0.448 -> 2^-2
  CHECK(scale_from_amax(3.0f, 57344.0f, false, 0.0f) == static_cast<float>(57344.0 / 3.0));
  // zero, inf and NaN amax -> 1
  CHECK(scale_from_amax(0.0f, 448.0f, false, 0.0f) == 1.0f);
  CHECK(scale_from_amax(-0.0f, 448.0f, false, 0.0f) == 1.0f);
  CHECK(scale_from_amax(kInf, 448.0f, false, 0.0f) == 1.0f);
  CHECK(scale_from_amax(kInf, 448.0f, true, 0.0f) == 1.0f);
  CHECK(scale_from_amax(kQNaN, 448.0f, false, 0.0f) == 1.0f);
  CHECK(scale_from_amax(kQNaN, 448.0f, false, 1e-4f) == 1.0f);
  // eps: an amax below eps is raised to eps; zero too.
  const float at_eps = static_cast<float>(448.0 / static_cast<double>(1e-4f));  // correctly rounded
  CHECK(scale_from_amax(1e-10f, 448.0f, false, 1e-4f) == at_eps);
  CHECK(scale_from_amax(0.0f, 448.0f, false, 1e-4f) == at_eps);
  CHECK(scale_from_amax(2.0f, 448.0f, false, 1e-4f) == 224.0f);  // above eps: untouched
  CHECK(scale_from_amax(1e-10f, 448.0f, true, 1e-4f) == 4194304.0f);  // 4.48e6 -> 2^22
  // fmax / amax overflows -> value_for_inf (FLT_MAX by default), then pow2 truncation.
  const float tiny = from_bits(1);  // 2^-149: 448 / 2^-149 = 448 * 2^149 > FLT_MAX
  CHECK(scale_from_amax(tiny, 448.0f, false, 0.0f) == FLT_MAX);
  CHECK(bits_of(scale_from_amax(tiny, 448.0f, true, 0.0f)) == 0x7F000000u);  // FLT_MAX -> 2^127
  CHECK(scale_from_amax(tiny, 448.0f, false, 0.0f, 65504.0f) == 65504.0f);
  CHECK(scale_from_amax(tiny, 448.0f, true, 0.0f, 65504.0f) == 32768.0f);    // 2^15
  const float bf16_max = bf16_to_f32(0x7F7F);
  CHECK(scale_from_amax(tiny, 448.0f, false, 0.0f, bf16_max) == bf16_max);
  // A large but finite quotient is not replaced: 448 / 2^-119 = 1.75 * 2^127 (finite).
  CHECK(scale_from_amax(std::ldexp(1.0f, -119), 448.0f, false, 0.0f) == std::ldexp(448.0f, 119));
  CHECK(scale_from_amax(std::ldexp(1.0f, -120), 448.0f, false, 0.0f) == FLT_MAX);  // 1.75 * 2^128
}

struct DelayedState {
  std::vector<float> history;
  float scale = 1.0f, scale_inv = 1.0f;
  void update(float reduced_amax, bool most_recent, int margin, float fmax) {
    delayed_scaling_update(history.data(), static_cast<int>(history.size()), &scale, &scale_inv,
                           reduced_amax, most_recent, margin, fmax);
  }
};

void check_history(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("history[", i, "]");
    CHECK(bits_of(got[i]) == bits_of(want[i]));
  }
}

TEST_CASE("delayed_scaling_update: a sequence of steps with algo max") {
  DelayedState s{{5.0f, 1.0f, 3.0f, 2.0f}};
  // Step 1: nothing reduced -> last = history[0] = 5; amax = max(1, 3, 2, 5) = 5.
  // Roll: [0, old2, old3, last] = [0, 3, 2, 5]; scale = 448 / 5 = 89.6.
  s.update(0.0f, false, 0, 448.0f);
  check_history(s.history, {0.0f, 3.0f, 2.0f, 5.0f});
  CHECK(s.scale == 448.0f / 5.0f);
  CHECK(s.scale_inv == 1.0f / (448.0f / 5.0f));
  // Step 2: reduced 7 -> amax = max(3, 2, 5, 7) = 7; scale 64.
  s.update(7.0f, false, 0, 448.0f);
  check_history(s.history, {0.0f, 2.0f, 5.0f, 7.0f});
  CHECK(s.scale == 64.0f);
  CHECK(s.scale_inv == 0.015625f);
  // Step 3: reduced 1 -> amax = max(2, 5, 7, 1) = 7 (old[1] = 2 counts, then drops out).
  s.update(1.0f, false, 0, 448.0f);
  check_history(s.history, {0.0f, 5.0f, 7.0f, 1.0f});
  CHECK(s.scale == 64.0f);
  // Step 4: reduced 0 and history[0] 0 -> last 0: nothing changes, scale_inv not rewritten.
  s.scale_inv = 123.0f;
  s.update(0.0f, false, 0, 448.0f);
  check_history(s.history, {0.0f, 5.0f, 7.0f, 1.0f});
  CHECK(s.scale == 64.0f);
  CHECK(s.scale_inv == 123.0f);
  // Step 5: a reduced amax overrides history[0]: last = 0.5, amax = max(5, 7, 1, 0.5) = 7.
  s.history[0] = 1000.0f;
  s.update(0.5f, false, 0, 448.0f);
  check_history(s.history, {0.0f, 7.0f, 1.0f, 0.5f});
  CHECK(s.scale == 64.0f);
  CHECK(s.scale_inv == 0.015625f);
}

TEST_CASE("delayed_scaling_update: most_recent, margin and length 1") {
  SUBCASE("most_recent uses only last") {
    DelayedState s{{0.5f, 100.0f, 100.0f, 100.0f}};
    s.update(2.0f, true, 0, 448.0f);  // last = 2 (reduced), amax = 2 -> scale 224
    check_history(s.history, {0.0f, 100.0f, 100.0f, 2.0f});
    CHECK(s.scale == 224.0f);
    CHECK(s.scale_inv == 1.0f / 224.0f);
  }
  SUBCASE("max over the same history") {
    DelayedState s{{0.5f, 100.0f, 100.0f, 100.0f}};
    s.update(2.0f, false, 0, 448.0f);  // amax = 100 -> 4.48
    CHECK(s.scale == 448.0f / 100.0f);
  }
  SUBCASE("margin scales fmax by 2^-margin") {
    DelayedState s{{7.0f, 0.0f}};
    s.update(0.0f, false, 2, 448.0f);  // (448 / 4) / 7 = 16
    CHECK(s.scale == 16.0f);
    CHECK(s.scale_inv == 0.0625f);
    check_history(s.history, {0.0f, 7.0f});
    DelayedState e5{{7.0f}};
    e5.update(0.0f, false, 3, 57344.0f);  // (57344 / 8) / 7 = 1024
    CHECK(e5.scale == 1024.0f);
  }
  SUBCASE("length 1: amax = last, the single row is cleared") {
    DelayedState s{{3.0f}};
    s.update(0.0f, false, 0, 448.0f);
    check_history(s.history, {0.0f});
    CHECK(s.scale == 448.0f / 3.0f);
    CHECK(s.scale_inv == 1.0f / (448.0f / 3.0f));
    s.update(0.0f, false, 0, 448.0f);  // row 0 is now 0: no-op
    CHECK(s.scale == 448.0f / 3.0f);
    s.update(8.0f, true, 0, 448.0f);
    CHECK(s.scale == 56.0f);
    check_history(s.history, {0.0f});
  }
}

TEST_CASE("delayed_scaling_update: inf amax keeps the scale, overflow becomes FLT_MAX") {
  SUBCASE("inf amax: history rolls, scale unchanged, scale_inv recomputed") {
    DelayedState s{{kInf, 1.0f}, 2.0f, 7.0f};
    s.update(0.0f, false, 0, 448.0f);
    check_history(s.history, {0.0f, kInf});
    CHECK(s.scale == 2.0f);
    CHECK(s.scale_inv == 0.5f);
    // The inf stays in history and keeps the max infinite on the next step too.
    s.update(4.0f, false, 0, 448.0f);
    check_history(s.history, {0.0f, 4.0f});
    CHECK(s.scale == 2.0f);
    // Once it has rolled out, the scale moves again: amax = max(4, 4) -> 112.
    s.update(4.0f, false, 0, 448.0f);
    CHECK(s.scale == 112.0f);
  }
  SUBCASE("inf reduced amax with most_recent") {
    DelayedState s{{0.0f, 1.0f}, 8.0f, 0.125f};
    s.update(kInf, true, 0, 448.0f);
    check_history(s.history, {0.0f, kInf});
    CHECK(s.scale == 8.0f);
    CHECK(s.scale_inv == 0.125f);
  }
  SUBCASE("fmax / amax overflows -> FLT_MAX") {
    DelayedState s{{from_bits(1)}};  // amax 2^-149 (1e-45): 448 * 2^149 overflows
    s.update(0.0f, false, 0, 448.0f);
    CHECK(s.scale == FLT_MAX);
    // 1 / FLT_MAX = 2^-128 / (1 - 2^-24) = 2^-128 (1 + 2^-24 + ...); the subnormal ulp there
    // is 2^-149, so it rounds to exactly 2^-128 (bits 0x00200000).
    CHECK(bits_of(s.scale_inv) == 0x00200000u);
  }
}

}  // namespace
