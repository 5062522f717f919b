// Checked shape and size arithmetic (header-only; the engine, the CLI and the plugin SDK use
// it). Shapes come from users (a CLI --shape, a torch tensor, a recipe's token count): a
// product, sum or padded size that does not fit in 64 bits is a qrecipe::Error saying which
// quantity overflowed, never a wrapped value that sizes a tiny buffer.
//
//   checked_mul(a, b, what)    a * b               (int64)
//   checked_add(a, b, what)    a + b               (int64, size_t)
//   ceil_div(a, d, what)       ceil(a / d)         a >= 0, d > 0
//   round_up(a, m, what)       ceil(a / m) * m     a >= 0, m > 0
// `what` names the quantity in the message ("rows x cols of f32[...]"); it is only turned
// into text when the check fails, so the checks cost one overflow test on the hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "qrecipe/error.hpp"

namespace qrecipe {

namespace detail {
[[noreturn]] inline void throw_overflow(std::string_view what, std::string_view op,
                                        std::int64_t a, std::int64_t b) {
  throw Error(QR_STATUS_INVALID_ARGUMENT, "",
              detail::concat(what.empty() ? std::string_view("a size") : what, ": ", a, " ", op,
                             " ", b, " overflows 64 bits; the shape is too large"));
}
}  // namespace detail

inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what = {}) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) detail::throw_overflow(what, "x", a, b);
  return r;
}

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what = {}) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) detail::throw_overflow(what, "+", a, b);
  return r;
}

inline std::size_t checked_add(std::size_t a, std::size_t b, std::string_view what = {}) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                detail::concat(what.empty() ? std::string_view("a byte count") : what, ": ", a,
                               " + ", b, " bytes overflows 64 bits; the shape is too large"));
  return r;
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t d, std::string_view what = {}) {
  if (d <= 0)
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                detail::concat(what.empty() ? std::string_view("ceil_div") : what,
                               ": divisor ", d, " must be positive"));
  if (a < 0)
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                detail::concat(what.empty() ? std::string_view("ceil_div") : what,
                               ": negative size ", a));
  // a / d + (a % d != 0) cannot overflow, unlike (a + d - 1) / d.
  return a / d + (a % d != 0 ? 1 : 0);
}

inline std::int64_t round_up(std::int64_t a, std::int64_t m, std::string_view what = {}) {
  return checked_mul(ceil_div(a, m, what), m, what);
}

}  // namespace qrecipe
