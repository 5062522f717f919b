// Recipe (recipe.hpp, docs/recipes.md): loading, parsing and validating a recipe and
// resolving roles against its rules. The work is in parse.cpp, validate.cpp and glob.cpp
// (internal.hpp says what they share).
#include "qrecipe/recipe.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "recipe/internal.hpp"

namespace qrecipe {

using recipe_internal::check_recipe;
using recipe_internal::CheckedRecipe;
using recipe_internal::more_problems;
using recipe_internal::Problem;

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
  recipe_internal::ParsedRecipe parsed = recipe_internal::parse_recipe_text(yaml_text, source_name);
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

Recipe Recipe::from_factory(const std::string& factory, const std::string& name,
                            const std::string& source) {
  QR_CHECK(!factory.empty(), "Recipe::from_factory needs a factory reference");
  Recipe recipe;
  recipe.name_ = name;
  recipe.source_ = source;
  RecipeRule rule;  // match: {} -> every role
  rule.factory = factory;
  rule.location = {source, 0, 0};
  rule.quantizer.location = rule.location;
  recipe.rules_.push_back(std::move(rule));
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
  if (index < 0) return defaults_;
  const RecipeRule& rule = rules_[static_cast<std::size_t>(index)];
  if (rule.delegates())
    throw RecipeError(rule.location,
                      "rules[" + std::to_string(index) + "] delegates role " + role.str() +
                          " to the factory '" + rule.factory + "', which only an engine with a "
                          "factory resolver can call (the Python adapter: qrecipe.Recipe); the "
                          "recipe alone cannot say what the role gets");
  return rule.quantizer;
}

std::string Recipe::decider_str(const QuantizerRole& role) const {
  const int index = match(role);
  if (index < 0) return "defaults (" + defaults_.location.str() + ")";
  return "rules[" + std::to_string(index) + "] (" +
         rules_[static_cast<std::size_t>(index)].location.str() + ")";
}

}  // namespace qrecipe
