// Recipes (recipe.hpp, DESIGN.md section 5): parsing YAML into rules, matching roles against
// rules, and validating quantizer specs against the loaded plugins' option schemas.
//
// Map of this file:
//   1. small helpers (key paths, "did you mean", number formatting)
//   2. glob_match and RuleMatch
//   3. the parser (YAML -> Recipe): structure only, option values kept as scalar text
//   4. the validator (Recipe/QuantizerSpec x Registry -> typed specs or problems)
//   5. Recipe members and validate_spec
//
// Both the parser and the validator collect every problem they find (a Problem is a location,
// a key path and a message) instead of stopping at the first one, so `qrecipe recipe check`
// can show all of them in one run. How to add a new top-level or match key: add it to the
// kTopLevelKeys / kMatchKeys list (the lists feed the "allowed keys" messages) and handle it
// in parse_recipe / parse_match; then document it in docs/recipes.md.
#include "qrecipe/recipe.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "qrecipe/registry.hpp"

namespace qrecipe {
namespace {

// ---------------------------------------------------------------------------------------------
// 1. Helpers

constexpr int kRecipeVersion = 1;  // the only recipe version this build reads

constexpr std::string_view kTopLevelKeys[] = {"version", "name", "description", "defaults",
                                              "rules"};
constexpr std::string_view kRuleKeys[] = {"match", "quantizer"};
constexpr std::string_view kMatchKeys[] = {"module_type", "tensor_type", "name"};

// One problem found in a recipe or spec; becomes a RecipeError "file:l:c: path: what".
struct Problem {
  SourceLocation location;
  std::string path;  // key path, e.g. "rules[2].quantizer.rowwise.dtype"; may be empty
  std::string what;
  std::string text() const { return path.empty() ? what : path + ": " + what; }
  RecipeError error() const { return RecipeError(location, text()); }
};

template <class Range>
std::string join(const Range& items, std::string_view separator = ", ") {
  std::string s;
  for (const auto& item : items) {
    if (!s.empty()) s += separator;
    s += item;
  }
  return s;
}

std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

// Levenshtein distance, for "did you mean" hints on misspelt keys and values.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "; did you mean 'scaling'?" when candidates lie within two edits (all of the closest ones,
// "'e4m3' or 'e5m2'", when several tie), else "".
template <class Range>
std::string did_you_mean(std::string_view got, const Range& candidates) {
  std::vector<std::string> best;
  std::size_t best_distance = 3;
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(got, candidate);
    if (d > best_distance) continue;
    if (d < best_distance) best.clear();
    best_distance = d;
    best.push_back("'" + std::string(candidate) + "'");
  }
  return best.empty() ? "" : "; did you mean " + join(best, " or ") + "?";
}

// Shortest text that reads back as the same double ("0.001", "1e+30", "1024").
std::string number_str(double v) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

const char* option_type_name(qr_option_type type) {
  switch (type) {
    case QR_OPTION_BOOL: return "bool";
    case QR_OPTION_INT: return "int";
    case QR_OPTION_FLOAT: return "float";
    case QR_OPTION_ENUM: return "enum";
    case QR_OPTION_STRING: return "string";
    case QR_OPTION_QUANTIZER: return "quantizer";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// 2. Globs

// Matches `c` against the character class that opens at pattern[open] == '['. Returns the
// index just past the closing ']', or npos when the class is never closed (the '[' is then a
// literal character). A ']' right after '[' or '[!' is a member, as in shells.
std::size_t match_class(std::string_view pattern, std::size_t open, char c, bool& matched) {
  std::size_t i = open + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool member = false;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    const char lo = pattern[i];
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      const char hi = pattern[i + 2];
      if (lo <= c && c <= hi) member = true;
      i += 3;
    } else {
      if (c == lo) member = true;
      ++i;
    }
  }
  if (i >= pattern.size()) return std::string_view::npos;
  matched = member != negate;
  return i + 1;
}

// Empty if `pattern` is a well-formed glob, else why not (checked when a recipe is parsed, so
// a typo such as "layers.[0-3.fc1" fails early instead of silently matching nothing).
std::string glob_problem(std::string_view pattern) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '[') continue;
    bool ignored = false;
    const std::size_t next = match_class(pattern, i, 'x', ignored);
    if (next == std::string_view::npos)
      return "character class opened at offset " + std::to_string(i) +
             " is never closed; add ']' (or write '[[]' for a literal '[')";
    i = next - 1;
  }
  return "";
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative matching with one backtrack point: on a mismatch, let the last '*' swallow one
  // more character and retry. Linear in practice, never exponential.
  std::size_t p = 0, t = 0;
  std::size_t star = std::string_view::npos, star_text = 0;
  while (t < text.size()) {
    bool advanced = false;
    if (p < pattern.size()) {
      const char pc = pattern[p];
      if (pc == '*') {
        star = p++;
        star_text = t;
        continue;
      }
      if (pc == '?') {
        ++p, ++t;
        continue;
      }
      if (pc == '[') {
        bool matched = false;
        const std::size_t next = match_class(pattern, p, text[t], matched);
        if (next == std::string_view::npos) {
          advanced = text[t] == '[';  // unclosed class: a literal '['
          if (advanced) ++p, ++t;
        } else if (matched) {
          p = next, ++t;
          advanced = true;
        }
      } else if (pc == text[t]) {
        ++p, ++t;
        advanced = true;
      }
    }
    if (advanced) continue;
    if (star == std::string_view::npos) return false;
    p = star + 1;
    t = ++star_text;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool RuleMatch::matches(const QuantizerRole& role) const {
  auto any_equal = [](const std::vector<std::string>& list, const std::string& value) {
    return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
  };
  if (!any_equal(module_types, role.module_type)) return false;
  if (!any_equal(tensor_types, role.tensor_type)) return false;
  if (names.empty()) return true;
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& glob) { return glob_match(glob, role.name); });
}

