// bench_quantize: how close quantization runs to the GPU's copy speed.
//
//   bench_quantize [--out results.json] [--runs 20] [--warmup 5] [--copy-mib 1024]
//                  [--shapes 8192x8192,16384x8192] [--formats float8,hybrid]
//
// Map of this file
//   1. CUDA error checks, the two kernels (16-byte copy, BF16 input fill), event timing
//   2. the copy ceiling: SM copy kernel and cudaMemcpyAsync D2D on one large buffer; the
//      ceiling is the faster of the two
//   3. quantize: for every format with CUDA support, every option set below and every usage,
//      Quantizer::quantize_into through the engine (Engine + Recipe::uniform + Registry) into
//      pre-allocated outputs, so allocation is not timed
//   4. output: JSON (--out) and a markdown table on stdout
//
// Method: CUDA events around each call on one stream; the median of --runs calls after
// --warmup calls. Inputs (and outputs) rotate over enough buffers that together they exceed
// four times the L2 cache, so no call reads what the previous one left in L2.
// Device time (`ms`, what ratio uses): each timed call is enqueued behind a short spin kernel
// (kLeadMicroseconds), so the start event, the call's launches and the stop event reach an
// already busy GPU and the events measure the GPU's work alone, as a stream of calls runs in
// training (the host enqueues ahead). Without the lead, a call's host work and launch latency
// (about 10-15 us on an H100 machine, a fixed cost) sit between the events; that figure is kept
// as `isolated_ms` (field of the JSON) so the host cost of one call stays visible.
//
// Metrics of a quantize record:
//   min_bytes        = passes * input bytes + every output byte written once (data, scales,
//                      amax), where passes = 2 when a tensor amax must be known before the cast
//                      (current-scaling float8, nvfp4) and 1 otherwise
//   value (GB/s)     = min_bytes / median time
//   ratio            = value / copy ceiling = max(SM copy kernel, cudaMemcpyAsync D2D), both
//                      counting read + write bytes (both records are kept in the output)
//   read_once_ratio  = the same with passes = 1
//   same_size_copy_ratio = time of the faster of the SM copy kernel and cudaMemcpyAsync moving
//                      min_bytes (min_bytes / 2 read and min_bytes / 2 written), timed the
//                      same way, / the call's time: the
//                      ceiling's 1 GiB copy hides the fixed cost of a call (launch, first
//                      wave's latency, drain) that a copy of this size pays too; not used by ratio
//   isolated_ms      = median time of a call timed alone on an idle GPU (host work and launch
//                      latency between the events included); not used by ratio
//
// How to add a format: add its option sets to kBenchSets with the passes it needs. A format
// with CUDA support and no entry is measured with its default spec and passes = 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/tensor.hpp"
#include "bench_common.hpp"

namespace {

using namespace qrecipe::bench;

// ---------------------------------------------------------------- 1. CUDA helpers, kernels



// Grid-stride copy of n 16-byte vectors, kCopyUnroll per thread and iteration: all the loads
// are issued before the first store, so each thread keeps 64 bytes in flight (a good SM copy
// reaches ~3030 GB/s on an H100 this way; one vector per iteration stays near 2800).
constexpr int kCopyUnroll = 4;

__global__ void __launch_bounds__(kThreads)
    copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kCopyUnroll - 1) * stride < n; i += kCopyUnroll * stride) {
    int4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];  // the last partial round
}

// BF16 values uniform in [-4, 4) from a hash of the index (deterministic, no host copy).
__global__ void fill_bf16_kernel(std::uint16_t* dst, std::size_t n, std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    std::uint32_t h = static_cast<std::uint32_t>(i) ^ static_cast<std::uint32_t>(i >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    dst[i] = qrecipe::num::f32_to_bf16((u - 0.5f) * 8.0f);
  }
}


// Owning device buffer (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { BENCH_CUDA(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};



// Busy-waits one thread for `ns` nanoseconds of the GPU's global timer: the lead that keeps
// the GPU busy while the host enqueues the timed call behind it.
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// The lead: longer than the host needs to enqueue one quantize call (a few to 20 us).
constexpr unsigned long long kLeadMicroseconds = 200;

enum class Timing {
  device,    // behind a spin_kernel lead: the GPU's time for the call
  isolated,  // on an idle GPU: host work and launch latency included
};

