// GPU GEMM == CPU reference GEMM on the same quantized operands (docs/gemm.md).
//
// For every operand pair, shape and GEMM kind below: quantize two random sources on the CPU,
// upload the quantized bytes unchanged (so both sides multiply exactly the same operands;
// that GPU quantization reproduces these bytes is test_gpu_parity's job), run gemm() on the
// CPU (the reference: decode to FP32, FP32 accumulation) and on cuda:0, and compare within the
// bound below. The plan gemm() returns must be the one the pairing table promises: native for
// the native pairs at shapes divisible by 16, emulated for the rest, dense for BF16 operands.
//
// Map
//   1. coverage: operand pairs, shapes, kinds, epilogue variants
//   2. the error bound
//   3. host helpers: sources, quantizers, uploads, element comparison
//   4. the test cases (the sweep; K = 0 and empty outputs; device errors)
//
// Error bound, per output element (i, j), with s = |alpha| * ||A_i|| * ||B_j|| (Euclidean norms
// of the decoded rows; by Cauchy-Schwarz s >= |alpha| * sum_r |A(i,r) B(j,r)|):
//   |gpu - cpu| <= gamma * s + 2^-21 * (|cpu| + |out0| + |bias_j|)   [+ BF16 output term]
//   gamma = (k + 2) * 2^-22 for FP32 accumulation of exactly decoded operands (emulated, dense):
//     each side is within (k + 1) ulp-sized relative steps of the exact sum in any summation
//     order, counting a whole ulp (2^-23) per step because tensor cores may truncate;
//   gamma += 2^-6 for a native FP8 GEMM with split accumulation: Hopper's FP8 tensor cores keep
//     the partial sum of at most 128 products (4 WGMMA k-steps) in about 14 significant bits
//     before cuBLASLt promotes it to FP32, so each such chunk is off by at most 128 * 2^-13;
//   gamma += 2^-5 for fast accumulation (fprop), where cuBLASLt never promotes: this is not a
//     worst-case bound but 2^-5 * ||A_i|| ||B_j|| is far above what the reduced-precision
//     accumulator loses on random data (about 2% of the result at K = 4096, DeepSeek-V3
//     section 3.3.2), and far below the error of any layout, transpose or scale mistake;
//   the 2^-21 term covers the FP32 roundings of the epilogue (+ out, + bias);
//   BF16 outputs add 2^-7 * (|cpu| + gamma * s): both sides round to BF16 once, landing at most
//   one BF16 ulp apart.
// Also, for FP32 outputs, the relative Frobenius error ||gpu - cpu|| / ||cpu|| must stay below
// 2^-12 (exact decode), 2^-7 (FP8 split) or 2^-4 (FP8 fast accumulation): a transposed
// operand, a wrong scale or a swapped FP8 type gives errors of order 1.
//
// Without a CUDA device the cases print "not supported: ..." and pass. An emulated pair whose
// format has no CUDA dequantize yet is reported as not supported (gemm() must then throw
// QR_STATUS_UNSUPPORTED, never fall back to the CPU). QRECIPE_GPU_GEMM_QUICK=1 skips the
// 4096^3 shape. QRECIPE_GPU_GEMM_SELFTEST=1 on a machine without a CUDA device runs the sweep
// with the "device" copies on the CPU: it checks the harness (operands of every format in
// every direction, uploads, bounds), not the CUDA path, and skips the plan checks.
//
// Every emulated case of the sweep (random normal data, power-of-two blockwise scales) must run
// with BF16 operands ("decoded to bf16" in the plan): each of its formats decodes exactly to
// BF16 there. A separate case feeds operands that BF16 cannot hold (MXFP8 blocks with the
// smallest E8M0 scale and subnormal codes; blockwise scales that are not powers of two): the
// device must notice and recompute the output exactly (within the same bound), under every
// epilogue variant; each such case first shows that BF16-truncated operands would fail it.
//
// How to add a pair: append to kPairs (YAML quantizer specs; nullptr for dense BF16) with the
// path the pairing table promises at shapes divisible by 16.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
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

using qrecipe::Device;
using qrecipe::DType;
using qrecipe::GemmKind;
using qrecipe::GemmOperand;
using qrecipe::GemmOptions;
using qrecipe::GemmPlan;
using qrecipe::QuantizedTensor;
using qrecipe::Quantizer;
using qrecipe::Tensor;
using qrecipe::TensorView;

