// Numeric checks: the round-trip error bound, zeros and denormals, NaN and inf, and values
// that must decode exactly. Rules are documented in conformance.hpp.
#include <cmath>
#include <numeric>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance::detail {
namespace {

using Shape = std::pair<std::int64_t, std::int64_t>;

bool same_bits(float a, float b) { return num::float_bits(a) == num::float_bits(b); }

// First element whose decode is not bit-identical to `expected` ("" when none).
std::string first_bit_mismatch(const std::vector<float>& expected, const std::vector<float>& got,
                               std::int64_t cols, const char* what) {
  for (std::size_t k = 0; k < got.size(); ++k)
    if (!same_bits(expected[k], got[k]))
      return std::string(what) + " at (" + std::to_string(static_cast<std::int64_t>(k) / cols) +
             ", " + std::to_string(static_cast<std::int64_t>(k) % cols) + "): expected " +
             float_str(expected[k]) + ", decoded " + float_str(got[k]);
  return "";
}

// A bf16 decode must be the f32 decode rounded to nearest even.
void check_bf16_decode(const Quantizer& q, const QuantizedTensor& t, qr_direction d,
                       const std::vector<float>& f32_decode, const std::string& what) {
  const std::vector<float> got = decode(q, t, d, DType::bf16);
  std::vector<float> expected(f32_decode.size());
  for (std::size_t k = 0; k < expected.size(); ++k)
    expected[k] = num::round_to_bf16(f32_decode[k]);
  const std::string m = first_bit_mismatch(expected, got, t.cols(), "bf16 decode");
  CHECK_MESSAGE(m.empty(), what << ", " << std::string(direction_name(d))
                                << ": the bf16 decode is not the f32 decode rounded to bf16: "
                                << m);
}

// Checks every direction of `t` against the bound of the case.
void check_decodes_within_bound(const CaseContext& c, const Fixture& fx, const QuantizedTensor& t,
                                const Source& src, const std::string& what) {
  for (qr_direction d : c.directions) {
    const qr_direction_layout& l = t.layout(d);
    const ErrorBound bound = c.bound_for(l);
    const Blocks b = blocks_of(l, src.rows, src.cols);
    const std::vector<float> dq = decode(fx.quantizer(), t, d);
    const BoundReport r = check_bound(src.values, dq, b, bound);
    CHECK_MESSAGE(r.violations == 0,
                  what << ", " << std::string(direction_name(d)) << ": " << r.violations << " of "
                       << src.rows * src.cols << " elements decode outside the bound "
                       << bound.str() << "; worst " << r.worst);
    check_bf16_decode(fx.quantizer(), t, d, dq, what);
  }
}

// Shapes for the edge-value checks: a few whole blocks in every direction, and 17x33
// (partial blocks) where the format has them.
std::vector<Shape> edge_shapes(const CaseContext& c, const std::string& check) {
  std::vector<Shape> s = {{c.geometry.multi_rows, c.geometry.multi_cols}};
  if (!c.skip_partial(17, 33, check)) s.emplace_back(17, 33);
  return s;
}

}  // namespace

void check_round_trip(const CaseContext& c) {
  for (const Shape& shape : c.shapes()) {
    const std::int64_t rows = shape.first, cols = shape.second;
    if (c.skip_partial(rows, cols, "round trip")) continue;
    for (DType dt : kSourceDTypes) {
      for (DataKind kind : kDataKinds) {
        const Source src = make_source(generate(kind, rows, cols), rows, cols, dt);
        const std::string what = src.str() + " " + kind_name(kind) + " data";
        attempt("round trip of " + what, [&] {
          Fixture fx(c);
          fx.prime(src.view());
          const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
          check_decodes_within_bound(c, fx, t, src, what);
        });
      }
    }
  }
}

