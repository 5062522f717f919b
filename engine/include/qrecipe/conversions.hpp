// Exact scalar conversions between FP32 and the narrow formats, written once for the host
// (every CPU reference) and the device (every kernel), so both produce the same bytes.
//
// Rules (docs/numerics.md, "General rules"):
//   - round to nearest even; the sign of zero is kept
//   - FP8 (E4M3, E5M2) and FP4 (E2M1) saturate: |x| beyond the largest finite value, and
//     +-inf, become +-max (E4M3 448, E5M2 57344, E2M1 6), like PTX `cvt.rn.satfinite`
//   - NaN becomes the canonical NaN 0x7F for E4M3 and E5M2 (what `cvt.rn.satfinite` gives,
//     sign dropped); E2M1 has no NaN: NaN encodes as +6 (0x7) and formats that can meet one
//     carry it in their block scale instead (an E4M3 NaN block scale)
//   - BF16 and F16 follow IEEE: overflow rounds to inf, NaN stays a quiet NaN with its sign
//   - E8M0 is a biased power of two 2^(e-127), 0xFF = NaN; `e8m0_from_f32_round_up` is the
//     MX "round the scale up to a power of two" rule
//
// Compile without contraction (-ffp-contract=off, nvcc -fmad=false) and never with fast math:
// the reference and the kernels must perform the same IEEE operations.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QR_HD __host__ __device__ __forceinline__
#else
#define QR_HD inline
#endif