namespace {

// ---------------------------------------------------------------- 1. coverage

constexpr const char* kE4M3 = "{format: float8, scaling: current, dtype: e4m3}";
constexpr const char* kE5M2 = "{format: float8, scaling: current, dtype: e5m2}";
constexpr const char* kBlock1x128 = "{format: blockwise, block: 1x128}";
constexpr const char* kBlock128x128 = "{format: blockwise, block: 128x128}";
constexpr const char* kMxfp8 = "{format: mxfp8}";
constexpr const char* kNvfp4 = "{format: nvfp4}";

using Path = GemmPlan::Path;

struct Pair {
  const char* label;
  const char* a_spec;  // quantizer of operand A; nullptr: dense BF16
  const char* b_spec;
  Path promised;       // at shapes divisible by 16
};

const Pair kPairs[] = {
    {"float8 e4m3 x e4m3", kE4M3, kE4M3, Path::native},
    {"float8 e4m3 x e5m2", kE4M3, kE5M2, Path::native},
    {"float8 e5m2 x e4m3", kE5M2, kE4M3, Path::native},
    {"float8 e5m2 x e5m2", kE5M2, kE5M2, Path::emulated},
    {"blockwise 1x128 x 128x128", kBlock1x128, kBlock128x128, Path::native},
    {"blockwise 1x128 x 1x128", kBlock1x128, kBlock1x128, Path::native},
    {"blockwise 128x128 x 128x128", kBlock128x128, kBlock128x128, Path::emulated},
    {"mxfp8 x mxfp8", kMxfp8, kMxfp8, Path::emulated},
    {"nvfp4 x nvfp4", kNvfp4, kNvfp4, Path::emulated},
    {"mixed float8 e4m3 x mxfp8", kE4M3, kMxfp8, Path::emulated},
    {"mixed mxfp8 x float8 e4m3", kMxfp8, kE4M3, Path::emulated},
    {"mixed nvfp4 x float8 e4m3", kNvfp4, kE4M3, Path::emulated},
    {"mixed float8 e5m2 x nvfp4", kE5M2, kNvfp4, Path::emulated},
    {"mixed blockwise 1x128 x mxfp8", kBlock1x128, kMxfp8, Path::emulated},
    {"mixed bf16 dense x nvfp4", nullptr, kNvfp4, Path::emulated},
    {"bf16 dense", nullptr, nullptr, Path::dense},
};

struct Shape {
  std::int64_t m, n, k;
};
// The last shape is not divisible by 16 (and has partial 128-blocks): always emulated.
const Shape kShapes[] = {{16, 16, 16}, {128, 256, 64}, {1024, 1024, 1024}, {4096, 4096, 4096},
                         {100, 72, 200}};

// The three GEMMs of a linear layer and the directions their operands are read in
// (gemm.hpp): fprop rowwise x rowwise, dgrad rowwise x columnwise, wgrad columnwise x columnwise.
struct Kind {
  GemmKind kind;
  qr_direction a, b;
};
const Kind kKinds[] = {{GemmKind::fprop, QR_DIRECTION_ROWWISE, QR_DIRECTION_ROWWISE},
                       {GemmKind::dgrad, QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE},
                       {GemmKind::wgrad, QR_DIRECTION_COLUMNWISE, QR_DIRECTION_COLUMNWISE}};

// Epilogue variants: the plain product everywhere; alpha + accumulate + bias (FP32 output) and
// accumulate + bias (BF16 output) where the shape is at most 1024^3.
struct Variant {
  const char* label;
  DType out;
  float alpha;
  bool accumulate, bias;
  DType bias_dtype = DType::f32;
};
// The BF16 bias with a BF16 output is what a BF16 model's Linear passes: a native FP8 GEMM adds
// it inside cuBLASLt's epilogue, every other path widens it to FP32 first.
const Variant kVariants[] = {{"f32", DType::f32, 1.0f, false, false},
                             {"f32 alpha=0.5 accumulate bias", DType::f32, 0.5f, true, true},
                             {"bf16 accumulate bias", DType::bf16, 1.0f, true, true},
                             {"bf16 bf16-bias", DType::bf16, 1.0f, false, true, DType::bf16}};

constexpr int kMaxReportedFailures = 20;

// ---------------------------------------------------------------- 2. error bound

struct Bound {
  double gamma = 0;   // times s = |alpha| ||A_i|| ||B_j||
  double frobenius = 0;
  const char* model = "";
};

Bound bound_for(const GemmPlan& plan, std::int64_t k) {
  Bound b;
  b.gamma = static_cast<double>(k + 2) * std::ldexp(1.0, -22);
  b.frobenius = std::ldexp(1.0, -12);
  b.model = "FP32 accumulation of exactly decoded operands";
  if (plan.path == Path::native) {
    if (plan.fast_accumulation) {
      b.gamma += std::ldexp(1.0, -5);
      b.frobenius = std::ldexp(1.0, -4);
      b.model = "native FP8, fast accumulation";
    } else {
      b.gamma += std::ldexp(1.0, -6);
      b.frobenius = std::ldexp(1.0, -7);
      b.model = "native FP8, split accumulation";
    }
  }
  return b;
}

// ---------------------------------------------------------------- 3. host helpers

std::shared_ptr<qrecipe::Registry> registry() {
  static const auto reg = std::make_shared<qrecipe::Registry>();
  return reg;
}

std::vector<float> random_normal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

std::string format_of(const char* spec) {
  const std::string s(spec);
  const auto start = s.find("format: ") + 8;
  return s.substr(start, s.find_first_of(",}", start) - start);
}

// One engine per spec, kept for the whole run (quantizers must not outlive their engine).
std::shared_ptr<Quantizer> quantizer_for(const char* spec) {
  static std::map<std::string, std::unique_ptr<qrecipe::Engine>> engines;
  auto& e = engines[spec];
  if (!e)
    e = std::make_unique<qrecipe::Engine>(
        qrecipe::Recipe::parse(std::string("version: 1\ndefaults: ") + spec + "\n", "gpu-gemm"),
        registry());
  return e->resolve({"linear", "input", "gpu_gemm"});
}

bool selftest() {
  const char* v = std::getenv("QRECIPE_GPU_GEMM_SELFTEST");
  return v && std::string(v) == "1" && !qrecipe::cuda_available();
}

// Where the "device" side lives: cuda:0, or the CPU in self-test mode.
Device target() { return selftest() ? Device::cpu() : Device::cuda(0); }
std::shared_ptr<qrecipe::Allocator> target_allocator() {
  return selftest() ? qrecipe::cpu_allocator() : qrecipe::cuda_allocator();
}
void copy_to_target(void* dst, const void* src, std::size_t bytes) {
  if (selftest()) {
    if (bytes) std::memcpy(dst, src, bytes);
  } else {
    qrecipe::copy_to_device(dst, src, bytes);
  }
}

std::size_t view_bytes(const qr_tensor_view& v) {
  return v.data ? static_cast<std::size_t>(TensorView(v).nbytes()) : 0;
}

// The same quantized tensor on cuda:0: same layouts, every buffer copied byte for byte.
QuantizedTensor upload(const QuantizedTensor& host) {
  std::array<qr_direction_layout, 2> layouts{};
  for (const auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (host.has(d)) layouts[d] = host.layout(d);
  QuantizedTensor dev(host.format(), host.rows(), host.cols(), host.usage(), layouts, target(),
                      target_allocator());
  for (const auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!host.has(d)) continue;
    const qr_direction_data& h = host.direction(d);
    const qr_direction_data& g = dev.direction(d);
    copy_to_target(g.data.data, h.data.data, view_bytes(h.data));
    if (h.scale_inv.data) copy_to_target(g.scale_inv.data, h.scale_inv.data, view_bytes(h.scale_inv));
    if (h.amax.data) copy_to_target(g.amax.data, h.amax.data, view_bytes(h.amax));
  }
  return dev;
}

Tensor to_device(const Tensor& host) {
  Tensor t(host.view().dtype(), host.shape(), target(), target_allocator());
  copy_to_target(t.view().data(), host.view().data(), static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

// The epilogue's inputs, the same values on both sides: the initial output (read by accumulate)
// in `out`'s dtype on the host and the target, and the bias in `bias_dtype` on the host and the
// target. For a BF16 output `out0`, and for a BF16 bias `bias`, are rounded to what the tensors
// hold, so the checks see the same values.
struct EpilogueInputs {
  Tensor cpu_out, gpu_out, bias_host, bias_dev;
};

EpilogueInputs epilogue_inputs(DType out, DType bias_dtype, const Shape& shape,
                               std::vector<float>& out0, std::vector<float>& bias) {
  Tensor cpu_out(out, {shape.m, shape.n});
  for (std::size_t i = 0; i < out0.size(); ++i) {
    if (out == DType::f32) {
      cpu_out.data_as<float>()[i] = out0[i];
    } else {
      cpu_out.data_as<std::uint16_t>()[i] = qrecipe::num::f32_to_bf16(out0[i]);
      out0[i] = qrecipe::num::bf16_to_f32(cpu_out.data_as<std::uint16_t>()[i]);
    }
  }
  Tensor gpu_out = to_device(cpu_out);
  Tensor bias_host(bias_dtype, {shape.n});
  for (std::size_t j = 0; j < bias.size(); ++j) {
    if (bias_dtype == DType::f32) {
      bias_host.data_as<float>()[j] = bias[j];
    } else {
      bias_host.data_as<std::uint16_t>()[j] = qrecipe::num::f32_to_bf16(bias[j]);
      bias[j] = qrecipe::num::bf16_to_f32(bias_host.data_as<std::uint16_t>()[j]);
    }
  }
  Tensor bias_dev = to_device(bias_host);
  return {std::move(cpu_out), std::move(gpu_out), std::move(bias_host), std::move(bias_dev)};
}

std::vector<float> output_values(const TensorView& out) {
  const auto n = static_cast<std::size_t>(out.numel());
  std::vector<float> v(n);
  if (out.dtype() == DType::f32) {
    if (out.device().is_cuda())
      qrecipe::copy_to_host(v.data(), out.data(), n * 4);
    else
      std::memcpy(v.data(), out.data(), n * 4);
    return v;
  }
  std::vector<std::uint16_t> raw(n);
  if (out.device().is_cuda())
    qrecipe::copy_to_host(raw.data(), out.data(), n * 2);
  else
    std::memcpy(raw.data(), out.data(), n * 2);
  for (std::size_t i = 0; i < n; ++i) v[i] = qrecipe::num::bf16_to_f32(raw[i]);
  return v;
}

// One operand of a case: the CPU tensor (quantized or dense BF16), its copy on cuda:0, and the
// Euclidean norm of each decoded row along K (for the bound).
struct Operand {
  std::shared_ptr<Quantizer> quantizer;
  QuantizedTensor cpu_q, gpu_q;
  Tensor cpu_dense, gpu_dense;
  qr_direction direction = QR_DIRECTION_ROWWISE;
  std::vector<double> norms;  // [outer]
  std::vector<float> decoded;  // the reference decode, [outer, inner]

  GemmOperand cpu() const {
    return quantizer ? GemmOperand::quantized(cpu_q, *quantizer, direction)
                     : GemmOperand::dense(cpu_dense.view(), direction);
  }
  GemmOperand gpu() const {
    return quantizer ? GemmOperand::quantized(gpu_q, *quantizer, direction)
                     : GemmOperand::dense(gpu_dense.view(), direction);
  }
};

// A logical [outer, inner] operand read in `direction`: stored [outer, inner] when rowwise,
// [inner, outer] when columnwise.
// The source values are standard normal times `magnitude` (FP32, then quantized).
Operand make_operand(const char* spec, qr_direction direction, std::int64_t outer, std::int64_t inner,
                     std::uint64_t seed, float magnitude = 1.0f) {
  Operand op;
  op.direction = direction;
  const bool rowwise = direction == QR_DIRECTION_ROWWISE;
  const std::int64_t rows = rowwise ? outer : inner, cols = rowwise ? inner : outer;
  std::vector<float> src = random_normal(static_cast<std::size_t>(rows * cols), seed);
  if (magnitude != 1.0f)
    for (auto& x : src) x = x * magnitude;
  std::vector<float> decoded(src.size());  // logical [rows, cols] after decoding
  if (spec) {
    op.quantizer = quantizer_for(spec);
    auto view = TensorView(const_cast<float*>(src.data()), DType::f32, {rows, cols});
    op.cpu_q = op.quantizer->quantize(view, qrecipe::usage_bit(direction));
    op.gpu_q = upload(op.cpu_q);
    op.quantizer->dequantize(op.cpu_q, direction, TensorView(decoded.data(), DType::f32, {rows, cols}));
  } else {
    op.cpu_dense = Tensor(DType::bf16, {rows, cols});
    auto* p = op.cpu_dense.data_as<std::uint16_t>();
    for (std::size_t i = 0; i < src.size(); ++i) {
      p[i] = qrecipe::num::f32_to_bf16(src[i]);
      decoded[i] = qrecipe::num::bf16_to_f32(p[i]);
    }
    op.gpu_dense = to_device(op.cpu_dense);
  }
  op.norms.assign(static_cast<std::size_t>(outer), 0.0);
  op.decoded.assign(decoded.size(), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = decoded[static_cast<std::size_t>(r * cols + c)];
      op.norms[static_cast<std::size_t>(rowwise ? r : c)] += static_cast<double>(v) * v;
      op.decoded[static_cast<std::size_t>(rowwise ? r * cols + c : c * rows + r)] = v;
    }
  for (auto& n : op.norms) n = std::sqrt(n);
  return op;
}

struct Comparison {
  std::int64_t failures = 0;
  std::string first;
  double worst_ratio = 0;  // max |gpu - cpu| / tol
  double frobenius = 0;    // ||gpu - cpu|| / ||cpu||
};

Comparison compare(const std::vector<float>& cpu, const std::vector<float>& gpu,
                   const std::vector<float>& out0, const std::vector<float>& bias, const Operand& a,
                   const Operand& b, std::int64_t m, std::int64_t n, const Bound& bound,
                   const Variant& v) {
  Comparison c;
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const auto idx = static_cast<std::size_t>(i * n + j);
      const double ref = cpu[idx], got = gpu[idx];
      const double s = std::fabs(v.alpha) * a.norms[static_cast<std::size_t>(i)] *
                       b.norms[static_cast<std::size_t>(j)];
      double tol = bound.gamma * s +
                   std::ldexp(1.0, -21) * (std::fabs(ref) + (v.accumulate ? std::fabs(out0[idx]) : 0.0) +
                                           (v.bias ? std::fabs(bias[static_cast<std::size_t>(j)]) : 0.0));
      if (v.out == DType::bf16) tol += std::ldexp(1.0, -7) * (std::fabs(ref) + bound.gamma * s);
      tol += 1e-30;
      const double diff = std::fabs(got - ref);
      err2 += diff * diff;
      ref2 += ref * ref;
      const double ratio = std::isfinite(got) ? diff / tol : INFINITY;
      c.worst_ratio = std::max(c.worst_ratio, ratio);
      if (!(ratio <= 1.0)) {
        if (c.failures == 0) {
          std::ostringstream os;
          os.precision(9);
          os << "out[" << i << ", " << j << "]: gpu " << got << ", cpu " << ref << ", |diff| " << diff
             << " > bound " << tol;
          c.first = os.str();
        }
        ++c.failures;
      }
    }
  }
  c.frobenius = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return c;
}

bool quick() {
  const char* v = std::getenv("QRECIPE_GPU_GEMM_QUICK");
  return v && std::string(v) == "1";
}

// QRECIPE_GPU_GEMM_SHARD="i/n": this process sweeps the pairs j with j % n == i, and runs the
// other test cases only when i == 0. ctest registers n entries so `ctest -j` runs them in
// parallel: the sweep is bound by the CPU reference (one process took 324 s on an H100 host).
// Unset: everything in one process.
struct Shard {
  int index = 0, count = 1;
  bool owns(std::size_t pair) const { return static_cast<int>(pair % static_cast<std::size_t>(count)) == index; }
  bool first() const { return index == 0; }
};

Shard shard() {
  const char* v = std::getenv("QRECIPE_GPU_GEMM_SHARD");
  if (!v || !*v) return {};
  Shard s;
  char slash = 0;
  std::istringstream in(v);
  if (!(in >> s.index >> slash >> s.count) || slash != '/' || s.count < 1 || s.index < 0 || s.index >= s.count ||
      !in.eof())
    throw std::invalid_argument("QRECIPE_GPU_GEMM_SHARD='" + std::string(v) +
                                "': expected 'i/n' with 0 <= i < n (e.g. 0/4), or unset for every pair");
  return s;
}

bool skip_without_cuda() {
  if (qrecipe::cuda_available()) return false;
  MESSAGE("not supported: " << qrecipe::cuda_status());
  return true;
}

}  // namespace

