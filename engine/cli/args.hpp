// Parsing of the `qrecipe` CLI's numeric arguments (shapes, counts), apart from main.cpp so the
// fuzz target tests/fuzz/fuzz_cli_args.cpp runs the very same code. Every function takes any
// bytes and either returns a value whose products fit in 64 bits or throws UsageError with a
// message naming the flag and what it expects; nothing wraps.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace qrecipe::cli {

// Bad command-line usage: exit status 2 and the usage text.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The most elements `qrecipe quantize` makes (it quantizes random data in memory on the CPU:
// 4 bytes of input and 4 of decoded output per element, plus the quantized bytes).
constexpr std::int64_t kMaxQuantizeElements = std::int64_t{1} << 30;

// "ROWSxCOLS", each decimal digits only (no sign, space or exponent): {rows, cols}, whose
// product must stay within `max_elements`.
std::pair<std::int64_t, std::int64_t> parse_shape(const std::string& text,
                                                  std::int64_t max_elements = kMaxQuantizeElements);

// A positive decimal integer that fits in int64 (`what` names the flag in the message).
std::int64_t parse_positive(const std::string& text, const std::string& what);

// A non-negative decimal integer that fits in uint64 (--seed).
std::uint64_t parse_unsigned(const std::string& text, const std::string& what);

}  // namespace qrecipe::cli
