// The recipe validator (docs/recipes.md): each quantizer spec checked against the option
// schema of its format's plugin (keys, types, enum choices, bounds, nested specs), every
// problem collected with its location, and a typed copy of each valid spec.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "recipe/internal.hpp"

namespace qrecipe {
namespace recipe_internal {
namespace {

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Bools: true/false, yes/no, on/off in any case (YAML 1.1's words, which recipe authors
// write; "1"/"0" are not bools, to keep integers and bools apart).
std::optional<bool> parse_bool(std::string_view text) {
  for (std::string_view word : {"true", "yes", "on"})
    if (equals_ignoring_case(text, word)) return true;
  for (std::string_view word : {"false", "no", "off"})
    if (equals_ignoring_case(text, word)) return false;
  return std::nullopt;
}

// A leading '+' is allowed once ("+1"); a second sign after it is not ("+-1").
std::optional<std::string_view> strip_plus(std::string_view text) {
  if (text.empty() || text.front() != '+') return text;
  text.remove_prefix(1);
  if (text.empty() || text.front() == '+' || text.front() == '-') return std::nullopt;
  return text;
}

// Integers: optional sign and decimal digits, nothing else ("1.5", "1e3", "0x10" are refused).
std::optional<std::int64_t> parse_int(std::string_view text, bool& overflow) {
  overflow = false;
  const auto digits = strip_plus(text);
  if (!digits || digits->empty()) return std::nullopt;
  std::int64_t value = 0;
  const auto result = std::from_chars(digits->data(), digits->data() + digits->size(), value);
  if (result.ptr != digits->data() + digits->size()) return std::nullopt;
  if (result.ec == std::errc::result_out_of_range) overflow = true;
  if (result.ec != std::errc()) return std::nullopt;
  return value;
}

// Floats: decimal or scientific notation; inf and nan are refused (no option wants them).
std::optional<double> parse_float(std::string_view text) {
  const auto number = strip_plus(text);
  if (!number || number->empty()) return std::nullopt;
  double value = 0;
  const auto result = std::from_chars(number->data(), number->data() + number->size(), value,
                                      std::chars_format::general);
  if (result.ec != std::errc() || result.ptr != number->data() + number->size())
    return std::nullopt;
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

// For decimal or scientific text that from_chars refused as out of range: "underflows a
// double ..." or "overflows a double ...", from the text's decimal exponent (the position of
// its first non-zero digit plus its exponent part); "" when the text is not such a number.
std::string out_of_double_range(std::string_view text) {
  const auto number = strip_plus(text);
  if (!number || number->empty()) return "";
  double ignored = 0;
  const auto result = std::from_chars(number->data(), number->data() + number->size(), ignored,
                                      std::chars_format::general);
  if (result.ec != std::errc::result_out_of_range || result.ptr != number->data() + number->size())
    return "";
  std::string_view digits = *number;
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  const auto e = digits.find_first_of("eE");
  long long exponent = 0;
  if (e != std::string_view::npos) {
    std::string_view exp_text = digits.substr(e + 1);
    if (!exp_text.empty() && exp_text.front() == '+') exp_text.remove_prefix(1);
    const auto r = std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
    if (r.ec == std::errc::result_out_of_range) exponent = exp_text.front() == '-' ? -100000 : 100000;
    digits = digits.substr(0, e);
  }
  // Decimal exponent of the first non-zero digit: its position relative to the point.
  const auto point = digits.find('.');
  const auto integer_digits = static_cast<long long>(point == std::string_view::npos ? digits.size() : point);
  long long position = 0;  // of the first non-zero digit, counting the point out
  for (char c : digits) {
    if (c == '.') continue;
    if (c != '0') break;
    ++position;
  }
  const long long magnitude = exponent + integer_digits - 1 - position;
  if (magnitude < 0)
    return "underflows a double (its magnitude is below 4.9e-324, the smallest one); write 0 or "
           "a larger value";
  return "overflows a double (its magnitude is above 1.8e308, the largest one); write a smaller "
         "value";
}

bool bounded(const OptionSchema& schema) {
  return !(schema.min_value == 0 && schema.max_value == 0);
}

std::string range_str(const OptionSchema& schema) {
  return "[" + number_str(schema.min_value) + ", " + number_str(schema.max_value) + "]";
}

class Validator {
 public:
  explicit Validator(const Registry& registry) : registry_(registry) {}

  std::vector<Problem>& problems() { return problems_; }

  // The typed copy of `in`; problems are recorded, and options with problems are left out.
  QuantizerSpec spec(const QuantizerSpec& in, const std::string& path, bool nested) {
    QuantizerSpec out;
    out.format = in.format;
    out.location = in.location;
    // A spec validated before (or made in code) carries the shared state's name as a field.
    if (!in.share.empty() && share_allowed(in.location, child_path(path, kShareKey), nested, in))
      out.share = in.share;
    if (in.is_none()) {
      if (!in.share.empty())
        fail(in.location, child_path(path, kShareKey),
             "format none keeps high precision and no scaling state to share; remove 'share'");
      if (!in.options.empty())
        fail(in.options.front().second.location, child_path(path, in.options.front().first),
             "format none keeps high precision and takes no options; remove " +
                 quoted(in.options.front().first));
      return out;
    }
    const auto plugin = registry_.find(in.format);
    if (!plugin) {
      fail(in.location, child_path(path, "format"), unknown_format(in.format));
      return out;
    }
    if (nested && plugin->takes_quantizers())
      fail(in.location, child_path(path, "format"),
           "a nested spec cannot nest again: format '" + in.format +
               "' takes nested quantizers itself, so it cannot be one; use a format without "
               "quantizer options here (" + nestable_formats() + ")");
    std::set<std::string> seen;
    for (const auto& [key, value] : in.options) {
      const std::string key_path = child_path(path, key);
      if (!seen.insert(key).second) {
        fail(value.location, key_path, "option " + quoted(key) + " is given twice; keep only one");
        continue;
      }
      if (key == kShareKey) {  // the engine's key, beside `format`: not the plugin's option
        if (const auto name = share_name(value, key_path, nested, in)) out.share = *name;
        continue;
      }
      const OptionSchema* schema = plugin->find_option(key);
      if (!schema) {
        fail(value.location, key_path, unknown_option(*plugin, key));
        continue;
      }
      if (auto typed = option(*schema, value, key_path)) out.options.emplace_back(key, *typed);
    }
    for (const auto& schema : plugin->options())
      if (schema.required && !seen.count(schema.key))
        fail(in.location, child_path(path, schema.key),
             "format '" + in.format + "' requires option '" + schema.key + "' (" +
                 schema.type_name() + ": " + schema.help + ")");
    return out;
  }

 private:
  void fail(const SourceLocation& location, std::string path, std::string what) {
    problems_.push_back({location, std::move(path), std::move(what)});
  }

  // `share: NAME` (a shared scaling state, Engine::acquire_scaling_state): a non-empty name,
  // on a top-level spec only. The check that the quantizer keeps a scaling state at all needs
  // the quantizer, so the engine makes it when it creates one.
  std::optional<std::string> share_name(const OptionValue& value, const std::string& path,
                                        bool nested, const QuantizerSpec& in) {
    if (value.type != QR_OPTION_STRING && value.type != QR_OPTION_ENUM) {
      fail(value.location, path, "expected the name of a shared scaling state (a string), got " +
                                     (value.type == QR_OPTION_QUANTIZER
                                          ? std::string("a nested quantizer spec (a map)")
                                          : quoted(value.str()) + " (" +
                                                option_type_name(value.type) + ")"));
      return std::nullopt;
    }
    if (value.string_value.empty()) {
      fail(value.location, path, "the name of a shared scaling state is empty; give a name, "
                                 "e.g. `share: weights`, or remove the key");
      return std::nullopt;
    }
    if (!share_allowed(value.location, path, nested, in)) return std::nullopt;
    return value.string_value;
  }

  bool share_allowed(const SourceLocation& location, const std::string& path, bool nested,
                     const QuantizerSpec& in) {
    if (nested) {
      fail(location, path, "a nested quantizer spec (format '" + in.format + "') cannot share "
                           "a scaling state; `share` belongs to a top-level quantizer spec, "
                           "beside its `format`");
      return false;
    }
    return true;
  }

  // "loaded: a, b" for the formats a nested spec may use (those without quantizer options).
  std::string nestable_formats() const {
    std::vector<std::string> names;
    for (const auto& plugin : registry_.plugins())
      if (!plugin->takes_quantizers()) names.push_back(plugin->name());
    std::sort(names.begin(), names.end());
    return names.empty() ? "no such format is loaded" : "loaded: " + join(names);
  }

  std::string unknown_format(const std::string& format) const {
    std::string message = "unknown format " + quoted(format) + "; loaded formats: " +
                          registry_.loaded_names();
    std::vector<std::string> names;
    for (const auto& plugin : registry_.plugins()) names.push_back(plugin->name());
    message += did_you_mean(format, names);
    if (!registry_.failures().empty()) {
      std::vector<std::string> failures;
      for (const auto& failure : registry_.failures())
        failures.push_back(printable(failure.path) + ": " + failure.cause);
      message += " (plugin load failures: " + join(failures, "; ") + ")";
    }
    return message + "; run `qrecipe plugins -v` to see where plugins are searched "
                     "(QRECIPE_PLUGIN_PATH adds directories)";
  }

  static std::string unknown_option(const FormatPlugin& plugin, const std::string& key) {
    if (plugin.options().empty())
      return "unknown option " + quoted(key) + ": format '" + plugin.name() + "' takes no options";
    std::vector<std::string> keys;
    for (const auto& schema : plugin.options()) keys.push_back(schema.key);
    return "unknown option " + quoted(key) + " for format '" + plugin.name() + "'; its options are: " +
           plugin.option_keys() + did_you_mean(key, keys);
  }

  // The value converted to / checked against the schema's type, or nullopt with a problem.
  std::optional<OptionValue> option(const OptionSchema& schema, const OptionValue& in,
                                    const std::string& path) {
    const std::string expected = "expected " + describe_type(schema);
    if (schema.type == QR_OPTION_QUANTIZER) {
      if (in.type != QR_OPTION_QUANTIZER || !in.spec) {
        fail(in.location, path, expected + ", got " + got(in));
        return std::nullopt;
      }
      OptionValue out = OptionValue::of_spec(spec(*in.spec, path, /*nested=*/true));
      out.location = in.location;
      return out;
    }
    if (in.type == QR_OPTION_QUANTIZER) {
      fail(in.location, path, expected + ", got a nested quantizer spec (a map)");
      return std::nullopt;
    }
    // A value typed in code must have the schema's type (an int is accepted for a float);
    // a STRING value is YAML text to convert. ENUM/STRING both carry string_value.
    const bool from_text = in.type == QR_OPTION_STRING || in.type == QR_OPTION_ENUM;
    const bool same_type = in.type == schema.type ||
                           (schema.type == QR_OPTION_FLOAT && in.type == QR_OPTION_INT);
    if (!from_text && !same_type) {
      fail(in.location, path, expected + ", got a value of type " + option_type_name(in.type));
      return std::nullopt;
    }
    std::optional<OptionValue> out;
    switch (schema.type) {
      case QR_OPTION_BOOL: out = to_bool(in, path, expected); break;
      case QR_OPTION_INT: out = to_int(schema, in, path, expected); break;
      case QR_OPTION_FLOAT: out = to_float(schema, in, path, expected); break;
      case QR_OPTION_ENUM: out = to_enum(schema, in, path); break;
      default:
        // A plugin receives strings as C strings: a NUL byte would silently cut the value.
        if (in.string_value.find('\0') != std::string::npos) {
          fail(in.location, path, quoted(in.string_value) + " holds a NUL byte, which a "
                                  "plugin cannot receive (its strings end at the first NUL)");
          return std::nullopt;
        }
        out = OptionValue::of_string(in.string_value);
        break;
    }
    if (out) out->location = in.location;
    return out;
  }

  static std::string describe_type(const OptionSchema& schema) {
    switch (schema.type) {
      case QR_OPTION_BOOL: return "a bool (true or false)";
      case QR_OPTION_INT: return "an integer";
      case QR_OPTION_FLOAT: return "a number";
      case QR_OPTION_ENUM: return "one of " + join(schema.choices);
      case QR_OPTION_QUANTIZER: return "a nested quantizer spec such as {format: <name>, ...}";
      default: return "a string";
    }
  }

  static std::string got(const OptionValue& in) {
    if (in.type == QR_OPTION_QUANTIZER) return "a nested quantizer spec";
    if (in.type == QR_OPTION_STRING || in.type == QR_OPTION_ENUM)
      return quoted(in.string_value);
    return quoted(in.str()) + " (" + option_type_name(in.type) + ")";
  }

  std::optional<OptionValue> to_bool(const OptionValue& in, const std::string& path,
                                     const std::string& expected) {
    if (in.type == QR_OPTION_BOOL) return OptionValue::of_bool(in.bool_value);
    if (auto value = parse_bool(in.string_value)) return OptionValue::of_bool(*value);
    fail(in.location, path, expected + ", got " + quoted(in.string_value) +
                                " (yes/no and on/off are accepted too, in any case)" +
                                did_you_mean(in.string_value, std::vector<std::string>{
                                                                  "true", "false"}));
    return std::nullopt;
  }

  std::optional<OptionValue> to_int(const OptionSchema& schema, const OptionValue& in,
                                    const std::string& path, const std::string& expected) {
    std::int64_t value = in.int_value;
    if (in.type != QR_OPTION_INT) {
      bool overflow = false;
      const auto parsed = parse_int(in.string_value, overflow);
      if (!parsed) {
        fail(in.location, path,
             overflow ? "integer " + quoted(in.string_value) + " does not fit in 64 bits"
                      : expected + " (decimal digits, no fraction or exponent), got " +
                            quoted(in.string_value));
        return std::nullopt;
      }
      value = *parsed;
    }
    if (bounded(schema) && (static_cast<double>(value) < schema.min_value ||
                            static_cast<double>(value) > schema.max_value)) {
      fail(in.location, path, std::to_string(value) + " is out of range; allowed: " +
                                  range_str(schema) + " (inclusive)");
      return std::nullopt;
    }
    return OptionValue::of_int(value);
  }

  std::optional<OptionValue> to_float(const OptionSchema& schema, const OptionValue& in,
                                      const std::string& path, const std::string& expected) {
    double value = 0;
    if (in.type == QR_OPTION_FLOAT) {
      value = in.float_value;
    } else if (in.type == QR_OPTION_INT) {
      value = static_cast<double>(in.int_value);
    } else if (auto parsed = parse_float(in.string_value)) {
      value = *parsed;
    } else if (const std::string range = out_of_double_range(in.string_value); !range.empty()) {
      fail(in.location, path, quoted(in.string_value) + " " + range);
      return std::nullopt;
    } else {
      fail(in.location, path, expected + " (such as 0, 1.5 or 1e-6), got " +
                                  quoted(in.string_value));
      return std::nullopt;
    }
    if (!std::isfinite(value)) {
      fail(in.location, path, expected + ", got the non-finite value " + number_str(value));
      return std::nullopt;
    }
    if (bounded(schema) && (value < schema.min_value || value > schema.max_value)) {
      fail(in.location, path, number_str(value) + " is out of range; allowed: " +
                                  range_str(schema) + " (inclusive)");
      return std::nullopt;
    }
    return OptionValue::of_float(value);
  }

  std::optional<OptionValue> to_enum(const OptionSchema& schema, const OptionValue& in,
                                     const std::string& path) {
    const auto& choices = schema.choices;
    if (std::find(choices.begin(), choices.end(), in.string_value) != choices.end())
      return OptionValue::of_enum(in.string_value);
    fail(in.location, path, quoted(in.string_value) + " is not a valid " + schema.key +
                                "; choose one of: " + join(choices) +
                                did_you_mean(in.string_value, choices));
    return std::nullopt;
  }

  const Registry& registry_;
  std::vector<Problem> problems_;
};


}  // namespace


CheckedRecipe check_recipe(const Recipe& recipe, const Registry& registry) {
  Validator validator(registry);
  CheckedRecipe out;
  // Pass 1, the schema; the specs that pass it go on to pass 2 (pointers into `out`, which
  // is not resized after the reserve).
  std::vector<SpecToResolve> to_resolve;
  std::size_t before = validator.problems().size();
  out.defaults = validator.spec(recipe.defaults(), "defaults", false);
  if (validator.problems().size() == before) to_resolve.push_back({&out.defaults, nullptr, "defaults"});
  out.rule_quantizers.reserve(recipe.rules().size());
  for (std::size_t i = 0; i < recipe.rules().size(); ++i) {
    const RecipeRule& rule = recipe.rules()[i];
    // A delegating rule has no spec yet: the engine validates (and makes) what its factory
    // returns, when a role asks.
    if (rule.delegates()) {
      out.rule_quantizers.push_back(rule.quantizer);
      continue;
    }
    const std::string path = "rules[" + std::to_string(i) + "].quantizer";
    before = validator.problems().size();
    out.rule_quantizers.push_back(validator.spec(rule.quantizer, path, false));
    if (validator.problems().size() == before)
      to_resolve.push_back({&out.rule_quantizers.back(), &rule.match, path});
  }
  out.problems = std::move(validator.problems());
  // Pass 2: each valid spec made into a quantizer by its plugin.
  if (out.problems.size() < kMaxProblems)
    for (Problem& p : resolve_problems(to_resolve, registry)) out.problems.push_back(std::move(p));
  std::stable_sort(out.problems.begin(), out.problems.end(), [](const Problem& a, const Problem& b) {
    return std::pair(a.location.line, a.location.column) < std::pair(b.location.line, b.location.column);
  });
  if (out.problems.size() > kMaxProblems) {
    const std::size_t dropped = out.problems.size() - (kMaxProblems - 1);
    out.problems.resize(kMaxProblems - 1);
    out.problems.push_back({out.problems.back().location, "",
                            "... and " + std::to_string(dropped) + " more problems, not shown; "
                            "fix these first"});
  }
  return out;
}

// "(and 2 more problems; run `qrecipe recipe check FILE`)" or "".
std::string more_problems(std::size_t extra, const std::string& source) {
  if (extra == 0) return "";
  std::string s = " (and " + std::to_string(extra) + " more problem" + (extra == 1 ? "" : "s");
  if (!source.empty() && source.front() != '<') s += "; run `qrecipe recipe check " + source + "`";
  return s + ")";
}

}  // namespace recipe_internal

using recipe_internal::more_problems;

QuantizerSpec validate_spec(const QuantizerSpec& spec, const Registry& registry) {
  recipe_internal::Validator validator(registry);
  QuantizerSpec typed = validator.spec(spec, "quantizer", false);
  const auto& problems = validator.problems();
  if (!problems.empty())
    throw RecipeError(problems.front().location,
                      problems.front().text() + more_problems(problems.size() - 1, ""));
  return typed;
}

}  // namespace qrecipe