std::string RuleMatch::str() const {
  std::vector<std::string> parts;
  auto add = [&](const char* key, const std::vector<std::string>& values) {
    if (values.empty()) return;
    parts.push_back(std::string(key) + ": " +
                    (values.size() == 1 ? values[0] : "[" + join(values) + "]"));
  };
  add("module_type", module_types);
  add("tensor_type", tensor_types);
  add("name", names);
  return "{" + join(parts) + "}";
}

namespace {

// ---------------------------------------------------------------------------------------------
// 3. Parser: YAML -> rules and untyped specs

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    case YAML::NodeType::Null: return "nothing (null)";
    default: return "an undefined node";
  }
}

struct ParsedRecipe {
  std::string name = "unnamed";
  int version = kRecipeVersion;
  QuantizerSpec defaults;
  std::vector<RecipeRule> rules;
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  std::vector<Problem>& problems() { return problems_; }

  ParsedRecipe recipe(const YAML::Node& root) {
    ParsedRecipe out;
    out.defaults.location = at(root);
    if (!root.IsMap()) {
      fail(root, "", "a recipe is a YAML map with the keys " + join(kTopLevelKeys) + "; got " +
                         describe_node(root));
      return out;
    }
    bool has_version = false;
    for_each_entry(root, "", kTopLevelKeys, "top-level key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& path) {
                     if (key == "version") {
                       has_version = true;
                       out.version = version(value, path);
                     } else if (key == "name") {
                       if (auto s = string_scalar(value, path)) out.name = *s;
                     } else if (key == "description") {
                       string_scalar(value, path);  // documentation only; checked, not kept
                     } else if (key == "defaults") {
                       out.defaults = spec(value, path);
                     } else if (key == "rules") {
                       out.rules = rules(value, path);
                     }
                   });
    if (!has_version)
      fail(root, "", "missing required key 'version'; add `version: " +
                         std::to_string(kRecipeVersion) + "` (this build reads recipe version " +
                         std::to_string(kRecipeVersion) + ")");
    return out;
  }

  SourceLocation at(const YAML::Node& node) const {
    YAML::Mark mark = node.Mark();
    // A null value (`match:` with nothing after it) carries the mark of the next token, which
    // may be lines below; point at its key instead.
    if (node.IsNull())
      for (const auto& [value, key_mark] : null_values_)
        if (value.is(node)) mark = key_mark;
    if (mark.is_null()) return {file_, 0, 0};
    return {file_, mark.line + 1, mark.column + 1};  // yaml-cpp marks are 0-based
  }

 private:
  void fail(const YAML::Node& node, std::string path, std::string what) {
    problems_.push_back({at(node), std::move(path), std::move(what)});
  }

  // Calls fn(key, value, key_path) for each entry of `map` whose key is a unique string and, if
  // `allowed` is not empty, one of `allowed`; reports every other key.
  template <class Allowed, class Fn>
  void for_each_entry(const YAML::Node& map, const std::string& path, const Allowed& allowed,
                      std::string_view what_key, Fn&& fn) {
    std::set<std::string> seen;
    for (const auto& entry : map) {
      const YAML::Node& key_node = entry.first;
      if (!key_node.IsScalar()) {
        fail(key_node, path, "keys must be plain strings; got " + describe_node(key_node));
        continue;
      }
      if (entry.second.IsNull()) null_values_.emplace_back(entry.second, key_node.Mark());
      const std::string key = key_node.Scalar();
      const std::string key_path = child_path(path, key);
      if (!seen.insert(key).second) {
        fail(key_node, key_path, "duplicate key '" + key + "'; keep only one");
        continue;
      }
      if (std::begin(allowed) != std::end(allowed) &&
          std::find(std::begin(allowed), std::end(allowed), key) == std::end(allowed)) {
        fail(key_node, key_path,
             "unknown " + std::string(what_key) + " '" + key + "'; allowed keys: " +
                 join(allowed) + did_you_mean(key, allowed));
        continue;
      }
      fn(key, entry.second, key_path);
    }
  }

  std::optional<std::string> string_scalar(const YAML::Node& node, const std::string& path) {
    if (node.IsScalar()) return node.Scalar();
    fail(node, path, "expected a string, got " + describe_node(node));
    return std::nullopt;
  }

  int version(const YAML::Node& node, const std::string& path) {
    const std::string supported = "this build reads recipe version " +
                                  std::to_string(kRecipeVersion);
    if (!node.IsScalar()) {
      fail(node, path, "expected an integer, got " + describe_node(node) + "; " + supported);
      return kRecipeVersion;
    }
    const std::string& text = node.Scalar();
    int value = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
    if (result.ec != std::errc() || result.ptr != text.data() + text.size()) {
      fail(node, path, "expected an integer, got '" + text + "'; " + supported);
      return kRecipeVersion;
    }
    if (value != kRecipeVersion)
      fail(node, path, "recipe version " + text + " is not supported; " + supported +
                           " (use a newer qrecipe, or write the recipe in version " +
                           std::to_string(kRecipeVersion) + ")");
    return value;
  }

  std::vector<RecipeRule> rules(const YAML::Node& node, const std::string& path) {
    std::vector<RecipeRule> out;
    if (node.IsNull()) return out;  // `rules:` with nothing under it: no rules
    if (!node.IsSequence()) {
      fail(node, path, "expected a list of rules ('- match: ...' entries), got " +
                           describe_node(node));
      return out;
    }
    for (std::size_t i = 0; i < node.size(); ++i)
      out.push_back(rule(node[i], path + "[" + std::to_string(i) + "]"));
    return out;
  }

  RecipeRule rule(const YAML::Node& node, const std::string& path) {
    RecipeRule out;
    out.location = at(node);
    out.quantizer.location = out.location;
    if (!node.IsMap()) {
      fail(node, path, "a rule is a map {match: {...}, quantizer: {...}}; got " +
                           describe_node(node));
      return out;
    }
    bool has_match = false, has_quantizer = false;
    for_each_entry(node, path, kRuleKeys, "rule key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& key_path) {
                     if (key == "match") {
                       has_match = true;
                       out.match = match(value, key_path);
                     } else {
                       has_quantizer = true;
                       out.quantizer = spec(value, key_path);
                     }
                   });
    if (!has_match)
      fail(node, path, "missing required key 'match'; write `match: {}` to match every role");
    if (!has_quantizer)
      fail(node, path, "missing required key 'quantizer', e.g. `quantizer: {format: float8}`");
    return out;
  }

  RuleMatch match(const YAML::Node& node, const std::string& path) {
    RuleMatch out;
    if (!node.IsMap()) {
      fail(node, path, "expected a map with any of the keys " + join(kMatchKeys) +
                           " (or {} to match every role), got " + describe_node(node));
      return out;
    }
    for_each_entry(node, path, kMatchKeys, "match key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& key_path) {
                     if (key == "module_type") {
                       out.module_types = string_list(value, key_path);
                     } else if (key == "tensor_type") {
                       out.tensor_types = tensor_types(value, key_path);
                     } else {
                       out.names = globs(value, key_path);
                     }
                   });
    return out;
  }

  // A string or a non-empty list of strings (any of).
  std::vector<std::string> string_list(const YAML::Node& node, const std::string& path) {
    std::vector<std::string> out;
    if (node.IsScalar()) {
      out.push_back(node.Scalar());
    } else if (node.IsSequence()) {
      if (node.size() == 0)
        fail(node, path, "an empty list matches nothing; remove the key to match any value");
      for (std::size_t i = 0; i < node.size(); ++i) {
        const std::string item_path = path + "[" + std::to_string(i) + "]";
        if (auto s = string_scalar(node[i], item_path)) out.push_back(*s);
      }
    } else {
      fail(node, path, "expected a string or a list of strings, got " + describe_node(node));
    }
    return out;
  }

  std::vector<std::string> tensor_types(const YAML::Node& node, const std::string& path) {
    std::vector<std::string> out = string_list(node, path);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto& value = out[i];
      if (std::find(std::begin(kTensorTypes), std::end(kTensorTypes), value) ==
          std::end(kTensorTypes)) {
        const YAML::Node item = node.IsSequence() ? node[i] : node;
        fail(item, node.IsSequence() ? path + "[" + std::to_string(i) + "]" : path,
             "unknown tensor_type '" + value + "'; allowed: " + join(kTensorTypes) +
                 did_you_mean(value, kTensorTypes));
      }
    }
    return out;
  }

  std::vector<std::string> globs(const YAML::Node& node, const std::string& path) {
    std::vector<std::string> out = string_list(node, path);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::string why = glob_problem(out[i]);
      if (!why.empty())
        fail(node.IsSequence() ? node[i] : node,
             node.IsSequence() ? path + "[" + std::to_string(i) + "]" : path,
             "bad name glob '" + out[i] + "': " + why);
    }
    return out;
  }

  // A quantizer spec: {format: NAME, option: value, ...}; a map value is a nested spec.
  QuantizerSpec spec(const YAML::Node& node, const std::string& path) {
    QuantizerSpec out;
    out.location = at(node);
    if (!node.IsMap()) {
      fail(node, path, "a quantizer spec is a map with a 'format' key, e.g. {format: float8} "
                       "or {format: none}; got " + describe_node(node));
      return out;
    }
    bool has_format = false;
    const std::vector<std::string_view> any_key;  // option keys are checked by the validator
    for_each_entry(node, path, any_key, "key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& key_path) {
                     if (key == "format") {
                       if (value.IsScalar() && !value.Scalar().empty()) {
                         has_format = true;
                         out.format = value.Scalar();
                       } else {
                         has_format = true;  // reported here, not again as missing
                         fail(value, key_path, "expected a format name (float8, ..., or none), "
                                               "got " + describe_node(value));
                       }
                       return;
                     }
                     if (value.IsScalar()) {
                       OptionValue option = OptionValue::of_string(value.Scalar());
                       option.location = at(value);
                       out.options.emplace_back(key, std::move(option));
                     } else if (value.IsMap()) {
                       OptionValue option = OptionValue::of_spec(spec(value, key_path));
                       option.location = at(value);
                       out.options.emplace_back(key, std::move(option));
                     } else if (value.IsSequence()) {
                       fail(value, key_path, "a list is not a valid option value (no option "
                                             "takes a list); give a single value");
                     } else {
                       fail(value, key_path, "option has no value; give one or remove the key");
                     }
                   });
    if (!has_format) {
      fail(node, path, "missing required key 'format' (a format name such as float8, or none)");
    } else if (out.is_none() && !out.options.empty()) {
      fail(node[out.options.front().first], child_path(path, out.options.front().first),
           "format none keeps high precision and takes no options; remove '" +
               out.options.front().first + "'");
    }
    return out;
  }

  std::string file_;
  std::vector<Problem> problems_;
  std::vector<std::pair<YAML::Node, YAML::Mark>> null_values_;  // null value -> its key's mark
};

