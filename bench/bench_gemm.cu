// bench_gemm: TFLOP/s of qrecipe::gemm() on CUDA, against a raw cuBLASLt call of the same
// precision, layout and shape, and against BF16.
//
//   bench_gemm [--out results.json] [--runs 15] [--warmup 10] [--batch 10]
//              [--shapes 4096x4096x4096,8192x8192x8192,16384x8192x8192] [--out-dtype bf16|f32]
//              [--configs label-substring,...]
//
// Map of this file
//   1. CUDA helpers: error checks, the BF16 fill kernel, events, timing
//   2. raw cuBLASLt: bench/raw_cublaslt.hpp, one prepared TN GEMM in the library the engine loaded
//   3. configurations: operand formats, GEMM kind, and the raw GEMM each is compared with
//   4. one measurement: operands on the device, qrecipe::gemm() and the raw GEMM timed alike
//   5. output: JSON (--out, the schema of bench_quantize with "kind": "gemm") and a markdown
//      table on stdout
//
// Method. Shapes are M x N x K: A is [M, K], B is [N, K] (both read rowwise, K-major) and the
// output [M, N] (BF16 by default). Operands are quantized once on the device (or on the CPU and
// uploaded when a format has no CUDA quantize yet); quantization is not timed. Each timed sample
// is --batch back-to-back calls between two CUDA events on one stream, so the host work of a
// call overlaps the previous call's GPU work exactly as in a training step. The samples of
// qrecipe::gemm() and of the raw cuBLASLt GEMM it is compared with are interleaved (qrecipe,
// raw, qrecipe, raw, ... --runs rounds after --warmup calls of each), so clock and power drifts
// of the GPU during a measurement hit both sides alike: the reported times are the median
// sample / batch of each side, the ratio the median of the per-round ratios.
//
// Metrics of a gemm record:
//   value (TFLOP/s)   = 2 M N K / median time of qrecipe::gemm()
//   ratio             = raw cuBLASLt time / qrecipe time (target >= 0.97 for native and dense
//                       GEMMs; for emulated GEMMs, whose raw GEMM is the BF16 GEMM of the
//                       shape, it is the fraction of BF16 speed: target >= 0.90 at 8192^3)
//   speedup_vs_bf16   = qrecipe BF16 dense time / this configuration's qrecipe time (same shape)
// The raw GEMM of a native configuration uses the very operand and scale buffers qrecipe reads,
// with the same scale modes and accumulation mode (and no bias: a "+ bias" configuration prices
// the bias epilogue); of a dense or emulated one, a BF16 TN GEMM into the same output.
//
// How to add a configuration: append to kConfigs.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/tensor.hpp"
#include "bench_common.hpp"
#include "raw_cublaslt.hpp"

namespace {

using namespace qrecipe::bench;

// ---------------------------------------------------------------- 1. CUDA helpers



// Uniform value in [-4, 4) from a hash of the index: the same on host and device, so a format
// without CUDA quantize can quantize the identical source on the CPU.
__host__ __device__ inline float source_value(std::uint64_t i, std::uint32_t seed) {
  std::uint32_t h = static_cast<std::uint32_t>(i) ^ static_cast<std::uint32_t>(i >> 32) ^ seed;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 8.0f;
}

__global__ void fill_bf16_kernel(std::uint16_t* dst, std::size_t n, std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = qrecipe::num::f32_to_bf16(source_value(i, seed));
}

__global__ void fill_f32_kernel(float* dst, std::size_t n, std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = qrecipe::num::bf16_to_f32(qrecipe::num::f32_to_bf16(source_value(i, seed)));
}




// Interleaved timing of two callables: after `warmup` calls of each, `runs` rounds of one
// sample of fa() and one of fb(), each sample `batch` back-to-back calls between two events on
// `stream`. Returns the median ms per call of each and the median per-round ratio tb / ta.
struct Paired {
  double a_ms = 0, b_ms = 0, ratio = 0;
};

template <class Fa, class Fb>
Paired time_paired(cudaStream_t stream, int warmup, int runs, int batch, Fa&& fa, Fb&& fb) {
  for (int i = 0; i < warmup; ++i) fa();
  for (int i = 0; i < warmup; ++i) fb();
  BENCH_CUDA(cudaStreamSynchronize(stream));
  Event start, stop;
  auto sample = [&](auto& fn) {
    BENCH_CUDA(cudaEventRecord(start.get(), stream));
    for (int i = 0; i < batch; ++i) fn();
    BENCH_CUDA(cudaEventRecord(stop.get(), stream));
    BENCH_CUDA(cudaEventSynchronize(stop.get()));
    float t = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&t, start.get(), stop.get()));
    return static_cast<double>(t) / batch;
  };
  std::vector<double> a, b, ratio;
  for (int r = 0; r < runs; ++r) {
    a.push_back(sample(fa));
    b.push_back(sample(fb));
    ratio.push_back(b.back() / a.back());
  }
  BENCH_CUDA(cudaGetLastError());
  return {median(a), median(b), median(ratio)};
}