// Median milliseconds of `runs` calls of fn(i) after `warmup` calls, each timed alone with
// events on `stream` (fn enqueues its work on that stream).
template <class Fn>
double time_ms(cudaStream_t stream, int warmup, int runs, Fn&& fn,
               Timing timing = Timing::device) {
  for (int i = 0; i < warmup; ++i) fn(i);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  Event start, stop;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    if (timing == Timing::device) {
      spin_kernel<<<1, 1, 0, stream>>>(kLeadMicroseconds * 1000ull);
      BENCH_CUDA(cudaGetLastError());
    }
    BENCH_CUDA(cudaEventRecord(start.get(), stream));
    fn(warmup + i);
    BENCH_CUDA(cudaEventRecord(stop.get(), stream));
    BENCH_CUDA(cudaEventSynchronize(stop.get()));
    float t = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&t, start.get(), stop.get()));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaGetLastError());
  return median(ms);
}

// ---------------------------------------------------------------- options and records

struct Options {
  std::string out;
  int runs = 20;
  int warmup = 5;
  std::size_t copy_mib = 1024;
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{8192, 8192}, {16384, 8192}};
  std::vector<std::string> formats;  // empty: every format with CUDA support
};

struct Record {
  std::string name, kind, format, option_set, usage;
  std::int64_t rows = 0, cols = 0;
  double ms = 0, value = 0, ratio = 0, read_once_ratio = 0;
  int passes = 0;
  double min_bytes = 0;
  double isolated_ms = 0;  // quantize: the call timed on an idle GPU (Timing::isolated)
  double same_size_copy_ratio = 0;  // quantize: a copy of min_bytes' time / ms
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "bench_quantize: " << msg
            << "\nusage: bench_quantize [--out FILE.json] [--runs N] [--warmup N] "
               "[--copy-mib MIB] [--shapes RxC,RxC] [--formats a,b]\n";
  std::exit(2);
}


Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--out") o.out = value();
      else if (a == "--runs") o.runs = std::stoi(value());
      else if (a == "--warmup") o.warmup = std::stoi(value());
      else if (a == "--copy-mib") o.copy_mib = static_cast<std::size_t>(std::stoull(value()));
      else if (a == "--formats") o.formats = split(value(), ',');
      else if (a == "--shapes") {
        o.shapes.clear();
        for (const auto& s : split(value(), ',')) {
          const auto x = s.find('x');
          if (x == std::string::npos) usage_error("shape '" + s + "' is not RxC");
          o.shapes.emplace_back(std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1)));
        }
      } else if (a == "--help" || a == "-h") usage_error("help");
      else usage_error("unknown argument '" + a + "'");
    } catch (const std::logic_error&) {  // stoi / stoll on a non-number
      usage_error("bad value for " + a);
    }
  }
  if (o.runs < 1 || o.warmup < 0 || o.copy_mib < 1) usage_error("runs >= 1, warmup >= 0, copy-mib >= 1");
  return o;
}

// ---------------------------------------------------------------- 2. copy ceiling

struct CopyCeiling {
  double kernel_gbps = 0, memcpy_gbps = 0;
  double gbps = 0;  // the ceiling: max(kernel, memcpy)
  Record kernel, memcpy;
};

// The copy kernel's grid: SM count x the blocks of it that fit on one SM (one full wave; the
// grid-stride loop covers the rest).
int copy_grid_for(const cudaDeviceProp& prop) {
  int copy_blocks_per_sm = 0;
  BENCH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&copy_blocks_per_sm, copy_kernel,
                                                           kThreads, 0));
  return prop.multiProcessorCount * std::max(1, copy_blocks_per_sm);
}

// Device time of the faster of the copy kernel and cudaMemcpyAsync moving `moved` bytes in all
// (half read, half written), timed like a quantize call (Timing::device): the same-size
// reference of same_size_copy_ratio.
double same_size_copy_ms(double moved, const Options& o, const cudaDeviceProp& prop,
                         cudaStream_t stream) {
  const std::size_t n_vec = std::max<std::size_t>(1, static_cast<std::size_t>(moved / 2) / sizeof(int4));
  DeviceBuffer src(n_vec * sizeof(int4)), dst(n_vec * sizeof(int4));
  BENCH_CUDA(cudaMemsetAsync(src.get(), 0, n_vec * sizeof(int4), stream));
  const int grid = copy_grid_for(prop);
  const double kernel_ms = time_ms(stream, o.warmup, o.runs, [&](int) {
    copy_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const int4*>(src.get()),
                                               static_cast<int4*>(dst.get()), n_vec);
    BENCH_CUDA(cudaGetLastError());
  });
  const double memcpy_ms = time_ms(stream, o.warmup, o.runs, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), n_vec * sizeof(int4),
                               cudaMemcpyDeviceToDevice, stream));
  });
  return std::min(kernel_ms, memcpy_ms);
}

