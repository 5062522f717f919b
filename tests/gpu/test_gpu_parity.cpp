// GPU == CPU, bit for bit (docs/architecture.md, "How CUDA and the CPU agree"): for every format
// whose plugin supports CUDA and every option set listed below, quantize the same inputs with the
// CPU reference and with the CUDA kernels, copy every GPU buffer back and require byte equality;
// the same for dequantize (f32 and bf16 outputs) and for the delayed-scaling state after each
// update.
//
// Map
//   1. what is covered: option sets per format, shapes, input kinds, usages
//   2. host helpers: inputs, device copies, byte comparison with a readable first mismatch
//   3. one case: quantize both ways, compare every buffer, dequantize both ways, compare
//   4. the test cases (CUDA runtime smoke test, the parity sweep)
//
// Without a usable CUDA device (CI on a CPU machine, or a GPU build on a machine without a
// driver) the sweep prints "not supported: no CUDA device" and passes. Setting
// QRECIPE_GPU_PARITY_SELFTEST=1 on such a machine runs the whole sweep with the "device" side
// on the CPU too: it checks the harness itself (inputs, comparisons, delayed-state flow), not
// the kernels.
//
// How to add a format: add its option sets to kOptionSets (YAML quantizer specs). A format
// that supports CUDA but has no option set here is tested with its default spec, and is a
// failure if that default spec is not valid (so a new CUDA format cannot go untested).
#include <doctest/doctest.h>

#include <array>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/tensor.hpp"

using qrecipe::Device;
using qrecipe::DType;
using qrecipe::Engine;
using qrecipe::QuantizedTensor;
using qrecipe::QuantizeOptions;
using qrecipe::Quantizer;
using qrecipe::QuantizerRole;
using qrecipe::Recipe;
using qrecipe::Tensor;
using qrecipe::TensorView;

namespace {

// ---------------------------------------------------------------- 1. coverage

struct OptionSet {
  const char* format;
  const char* label;
  const char* spec_yaml;  // a quantizer spec, as a recipe writes it
  // Inputs the option set accepts (its CPU reference refuses the others); null: all.
  bool (*accepts)(std::int64_t rows, std::int64_t cols, DType src) = nullptr;
};

// nvfp4 hadamard transforms runs of 16 rows of bf16 sources.
bool nvfp4_hadamard_input(std::int64_t rows, std::int64_t, DType src) {
  return src == DType::bf16 && rows % 16 == 0;
}

// Option sets by format name. Delayed scaling uses a short history so that the updates run
// between cases move the scale (the state is compared after every update).
const OptionSet kOptionSets[] = {
    {"float8", "current_e4m3", "{format: float8, scaling: current, dtype: e4m3}"},
    {"float8", "current_e5m2", "{format: float8, scaling: current, dtype: e5m2}"},
    {"float8", "pow2", "{format: float8, scaling: current, dtype: e4m3, pow2_scales: true}"},
    // 100 is above the amax of the normal inputs (so the epsilon decides the scale) and below
    // that of the outlier inputs (so it does not).
    {"float8", "amax_epsilon",
     "{format: float8, scaling: current, dtype: e5m2, amax_epsilon: 100}"},
    {"float8", "delayed",
     "{format: float8, scaling: delayed, dtype: e4m3, amax_history_len: 4, margin: 1}"},
    {"mxfp8", "e4m3", "{format: mxfp8, dtype: e4m3}"},
    {"mxfp8", "e5m2", "{format: mxfp8, dtype: e5m2}"},
    {"blockwise", "1x128_pow2", "{format: blockwise, block: 1x128, pow2_scales: true}"},
    {"blockwise", "1x128_no_pow2", "{format: blockwise, block: 1x128, pow2_scales: false}"},
    {"blockwise", "128x128", "{format: blockwise, block: 128x128}"},
    // As for float8: 100 decides the scale of normal blocks, not of outlier ones; with
    // 128x128 and no pow2 it also covers that pair.
    {"blockwise", "128x128_amax_epsilon",
     "{format: blockwise, block: 128x128, pow2_scales: false, amax_epsilon: 100}"},
    // Both float8: the columnwise side's cast + transpose also writes the rowwise e4m3 cast
    // (one read after the rowwise side's amax pass) for bf16 / f16 sources.
    {"hybrid", "float8_e4m3_rows_e5m2_cols",
     "{format: hybrid, rowwise: {format: float8, dtype: e4m3}, "
     "columnwise: {format: float8, dtype: e5m2, pow2_scales: true}}"},
    // The shipped hybrid pairs of recipes/hybrid_*.yaml with columnwise_source: input. Both
    // directions of a bf16 source take the one-read path (float8's prepare_tensor_cast, the
    // other side's quantize_with_tensor_cast); f32 sources and single directions the two calls.
    {"hybrid", "float8_rows_mxfp8_cols",  // hybrid_fp8_mx inputs and gradients, hybrid_seed weights
     "{format: hybrid, rowwise: {format: float8, scaling: current}, columnwise: {format: mxfp8}}"},
    {"hybrid", "float8_rows_nvfp4_cols",  // hybrid_seed inputs
     "{format: hybrid, rowwise: {format: float8, scaling: current, dtype: e4m3}, "
     "columnwise: {format: nvfp4}}"},
    // nvfp4's columnwise kernel with the e5m2 tensor cast (quantize_16bit_kernel<CastE5M2>).
    {"hybrid", "float8_e5m2_rows_nvfp4_cols",
     "{format: hybrid, rowwise: {format: float8, scaling: current, dtype: e5m2}, "
     "columnwise: {format: nvfp4}}"},
    {"hybrid", "mxfp8_e5m2_rows_nvfp4_cols",  // hybrid_seed gradients (two calls: no tensor cast)
     "{format: hybrid, rowwise: {format: mxfp8, dtype: e5m2}, columnwise: {format: nvfp4}}"},
    // The cast's scale rule with pow2 and epsilon, into e5m2 codes.
    {"hybrid", "float8_e5m2_pow2_eps_rows_mxfp8_cols",
     "{format: hybrid, rowwise: {format: float8, dtype: e5m2, pow2_scales: true, "
     "amax_epsilon: 100}, columnwise: {format: mxfp8, dtype: e5m2}}"},
    // columnwise_source: rowwise_dequantized: the columnwise side is quantized on the device
    // from the device decode of the rowwise side (FP32 scratch), as the CPU path does.
    {"hybrid", "float8_rows_mxfp8_cols_dequantized",  // recipes/hybrid_fp8_mx.yaml's weights
     "{format: hybrid, rowwise: {format: float8, scaling: current}, columnwise: {format: mxfp8}, "
     "columnwise_source: rowwise_dequantized}"},
    {"hybrid", "blockwise_1x128_rows_nvfp4_cols_dequantized",
     "{format: hybrid, rowwise: {format: blockwise, block: 1x128}, columnwise: {format: nvfp4}, "
     "columnwise_source: rowwise_dequantized}"},
    {"hybrid", "nvfp4_2d_rows_float8_delayed_cols_dequantized",
     "{format: hybrid, rowwise: {format: nvfp4, 2d: true}, columnwise: {format: float8, "
     "scaling: delayed, amax_history_len: 4}, columnwise_source: rowwise_dequantized}"},
    {"nvfp4", "default", "{format: nvfp4}"},
    {"nvfp4", "2d", "{format: nvfp4, 2d: true}"},
    {"nvfp4", "stochastic_rounding", "{format: nvfp4, stochastic_rounding: true, seed: 1234}"},
    {"nvfp4", "hadamard", "{format: nvfp4, hadamard: true}", nvfp4_hadamard_input},
    {"nvfp4", "2d_stochastic_rounding",
     "{format: nvfp4, 2d: true, stochastic_rounding: true, seed: -7}"},
};

struct Shape {
  std::int64_t rows, cols;
};
// {144, 99}: partial 64-row tiles with whole 16-row blocks (M % 16 == 0, for nvfp4 hadamard).
// {2192, 3072}: more tiles than a persistent grid holds on a 132-SM GPU (432 of blockwise's
// 128 x 128 against 2 CTAs an SM, 840 of nvfp4's 64 x 128 against up to 5), so CTAs loop and
// prefetch; aligned, with a last row of partial tiles (2192 = 17 x 128 + 16 = 34 x 64 + 16)
// the loop reaches after interior ones, and M % 16 == 0 for nvfp4 hadamard.
const Shape kShapes[] = {{1, 1},      {1, 17},     {31, 33},     {128, 128},
                         {129, 257},  {256, 1024}, {1000, 999},  {4096, 4096},
                         {0, 16},     {144, 99},   {2192, 3072}};

// Inputs: `normal` N(0,1); `outliers` N(0,1) with one element in 997 scaled by 1000;
// `special` N(0,1) with NaN, +-0 and f32/bf16 denormals sprinkled in (amax stays finite);
// `inf` the same plus +-inf (amax is inf: the scale falls back to 1).
enum class Kind { normal, outliers, special, inf };
const Kind kKinds[] = {Kind::normal, Kind::outliers, Kind::special, Kind::inf};
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::normal: return "normal";
    case Kind::outliers: return "outliers";
    case Kind::special: return "special";
    default: return "inf";
  }
}

