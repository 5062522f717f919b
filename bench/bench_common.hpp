// Pieces every benchmark binary needs: CUDA error checks, events, the median, argument
// splitting, and the JSON output helpers of the bench/results schema. Header-only, included
// by one .cu file per benchmark.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace qrecipe::bench {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  std::ostringstream os;
  os << file << ":" << line << ": " << call << " failed: " << cudaGetErrorName(status) << ": "
     << cudaGetErrorString(status);
  throw std::runtime_error(os.str());
}

constexpr int kThreads = 256;  // threads per block of the benchmarks' own kernels

// Blocks for a grid-stride kernel of kThreads threads: enough to fill every SM.
inline int grid_for(const cudaDeviceProp& prop) {
  return prop.multiProcessorCount * std::max(1, prop.maxThreadsPerMultiProcessor / kThreads);
}

}  // namespace qrecipe::bench

#define BENCH_CUDA(call) ::qrecipe::bench::check_cuda((call), #call, __FILE__, __LINE__)

namespace qrecipe::bench {

// A CUDA event, destroyed with its owner.
class Event {
 public:
  Event() { BENCH_CUDA(cudaEventCreate(&e_)); }
  ~Event() { (void)cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "a,b,,c" -> {a, b, c}
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_number(double v, int digits = 6) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(digits);
  os << v;
  return os.str();
}

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace qrecipe::bench