// Problems of a parse, thrown as one RecipeError: the first problem's location, then every
// other problem on its own line, so one run shows them all.
[[noreturn]] void throw_problems(const std::vector<Problem>& problems) {
  const Problem& first = problems.front();
  std::string message = first.text();
  if (problems.size() > 1) {
    for (std::size_t i = 1; i < problems.size(); ++i)
      message += "\n" + problems[i].location.str() + ": " + problems[i].text();
    message += "\n(" + std::to_string(problems.size()) + " problems in all)";
  }
  throw RecipeError(first.location, message);
}

// ---------------------------------------------------------------------------------------------
// 4. Validator: specs x plugin schemas -> typed specs

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
    if (in.is_none()) {
      if (!in.options.empty())
        fail(in.options.front().second.location, child_path(path, in.options.front().first),
             "format none keeps high precision and takes no options; remove '" +
                 in.options.front().first + "'");
      return out;
    }
    const auto plugin = registry_.find(in.format);
    if (!plugin) {
      fail(in.location, child_path(path, "format"), unknown_format(in.format));
      return out;
    }
    if (nested && plugin->takes_quantizers())
      fail(in.location, child_path(path, "format"),
           "nesting a hybrid in a hybrid: format '" + in.format +
               "' takes nested quantizers itself, so it cannot be one; use a single format "
               "here (e.g. {format: float8})");
    std::set<std::string> seen;
    for (const auto& [key, value] : in.options) {
      const std::string key_path = child_path(path, key);
      if (!seen.insert(key).second) {
        fail(value.location, key_path, "option '" + key + "' is given twice; keep only one");
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

  std::string unknown_format(const std::string& format) const {
    std::string message = "unknown format '" + format + "'; loaded formats: " +
                          registry_.loaded_names();
    std::vector<std::string> names;
    for (const auto& plugin : registry_.plugins()) names.push_back(plugin->name());
    message += did_you_mean(format, names);
    if (!registry_.failures().empty()) {
      std::vector<std::string> failures;
      for (const auto& failure : registry_.failures())
        failures.push_back(failure.path + ": " + failure.cause);
      message += " (plugin load failures: " + join(failures, "; ") + ")";
    }
    return message + "; run `qrecipe plugins -v` to see where plugins are searched "
                     "(QRECIPE_PLUGIN_PATH adds directories)";
  }

  static std::string unknown_option(const FormatPlugin& plugin, const std::string& key) {
    if (plugin.options().empty())
      return "unknown option '" + key + "': format '" + plugin.name() + "' takes no options";
    std::vector<std::string> keys;
    for (const auto& schema : plugin.options()) keys.push_back(schema.key);
    return "unknown option '" + key + "' for format '" + plugin.name() + "'; its options are: " +
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
      default: out = OptionValue::of_string(in.string_value); break;
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
      case QR_OPTION_QUANTIZER: return "a nested quantizer spec such as {format: float8}";
      default: return "a string";
    }
  }

  static std::string got(const OptionValue& in) {
    if (in.type == QR_OPTION_QUANTIZER) return "a nested quantizer spec";
    if (in.type == QR_OPTION_STRING || in.type == QR_OPTION_ENUM)
      return "'" + in.string_value + "'";
    return "'" + in.str() + "' (" + option_type_name(in.type) + ")";
  }

  std::optional<OptionValue> to_bool(const OptionValue& in, const std::string& path,
                                     const std::string& expected) {
    if (in.type == QR_OPTION_BOOL) return OptionValue::of_bool(in.bool_value);
    if (auto value = parse_bool(in.string_value)) return OptionValue::of_bool(*value);
    fail(in.location, path, expected + ", got '" + in.string_value +
                                "' (yes/no and on/off are accepted too, in any case)" +
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
             overflow ? "integer '" + in.string_value + "' does not fit in 64 bits"
                      : expected + " (decimal digits, no fraction or exponent), got '" +
                            in.string_value + "'");
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
    } else {
      fail(in.location, path, expected + " (such as 0, 1.5 or 1e-6), got '" + in.string_value +
                                  "'");
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
    fail(in.location, path, "'" + in.string_value + "' is not a valid " + schema.key +
                                "; choose one of: " + join(choices) +
                                did_you_mean(in.string_value, choices));
    return std::nullopt;
  }

  const Registry& registry_;
  std::vector<Problem> problems_;
};

