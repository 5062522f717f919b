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

std::shared_ptr<Quantizer> Engine::resolve(const QuantizerRole& role) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(role); it != cache_.end()) return it->second;
  }
  auto q = make_quantizer(recipe_.resolve(role), role);
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.emplace(role, std::move(q)).first->second;
}

namespace {
// The quantizer being created on this thread (innermost first for a hybrid's halves), so a
// scaling state requested from inside a plugin's factory is labelled with the role and format
// that asked for it, without the plugin having to say.
thread_local std::vector<std::string> t_creating;
struct CreatingScope {
  explicit CreatingScope(std::string owner) { t_creating.push_back(std::move(owner)); }
  ~CreatingScope() { t_creating.pop_back(); }
  CreatingScope(const CreatingScope&) = delete;
  CreatingScope& operator=(const CreatingScope&) = delete;
};
}  // namespace

std::string Engine::creating_owner() {
  return t_creating.empty() ? std::string() : t_creating.back();
}

std::shared_ptr<Quantizer> Engine::make_quantizer(const QuantizerSpec& spec,
                                                  const QuantizerRole& role) {
  QuantizerSpec typed = validate_spec(spec, *registry_);
  if (typed.is_none()) return nullptr;
  auto plugin = registry_->find(typed.format);
  QR_CHECK(plugin != nullptr, "format '", typed.format, "' vanished from the registry");
  const CreatingScope scope(role.str() + " " + typed.format);
  return std::make_shared<Quantizer>(std::move(plugin), std::move(typed), role, host_context());
}

}  // namespace qrecipe
