// Grouped quantization on the GPU == the CPU reference of each group alone, bit for bit
// (Engine::quantize_grouped, plugin_abi.h quantize_grouped). For float8 that is the grouped
// kernels of plugins/float8/float8_grouped_kernels.cu (one amax launch and one cast launch for
// all groups), for mxfp8 plugins/mxfp8/mxfp8_grouped_kernels.cu and for blockwise
// plugins/blockwise/blockwise_grouped_kernels.cu (one launch each), for nvfp4 with the 1-D
// options plugins/nvfp4/nvfp4_grouped_kernels.cu (three launches: zero, amax, cast); for the
// formats without the extra, the engine's per-group loop over device slices. Each case
// quantizes the same source on the CPU group by group (one engine) and on the GPU grouped
// (another engine), copies every GPU buffer back and requires byte equality of data,
// scale_inv and amax per group and direction; delayed-scaling states are compared after each
// update. A last case prints grouped vs per-group timings (information, not asserted).
//
// Without a usable CUDA device it prints "not supported: no CUDA device" and passes.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "../grouped_inputs.hpp"

using namespace qrecipe;

namespace {

struct Spec {
  const char* label;
  const char* yaml;
};
const Spec kSpecs[] = {
    {"float8/current_e4m3", "{format: float8}"},
    {"float8/e5m2_pow2", "{format: float8, dtype: e5m2, pow2_scales: true}"},
    // 100 is above the amax of normal groups (the epsilon decides) and below the outlier
    // group's (it does not): only per-group amaxes get both right.
    {"float8/amax_epsilon", "{format: float8, amax_epsilon: 100}"},
    {"float8/delayed", "{format: float8, scaling: delayed, amax_history_len: 4, margin: 1}"},
    {"mxfp8/e4m3", "{format: mxfp8}"},
    {"mxfp8/e5m2", "{format: mxfp8, dtype: e5m2}"},
    {"blockwise/1x128", "{format: blockwise, block: 1x128}"},
    {"blockwise/128x128", "{format: blockwise, block: 128x128, pow2_scales: false}"},
    // 100 is above the amax of normal blocks (the epsilon decides) and below the outlier's.
    {"blockwise/1x128_eps", "{format: blockwise, block: 1x128, amax_epsilon: 100}"},
    {"nvfp4/default", "{format: nvfp4}"},
    {"nvfp4/sr", "{format: nvfp4, stochastic_rounding: true, seed: 5}"},
    // 2d: the plugin quantizes group by group (no grouped kernel for the 2d tiles).
    {"nvfp4/2d", "{format: nvfp4, 2d: true}"},
};

using Layout = test::GroupLayout;
using test::states_of;
using test::total_rows;

std::vector<Layout> layouts() {
  std::vector<Layout> out = {
      {{1, 0, 63, 65, 128}, 17},  // odd rows and columns: unaligned groups, ragged tiles
      {{64, 64}, 64},             // whole tiles, 16-byte aligned everything
      {{1}, 1},
      {{0, 0}, 16},                // only empty groups: scalars only
      {{200, 56, 3}, 257},
      {{1024, 1024, 512}, 1024},   // expert-sized
  };
  Layout many{{}, 40};  // more groups than one launch carries (128 per launch)
  for (int g = 0; g < 130; ++g) many.group_rows.push_back(g % 5);
  out.push_back(many);
  return out;
}

Tensor to_device(const Tensor& host) {
  Tensor t(host.view().dtype(), host.shape(), Device::cuda(0), cuda_allocator());
  copy_to_device(t.view().data(), host.view().data(),
                 static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

std::vector<std::uint8_t> host_bytes(const qr_tensor_view& c) {
  if (c.data == nullptr) return {};
  const TensorView v(c);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(v.nbytes()));
  if (out.empty()) return out;
  if (v.device().is_cuda()) copy_to_host(out.data(), v.data(), out.size());
  else std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TensorView rows_of(const TensorView& src, std::int64_t row, std::int64_t rows) {
  qr_tensor_view v = src.c();
  v.shape[0] = rows;
  if (rows > 0)
    v.data = static_cast<char*>(v.data) + row * v.strides[0] * dtype_bits(src.dtype()) / 8;
  return TensorView(v);
}

// First differing byte of a buffer, for a readable failure.
std::string first_mismatch(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "byte %zu of %zu: cpu 0x%02x gpu 0x%02x", i, a.size(), a[i],
                    b[i]);
      return buf;
    }
  return "";
}

// Returns the number of mismatching buffers (each reported).
int compare(const QuantizedTensor& cpu, const QuantizedTensor& gpu, const std::string& what) {
  int bad = 0;
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!cpu.has(d)) continue;
    const qr_direction_data& a = cpu.direction(d);
    const qr_direction_data& b = gpu.direction(d);
    const std::pair<const char*, std::pair<const qr_tensor_view*, const qr_tensor_view*>> bufs[] =
        {{"data", {&a.data, &b.data}},
         {"scale_inv", {&a.scale_inv, &b.scale_inv}},
         {"amax", {&a.amax, &b.amax}}};
    for (const auto& [name, views] : bufs) {
      const std::string m = first_mismatch(host_bytes(*views.first), host_bytes(*views.second));
      if (m.empty()) continue;
      ++bad;
      if (bad <= 3) MESSAGE(what << " " << direction_name(d) << " " << name << ": " << m);
    }
  }
  return bad;
}