// ---------------------------------------------------------------- 4. test cases

TEST_CASE("GPU GEMMs equal the CPU reference on the same quantized operands") {
  if (selftest())
    MESSAGE("QRECIPE_GPU_GEMM_SELFTEST=1 without a CUDA device: the device side runs on the CPU "
            "(harness check only)");
  else if (skip_without_cuda())
    return;
  MESSAGE(qrecipe::cuda_status());
  int reported = 0;
  const Shard my_shard = shard();
  for (std::size_t pair_index = 0; pair_index < std::size(kPairs); ++pair_index) {
    if (!my_shard.owns(pair_index)) continue;
    const Pair& pair = kPairs[pair_index];
    const bool formats_loaded = (!pair.a_spec || registry()->find(format_of(pair.a_spec))) &&
                                (!pair.b_spec || registry()->find(format_of(pair.b_spec)));
    if (!formats_loaded) {
      MESSAGE("not supported: " << std::string(pair.label) << ": plugin not built");
      continue;
    }
    int cases = 0, unsupported = 0;
    double worst = 0;
    std::string paths;
    std::string unsupported_why;
    for (const Shape& shape : kShapes) {
      if (quick() && shape.m * shape.n * shape.k > (std::int64_t{1} << 30)) continue;
      const bool divisible = shape.m % 16 == 0 && shape.n % 16 == 0 && shape.k % 16 == 0;
      const Path promised = divisible || pair.promised == Path::dense ? pair.promised : Path::emulated;
      for (const Kind& kind : kKinds) {
        const std::uint64_t seed = static_cast<std::uint64_t>(shape.m * 7919 + shape.n * 104729 + shape.k) ^
                                   (static_cast<std::uint64_t>(kind.kind) << 48);
        const Operand a = make_operand(pair.a_spec, kind.a, shape.m, shape.k, seed);
        const Operand b = make_operand(pair.b_spec, kind.b, shape.n, shape.k, seed + 1);
        for (const Variant& v : kVariants) {
          const bool plain = !v.accumulate && !v.bias && v.out == DType::f32;
          if (!plain && shape.m * shape.n * shape.k > (std::int64_t{1} << 30)) continue;
          CAPTURE(std::string(pair.label));
          CAPTURE(std::string(gemm_kind_name(kind.kind)));
          CAPTURE(shape.m);
          CAPTURE(shape.n);
          CAPTURE(shape.k);
          CAPTURE(std::string(v.label));
          // Initial output (read by accumulate) and bias: the same values on both sides.
          const auto mn = static_cast<std::size_t>(shape.m * shape.n);
          std::vector<float> out0 = random_normal(mn, seed + 2);
          std::vector<float> bias = random_normal(static_cast<std::size_t>(shape.n), seed + 3);
          auto [cpu_out, gpu_out, bias_host, bias_dev] = epilogue_inputs(v.out, v.bias_dtype, shape, out0, bias);

          GemmOptions o;
          o.alpha = v.alpha;
          o.accumulate = v.accumulate;
          o.kind = kind.kind;
          o.bias = v.bias ? bias_host.view().data() : nullptr;
          o.bias_dtype = v.bias_dtype;
          qrecipe::gemm(a.cpu(), b.cpu(), cpu_out.view(), o);
          o.bias = v.bias ? bias_dev.view().data() : nullptr;
          GemmPlan plan;
          try {
            plan = qrecipe::gemm(a.gpu(), b.gpu(), gpu_out.view(), o);
            if (!selftest()) qrecipe::synchronize(Device::cuda(0));
          } catch (const qrecipe::Error& e) {
            // Only an emulated pair may lack its format's CUDA dequantize (still being written).
            REQUIRE_MESSAGE(e.code() == QR_STATUS_UNSUPPORTED, e.what());
            CHECK(std::string(e.what()).find("never falls back") != std::string::npos);
            CHECK_MESSAGE(promised != Path::native, "a native pair must not need a dequantize: ",
                          e.what());
            ++unsupported;
            if (unsupported_why.empty()) unsupported_why = e.what();
            continue;
          }
          if (!selftest()) CHECK_MESSAGE(plan.path == promised, "plan: ", plan.str());
          if (!selftest() && plan.path == Path::emulated)
            CHECK_MESSAGE(plan.reason.find("decoded to bf16") != std::string::npos,
                          "an emulated GEMM of exactly representable operands must run in BF16: ",
                          plan.str());
          if (paths.find(plan.str()) == std::string::npos && paths.size() < 2000)
            paths += "\n    " + std::string(gemm_kind_name(kind.kind)) + ": " + plan.str();

          const Bound bound = bound_for(plan, shape.k);
          const Comparison c = compare(output_values(cpu_out.view()), output_values(gpu_out.view()),
                                       out0, bias, a, b, shape.m, shape.n, bound, v);
          ++cases;
          worst = std::max(worst, c.worst_ratio);
          if (c.failures > 0 && reported++ < kMaxReportedFailures)
            FAIL_CHECK(c.failures << " of " << mn << " elements outside the bound (" << bound.model
                                  << "); first " << c.first);
          if (v.out == DType::f32 && c.frobenius > bound.frobenius && reported++ < kMaxReportedFailures)
            FAIL_CHECK("relative Frobenius error " << c.frobenius << " > " << bound.frobenius << " ("
                                                   << bound.model << ")");
        }
      }
    }
    MESSAGE(std::string(pair.label) << ": " << cases << " cases, worst |gpu - cpu| / bound = " << worst << paths);
    if (unsupported)
      MESSAGE("not supported: " << std::string(pair.label) << ": " << unsupported << " cases need a CUDA dequantize: "
                                << unsupported_why);
  }
}

