// The recipe parser (docs/recipes.md): YAML text -> rules and untyped quantizer specs,
// every structural problem collected with its file:line:column and key path. Option values
// stay scalar text here; validate.cpp types them against the plugins' schemas.
//
// How to add a new top-level or match key: add it to kTopLevelKeys / kMatchKeys (the lists
// feed the "allowed keys" messages), handle it in the Parser, and document it in
// docs/recipes.md.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/internal.hpp"

namespace qrecipe::recipe_internal {
namespace {

constexpr std::string_view kTopLevelKeys[] = {"version", "name", "description", "defaults",
                                              "rules", "telemetry"};
constexpr std::string_view kTelemetryKeys[] = {"every", "roles"};
constexpr std::string_view kRuleKeys[] = {"match", "quantizer", "factory"};
constexpr std::string_view kMatchKeys[] = {"module_type", "tensor_type", "name"};

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return quoted(node.Scalar());
    case YAML::NodeType::Null: return "nothing (null)";
    default: return "an undefined node";
  }
}


// Thrown by Parser::fail at kMaxProblems problems: the walk stops there.
struct TooManyProblems {};

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
                     } else if (key == "telemetry") {
                       out.telemetry = telemetry(value, path);
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
    if (problems_.size() >= kMaxProblems) throw TooManyProblems{};
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
        fail(key_node, key_path, "duplicate key " + quoted(key) + "; keep only one");
        continue;
      }
      if (std::begin(allowed) != std::end(allowed) &&
          std::find(std::begin(allowed), std::end(allowed), key) == std::end(allowed)) {
        fail(key_node, key_path,
             "unknown " + std::string(what_key) + " " + quoted(key) + "; allowed keys: " +
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
      fail(node, path, "expected an integer, got " + quoted(text) + "; " + supported);
      return kRecipeVersion;
    }
    if (value != kRecipeVersion)
      fail(node, path, "recipe version " + printable(text) + " is not supported; " + supported +
                           " (use a newer qrecipe, or write the recipe in version " +
                           std::to_string(kRecipeVersion) + ")");
    return value;
  }

  // `telemetry: {every: N, roles: [glob, ...]}`: N a positive integer (required), roles
  // globs on "module_type:tensor_type@name" (optional: every role).
  TelemetrySettings telemetry(const YAML::Node& node, const std::string& path) {
    TelemetrySettings out;
    out.location = at(node);
    if (!node.IsMap()) {
      fail(node, path, "expected a map {every: N, roles: [glob, ...]}, got " +
                           describe_node(node));
      return out;
    }
    bool has_every = false;
    for_each_entry(node, path, kTelemetryKeys, "telemetry key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& key_path) {
                     if (key == "every") {
                       has_every = true;
                       out.every = every(value, key_path);
                     } else if (key == "roles") {
                       out.roles = globs(value, key_path);
                     }
                   });
    if (!has_every)
      fail(node, path, "missing key 'every': how often to gather the statistics (`every: 1` for "
                       "every quantization, `every: 100` for every 100th of each role)");
    return out;
  }

  int every(const YAML::Node& node, const std::string& path) {
    const std::string expected = "expected a positive integer (1 to " +
                                 std::to_string(kMaxTelemetryEvery) + ")";
    if (!node.IsScalar()) {
      fail(node, path, expected + ", got " + describe_node(node));
      return 0;
    }
    const std::string& text = node.Scalar();
    int value = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
    if (result.ec != std::errc() || result.ptr != text.data() + text.size() || value < 1 ||
        value > kMaxTelemetryEvery) {
      fail(node, path, expected + ", got " + quoted(text));
      return 0;
    }
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
    bool has_match = false, has_quantizer = false, has_factory = false;
    for_each_entry(node, path, kRuleKeys, "rule key",
                   [&](const std::string& key, const YAML::Node& value, const std::string& key_path) {
                     if (key == "match") {
                       has_match = true;
                       out.match = match(value, key_path);
                     } else if (key == "quantizer") {
                       has_quantizer = true;
                       out.quantizer = spec(value, key_path);
                     } else {
                       has_factory = true;
                       out.factory = factory(value, key_path);
                     }
                   });
    if (!has_match)
      fail(node, path, "missing required key 'match'; write `match: {}` to match every role");
    if (has_quantizer && has_factory)
      fail(node[std::string("factory")], child_path(path, "factory"),
           "a rule gives either 'quantizer' or 'factory', not both; keep one");
    else if (!has_quantizer && !has_factory)
      fail(node, path, "missing required key 'quantizer', e.g. `quantizer: {format: <name>}` "
                       "(`qrecipe plugins` lists the formats) or `quantizer: {format: none}` "
                       "(or `factory: package.module:function` to let a Python function decide)");
    return out;
  }

  // `factory: package.module:function`: the Python function (a dotted path inside the module)
  // that decides the roles of this rule; the adapter imports it when a role needs it.
  std::string factory(const YAML::Node& node, const std::string& path) {
    const auto text = string_scalar(node, path);
    if (!text) return "";
    const std::string why = factory_problem(*text);
    if (!why.empty()) {
      fail(node, path, "expected 'package.module:function' (a Python module to import and the "
                       "function in it that decides each role), got '" + *text + "': " + why);
      return "";
    }
    return *text;
  }

  // Why `text` is not "dotted.module:dotted.function" with Python identifiers ("" if it is).
  static std::string factory_problem(std::string_view text) {
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) return "no ':' between the module and the function";
    if (text.find(':', colon + 1) != std::string_view::npos) return "more than one ':'";
    for (const std::string_view part : {text.substr(0, colon), text.substr(colon + 1)}) {
      if (part.empty()) return "an empty module or function name";
      std::size_t start = 0;
      while (start <= part.size()) {
        const std::size_t dot = std::min(part.find('.', start), part.size());
        const std::string_view word = part.substr(start, dot - start);
        if (word.empty() || std::isdigit(static_cast<unsigned char>(word.front())) ||
            !std::all_of(word.begin(), word.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
            }))
          return "'" + std::string(part) + "' is not a dotted Python name";
        start = dot + 1;
      }
    }
    return "";
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
             "unknown tensor_type " + quoted(value) + "; allowed: " + join(kTensorTypes) +
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
             "bad name glob " + quoted(out[i]) + ": " + why);
    }
    return out;
  }

  // A quantizer spec: {format: NAME, option: value, ...}; a map value is a nested spec.
  QuantizerSpec spec(const YAML::Node& node, const std::string& path) {
    QuantizerSpec out;
    out.location = at(node);
    if (!node.IsMap()) {
      fail(node, path, "a quantizer spec is a map with a 'format' key, e.g. {format: <name>} "
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
                         fail(value, key_path, "expected a format name (one `qrecipe plugins` "
                                               "lists, or none), got " + describe_node(value));
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
      fail(node, path, "missing required key 'format' (a format name `qrecipe plugins` lists, "
                       "or none)");
    } else if (out.is_none() && !out.options.empty()) {
      fail(node[out.options.front().first], child_path(path, out.options.front().first),
           "format none keeps high precision and takes no options; remove " +
               quoted(out.options.front().first));
    }
    return out;
  }

  std::string file_;
  std::vector<Problem> problems_;
  std::vector<std::pair<YAML::Node, YAML::Mark>> null_values_;  // null value -> its key's mark
};

