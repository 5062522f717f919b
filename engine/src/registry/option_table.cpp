// Validation of a plugin's option table and format name (option_table.hpp has the rules).
#include "registry/option_table.hpp"

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "qrecipe/error.hpp"

namespace qrecipe::registry_internal {
namespace {

constexpr const char* kFix = "; fix the plugin's option table (qrecipe/plugin_abi.h, "
                             "qr_option_schema) and rebuild it";

std::string str_or_empty(const char* s) { return s ? s : ""; }

// Why `name` is not a usable key / format name ("" when it is). Reads at most
// kMaxNameLength + 1 bytes, so an unterminated string is caught as too long.
std::string name_problem(const char* name) {
  if (name == nullptr) return "NULL";
  const std::size_t length = strnlen(name, kMaxNameLength + 1);
  if (length == 0) return "empty";
  if (length > kMaxNameLength)
    return "longer than " + std::to_string(kMaxNameLength) + " characters";
  for (std::size_t i = 0; i < length; ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok)
      return printable(std::string_view(name, length)) +
             " holds a character other than letters, digits, '_', '-' and '.'";
  }
  return "";
}

[[noreturn]] void bad_entry(std::uint32_t index, const char* key, const std::string& what) {
  std::string where = "option table: option " + std::to_string(index);
  if (key != nullptr && name_problem(key).empty()) where += " ('" + std::string(key) + "')";
  throw Error(QR_STATUS_INVALID_ARGUMENT, "", where + ": " + what + kFix);
}

}  // namespace

std::vector<OptionSchema> read_option_table(const qr_option_schema* options, std::uint32_t count) {
  if (count > kMaxOptions)
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                "option table: the descriptor declares " + std::to_string(count) +
                    " options, more than the " + std::to_string(kMaxOptions) +
                    " a plugin may have (a corrupt num_options?)" + kFix);
  if (count > 0 && options == nullptr)
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                "option table: the descriptor declares " + std::to_string(count) +
                    " options but no option table (options is NULL)" + kFix);
  std::vector<OptionSchema> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    const qr_option_schema& o = options[i];
    if (o.struct_size < sizeof(qr_option_schema))
      bad_entry(i, nullptr, "struct_size " + std::to_string(o.struct_size) +
                                " is smaller than this ABI's " +
                                std::to_string(sizeof(qr_option_schema)));
    if (const std::string why = name_problem(o.key); !why.empty())
      bad_entry(i, nullptr, (o.key == nullptr || *o.key == '\0') ? "NULL or empty key"
                                                                  : "the key " + why);
    const std::string key = o.key;
    if (key == "format")
      bad_entry(i, o.key, "'format' is the spec's own key (the format name), not an option; "
                          "rename the option");
    for (std::uint32_t j = 0; j < i; ++j)
      if (key == options[j].key)
        bad_entry(i, o.key, "key '" + key + "' is already used by option " + std::to_string(j));
    if (o.type < QR_OPTION_BOOL || o.type > QR_OPTION_QUANTIZER)
      bad_entry(i, o.key, "type " + std::to_string(o.type) + " is not an option type (0 bool, "
                          "1 int, 2 float, 3 enum, 4 string, 5 quantizer)");
    OptionSchema s;
    s.key = key;
    s.type = static_cast<qr_option_type>(o.type);
    s.default_value = str_or_empty(o.default_value);
    s.help = str_or_empty(o.help);
    s.required = o.required != 0;
    if (s.type == QR_OPTION_ENUM) {
      if (o.num_choices == 0) bad_entry(i, o.key, "enum with no choices");
      if (o.num_choices > kMaxChoices)
        bad_entry(i, o.key, "enum with " + std::to_string(o.num_choices) + " choices, more than " +
                                std::to_string(kMaxChoices) + " (a corrupt num_choices?)");
      if (o.choices == nullptr)
        bad_entry(i, o.key, "enum with " + std::to_string(o.num_choices) +
                                " choices but a NULL choices array");
      std::set<std::string> seen;
      for (std::uint32_t c = 0; c < o.num_choices; ++c) {
        const char* choice = o.choices[c];
        if (choice == nullptr || *choice == '\0')
          bad_entry(i, o.key, "choice " + std::to_string(c) + " is NULL or empty");
        const std::string text(choice, strnlen(choice, kMaxNameLength * 4 + 1));
        if (text.size() > kMaxNameLength * 4)
          bad_entry(i, o.key, "choice " + std::to_string(c) + " is longer than " +
                                  std::to_string(kMaxNameLength * 4) + " characters");
        if (!seen.insert(text).second)
          bad_entry(i, o.key, "choice '" + printable(text) + "' is listed twice");
        s.choices.push_back(text);
      }
    } else if (o.num_choices != 0) {
      bad_entry(i, o.key, std::to_string(o.num_choices) + " choices on a " +
                              option_type_name(s.type) + " option; choices are for enums only");
    }
    if (s.type == QR_OPTION_INT || s.type == QR_OPTION_FLOAT) {
      if (!std::isfinite(o.min_value) || !std::isfinite(o.max_value))
        bad_entry(i, o.key, "bounds [" + detail::concat(o.min_value) + ", " +
                                detail::concat(o.max_value) + "] are not finite numbers");
      if (o.min_value > o.max_value)
        bad_entry(i, o.key, "min_value " + detail::concat(o.min_value) + " > max_value " +
                                detail::concat(o.max_value) + " (both 0 means unbounded)");
      s.min_value = o.min_value;
      s.max_value = o.max_value;
    }
    out.push_back(std::move(s));
  }
  return out;
}

void check_format_name(const char* name) {
  if (const std::string why = name_problem(name); !why.empty())
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                "the descriptor's format name is " + why +
                    "; a format name is 1 to " + std::to_string(kMaxNameLength) +
                    " letters, digits, '_', '-' or '.'");
  if (std::string_view(name) == "none")
    throw Error(QR_STATUS_INVALID_ARGUMENT, "",
                "format name 'none' is reserved: recipes write `format: none` to keep a tensor "
                "in high precision, so this format could never be chosen; rename it");
}

}  // namespace qrecipe::registry_internal