// What a BF16 GEMM of the operands would give if nothing caught the inexact values: every
// value of a `truncated` operand cut to BF16 (what the decoders write), exact sums otherwise.
std::vector<float> truncated_product(const Operand& a, bool a_truncated, const Operand& b, bool b_truncated,
                                     std::int64_t m, std::int64_t n, std::int64_t k) {
  // A mask, not a branch around memcpy: GCC 12 -O2 miscompiled that form (it kept the low bits).
  const auto cut = [](float v, bool truncate) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(v) & (truncate ? 0xFFFF0000u : 0xFFFFFFFFu);
    return static_cast<double>(std::bit_cast<float>(u));
  };
  std::vector<float> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t r = 0; r < k; ++r)
        sum += cut(a.decoded[static_cast<std::size_t>(i * k + r)], a_truncated) *
               cut(b.decoded[static_cast<std::size_t>(j * k + r)], b_truncated);
      out[static_cast<std::size_t>(i * n + j)] = static_cast<float>(sum);
    }
  return out;
}

TEST_CASE("GPU emulated GEMMs recompute exactly when BF16 cannot hold the decoded values") {
  // The self-test runs only the host part: that each case can fail.
  if (!shard().first() || (!selftest() && skip_without_cuda())) return;
  struct Case {
    const char* label;
    const char* a_spec;  // nullptr: dense BF16
    float a_magnitude;   // A's source scale
    const char* b_spec;
    float b_magnitude;
    bool inexact_a, inexact_b;  // the operands BF16 cannot hold (the device must recompute)
  };
  // MXFP8 of normals times 2^-136: every block gets E8M0 0x00 (2^-127) and subnormal codes, so
  // the decoded values are multiples of 2^-136, below BF16's grid. B is large (2^110) so that
  // the products are normal FP32 numbers and any rounding of A shows far above the bound.
  // Blockwise without power-of-two scales: q * s carries up to 28 significant bits.
  // The BF16 GEMM still runs for these (the host never waits for the device's check); the
  // exact GEMM then replaces its output. Each inexact case first proves that BF16-truncated
  // operands would fail the bound (so a skipped recomputation cannot pass), then runs every
  // epilogue variant (accumulate reads the output saved before the BF16 GEMM overwrote it).
  const float tiny = std::ldexp(1.0f, -136), huge = std::ldexp(1.0f, 110);
  constexpr const char* kBlockNoPow2 = "{format: blockwise, block: 128x128, pow2_scales: false}";
  const Case cases[] = {
      {"mxfp8 (tiny) x mxfp8 (huge)", kMxfp8, tiny, kMxfp8, huge, true, false},
      {"mxfp8 (huge) x float8 e4m3", kMxfp8, huge, kE4M3, 1.0f, false, false},
      {"float8 e4m3 (huge) x mxfp8 (tiny)", kE4M3, huge, kMxfp8, tiny, false, true},
      {"blockwise 128x128 without pow2 scales x itself", kBlockNoPow2, 1.0f, kBlockNoPow2, 1.0f, true, true},
      {"nvfp4 x blockwise 128x128 without pow2 scales", kNvfp4, 1.0f, kBlockNoPow2, 1.0f, false, true},
      {"bf16 dense x blockwise 128x128 without pow2 scales", nullptr, 1.0f, kBlockNoPow2, 1.0f, false, true},
      {"mxfp8 x mxfp8 (exact, after the misses: a stale flag must not matter)", kMxfp8, 1.0f, kMxfp8, 1.0f,
       false, false},
  };
  // Several 128 x 128 tiles of the exact GEMM with partial ones; rows that are not whole
  // 8-element units (columnwise 100 and 300) take the one-element decoder.
  const Shape shapes[] = {{128, 256, 512}, {100, 72, 200}, {300, 200, 136}};
  for (const Case& cs : cases) {
    const bool checked = (cs.a_spec && std::string(cs.a_spec).find("nvfp4") == std::string::npos &&
                          std::string(cs.a_spec) != kE4M3) ||
                         (cs.b_spec && std::string(cs.b_spec).find("nvfp4") == std::string::npos &&
                          std::string(cs.b_spec) != kE4M3);
    for (const Shape& shape : shapes) {
      for (const Kind& kind : kKinds) {
        CAPTURE(std::string(cs.label));
        CAPTURE(std::string(gemm_kind_name(kind.kind)));
        CAPTURE(shape.m);
        const std::uint64_t seed = static_cast<std::uint64_t>(shape.m * 31 + shape.k) ^
                                   (static_cast<std::uint64_t>(kind.kind) << 40);
        const Operand a = make_operand(cs.a_spec, kind.a, shape.m, shape.k, seed, cs.a_magnitude);
        const Operand b = make_operand(cs.b_spec, kind.b, shape.n, shape.k, seed + 1, cs.b_magnitude);
        const auto mn = static_cast<std::size_t>(shape.m * shape.n);
        const Variant plain{"f32", DType::f32, 1.0f, false, false};
        const std::vector<float> none(mn, 0.0f);
        if (cs.inexact_a || cs.inexact_b) {
          // The case must be able to fail: BF16-truncated operands miss the bound.
          Tensor ref(DType::f32, {shape.m, shape.n});
          std::memset(ref.view().data(), 0, mn * 4);
          qrecipe::gemm(a.cpu(), b.cpu(), ref.view(), GemmOptions{});
          const Comparison t = compare(output_values(ref.view()),
                                       truncated_product(a, cs.inexact_a, b, cs.inexact_b, shape.m, shape.n, shape.k),
                                       none, none, a, b, shape.m, shape.n,
                                       bound_for(GemmPlan{Path::emulated, false, ""}, shape.k), plain);
          const bool discriminates = t.failures > 0 || t.frobenius > std::ldexp(1.0, -12);
          REQUIRE_MESSAGE(discriminates,
                          "BF16-truncated operands pass the bound: the case proves nothing (worst "
                              << t.worst_ratio << ", Frobenius " << t.frobenius << ")");
        }
        if (selftest()) continue;
        for (const Variant& v : kVariants) {
          CAPTURE(std::string(v.label));
          std::vector<float> out0 = random_normal(mn, seed + 2);
          std::vector<float> bias = random_normal(static_cast<std::size_t>(shape.n), seed + 3);
          // Keep the old output and the bias at the product's scale, so that they do not hide it.
          Tensor cpu_probe(DType::f32, {shape.m, shape.n});
          std::memset(cpu_probe.view().data(), 0, mn * 4);
          qrecipe::gemm(a.cpu(), b.cpu(), cpu_probe.view(), GemmOptions{});
          double scale = 0;
          for (const float x : output_values(cpu_probe.view())) scale = std::max(scale, std::fabs(static_cast<double>(x)));
          for (auto& x : out0) x = static_cast<float>(x * scale);
          for (auto& x : bias) x = static_cast<float>(x * scale);
          auto [cpu_out, gpu_out, bias_host, bias_dev] = epilogue_inputs(v.out, v.bias_dtype, shape, out0, bias);
          GemmOptions o;
          o.kind = kind.kind;
          o.alpha = v.alpha;
          o.accumulate = v.accumulate;
          o.bias = v.bias ? bias_host.view().data() : nullptr;
          o.bias_dtype = v.bias_dtype;
          qrecipe::gemm(a.cpu(), b.cpu(), cpu_out.view(), o);
          o.bias = v.bias ? bias_dev.view().data() : nullptr;
          const GemmPlan plan = qrecipe::gemm(a.gpu(), b.gpu(), gpu_out.view(), o);
          qrecipe::synchronize(Device::cuda(0));
          REQUIRE(plan.path == Path::emulated);
          CHECK_MESSAGE(plan.reason.find("decoded to bf16") != std::string::npos, "plan: ", plan.str());
          const bool says_checked = plan.reason.find("checked on the device") != std::string::npos;
          CHECK_MESSAGE(says_checked == checked,
                        "plan: ", plan.str());
          const auto cpu = output_values(cpu_out.view());
          double ref2 = 0;
          for (const float x : cpu) ref2 += static_cast<double>(x) * x;
          CHECK_MESSAGE(ref2 > 0, "the reference product must not vanish (the case would prove nothing)");
          const Comparison c = compare(cpu, output_values(gpu_out.view()), out0, bias, a, b, shape.m, shape.n,
                                       bound_for(plan, shape.k), v);
          CHECK_MESSAGE(c.failures == 0, c.failures << " elements outside the bound; first " << c.first);
          if (v.out == DType::f32)
            CHECK_MESSAGE(c.frobenius <= std::ldexp(1.0, -12), "relative Frobenius error " << c.frobenius);
        }
      }
    }
  }
}

