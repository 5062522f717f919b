// Kernels of the exhaustive conversion sweeps (see conversion_sweeps.hpp): every thread takes
// 32-bit words u in a grid-stride loop over all 2^32 of them and compares, per lane, the fast
// device conversion with the reference of conversions.hpp compiled for the device with the
// project's numerics flags (-fmad=false --ftz=false), exactly as the kernels use both.
//
// Encode sweeps feed four lanes per u: u, u ^ 0x80000000, ~u and u ^ 0x00400001. Each lane is
// a bijection of u, so every lane position of f32x4_to_*x4 (hence both positions of the pair
// conversion inside it) sees all 2^32 FP32 bit patterns: NaNs of both signs and every
// payload, infinities, zeros, FP32 subnormals, every rounding tie and the saturation edges.
#include "conversion_sweeps.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "qrecipe/conversions.hpp"
#include "qrecipe/fast_conversions.cuh"

namespace qrecipe::sweeps {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA call `") + call + "` failed: " +
                             cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}
#define SWEEP_CUDA(call) check((call), #call)

// Device-side counters (one instance in device memory per sweep).
struct Counters {
  unsigned long long mismatches;
  unsigned long long raw_nan_mismatches;
  unsigned long long raw_other_mismatches;
  unsigned long long nan_payload_differences;
  unsigned long long below7_mismatches;
  unsigned long long below7_checked;
  unsigned int recorded;
  unsigned int input[SweepResult::kRecorded];
  unsigned int expected[SweepResult::kRecorded];
  unsigned int got[SweepResult::kRecorded];
};

constexpr int kThreads = 256;
constexpr std::uint64_t kWords = std::uint64_t{1} << 32;

__device__ void record(Counters* c, std::uint32_t input, std::uint32_t expected,
                       std::uint32_t got) {
  const unsigned slot = atomicAdd(&c->recorded, 1u);
  if (slot < SweepResult::kRecorded) {
    c->input[slot] = input;
    c->expected[slot] = expected;
    c->got[slot] = got;
  }
}

// Thread-local counts, added to the device counters once per thread.
struct Local {
  unsigned long long mismatches = 0, raw_nan = 0, raw_other = 0, payload = 0;
  unsigned long long below7 = 0, below7_checked = 0;
  __device__ void flush(Counters* c) const {
    if (below7) atomicAdd(&c->below7_mismatches, below7);
    if (below7_checked) atomicAdd(&c->below7_checked, below7_checked);
    if (mismatches) atomicAdd(&c->mismatches, mismatches);
    if (raw_nan) atomicAdd(&c->raw_nan_mismatches, raw_nan);
    if (raw_other) atomicAdd(&c->raw_other_mismatches, raw_other);
    if (payload) atomicAdd(&c->nan_payload_differences, payload);
  }
};

__device__ __forceinline__ std::uint32_t lane_bits(std::uint32_t u, int lane) {
  switch (lane) {
    case 0: return u;
    case 1: return u ^ 0x80000000u;
    case 2: return ~u;
    default: return u ^ 0x00400001u;
  }
}

template <bool kE4M3>
__global__ void __launch_bounds__(kThreads) encode_sweep(Counters* counters) {
  Local local;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < kWords; w += stride) {
    const auto u = static_cast<std::uint32_t>(w);
    float x[4];
    std::uint32_t ref[4];
    for (int lane = 0; lane < 4; ++lane) {
      x[lane] = num::bits_float(lane_bits(u, lane));
      ref[lane] = kE4M3 ? num::f32_to_e4m3(x[lane]) : num::f32_to_e5m2(x[lane]);
    }
    const std::uint32_t fast = kE4M3 ? num::fast::f32x4_to_e4m3x4(x[0], x[1], x[2], x[3])
                                     : num::fast::f32x4_to_e5m2x4(x[0], x[1], x[2], x[3]);
    const std::uint32_t raw01 = kE4M3 ? num::fast::hardware_e4m3x2(x[0], x[1])
                                      : num::fast::hardware_e5m2x2(x[0], x[1]);
    for (int lane = 0; lane < 4; ++lane) {
      const std::uint32_t got = (fast >> (8 * lane)) & 0xFFu;
      if (got != ref[lane]) {
        ++local.mismatches;
        record(counters, lane_bits(u, lane), ref[lane], got);
      }
    }
    for (int lane = 0; lane < 2; ++lane) {
      const std::uint32_t raw = (raw01 >> (8 * lane)) & 0xFFu;
      if (raw != ref[lane]) {
        if (num::is_nan(x[lane])) ++local.raw_nan;
        else ++local.raw_other;
      }
    }
  }
  local.flush(counters);
}