// Validates every spec of a recipe; typed copies of the defaults and rule quantizers.
struct CheckedRecipe {
  std::vector<Problem> problems;
  QuantizerSpec defaults;
  std::vector<QuantizerSpec> rule_quantizers;
};

CheckedRecipe check_recipe(const Recipe& recipe, const Registry& registry) {
  Validator validator(registry);
  CheckedRecipe out;
  out.defaults = validator.spec(recipe.defaults(), "defaults", false);
  for (std::size_t i = 0; i < recipe.rules().size(); ++i)
    out.rule_quantizers.push_back(validator.spec(
        recipe.rules()[i].quantizer, "rules[" + std::to_string(i) + "].quantizer", false));
  out.problems = std::move(validator.problems());
  return out;
}

// "(and 2 more problems; run `qrecipe recipe check FILE`)" or "".
std::string more_problems(std::size_t extra, const std::string& source) {
  if (extra == 0) return "";
  std::string s = " (and " + std::to_string(extra) + " more problem" + (extra == 1 ? "" : "s");
  if (!source.empty() && source.front() != '<') s += "; run `qrecipe recipe check " + source + "`";
  return s + ")";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// 5. Recipe

Recipe Recipe::load(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) {
    const int err = errno;
    QR_THROW("cannot open recipe file '", path, "': ", std::strerror(err),
             "; check the path (relative paths start at the working directory)");
  }
  std::string text;
  char buffer[1 << 14];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, got);
  const bool failed = std::ferror(file) != 0;
  const int err = errno;
  std::fclose(file);
  if (failed)
    QR_THROW("cannot read recipe file '", path, "': ", std::strerror(err),
             "; a recipe is a readable YAML file");
  return parse(text, path);
}