// Problems of a parse, thrown as one RecipeError: the first problem's location, then every
// other problem on its own line, so one run shows them all.
[[noreturn]] void throw_problems(const std::vector<Problem>& problems, bool stopped) {
  const Problem& first = problems.front();
  std::string message = first.text();
  if (problems.size() > 1) {
    for (std::size_t i = 1; i < problems.size(); ++i)
      message += "\n" + problems[i].location.str() + ": " + problems[i].text();
    message += "\n(" + std::to_string(problems.size()) + " problems" +
               (stopped ? "; the parser stopped there, fix these first)" : " in all)");
  }
  throw RecipeError(first.location, message);
}

}  // namespace

ParsedRecipe parse_recipe_text(const std::string& yaml_text, const std::string& source_name) {
  std::vector<YAML::Node> documents;
  try {
    // Limits first: the nodes built below are walked, aliases expanded, by the parser.
    check_yaml_limits(yaml_text, source_name);
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    // e.mark is 0-based; e.msg is the parser's message without the position prefix.
    SourceLocation where{source_name, 0, 0};
    if (!e.mark.is_null()) where = {source_name, e.mark.line + 1, e.mark.column + 1};
    throw RecipeError(where, "YAML syntax error: " + printable(e.msg));
  }
  if (documents.empty())
    throw RecipeError({source_name, 1, 1}, "the recipe is empty; a recipe needs at least "
                                           "`version: 1` (see docs/recipes.md)");
  Parser parser(source_name);
  if (documents.size() > 1)
    throw RecipeError(parser.at(documents[1]),
                      "a recipe file holds one YAML document, found " +
                          std::to_string(documents.size()) + "; remove the extra '---'");
  ParsedRecipe parsed;
  bool stopped = false;
  try {
    parsed = parser.recipe(documents.front());
  } catch (const TooManyProblems&) {
    stopped = true;
  }
  if (!parser.problems().empty()) throw_problems(parser.problems(), stopped);
  return parsed;
}

}  // namespace qrecipe::recipe_internal
