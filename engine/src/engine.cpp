// Engine: recipe validation and role resolution (cached). The delayed-scaling states it owns
// are in scaling/engine_scaling.cpp, the linear-layer plan in gemm/linear_plan.cpp.
#include "qrecipe/engine.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

#include "qrecipe/cuda.hpp"
#include "qrecipe/scaling.hpp"
#include "scaling/scaling_cuda.hpp"

namespace qrecipe {

Engine::Engine(Recipe recipe, std::shared_ptr<Registry> registry,
               std::shared_ptr<Allocator> allocator)
    : recipe_(std::move(recipe)), registry_(std::move(registry)), allocator_(std::move(allocator)) {
  QR_CHECK(registry_ != nullptr, "Engine needs a plugin registry");
  QR_CHECK(allocator_ != nullptr, "Engine needs an allocator");
  if (!recipe_.validated()) recipe_.validate(*registry_);
}

Engine::~Engine() {
  // Quantizers may point into the scaling states: drop them first.
  cache_.clear();
}

void Engine::set_factory_resolver(FactoryResolver resolver) {
  std::lock_guard<std::mutex> lock(mutex_);
  factory_resolver_ = std::move(resolver);
}

namespace {
// Every location in a spec a factory made (none carry a file): `where`, so validation errors
// name the factory and the role instead of "<code>".
void stamp(QuantizerSpec& spec, const SourceLocation& where) {
  if (spec.location.file.empty() && spec.location.line == 0) spec.location = where;
  for (auto& [key, value] : spec.options) {
    if (value.location.file.empty() && value.location.line == 0) value.location = where;
    if (value.type == QR_OPTION_QUANTIZER && value.spec) {
      QuantizerSpec nested = *value.spec;
      stamp(nested, where);
      value.spec = std::make_shared<const QuantizerSpec>(std::move(nested));
    }
  }
}
}  // namespace

std::pair<QuantizerSpec, std::string> Engine::spec_for(const QuantizerRole& role) {
  const int index = recipe_.match(role);
  const std::string decider = recipe_.decider_str(role);
  if (index < 0 || !recipe_.rules()[static_cast<std::size_t>(index)].delegates())
    return {recipe_.resolve(role), decider};
  const RecipeRule& rule = recipe_.rules()[static_cast<std::size_t>(index)];
  FactoryResolver resolver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    resolver = factory_resolver_;
  }
  if (!resolver)
    throw RecipeError(rule.location,
                      "rules[" + std::to_string(index) + "] delegates role " + role.str() +
                          " to the factory '" + rule.factory + "', but this engine has no "
                          "factory resolver: factories are Python functions, which run under "
                          "the Python adapter (qrecipe.Recipe)");
  // Outside the lock: the resolver runs user code, which may resolve other roles.
  FactorySpec made = resolver(FactoryCall{rule.factory, decider, role});
  const std::string origin = made.origin.empty() ? "factory '" + rule.factory + "'" : made.origin;
  stamp(made.spec, SourceLocation{origin + ", role " + role.str(), 0, 0});
  const bool whole_recipe = rule.location.line == 0 && rule.match.str() == "{}";
  return {std::move(made.spec), whole_recipe ? origin : decider + " -> " + origin};
}

std::shared_ptr<Quantizer> Engine::resolve(const QuantizerRole& role) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(role); it != cache_.end()) return it->second;
  }
  // One creation at a time (recursive: a factory may resolve another role on this thread).
  std::lock_guard<std::recursive_mutex> creating(resolve_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // another thread may have made it meanwhile
    if (auto it = cache_.find(role); it != cache_.end()) return it->second;
  }
  auto [spec, origin] = spec_for(role);
  std::shared_ptr<Quantizer> q;
  try {
    q = make_quantizer(spec, role);
  } catch (const RecipeError&) {
    throw;  // located already: the recipe's file:line:column, or the factory and the role
  } catch (const Error& e) {
    // A plugin refusing the spec (options that contradict each other): say who gave it.
    QR_THROW_CODE(e.code(), "role ", role.str(), " gets ", spec.str(), " from ", origin, ": ",
                  e.message());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  origins_.emplace(role, std::move(origin));
  return cache_.emplace(role, std::move(q)).first->second;
}

std::string Engine::origin(const QuantizerRole& role) {
  resolve(role);
  std::lock_guard<std::mutex> lock(mutex_);
  return origins_.at(role);
}

namespace {
// The quantizer being created on this thread (innermost first for sub-quantizers), so a
// scaling state requested from inside a plugin's factory is labelled with the role and format
// that asked for it, and joins the share group its spec names, without the plugin having to
// say.
struct Creating {
  std::string owner, share;
  int states = 0;  // scaling states acquired for it
};
thread_local std::vector<Creating> t_creating;
struct CreatingScope {
  CreatingScope(std::string owner, std::string share) {
    t_creating.push_back({std::move(owner), std::move(share), 0});
  }
  ~CreatingScope() { t_creating.pop_back(); }
  CreatingScope(const CreatingScope&) = delete;
  CreatingScope& operator=(const CreatingScope&) = delete;
  int states() const { return t_creating.back().states; }
};
}  // namespace

std::string Engine::creating_owner() {
  return t_creating.empty() ? std::string() : t_creating.back().owner;
}

std::string Engine::creating_share() {
  return t_creating.empty() ? std::string() : t_creating.back().share;
}

void Engine::note_state_acquired() {
  if (!t_creating.empty()) ++t_creating.back().states;
}

std::shared_ptr<Quantizer> Engine::make_quantizer(const QuantizerSpec& spec,
                                                  const QuantizerRole& role) {
  QuantizerSpec typed = validate_spec(spec, *registry_);
  if (typed.is_none()) return nullptr;
  auto plugin = registry_->find(typed.format);
  QR_CHECK(plugin != nullptr, "format '", typed.format, "' vanished from the registry");
  const CreatingScope scope(role.str() + " " + typed.format, typed.share);
  const std::string share = typed.share, described = typed.str();
  const SourceLocation location = typed.location;
  std::shared_ptr<Quantizer> q;
  try {
    q = std::make_shared<Quantizer>(std::move(plugin), std::move(typed), role, host_context());
  } catch (const RecipeError&) {
    throw;
  } catch (const Error& e) {
    // The plugin refused the spec (an option combination): say where the recipe wrote it,
    // not where the plugin's source checked it.
    if (e.code() != QR_STATUS_INVALID_ARGUMENT || location.line == 0) throw;
    throw RecipeError(location, e.message());
  }
  // A share name on a quantizer that keeps no scaling state would silently mean nothing.
  if (!share.empty() && scope.states() == 0)
    throw RecipeError(spec.location,
                      std::string(kShareKey) + ": " + described + " keeps no scaling state, so " +
                          "there is nothing to share under '" + share + "' (share names a " +
                          "delayed-scaling state); remove 'share', or give it to a spec with " +
                          "delayed scaling");
  return q;
}

}  // namespace qrecipe