// The CPU reference of a 4096x4096 tensor takes a while: there only f32 outliers and bf16
// normal run (each source dtype once, and both ways the scale is decided); special values
// and the other combinations are covered by every smaller shape. Up to 2^23 elements (the
// looping persistent grids of the 16-bit kernels) bf16 special runs too, so NaN reaches the
// prefetched tiles of a looping CTA.
bool runs(const Shape& s, DType src, Kind k) {
  if (s.rows * s.cols <= (1 << 20)) return true;
  if (s.rows * s.cols <= (1 << 23) && src == DType::bf16 && k == Kind::special) return true;
  return (src == DType::f32 && k == Kind::outliers) || (src == DType::bf16 && k == Kind::normal);
}

constexpr std::uint32_t kUsages[] = {QR_USAGE_ROWWISE, QR_USAGE_COLUMNWISE,
                                     QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE};
constexpr DType kSourceDTypes[] = {DType::f32, DType::bf16};

// The failures reported in full before the sweep stops (a broken kernel would otherwise print
// thousands of identical mismatches).
constexpr int kMaxReportedFailures = 40;

// ---------------------------------------------------------------- 2. host helpers

std::shared_ptr<qrecipe::Registry> registry() {
  static const auto reg = std::make_shared<qrecipe::Registry>();
  return reg;
}

const QuantizerRole kRole{"linear", "input", "gpu_parity"};

bool selftest_requested() {
  const char* v = std::getenv("QRECIPE_GPU_PARITY_SELFTEST");
  return v != nullptr && std::string(v) == "1";
}

// QRECIPE_GPU_PARITY_ONLY="mxfp8,nvfp4/2d": sweep only these formats ("format") or option
// sets ("format/label"), so a GPU run can check a few formats, or split the sweep over
// parallel processes. Unset or empty: everything.
bool selected(const std::string& format, const std::string& label) {
  const char* v = std::getenv("QRECIPE_GPU_PARITY_ONLY");
  if (v == nullptr || *v == '\0') return true;
  std::string list = std::string(",") + v + ",";
  return list.find("," + format + ",") != std::string::npos ||
         list.find("," + format + "/" + label + ",") != std::string::npos;
}

// Where the "device" side of the comparison runs: CUDA, or the CPU in self-test mode.
struct Target {
  Device device;
  std::shared_ptr<qrecipe::Allocator> allocator;
};

std::vector<float> make_values(const Shape& s, Kind kind) {
  const std::int64_t n = s.rows * s.cols;
  std::mt19937_64 rng(0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(s.rows * 131 + s.cols) ^
                      (static_cast<std::uint64_t>(kind) << 40));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  if (kind == Kind::outliers)
    for (std::int64_t i = 5; i < n; i += 997) v[i] *= 1000.0f;
  if (kind == Kind::special || kind == Kind::inf) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // 1e-40 and 1.4e-45 are f32 denormals; 3e-39 is a bf16 denormal too; 2^-10 is an E4M3
    // denormal step and 2^-17 below the smallest E5M2 denormal once scaled by ~100.
    std::vector<float> specials = {nan,    -nan,   0.0f,  -0.0f, 1e-40f, -1.4e-45f,
                                   3e-39f, -3e-39f, FLT_MIN, std::ldexp(1.0f, -10),
                                   -std::ldexp(1.0f, -17)};
    if (kind == Kind::inf) specials.insert(specials.end(), {inf, -inf});
    std::size_t next = 0;
    for (std::int64_t i = 1; i < n; i += 5) v[i] = specials[next++ % specials.size()];
    if (n == 1) v[0] = kind == Kind::inf ? inf : nan;  // a 1x1 input is the special value
  }
  return v;
}