namespace qrecipe::num {

QR_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

QR_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

QR_HD bool is_nan(float f) { return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
QR_HD bool is_inf(float f) { return (float_bits(f) & 0x7FFFFFFFu) == 0x7F800000u; }
QR_HD bool is_finite(float f) { return (float_bits(f) & 0x7F800000u) != 0x7F800000u; }
QR_HD float abs_f(float f) { return bits_float(float_bits(f) & 0x7FFFFFFFu); }

// 2^k as a float, for k in [-149, 127], built from bits (exact, no libm).
QR_HD float exp2i(int k) {
  if (k >= -126) return bits_float(static_cast<std::uint32_t>(k + 127) << 23);
  return bits_float(1u << (k + 149));  // subnormal
}

// Round a non-negative float holding a value < 2^23 to the nearest integer, ties to even,
// independent of the floating-point environment.
QR_HD float round_half_even(float v) {
  constexpr float kMagic = 8388608.0f;  // 2^23: adding it leaves no fraction bits
  // volatile-free: the add/subtract pair is exact except for the rounding we want (RNE is the
  // IEEE default and kernels are compiled without fast math).
  float r = (v + kMagic) - kMagic;
  return r;
}

// Narrow IEEE-like formats: sign bit on top of kExpBits exponent bits and kManBits mantissa.
struct E4M3Traits {
  static constexpr int kExpBits = 4, kManBits = 3, kBias = 7;
  static constexpr std::uint32_t kMaxCode = 0x7E;  // 448
  static constexpr float kMax = 448.0f;
  static constexpr bool kSaturate = true;
  static constexpr std::uint32_t kNanCode = 0x7F;
};
struct E5M2Traits {
  static constexpr int kExpBits = 5, kManBits = 2, kBias = 15;
  static constexpr std::uint32_t kMaxCode = 0x7B;  // 57344
  static constexpr float kMax = 57344.0f;
  static constexpr bool kSaturate = true;
  static constexpr std::uint32_t kNanCode = 0x7F;
};
struct E2M1Traits {
  static constexpr int kExpBits = 2, kManBits = 1, kBias = 1;
  static constexpr std::uint32_t kMaxCode = 0x7;  // 6
  static constexpr float kMax = 6.0f;
  static constexpr bool kSaturate = true;
  static constexpr std::uint32_t kNanCode = 0x7;  // no NaN: +6 (documented above)
};
struct F16Traits {
  static constexpr int kExpBits = 5, kManBits = 10, kBias = 15;
  static constexpr std::uint32_t kMaxCode = 0x7BFF;  // 65504
  static constexpr float kMax = 65504.0f;
  static constexpr bool kSaturate = false;
  static constexpr std::uint32_t kNanCode = 0x7E00;
};

template <class T>
QR_HD std::uint32_t encode_minifloat(float x) {
  constexpr int kSignShift = T::kExpBits + T::kManBits;
  constexpr int kEmin = 1 - T::kBias;  // exponent of the smallest normal
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t sign = (bits >> 31) << kSignShift;
  const float a = abs_f(x);
  if (is_nan(x)) return T::kSaturate ? T::kNanCode : (sign | T::kNanCode);
  if (T::kSaturate) {
    if (a >= T::kMax) return sign | T::kMaxCode;  // includes inf
  } else {
    // IEEE: values at or above max + half an ulp round to inf.
    constexpr std::uint32_t kInfCode = ((1u << T::kExpBits) - 1) << T::kManBits;
    const float half_ulp_above = T::kMax + exp2i(static_cast<int>(
        (T::kMaxCode >> T::kManBits) - T::kBias - T::kManBits - 1));
    if (a >= half_ulp_above) return sign | kInfCode;
  }
  const int e = static_cast<int>((float_bits(a) >> 23) & 0xFF) - 127;
  if (e < kEmin) {
    // Subnormal in the target (or zero): integer multiples of 2^(kEmin - kManBits). A carry
    // to 2^kManBits lands exactly on the smallest normal's code.
    const float q = round_half_even(a * exp2i(T::kManBits - kEmin));
    return sign | static_cast<std::uint32_t>(q);
  }
  // Normal: q in [2^M, 2^(M+1)] carries the implicit bit; a carry bumps the exponent.
  const float q = round_half_even(a * exp2i(T::kManBits - e));
  const std::uint32_t code =
      (static_cast<std::uint32_t>(e + T::kBias - 1) << T::kManBits) + static_cast<std::uint32_t>(q);
  return sign | code;
}

template <class T>
QR_HD float decode_minifloat(std::uint32_t code) {
  constexpr int kSignShift = T::kExpBits + T::kManBits;
  constexpr std::uint32_t kManMask = (1u << T::kManBits) - 1;
  constexpr std::uint32_t kExpMask = (1u << T::kExpBits) - 1;
  const bool neg = (code >> kSignShift) & 1u;
  const std::uint32_t exp = (code >> T::kManBits) & kExpMask;
  const std::uint32_t man = code & kManMask;
  // Formats whose largest finite value sits below the all-ones exponent (E5M2, F16) keep IEEE
  // specials there: mantissa 0 is inf, anything else NaN. E4M3 uses that exponent for
  // numbers and only S.1111.111 is NaN; E2M1 has no specials.
  constexpr bool kIeeeSpecials = (T::kMaxCode >> T::kManBits) < kExpMask;
  float v;
  if (kIeeeSpecials && exp == kExpMask) {
    v = man ? bits_float(0x7FC00000u) : bits_float(0x7F800000u);
  } else if (!kIeeeSpecials && T::kNanCode != T::kMaxCode &&
             (code & ~(1u << kSignShift)) == T::kNanCode) {
    v = bits_float(0x7FC00000u);  // E4M3 0x7F / 0xFF
  } else if (exp == 0) {
    v = static_cast<float>(man) * exp2i(1 - T::kBias - T::kManBits);
  } else {
    v = static_cast<float>(man + (1u << T::kManBits)) *
        exp2i(static_cast<int>(exp) - T::kBias - T::kManBits);
  }
  return neg ? -v : v;
}

QR_HD std::uint8_t f32_to_e4m3(float x) { return static_cast<std::uint8_t>(encode_minifloat<E4M3Traits>(x)); }
QR_HD std::uint8_t f32_to_e5m2(float x) { return static_cast<std::uint8_t>(encode_minifloat<E5M2Traits>(x)); }
// Returns the 4-bit code in the low nibble.
QR_HD std::uint8_t f32_to_e2m1(float x) { return static_cast<std::uint8_t>(encode_minifloat<E2M1Traits>(x)); }
QR_HD std::uint16_t f32_to_f16(float x) { return static_cast<std::uint16_t>(encode_minifloat<F16Traits>(x)); }

QR_HD float e4m3_to_f32(std::uint8_t c) { return decode_minifloat<E4M3Traits>(c); }
QR_HD float e5m2_to_f32(std::uint8_t c) { return decode_minifloat<E5M2Traits>(c); }
QR_HD float e2m1_to_f32(std::uint8_t c) { return decode_minifloat<E2M1Traits>(c & 0xFu); }
QR_HD float f16_to_f32(std::uint16_t c) { return decode_minifloat<F16Traits>(c); }

// BF16: the top half of an FP32, rounded to nearest even.
QR_HD std::uint16_t f32_to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if (is_nan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // keep sign, quiet
  const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}
QR_HD float bf16_to_f32(std::uint16_t c) { return bits_float(static_cast<std::uint32_t>(c) << 16); }
QR_HD float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// E8M0: 2^(e-127); 0xFF is NaN. 0x00 is 2^-127 (a subnormal FP32).
QR_HD float e8m0_to_f32(std::uint8_t e) {
  if (e == 0xFF) return bits_float(0x7FC00000u);
  if (e == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<std::uint32_t>(e) << 23);
}

// MX scale exponent: round a non-negative FP32 up to a power of two, saturating.
// NaN -> 0xFF, inf -> 0xFE, 0 -> 0x00; an FP32 subnormal rounds up only when its mantissa
// exceeds 0x400000 (2^-127 is itself code 0x00).
QR_HD std::uint8_t e8m0_from_f32_round_up(float v) {
  if (is_nan(v)) return 0xFF;
  if (is_inf(v)) return 0xFE;
  const std::uint32_t u = float_bits(v) & 0x7FFFFFFFu;
  std::uint32_t exp = u >> 23;
  const std::uint32_t man = u & 0x7FFFFFu;
  const bool round_up = man != 0 && exp != 0xFE && !(exp == 0 && man <= 0x400000u);
  if (round_up) ++exp;
  return static_cast<std::uint8_t>(exp);
}

// 2^(127-e): the factor that maps a block onto the element grid (e = 254 gives 2^-127,
// e = 255 gives NaN), built from bits like the kernels do.
QR_HD float e8m0_encode_factor(std::uint8_t e) {
  if (e == 0xFF) return bits_float(0x7FC00000u);
  if (e == 0xFE) return bits_float(0x00400000u);
  return bits_float(static_cast<std::uint32_t>(254 - e) << 23);
}

}  // namespace qrecipe::num
