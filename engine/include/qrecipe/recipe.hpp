// Recipe: an ordered list of rules mapping quantizer roles to quantizer specs (DESIGN.md
// section 5), parsed from YAML.
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
#pragma once

#include <string>
#include <vector>

#include "qrecipe/error.hpp"
#include "qrecipe/role.hpp"
#include "qrecipe/spec.hpp"

namespace qrecipe {

class Registry;

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

class Recipe {
 public:
  static Recipe load(const std::string& path);  // throws RecipeError / Error (file unreadable)
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
  std::string name_ = "unnamed";
  int version_ = 1;
  std::string source_;
  QuantizerSpec defaults_;
  std::vector<RecipeRule> rules_;
  bool validated_ = false;
};

// Validates one spec against the registry (the checks Recipe::check runs per quantizer) and
// returns the typed copy; throws RecipeError. Used for specs made in code too.
QuantizerSpec validate_spec(const QuantizerSpec& spec, const Registry& registry);

}  // namespace qrecipe
