// Exhaustive GPU sweeps of the device fast conversions (qrecipe/fast_conversions.cuh) against
// their references (qrecipe/conversions.hpp), run by test_gpu_conversions.cpp. The kernels
// live in conversion_sweeps.cu; this header needs no CUDA header.
#pragma once

#include <cstdint>
#include <string>

namespace qrecipe::sweeps {

enum class Sweep {
  e4m3_encode,  // f32x4_to_e4m3x4 == f32_to_e4m3 per lane, all 2^32 FP32 inputs in each lane
  e5m2_encode,  // f32x4_to_e5m2x4 == f32_to_e5m2 per lane, likewise
  bf16_decode,  // bf16x2_to_f32x2 == bf16_to_f32 per half, all 2^32 packed words
  f16_decode,   // f16x2_to_f32x2 == f16_to_f32 per half (NaN: any NaN), all 2^32 words
  e2m1_encode,  // fast::f32_to_e2m1 == f32_to_e2m1, all 2^32 FP32 inputs in each of 4 lanes
};

const char* sweep_name(Sweep s);

struct SweepResult {
  // Fast path vs reference, over every input of every lane: must be 0.
  std::uint64_t mismatches = 0;
  // Encode sweeps: the raw hardware conversion (no NaN rule) vs the reference, split by
  // whether the input is NaN. Informational for NaN (the NaN rule exists for them); must be
  // 0 otherwise. E2M1 sweep: raw_other_mismatches counts fast::f32_to_e2m1_non_nan against
  // the reference on non-NaN inputs (must be 0).
  std::uint64_t raw_nan_mismatches = 0;
  std::uint64_t raw_other_mismatches = 0;
  // E2M1 sweep: fast::e2m1_magnitude_byte_below7 against the reference on its domain (sign
  // bit clear, not NaN, below 7), every such input (must be 0).
  std::uint64_t below7_mismatches = 0;
  std::uint64_t below7_checked = 0;
  // F16 decode sweep: NaN inputs whose hardware NaN has other bits than the reference's NaN
  // (allowed by the contract of fast_conversions.cuh; reported).
  std::uint64_t nan_payload_differences = 0;
  // Inputs checked (lanes x words).
  std::uint64_t checked = 0;
  // The first few fast-path mismatches: input bits, reference result, fast result.
  static constexpr int kRecorded = 8;
  int recorded = 0;
  std::uint32_t input[kRecorded] = {}, expected[kRecorded] = {}, got[kRecorded] = {};
  // Raw hardware codes for a few NaN inputs, to document what the hardware does.
  std::uint32_t raw_nan_code_positive = 0, raw_nan_code_negative = 0;
  double seconds = 0;
};

// True when a CUDA device can run the sweeps; otherwise `why` says what is missing.
bool device_available(std::string& why);

// Runs one sweep on device 0. Throws std::runtime_error naming the CUDA call that failed.
SweepResult run_sweep(Sweep s);

}  // namespace qrecipe::sweeps
