// Fixture (an Engine plus one Quantizer for a Case), the per-case context, and the
// "not supported" log.
#include <algorithm>
#include <mutex>
#include <set>

#include "detail.hpp"
#include "qrecipe/recipe.hpp"

namespace qrecipe::conformance::detail {

ErrorBound CaseContext::bound_for(const qr_direction_layout& layout) const {
  return kase->bound ? *kase->bound : derive_bound(layout);
}

QuantizeOptions CaseContext::repeatable() const {
  QuantizeOptions o;
  if (kase->properties.stochastic) o.rng_offset = 12345;  // any fixed offset
  return o;
}

std::vector<std::pair<std::int64_t, std::int64_t>> CaseContext::shapes() const {
  // One past a block along each direction's blocked dimension; 33 when the block spans the
  // dimension (per-tensor, per-row), which is just "some odd size".
  const std::int64_t row_block = geometry.block_cols[0] > 0 ? geometry.block_cols[0] : 32;
  const std::int64_t col_block = geometry.block_rows[1] > 0 ? geometry.block_rows[1] : 32;
  std::vector<std::pair<std::int64_t, std::int64_t>> s = {
      {1, 1},   {0, 32},  {32, 0},   {1, row_block + 1}, {col_block + 1, 1},
      {17, 33}, {128, 128}, {256, 96}, {130, 260}};
  std::vector<std::pair<std::int64_t, std::int64_t>> unique;
  for (const auto& x : s)
    if (std::find(unique.begin(), unique.end(), x) == unique.end()) unique.push_back(x);
  return unique;
}

bool CaseContext::partial(std::int64_t rows, std::int64_t cols) const {
  if (rows == 0 || cols == 0) return false;
  for (qr_direction d : directions) {
    if (!geometry.block_mode[d]) continue;
    const std::int64_t br = geometry.block_rows[d], bc = geometry.block_cols[d];
    if ((br > 0 && rows % br != 0) || (bc > 0 && cols % bc != 0)) return true;
  }
  return false;
}

bool CaseContext::skip_partial(std::int64_t rows, std::int64_t cols,
                               const std::string& check) const {
  if (kase->properties.supports_partial_blocks || !partial(rows, cols)) return false;
  not_supported(name + ": " + check + " of " + shape_str(rows, cols) +
                " (partial blocks; the format declares supports_partial_blocks = false)");
  return true;
}

Fixture::Fixture(const CaseContext& c)
    : context_(c), allocator_(std::make_shared<GuardedAllocator>()) {
  engine_ = std::make_unique<Engine>(Recipe::uniform(c.kase->spec, "conformance"), c.registry,
                                     allocator_);
  quantizer_ = engine_->make_quantizer(c.kase->spec, c.kase->role);
  QR_CHECK(quantizer_ != nullptr, "the spec ", c.kase->spec.str(),
           " resolves to format none; a conformance case needs a quantizing format");
}

void Fixture::prime(const TensorView& x) {
  if (!stateful()) return;
  QuantizedTensor warm = quantize(x, context_.usage, context_.repeatable());
  engine_->update_scaling();
}

QuantizedTensor Fixture::quantize(const TensorView& x, std::uint32_t usage,
                                  const QuantizeOptions& options) {
  QuantizedTensor t = quantizer_->quantize(x, usage, options, allocator_);
  check_guards("quantize of " + x.str());
  return t;
}

void Fixture::quantize_into(const TensorView& x, QuantizedTensor& dst,
                            const QuantizeOptions& options) {
  quantizer_->quantize_into(x, dst, options);
  check_guards("quantize_into of " + x.str());
}

void Fixture::check_guards(const std::string& what) const {
  const std::string overruns = allocator_->overruns();
  CHECK_MESSAGE(overruns.empty(), what << " wrote outside the buffers layout() sized: "
                                       << overruns
                                       << " (guard bytes around the buffer were changed)");
}

namespace {
std::mutex g_log_mutex;
std::set<std::string> g_log_seen;
std::vector<std::string> g_log;
std::string g_current_case;
}  // namespace

void set_current_case(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_current_case = name;
}

void not_supported(const std::string& what) {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    text = g_current_case.empty() || what.rfind(g_current_case, 0) == 0
               ? what
               : g_current_case + ": " + what;
    if (!g_log_seen.insert(text).second) return;
    g_log.push_back(text);
  }
  MESSAGE("not supported: " << text);
}

}  // namespace qrecipe::conformance::detail

namespace qrecipe::conformance {

std::vector<std::string> not_supported_log() {
  std::lock_guard<std::mutex> lock(detail::g_log_mutex);
  return detail::g_log;
}

}  // namespace qrecipe::conformance