std::string yaml_of(const char* spec) {
  return std::string("version: 1\nname: gpu-grouped\ndefaults: ") + spec + "\n";
}

const QuantizerRole kRole{"grouped_linear", "weight", "experts"};

// The formats whose plugin fills the quantize_grouped extra (the others take the engine's
// loop); tests/test_grouped_quantize.cpp kFormatsWithExtra lists the same.
bool has_extra(const std::string& format) {
  return format == "float8" || format == "mxfp8" || format == "blockwise" || format == "nvfp4";
}

}  // namespace

TEST_CASE("GPU grouped quantize == CPU reference of each group alone") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device (" << cuda_status() << ")");
    return;
  }
  const auto all = layouts();
  int cases = 0, failures = 0;
  for (const Spec& spec : kSpecs) {
    const std::string label = spec.label;
    const std::string format = label.substr(0, label.find('/'));
    const auto plugin = Registry::shared()->find(format);
    if (!plugin || !plugin->supports(Device::cuda(0))) {
      MESSAGE("not supported: " << format << " has no CUDA kernels in this build");
      continue;
    }
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      // f16 sources for the grouped kernels; the loop formats run f32 and bf16.
      if (!has_extra(format) && dtype == DType::f16) continue;
      for (const std::uint32_t usage : {1u, 2u, 3u}) {
        Engine cpu_engine(Recipe::parse(yaml_of(spec.yaml), "gpu-grouped.yaml"));
        Engine gpu_engine(Recipe::parse(yaml_of(spec.yaml), "gpu-grouped.yaml"));
        const auto cq = cpu_engine.resolve(kRole);
        const auto gq = gpu_engine.resolve(kRole);
        CHECK(Engine::has_grouped_quantize(*gq) == has_extra(format));
        std::uint64_t seed = 7;
        for (const Layout& l : all) {
          const std::string what = label + " " + std::string(dtype_name(dtype)) + " " +
                                   usage_str(usage) + " " + std::to_string(l.group_rows.size()) +
                                   " groups x " + std::to_string(l.cols) + " cols";
          CAPTURE(what);
          const Tensor host = test::host_source(test::grouped_values(l, seed++), total_rows(l), l.cols, dtype);
          const Tensor dev = to_device(host);
          std::vector<QuantizedTensor> want;
          std::int64_t row = 0;
          for (const auto r : l.group_rows) {
            want.push_back(cq->quantize(rows_of(host.view(), row, r), usage));
            row += r;
          }
          std::vector<QuantizedTensor> got;
          try {
            got = gpu_engine.quantize_grouped(*gq, dev.view(), l.group_rows, usage, {},
                                              cuda_allocator());
          } catch (const Error& e) {
            // Only a shape this format's kernels refuse for a single group too may be refused.
            MESSAGE("refused: " << what << ": " << e.message());
            bool single_refused = false;
            try {
              std::int64_t r0 = 0;
              for (const auto r : l.group_rows) {
                gq->quantize(rows_of(dev.view(), r0, r), usage, {}, cuda_allocator());
                r0 += r;
              }
            } catch (const Error&) {
              single_refused = true;
            }
            CHECK(single_refused);
            break;  // the engines' states now differ: next usage
          }
          synchronize(Device::cuda(0));
          REQUIRE(got.size() == want.size());
          ++cases;
          for (std::size_t g = 0; g < got.size(); ++g)
            failures += compare(want[g], got[g], what + " group " + std::to_string(g));
          // Delayed scaling: amaxes of the step, then the states after an update.
          CHECK(cpu_engine.current_amaxes() == gpu_engine.current_amaxes());
          cpu_engine.update_scaling();
          gpu_engine.update_scaling();
          synchronize(Device::cuda(0));
          CHECK(states_of(cpu_engine) == states_of(gpu_engine));
        }
      }
    }
  }
  MESSAGE("grouped GPU cases: " << cases << ", mismatching buffers: " << failures);
  CHECK(cases > 0);
  CHECK(failures == 0);
}