template <bool kBF16>
__global__ void __launch_bounds__(kThreads) decode_sweep(Counters* counters) {
  Local local;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < kWords; w += stride) {
    const auto u = static_cast<std::uint32_t>(w);
    float got[2];
    if (kBF16) num::fast::bf16x2_to_f32x2(u, got[0], got[1]);
    else num::fast::f16x2_to_f32x2(u, got[0], got[1]);
    for (int half = 0; half < 2; ++half) {
      const auto code = static_cast<std::uint16_t>(half ? u >> 16 : u & 0xFFFFu);
      const float ref = kBF16 ? num::bf16_to_f32(code) : num::f16_to_f32(code);
      const std::uint32_t ref_bits = num::float_bits(ref), got_bits = num::float_bits(got[half]);
      if (ref_bits == got_bits) continue;
      // The contract of fast_conversions.cuh: a NaN for a NaN, bits otherwise.
      if (!kBF16 && num::is_nan(ref) && num::is_nan(got[half])) {
        ++local.payload;
        continue;
      }
      ++local.mismatches;
      record(counters, code, ref_bits, got_bits);
    }
  }
  local.flush(counters);
}

// The arithmetic E2M1 encoder (no hardware conversion before sm_100) against the reference,
// over the same four lanes per word as the FP8 encode sweeps.
__global__ void __launch_bounds__(kThreads) e2m1_encode_sweep(Counters* counters) {
  Local local;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < kWords; w += stride) {
    const auto u = static_cast<std::uint32_t>(w);
    for (int lane = 0; lane < 4; ++lane) {
      const float x = num::bits_float(lane_bits(u, lane));
      const std::uint32_t ref = num::f32_to_e2m1(x);
      const std::uint32_t got = num::fast::f32_to_e2m1(x);
      if (got != ref) {
        ++local.mismatches;
        record(counters, lane_bits(u, lane), ref, got);
      }
      // The NaN-free variant (kernels route NaN elsewhere): must agree on every non-NaN input.
      if (!num::is_nan(x) && num::fast::f32_to_e2m1_non_nan(x) != ref) ++local.raw_other;
      // The byte-packing variant (no saturation) on its domain 0 <= x < 7: the low byte (each
      // lane is a bijection of u, so every pattern of the domain is checked in every lane).
      if (!(num::float_bits(x) >> 31) && x < 7.0f) {
        ++local.below7_checked;
        if ((num::fast::e2m1_magnitude_byte_below7(x) & 0xFFu) != ref) ++local.below7;
      }
    }
  }
  local.flush(counters);
}

// What the hardware writes for +NaN and -NaN (documentation in the test output).
template <bool kE4M3>
__global__ void raw_nan_codes(std::uint32_t* out) {
  const float pos = num::bits_float(0x7FC00000u), neg = num::bits_float(0xFFC00000u);
  *out = kE4M3 ? num::fast::hardware_e4m3x2(pos, neg) : num::fast::hardware_e5m2x2(pos, neg);
}

}  // namespace

