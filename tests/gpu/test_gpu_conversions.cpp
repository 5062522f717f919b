// The device fast conversions (qrecipe/fast_conversions.cuh: hardware FP8 encode with the
// reference's NaN rule, the arithmetic E2M1 encode, packed BF16 / F16 decodes) equal the specification
// (qrecipe/conversions.hpp) on the GPU, over ALL 2^32 inputs each: every kernel that uses them
// is then bit-exact by construction wherever it used to call the reference.
//
// Without a usable CUDA device every case prints "not supported: ..." and passes.
#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "conversion_sweeps.hpp"

namespace sw = qrecipe::sweeps;

namespace {

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// One line per recorded mismatch: input bits, reference, fast path.
std::string first_mismatches(const sw::SweepResult& r) {
  std::ostringstream os;
  for (int i = 0; i < r.recorded; ++i)
    os << "\n  input " << hex(r.input[i]) << ": reference " << hex(r.expected[i]) << ", fast "
       << hex(r.got[i]);
  return os.str();
}

// Runs a sweep (or reports that it cannot) and checks the counts every sweep must meet.
bool run(sw::Sweep s, sw::SweepResult& r) {
  std::string why;
  if (!sw::device_available(why)) {
    MESSAGE("not supported: " << why);
    return false;
  }
  r = sw::run_sweep(s);
  MESSAGE(sw::sweep_name(s) << ": " << r.checked << " inputs in " << r.seconds << " s, "
                            << r.mismatches << " mismatches");
  CHECK(r.checked >= (std::uint64_t{1} << 33));  // two or four lanes of all 2^32 words
  CHECK_MESSAGE(r.mismatches == 0, sw::sweep_name(s) << ": the fast path differs from "
                                   "conversions.hpp; first differences:" << first_mismatches(r));
  return true;
}

void check_encode(sw::Sweep s) {
  sw::SweepResult r;
  if (!run(s, r)) return;
  // The hardware conversion itself (before the NaN rule) must agree on every non-NaN input:
  // round to nearest even, saturation to +-max, signed zeros, FP8 subnormals.
  CHECK_MESSAGE(r.raw_other_mismatches == 0,
                sw::sweep_name(s) << ": the raw hardware conversion differs from the reference "
                                     "on " << r.raw_other_mismatches << " non-NaN inputs");
  MESSAGE(sw::sweep_name(s) << ": raw hardware vs reference on NaN inputs: "
                            << r.raw_nan_mismatches
                            << " differ (the fast path maps every NaN to 0x7F); hardware codes: "
                               "+NaN -> "
                            << hex(r.raw_nan_code_positive) << ", -NaN -> "
                            << hex(r.raw_nan_code_negative));
}

}  // namespace

TEST_CASE("hardware FP32 -> E4M3 (cvt.rn.satfinite.e4m3x2) == f32_to_e4m3, all 2^32 inputs") {
  check_encode(sw::Sweep::e4m3_encode);
}

TEST_CASE("hardware FP32 -> E5M2 (cvt.rn.satfinite.e5m2x2) == f32_to_e5m2, all 2^32 inputs") {
  check_encode(sw::Sweep::e5m2_encode);
}

TEST_CASE("arithmetic FP32 -> E2M1 (fast::f32_to_e2m1) == f32_to_e2m1, all 2^32 inputs") {
  // No hardware E2M1 conversion on sm_90: the branch-free encoder the nvfp4 kernels use must
  // equal the reference everywhere (ties to even at the 7 midpoints, saturation, -0, NaN -> 7).
  sw::SweepResult r;
  if (!run(sw::Sweep::e2m1_encode, r)) return;
  CHECK_MESSAGE(r.raw_other_mismatches == 0,
                "fast::f32_to_e2m1_non_nan differs from f32_to_e2m1 on "
                    << r.raw_other_mismatches << " non-NaN inputs");
  // Every FP32 pattern in [+0, 7) (1088421888 of them), once in each of the four lanes.
  MESSAGE("fast::e2m1_magnitude_byte_below7: " << r.below7_checked << " inputs in [+0, 7), "
                                                << r.below7_mismatches << " mismatches");
  CHECK(r.below7_checked == 4 * std::uint64_t{1088421888});
  CHECK_MESSAGE(r.below7_mismatches == 0,
                "fast::e2m1_magnitude_byte_below7 differs from f32_to_e2m1 on "
                    << r.below7_mismatches << " inputs in [+0, 7)");
}

TEST_CASE("packed BF16 decode == bf16_to_f32, all 2^32 packed pairs") {
  sw::SweepResult r;
  run(sw::Sweep::bf16_decode, r);
}

TEST_CASE("hardware F16 decode (cvt.f32.f16) == f16_to_f32, all 2^32 packed pairs") {
  sw::SweepResult r;
  if (!run(sw::Sweep::f16_decode, r)) return;
  // F16 has 2 * 1023 NaN codes; each appears 2^16 times in each half of the packed words.
  MESSAGE("F16 NaN inputs decoded to a NaN with other bits than the reference's: "
          << r.nan_payload_differences << " (allowed: NaN payloads cannot reach any output)");
}