TEST_CASE("GPU grouped quantize timing: one grouped call vs one quantize per group (info)") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device");
    return;
  }
  struct Case {
    int groups;
    std::int64_t rows, cols;
  };
  for (const std::string format : {"float8", "mxfp8", "blockwise", "nvfp4"}) {
    if (!Registry::shared()->find(format)) continue;
    Engine engine(Recipe::parse(yaml_of(("{format: " + format + "}").c_str()), "grouped.yaml"));
    const auto q = engine.resolve(kRole);
    for (const Case c : {Case{8, 2048, 1024}, Case{64, 256, 1024}, Case{128, 64, 512}}) {
      const Layout l{std::vector<std::int64_t>(static_cast<std::size_t>(c.groups), c.rows),
                     c.cols};
      const Tensor dev =
          to_device(test::host_source(test::grouped_values(l, 3), total_rows(l), l.cols, DType::bf16));
      auto grouped = engine.quantize_grouped(*q, dev.view(), l.group_rows, 3, {},
                                             cuda_allocator());
      std::vector<QuantizedTensor*> dst;
      for (auto& t : grouped) dst.push_back(&t);
      const auto time_ms = [&](auto&& fn) {
        for (int i = 0; i < 3; ++i) fn();  // warm-up
        synchronize(Device::cuda(0));
        const int reps = 50;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) fn();
        synchronize(Device::cuda(0));
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                   .count() / reps;
      };
      const double grouped_ms =
          time_ms([&] { engine.quantize_grouped_into(*q, dev.view(), l.group_rows, dst); });
      const double loop_ms = time_ms([&] {
        std::int64_t row = 0;
        for (std::size_t g = 0; g < dst.size(); ++g) {
          q->quantize_into(rows_of(dev.view(), row, l.group_rows[g]), *dst[g]);
          row += l.group_rows[g];
        }
      });
      char line[200];
      std::snprintf(line, sizeof line,
                    "%s bf16 %d groups x [%lld, %lld], both directions: grouped %.3f ms, "
                    "per-group loop %.3f ms",
                    format.c_str(), c.groups, static_cast<long long>(c.rows),
                    static_cast<long long>(c.cols), grouped_ms, loop_ms);
      MESSAGE(line);
      std::printf("%s\n", line);
    }
  }
}