CopyCeiling measure_copy(const Options& o, const cudaDeviceProp& prop, cudaStream_t stream) {
  const std::size_t bytes = o.copy_mib << 20;
  DeviceBuffer src(bytes), dst(bytes);
  const std::size_t n_vec = bytes / sizeof(int4);
  const int grid = grid_for(prop);
  const int copy_grid = copy_grid_for(prop);
  fill_bf16_kernel<<<grid, kThreads, 0, stream>>>(static_cast<std::uint16_t*>(src.get()),
                                                  bytes / 2, 1u);
  BENCH_CUDA(cudaGetLastError());
  const double kernel_ms = time_ms(stream, o.warmup, o.runs, [&](int) {
    copy_kernel<<<copy_grid, kThreads, 0, stream>>>(static_cast<const int4*>(src.get()),
                                               static_cast<int4*>(dst.get()), n_vec);
    BENCH_CUDA(cudaGetLastError());
  });
  const double memcpy_ms = time_ms(stream, o.warmup, o.runs, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  CopyCeiling c;
  const double moved = 2.0 * static_cast<double>(bytes);  // read + write
  c.kernel_gbps = moved / (kernel_ms * 1e-3) / 1e9;
  c.memcpy_gbps = moved / (memcpy_ms * 1e-3) / 1e9;
  c.gbps = std::max(c.kernel_gbps, c.memcpy_gbps);
  const std::string mib = std::to_string(o.copy_mib) + " MiB";
  c.kernel = {"copy kernel (16-byte vectors x" + std::to_string(kCopyUnroll) + ") " + mib,
              "copy", "", "", "", 0, 0, kernel_ms, c.kernel_gbps, c.kernel_gbps / c.gbps,
              c.kernel_gbps / c.gbps, 1, moved};
  c.memcpy = {"cudaMemcpyAsync D2D " + mib, "memcpy", "", "", "", 0, 0, memcpy_ms,
              c.memcpy_gbps, c.memcpy_gbps / c.gbps, c.memcpy_gbps / c.gbps, 1, moved};
  return c;
}

// ---------------------------------------------------------------- 3. quantize

struct BenchSet {
  const char* format;
  const char* label;
  const char* spec_yaml;
  int passes;  // input reads a minimal implementation needs (see the file header)
};

const BenchSet kBenchSets[] = {
    {"float8", "current", "{format: float8, scaling: current, dtype: e4m3}", 2},
    {"float8", "delayed", "{format: float8, scaling: delayed, dtype: e4m3}", 1},
    {"mxfp8", "default", "{format: mxfp8}", 1},
    {"nvfp4", "default", "{format: nvfp4}", 2},
    // NVFP4's variants, reported with their cost against the same two-pass floor.
    {"nvfp4", "2d", "{format: nvfp4, 2d: true}", 2},
    {"nvfp4", "hadamard", "{format: nvfp4, hadamard: true}", 2},
    {"nvfp4", "stochastic_rounding", "{format: nvfp4, stochastic_rounding: true}", 2},
    {"blockwise", "default", "{format: blockwise}", 1},
    {"blockwise", "128x128", "{format: blockwise, block: 128x128}", 1},
    {"hybrid", "float8_e4m3_e5m2",
     "{format: hybrid, rowwise: {format: float8, dtype: e4m3}, "
     "columnwise: {format: float8, dtype: e5m2}}",
     2},
    // The shipped pairs (recipes/hybrid_*.yaml, columnwise_source: input): both directions of
    // the first two run from one read after float8's amax pass (QRECIPE_HYBRID_FUSE=0 times
    // the two-call path); the third has no per-tensor side and runs two calls.
    {"hybrid", "float8_mxfp8",
     "{format: hybrid, rowwise: {format: float8, scaling: current}, columnwise: {format: mxfp8}}",
     2},
    {"hybrid", "float8_nvfp4",
     "{format: hybrid, rowwise: {format: float8, scaling: current}, columnwise: {format: nvfp4}}",
     2},
    {"hybrid", "mxfp8_e5m2_nvfp4",
     "{format: hybrid, rowwise: {format: mxfp8, dtype: e5m2}, columnwise: {format: nvfp4}}", 2},
};

qrecipe::QuantizerSpec spec_from_yaml(const std::string& yaml) {
  return qrecipe::Recipe::parse("version: 1\ndefaults: " + yaml + "\n", "bench").defaults();
}

// Every byte a quantized tensor holds: data, scales and amax of each direction.
double output_bytes(const qrecipe::QuantizedTensor& t) {
  double total = 0;
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!t.has(d)) continue;
    const qr_direction_data& dd = t.direction(d);
    total += static_cast<double>(qrecipe::TensorView(dd.data).nbytes());
    if (dd.scale_inv.data) total += static_cast<double>(qrecipe::TensorView(dd.scale_inv).nbytes());
    if (dd.amax.data) total += static_cast<double>(qrecipe::TensorView(dd.amax).nbytes());
  }
  return total;
}