// A host tensor of `dtype` holding `values` (rounded to bf16 for bf16 sources).
Tensor host_source(const std::vector<float>& values, const Shape& s, DType dtype) {
  Tensor t(dtype, {s.rows, s.cols});
  if (dtype == DType::f32) {
    if (!values.empty()) std::memcpy(t.data_as<float>(), values.data(), values.size() * 4);
  } else {
    auto* p = t.data_as<std::uint16_t>();
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = qrecipe::num::f32_to_bf16(values[i]);
  }
  return t;
}

std::size_t view_bytes(const TensorView& v) { return static_cast<std::size_t>(v.nbytes()); }

// A copy of `host` on the target.
Tensor to_target(const Tensor& host, const Target& target) {
  Tensor t(host.view().dtype(), host.shape(), target.device, target.allocator);
  const std::size_t bytes = view_bytes(host.view());
  if (target.device.is_cuda())
    qrecipe::copy_to_device(t.view().data(), host.view().data(), bytes);
  else if (bytes)
    std::memcpy(t.view().data(), host.view().data(), bytes);
  return t;
}

// The bytes of any view, wherever it lives.
std::vector<std::uint8_t> host_bytes(const TensorView& v) {
  std::vector<std::uint8_t> out(view_bytes(v));
  if (out.empty()) return out;
  if (v.device().is_cuda())
    qrecipe::copy_to_host(out.data(), v.data(), out.size());
  else
    std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string hex(const std::uint8_t* p, int n) {  // little-endian element as 0x...
  std::string s = "0x";
  char buf[3];
  for (int i = n - 1; i >= 0; --i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    s += buf;
  }
  return s;
}

std::string float_str(float f) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

// One element of a buffer, decoded where the dtype is a float type: "1.5 (0x3fc00000)".
std::string element_str(DType t, const std::uint8_t* p) {
  namespace num = qrecipe::num;
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return float_str(f) + " (" + hex(p, 4) + ")";
    }
    case DType::bf16: {
      std::uint16_t u;
      std::memcpy(&u, p, 2);
      return float_str(num::bf16_to_f32(u)) + " (" + hex(p, 2) + ")";
    }
    case DType::e4m3: return float_str(num::e4m3_to_f32(*p)) + " (" + hex(p, 1) + ")";
    case DType::e5m2: return float_str(num::e5m2_to_f32(*p)) + " (" + hex(p, 1) + ")";
    case DType::e8m0: return "2^" + std::to_string(static_cast<int>(*p) - 127) + " (" + hex(p, 1) + ")";
    default: return hex(p, 1);  // e2m1 (two per byte), u8
  }
}

// Empty when equal; otherwise how many bytes differ and the first difference, located as an
// element [row, col] of the buffer's shape with both values decoded.
std::string compare_bytes(const std::vector<std::uint8_t>& cpu, const std::vector<std::uint8_t>& gpu,
                          const TensorView& layout_view) {
  if (cpu.size() != gpu.size())
    return "sizes differ: cpu " + std::to_string(cpu.size()) + " bytes, gpu " +
           std::to_string(gpu.size()) + " bytes";
  std::size_t first = cpu.size(), count = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      if (first == cpu.size()) first = i;
      ++count;
    }
  }
  if (count == 0) return "";
  const DType t = layout_view.dtype();
  const int bits = qrecipe::dtype_bits(t);
  const std::size_t elem_bytes = bits >= 8 ? static_cast<std::size_t>(bits / 8) : 1;
  const std::size_t elem_start = first - first % elem_bytes;
  const std::int64_t cols = layout_view.cols();
  const std::int64_t row_bytes = qrecipe::storage_bytes(t, 1, cols);
  const std::int64_t r = row_bytes > 0 ? static_cast<std::int64_t>(first) / row_bytes : 0;
  const std::int64_t c_byte = row_bytes > 0 ? static_cast<std::int64_t>(first) % row_bytes : 0;
  std::ostringstream os;
  os << count << " of " << cpu.size() << " bytes differ; first at byte " << first << " = "
     << (bits == 4 ? "elements [" : "element [") << r << ", "
     << (bits == 4 ? std::to_string(c_byte * 2) + ".." + std::to_string(c_byte * 2 + 1)
                   : std::to_string(c_byte / static_cast<std::int64_t>(elem_bytes)))
     << "] of " << std::string(qrecipe::dtype_name(t)) << layout_view.shape_str()
     << ": cpu " << element_str(t, cpu.data() + elem_start) << ", gpu "
     << element_str(t, gpu.data() + elem_start);
  return os.str();
}

struct Tally {
  int cases = 0, buffers = 0, failures = 0;
};

// Records one comparison; returns false once too many failures were reported.
bool expect_equal(Tally& tally, const std::string& what, const std::vector<std::uint8_t>& cpu,
                  const std::vector<std::uint8_t>& gpu, const TensorView& layout_view) {
  ++tally.buffers;
  const std::string diff = compare_bytes(cpu, gpu, layout_view);
  if (diff.empty()) return true;
  ++tally.failures;
  FAIL_CHECK(what << ": " << diff);
  return tally.failures < kMaxReportedFailures;
}

// The delayed-scaling states of an engine as host floats: history, then scale, scale_inv.
std::vector<std::vector<float>> state_values(const Engine& e) {
  std::vector<std::vector<float>> out;
  for (const auto& s : e.scaling_states()) {
    const auto n = static_cast<std::size_t>(s->c.history_len);
    std::vector<float> v(n + 2);
    if (s->c.device.type == QR_DEVICE_CUDA) {
      qrecipe::copy_to_host(v.data(), s->c.amax_history, n * 4);
      qrecipe::copy_to_host(&v[n], s->c.scale, 4);
      qrecipe::copy_to_host(&v[n + 1], s->c.scale_inv, 4);
    } else {
      std::memcpy(v.data(), s->c.amax_history, n * 4);
      v[n] = *s->c.scale;
      v[n + 1] = *s->c.scale_inv;
    }
    out.push_back(std::move(v));
  }
  return out;
}