TEST_CASE("GPU emulated GEMMs on kept and one-pass decoded operands equal fresh decodes, bit for bit") {
  // docs/gemm.md, "Decoded operands": an operand whose tensor keeps its decoded copy
  // (QuantizedTensor::set_keep_decoded, the adapter's cached weight) is decoded by the first
  // GEMM and reused by later ones; one quantized by Quantizer::quantize_decoded has the copy
  // written by the plugin's quantize kernel (QR_EXTRA_QUANTIZE_DECODED; mxfp8) or by the first
  // GEMM (formats without it). Either way every output equals the GEMM of a fresh decode bit
  // for bit, including operands BF16 cannot hold (the kept miss word makes the GEMM recompute).
  if (!shard().first() || skip_without_cuda()) return;
  struct Case {
    const char* label;
    const char* a_spec;
    float a_magnitude;
    const char* b_spec;
    float b_magnitude;
    bool one_pass_served;  // both operands' plugins fuse quantize and decode on CUDA
  };
  const float tiny = std::ldexp(1.0f, -136), huge = std::ldexp(1.0f, 110);
  const Case cases[] = {
      {"mxfp8 x mxfp8", kMxfp8, 1.0f, kMxfp8, 1.0f, true},
      {"mxfp8 (tiny: misses) x mxfp8 (huge)", kMxfp8, tiny, kMxfp8, huge, true},
      {"nvfp4 x nvfp4", kNvfp4, 1.0f, kNvfp4, 1.0f, false},
      {"mxfp8 x float8 e4m3", kMxfp8, 1.0f, kE4M3, 1.0f, false},
  };
  const Shape shapes[] = {{128, 256, 512}, {100, 72, 200}};
  const Variant variants[] = {kVariants[0], kVariants[2]};
  for (const Case& cs : cases) {
    for (const Shape& shape : shapes) {
      for (const Kind& kind : kKinds) {
        CAPTURE(std::string(cs.label));
        CAPTURE(std::string(gemm_kind_name(kind.kind)));
        CAPTURE(shape.m);
        const std::uint64_t seed = static_cast<std::uint64_t>(shape.m * 37 + shape.k) ^
                                   (static_cast<std::uint64_t>(kind.kind) << 40);
        const Operand a = make_operand(cs.a_spec, kind.a, shape.m, shape.k, seed, cs.a_magnitude);
        const Operand b = make_operand(cs.b_spec, kind.b, shape.n, shape.k, seed + 1, cs.b_magnitude);
        // Kept copies: the same bytes uploaded again, with keeping on.
        QuantizedTensor ka = upload(a.cpu_q), kb = upload(b.cpu_q);
        ka.set_keep_decoded(true);
        kb.set_keep_decoded(true);
        // One pass: the sources quantized on the device both ways.
        auto device_source = [&](const Operand& op, std::int64_t outer, std::int64_t inner, std::uint64_t sd,
                                 float magnitude) {
          const bool rowwise = op.direction == QR_DIRECTION_ROWWISE;
          const std::int64_t rows = rowwise ? outer : inner, cols = rowwise ? inner : outer;
          std::vector<float> src = random_normal(static_cast<std::size_t>(rows * cols), sd);
          for (auto& x : src) x = x * magnitude;
          Tensor host(DType::f32, {rows, cols});
          std::memcpy(host.view().data(), src.data(), src.size() * 4);
          return to_device(host);
        };
        const Tensor sa = device_source(a, shape.m, shape.k, seed, cs.a_magnitude);
        const Tensor sb = device_source(b, shape.n, shape.k, seed + 1, cs.b_magnitude);
        const std::uint32_t ua = qrecipe::usage_bit(kind.a), ub = qrecipe::usage_bit(kind.b);
        const QuantizedTensor pa = a.quantizer->quantize(sa.view(), ua, {}, target_allocator());
        const QuantizedTensor pb = b.quantizer->quantize(sb.view(), ub, {}, target_allocator());
        const QuantizedTensor fa = a.quantizer->quantize_decoded(sa.view(), ua, ua, {}, target_allocator());
        const QuantizedTensor fb = b.quantizer->quantize_decoded(sb.view(), ub, ub, {}, target_allocator());
        if (cs.one_pass_served) {
          CHECK_MESSAGE(fa.decoded(kind.a).values != nullptr, "the plugin's kernel wrote no decoded copy");
          CHECK_MESSAGE(fb.decoded(kind.b).values != nullptr, "the plugin's kernel wrote no decoded copy");
        }
        for (const Variant& v : variants) {
          CAPTURE(std::string(v.label));
          const auto mn = static_cast<std::size_t>(shape.m * shape.n);
          std::vector<float> out0 = random_normal(mn, seed + 2);
          std::vector<float> bias = random_normal(static_cast<std::size_t>(shape.n), seed + 3);
          GemmOptions o;
          o.kind = kind.kind;
          o.alpha = v.alpha;
          o.accumulate = v.accumulate;
          o.bias_dtype = v.bias_dtype;
          auto run = [&](const GemmOperand& x, const GemmOperand& y) {
            auto [cpu_out, gpu_out, bias_host, bias_dev] = epilogue_inputs(v.out, v.bias_dtype, shape, out0, bias);
            o.bias = v.bias ? bias_dev.view().data() : nullptr;
            qrecipe::gemm(x, y, gpu_out.view(), o);
            qrecipe::synchronize(Device::cuda(0));
            std::vector<std::uint8_t> bytes(static_cast<std::size_t>(gpu_out.view().nbytes()));
            qrecipe::copy_to_host(bytes.data(), gpu_out.view().data(), bytes.size());
            return bytes;
          };
          const auto fresh = run(a.gpu(), b.gpu());
          for (int micro = 0; micro < 3; ++micro) {
            CAPTURE(micro);
            CHECK(run(GemmOperand::quantized(ka, *a.quantizer, kind.a),
                      GemmOperand::quantized(kb, *b.quantizer, kind.b)) == fresh);
            CHECK(ka.decoded(kind.a).values != nullptr);
          }
          const auto plain = run(GemmOperand::quantized(pa, *a.quantizer, kind.a),
                                 GemmOperand::quantized(pb, *b.quantizer, kind.b));
          CHECK(run(GemmOperand::quantized(fa, *a.quantizer, kind.a),
                    GemmOperand::quantized(fb, *b.quantizer, kind.b)) == plain);
        }
      }
    }
  }
}

