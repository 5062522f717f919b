// run(): the SUBCASE tree of the conformance suite (plugin-wide checks, then one subtree per
// case with one leaf per check group), plus the small public helpers of conformance.hpp.
#include <cmath>
#include <numeric>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance {

// ------------------------------------------------------------------ bounds

double ErrorBound::limit(double x, double block_amax, double tensor_amax) const {
  return rel_element * std::fabs(x) + rel_block * block_amax + rel_tensor * tensor_amax + abs;
}

std::string ErrorBound::str() const {
  return detail::float_str(rel_element) + "*|x| + " + detail::float_str(rel_block) +
         "*block_amax + " + detail::float_str(rel_tensor) + "*tensor_amax + " +
         detail::float_str(abs);
}

namespace {

struct FloatTraits {
  int mantissa_bits;
  double min_subnormal;
  double max;
};

// Facts of the floating-point types a layout may use, from the engine's own conversions.
bool float_traits(DType t, FloatTraits& out) {
  switch (t) {
    case DType::e4m3: out = {3, num::e4m3_to_f32(1), 448.0}; return true;
    case DType::e5m2: out = {2, num::e5m2_to_f32(1), 57344.0}; return true;
    case DType::e2m1: out = {1, num::e2m1_to_f32(1), 6.0}; return true;
    case DType::bf16: out = {7, 0x1p-133, dtype_max(t)}; return true;
    case DType::f16: out = {10, 0x1p-24, 65504.0}; return true;
    case DType::f32: out = {23, 0x1p-149, dtype_max(t)}; return true;
    default: return false;
  }
}

}  // namespace

ErrorBound derive_bound(const qr_direction_layout& layout) {
  const auto data = static_cast<DType>(layout.data_dtype);
  FloatTraits d{};
  QR_CHECK(float_traits(data, d), "derive_bound: no default error bound for data dtype ",
           dtype_name(data), " (format '", layout.format ? layout.format : "?",
           "'); state the Case's bound explicitly (conformance.hpp, ErrorBound)");
  ErrorBound b;
  // Round to nearest: half an ulp, 2^-(mantissa bits + 1) of |x|.
  b.rel_element = std::ldexp(1.0, -(d.mantissa_bits + 1));
  if (layout.scale_mode == QR_SCALE_NONE) {
    b.abs = d.min_subnormal / 2;  // a plain cast: half the smallest subnormal
    return b;
  }
  // A few FP32 roundings (scale, scaled value, decode product), 2^-24 each, with room.
  b.rel_element += 0x1p-20;
  // Below the data type's normals the error is half its smallest subnormal after scaling;
  // with the block amax mapped to at least half the max, that is <= min_subnormal / max.
  b.rel_block = d.min_subnormal / d.max;
  // Block scales stored in a narrow float (NVFP4's E4M3 against the tensor amax) lose
  // precision, or flush to zero, for blocks far below the tensor amax.
  FloatTraits s{};
  const auto scale = static_cast<DType>(layout.scale_dtype);
  if (layout.scale_ndim > 0 && dtype_bits(scale) == 8 && float_traits(scale, s))
    b.rel_tensor = s.min_subnormal / s.max;
  // Scales capped at FLT_MAX (or E8M0's 2^-127 decode factor) give an absolute floor; the
  // decode itself may land in the FP32 subnormals (2^-149 spacing).
  b.abs = d.min_subnormal * 0x1p-127 + 0x1p-147;
  return b;
}

QuantizerSpec spec(const std::string& format,
                   const std::vector<std::pair<std::string, std::string>>& options) {
  QuantizerSpec s;
  s.format = format;
  for (const auto& [key, value] : options)
    s.options.emplace_back(key, OptionValue::of_string(value));
  return s;
}

