// libFuzzer target: a plugin's option table and format name as the loader validates them
// (engine/src/registry/option_table.cpp), built from any bytes. The table is well-formed
// memory (arrays as long as their counts up to the limits the validator checks first), but
// every field is fuzzed: counts, struct sizes, keys (NULL, empty, odd bytes, duplicates),
// types, enum choices (NULL arrays, NULL or repeated entries), bounds (NaN, inf, min > max).
// Invariants: the only exception is qrecipe::Error; an accepted table has unique keys, a known
// type per entry, enums with unique non-empty choices, finite bounds with min <= max.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "registry/option_table.hpp"

using namespace qrecipe;
using namespace qrecipe::registry_internal;

namespace {

// Strings that outlive the table: the keys and choices it points to.
struct Arena {
  std::deque<std::string> strings;
  std::deque<std::vector<const char*>> arrays;
  const char* text(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: return nullptr;
      case 1: return "";
      case 2: return "dtype";
      case 3: return "format";
      case 4: return "scaling";
      default: strings.push_back(in.ConsumeRandomLengthString(80)); return strings.back().c_str();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Arena arena;
  try {
    check_format_name(arena.text(in));
  } catch (const Error&) {
  }
  // Counts above the limits are refused before the table is read: allocate up to the limit.
  const std::uint32_t count = in.ConsumeBool() ? in.ConsumeIntegral<std::uint32_t>()
                                               : in.ConsumeIntegralInRange<std::uint32_t>(0, 8);
  const bool null_table = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  std::vector<qr_option_schema> table(count <= kMaxOptions ? count : 0);
  for (auto& o : table) {
    o.struct_size = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeIntegral<std::uint32_t>()
                                                             : sizeof(qr_option_schema);
    o.key = arena.text(in);
    o.type = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeIntegral<std::int32_t>()
                                                       : in.ConsumeIntegralInRange<int>(0, 5);
    o.default_value = arena.text(in);
    o.help = arena.text(in);
    o.num_choices = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint32_t>(0, 4)
                                     : in.ConsumeIntegral<std::uint32_t>();
    if (in.ConsumeIntegralInRange<int>(0, 7) != 0 && o.num_choices <= kMaxChoices) {
      arena.arrays.emplace_back();
      for (std::uint32_t c = 0; c < o.num_choices; ++c) arena.arrays.back().push_back(arena.text(in));
      o.choices = arena.arrays.back().data();
    }
    const double special[] = {0.0, -1.0, 1.0, NAN, INFINITY, -INFINITY, 1e300};
    o.min_value = in.ConsumeBool() ? special[in.ConsumeIntegralInRange<int>(0, 6)]
                                   : in.ConsumeFloatingPoint<double>();
    o.max_value = in.ConsumeBool() ? special[in.ConsumeIntegralInRange<int>(0, 6)]
                                   : in.ConsumeFloatingPoint<double>();
    o.required = in.ConsumeIntegral<std::int32_t>();
  }
  try {
    const std::vector<OptionSchema> schema =
        read_option_table(null_table ? nullptr : table.data(), count);
    std::set<std::string> keys;
    for (const OptionSchema& s : schema) {
      if (!keys.insert(s.key).second || s.key.empty() || s.key == "format") std::abort();
      if (s.type < QR_OPTION_BOOL || s.type > QR_OPTION_QUANTIZER) std::abort();
      if (s.type == QR_OPTION_ENUM) {
        std::set<std::string> choices(s.choices.begin(), s.choices.end());
        if (s.choices.empty() || choices.size() != s.choices.size() || choices.count(""))
          std::abort();
      }
      if (!std::isfinite(s.min_value) || !std::isfinite(s.max_value) || s.min_value > s.max_value)
        std::abort();
      (void)s.describe();  // the `qrecipe plugins` listing of the entry
    }
  } catch (const Error&) {
  }
  return 0;
}