// ---------------------------------------------------------------- 2. raw cuBLASLt
//
// bench/raw_cublaslt.hpp: the benchmarks' one raw cuBLASLt GEMM (the TN GEMM the engine
// issues, set up as the engine sets it up, in the libcublasLt.so.13 the engine loaded), prepared
// once per measurement and enqueued as is.

// ---------------------------------------------------------------- 3. configurations

enum class Raw { fp8, bf16 };

struct Config {
  const char* label;
  const char* a_spec;  // quantizer spec of A; nullptr: dense BF16
  const char* b_spec;
  qrecipe::GemmKind kind;
  Raw raw;             // the raw cuBLASLt GEMM it is compared with
  bool bias = false;   // a bias (the raw GEMM has none)
  qrecipe::DType bias_dtype = qrecipe::DType::f32;
};

constexpr const char* kE4M3 = "{format: float8, scaling: current, dtype: e4m3}";
constexpr const char* kE5M2 = "{format: float8, scaling: current, dtype: e5m2}";
constexpr const char* kBlock1 = "{format: blockwise, block: 1x128}";
constexpr const char* kBlock128 = "{format: blockwise, block: 128x128}";
constexpr const char* kMxfp8 = "{format: mxfp8}";
constexpr const char* kNvfp4 = "{format: nvfp4}";

const Config kConfigs[] = {
    {"bf16 dense", nullptr, nullptr, qrecipe::GemmKind::fprop, Raw::bf16},
    {"float8 e4m3 x e4m3 fprop (fast accumulation)", kE4M3, kE4M3, qrecipe::GemmKind::fprop, Raw::fp8},
    {"float8 e4m3 x e4m3 dgrad (split accumulation)", kE4M3, kE4M3, qrecipe::GemmKind::dgrad, Raw::fp8},
    // dgrad / wgrad of the float8 recipes: E5M2 gradients against E4M3 (bench_linear's floor).
    {"float8 e5m2 x e4m3 dgrad (split accumulation)", kE5M2, kE4M3, qrecipe::GemmKind::dgrad, Raw::fp8},
    {"blockwise 1x128 x 128x128", kBlock1, kBlock128, qrecipe::GemmKind::fprop, Raw::fp8},
    {"blockwise 1x128 x 1x128", kBlock1, kBlock1, qrecipe::GemmKind::fprop, Raw::fp8},
    {"float8 e4m3 x e4m3 fprop + bias", kE4M3, kE4M3, qrecipe::GemmKind::fprop, Raw::fp8, true},
    // A BF16 model's bias: added inside cuBLASLt's epilogue (the FP32 one needs a pass of its own).
    {"float8 e4m3 x e4m3 fprop + bf16 bias", kE4M3, kE4M3, qrecipe::GemmKind::fprop, Raw::fp8, true,
     qrecipe::DType::bf16},
    {"mxfp8 x mxfp8 (emulated)", kMxfp8, kMxfp8, qrecipe::GemmKind::fprop, Raw::bf16},
    {"nvfp4 x nvfp4 (emulated)", kNvfp4, kNvfp4, qrecipe::GemmKind::fprop, Raw::bf16},
    {"float8 e4m3 x mxfp8 (emulated, mixed)", kE4M3, kMxfp8, qrecipe::GemmKind::fprop, Raw::bf16},
    {"nvfp4 x float8 e4m3 (emulated, mixed)", kNvfp4, kE4M3, qrecipe::GemmKind::fprop, Raw::bf16},
    {"blockwise 1x128 x mxfp8 (emulated, mixed)", kBlock1, kMxfp8, qrecipe::GemmKind::fprop, Raw::bf16},
    {"blockwise 128x128 x 128x128 (emulated)", kBlock128, kBlock128, qrecipe::GemmKind::fprop, Raw::bf16},
};