namespace {

using namespace detail;

Geometry probe_geometry(const Quantizer& q, const std::vector<qr_direction>& directions) {
  // A shape far larger than any block, so a block dimension equal to it means "spans the
  // dimension" (per-row / per-column scaling) rather than a fixed block size.
  constexpr std::int64_t kProbe = 1 << 14;
  Geometry g;
  for (qr_direction d : directions) {
    const qr_direction_layout l = q.layout(kProbe, kProbe, d);
    g.block_mode[d] = is_block_mode(l);
    if (!g.block_mode[d]) continue;
    g.block_rows[d] = l.block_rows > 0 && l.block_rows < kProbe ? l.block_rows : 0;
    g.block_cols[d] = l.block_cols > 0 && l.block_cols < kProbe ? l.block_cols : 0;
    if (g.block_rows[d]) g.tile_rows = std::lcm(g.tile_rows, g.block_rows[d]);
    if (g.block_cols[d]) g.tile_cols = std::lcm(g.tile_cols, g.block_cols[d]);
  }
  // At least two tiles and at least 16 along each dimension.
  g.multi_rows = g.tile_rows * std::max<std::int64_t>(2, (16 + g.tile_rows - 1) / g.tile_rows);
  g.multi_cols = g.tile_cols * std::max<std::int64_t>(2, (16 + g.tile_cols - 1) / g.tile_cols);
  return g;
}

// Builds the context of one case; false (with a failed check) when the case cannot even make
// its quantizer.
bool make_context(const Suite& suite, const Case& kase, const std::shared_ptr<Registry>& registry,
                  const std::string& name, CaseContext& c) {
  c.suite = &suite;
  c.kase = &kase;
  c.registry = registry;
  c.name = name;
  c.usage = kase.properties.usage & (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
  CHECK_MESSAGE(c.usage != 0, "Properties::usage holds no direction");
  CHECK_MESSAGE(kase.spec.format == suite.format, "the case's spec is for format '"
                                                    << kase.spec.format << "' but the suite tests '"
                                                    << suite.format << "'");
  if (c.usage == 0 || kase.spec.format != suite.format) return false;
  for (qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (c.usage & usage_bit(d)) c.directions.push_back(d);
  return attempt("making the quantizer " + kase.spec.str() + " for role " + kase.role.str(), [&] {
    Fixture probe(c);
    c.geometry = probe_geometry(probe.quantizer(), c.directions);
  });
}

}  // namespace

void run(const Suite& suite) {
  const std::shared_ptr<Registry> registry = suite.registry ? suite.registry : Registry::shared();
  INFO("conformance of format '" << suite.format << "'");
  const bool found = attempt("finding the plugin", [&] { registry->get(suite.format); });
  if (!found) return;

  std::vector<Case> cases = suite.cases;
  if (cases.empty()) cases.push_back(Case{spec(suite.format)});

  set_current_case("");
  SUBCASE("plugin: option schema and validation") { check_options(suite, *registry); }
  SUBCASE("plugin: devices") { check_devices(suite, *registry); }

  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& kase = cases[i];
    const std::string name = "case " + std::to_string(i + 1) + ": " +
                             (kase.name.empty() ? kase.spec.str() + " for " + kase.role.tensor_type
                                                : kase.name);
    SUBCASE(name.c_str()) {
      INFO(name);
      set_current_case(name);
      CaseContext c;
      if (!make_context(suite, kase, registry, name, c)) return;
      SUBCASE("quantizer") { check_quantizer(c); }
      SUBCASE("round trip within the error bound") { check_round_trip(c); }
      SUBCASE("zeros and denormals") { check_zeros_and_denormals(c); }
      SUBCASE("NaN and inf") { check_nan_and_inf(c); }
      SUBCASE("exactly representable values") { check_exact_values(c); }
      SUBCASE("single-element, empty and partial-block shapes") { check_shapes(c); }
      SUBCASE("layout and buffers") { check_layout(c); }
      SUBCASE("rowwise and columnwise") { check_directions(c); }
      SUBCASE("determinism and amax") { check_determinism(c); }
      SUBCASE("quantize and decode in one pass") { check_quantize_decoded(c); }
    }
  }
}

}  // namespace qrecipe::conformance
