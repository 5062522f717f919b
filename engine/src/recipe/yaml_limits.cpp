// The limits a recipe's YAML text must keep before the parser walks its nodes (internal.hpp:
// kMaxRecipeBytes, kMaxYamlDepth, kMaxYamlNodes; docs/recipes.md "Limits").
//
// yaml-cpp builds an alias as a reference to the anchored node, so a small text can stand for
// an exponential tree (the 929-byte "alias bomb" of issue 19: 8 levels of maps holding 9
// aliases of the level before, 9^8 nodes), and the recipe parser, which walks every map it is
// given, would visit all of them. So before any node is built, one pass over yaml-cpp's
// parse events counts the nodes of the EXPANDED document (an alias counts the nodes of what
// it refers to) and its nesting depth (an alias adds the height of its target), and stops at
// the event that crosses a limit, with that event's line and column. The depth limit sits far
// below yaml-cpp's own recursion guard (500, reported as "bad file" at whatever position its
// scanner has reached), so deep nesting is reported here, at the node that is too deep.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "recipe/internal.hpp"

namespace qrecipe::recipe_internal {
namespace {

class LimitCounter final : public YAML::EventHandler {
 public:
  explicit LimitCounter(const std::string& source) : source_(source) {}

  void OnDocumentStart(const YAML::Mark&) override {
    targets_.clear();
    names_.clear();
  }
  void OnDocumentEnd() override {}
  void OnAnchor(const YAML::Mark&, const std::string& name) override { pending_name_ = name; }
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(mark, anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const auto target = targets_.find(anchor);
    const std::string name = names_.count(anchor) ? "*" + names_[anchor] : "an alias";
    if (target == targets_.end())
      fail(mark, name + " refers to a node that contains it (a recursive structure); a recipe "
                        "is a tree: repeat the value instead");
    const Tree& t = target->second;
    const int depth = static_cast<int>(open_.size());  // collections around the alias
    if (depth + t.height > kMaxYamlDepth)
      fail(mark, "nesting deeper than " + std::to_string(kMaxYamlDepth) + " levels once " + name +
                     " is expanded (it is " + std::to_string(t.height) + " levels deep, used "
                     "inside " + std::to_string(depth) + "); a recipe needs a few levels");
    add(mark, t.nodes, true);
    child(t.height, t.nodes);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  // The expanded size of an anchored node: nodes (itself included) and height (nested
  // collections: 0 for a scalar, 1 for a map of scalars).
  struct Tree {
    std::uint64_t nodes = 0;
    int height = 0;
  };
  struct Frame {
    YAML::anchor_t anchor = 0;
    Tree tree{1, 1};
  };

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& what) const {
    SourceLocation where{source_, 0, 0};
    if (!mark.is_null()) where = {source_, mark.line + 1, mark.column + 1};
    throw RecipeError(where, what);
  }

  void name_anchor(YAML::anchor_t anchor) {
    if (anchor != 0 && !pending_name_.empty()) names_[anchor] = pending_name_;
    pending_name_.clear();
  }

  // Counts `nodes` more nodes of the expanded document.
  void add(const YAML::Mark& mark, std::uint64_t nodes, bool through_alias) {
    total_ += nodes;
    if (total_ <= kMaxYamlNodes) return;
    if (through_alias)
      fail(mark, "aliases expand this recipe to more than " + std::to_string(kMaxYamlNodes) +
                     " nodes (an alias stands for a copy of its anchored node, here " +
                     std::to_string(nodes) + " nodes); a recipe needs a few hundred: use fewer "
                     "nested aliases");
    fail(mark, "the recipe has more than " + std::to_string(kMaxYamlNodes) + " YAML nodes; a "
               "recipe needs a few hundred (rules match many modules through globs)");
  }

  // A finished child of height `height` and `nodes` nodes joins the innermost open node.
  void child(int height, std::uint64_t nodes) {
    if (open_.empty()) return;
    Tree& parent = open_.back().tree;
    parent.nodes += nodes;
    if (height + 1 > parent.height) parent.height = height + 1;
  }

  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    name_anchor(anchor);
    add(mark, 1, false);
    if (anchor != 0) targets_[anchor] = Tree{1, 0};
    child(0, 1);
  }

  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    name_anchor(anchor);
    if (static_cast<int>(open_.size()) + 1 > kMaxYamlDepth) too_deep(mark);
    add(mark, 1, false);
    open_.push_back(Frame{anchor});
  }

  void close() {
    const Frame done = open_.back();
    open_.pop_back();
    // Registered only now: an alias met while its anchor is still open is a cycle.
    if (done.anchor != 0) targets_[done.anchor] = done.tree;
    child(done.tree.height, done.tree.nodes);
  }

  [[noreturn]] void too_deep(const YAML::Mark& mark) const {
    fail(mark, "nesting deeper than " + std::to_string(kMaxYamlDepth) + " levels; a recipe "
               "needs a few (rules > rule > quantizer > a sub-quantizer of a format built from others)");
  }

  std::string source_;
  std::vector<Frame> open_;
  std::map<YAML::anchor_t, Tree> targets_;
  std::map<YAML::anchor_t, std::string> names_;
  std::string pending_name_;
  std::uint64_t total_ = 0;
};

}  // namespace

void check_yaml_limits(const std::string& text, const std::string& source_name) {
  if (text.size() > kMaxRecipeBytes)
    throw RecipeError({source_name, 0, 0},
                      "the recipe text is " + std::to_string(text.size()) + " bytes, above the "
                      "limit of " + std::to_string(kMaxRecipeBytes) + " bytes; a recipe needs a "
                      "few kilobytes");
  std::istringstream in(text);
  YAML::Parser parser(in);
  LimitCounter counter(source_name);
  while (parser.HandleNextDocument(counter)) {
  }
}

}  // namespace qrecipe::recipe_internal