struct Shape {
  std::int64_t m, n, k;
};

// The "format" field of a record: the operands' formats, "A x B" ("bf16" for a dense GEMM),
// read from the quantizer specs ("{format: mxfp8, ...}" -> "mxfp8").
std::string format_of(const Config& c) {
  const auto one = [](const char* spec) -> std::string {
    if (spec == nullptr) return "bf16";
    const std::string s(spec), key = "format: ";
    const auto at = s.find(key);
    if (at == std::string::npos) return "?";
    const auto begin = at + key.size();
    return s.substr(begin, s.find_first_of(",}", begin) - begin);
  };
  return c.a_spec == nullptr && c.b_spec == nullptr ? "bf16" : one(c.a_spec) + " x " + one(c.b_spec);
}

struct Options {
  std::string out;
  int runs = 15, warmup = 10, batch = 10;
  std::vector<Shape> shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}, {16384, 8192, 8192}};
  qrecipe::DType out_dtype = qrecipe::DType::bf16;
  std::vector<std::string> configs;  // label substrings; empty: all
};

struct Record {
  std::string name, config, format, path, plan;
  Shape shape{};
  double ms = 0, raw_ms = 0, value = 0, raw_value = 0, ratio = 0, speedup_vs_bf16 = 0, flops = 0;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "bench_gemm: " << msg
            << "\nusage: bench_gemm [--out FILE.json] [--runs N] [--warmup N] [--batch N] "
               "[--shapes MxNxK,...] [--out-dtype bf16|f32] [--configs substring,...]\n";
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
      else if (a == "--batch") o.batch = std::stoi(value());
      else if (a == "--configs") o.configs = split(value(), ',');
      else if (a == "--out-dtype") {
        const std::string d = value();
        if (d != "bf16" && d != "f32") usage_error("--out-dtype is bf16 or f32");
        o.out_dtype = d == "bf16" ? qrecipe::DType::bf16 : qrecipe::DType::f32;
      } else if (a == "--shapes") {
        o.shapes.clear();
        for (const auto& s : split(value(), ',')) {
          const auto parts = split(s, 'x');
          if (parts.size() != 3) usage_error("shape '" + s + "' is not MxNxK");
          o.shapes.push_back({std::stoll(parts[0]), std::stoll(parts[1]), std::stoll(parts[2])});
        }
      } else if (a == "--help" || a == "-h") usage_error("help");
      else usage_error("unknown argument '" + a + "'");
    } catch (const std::logic_error&) {
      usage_error("bad value for " + a);
    }
  }
  if (o.runs < 1 || o.warmup < 0 || o.batch < 1) usage_error("runs >= 1, warmup >= 0, batch >= 1");
  return o;
}

// ---------------------------------------------------------------- 4. one measurement

using qrecipe::Device;
using qrecipe::DType;
using qrecipe::Tensor;
using qrecipe::TensorView;

std::shared_ptr<qrecipe::Quantizer> quantizer_for(const std::string& spec) {
  static std::map<std::string, std::unique_ptr<qrecipe::Engine>> engines;
  auto& e = engines[spec];
  if (!e)
    e = std::make_unique<qrecipe::Engine>(
        qrecipe::Recipe::parse("version: 1\ndefaults: " + spec + "\n", "bench_gemm"),
        qrecipe::Registry::shared());
  return e->resolve({"linear", "input", "bench_gemm"});
}

Tensor device_bf16(std::int64_t rows, std::int64_t cols, std::uint32_t seed, const cudaDeviceProp& prop,
                   cudaStream_t stream) {
  Tensor t(DType::bf16, {rows, cols}, Device::cuda(0), qrecipe::cuda_allocator());
  fill_bf16_kernel<<<grid_for(prop), kThreads, 0, stream>>>(t.data_as<std::uint16_t>(),
                                                             static_cast<std::size_t>(rows * cols), seed);
  BENCH_CUDA(cudaGetLastError());
  return t;
}

