// Internal to the recipe implementation (engine/src/recipe/*.cpp), never installed: what the
// parser, the validator and the Recipe members share. docs/recipes.md.
//
//   glob.cpp             glob_match, RuleMatch, and the pattern check the parser uses
//   yaml_limits.cpp      size, depth and alias-expansion limits, before any node is walked
//   parse.cpp            YAML text -> ParsedRecipe (structure only, option values as text)
//   validate.cpp         specs x the loaded plugins' schemas -> typed specs or Problems
//   resolve_check.cpp    valid specs made into quantizers by their plugins -> Problems
//   recipe.cpp           the Recipe members (load, parse, check, validate, resolve)
//   coverage.cpp         Recipe::coverage: rules that match nothing, roles a rule nearly covers
//
// The parser and the validator collect every problem they find (a Problem is a location, a
// key path and a message) instead of stopping at the first, so `qrecipe recipe check` shows
// them all in one run.
#pragma once

#include "internal_visibility.hpp"

#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "qrecipe/recipe.hpp"
#include "qrecipe/registry.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::recipe_internal {

constexpr int kRecipeVersion = 1;  // the only recipe version this build reads
constexpr std::size_t kMaxRecipeBytes = kRecipeMaxBytes;
constexpr int kMaxYamlDepth = kRecipeMaxDepth;
constexpr std::uint64_t kMaxYamlNodes = kRecipeMaxNodes;
constexpr std::size_t kMaxProblems = kRecipeMaxProblems;
// The largest `telemetry: every:` accepted (larger values are refused, not clamped).
constexpr int kMaxTelemetryEvery = 1000000000;

// Recipe's private parts for the implementation files.
struct RecipeAccess {
  // A recipe of `spec` alone, marked validated without a check (the resolve pass's throwaway
  // engine: checking it would resolve again).
  static Recipe validated_uniform(const QuantizerSpec& spec) {
    Recipe recipe = Recipe::uniform(spec, "recipe check");
    recipe.validated_ = true;
    return recipe;
  }
};

// User text quoted for a message: 'text', escaped by printable() (error.hpp).
inline std::string quoted(std::string_view text) { return "'" + printable(text) + "'"; }

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

inline std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? printable(key) : parent + "." + printable(key);
}

// Levenshtein distance, for "did you mean" hints on misspelt keys and values.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
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
  if (got.size() > 64) return "";  // no typo of a short name is that long (and the distance is quadratic)
  std::vector<std::string> best;
  std::size_t best_distance = 3;
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(got, candidate);
    if (d > best_distance) continue;
    if (d < best_distance) best.clear();
    best_distance = d;
    best.push_back(quoted(candidate));
  }
  return best.empty() ? "" : "; did you mean " + join(best, " or ") + "?";
}

// Shortest text that reads back as the same double ("0.001", "1e+30", "1024").
inline std::string number_str(double v) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

// Why `pattern` is not a valid name glob ("" when it is): glob.cpp.
std::string glob_problem(std::string_view pattern);

// What the parser reads from a recipe file before validation.
struct ParsedRecipe {
  std::string name = "unnamed";
  int version = kRecipeVersion;
  QuantizerSpec defaults;
  std::vector<RecipeRule> rules;
  TelemetrySettings telemetry;
};

// Throws RecipeError (file:line:column of the crossing) when the text is larger than
// kMaxRecipeBytes, nests deeper than kMaxYamlDepth or expands to more than kMaxYamlNodes
// nodes, or holds an alias inside the node it refers to; YAML syntax errors propagate as
// YAML::Exception. yaml_limits.cpp.
void check_yaml_limits(const std::string& text, const std::string& source_name);

// Parses one YAML recipe text; throws RecipeError listing every problem (file:line:column).
ParsedRecipe parse_recipe_text(const std::string& yaml_text, const std::string& source_name);

// Validates every spec of a recipe; typed copies of the defaults and rule quantizers.
struct CheckedRecipe {
  std::vector<Problem> problems;
  QuantizerSpec defaults;
  std::vector<QuantizerSpec> rule_quantizers;
};

// Both passes: the schema of every spec, then (for each spec without schema problems) its
// quantizer made by the plugin. At most kMaxProblems problems, the last one saying so.
CheckedRecipe check_recipe(const Recipe& recipe, const Registry& registry);

// The resolve pass (resolve_check.cpp): each spec made into a quantizer for every tensor type
// `match` allows (all when null or empty); the problems the plugins report, one per spec.
struct SpecToResolve {
  const QuantizerSpec* spec = nullptr;
  const RuleMatch* match = nullptr;  // null for the defaults
  std::string path;                  // "defaults", "rules[2].quantizer"
};
std::vector<Problem> resolve_problems(const std::vector<SpecToResolve>& specs,
                                      const Registry& registry);

// "(and 2 more problems; run `qrecipe recipe check FILE`)" or "".
std::string more_problems(std::size_t extra, const std::string& source);

}  // namespace qrecipe::recipe_internal
QR_INTERNAL_END