std::vector<Record> measure_quantize(const Options& o, const cudaDeviceProp& prop,
                                     cudaStream_t stream, double copy_gbps) {
  using namespace qrecipe;
  std::vector<Record> records;
  auto registry = Registry::shared();
  for (const auto& f : registry->failures())
    std::cerr << "plugin load failure: " << f.path << ": " << f.cause << "\n";
  const QuantizerRole role{"linear", "input", "bench"};
  const Device device = Device::cuda(0);
  for (const auto& plugin : registry->plugins()) {
    if (!o.formats.empty() &&
        std::find(o.formats.begin(), o.formats.end(), plugin->name()) == o.formats.end())
      continue;
    if (!plugin->supports(device)) {
      std::cerr << "format '" << plugin->name() << "' supports " << plugin->devices_str()
                << " only: skipped\n";
      continue;
    }
    std::vector<BenchSet> sets;
    for (const auto& s : kBenchSets)
      if (plugin->name() == s.format) sets.push_back(s);
    std::string default_yaml;
    if (sets.empty()) {
      default_yaml = "{format: " + plugin->name() + "}";
      sets.push_back({plugin->name().c_str(), "default", default_yaml.c_str(), 1});
      std::cerr << "format '" << plugin->name() << "' has no entry in kBenchSets: default spec, "
                << "passes = 1\n";
    }
    for (const BenchSet& set : sets) {
      Engine engine(Recipe::uniform(spec_from_yaml(set.spec_yaml)), registry);
      const std::shared_ptr<Quantizer> q = engine.resolve(role);
      for (const auto& [rows, cols] : o.shapes) {
        const std::size_t in_bytes = static_cast<std::size_t>(rows * cols) * 2;  // bf16
        const std::size_t l2 = static_cast<std::size_t>(std::max(prop.l2CacheSize, 1));
        const std::size_t slots = std::max<std::size_t>(2, (4 * l2 + in_bytes - 1) / in_bytes);
        std::vector<Tensor> inputs;
        for (std::size_t s = 0; s < slots; ++s) {
          inputs.emplace_back(DType::bf16, std::vector<std::int64_t>{rows, cols}, device,
                              cuda_allocator());
          fill_bf16_kernel<<<grid_for(prop), kThreads, 0, stream>>>(
              inputs.back().data_as<std::uint16_t>(), in_bytes / 2,
              static_cast<std::uint32_t>(s + 7));
          BENCH_CUDA(cudaGetLastError());
        }
        BENCH_CUDA(cudaStreamSynchronize(stream));
        for (const std::uint32_t usage : {static_cast<std::uint32_t>(QR_USAGE_ROWWISE),
                                          static_cast<std::uint32_t>(QR_USAGE_COLUMNWISE),
                                          static_cast<std::uint32_t>(QR_USAGE_ROWWISE |
                                                                     QR_USAGE_COLUMNWISE)}) {
          QuantizeOptions qopt;
          qopt.stream = stream;
          // One pre-allocated output per input slot (allocated and filled here, not timed).
          std::vector<QuantizedTensor> outputs;
          for (std::size_t s = 0; s < slots; ++s)
            outputs.push_back(q->quantize(inputs[s].view(), usage, qopt, cuda_allocator()));
          auto call = [&](int i) {
            const std::size_t s = static_cast<std::size_t>(i) % slots;
            q->quantize_into(inputs[s].view(), outputs[s], qopt);
          };
          const double ms = time_ms(stream, o.warmup, o.runs, call, Timing::device);
          const double isolated_ms = time_ms(stream, 0, o.runs, call, Timing::isolated);
          Record r;
          r.kind = "quantize";
          r.format = plugin->name();
          r.option_set = set.label;
          r.usage = usage_str(usage);
          r.rows = rows;
          r.cols = cols;
          r.ms = ms;
          r.isolated_ms = isolated_ms;
          r.passes = set.passes;
          const double out_bytes = output_bytes(outputs[0]);
          r.min_bytes = set.passes * static_cast<double>(in_bytes) + out_bytes;
          r.value = r.min_bytes / (ms * 1e-3) / 1e9;
          r.ratio = r.value / copy_gbps;
          r.read_once_ratio =
              (static_cast<double>(in_bytes) + out_bytes) / (ms * 1e-3) / 1e9 / copy_gbps;
          r.same_size_copy_ratio = same_size_copy_ms(r.min_bytes, o, prop, stream) / ms;
          r.name = "quantize " + r.format + " " + r.option_set + " " + r.usage + " bf16 " +
                   std::to_string(rows) + "x" + std::to_string(cols);
          std::cerr << r.name << ": " << ms << " ms\n";
          records.push_back(r);
        }
      }
    }
  }
  return records;
}

