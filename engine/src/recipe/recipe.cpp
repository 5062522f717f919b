// Recipe (recipe.hpp, docs/recipes.md): loading, parsing and validating a recipe and
// resolving roles against its rules. The work is in parse.cpp, validate.cpp and glob.cpp
// (internal.hpp says what they share).
#include "qrecipe/recipe.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "recipe/internal.hpp"

namespace qrecipe {

using recipe_internal::check_recipe;
using recipe_internal::CheckedRecipe;
using recipe_internal::more_problems;
using recipe_internal::Problem;

namespace {

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

[[noreturn]] void refuse_file_type(const std::string& shown, mode_t mode) {
  QR_THROW("recipe file ", shown, " is not a regular file (", file_type(mode),
           "); a recipe is a YAML file");
}

[[noreturn]] void refuse_file_size(const std::string& shown, std::uint64_t bytes) {
  QR_THROW("recipe file ", shown, " is ", bytes, " bytes, above the limit of ", kRecipeMaxBytes,
           " bytes; a recipe needs a few kilobytes");
}

// The whole text of a recipe file: a regular file (decided by stat before opening, since
// opening a FIFO for reading blocks until a writer comes and /dev/zero never ends) of at most
// kRecipeMaxBytes, read through a descriptor opened without blocking.
std::string read_recipe_file(const std::string& path) {
  const std::string shown = recipe_internal::quoted(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    QR_THROW("cannot open recipe file ", shown, ": ", std::strerror(err),
             "; check the path (relative paths start at the working directory)");
  }
  if (!S_ISREG(st.st_mode)) refuse_file_type(shown, st.st_mode);
  if (static_cast<std::uint64_t>(st.st_size) > kRecipeMaxBytes) refuse_file_size(shown, st.st_size);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    QR_THROW("cannot open recipe file ", shown, ": ", std::strerror(err),
             "; check the path and its permissions");
  }
  std::string text;
  int err = 0;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // replaced since the stat
    ::close(fd);
    refuse_file_type(shown, st.st_mode);
  }
  // One byte more than the limit tells a file that grew since the stat.
  text.resize(kRecipeMaxBytes + 1);
  std::size_t size = 0;
  while (size < text.size()) {
    const ssize_t got = ::read(fd, text.data() + size, text.size() - size);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) err = errno;
    if (got <= 0) break;
    size += static_cast<std::size_t>(got);
  }
  ::close(fd);
  if (err != 0)
    QR_THROW("cannot read recipe file ", shown, ": ", std::strerror(err),
             "; a recipe is a readable YAML file");
  if (size > kRecipeMaxBytes) refuse_file_size(shown, size);
  text.resize(size);
  return text;
}

}  // namespace

Recipe Recipe::load(const std::string& path) { return parse(read_recipe_file(path), path); }

Recipe Recipe::parse(const std::string& yaml_text, const std::string& source_name) {
  recipe_internal::ParsedRecipe parsed = recipe_internal::parse_recipe_text(yaml_text, source_name);
  Recipe recipe;
  recipe.name_ = std::move(parsed.name);
  recipe.version_ = parsed.version;
  recipe.source_ = source_name;
  recipe.defaults_ = std::move(parsed.defaults);
  recipe.rules_ = std::move(parsed.rules);
  recipe.telemetry_ = std::move(parsed.telemetry);
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