Recipe Recipe::parse(const std::string& yaml_text, const std::string& source_name) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    // e.mark is 0-based; e.msg is the parser's message without the position prefix.
    SourceLocation where{source_name, 0, 0};
    if (!e.mark.is_null()) where = {source_name, e.mark.line + 1, e.mark.column + 1};
    throw RecipeError(where, "YAML syntax error: " + e.msg);
  }
  if (documents.empty())
    throw RecipeError({source_name, 1, 1}, "the recipe is empty; a recipe needs at least "
                                           "`version: 1` (see docs/recipes.md)");
  Parser parser(source_name);
  if (documents.size() > 1)
    throw RecipeError(parser.at(documents[1]),
                      "a recipe file holds one YAML document, found " +
                          std::to_string(documents.size()) + "; remove the extra '---'");
  ParsedRecipe parsed = parser.recipe(documents.front());
  if (!parser.problems().empty()) throw_problems(parser.problems());

  Recipe recipe;
  recipe.name_ = std::move(parsed.name);
  recipe.version_ = parsed.version;
  recipe.source_ = source_name;
  recipe.defaults_ = std::move(parsed.defaults);
  recipe.rules_ = std::move(parsed.rules);
  return recipe;
}

Recipe Recipe::uniform(const QuantizerSpec& spec, const std::string& name) {
  Recipe recipe;
  recipe.name_ = name;
  recipe.defaults_ = spec;
  return recipe;
}

