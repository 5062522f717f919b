// Numeric arguments of the `qrecipe` CLI (args.hpp).
#include "args.hpp"

#include <charconv>
#include <string_view>

#include "qrecipe/checked.hpp"
#include "qrecipe/error.hpp"

namespace qrecipe::cli {
namespace {

// Decimal digits only; nullopt-like false when the text is empty, has another character or
// does not fit.
template <class Int>
bool parse_digits(std::string_view text, Int& out, bool& too_large) {
  too_large = false;
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), out);
  if (result.ec == std::errc::result_out_of_range) too_large = true;
  return result.ec == std::errc() && result.ptr == text.data() + text.size();
}

}  // namespace

std::pair<std::int64_t, std::int64_t> parse_shape(const std::string& text,
                                                  std::int64_t max_elements) {
  const std::string shown = printable(text);
  const auto x = text.find('x');
  std::int64_t rows = 0, cols = 0;
  bool rows_large = false, cols_large = false;
  if (x == std::string::npos ||
      !parse_digits(std::string_view(text).substr(0, x), rows, rows_large) ||
      !parse_digits(std::string_view(text).substr(x + 1), cols, cols_large)) {
    if (rows_large || cols_large)
      throw UsageError("--shape " + shown + ": a dimension does not fit in 64 bits");
    throw UsageError("--shape expects ROWSxCOLS in decimal digits (e.g. 1024x1024), got '" +
                     shown + "'");
  }
  std::int64_t elements = 0;
  if (__builtin_mul_overflow(rows, cols, &elements))
    throw UsageError("--shape " + shown + ": " + std::to_string(rows) + " x " +
                     std::to_string(cols) + " elements overflow 64 bits");
  if (elements > max_elements)
    throw UsageError("--shape " + shown + ": " + std::to_string(elements) +
                     " elements; `qrecipe quantize` makes at most " +
                     std::to_string(max_elements) + " (it quantizes in memory on the CPU)");
  return {rows, cols};
}

std::int64_t parse_positive(const std::string& text, const std::string& what) {
  std::int64_t value = 0;
  bool too_large = false;
  if (!parse_digits(text, value, too_large) || value <= 0)
    throw UsageError(what + " expects a positive integer" +
                     (too_large ? " that fits in 64 bits" : "") + ", got '" + printable(text) + "'");
  return value;
}

std::uint64_t parse_unsigned(const std::string& text, const std::string& what) {
  std::uint64_t value = 0;
  bool too_large = false;
  if (!parse_digits(text, value, too_large))
    throw UsageError(what + " expects a non-negative integer" +
                     (too_large ? " that fits in 64 bits" : "") + ", got '" + printable(text) + "'");
  return value;
}

}  // namespace qrecipe::cli
