// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so the random word of an element is a pure function of
// (key, counter) and the CPU reference and the CUDA kernels draw identical words without
// sharing any generator state. Written from the published constants; checked against the
// Random123 known-answer vectors in test_nvfp4.cpp.
//
// nvfp4 stochastic rounding uses it as (docs/numerics.md, "nvfp4", stochastic rounding): one call
// gives the 4 words of 4 consecutive elements of a data row, so a kernel draws one call per 4
// elements (the previous definition drew a call per element and kept word 0 only):
//   key     = (seed low 32 bits, seed high 32 bits)
//   group   = data_row * ceil(data_cols / 4) + col / 4   (element col of data row data_row)
//   counter = (group low, group high, call offset low, call offset high)
//   word    = output word col % 4
#pragma once

#include <cstdint>

#include "qrecipe/conversions.hpp"  // QR_HD

namespace qrecipe::nvfp4 {

struct PhiloxWords {
  std::uint32_t w[4];
};

namespace philox_detail {
inline constexpr std::uint32_t kM0 = 0xD2511F53u;  // round multipliers
inline constexpr std::uint32_t kM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kW0 = 0x9E3779B9u;  // key schedule (Weyl) increments
inline constexpr std::uint32_t kW1 = 0xBB67AE85u;
inline constexpr int kRounds = 10;

// High and low halves of the 64-bit product a*b (exact integer arithmetic on host and device).
QR_HD void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace philox_detail

// The full 4-word output block of Philox4x32-10 for one counter and key.
QR_HD PhiloxWords philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  using namespace philox_detail;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {  // the key is bumped between rounds, not before the first
      k0 += kW0;
      k1 += kW1;
    }
    std::uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kM0, c0, hi0, lo0);
    mul_hi_lo(kM1, c2, hi1, lo1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0;
    const std::uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// Elements of one Philox call: 4 consecutive elements of a data row, starting at a multiple of 4.
inline constexpr int kSrWordsPerCall = 4;

// The Philox group of element `col` of data row `data_row` (rows of data_cols elements): groups
// never straddle two data rows, whatever data_cols is.
QR_HD std::uint64_t sr_group(std::uint64_t data_row, std::uint64_t data_cols, std::uint64_t col) {
  const std::uint64_t groups_per_row = (data_cols + kSrWordsPerCall - 1) / kSrWordsPerCall;
  return data_row * groups_per_row + col / kSrWordsPerCall;
}

// The 4 stochastic-rounding words of a group: word j belongs to element 4 * (group's first) + j.
QR_HD PhiloxWords sr_group_words(std::uint64_t seed, std::uint64_t group,
                                 std::uint64_t call_offset) {
  return philox4x32_10(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                       static_cast<std::uint32_t>(call_offset),
                       static_cast<std::uint32_t>(call_offset >> 32),
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// The stochastic-rounding word of one element (a whole Philox call: kernels call
// sr_group_words once per 4 elements instead).
QR_HD std::uint32_t sr_random_word(std::uint64_t seed, std::uint64_t call_offset,
                                   std::uint64_t data_row, std::uint64_t data_cols,
                                   std::uint64_t col) {
  const PhiloxWords g = sr_group_words(seed, sr_group(data_row, data_cols, col), call_offset);
  const std::uint64_t j = col % kSrWordsPerCall;  // constant indices keep g in registers
  return j == 0 ? g.w[0] : (j == 1 ? g.w[1] : (j == 2 ? g.w[2] : g.w[3]));
}

}  // namespace qrecipe::nvfp4
