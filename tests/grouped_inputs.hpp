// Inputs shared by the grouped-quantization suites (tests/test_grouped_quantize.cpp on the CPU,
// tests/gpu/test_gpu_grouped.cpp on a GPU): a layout of row groups and values whose groups
// differ in character, so a scale computed over the whole tensor instead of per group fails.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::test {

// Every delayed-scaling state of `e` as numbers (amax history, then scale and scale_inv): two
// engines that quantized alike, grouped or group by group, hold equal states.
inline std::vector<std::vector<float>> states_of(const Engine& e) {
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < e.scaling_states().size(); ++i) {
    auto v = e.scaling_values(i);
    v.amax_history.push_back(v.scale);
    v.amax_history.push_back(v.scale_inv);
    out.push_back(v.amax_history);
  }
  return out;
}

// Consecutive row groups of `cols` columns (Engine::quantize_grouped's group_rows).
struct GroupLayout {
  std::vector<std::int64_t> group_rows;
  std::int64_t cols;
};

inline std::int64_t total_rows(const GroupLayout& l) {
  std::int64_t n = 0;
  for (auto r : l.group_rows) n += r;
  return n;
}

// N(0,1) values, with per-group character: group 1 gets an outlier (its own amax is large),
// group 2 a NaN and a -inf (its amax is inf: per-tensor formats fall back to scale 1 there).
inline std::vector<float> grouped_values(const GroupLayout& l, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(total_rows(l) * l.cols));
  for (auto& x : v) x = normal(rng);
  std::int64_t row = 0;
  for (std::size_t g = 0; g < l.group_rows.size(); ++g) {
    const std::int64_t n = l.group_rows[g] * l.cols, first = row * l.cols;
    if (g == 1 && n > 0) v[first + n / 2] = 3000.0f;
    if (g == 2 && n > 1) {
      v[first] = std::numeric_limits<float>::quiet_NaN();
      v[first + n - 1] = -std::numeric_limits<float>::infinity();
    }
    row += l.group_rows[g];
  }
  return v;
}

// A host tensor [rows, cols] of `dtype` (f32, bf16 or f16) holding `values` (rounded to
// nearest even for the 16-bit types).
inline Tensor host_source(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                          DType dtype) {
  Tensor t(dtype, {rows, cols});
  if (dtype == DType::f32) {
    if (!values.empty()) std::memcpy(t.data_as<float>(), values.data(), values.size() * 4);
  } else {
    auto* p = t.data_as<std::uint16_t>();
    for (std::size_t i = 0; i < values.size(); ++i)
      p[i] = dtype == DType::bf16 ? num::f32_to_bf16(values[i]) : num::f32_to_f16(values[i]);
  }
  return t;
}

}  // namespace qrecipe::test
