// Reading quantized tensors through their layouts (block grid, codes, scale entries), the
// guard-byte allocator, and the error-bound check. Nothing here knows a concrete format.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance::detail {

// ------------------------------------------------------------------ guarded allocator

namespace {
// 256 guard bytes on each side keep the user pointer 256-byte aligned (the Allocator contract).
constexpr std::size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

bool guards_intact(const unsigned char* base, std::size_t bytes) {
  for (std::size_t k = 0; k < kGuard; ++k)
    if (base[k] != kGuardByte || base[kGuard + bytes + k] != kGuardByte) return false;
  return true;
}
}  // namespace

void* GuardedAllocator::allocate(std::size_t bytes, Device device) {
  QR_CHECK(device.is_cpu(), "the conformance suite runs on CPU tensors; got ", device.str());
  const std::size_t total = ((2 * kGuard + bytes + kGuard - 1) / kGuard) * kGuard;
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(kGuard, total));
  QR_CHECK_CODE(base != nullptr, QR_STATUS_OUT_OF_MEMORY, "allocation of ", bytes, " bytes failed");
  std::memset(base, kGuardByte, kGuard);
  std::memset(base + kGuard + bytes, kGuardByte, kGuard);
  std::lock_guard<std::mutex> lock(mutex_);
  live_.push_back({base, bytes});
  return base + kGuard;
}

void GuardedAllocator::deallocate(void* ptr, std::size_t, Device) noexcept {
  if (!ptr) return;
  auto* base = static_cast<unsigned char*>(ptr) - kGuard;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->base != base) continue;
    if (!guards_intact(base, it->bytes))
      freed_with_overrun_.push_back("a freed buffer of " + std::to_string(it->bytes) + " bytes");
    live_.erase(it);
    break;
  }
  std::free(base);
}

void GuardedAllocator::zero(void* ptr, std::size_t bytes, Device) {
  if (bytes) std::memset(ptr, 0, bytes);
}

std::string GuardedAllocator::overruns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& b : live_)
    if (!guards_intact(b.base, b.bytes))
      out += (out.empty() ? "" : "; ") + std::string("a buffer of ") + std::to_string(b.bytes) +
             " bytes";
  for (const auto& s : freed_with_overrun_) out += (out.empty() ? "" : "; ") + s;
  return out;
}

// ------------------------------------------------------------------ layouts and blocks

bool is_block_mode(const qr_direction_layout& l) {
  return l.scale_mode == QR_SCALE_BLOCK || l.scale_mode == QR_SCALE_BLOCK_TENSOR;
}

Blocks blocks_of(const qr_direction_layout& l, std::int64_t rows, std::int64_t cols) {
  Blocks b;
  b.rows = rows;
  b.cols = cols;
  if (!is_block_mode(l)) {
    b.per_tensor = true;
    b.block_rows = std::max<std::int64_t>(rows, 1);
    b.block_cols = std::max<std::int64_t>(cols, 1);
    b.grid_rows = b.grid_cols = 1;
    return b;
  }
  // A block dimension <= 0 spans the whole dimension (per-row / per-column scaling).
  b.block_rows = l.block_rows > 0 ? l.block_rows : std::max<std::int64_t>(rows, 1);
  b.block_cols = l.block_cols > 0 ? l.block_cols : std::max<std::int64_t>(cols, 1);
  b.grid_rows = (rows + b.block_rows - 1) / b.block_rows;
  b.grid_cols = (cols + b.block_cols - 1) / b.block_cols;
  return b;
}

namespace {

std::int64_t scale_index(const qr_direction_layout& l, const Blocks& b, std::int64_t bi,
                         std::int64_t bj) {
  if (l.scale_ndim >= 2) {
    const std::int64_t s1 = l.scale_shape[1];
    return l.scale_transposed ? bj * s1 + bi : bi * s1 + bj;
  }
  return l.scale_transposed ? bj * b.grid_rows + bi : bi * b.grid_cols + bj;
}

std::int64_t scale_entries(const qr_direction_layout& l) {
  if (l.scale_ndim <= 0) return 0;
  return l.scale_ndim >= 2 ? l.scale_shape[0] * l.scale_shape[1] : l.scale_shape[0];
}

std::string hex_byte(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v & 0xFFu);
  return buf;
}

// First differing byte of two buffers, described ("" when equal).
std::string diff_bytes(const char* what, const void* a, std::int64_t na, const void* b,
                       std::int64_t nb) {
  if (na != nb)
    return std::string(what) + " sizes differ: " + std::to_string(na) + " vs " +
           std::to_string(nb) + " bytes";
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  for (std::int64_t k = 0; k < na; ++k)
    if (pa[k] != pb[k])
      return std::string(what) + " differs at byte " + std::to_string(k) + " (" +
             hex_byte(pa[k]) + " vs " + hex_byte(pb[k]) + ")";
  return "";
}

}  // namespace