// ---------------------------------------------------------------- 3. one case

struct Sides {
  std::unique_ptr<Engine> cpu_engine, gpu_engine;
  std::shared_ptr<Quantizer> cpu, gpu;
};

Sides make_sides(const std::string& spec_yaml) {
  const std::string yaml = "version: 1\nname: gpu-parity\ndefaults: " + spec_yaml + "\n";
  Sides s;
  s.cpu_engine = std::make_unique<Engine>(Recipe::parse(yaml, "gpu-parity"), registry());
  s.gpu_engine = std::make_unique<Engine>(Recipe::parse(yaml, "gpu-parity"), registry());
  s.cpu = s.cpu_engine->resolve(kRole);
  s.gpu = s.gpu_engine->resolve(kRole);
  return s;
}

// Quantizes `host` on the CPU and `dev` on the target with `usage`; compares every buffer of
// every direction, then dequantizes each direction both ways (f32 and bf16) and compares.
// Returns false when the failure budget is spent.
bool run_case(Sides& sides, const Tensor& host, const Tensor& dev, std::uint32_t usage,
              const Target& target, const std::string& what, Tally& tally) {
  ++tally.cases;
  const QuantizedTensor ref = sides.cpu->quantize(host.view(), usage);
  const QuantizedTensor got = sides.gpu->quantize(dev.view(), usage, {}, target.allocator);
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & qrecipe::usage_bit(d))) continue;
    const std::string dir = what + " | " + qrecipe::direction_name(d);
    REQUIRE(got.has(d));
    if (!expect_equal(tally, dir + " data", host_bytes(ref.data(d)), host_bytes(got.data(d)),
                      ref.data(d)))
      return false;
    if (ref.direction(d).scale_inv.data != nullptr &&
        !expect_equal(tally, dir + " scale_inv", host_bytes(ref.scale_inv(d)),
                      host_bytes(got.scale_inv(d)), ref.scale_inv(d)))
      return false;
    if (ref.has_amax(d)) {
      const TensorView ra(ref.direction(d).amax), ga(got.direction(d).amax);
      if (!expect_equal(tally, dir + " amax", host_bytes(ra), host_bytes(ga), ra)) return false;
    }
    // Dequantize: CPU decode of the CPU bytes vs the target's decode of its own bytes.
    for (const DType out_dtype : {DType::f32, DType::bf16}) {
      Tensor ref_out(out_dtype, {ref.rows(), ref.cols()});
      sides.cpu->dequantize(ref, d, ref_out.view());
      Tensor got_out(out_dtype, {ref.rows(), ref.cols()}, target.device, target.allocator);
      sides.gpu->dequantize(got, d, got_out.view());
      if (!expect_equal(tally,
                        dir + " dequantize to " + std::string(qrecipe::dtype_name(out_dtype)),
                        host_bytes(ref_out.view()), host_bytes(got_out.view()), ref_out.view()))
        return false;
    }
  }
  return true;
}

// After the cases of one input: the step's amaxes and, after update_scaling, the whole
// delayed-scaling state must agree (a no-op for formats without state).
bool compare_and_update_states(Sides& sides, const std::string& what, Tally& tally) {
  const std::vector<float> a = sides.cpu_engine->current_amaxes();
  const std::vector<float> b = sides.gpu_engine->current_amaxes();
  REQUIRE(a.size() == b.size());
  if (a.empty()) return true;
  sides.cpu_engine->update_scaling();
  sides.gpu_engine->update_scaling();
  const auto sa = state_values(*sides.cpu_engine), sb = state_values(*sides.gpu_engine);
  for (std::size_t i = 0; i < sa.size(); ++i) {
    const auto to_bytes = [](const std::vector<float>& v) {
      std::vector<std::uint8_t> out(v.size() * 4);
      if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
      return out;
    };
    const std::vector<float> amax_a{a[i]}, amax_b{b[i]};
    const TensorView scalar(nullptr, DType::f32, {1});
    const TensorView state_view(nullptr, DType::f32,
                                {static_cast<std::int64_t>(sa[i].size())});
    if (!expect_equal(tally, what + " | scaling state " + std::to_string(i) + " step amax",
                      to_bytes(amax_a), to_bytes(amax_b), scalar) ||
        !expect_equal(tally,
                      what + " | scaling state " + std::to_string(i) +
                          " after update (history..., scale, scale_inv)",
                      to_bytes(sa[i]), to_bytes(sb[i]), state_view))
      return false;
  }
  return true;
}

std::vector<OptionSet> option_sets_for(const qrecipe::FormatPlugin& plugin) {
  std::vector<OptionSet> out;
  for (const auto& set : kOptionSets)
    if (plugin.name() == set.format) out.push_back(set);
  return out;
}