// The rowwise quantization of the [rows, cols] source `seed` on cuda:0: quantized there when the
// format has CUDA kernels, else quantized on the CPU from the same values and uploaded.
qrecipe::QuantizedTensor quantize_on_device(const qrecipe::Quantizer& q, const Tensor& source,
                                            std::uint32_t seed, cudaStream_t stream) {
  const std::int64_t rows = source.view().rows(), cols = source.view().cols();
  if (q.plugin().supports(Device::cuda(0))) {
    qrecipe::QuantizeOptions o;
    o.stream = stream;
    auto t = q.quantize(source.view(), QR_USAGE_ROWWISE, o, qrecipe::cuda_allocator());
    BENCH_CUDA(cudaStreamSynchronize(stream));
    return t;
  }
  std::cerr << "  format '" << q.format() << "' has no CUDA quantize: quantizing " << rows << "x" << cols
            << " on the CPU and uploading\n";
  Tensor host(DType::bf16, {rows, cols});
  auto* p = host.data_as<std::uint16_t>();
  for (std::int64_t i = 0; i < rows * cols; ++i)
    p[i] = qrecipe::num::f32_to_bf16(source_value(static_cast<std::uint64_t>(i), seed));
  const auto h = q.quantize(host.view(), QR_USAGE_ROWWISE);
  std::array<qr_direction_layout, 2> layouts{};
  layouts[QR_DIRECTION_ROWWISE] = h.layout(QR_DIRECTION_ROWWISE);
  qrecipe::QuantizedTensor d(h.format(), rows, cols, QR_USAGE_ROWWISE, layouts, Device::cuda(0),
                             qrecipe::cuda_allocator());
  const qr_direction_data& hs = h.direction(QR_DIRECTION_ROWWISE);
  const qr_direction_data& ds = d.direction(QR_DIRECTION_ROWWISE);
  auto bytes = [](const qr_tensor_view& v) {
    return v.data ? static_cast<std::size_t>(TensorView(v).nbytes()) : std::size_t{0};
  };
  qrecipe::copy_to_device(ds.data.data, hs.data.data, bytes(hs.data));
  if (hs.scale_inv.data) qrecipe::copy_to_device(ds.scale_inv.data, hs.scale_inv.data, bytes(hs.scale_inv));
  if (hs.amax.data) qrecipe::copy_to_device(ds.amax.data, hs.amax.data, bytes(hs.amax));
  return d;
}