std::uint32_t code_at(const QuantizedTensor& t, qr_direction d, std::int64_t i, std::int64_t j) {
  const qr_direction_layout& l = t.layout(d);
  const TensorView data = t.data(d);
  const std::int64_t d1 = l.data_ndim >= 2 ? l.data_shape[1] : l.data_shape[0];
  const std::int64_t a = l.data_transposed ? j : i;  // storage row
  const std::int64_t c = l.data_transposed ? i : j;  // storage column
  const auto* bytes = static_cast<const unsigned char*>(data.data());
  const int bits = dtype_bits(static_cast<DType>(l.data_dtype));
  if (bits == 4) {
    const std::uint32_t byte = bytes[a * ((d1 + 1) / 2) + c / 2];
    return c % 2 == 0 ? (byte & 0xFu) : (byte >> 4);  // even index in the low nibble
  }
  const std::size_t width = static_cast<std::size_t>(bits / 8);
  std::uint32_t code = 0;
  if (width <= 4) std::memcpy(&code, bytes + static_cast<std::size_t>(a * d1 + c) * width, width);
  return code;
}

std::vector<unsigned char> scale_entry(const QuantizedTensor& t, qr_direction d, std::int64_t bi,
                                       std::int64_t bj) {
  const qr_direction_layout& l = t.layout(d);
  if (l.scale_ndim <= 0) return {};
  const Blocks b = blocks_of(l, t.rows(), t.cols());
  const auto width = static_cast<std::size_t>(dtype_bits(static_cast<DType>(l.scale_dtype)) / 8);
  const auto* base = static_cast<const unsigned char*>(t.scale_inv(d).data());
  const std::int64_t k = scale_index(l, b, bi, bj);
  return std::vector<unsigned char>(base + k * width, base + (k + 1) * width);
}

std::string scale_array_problem(const QuantizedTensor& t, qr_direction d) {
  const qr_direction_layout& l = t.layout(d);
  const std::string where = std::string(direction_name(d)) + " scale_inv";
  if (l.scale_ndim <= 0)
    return l.scale_mode == QR_SCALE_NONE
               ? ""
               : where + ": scale mode " + std::to_string(l.scale_mode) + " but no scale array";
  const int bits = dtype_bits(static_cast<DType>(l.scale_dtype));
  if (bits < 8) return where + ": scale dtype of " + std::to_string(bits) + " bits";
  const Blocks b = blocks_of(l, t.rows(), t.cols());
  // Extent: the stored array must hold every block of the grid.
  std::int64_t need0 = b.grid_rows, need1 = b.grid_cols;
  if (l.scale_transposed) std::swap(need0, need1);
  if (l.scale_ndim >= 2) {
    if (l.scale_shape[0] < need0 || l.scale_shape[1] < need1)
      return where + " is [" + std::to_string(l.scale_shape[0]) + ", " +
             std::to_string(l.scale_shape[1]) + "] but the " + shape_str(b.rows, b.cols) +
             " tensor has a " + shape_str(b.grid_rows, b.grid_cols) + " block grid" +
             (l.scale_transposed ? " (stored transposed)" : "");
  } else if (l.scale_shape[0] < need0 * need1) {
    return where + " has " + std::to_string(l.scale_shape[0]) + " entries for a " +
           shape_str(b.grid_rows, b.grid_cols) + " block grid";
  }
  // Padding: every entry that belongs to no block is zero. An empty tensor has no block, and
  // what a plugin writes for its empty lines (per-row scales of 0 elements) is unobservable.
  if (b.rows == 0 || b.cols == 0) return "";
  const std::int64_t n = scale_entries(l);
  std::vector<bool> valid(static_cast<std::size_t>(n), false);
  for (std::int64_t bi = 0; bi < b.grid_rows; ++bi)
    for (std::int64_t bj = 0; bj < b.grid_cols; ++bj)
      valid[static_cast<std::size_t>(scale_index(l, b, bi, bj))] = true;
  const auto width = static_cast<std::int64_t>(bits / 8);
  const auto* base = static_cast<const unsigned char*>(t.scale_inv(d).data());
  for (std::int64_t k = 0; k < n; ++k) {
    if (valid[static_cast<std::size_t>(k)]) continue;
    for (std::int64_t w = 0; w < width; ++w)
      if (base[k * width + w] != 0)
        return where + " padding entry " + std::to_string(k) + " (outside the " +
               shape_str(b.grid_rows, b.grid_cols) + " block grid of " +
               shape_str(b.rows, b.cols) + ") holds " + hex_byte(base[k * width + w]) +
               "; padding must be zero";
  }
  return "";
}