// The whole sweep for one format; false when the failure budget is spent.
bool sweep_format(const qrecipe::FormatPlugin& plugin, const Target& target, Tally& tally) {
  std::vector<OptionSet> sets = option_sets_for(plugin);
  std::string default_spec;  // kept alive for the OptionSet pointers below
  if (sets.empty()) {
    default_spec = "{format: " + plugin.name() + "}";
    sets.push_back({plugin.name().c_str(), "defaults", default_spec.c_str()});
  }
  for (const OptionSet& set : sets) {
    if (!selected(plugin.name(), set.label)) {
      MESSAGE(plugin.name() << " " << std::string(set.label)
                            << ": skipped (not in QRECIPE_GPU_PARITY_ONLY)");
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<Sides> sides;
    try {
      sides.emplace(make_sides(set.spec_yaml));
    } catch (const std::exception& e) {
      FAIL_CHECK("format '" << plugin.name() << "' supports CUDA but its option set '"
                            << std::string(set.label) << "' " << std::string(set.spec_yaml)
                            << " is not usable: "
                            << e.what()
                            << "; add valid option sets for it to kOptionSets in "
                               "tests/gpu/test_gpu_parity.cpp");
      ++tally.failures;
      continue;
    }
    const int cases_before = tally.cases;
    for (const Shape& shape : kShapes) {
      for (const DType src_dtype : kSourceDTypes) {
        for (const Kind kind : kKinds) {
          if (!runs(shape, src_dtype, kind)) continue;
          if (set.accepts && !set.accepts(shape.rows, shape.cols, src_dtype)) continue;
          const std::string input = std::string(qrecipe::dtype_name(src_dtype)) + " " +
                                    kind_name(kind) + " " + std::to_string(shape.rows) + "x" +
                                    std::to_string(shape.cols);
          const std::string base = plugin.name() + " " + set.label + " | " + input;
          try {
            const Tensor host = host_source(make_values(shape, kind), shape, src_dtype);
            const Tensor dev = to_target(host, target);
            for (const std::uint32_t usage : kUsages)
              if (!run_case(*sides, host, dev, usage, target,
                            base + " | usage " + qrecipe::usage_str(usage), tally))
                return false;
            if (!compare_and_update_states(*sides, base, tally)) return false;
          } catch (const std::exception& e) {
            ++tally.failures;
            FAIL_CHECK(base << ": threw " << e.what());
            if (tally.failures >= kMaxReportedFailures) return false;
          }
        }
      }
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(plugin.name() << " " << std::string(set.label) << ": " << (tally.cases - cases_before)
                          << " cases in " << s << " s");
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------- 4. test cases

TEST_CASE("CUDA runtime helpers: allocator, copies, zero-fill") {
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    if (!qrecipe::cuda_built()) {
      // The stubs of a CPU-only build must say so.
      CHECK_THROWS_WITH_AS(qrecipe::cuda_allocator(), doctest::Contains("has no CUDA"),
                           qrecipe::Error);
    }
    return;
  }
  MESSAGE(qrecipe::cuda_status());
  const auto alloc = qrecipe::cuda_allocator();
  const Device dev = Device::cuda(0);
  // A buffer is zero-filled; a host round trip returns exactly what was written.
  std::vector<std::uint8_t> pattern(1000);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 7 + 3);
  qrecipe::Buffer buf(alloc, pattern.size(), dev);
  REQUIRE(buf.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 256 == 0);
  std::vector<std::uint8_t> back(pattern.size(), 0xAB);
  qrecipe::copy_to_host(back.data(), buf.data(), back.size());
  CHECK(back == std::vector<std::uint8_t>(pattern.size(), 0));
  qrecipe::copy_to_device(buf.data(), pattern.data(), pattern.size());
  qrecipe::copy_to_host(back.data(), buf.data(), back.size());
  CHECK(back == pattern);
  alloc->zero(buf.data(), 100, dev);
  qrecipe::copy_to_host(back.data(), buf.data(), back.size());
  CHECK(std::vector<std::uint8_t>(back.begin(), back.begin() + 100) ==
        std::vector<std::uint8_t>(100, 0));
  CHECK(std::vector<std::uint8_t>(back.begin() + 100, back.end()) ==
        std::vector<std::uint8_t>(pattern.begin() + 100, pattern.end()));
  qrecipe::synchronize(dev);
  // Empty buffers still get a real pointer.
  qrecipe::Buffer empty(alloc, 0, dev);
  CHECK(empty.data() != nullptr);
  // Errors name the call: the CPU allocator refuses CUDA and vice versa.
  CHECK_THROWS_WITH_AS(alloc->allocate(16, Device::cpu()), doctest::Contains("CUDA allocator"),
                       qrecipe::Error);
  // An impossible allocation is OUT_OF_MEMORY naming cudaMalloc and the size.
  try {
    (void)alloc->allocate(std::size_t{1} << 50, dev);
    FAIL("a 1 PiB cudaMalloc succeeded");
  } catch (const qrecipe::Error& e) {
    CHECK(e.code() == QR_STATUS_OUT_OF_MEMORY);
    CHECK(std::string(e.what()).find("cudaMalloc(1125899906842624 bytes) on cuda:0") !=
          std::string::npos);
  }
}

TEST_CASE("delayed-scaling state on a CUDA device: engine update == CPU update") {
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  // Two states made through the engine's host entry: one on the CPU, one on cuda:0; the same
  // amaxes go in, the same history and scale must come out.
  const std::string yaml = "version: 1\ndefaults: {format: none}\n";
  Engine engine(Recipe::parse(yaml), registry());
  qr_scaling_request request{};
  request.struct_size = sizeof request;
  request.history_len = 3;
  request.algo_most_recent = 0;
  request.margin = 0;
  request.fp8_max = 448.0f;
  request.device = {QR_DEVICE_CPU, 0};
  const qr_scaling_state cpu = engine.acquire_scaling_state(request, "cpu-state");
  request.device = {QR_DEVICE_CUDA, 0};
  const qr_scaling_state gpu = engine.acquire_scaling_state(request, "gpu-state");
  REQUIRE(gpu.device.type == QR_DEVICE_CUDA);
  float scale = 0.0f;
  qrecipe::copy_to_host(&scale, gpu.scale, 4);
  CHECK(scale == 1.0f);  // docs/numerics.md: a new state has scale 1
  for (const float amax : {2.0f, 0.5f, 7.0f, 0.0f, 3.0f}) {
    // The step's amax goes into history row 0 of both states.
    cpu.amax_history[0] = amax;
    qrecipe::copy_to_device(gpu.amax_history, &amax, 4);
    const std::vector<float> step = engine.current_amaxes();
    REQUIRE(step.size() == 2);
    CHECK(step[0] == amax);
    CHECK(step[1] == amax);
    engine.update_scaling();
    const auto values = state_values(engine);
    REQUIRE(values.size() == 2);
    CHECK(values[0] == values[1]);
  }
  // After the amaxes 2, 0.5, 7, (0: no change), 3 with history 3 and algo max: the window
  // holds [0, 7, 3] and the scale is 448 / max(7, 3) = 64.
  const auto values = state_values(engine);
  CHECK(values[1][0] == 0.0f);
  CHECK(values[1][1] == 7.0f);
  CHECK(values[1][2] == 3.0f);
  CHECK(values[1][3] == 64.0f);
  CHECK(values[1][4] == 1.0f / 64.0f);
}

TEST_CASE("shared delayed-scaling states on CUDA update as one, as on the CPU") {
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  // Share groups (Engine::acquire_scaling_state): two members on cuda:0 (the group max is
  // taken on the device before the update), two on the CPU, one on each (through the host),
  // and a lone CUDA state. Every member of every group must end where the CPU group ends.
  Engine engine(Recipe::parse("version: 1\ndefaults: {format: none}\n"), registry());
  qr_scaling_request request{};
  request.struct_size = sizeof request;
  request.history_len = 3;
  request.fp8_max = 448.0f;
  const qr_device cpu{QR_DEVICE_CPU, 0}, gpu{QR_DEVICE_CUDA, 0};
  std::vector<qr_scaling_state> members;  // pairs: [cpu a, cpu b, gpu a, gpu b, mixed a, mixed b]
  for (const auto& [share, da, db] : {std::tuple{"c", cpu, cpu}, std::tuple{"g", gpu, gpu},
                                      std::tuple{"m", cpu, gpu}}) {
    request.device = da;
    members.push_back(engine.acquire_scaling_state(request, std::string(share) + ".a", share));
    request.device = db;
    members.push_back(engine.acquire_scaling_state(request, std::string(share) + ".b", share));
  }
  request.device = gpu;
  const qr_scaling_state lone = engine.acquire_scaling_state(request, "lone");
  const auto set_row0 = [](const qr_scaling_state& s, float amax) {
    if (s.device.type == QR_DEVICE_CPU)
      s.amax_history[0] = amax;
    else
      qrecipe::copy_to_device(s.amax_history, &amax, 4);
  };
  const std::pair<float, float> steps[] = {{2.0f, 5.0f}, {0.5f, 0.25f}, {7.0f, 1.0f},
                                           {0.0f, 0.0f}, {3.0f, 4.0f}};
  for (const auto& [a, b] : steps) {
    for (std::size_t i = 0; i < members.size(); i += 2) {
      set_row0(members[i], a);
      set_row0(members[i + 1], b);
    }
    set_row0(lone, a);
    engine.update_scaling();  // on the legacy default stream, then read back (synchronous)
    const auto values = state_values(engine);
    REQUIRE(values.size() == 7);
    for (std::size_t i = 1; i < 6; ++i) CHECK_MESSAGE(values[i] == values[0], "member " << i);
  }
  // Group amaxes 5, 0.5, 7, (0: no change), 4 with history 3 and algo max: [0, 7, 4], scale
  // 448 / 7 = 64. The lone state saw 2, 0.5, 7, 0, 3: [0, 7, 3], also 64.
  const auto values = state_values(engine);
  CHECK(values[0] == std::vector<float>{0.0f, 7.0f, 4.0f, 64.0f, 1.0f / 64.0f});
  CHECK(values[6] == std::vector<float>{0.0f, 7.0f, 3.0f, 64.0f, 1.0f / 64.0f});
  // Caller-reduced amaxes (a distributed step): the group takes the max over its members.
  engine.update_scaling({1.0f, 9.0f, 1.0f, 9.0f, 1.0f, 9.0f, 1.0f});
  const auto reduced = state_values(engine);
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(reduced[i] == std::vector<float>{0.0f, 4.0f, 9.0f, 448.0f / 9.0f, 1.0f / (448.0f / 9.0f)});
}

TEST_CASE("delayed-scaling state moved cpu -> cuda:0 -> cpu keeps its values") {
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  // A delayed-scaling quantizer moves its state to the device of its first CUDA tensor
  // (host scaling_state_move); the values and the state's place in the engine must survive.
  Engine engine(Recipe::parse("version: 1\ndefaults: {format: none}\n"), registry());
  qr_scaling_request request{};
  request.struct_size = sizeof request;
  request.history_len = 3;
  request.fp8_max = 448.0f;
  request.device = {QR_DEVICE_CPU, 0};
  qr_scaling_state s = engine.acquire_scaling_state(request, "moving-state");
  s.amax_history[0] = 5.0f;
  s.amax_history[2] = 7.0f;
  *s.scale = 64.0f;
  *s.scale_inv = 1.0f / 64.0f;
  const std::vector<float> before = state_values(engine)[0];
  s = engine.move_scaling_state(s.amax_history, {QR_DEVICE_CUDA, 0});
  REQUIRE(engine.scaling_states().size() == 1);
  CHECK(s.device.type == QR_DEVICE_CUDA);
  CHECK(engine.scaling_states()[0]->c.amax_history == s.amax_history);
  CHECK(state_values(engine)[0] == before);
  CHECK(engine.current_amaxes() == std::vector<float>{5.0f});
  s = engine.move_scaling_state(s.amax_history, {QR_DEVICE_CPU, 0});
  CHECK(s.device.type == QR_DEVICE_CPU);
  CHECK(state_values(engine)[0] == before);
  CHECK(s.amax_history[2] == 7.0f);
  // An unknown history pointer is an error naming the fix.
  float other = 0.0f;
  CHECK_THROWS_WITH_AS(engine.move_scaling_state(&other, {QR_DEVICE_CUDA, 0}),
                       doctest::Contains("no scaling state of this engine"), qrecipe::Error);
}

// Data, scale_inv and (where stored) amax of every direction in `usage`: CPU ref vs GPU got.
static void expect_same_buffers(Tally& tally, const std::string& what, const QuantizedTensor& ref,
                                const QuantizedTensor& got, std::uint32_t usage) {
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & qrecipe::usage_bit(d))) continue;
    const std::string dir = what + " | " + qrecipe::direction_name(d);
    expect_equal(tally, dir + " data", host_bytes(ref.data(d)), host_bytes(got.data(d)),
                 ref.data(d));
    expect_equal(tally, dir + " scale_inv", host_bytes(ref.scale_inv(d)),
                 host_bytes(got.scale_inv(d)), ref.scale_inv(d));
    if (ref.has_amax(d)) {
      const TensorView ra(ref.direction(d).amax), ga(got.direction(d).amax);
      expect_equal(tally, dir + " amax", host_bytes(ra), host_bytes(ga), ra);
    }
  }
}

