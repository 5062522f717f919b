// A plugin's option table and format name, validated when the plugin loads (internal to the
// registry; the fuzz target tests/fuzz/fuzz_option_table.cpp calls it directly).
//
// The table is static data the plugin returns from its entry; the engine reads it before any
// recipe is checked against it, so a malformed table must be a load failure here, not a crash
// or undefined behaviour later (an enum whose choices array is NULL, an option type out of
// range). What a table must be:
//   - at most kMaxOptions entries, a non-NULL array when there are any;
//   - each entry's struct_size at least this ABI's, a key of letters, digits, '_', '-' or '.'
//     (1 to kMaxNameLength characters), not "format" (the spec's own key), used once;
//   - a type in QR_OPTION_BOOL..QR_OPTION_QUANTIZER;
//   - ENUM: 1 to kMaxChoices choices, each non-NULL, non-empty and listed once; other types
//     no choices;
//   - INT / FLOAT: finite bounds with min_value <= max_value (both 0: unbounded).
// A format name follows the key rules and is not "none" (recipes write `format: none` for
// high precision, so a format of that name could never be reached).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qrecipe/format_plugin.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::registry_internal {

constexpr std::uint32_t kMaxOptions = 256;
constexpr std::uint32_t kMaxChoices = 256;
constexpr std::size_t kMaxNameLength = 64;

// The schema of `count` entries at `options`; throws qrecipe::Error "option table: option 2
// ('dtype'): ..." naming the first bad entry.
std::vector<OptionSchema> read_option_table(const qr_option_schema* options, std::uint32_t count);

// Throws qrecipe::Error when `name` (a descriptor's format name, possibly NULL) is unusable.
void check_format_name(const char* name);

}  // namespace qrecipe::registry_internal
