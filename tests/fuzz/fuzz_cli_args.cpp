// libFuzzer target: the CLI's numeric arguments (engine/cli/args.cpp: --shape, --tokens,
// --seed, --module IN:OUT) on any bytes. Invariants: the only exception is UsageError, and a
// shape that parses has non-negative dimensions whose product fits the documented limit.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "args.hpp"

using namespace qrecipe::cli;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto [rows, cols] = parse_shape(text);
    std::int64_t product = 0;
    if (rows < 0 || cols < 0 || __builtin_mul_overflow(rows, cols, &product) ||
        product > kMaxQuantizeElements)
      std::abort();
  } catch (const UsageError&) {
  }
  try {
    if (parse_positive(text, "--tokens") <= 0) std::abort();
  } catch (const UsageError&) {
  }
  try {
    parse_unsigned(text, "--seed");
  } catch (const UsageError&) {
  }
  return 0;
}