std::vector<RecipeError> Recipe::check(const Registry& registry) const {
  std::vector<RecipeError> errors;
  for (const Problem& problem : check_recipe(*this, registry).problems)
    errors.push_back(problem.error());
  return errors;
}

void Recipe::validate(const Registry& registry) {
  CheckedRecipe checked = check_recipe(*this, registry);
  if (!checked.problems.empty()) {
    const Problem& first = checked.problems.front();
    throw RecipeError(first.location,
                      first.text() + more_problems(checked.problems.size() - 1, source_));
  }
  defaults_ = std::move(checked.defaults);
  for (std::size_t i = 0; i < rules_.size(); ++i)
    rules_[i].quantizer = std::move(checked.rule_quantizers[i]);
  validated_ = true;
}

int Recipe::match(const QuantizerRole& role) const {
  for (std::size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].match.matches(role)) return static_cast<int>(i);
  return -1;
}

const QuantizerSpec& Recipe::resolve(const QuantizerRole& role) const {
  const int index = match(role);
  return index < 0 ? defaults_ : rules_[static_cast<std::size_t>(index)].quantizer;
}

QuantizerSpec validate_spec(const QuantizerSpec& spec, const Registry& registry) {
  Validator validator(registry);
  QuantizerSpec typed = validator.spec(spec, "quantizer", false);
  const auto& problems = validator.problems();
  if (!problems.empty())
    throw RecipeError(problems.front().location,
                      problems.front().text() + more_problems(problems.size() - 1, ""));
  return typed;
}

}  // namespace qrecipe