TEST_CASE("hybrid one-read path with caller amaxes equals the CPU reference") {
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  // The fused pairs (float8's prepare_tensor_cast + the other side's quantize_with_tensor_cast)
  // take caller-reduced amaxes too: the cast's scale from the given rowwise amax, the other
  // side's own amax from the given columnwise one (no source_amax then). The amaxes are not
  // the source's, and differ between the sides.
  const Target target{Device::cuda(0), qrecipe::cuda_allocator()};
  const char* const pairs[] = {
      "{format: hybrid, rowwise: {format: float8, scaling: current}, columnwise: {format: mxfp8}}",
      "{format: hybrid, rowwise: {format: float8, dtype: e5m2, pow2_scales: true}, "
      "columnwise: {format: nvfp4}}",
      "{format: hybrid, rowwise: {format: float8, dtype: e4m3}, "
      "columnwise: {format: float8, dtype: e5m2, pow2_scales: true}}",
  };
  Tally tally;
  for (const char* yaml : pairs) {
    for (const Shape shape : {Shape{256, 1024}, Shape{144, 99}, Shape{1000, 999}}) {
      Sides sides = make_sides(yaml);
      const Tensor host = host_source(make_values(shape, Kind::outliers), shape, DType::bf16);
      const Tensor dev = to_target(host, target);
      QuantizeOptions opts;
      opts.amax = std::array<float, 2>{3000.0f, 77.5f};
      const std::string what = std::string(yaml) + " | " + std::to_string(shape.rows) + "x" +
                               std::to_string(shape.cols) + " | given amax";
      const QuantizedTensor ref = sides.cpu->quantize(host.view(), QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, opts);
      const QuantizedTensor got = sides.gpu->quantize(dev.view(), QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, opts, target.allocator);
      expect_same_buffers(tally, what, ref, got, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
    }
  }
  MESSAGE(tally.buffers << " buffers compared, " << tally.failures << " failures");
  CHECK(tally.failures == 0);
}

TEST_CASE("device amax: compute_amax_into and quantize with a device amax equal the CPU reference") {
  // plugin_abi.h QR_EXTRA_COMPUTE_AMAX_DEVICE / QR_EXTRA_QUANTIZE_DEVICE_AMAX: the pair written
  // to device memory, and a quantize whose kernels read the caller's pair there, give the CPU
  // reference's amax, bytes, scales and stored amaxes (the CPU side takes the same pair on the
  // host). Hybrid takes the engine's host-copy fallback: same bytes.
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  const Target target{Device::cuda(0), qrecipe::cuda_allocator()};
  struct Case {
    const char* yaml;
    DType src;
  };
  const Case cases[] = {
      {"{format: float8, dtype: e4m3}", DType::f32},
      {"{format: float8, dtype: e5m2, pow2_scales: true}", DType::bf16},
      {"{format: float8, amax_epsilon: 0.001}", DType::f32},
      {"{format: float8, scaling: delayed, amax_history_len: 4}", DType::bf16},
      {"{format: nvfp4}", DType::bf16},
      {"{format: nvfp4}", DType::f32},
      {"{format: nvfp4, 2d: true}", DType::bf16},
      {"{format: nvfp4, hadamard: true}", DType::bf16},
      {"{format: hybrid, rowwise: {format: float8}, columnwise: {format: nvfp4}}", DType::bf16},
  };
  Tally tally;
  for (const Case& c : cases) {
    for (const Shape shape : {Shape{256, 1024}, Shape{144, 96}, Shape{1008, 992}}) {
      const std::uint32_t usages[] = {QR_USAGE_ROWWISE, QR_USAGE_COLUMNWISE,
                                      QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE};
      for (const std::uint32_t usage : usages) {
        Sides sides = make_sides(c.yaml);
        const Tensor host = host_source(make_values(shape, Kind::outliers), shape, c.src);
        const Tensor dev = to_target(host, target);
        const std::string what = std::string(c.yaml) + " | " + std::to_string(shape.rows) + "x" +
                                 std::to_string(shape.cols) + " | usage " + std::to_string(usage);
        // The device pair equals the CPU reference's amax.
        const std::array<float, 2> ref_amax = sides.cpu->compute_amax(host.view());
        Tensor pair(DType::f32, {2}, target.device, target.allocator);
        sides.gpu->compute_amax_into(dev.view(), pair.view().data_as<float>());
        Tensor ref_pair(DType::f32, {2});
        std::memcpy(ref_pair.view().data(), ref_amax.data(), sizeof ref_amax);
        expect_equal(tally, what + " compute_amax_into", host_bytes(ref_pair.view()),
                     host_bytes(pair.view()), ref_pair.view());
        // A reduced pair (as from a max all-reduce) read on the device by the kernels.
        std::array<float, 2> given{ref_amax[0] * 1.75f, ref_amax[1] * 1.75f};
        if (std::string(c.yaml).find("2d") != std::string::npos) given[1] = given[0];
        std::memcpy(ref_pair.view().data(), given.data(), sizeof given);
        const Tensor dev_pair = to_target(ref_pair, target);
        QuantizeOptions host_opts;
        host_opts.amax = given;
        QuantizeOptions dev_opts;
        dev_opts.device_amax = dev_pair.view().data_as<float>();
        const QuantizedTensor ref = sides.cpu->quantize(host.view(), usage, host_opts);
        const QuantizedTensor got =
            sides.gpu->quantize(dev.view(), usage, dev_opts, target.allocator);
        expect_same_buffers(tally, what, ref, got, usage);
      }
    }
  }
  MESSAGE(tally.buffers << " buffers compared, " << tally.failures << " failures");
  CHECK(tally.failures == 0);
}

TEST_CASE("GPU quantize and dequantize are bit-identical to the CPU reference") {
  Target target;
  if (qrecipe::cuda_available()) {
    target = {Device::cuda(0), qrecipe::cuda_allocator()};
  } else if (selftest_requested()) {
    MESSAGE("QRECIPE_GPU_PARITY_SELFTEST=1 without a CUDA device: the device side runs on the "
            "CPU (checks the harness, not the kernels)");
    target = {Device::cpu(), qrecipe::cpu_allocator()};
  } else {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  const auto& plugins = registry()->plugins();
  for (const auto& f : registry()->failures()) MESSAGE("plugin load failure: " << f.path << ": " << f.cause);
  // float8 is the format with CUDA kernels in this build: a GPU run that tests nothing passes
  // for the wrong reason.
  const auto float8 = registry()->find("float8");
  REQUIRE_MESSAGE(float8 != nullptr, "libqrecipe_float8.so not found (QRECIPE_PLUGIN_PATH)");
  if (target.device.is_cuda())
    CHECK_MESSAGE(float8->supports(Device::cuda()),
                  "the float8 plugin was built without CUDA kernels: " << float8->path());

  Tally tally;
  int formats = 0;
  for (const auto& plugin : plugins) {
    if (!plugin->supports(Device::cuda())) {
      MESSAGE("format '" << plugin->name() << "' supports " << plugin->devices_str()
                         << " only: not tested here");
      continue;
    }
    ++formats;
    if (!sweep_format(*plugin, target, tally)) {
      FAIL_CHECK("stopped after " << tally.failures << " failures");
      break;
    }
  }
  MESSAGE(formats << " format(s), " << tally.cases << " quantize cases, " << tally.buffers
                  << " buffers compared, " << tally.failures << " failures");
  CHECK(formats >= 1);
  CHECK(tally.failures == 0);
}

// The decoded values of QR_EXTRA_QUANTIZE_DECODED for every block-scaled direction of `usage`
// (BF16 [data_shape[0], data_shape[1]]) and their miss words, in memory of `target`: a
// quantize_decoded_into call that the plugin served (false: refused, nothing written).
struct DecodedSide {
  std::vector<Tensor> values;  // one per direction, empty tensors where not asked
  bool asked[2] = {false, false};
  Tensor miss;                 // [2] uint32 as f32-sized words
  bool served = false;
};

static DecodedSide quantize_decoded(const Quantizer& q, const Tensor& src, QuantizedTensor& dst,
                                    std::uint32_t usage, const Target& target) {
  DecodedSide side;
  side.miss = Tensor(DType::f32, {2}, target.device, target.allocator);  // zero-filled
  qr_decoded_output out{};
  out.struct_size = sizeof out;
  side.values.resize(2);
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & qrecipe::usage_bit(d))) continue;
    const qr_direction_layout& l = dst.layout(d);
    if (l.scale_mode != QR_SCALE_BLOCK && l.scale_mode != QR_SCALE_BLOCK_TENSOR) continue;
    side.values[d] = Tensor(DType::bf16, {l.data_shape[0], l.data_shape[1]}, target.device, target.allocator);
    out.values[d] = side.values[d].data_as<std::uint16_t>();
    side.asked[d] = true;
    out.miss[d] = reinterpret_cast<std::uint32_t*>(side.miss.data_as<float>()) + d;
  }
  side.served = q.quantize_decoded_into(src.view(), dst, {}, out);
  return side;
}