// ---------------------------------------------------------------- 4. output




void write_json(const std::string& path, const cudaDeviceProp& prop, const Options& o,
                const std::vector<Record>& records) {
  const char* commit = std::getenv("QRECIPE_COMMIT");
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << "{\n  \"device\": " << json_string(prop.name) << ",\n  \"date\": " << json_string(utc_now())
    << ",\n  \"commit\": " << json_string(commit && *commit ? commit : "unknown")
    << ",\n  \"l2_bytes\": " << prop.l2CacheSize << ",\n  \"runs\": " << o.runs
    << ",\n  \"warmup\": " << o.warmup << ",\n  \"records\": [";
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << (i ? "," : "") << "\n    {\"name\": " << json_string(r.name)
      << ", \"kind\": " << json_string(r.kind);
    if (r.kind != "quantize")  // the ceiling's copies: no format, no tensor shape
      f << ", \"format\": \"\", \"shape\": []";
    if (r.kind == "quantize")
      f << ", \"format\": " << json_string(r.format) << ", \"option_set\": "
        << json_string(r.option_set) << ", \"usage\": " << json_string(r.usage)
        << ", \"shape\": [" << r.rows << ", " << r.cols << "], \"dtype\": \"bf16\", \"passes\": "
        << r.passes;
    f << ", \"ms\": " << json_number(r.ms) << ", \"bytes\": " << json_number(r.min_bytes, 12)
      << ", \"value\": " << json_number(r.value) << ", \"unit\": \"GB/s\""
      << ", \"ratio\": " << json_number(r.ratio)
      << ", \"ratio_to\": \"max(copy kernel, memcpy)\"";
    if (r.kind == "quantize")
      f << ", \"read_once_ratio\": " << json_number(r.read_once_ratio)
        << ", \"isolated_ms\": " << json_number(r.isolated_ms)
        << ", \"same_size_copy_ratio\": " << json_number(r.same_size_copy_ratio);
    f << "}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw std::runtime_error("writing " + path + " failed");
}

void print_table(const cudaDeviceProp& prop, const std::vector<Record>& records) {
  std::printf("\n%s\n\n", prop.name);
  std::printf("| name | ms | GB/s | ratio | read_once_ratio | isolated_ms | same_size_copy_ratio |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Record& r : records) {
    const bool q = r.kind == "quantize";
    std::printf("| %s | %.4f | %.1f | %.3f | %s | %s | %s |\n", r.name.c_str(), r.ms, r.value,
                r.ratio, q ? json_number(r.read_once_ratio, 3).c_str() : "",
                q ? json_number(r.isolated_ms, 4).c_str() : "",
                q ? json_number(r.same_size_copy_ratio, 3).c_str() : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      std::cerr << "bench_quantize: no CUDA device ("
                << (status != cudaSuccess ? cudaGetErrorString(status) : "0 devices")
                << "); run it on a GPU machine (tools/gpu_check.sh bench)\n";
      return 2;
    }
    BENCH_CUDA(cudaSetDevice(0));
    cudaDeviceProp prop{};
    BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::cerr << "device: " << prop.name << ", " << prop.multiProcessorCount << " SMs, L2 "
              << (prop.l2CacheSize >> 20) << " MiB\n";
    cudaStream_t stream = nullptr;
    BENCH_CUDA(cudaStreamCreate(&stream));
    const CopyCeiling copy = measure_copy(o, prop, stream);
    std::vector<Record> records = {copy.kernel, copy.memcpy};
    std::cerr << "copy ceiling: kernel " << copy.kernel_gbps << " GB/s, memcpy " << copy.memcpy_gbps
              << " GB/s; ratios are against " << copy.gbps << " GB/s\n";
    const std::vector<Record> q = measure_quantize(o, prop, stream, copy.gbps);
    records.insert(records.end(), q.begin(), q.end());
    BENCH_CUDA(cudaStreamSynchronize(stream));
    BENCH_CUDA(cudaStreamDestroy(stream));
    if (!o.out.empty()) {
      write_json(o.out, prop, o, records);
      std::cerr << "wrote " << o.out << "\n";
    }
    print_table(prop, records);
    if (q.empty()) {
      std::cerr << "bench_quantize: no format with CUDA support was measured\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_quantize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
