// Deterministic test data for the conformance suite. The generator is std::mt19937_64 (its
// output sequence is fixed by the C++ standard) turned into doubles by hand, so the data is
// the same on every standard library; only the last bits of log/cos may differ across libms.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance::detail {
namespace {

constexpr double kPi = 3.14159265358979323846;

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  // Uniform in (0, 1), never 0 or 1: 53 random bits, centred in their interval.
  double open01() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1p-53; }
  double normal() {  // Box-Muller
    const double u1 = open01();
    const double u2 = open01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }

 private:
  std::mt19937_64 engine_;
};

std::uint64_t seed_of(DataKind kind, std::int64_t rows, std::int64_t cols, std::uint64_t salt) {
  // Distinct, fixed seeds per (kind, shape, salt); the constants are arbitrary odd numbers.
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  for (std::uint64_t v : {static_cast<std::uint64_t>(kind), static_cast<std::uint64_t>(rows),
                          static_cast<std::uint64_t>(cols), salt})
    s = (s ^ v) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  return s;
}

}  // namespace

const char* kind_name(DataKind kind) {
  switch (kind) {
    case DataKind::normal: return "normal";
    case DataKind::uniform: return "uniform";
    case DataKind::heavy_tailed: return "heavy-tailed";
    case DataKind::outliers: return "outliers";
    case DataKind::tiny: return "tiny";
    case DataKind::huge: return "huge";
  }
  return "?";
}

std::vector<float> generate(DataKind kind, std::int64_t rows, std::int64_t cols,
                            std::uint64_t salt) {
  const auto n = static_cast<std::size_t>(rows * cols);
  std::vector<float> v(n);
  Random rng(seed_of(kind, rows, cols, salt));
  for (auto& x : v) {
    double d = 0.0;
    switch (kind) {
      case DataKind::uniform: d = 6.0 * rng.open01() - 3.0; break;
      case DataKind::heavy_tailed:  // Cauchy by inversion, clipped
        d = std::clamp(std::tan(kPi * (rng.open01() - 0.5)), -1e4, 1e4);
        break;
      case DataKind::tiny: d = rng.normal() * 0x1p-100; break;
      case DataKind::huge: d = rng.normal() * 0x1p100; break;
      default: d = rng.normal(); break;
    }
    x = static_cast<float>(d);
  }
  if (kind == DataKind::outliers && n > 0) {
    const std::size_t count = std::max<std::size_t>(1, n / 200);
    for (std::size_t k = 0; k < count; ++k) v[rng.below(n)] *= 1000.0f;
  }
  return v;
}

std::vector<float> subnormals(std::int64_t rows, std::int64_t cols) {
  const auto n = static_cast<std::size_t>(rows * cols);
  std::vector<float> v(n);
  Random rng(seed_of(DataKind::normal, rows, cols, 0x5B));
  for (std::size_t i = 0; i < n; ++i) {
    // A random 23-bit mantissa with a zero exponent field is a subnormal (or zero).
    std::uint32_t bits = static_cast<std::uint32_t>(rng.below(0x800000u));
    if (i == 0) bits = 1;          // 2^-149, the smallest
    if (i == 1) bits = 0x7FFFFFu;  // the largest subnormal, just under 2^-126
    if (bits == 0) bits = 1;
    if (rng.below(2)) bits |= 0x80000000u;
    v[i] = num::bits_float(bits);
  }
  return v;
}

std::string Source::str() const {
  return std::string(dtype_name(dtype)) + tensor.view().shape_str();
}

Source make_source(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                   DType dtype) {
  QR_CHECK(static_cast<std::int64_t>(values.size()) == rows * cols, "make_source: ",
           values.size(), " values for ", rows, "x", cols);
  Source s;
  s.rows = rows;
  s.cols = cols;
  s.dtype = dtype;
  s.tensor = Tensor(dtype, {rows, cols});
  s.values = values;
  if (dtype == DType::bf16) {
    auto* out = s.tensor.data_as<std::uint16_t>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      out[i] = num::f32_to_bf16(values[i]);
      s.values[i] = num::bf16_to_f32(out[i]);
    }
  } else {
    QR_CHECK(dtype == DType::f32, "make_source: f32 or bf16 sources only");
    if (!values.empty()) std::memcpy(s.tensor.data_as<float>(), values.data(), values.size() * 4);
  }
  return s;
}

Source reshape(const Source& src, const std::vector<std::int64_t>& shape) {
  Source s;
  s.rows = src.rows;
  s.cols = src.cols;
  s.dtype = src.dtype;
  s.values = src.values;
  s.tensor = Tensor(src.dtype, shape);
  QR_CHECK(s.tensor.view().rows() == src.rows && s.tensor.view().cols() == src.cols,
           "reshape to ", s.tensor.view().shape_str(), " changes the 2-D view ",
           shape_str(src.rows, src.cols));
  const auto bytes = static_cast<std::size_t>(src.view().nbytes());
  if (bytes) std::memcpy(s.tensor.view().data(), src.view().data(), bytes);
  return s;
}

StridedSource transposed_storage(const Source& src) {
  StridedSource s;
  s.storage = Tensor(src.dtype, {src.cols, src.rows});
  const std::size_t elem = src.dtype == DType::bf16 ? 2 : 4;
  const auto* in = static_cast<const unsigned char*>(src.view().data());
  auto* out = static_cast<unsigned char*>(s.storage.view().data());
  for (std::int64_t i = 0; i < src.rows; ++i)
    for (std::int64_t j = 0; j < src.cols; ++j)
      std::memcpy(out + static_cast<std::size_t>(j * src.rows + i) * elem,
                  in + static_cast<std::size_t>(i * src.cols + j) * elem, elem);
  s.view = TensorView(s.storage.view().data(), src.dtype, {src.rows, src.cols});
  s.view.c().strides[0] = 1;
  s.view.c().strides[1] = src.rows;
  return s;
}

}  // namespace qrecipe::conformance::detail
