// DType: the element types of tensors that cross the engine (mirrors qr_dtype). Header-only,
// so plugins can use it without linking the engine.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "qrecipe/checked.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe {

enum class DType : std::int32_t {
  f32 = QR_DTYPE_F32,
  bf16 = QR_DTYPE_BF16,
  f16 = QR_DTYPE_F16,
  e4m3 = QR_DTYPE_E4M3,
  e5m2 = QR_DTYPE_E5M2,
  e2m1 = QR_DTYPE_E2M1,
  e8m0 = QR_DTYPE_E8M0,
  u8 = QR_DTYPE_U8,
  f64 = QR_DTYPE_F64,
};

namespace detail {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
  double max;  // largest finite value (0 for non-float types)
};
inline constexpr std::array<DTypeInfo, 9> kDTypes{{
    {DType::f32, "f32", 32, 3.4028234663852886e38},
    {DType::bf16, "bf16", 16, 3.3895313892515355e38},
    {DType::f16, "f16", 16, 65504.0},
    {DType::e4m3, "e4m3", 8, 448.0},
    {DType::e5m2, "e5m2", 8, 57344.0},
    {DType::e2m1, "e2m1", 4, 6.0},
    {DType::e8m0, "e8m0", 8, 1.7014118346046923e38},
    {DType::u8, "u8", 8, 0.0},
    {DType::f64, "f64", 64, 1.7976931348623157e308},
}};
inline const DTypeInfo& dtype_info(DType t) {
  for (const auto& info : kDTypes)
    if (info.dtype == t) return info;
  QR_THROW("unknown dtype code ", static_cast<int>(t), "; expected one of 0..", kDTypes.size() - 1);
}
}  // namespace detail

// Bits per element (E2M1 is 4: two per byte).
inline int dtype_bits(DType t) { return detail::dtype_info(t).bits; }
inline std::string_view dtype_name(DType t) { return detail::dtype_info(t).name; }
// Largest finite value of a floating-point dtype.
inline double dtype_max(DType t) { return detail::dtype_info(t).max; }

// Parses the names dtype_name prints.
inline DType dtype_from_name(std::string_view name) {
  std::string known;
  for (const auto& info : detail::kDTypes) {
    if (info.name == name) return info.dtype;
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  QR_THROW("unknown dtype '", name, "'; expected one of: ", known);
}

// Bytes of `rows` rows of `cols` elements; E2M1 rows are packed to whole bytes. Throws
// qrecipe::Error when the count does not fit in 64 bits (checked.hpp).
inline std::int64_t storage_bytes(DType t, std::int64_t rows, std::int64_t cols) {
  const int bits = dtype_bits(t);
  if (bits == 4) return checked_mul(rows, ceil_div(cols, 2, "e2m1 row bytes"), "e2m1 bytes");
  return checked_mul(checked_mul(rows, cols, "elements (rows x cols)"), bits / 8,
                     "bytes of the elements");
}

}  // namespace qrecipe
