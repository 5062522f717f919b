// Structural checks: the quantizer itself, shapes (single element, empty, partial blocks),
// layouts and buffers, the two directions, determinism and the amax paths.
#include <cstring>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance::detail {
namespace {

using Shape = std::pair<std::int64_t, std::int64_t>;

bool known_dtype(std::int32_t code) {
  for (const auto& info : qrecipe::detail::kDTypes)
    if (static_cast<std::int32_t>(info.dtype) == code) return true;
  return false;
}

// Differences between two layouts of the same request ("" when equal).
std::string layout_diff(const qr_direction_layout& a, const qr_direction_layout& b) {
  auto field = [](const char* name, std::int64_t x, std::int64_t y) {
    return x == y ? std::string()
                  : std::string(name) + " " + std::to_string(x) + " vs " + std::to_string(y);
  };
  for (const std::string& s :
       {field("data_dtype", a.data_dtype, b.data_dtype),
        field("data_ndim", a.data_ndim, b.data_ndim),
        field("data_shape[0]", a.data_shape[0], b.data_shape[0]),
        field("data_shape[1]", a.data_shape[1], b.data_shape[1]),
        field("data_transposed", a.data_transposed, b.data_transposed),
        field("scale_mode", a.scale_mode, b.scale_mode),
        field("scale_dtype", a.scale_dtype, b.scale_dtype),
        field("scale_ndim", a.scale_ndim, b.scale_ndim),
        field("scale_shape[0]", a.scale_shape[0], b.scale_shape[0]),
        field("scale_shape[1]", a.scale_shape[1], b.scale_shape[1]),
        field("scale_transposed", a.scale_transposed, b.scale_transposed),
        field("block_rows", a.block_rows, b.block_rows),
        field("block_cols", a.block_cols, b.block_cols),
        field("has_amax", a.has_amax, b.has_amax)})
    if (!s.empty()) return s;
  const std::string fa = a.format ? a.format : "", fb = b.format ? b.format : "";
  return fa == fb ? "" : "format '" + fa + "' vs '" + fb + "'";
}

// Problems of one layout on its own ("" when none).
std::string layout_problem(const qr_direction_layout& l, std::int64_t rows, std::int64_t cols) {
  if (!l.format || !*l.format) return "no format name";
  if (!known_dtype(l.data_dtype)) return "unknown data dtype " + std::to_string(l.data_dtype);
  if (l.data_ndim != 2) return "data_ndim " + std::to_string(l.data_ndim) + " (expected 2)";
  const std::int64_t e0 = l.data_transposed ? cols : rows, e1 = l.data_transposed ? rows : cols;
  if (l.data_shape[0] != e0 || l.data_shape[1] != e1)
    return "data shape [" + std::to_string(l.data_shape[0]) + ", " +
           std::to_string(l.data_shape[1]) + "] but the " + shape_str(rows, cols) +
           " tensor needs [" + std::to_string(e0) + ", " + std::to_string(e1) + "]" +
           (l.data_transposed ? " (transposed)" : "");
  if (l.scale_mode < QR_SCALE_NONE || l.scale_mode > QR_SCALE_BLOCK_TENSOR)
    return "unknown scale mode " + std::to_string(l.scale_mode);
  if (l.scale_mode == QR_SCALE_NONE && l.scale_ndim != 0)
    return "scale mode NONE with a scale array";
  if (l.scale_mode != QR_SCALE_NONE && (l.scale_ndim < 1 || l.scale_ndim > 2))
    return "scale_ndim " + std::to_string(l.scale_ndim) + " (expected 1 or 2)";
  if (l.scale_ndim > 0 && !known_dtype(l.scale_dtype))
    return "unknown scale dtype " + std::to_string(l.scale_dtype);
  if (l.scale_ndim > 0 && (l.scale_shape[0] < 0 || (l.scale_ndim == 2 && l.scale_shape[1] < 0)))
    return "negative scale shape";
  return "";
}

}  // namespace

void check_quantizer(const CaseContext& c) {
  attempt("describe()", [&] {
    Fixture fx(c);
    const std::string d = fx.quantizer().describe();
    CHECK_MESSAGE(!d.empty(), "describe() returned an empty string");
    // layout() is a pure function of (rows, cols, direction).
    for (qr_direction dir : c.directions) {
      const auto a = fx.quantizer().layout(17, 33, dir);
      const auto b = fx.quantizer().layout(17, 33, dir);
      const std::string diff = layout_diff(a, b);
      CHECK_MESSAGE(diff.empty(), std::string(direction_name(dir))
                                      << " layout of 17x33 changed between two calls: " << diff);
    }
  });
}