cudaDataType_t cuda_type(std::int32_t t) {
  switch (t) {
    case QR_DTYPE_E4M3: return CUDA_R_8F_E4M3;
    case QR_DTYPE_E5M2: return CUDA_R_8F_E5M2;
    case QR_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

cublasLtMatmulMatrixScale_t scale_mode(const qr_direction_layout& l) {
  if (l.scale_mode == QR_SCALE_TENSOR) return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  return l.block_rows == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

const char* path_name(qrecipe::GemmPlan::Path p) {
  switch (p) {
    case qrecipe::GemmPlan::Path::native: return "native";
    case qrecipe::GemmPlan::Path::emulated: return "emulated";
    case qrecipe::GemmPlan::Path::dense: return "dense";
    default: return "reference";
  }
}

// Measures one configuration at one shape; nullopt (with a note on stderr) when a format
// cannot run on CUDA yet.
std::optional<Record> measure(const Options& o, const Config& c, const Shape& s, const cudaDeviceProp& prop,
                              cudaStream_t stream) {
  using namespace qrecipe;
  const std::uint32_t seed_a = 11, seed_b = 12;
  Tensor src_a = device_bf16(s.m, s.k, seed_a, prop, stream);
  Tensor src_b = device_bf16(s.n, s.k, seed_b, prop, stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  Tensor out(o.out_dtype, {s.m, s.n}, Device::cuda(0), cuda_allocator());

  std::shared_ptr<Quantizer> qa, qb;
  QuantizedTensor ta, tb;
  GemmOperand a = GemmOperand::dense(src_a.view(), QR_DIRECTION_ROWWISE);
  GemmOperand b = GemmOperand::dense(src_b.view(), QR_DIRECTION_ROWWISE);
  if (c.a_spec) {
    qa = quantizer_for(c.a_spec);
    qb = quantizer_for(c.b_spec);
    ta = quantize_on_device(*qa, src_a, seed_a, stream);
    tb = quantize_on_device(*qb, src_b, seed_b, stream);
    a = GemmOperand::quantized(ta, *qa, QR_DIRECTION_ROWWISE);
    b = GemmOperand::quantized(tb, *qb, QR_DIRECTION_ROWWISE);
  }
  GemmOptions go;
  go.kind = c.kind;
  go.stream = stream;
  std::unique_ptr<Tensor> bias;
  if (c.bias) {
    bias = std::make_unique<Tensor>(c.bias_dtype, std::vector<std::int64_t>{s.n}, Device::cuda(0), cuda_allocator());
    if (c.bias_dtype == DType::bf16)
      fill_bf16_kernel<<<grid_for(prop), kThreads, 0, stream>>>(bias->data_as<std::uint16_t>(), static_cast<std::size_t>(s.n), 13);
    else
      fill_f32_kernel<<<grid_for(prop), kThreads, 0, stream>>>(bias->data_as<float>(), static_cast<std::size_t>(s.n), 13);
    BENCH_CUDA(cudaGetLastError());
    go.bias = bias->view().data();
    go.bias_dtype = c.bias_dtype;
  }
  GemmPlan plan;
  try {
    plan = gemm(a, b, out.view(), go);
    BENCH_CUDA(cudaStreamSynchronize(stream));
  } catch (const Error& e) {
    if (e.code() != QR_STATUS_UNSUPPORTED) throw;
    std::cerr << "  " << c.label << ": not measured: " << e.what() << "\n";
    return std::nullopt;
  }

  // The raw cuBLASLt GEMM of the same precision, layout and shape: out [M, N] = A . B^T.
  raw_cublaslt::Gemm r;
  r.k = s.k;
  r.out = out.view().data();
  r.out_type = o.out_dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  r.a.outer = s.m;
  r.b.outer = s.n;
  if (c.raw == Raw::fp8 && plan.path == GemmPlan::Path::native) {
    const auto& da = ta.direction(QR_DIRECTION_ROWWISE);
    const auto& db = tb.direction(QR_DIRECTION_ROWWISE);
    r.a.data = da.data.data;
    r.a.type = cuda_type(da.layout.data_dtype);
    r.a.scale = da.scale_inv.data;
    r.a.scale_mode = scale_mode(da.layout);
    r.b.data = db.data.data;
    r.b.type = cuda_type(db.layout.data_dtype);
    r.b.scale = db.scale_inv.data;
    r.b.scale_mode = scale_mode(db.layout);
    r.fast_accumulation = plan.fast_accumulation;
  } else {  // BF16 (dense, emulated, or a native configuration that ran emulated)
    r.a.data = src_a.view().data();
    r.b.data = src_b.view().data();
    r.a.type = r.b.type = CUDA_R_16BF;
  }
  const raw_cublaslt::Prepared raw(r);
  const Paired t = time_paired(
      stream, o.warmup, o.runs, o.batch, [&] { gemm(a, b, out.view(), go); }, [&] { raw.run(stream); });
  const double ms = t.a_ms, raw_ms = t.b_ms;

  Record rec;
  rec.config = c.label;
  rec.format = format_of(c);
  rec.shape = s;
  rec.path = path_name(plan.path);
  rec.plan = plan.str();
  rec.ms = ms;
  rec.raw_ms = raw_ms;
  rec.flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  rec.value = rec.flops / (ms * 1e-3) / 1e12;
  rec.raw_value = rec.flops / (raw_ms * 1e-3) / 1e12;
  rec.ratio = t.ratio;
  rec.name = "gemm " + std::string(c.label) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
             std::to_string(s.k) + " -> " + std::string(dtype_name(o.out_dtype));
  std::cerr << rec.name << ": " << ms << " ms (raw " << raw_ms << " ms), " << rec.plan << "\n";
  return rec;
}

// ---------------------------------------------------------------- 5. output




void write_json(const std::string& path, const cudaDeviceProp& prop, const Options& o,
                const std::vector<Record>& records) {
  const char* commit = std::getenv("QRECIPE_COMMIT");
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << "{\n  \"device\": " << json_string(prop.name) << ",\n  \"date\": " << json_string(utc_now())
    << ",\n  \"commit\": " << json_string(commit && *commit ? commit : "unknown")
    << ",\n  \"l2_bytes\": " << prop.l2CacheSize << ",\n  \"runs\": " << o.runs
    << ",\n  \"warmup\": " << o.warmup << ",\n  \"batch\": " << o.batch << ",\n  \"records\": [";
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << (i ? "," : "") << "\n    {\"name\": " << json_string(r.name) << ", \"kind\": \"gemm\""
      << ", \"config\": " << json_string(r.config) << ", \"format\": " << json_string(r.format)
      << ", \"shape\": [" << r.shape.m << ", " << r.shape.n
      << ", " << r.shape.k << "], \"dtype\": " << json_string(std::string(qrecipe::dtype_name(o.out_dtype)))
      << ", \"path\": " << json_string(r.path) << ", \"plan\": " << json_string(r.plan)
      << ", \"ms\": " << json_number(r.ms) << ", \"flops\": " << json_number(r.flops, 12)
      << ", \"value\": " << json_number(r.value) << ", \"unit\": \"TFLOP/s\""
      << ", \"ratio\": " << json_number(r.ratio) << ", \"ratio_to\": \"cublaslt\""
      << ", \"raw_ms\": " << json_number(r.raw_ms) << ", \"raw_value\": " << json_number(r.raw_value)
      << ", \"speedup_vs_bf16\": " << json_number(r.speedup_vs_bf16) << "}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw std::runtime_error("writing " + path + " failed");
}

void print_table(const cudaDeviceProp& prop, const std::vector<Record>& records) {
  std::printf("\n%s\n\n", prop.name);
  std::printf("| name | path | ms | TFLOP/s | raw cuBLASLt TFLOP/s | ratio | vs bf16 |\n"
              "|---|---|---:|---:|---:|---:|---:|\n");
  for (const Record& r : records)
    std::printf("| %s | %s | %.4f | %.1f | %.1f | %.3f | %.2fx |\n", r.name.c_str(), r.path.c_str(), r.ms,
                r.value, r.raw_value, r.ratio, r.speedup_vs_bf16);
}

bool selected(const Options& o, const Config& c) {
  if (o.configs.empty()) return true;
  for (const auto& s : o.configs)
    if (std::string(c.label).find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
      std::cerr << "bench_gemm: no CUDA device ("
                << (status != cudaSuccess ? cudaGetErrorString(status) : "0 devices")
                << "); run it on a GPU machine (tools/gpu_check.sh bench)\n";
      return 2;
    }
    BENCH_CUDA(cudaSetDevice(0));
    cudaDeviceProp prop{};
    BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::cerr << "device: " << prop.name << ", " << prop.multiProcessorCount << " SMs\n";
    for (const auto& f : qrecipe::Registry::shared()->failures())
      std::cerr << "plugin load failure: " << f.path << ": " << f.cause << "\n";
    cudaStream_t stream = nullptr;
    BENCH_CUDA(cudaStreamCreate(&stream));
    std::vector<Record> records;
    for (const Shape& s : o.shapes) {
      std::optional<double> bf16_ms;
      const std::size_t first = records.size();
      for (const Config& c : kConfigs) {
        if (!selected(o, c) && c.a_spec) continue;  // the BF16 baseline always runs
        auto r = measure(o, c, s, prop, stream);
        if (!r) continue;
        if (!c.a_spec) bf16_ms = r->ms;
        if (selected(o, c)) records.push_back(*r);
      }
      for (std::size_t i = first; i < records.size(); ++i)
        records[i].speedup_vs_bf16 = bf16_ms ? *bf16_ms / records[i].ms : NAN;
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));
    BENCH_CUDA(cudaStreamDestroy(stream));
    if (!o.out.empty()) {
      write_json(o.out, prop, o, records);
      std::cerr << "wrote " << o.out << "\n";
    }
    print_table(prop, records);
    if (records.empty()) {
      std::cerr << "bench_gemm: nothing was measured\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_gemm: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
