// Recipe::coverage (recipe.hpp): what a recipe does to a given list of roles that its author
// probably did not mean, for `qrecipe recipe check FILE --module ...` and
// `qrecipe.Recipe.check(model)`:
//   - a rule that matches none of the roles (a misspelt name glob, a module type the model
//     does not have);
//   - a rule that matches roles but never decides one (an earlier rule always wins);
//   - a role that no rule matches, left in high precision by the defaults, while a rule that
//     quantizes would match it but for its module_type or its name: the author most likely
//     meant the rule to cover it.
// Findings about roles are grouped per role name, so a module's three roles give one line.
#include <algorithm>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "qrecipe/recipe.hpp"
#include "recipe/internal.hpp"

namespace qrecipe {

using recipe_internal::join;

namespace {

std::string rule_str(const Recipe& recipe, std::size_t i) {
  const RecipeRule& rule = recipe.rules()[i];
  return "rules[" + std::to_string(i) + "] " + rule.match.str() + " (" + rule.location.str() +
         ")";
}

// Up to `limit` distinct values in first-seen order, then ", ..." when there are more.
std::string sample(const std::vector<std::string>& values, std::size_t limit) {
  std::vector<std::string> seen;
  bool more = false;
  for (const auto& v : values) {
    if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
    if (seen.size() == limit) {
      more = true;
      break;
    }
    seen.push_back(v);
  }
  return join(seen) + (more ? ", ..." : "");
}

// Why `match` would match `role` if it were a little looser ("" when it would not):
//   "module_type": it would with its module_type left out (a type its author did not list);
//   "name": it would if its name globs could match a part of the name (`head` for
//           `lm_head`, `layers.*.fc1` for `layers.0.mlp.fc1`): a forgotten `*`.
// A rule loosened into `match: {}` says nothing about the author's intent and is no near miss.
std::string near_miss(const RuleMatch& match, const QuantizerRole& role) {
  RuleMatch without_type = match;
  without_type.module_types.clear();
  const bool other_keys = !match.tensor_types.empty() || !match.names.empty();
  if (!match.module_types.empty() && other_keys && without_type.matches(role)) return "module_type";
  if (match.names.empty()) return "";
  RuleMatch partial_names = match;
  for (auto& glob : partial_names.names) glob = "*" + glob + "*";
  if (partial_names.matches(role)) return "name";
  return "";
}

}  // namespace

std::vector<std::string> Recipe::coverage(const std::vector<QuantizerRole>& roles) const {
  std::vector<std::string> out;
  if (roles.empty()) return out;
  std::vector<int> decider(roles.size());
  for (std::size_t r = 0; r < roles.size(); ++r) decider[r] = match(roles[r]);

  std::vector<std::string> types, names;
  for (const auto& role : roles) {
    types.push_back(role.module_type);
    names.push_back(role.name.empty() ? "<unnamed>" : role.name);
  }
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    std::vector<std::string> winners;
    bool matches_any = false, decides_any = false;
    for (std::size_t r = 0; r < roles.size(); ++r) {
      if (!rules_[i].match.matches(roles[r])) continue;
      matches_any = true;
      if (decider[r] == static_cast<int>(i))
        decides_any = true;
      else
        winners.push_back("rules[" + std::to_string(decider[r]) + "]");
    }
    if (!matches_any)
      out.push_back(rule_str(*this, i) + " matches none of the roles (module types: " +
                    sample(types, 6) + "; names: " + sample(names, 4) + ")");
    else if (!decides_any)
      out.push_back(rule_str(*this, i) + " never decides a role: every role it matches is "
                    "decided by an earlier rule (" + sample(winners, 4) + ")");
  }

  if (!defaults_.is_none()) return out;
  // (module_type, name, rule, key) -> the tensor types it concerns, in first-seen order.
  using Key = std::tuple<std::string, std::string, std::size_t, std::string>;
  std::vector<std::pair<Key, std::vector<std::string>>> misses;
  for (std::size_t r = 0; r < roles.size(); ++r) {
    if (decider[r] >= 0) continue;
    const QuantizerRole& role = roles[r];
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      const RecipeRule& rule = rules_[i];
      if (!rule.delegates() && rule.quantizer.is_none()) continue;
      const std::string key = near_miss(rule.match, role);
      if (key.empty()) continue;
      const Key k{role.module_type, role.name, i, key};
      auto it = std::find_if(misses.begin(), misses.end(),
                             [&](const auto& m) { return m.first == k; });
      if (it == misses.end()) {
        misses.emplace_back(k, std::vector<std::string>{});
        it = std::prev(misses.end());
      }
      it->second.push_back(role.tensor_type);
      break;
    }
  }
  for (const auto& [k, tensor_types] : misses) {
    const auto& [module_type, name, i, key] = k;
    const RecipeRule& rule = rules_[i];
    const bool one = tensor_types.size() == 1;
    std::string line = module_type + " " + (name.empty() ? "<unnamed>" : name) + ": " +
                       join(tensor_types) + (one ? " gets" : " get") +
                       " no quantization (no rule matches " + (one ? "it" : "them") +
                       " and the defaults are none), but " + rule_str(*this, i) +
                       " would give " + (one ? "it " : "them ") + rule.decision_str() + " if ";
    if (key == "module_type")
      line += "its module_type [" + join(rule.match.module_types) + "] covered " + module_type +
              "; add " + module_type + " to it, or remove the key";
    else
      line += "its name [" + join(rule.match.names) + "] matched '" + name +
              "'; check the glob (`*` matches dots too, the whole name must match)";
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace qrecipe