TEST_CASE("GPU GEMM edge cases: K = 0 (epilogue only) and empty outputs") {
  if (!shard().first() || skip_without_cuda()) return;
  // Dense BF16 operands [3, 0] x [2, 0]: out = alpha * 0 + out + bias.
  Tensor a(DType::bf16, {3, 0}, Device::cuda(0), qrecipe::cuda_allocator());
  Tensor b(DType::bf16, {2, 0}, Device::cuda(0), qrecipe::cuda_allocator());
  Tensor out_host(DType::f32, {3, 2});
  for (int i = 0; i < 6; ++i) out_host.data_as<float>()[i] = static_cast<float>(i);
  Tensor out = to_device(out_host);
  Tensor bias_host(DType::f32, {2});
  bias_host.data_as<float>()[0] = 10.0f;
  bias_host.data_as<float>()[1] = 20.0f;
  Tensor bias = to_device(bias_host);
  GemmOptions o;
  o.accumulate = true;
  o.bias = bias.data_as<float>();
  qrecipe::gemm(GemmOperand::dense(a.view(), QR_DIRECTION_ROWWISE),
                GemmOperand::dense(b.view(), QR_DIRECTION_ROWWISE), out.view(), o);
  const auto got = output_values(out.view());
  // out[i][j] = 0 + (2i + j) + bias[j]: {10, 21, 12, 23, 14, 25}.
  const float want[6] = {10, 21, 12, 23, 14, 25};
  for (int i = 0; i < 6; ++i) CHECK(got[static_cast<std::size_t>(i)] == want[i]);
  // The same with a BF16 bias (10 and 20 are exact in BF16), from the same initial output.
  Tensor out_b = to_device(out_host);
  Tensor bias16_host(DType::bf16, {2});
  bias16_host.data_as<std::uint16_t>()[0] = qrecipe::num::f32_to_bf16(10.0f);
  bias16_host.data_as<std::uint16_t>()[1] = qrecipe::num::f32_to_bf16(20.0f);
  Tensor bias16 = to_device(bias16_host);
  o.bias = bias16.view().data();
  o.bias_dtype = DType::bf16;
  qrecipe::gemm(GemmOperand::dense(a.view(), QR_DIRECTION_ROWWISE),
                GemmOperand::dense(b.view(), QR_DIRECTION_ROWWISE), out_b.view(), o);
  const auto got_b = output_values(out_b.view());
  for (int i = 0; i < 6; ++i) CHECK(got_b[static_cast<std::size_t>(i)] == want[i]);
  // An empty output does nothing and does not fail.
  Tensor a0(DType::bf16, {0, 16}, Device::cuda(0), qrecipe::cuda_allocator());
  Tensor b0(DType::bf16, {4, 16}, Device::cuda(0), qrecipe::cuda_allocator());
  Tensor out0(DType::f32, {0, 4}, Device::cuda(0), qrecipe::cuda_allocator());
  CHECK_NOTHROW(qrecipe::gemm(GemmOperand::dense(a0.view(), QR_DIRECTION_ROWWISE),
                              GemmOperand::dense(b0.view(), QR_DIRECTION_ROWWISE), out0.view()));
}

