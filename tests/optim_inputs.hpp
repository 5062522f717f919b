// Inputs and helpers shared by the optimizer-step suites (tests/test_optim.cpp on the CPU,
// tests/gpu/test_gpu_optim.cpp on a GPU): the quantizers every format's Adam extra is run
// with, tensor shapes with partial blocks, and the tensors of one parameter's step.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/optim.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::test {

struct OptimSpec {
  const char* label;
  const char* yaml;
  bool fused_on_cuda;  // the plugin's CUDA kernels fuse it (else: the two-pass path)
};

inline const OptimSpec kOptimSpecs[] = {
    {"float8/current", "{format: float8}", true},
    {"float8/e5m2_pow2_eps", "{format: float8, dtype: e5m2, pow2_scales: true, amax_epsilon: 0.5}",
     true},
    {"float8/delayed", "{format: float8, scaling: delayed, amax_history_len: 4, margin: 1}", true},
    {"mxfp8/e4m3", "{format: mxfp8}", true},
    {"mxfp8/e5m2", "{format: mxfp8, dtype: e5m2}", true},
    {"blockwise/1x128", "{format: blockwise, block: 1x128}", true},
    {"blockwise/128x128", "{format: blockwise, block: 128x128, pow2_scales: false}", true},
    {"nvfp4/1d", "{format: nvfp4}", true},
    {"nvfp4/2d", "{format: nvfp4, 2d: true}", true},
    {"nvfp4/sr", "{format: nvfp4, stochastic_rounding: true, seed: 3}", false},
    {"hybrid/fp8_mx",
     "{format: hybrid, rowwise: {format: float8}, columnwise: {format: mxfp8}}", false},
};

struct Shape {
  std::int64_t rows, cols;
};
// Partial blocks and tiles of every format, an empty tensor, a tensor of one element, and
// whole aligned tiles.
inline const Shape kOptimShapes[] = {{1, 1},   {17, 33},  {64, 128}, {100, 72},
                                     {130, 260}, {0, 16}, {257, 129}};

inline std::string optim_yaml(const char* spec) {
  return std::string("version: 1\nname: optim-test\ndefaults: ") + spec + "\n";
}

inline const QuantizerRole kOptimRole{"linear", "weight", "fc"};

// `n` values: N(0, scale), with one outlier (a 1000x value) when n > 4.
inline std::vector<float> normal_values(std::int64_t n, float scale, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  if (n > 4) v[static_cast<std::size_t>(n / 3)] *= 1000.0f;
  return v;
}

// A host tensor of `dtype` (f32, bf16, f16) of `shape` holding `values` rounded to nearest.
inline Tensor host_tensor(const std::vector<float>& values, const std::vector<std::int64_t>& shape,
                          DType dtype) {
  Tensor t(dtype, shape);
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32: t.data_as<float>()[i] = values[i]; break;
      case DType::bf16: t.data_as<std::uint16_t>()[i] = num::f32_to_bf16(values[i]); break;
      default: t.data_as<std::uint16_t>()[i] = num::f32_to_f16(values[i]); break;
    }
  }
  return t;
}

// The bytes of a view (copied from the device when it lives there: copy_fn does that).
template <class CopyToHost>
std::vector<std::uint8_t> bytes_of(const qr_tensor_view& c, CopyToHost&& copy_to_host_fn) {
  if (c.data == nullptr) return {};
  const TensorView v(c);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(v.nbytes()));
  if (out.empty()) return out;
  if (v.device().is_cuda()) copy_to_host_fn(out.data(), v.data(), out.size());
  else std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Equal bytes, except that two NaNs of a float buffer compare equal whatever their payloads
// (x86 arithmetic propagates an operand's NaN payload, CUDA returns its canonical NaN; no
// quantized byte depends on a payload). Returns "" or the first difference.
inline std::string compare_values(const std::vector<std::uint8_t>& a,
                                  const std::vector<std::uint8_t>& b, DType dtype) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  const std::size_t width = dtype == DType::f32 ? 4 : (dtype == DType::bf16 || dtype == DType::f16 ? 2 : 1);
  for (std::size_t i = 0; i < a.size(); i += width) {
    if (std::memcmp(a.data() + i, b.data() + i, width) == 0) continue;
    if (width > 1) {
      float x = 0, y = 0;
      if (width == 4) {
        std::memcpy(&x, a.data() + i, 4);
        std::memcpy(&y, b.data() + i, 4);
      } else {
        std::uint16_t hx, hy;
        std::memcpy(&hx, a.data() + i, 2);
        std::memcpy(&hy, b.data() + i, 2);
        x = dtype == DType::bf16 ? num::bf16_to_f32(hx) : num::f16_to_f32(hx);
        y = dtype == DType::bf16 ? num::bf16_to_f32(hy) : num::f16_to_f32(hy);
      }
      if (std::isnan(x) && std::isnan(y)) continue;
      return "element " + std::to_string(i / width) + " of " + std::to_string(a.size() / width) +
             ": " + std::to_string(x) + " vs " + std::to_string(y);
    }
    return "byte " + std::to_string(i) + " of " + std::to_string(a.size());
  }
  return "";
}

// The hyperparameters of step `step` (AdamW, weight decay on).
inline qr_adam_hyper optim_hyper(std::int64_t step, bool adam_w_mode = true) {
  qr_adam_hyper h{};
  h.struct_size = sizeof(qr_adam_hyper);
  h.adam_w_mode = adam_w_mode ? 1 : 0;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.05;
  h.step = step;
  return h;
}

}  // namespace qrecipe::test