void check_shapes(const CaseContext& c) {
  for (const Shape& shape : c.shapes()) {
    const std::int64_t rows = shape.first, cols = shape.second;
    const bool partial = c.partial(rows, cols);
    const bool refuse = partial && !c.kase->properties.supports_partial_blocks;
    const Source src = make_source(generate(DataKind::normal, rows, cols), rows, cols, DType::f32);
    INFO(src.str() << std::string(partial ? " (partial blocks)" : ""));
    try {
      Fixture fx(c);
      fx.prime(src.view());
      const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
      CHECK_MESSAGE(!refuse, "the Properties say the format has no partial blocks, but "
                                 << src.str() << " quantized without an error");
      for (qr_direction d : c.directions) {
        const std::string p = scale_array_problem(t, d);
        CHECK_MESSAGE(p.empty(), p);
        const std::vector<float> dq = decode(fx.quantizer(), t, d);
        CHECK(static_cast<std::int64_t>(dq.size()) == rows * cols);
      }
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (refuse) {
        CHECK_MESSAGE((msg.find(std::to_string(rows)) != std::string::npos &&
                       msg.find(std::to_string(cols)) != std::string::npos),
                      "refusing " << shape_str(rows, cols)
                                  << " is allowed, but the error must name the shape: " << msg);
        not_supported(c.name + ": partial blocks (" + shape_str(rows, cols) +
                      " refused: " + msg + ")");
      } else if (e.code() == QR_STATUS_UNSUPPORTED) {
        not_supported("quantizing " + src.str() + " (the plugin answered UNSUPPORTED: " + msg +
                      ")");
      } else {
        FAIL_CHECK("quantizing " << src.str() << " threw: " << msg);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK("quantizing " << src.str()
                               << " threw a non-qrecipe exception: " << std::string(e.what()));
    }
  }
}

void check_layout(const CaseContext& c) {
  const std::int64_t multi_rows = c.geometry.multi_rows, multi_cols = c.geometry.multi_cols;
  const Source big = make_source(generate(DataKind::normal, multi_rows, multi_cols), multi_rows,
                                 multi_cols, DType::f32);
  // Layouts alone, and the buffers a quantize allocates from them.
  for (const Shape& shape : c.shapes()) {
    const std::int64_t rows = shape.first, cols = shape.second;
    if (c.skip_partial(rows, cols, "layout")) continue;
    const Source src =
        make_source(generate(DataKind::uniform, rows, cols), rows, cols, DType::bf16);
    attempt("layout and quantize of " + src.str(), [&] {
      Fixture fx(c);
      fx.prime(src.view());
      const QuantizedTensor t = fx.quantize(src.view(), c.usage, c.repeatable());
      for (qr_direction d : c.directions) {
        INFO(src.str() << ", " << std::string(direction_name(d)));
        const qr_direction_layout l = fx.quantizer().layout(rows, cols, d);
        const std::string p = layout_problem(l, rows, cols);
        CHECK_MESSAGE(p.empty(), "layout: " << p);
        if (!p.empty()) continue;
        const std::string diff = layout_diff(t.layout(d), l);
        CHECK_MESSAGE(diff.empty(),
                      "the quantized tensor's layout differs from layout(): " << diff);
        const auto data_dtype = static_cast<DType>(l.data_dtype);
        CHECK(t.data(d).nbytes() == storage_bytes(data_dtype, l.data_shape[0], l.data_shape[1]));
        if (l.scale_ndim > 0) {
          const TensorView s = t.scale_inv(d);
          CHECK(s.ndim() == l.scale_ndim);
          CHECK(s.size(0) == l.scale_shape[0]);
          if (l.scale_ndim == 2) CHECK(s.size(1) == l.scale_shape[1]);
          CHECK(static_cast<std::int32_t>(s.dtype()) == l.scale_dtype);
        }
        CHECK(t.has_amax(d) == (l.has_amax != 0));
      }
    });
  }

  // A 3-D source is its 2-D view [prod(leading dims), last dim].
  attempt("quantizing a 3-D source", [&] {
    const std::int64_t lead = big.rows % 2 == 0 ? 2 : 1;
    const Source three = reshape(big, {lead, big.rows / lead, big.cols});
    Fixture fx(c);
    fx.prime(big.view());
    const QuantizedTensor a = fx.quantize(big.view(), c.usage, c.repeatable());
    const QuantizedTensor b = fx.quantize(three.view(), c.usage, c.repeatable());
    const std::string diff = compare_bytes(a, b, c.usage);
    CHECK_MESSAGE(diff.empty(), "quantizing " << three.str() << " differs from its 2-D view "
                                              << big.str() << ": " << diff);
  });

  // A strided (transposed) source equals its contiguous copy, or is refused with an error.
  attempt("quantizing a strided source", [&] {
    const StridedSource strided = transposed_storage(big);
    Fixture fx(c);
    fx.prime(big.view());
    const QuantizedTensor a = fx.quantize(big.view(), c.usage, c.repeatable());
    try {
      const QuantizedTensor b = fx.quantize(strided.view, c.usage, c.repeatable());
      const std::string diff = compare_bytes(a, b, c.usage);
      CHECK_MESSAGE(diff.empty(), "a transposed-strided view of "
                                      << big.str() << " quantizes differently: " << diff);
    } catch (const Error& e) {
      not_supported(c.name + ": strided (non-contiguous) sources, refused with: " + e.what());
    }
  });

  // quantize_into an existing tensor (holding other values) equals a fresh quantize.
  attempt("quantize_into", [&] {
    const Source other = make_source(generate(DataKind::outliers, big.rows, big.cols, 11),
                                     big.rows, big.cols, DType::f32);
    Fixture fx(c);
    fx.prime(big.view());
    QuantizedTensor into = fx.quantize(other.view(), c.usage, c.repeatable());
    fx.quantize_into(big.view(), into, c.repeatable());
    const QuantizedTensor fresh = fx.quantize(big.view(), c.usage, c.repeatable());
    const std::string diff = compare_bytes(into, fresh, c.usage);
    CHECK_MESSAGE(diff.empty(), "quantize_into of " << big.str() << " over a tensor holding other "
                                                    << "values differs from quantize: " << diff);
  });

  // quantize_into a destination whose layout or buffers disagree with layout() (a tensor of
  // another quantizer, or one altered after allocation) is refused with a qrecipe::Error
  // before anything is written: a plugin checks its destinations itself, as its C entry is
  // also reached without the engine in front (the host table's quantizer_quantize).
  attempt("quantize_into a mismatched destination", [&] {
    struct Mismatch {
      const char* what;
      void (*apply)(qr_direction_data&);
    };
    const Mismatch mismatches[] = {
        {"a data buffer of another dtype",
         [](qr_direction_data& dd) {
           dd.data.dtype = dd.data.dtype == QR_DTYPE_F32 ? QR_DTYPE_F16 : QR_DTYPE_F32;
         }},
        {"a data buffer one row longer", [](qr_direction_data& dd) { dd.data.shape[0] += 1; }},
        {"a layout with other blocks", [](qr_direction_data& dd) { dd.layout.block_rows += 1; }},
        {"a null data pointer", [](qr_direction_data& dd) { dd.data.data = nullptr; }},
    };
    Fixture fx(c);
    fx.prime(big.view());
    for (const qr_direction d : c.directions) {
      for (const Mismatch& m : mismatches) {
        INFO(big.str() << ", the " << std::string(direction_name(d)) << " direction with "
                       << m.what);
        QuantizedTensor t = fx.quantize(big.view(), c.usage, c.repeatable());
        m.apply(d == QR_DIRECTION_ROWWISE ? t.c().rowwise : t.c().columnwise);
        CHECK_THROWS_AS(fx.quantize_into(big.view(), t, c.repeatable()), Error);
      }
    }
  });
}

void check_directions(const CaseContext& c) {
  if (c.usage != (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) {
    not_supported(c.name + ": " + (c.usage & QR_USAGE_ROWWISE ? "columnwise" : "rowwise") +
                  " direction (Properties::usage)");
    return;
  }
  std::vector<Shape> shapes = {{c.geometry.multi_rows, c.geometry.multi_cols}};
  if (!c.skip_partial(17, 33, "rowwise and columnwise")) shapes.emplace_back(17, 33);
  for (const Shape& shape : shapes) {
    const std::int64_t rows = shape.first, cols = shape.second;
    const Source src =
        make_source(generate(DataKind::heavy_tailed, rows, cols), rows, cols, DType::bf16);
    attempt("quantizing " + src.str() + " per direction", [&] {
      Fixture fx(c);
      fx.prime(src.view());
      const QuantizedTensor both = fx.quantize(src.view(), c.usage, c.repeatable());
      const QuantizedTensor row = fx.quantize(src.view(), QR_USAGE_ROWWISE, c.repeatable());
      const QuantizedTensor col = fx.quantize(src.view(), QR_USAGE_COLUMNWISE, c.repeatable());
      const std::string dr = compare_bytes(both, row, QR_USAGE_ROWWISE);
      const std::string dc = compare_bytes(both, col, QR_USAGE_COLUMNWISE);
      CHECK_MESSAGE(dr.empty(),
                    src.str() << ": rowwise alone differs from rowwise of both: " << dr);
      CHECK_MESSAGE(dc.empty(),
                    src.str() << ": columnwise alone differs from columnwise of both: " << dc);
      if (!c.kase->properties.columnwise_is_transpose) return;
      // Both directions hold the same codes (transposed in storage) and decode identically.
      const std::vector<float> r = decode(fx.quantizer(), both, QR_DIRECTION_ROWWISE);
      const std::vector<float> k = decode(fx.quantizer(), both, QR_DIRECTION_COLUMNWISE);
      std::string problem;
      if (both.layout(QR_DIRECTION_ROWWISE).data_dtype !=
          both.layout(QR_DIRECTION_COLUMNWISE).data_dtype)
        problem = "the directions have different data dtypes";
      for (std::int64_t i = 0; i < rows && problem.empty(); ++i)
        for (std::int64_t j = 0; j < cols && problem.empty(); ++j) {
          const auto e = static_cast<std::size_t>(i * cols + j);
          const std::uint32_t cr = code_at(both, QR_DIRECTION_ROWWISE, i, j);
          const std::uint32_t cc = code_at(both, QR_DIRECTION_COLUMNWISE, i, j);
          if (cr != cc || num::float_bits(r[e]) != num::float_bits(k[e]))
            problem = "element (" + std::to_string(i) + ", " + std::to_string(j) +
                      "): rowwise code " + std::to_string(cr) + " decodes to " +
                      float_str(r[e]) + ", columnwise code " + std::to_string(cc) + " to " +
                      float_str(k[e]);
        }
      CHECK_MESSAGE(problem.empty(), src.str() << ": Properties say columnwise is the transpose of "
                                               << "rowwise, but " << problem);
    });
  }
}

void check_determinism(const CaseContext& c) {
  const std::int64_t rows = c.geometry.multi_rows, cols = c.geometry.multi_cols;
  for (DType dt : kSourceDTypes) {
    const Source src = make_source(generate(DataKind::normal, rows, cols, 21), rows, cols, dt);
    attempt("repeated quantization of " + src.str(), [&] {
      Fixture fx(c);
      fx.prime(src.view());
      const QuantizedTensor a = fx.quantize(src.view(), c.usage, c.repeatable());
      const QuantizedTensor b = fx.quantize(src.view(), c.usage, c.repeatable());
      const std::string same_q = compare_bytes(a, b, c.usage);
      CHECK_MESSAGE(same_q.empty(), src.str() << ": two quantizations differ: " << same_q);
      Fixture other(c);  // a fresh engine and quantizer
      other.prime(src.view());
      const QuantizedTensor e = other.quantize(src.view(), c.usage, c.repeatable());
      const std::string same_fresh = compare_bytes(a, e, c.usage);
      CHECK_MESSAGE(same_fresh.empty(),
                    src.str() << ": a second quantizer gives other bytes: " << same_fresh);

      // amax: a stored amax is compute_amax's; passing compute_amax's result changes nothing.
      const std::array<float, 2> amax = fx.quantizer().compute_amax(src.view());
      for (qr_direction d : c.directions)
        if (a.has_amax(d))
          CHECK_MESSAGE(num::float_bits(a.amax(d)) == num::float_bits(amax[d]),
                        src.str() << ", " << std::string(direction_name(d)) << ": stored amax "
                                  << float_str(a.amax(d)) << " but compute_amax gives "
                                  << float_str(amax[d]));
      attempt("quantizing with a caller-given amax", [&] {
        QuantizeOptions given = c.repeatable();
        given.amax = amax;
        const QuantizedTensor g = fx.quantize(src.view(), c.usage, given);
        const std::string same_amax = compare_bytes(a, g, c.usage);
        CHECK_MESSAGE(same_amax.empty(),
                      src.str() << ": quantizing with the caller-given amax [" << float_str(amax[0])
                                << ", " << float_str(amax[1])
                                << "] (= compute_amax) differs: " << same_amax);
      });

      if (!c.kase->properties.stochastic) return;
      // Stochastic rounding: the offset is the only source of randomness.
      QuantizeOptions o1, o2;
      o1.rng_offset = 1;
      o2.rng_offset = 2;
      const QuantizedTensor s1 = fx.quantize(src.view(), c.usage, o1);
      const QuantizedTensor s2 = fx.quantize(src.view(), c.usage, o2);
      CHECK_MESSAGE(!compare_bytes(s1, s2, c.usage).empty(),
                    src.str() << ": rng_offset 1 and 2 give identical bytes; stochastic rounding "
                                 "should depend on the offset");
      const QuantizedTensor n1 = fx.quantize(src.view(), c.usage);
      const QuantizedTensor n2 = fx.quantize(src.view(), c.usage);
      CHECK_MESSAGE(!compare_bytes(n1, n2, c.usage).empty(),
                    src.str() << ": two calls without an rng_offset give identical bytes; the "
                                 "call offset should advance per call");
    });
  }
}

}  // namespace qrecipe::conformance::detail