std::string compare_bytes(const QuantizedTensor& a, const QuantizedTensor& b,
                          std::uint32_t usage) {
  for (int k = 0; k < 2; ++k) {
    const auto d = static_cast<qr_direction>(k);
    if (!(usage & usage_bit(d))) continue;
    const std::string dir = direction_name(d);
    if (!a.has(d) || !b.has(d)) return dir + " direction missing";
    const TensorView da = a.data(d), db = b.data(d);
    if (auto s = diff_bytes((dir + " data").c_str(), da.data(), da.nbytes(), db.data(),
                            db.nbytes());
        !s.empty())
      return s;
    const auto& ca = a.direction(d).scale_inv;
    const auto& cb = b.direction(d).scale_inv;
    if ((ca.data != nullptr) != (cb.data != nullptr)) return dir + " scale_inv present in one only";
    if (ca.data) {
      const TensorView sa(ca), sb(cb);
      if (auto s = diff_bytes((dir + " scale_inv").c_str(), sa.data(), sa.nbytes(), sb.data(),
                              sb.nbytes());
          !s.empty())
        return s;
    }
    if (a.has_amax(d) != b.has_amax(d)) return dir + " amax present in one only";
    if (a.has_amax(d)) {
      const float fa = a.amax(d), fb = b.amax(d);
      if (std::memcmp(&fa, &fb, 4) != 0)
        return dir + " amax differs: " + float_str(fa) + " vs " + float_str(fb);
    }
  }
  return "";
}

std::vector<float> decode(const Quantizer& q, const QuantizedTensor& t, qr_direction d,
                          DType out) {
  Tensor dst(out, {t.rows(), t.cols()});
  q.dequantize(t, d, dst.view());
  std::vector<float> v(static_cast<std::size_t>(t.rows() * t.cols()));
  if (out == DType::bf16) {
    const auto* p = dst.data_as<std::uint16_t>();
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = num::bf16_to_f32(p[k]);
  } else if (!v.empty()) {
    std::memcpy(v.data(), dst.data_as<float>(), v.size() * 4);
  }
  return v;
}

// ------------------------------------------------------------------ error bounds

Amaxes amaxes(const std::vector<float>& x, const Blocks& b) {
  Amaxes a;
  a.block.assign(static_cast<std::size_t>(b.grid_rows * b.grid_cols), 0.0);
  for (std::int64_t i = 0; i < b.rows; ++i)
    for (std::int64_t j = 0; j < b.cols; ++j) {
      const float v = x[static_cast<std::size_t>(i * b.cols + j)];
      if (!std::isfinite(v)) continue;
      const double m = std::fabs(static_cast<double>(v));
      double& blk = a.block[static_cast<std::size_t>(b.row_of(i) * b.grid_cols + b.col_of(j))];
      blk = std::max(blk, m);
      a.tensor = std::max(a.tensor, m);
    }
  return a;
}

BoundReport check_bound(const std::vector<float>& x, const std::vector<float>& decoded,
                        const Blocks& b, const ErrorBound& bound) {
  BoundReport r;
  const Amaxes am = amaxes(x, b);
  double worst_ratio = -1.0;
  for (std::int64_t i = 0; i < b.rows; ++i)
    for (std::int64_t j = 0; j < b.cols; ++j) {
      const auto k = static_cast<std::size_t>(i * b.cols + j);
      if (!std::isfinite(x[k])) continue;
      const double xv = x[k], dv = decoded[k];
      const double lim = bound.limit(xv, am.of(b, i, j), am.tensor);
      const double err = std::fabs(xv - dv);
      const bool bad = !std::isfinite(dv) || err > lim;
      if (!bad) continue;
      ++r.violations;
      const double ratio = !std::isfinite(dv) || lim == 0.0 ? INFINITY : err / lim;
      if (ratio <= worst_ratio) continue;
      worst_ratio = ratio;
      r.worst = "at (" + std::to_string(i) + ", " + std::to_string(j) + "): x = " +
                float_str(xv) + ", decoded " + float_str(dv) + ", error " + float_str(err) +
                " > bound " + float_str(lim) + " (block amax " + float_str(am.of(b, i, j)) +
                ", tensor amax " + float_str(am.tensor) + "; block " +
                shape_str(b.block_rows, b.block_cols) + ")";
    }
  return r;
}

// ------------------------------------------------------------------ formatting

std::string shape_str(std::int64_t rows, std::int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

std::string float_str(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace qrecipe::conformance::detail