const char* sweep_name(Sweep s) {
  switch (s) {
    case Sweep::e4m3_encode: return "FP32 -> E4M3 encode";
    case Sweep::e5m2_encode: return "FP32 -> E5M2 encode";
    case Sweep::bf16_decode: return "BF16 -> FP32 decode";
    case Sweep::e2m1_encode: return "FP32 -> E2M1 encode (arithmetic)";
    default: return "F16 -> FP32 decode";
  }
}

bool device_available(std::string& why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    why = std::string("no CUDA device: ") + cudaGetErrorName(status) + " (" +
          cudaGetErrorString(status) + ")";
    (void)cudaGetLastError();  // reset the last-error state for whoever calls CUDA next
    return false;
  }
  if (count == 0) {
    why = "no CUDA device: 0 devices";
    return false;
  }
  return true;
}

SweepResult run_sweep(Sweep s) {
  SWEEP_CUDA(cudaSetDevice(0));
  Counters* counters = nullptr;
  SWEEP_CUDA(cudaMalloc(&counters, sizeof(Counters)));
  std::uint32_t* nan_codes = nullptr;
  SweepResult r;
  try {
    SWEEP_CUDA(cudaMalloc(&nan_codes, sizeof(std::uint32_t)));
    SWEEP_CUDA(cudaMemset(counters, 0, sizeof(Counters)));
    SWEEP_CUDA(cudaMemset(nan_codes, 0, sizeof(std::uint32_t)));
    int sms = 0;
    SWEEP_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const unsigned blocks = static_cast<unsigned>(sms * 16);  // grid-stride; many waves of work
    const auto t0 = std::chrono::steady_clock::now();
    switch (s) {
      case Sweep::e4m3_encode:
        encode_sweep<true><<<blocks, kThreads>>>(counters);
        raw_nan_codes<true><<<1, 1>>>(nan_codes);
        break;
      case Sweep::e5m2_encode:
        encode_sweep<false><<<blocks, kThreads>>>(counters);
        raw_nan_codes<false><<<1, 1>>>(nan_codes);
        break;
      case Sweep::bf16_decode: decode_sweep<true><<<blocks, kThreads>>>(counters); break;
      case Sweep::f16_decode: decode_sweep<false><<<blocks, kThreads>>>(counters); break;
      case Sweep::e2m1_encode: e2m1_encode_sweep<<<blocks, kThreads>>>(counters); break;
    }
    SWEEP_CUDA(cudaGetLastError());
    SWEEP_CUDA(cudaDeviceSynchronize());
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Counters host{};
    std::uint32_t codes = 0;
    SWEEP_CUDA(cudaMemcpy(&host, counters, sizeof host, cudaMemcpyDeviceToHost));
    SWEEP_CUDA(cudaMemcpy(&codes, nan_codes, sizeof codes, cudaMemcpyDeviceToHost));
    r.mismatches = host.mismatches;
    r.raw_nan_mismatches = host.raw_nan_mismatches;
    r.raw_other_mismatches = host.raw_other_mismatches;
    r.nan_payload_differences = host.nan_payload_differences;
    r.below7_mismatches = host.below7_mismatches;
    r.below7_checked = host.below7_checked;
    const bool encode =
        s == Sweep::e4m3_encode || s == Sweep::e5m2_encode || s == Sweep::e2m1_encode;
    r.checked = kWords * (encode ? 4 : 2);
    r.recorded = host.recorded < SweepResult::kRecorded ? static_cast<int>(host.recorded)
                                                        : SweepResult::kRecorded;
    for (int i = 0; i < r.recorded; ++i) {
      r.input[i] = host.input[i];
      r.expected[i] = host.expected[i];
      r.got[i] = host.got[i];
    }
    r.raw_nan_code_positive = codes & 0xFFu;
    r.raw_nan_code_negative = (codes >> 8) & 0xFFu;
  } catch (...) {
    cudaFree(counters);
    if (nan_codes) cudaFree(nan_codes);
    throw;
  }
  cudaFree(counters);
  cudaFree(nan_codes);
  return r;
}

}  // namespace qrecipe::sweeps