TEST_CASE("GPU GEMM errors: mixed devices and a host bias never fall back to the CPU") {
  if (!shard().first() || skip_without_cuda()) return;
  Tensor a(DType::bf16, {16, 16}, Device::cuda(0), qrecipe::cuda_allocator());
  Tensor b_host(DType::bf16, {16, 16});
  Tensor out(DType::f32, {16, 16}, Device::cuda(0), qrecipe::cuda_allocator());
  try {
    qrecipe::gemm(GemmOperand::dense(a.view(), QR_DIRECTION_ROWWISE),
                  GemmOperand::dense(b_host.view(), QR_DIRECTION_ROWWISE), out.view());
    FAIL("expected an error for operands on cuda:0 and cpu");
  } catch (const qrecipe::Error& e) {
    CHECK(e.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(e.what()).find("one device") != std::string::npos);
  }
  Tensor b(DType::bf16, {16, 16}, Device::cuda(0), qrecipe::cuda_allocator());
  std::vector<float> host_bias(16, 1.0f);
  GemmOptions o;
  o.bias = host_bias.data();
  CHECK_THROWS_WITH_AS(qrecipe::gemm(GemmOperand::dense(a.view(), QR_DIRECTION_ROWWISE),
                                     GemmOperand::dense(b.view(), QR_DIRECTION_ROWWISE), out.view(), o),
                       doctest::Contains("device memory"), qrecipe::Error);
}