TEST_CASE("quantize and decode in one pass: CUDA == the CPU reference, bit for bit") {
  // plugin_abi.h QR_EXTRA_QUANTIZE_DECODED: the CUDA kernels write the quantize's bytes and
  // the decoded BF16 operand of the emulated GEMMs; both equal the CPU reference (which the
  // conformance suite checks against quantize + the reference decode), and so do the miss
  // words. A plugin that refuses CUDA calls is reported (the engine then decodes in a second
  // kernel, which test_gpu_gemm covers).
  if (!qrecipe::cuda_available()) {
    MESSAGE("not supported: " << qrecipe::cuda_status());
    return;
  }
  const Target target{Device::cuda(0), qrecipe::cuda_allocator()};
  const char* const specs[] = {"{format: mxfp8, dtype: e4m3}", "{format: mxfp8, dtype: e5m2}",
                               "{format: nvfp4}", "{format: nvfp4, 2d: true}",
                               "{format: nvfp4, stochastic_rounding: true, seed: 3}"};
  Tally tally;
  int served = 0, refused = 0;
  for (const char* yaml : specs) {
    // Each ctest entry (QRECIPE_GPU_PARITY_ONLY=<format>) runs its own format's specs.
    const std::string spec(yaml);
    if (!selected(spec.substr(9, spec.find_first_of(",}") - 9), "decoded")) continue;
    for (const Shape shape : kShapes) {
      if (shape.rows * shape.cols > (1 << 20)) continue;  // the CPU side bounds the run time
      for (const Kind kind : kKinds) {
        for (const DType src_dtype : kSourceDTypes) {
          for (const std::uint32_t usage : kUsages) {
            Sides sides = make_sides(yaml);
            const Tensor host = host_source(make_values(shape, kind), shape, src_dtype);
            const Tensor dev = to_target(host, target);
            std::array<qr_direction_layout, 2> layouts{};
            for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
              if (usage & qrecipe::usage_bit(d)) layouts[d] = sides.cpu->layout(shape.rows, shape.cols, d);
            QuantizedTensor ref(sides.cpu->format(), shape.rows, shape.cols, usage, layouts,
                                Device::cpu(), qrecipe::cpu_allocator());
            QuantizedTensor got(sides.gpu->format(), shape.rows, shape.cols, usage, layouts,
                                target.device, target.allocator);
            const Target host_target{Device::cpu(), qrecipe::cpu_allocator()};
            const DecodedSide r = quantize_decoded(*sides.cpu, host, ref, usage, host_target);
            const DecodedSide g = quantize_decoded(*sides.gpu, dev, got, usage, target);
            const std::string what = std::string(yaml) + " | " + std::to_string(shape.rows) +
                                     "x" + std::to_string(shape.cols) + " | " + kind_name(kind) +
                                     " " + std::string(qrecipe::dtype_name(src_dtype)) + " | usage " +
                                     std::to_string(usage);
            REQUIRE_MESSAGE(r.served, what << ": the CPU reference refused quantize_decoded");
            if (!g.served) {
              ++refused;
              MESSAGE("not supported: " << what << ": the CUDA plugin refused "
                                        "quantize_decoded (two kernels instead)");
              continue;
            }
            ++served;
            expect_same_buffers(tally, what, ref, got, usage);
            for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
              if (!r.asked[d]) continue;
              expect_equal(tally, what + " | " + qrecipe::direction_name(d) + " decoded",
                           host_bytes(r.values[d].view()), host_bytes(g.values[d].view()),
                           r.values[d].view());
            }
            expect_equal(tally, what + " miss words", host_bytes(r.miss.view()),
                         host_bytes(g.miss.view()), r.miss.view());
            if (tally.failures >= kMaxReportedFailures) break;
          }
        }
      }
    }
  }
  MESSAGE(served << " one-pass cases served on CUDA, " << refused << " refused; "
                 << tally.buffers << " buffers compared, " << tally.failures << " failures");
  // mxfp8 has the fused kernel: a run of it where CUDA served nothing tests nothing.
  if (selected("mxfp8", "decoded")) CHECK(served > 0);
  CHECK(tally.failures == 0);
}