void check_zeros_and_denormals(const CaseContext& c) {
  for (const Shape& shape : edge_shapes(c, "zeros and denormals")) {
    const std::int64_t rows = shape.first, cols = shape.second;
    for (DType dt : kSourceDTypes) {
      // +0 and -0 in a checkerboard: every element decodes to itself, sign included.
      std::vector<float> zeros(static_cast<std::size_t>(rows * cols));
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          zeros[static_cast<std::size_t>(i * cols + j)] = (i + j) % 2 ? -0.0f : 0.0f;
      // A +0 row and a -0 column inside normal data decode to +0 / -0 too.
      std::vector<float> holes = generate(DataKind::normal, rows, cols, 3);
      for (std::int64_t j = 0; j < cols; ++j) holes[static_cast<std::size_t>(1 * cols + j)] = 0.0f;
      for (std::int64_t i = 0; i < rows; ++i) holes[static_cast<std::size_t>(i * cols + 2)] = -0.0f;

      for (const auto* values : {&zeros, &holes}) {
        const Source src = make_source(*values, rows, cols, dt);
        const std::string what =
            src.str() + (values == &zeros ? " of +-0" : " with a +0 row and a -0 column");
        attempt("quantizing " + what, [&] {
          Fixture fx(c);
          fx.prime(src.view());
          const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
          for (qr_direction d : c.directions) {
            const std::vector<float> dq = decode(fx.quantizer(), t, d);
            std::string m;
            for (std::size_t k = 0; k < dq.size() && m.empty(); ++k)
              if (src.values[k] == 0.0f && !same_bits(src.values[k], dq[k]))
                m = "element " + std::to_string(k) + ": " + float_str(src.values[k]) +
                    " decodes to " + float_str(dq[k]) +
                    (dq[k] == 0.0f ? " (sign of zero lost)" : "");
            CHECK_MESSAGE(m.empty(), what << ", " << std::string(direction_name(d)) << ": " << m);
            check_bf16_decode(fx.quantizer(), t, d, dq, what);
          }
        });
      }

      // FP32 subnormals alone, and mixed with normal values (one element in 7): no crash,
      // no flush to zero beyond what the bound allows.
      std::vector<float> sub = subnormals(rows, cols);
      std::vector<float> mixed = sub;
      const std::vector<float> normal = generate(DataKind::normal, rows, cols, 4);
      for (std::size_t k = 0; k < mixed.size(); k += 7) mixed[k] = normal[k];
      for (const auto* values : {&sub, &mixed}) {
        const Source src = make_source(*values, rows, cols, dt);
        const std::string what =
            src.str() + (values == &sub ? " of FP32 subnormals" : " of subnormals and normals");
        attempt("quantizing " + what, [&] {
          Fixture fx(c);
          fx.prime(src.view());
          const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
          check_decodes_within_bound(c, fx, t, src, what);
        });
      }
    }
  }
}

void check_nan_and_inf(const CaseContext& c) {
  const std::int64_t rows = c.geometry.multi_rows, cols = c.geometry.multi_cols;
  struct Special {
    float value;
    std::int64_t i, j;
    const char* name;
  };
  // Positions in different blocks of every direction (the shape has >= 2 blocks each way).
  const Special specials[] = {{NAN, rows / 2 + 1, cols / 2 + 3, "NaN"},
                              {INFINITY, 1, 2, "+inf"},
                              {-INFINITY, rows - 1, cols - 2, "-inf"}};
  for (DType dt : kSourceDTypes) {
    for (const Special& sp : specials) {
      const auto p = static_cast<std::size_t>(sp.i * cols + sp.j);
      std::vector<float> clean = generate(DataKind::normal, rows, cols, 7);
      clean[p] = 0.0f;
      std::vector<float> dirty = clean;
      dirty[p] = sp.value;
      const Source src_clean = make_source(clean, rows, cols, dt);
      const Source src_dirty = make_source(dirty, rows, cols, dt);
      const std::string what = src_dirty.str() + " with " + sp.name + " at (" +
                               std::to_string(sp.i) + ", " + std::to_string(sp.j) + ")";
      const bool is_nan = std::isnan(sp.value);
      attempt("quantizing " + what, [&] {
        Fixture fx(c);
        fx.prime(src_clean.view());
        const QuantizedTensor qd = fx.quantize(src_dirty.view(), c.usage, c.repeatable());
        const QuantizedTensor qc = fx.quantize(src_clean.view(), c.usage, c.repeatable());
        for (qr_direction d : c.directions) {
          INFO(what << ", " << std::string(direction_name(d)));
          const qr_direction_layout& l = qd.layout(d);
          const Blocks b = blocks_of(l, rows, cols);
          const std::vector<float> dd = decode(fx.quantizer(), qd, d);
          const std::vector<float> dc = decode(fx.quantizer(), qc, d);
          // The special element itself.
          if (is_nan) {
            CHECK_MESSAGE(std::isnan(dd[p]),
                          std::string(sp.name) << " decodes to " << float_str(dd[p]));
          } else {
            CHECK_MESSAGE((!std::isnan(dd[p]) && dd[p] != 0.0f &&
                           std::signbit(dd[p]) == std::signbit(sp.value)),
                          std::string(sp.name) << " decodes to " << float_str(dd[p])
                                  << "; expected a value of its sign (inf or saturated)");
          }
          // Everything else, per the rules of conformance.hpp.
          const bool unaffected = is_nan || l.scale_mode == QR_SCALE_BLOCK ||
                                  l.scale_mode == QR_SCALE_NONE;
          std::string problem;
          for (std::int64_t i = 0; i < rows && problem.empty(); ++i)
            for (std::int64_t j = 0; j < cols && problem.empty(); ++j) {
              const auto k = static_cast<std::size_t>(i * cols + j);
              if (k == p) continue;
              const std::string at =
                  "element (" + std::to_string(i) + ", " + std::to_string(j) + ")";
              const bool own_block = !b.per_tensor && b.same_block(i, j, sp.i, sp.j);
              if (!unaffected) {
                if (!std::isfinite(dd[k]))
                  problem = at + " decodes to " + float_str(dd[k]) +
                            "; with an inf amax every other element must stay finite";
              } else if (own_block) {
                if (is_nan ? !(std::isnan(dd[k]) || same_bits(dd[k], dc[k])) : std::isnan(dd[k]))
                  problem = at + ", in the " + sp.name + "'s block, decodes to " +
                            float_str(dd[k]) + " (without the " + sp.name + ": " +
                            float_str(dc[k]) + ")";
              } else if (!same_bits(dd[k], dc[k]) || code_at(qd, d, i, j) != code_at(qc, d, i, j)) {
                problem = at + ", outside the " + sp.name + "'s block, decodes to " +
                          float_str(dd[k]) + " (code " + std::to_string(code_at(qd, d, i, j)) +
                          ") but to " + float_str(dc[k]) + " (code " +
                          std::to_string(code_at(qc, d, i, j)) + ") without the " + sp.name;
              }
            }
          if (unaffected && problem.empty() && l.scale_ndim > 0) {
            for (std::int64_t bi = 0; bi < b.grid_rows && problem.empty(); ++bi)
              for (std::int64_t bj = 0; bj < b.grid_cols && problem.empty(); ++bj) {
                const bool own = b.row_of(sp.i) == bi && b.col_of(sp.j) == bj;
                if (own && !b.per_tensor) continue;
                if (scale_entry(qd, d, bi, bj) != scale_entry(qc, d, bi, bj))
                  problem = "the scale of block (" + std::to_string(bi) + ", " +
                            std::to_string(bj) + ") differs from the one without the " + sp.name;
              }
          }
          if (is_nan && problem.empty() && qd.has_amax(d)) {
            const float a = qd.amax(d), e = qc.amax(d);
            if (!same_bits(a, e))
              problem = "the stored amax is " + float_str(a) + " but " + float_str(e) +
                        " without the NaN (amax ignores NaN)";
          }
          CHECK_MESSAGE(problem.empty(), problem);
        }
      });
    }
  }
}

