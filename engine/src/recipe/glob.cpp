// Name globs of recipe rules and RuleMatch (recipe.hpp, docs/recipes.md): `*`, `?` and
// `[...]` classes as in shells, over the whole dotted module name.
#include <algorithm>
#include <string>
#include <string_view>

#include "qrecipe/recipe.hpp"
#include "recipe/internal.hpp"

namespace qrecipe {
namespace recipe_internal {
namespace {

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

}  // namespace

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

}  // namespace recipe_internal

using recipe_internal::join;
using recipe_internal::match_class;

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
  // A family ("linear") covers its types (role.hpp, kModuleTypes).
  if (!module_types.empty() &&
      std::none_of(module_types.begin(), module_types.end(), [&](const std::string& type) {
        return module_type_covers(type, role.module_type);
      }))
    return false;
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

}  // namespace qrecipe
