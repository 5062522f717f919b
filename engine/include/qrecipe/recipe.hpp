// Recipe: an ordered list of rules mapping quantizer roles to quantizer specs
// (docs/recipes.md), parsed from YAML.
//
//   version: 1
//   name: my-recipe
//   defaults: {format: none}          # used when no rule matches
//   rules:                            # first match wins
//     - match: {module_type: linear, tensor_type: [input, weight], name: "layers.*"}
//       quantizer: {format: myformat, scaling: current}
//
// Parsing (Recipe::load / Recipe::parse) checks the structure: YAML syntax, `version`, known
// top-level and match keys, a `format` in every quantizer. Option values stay untyped (the
// YAML scalar text) until Recipe::validate checks them against each plugin's schema (unknown
// formats, unknown keys, wrong types, enum choices, bounds, forbidden nesting) and converts
// them. Every error names file:line:column and the key path; `check` collects all of them.
// Validation also makes every spec into a quantizer through its plugin (per tensor type the
// rule can match), so option combinations only the plugin knows fail there too, not at first
// use.
//
// Limits (docs/recipes.md "Limits"): a recipe file must be a regular file of at most
// kRecipeMaxBytes; its YAML may nest at most kRecipeMaxDepth collections deep and expand (YAML
// aliases copied where they are used) to at most kRecipeMaxNodes nodes. Each limit is a
// RecipeError at the place that crosses it; nothing reads, walks or allocates past it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qrecipe/error.hpp"
#include "qrecipe/role.hpp"
#include "qrecipe/spec.hpp"

namespace qrecipe {

class Registry;

inline constexpr std::size_t kRecipeMaxBytes = std::size_t{1} << 20;  // 1 MiB
inline constexpr int kRecipeMaxDepth = 64;                             // nested maps and lists
inline constexpr std::uint64_t kRecipeMaxNodes = 100000;               // after alias expansion
inline constexpr std::size_t kRecipeMaxProblems = 100;                 // reported by one check

namespace recipe_internal {
struct RecipeAccess;
}

// An error in a recipe file: message already prefixed with "file:line:column: ".
class RecipeError : public Error {
 public:
  RecipeError(SourceLocation location, const std::string& message)
      : Error(QR_STATUS_INVALID_ARGUMENT, "", location.str() + ": " + message),
        location_(std::move(location)) {}
  const SourceLocation& location() const { return location_; }

 private:
  SourceLocation location_;
};

// Shell-style glob: '*' any run of characters (dots included), '?' one character,
// '[abc]' / '[a-z]' / '[!a]' a character class.
bool glob_match(std::string_view pattern, std::string_view text);

struct RuleMatch {
  std::vector<std::string> module_types;  // any of; empty = any
  std::vector<std::string> tensor_types;  // any of; empty = any
  std::vector<std::string> names;         // globs, any of; empty = any
  bool matches(const QuantizerRole& role) const;
  std::string str() const;  // "{module_type: linear, tensor_type: [input, weight]}"
};

// A rule decides its roles' spec itself (`quantizer:`) or delegates them to a factory
// (`factory: package.module:function`): a function the host (the Python adapter) calls once
// per role, whose answer the engine validates like any spec (Engine::set_factory_resolver).
struct RecipeRule {
  RuleMatch match;
  QuantizerSpec quantizer;  // unused when the rule delegates
  std::string factory;      // "" unless the rule delegates
  SourceLocation location;

  bool delegates() const { return !factory.empty(); }
  // What the rule gives: the spec's str(), or "factory package.module:function".
  std::string decision_str() const { return delegates() ? "factory " + factory : quantizer.str(); }
};

// `telemetry: {every: N, roles: [glob, ...]}`: which quantizations the adapter gathers
// numerics statistics of (docs/adapter.md, telemetry). The engine parses and checks the key;
// the statistics are the adapter's. `roles` are globs on the role string
// "module_type:tensor_type@name" (empty: every role).
struct TelemetrySettings {
  int every = 0;  // every N-th quantization of a role; 0: the recipe has no telemetry key
  std::vector<std::string> roles;
  SourceLocation location;
  bool enabled() const { return every > 0; }
};

class Recipe {
 public:
  // Throws RecipeError, or Error when the file is unreadable, not a regular file (a FIFO, a
  // device, a directory: refused before it is opened) or larger than kRecipeMaxBytes.
  static Recipe load(const std::string& path);
  static Recipe parse(const std::string& yaml_text, const std::string& source_name = "<string>");
  // A recipe with no rules whose defaults are `spec` (e.g. the whole model in one format).
  static Recipe uniform(const QuantizerSpec& spec, const std::string& name = "uniform");
  // A recipe whose one rule (`match: {}`) delegates every role to `factory` (any non-empty
  // reference the engine's factory resolver understands; a Python callable's display name for
  // `qrecipe.Recipe.from_factory`). `source` is what errors and `explain` name.
  static Recipe from_factory(const std::string& factory, const std::string& name,
                             const std::string& source);

  // All validation problems against the loaded plugins (empty = valid).
  std::vector<RecipeError> check(const Registry& registry) const;
  // Throws the first problem of check() (the message lists how many more there are); on
  // success converts every option to its schema type.
  void validate(const Registry& registry);
  bool validated() const { return validated_; }

  const std::string& name() const { return name_; }
  int version() const { return version_; }
  const std::string& source() const { return source_; }
  const QuantizerSpec& defaults() const { return defaults_; }
  const std::vector<RecipeRule>& rules() const { return rules_; }
  const TelemetrySettings& telemetry() const { return telemetry_; }

  // Index of the first matching rule, or -1 when the defaults apply.
  int match(const QuantizerRole& role) const;
  // The spec of the deciding rule (or the defaults). A rule that delegates to a factory has
  // none here: that is a RecipeError naming the rule (Engine::resolve calls the factory).
  const QuantizerSpec& resolve(const QuantizerRole& role) const;
  // "rules[2] (file:7:5)" or "defaults (file)": who decides `role` (explain, errors).
  std::string decider_str(const QuantizerRole& role) const;

  // What a reader of the recipe would want to know about it applied to `roles` (the roles of a
  // model's modules): each rule that matches none of them, each rule that matches some but is
  // always beaten by an earlier rule, and each role that no rule matches and the defaults
  // leave in high precision while a rule would quantize it but for its module_type or name.
  // One line per finding, grouped per module; empty when there is nothing to say.
  std::vector<std::string> coverage(const std::vector<QuantizerRole>& roles) const;

 private:
  friend struct recipe_internal::RecipeAccess;
  std::string name_ = "unnamed";
  int version_ = 1;
  std::string source_;
  QuantizerSpec defaults_;
  std::vector<RecipeRule> rules_;
  TelemetrySettings telemetry_;
  bool validated_ = false;
};

// Validates one spec against the registry (the checks Recipe::check runs per quantizer) and
// returns the typed copy; throws RecipeError. Used for specs made in code too.
QuantizerSpec validate_spec(const QuantizerSpec& spec, const Registry& registry);

}  // namespace qrecipe