void check_exact_values(const CaseContext& c) {
  const std::vector<float>& values = c.kase->properties.exact_values;
  if (values.empty()) {
    not_supported(c.name + ": exactly representable values (Properties::exact_values is empty)");
    return;
  }
  std::vector<qr_direction> block_dirs;
  for (qr_direction d : c.directions)
    if (c.geometry.block_mode[d]) block_dirs.push_back(d);

  for (const Shape& shape : edge_shapes(c, "exact values")) {
    const std::int64_t rows = shape.first, cols = shape.second;
    for (DType dt : kSourceDTypes) {
      std::vector<float> usable;  // the values this source dtype holds exactly
      for (float v : values)
        if (dt == DType::f32 || num::round_to_bf16(v) == v) usable.push_back(v);
      if (usable.empty()) continue;

      auto check_exact = [&](const std::vector<float>& x, const std::vector<qr_direction>& dirs,
                             const std::string& what) {
        const Source src = make_source(x, rows, cols, dt);
        attempt("quantizing " + what, [&] {
          Fixture fx(c);
          fx.prime(src.view());
          const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
          for (qr_direction d : dirs) {
            const std::string m =
                first_bit_mismatch(src.values, decode(fx.quantizer(), t, d), cols, "element");
            CHECK_MESSAGE(m.empty(), what << ", " << std::string(direction_name(d))
                                          << ": not decoded exactly: " << m);
          }
        });
      };

      // A tensor of one value: every direction decodes it exactly.
      for (float v : usable)
        check_exact(std::vector<float>(static_cast<std::size_t>(rows * cols), v), c.directions,
                    std::string(dtype_name(dt)) + "[" + shape_str(rows, cols) + "] all " +
                        float_str(v));

      // Block scaling: tiles constant over every block of every blocked direction, cycling
      // through the values. A block dimension spanning the tensor makes the tile span it.
      if (block_dirs.empty()) continue;
      std::int64_t tile_rows = 1, tile_cols = 1;
      bool whole_rows = false, whole_cols = false;
      for (qr_direction d : block_dirs) {
        const std::int64_t br = c.geometry.block_rows[d], bc = c.geometry.block_cols[d];
        if (br > 0) tile_rows = std::lcm(tile_rows, br); else whole_rows = true;
        if (bc > 0) tile_cols = std::lcm(tile_cols, bc); else whole_cols = true;
      }
      if (whole_rows) tile_rows = std::max<std::int64_t>(rows, 1);
      if (whole_cols) tile_cols = std::max<std::int64_t>(cols, 1);
      std::vector<float> tiles(static_cast<std::size_t>(rows * cols));
      const auto n = static_cast<std::int64_t>(usable.size());
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          tiles[static_cast<std::size_t>(i * cols + j)] =
              usable[static_cast<std::size_t>((i / tile_rows + j / tile_cols) % n)];
      check_exact(tiles, block_dirs,
                  std::string(dtype_name(dt)) + "[" + shape_str(rows, cols) +
                      "] of constant blocks");
    }
  }
}

}  // namespace qrecipe::conformance::detail
