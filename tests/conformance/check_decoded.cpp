// Quantize and decode in one pass (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED): the extra writes
// exactly the bytes `quantize` writes, and for every block-scaled direction the BF16 values of
// the extra's rule, checked here against the plugin's own reference decode of those bytes
// (dequantize, with the per-tensor factor made 1 by storing the format's
// tensor_scale_numerator as the amax: S_dec = amax / numerator = 1). A plugin without the
// extra is "not supported" (emulated GEMMs then decode in a second kernel).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "detail.hpp"
#include "qrecipe/conversions.hpp"

namespace qrecipe::conformance::detail {
namespace {

using Shape = std::pair<std::int64_t, std::int64_t>;

// The extra's rule, restated from plugin_abi.h (not the SDK helper: the test must not check
// the helper against itself): high 16 bits, NaN as 0x7FFF, a miss for finite low bits.
std::uint16_t rule_bf16(float v, bool& miss) {
  const std::uint32_t u = num::float_bits(v);
  if (std::isnan(v)) return 0x7FFFu;
  if ((u & 0x7F800000u) != 0x7F800000u && (u & 0xFFFFu) != 0) miss = true;
  return static_cast<std::uint16_t>(u >> 16);
}

// The sources of one shape: normal data, data with NaN / +inf / -inf (two of each shape has
// room for), and FP32 subnormals (tiny blocks: where MX scales miss BF16's grid).
std::vector<std::pair<std::string, std::vector<float>>> sources_of(std::int64_t rows, std::int64_t cols) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  out.emplace_back("normal", generate(DataKind::normal, rows, cols, 3));
  out.emplace_back("outliers", generate(DataKind::outliers, rows, cols, 4));
  out.emplace_back("subnormals", subnormals(rows, cols));
  std::vector<float> special = generate(DataKind::normal, rows, cols, 5);
  const std::size_t n = special.size();
  if (n > 0) special[0] = NAN;
  if (n > 2) special[n / 2] = INFINITY;
  if (n > 3) special[n - 1] = -INFINITY;
  out.emplace_back("NaN and inf", std::move(special));
  return out;
}

std::string hex16(std::uint16_t v) {
  static const char* digits = "0123456789ABCDEF";
  std::string s = "0x";
  for (int shift = 12; shift >= 0; shift -= 4) s += digits[(v >> shift) & 0xF];
  return s;
}

}  // namespace

void check_quantize_decoded(const CaseContext& c) {
  std::vector<Shape> shapes = c.shapes();
  for (const Shape& extra : {Shape{33, 17}, Shape{5, 100}, Shape{64, 96}})
    if (std::find(shapes.begin(), shapes.end(), extra) == shapes.end()) shapes.push_back(extra);
  for (const Shape& shape : shapes) {
    const std::int64_t rows = shape.first, cols = shape.second;
    if (rows * cols == 0) continue;  // nothing to decode (check_shapes covers empty tensors)
    if (c.skip_partial(rows, cols, "quantize and decode")) continue;
    for (DType dt : kSourceDTypes) {
      for (const auto& [kind, values] : sources_of(rows, cols)) {
        const Source src = make_source(values, rows, cols, dt);
        const std::string what = src.str() + " " + kind + " data";
        attempt("quantize and decode of " + what, [&] {
          Fixture fx(c);
          const Quantizer& q = fx.quantizer();
          if (!q.has_quantize_decoded()) {
            not_supported("quantize and decode in one pass: the plugin has no "
                          QR_EXTRA_QUANTIZE_DECODED " extra (emulated GEMMs decode in a second "
                          "kernel)");
            return;
          }
          fx.prime(src.view());
          const QuantizedTensor plain = fx.quantize(src.view(), c.usage, c.repeatable());
          std::array<qr_direction_layout, 2> layouts{};
          for (qr_direction d : c.directions) layouts[d] = plain.layout(d);
          QuantizedTensor fused(q.format(), rows, cols, c.usage, layouts, Device::cpu(), cpu_allocator());
          qr_decoded_output out{};
          out.struct_size = sizeof out;
          std::vector<std::uint16_t> values_of[2];
          std::uint32_t miss[2] = {0, 0};
          for (qr_direction d : c.directions) {
            const qr_direction_layout& l = layouts[d];
            if (!is_block_mode(l) || l.data_ndim != 2) continue;
            // Pre-filled with a pattern the rule never writes for finite values of this size.
            values_of[d].assign(static_cast<std::size_t>(l.data_shape[0] * l.data_shape[1]), 0xFFFFu);
            out.values[d] = values_of[d].data();
            out.miss[d] = &miss[d];
          }
          if (out.values[0] == nullptr && out.values[1] == nullptr) {
            not_supported("quantize and decode: no block-scaled direction in this case");
            return;
          }
          const bool served = q.quantize_decoded_into(src.view(), fused, c.repeatable(), out);
          if (!served) {
            not_supported("quantize and decode of " + src.str() + ": the plugin refused it "
                          "(UNSUPPORTED); the engine decodes in a second kernel");
            return;
          }
          const std::string diff = compare_bytes(plain, fused, c.usage);
          CHECK_MESSAGE(diff.empty(), what << ": the one-pass bytes differ from quantize's: " << diff);
          for (qr_direction d : c.directions) {
            if (out.values[d] == nullptr) continue;
            INFO(what << ", " << std::string(direction_name(d)));
            const qr_direction_layout& l = layouts[d];
            // The reference decode without the per-tensor factor.
            QuantizedTensor ref = fx.quantize(src.view(), c.usage, c.repeatable());
            if (l.scale_mode == QR_SCALE_BLOCK_TENSOR) {
              const float numerator = q.direction_plugin(l).tensor_scale_numerator();
              if (numerator == 0.0f) {
                not_supported("quantize and decode: a block-and-tensor direction whose format "
                              "gives no tensor_scale_numerator cannot be checked");
                continue;
              }
              qr_direction_data& dd = d == QR_DIRECTION_ROWWISE ? ref.c().rowwise : ref.c().columnwise;
              *static_cast<float*>(dd.amax.data) = numerator;
            }
            const std::vector<float> logical = decode(q, ref, d);
            const bool transposed = l.data_transposed != 0;
            const std::int64_t drows = l.data_shape[0], dcols = l.data_shape[1];
            bool want_miss = false;
            std::string problem;
            for (std::int64_t p = 0; p < drows && problem.empty(); ++p)
              for (std::int64_t qq = 0; qq < dcols && problem.empty(); ++qq) {
                const std::int64_t i = transposed ? qq : p, j = transposed ? p : qq;
                const std::uint16_t want =
                    rule_bf16(logical[static_cast<std::size_t>(i * cols + j)], want_miss);
                const std::uint16_t got = values_of[d][static_cast<std::size_t>(p * dcols + qq)];
                if (want != got)
                  problem = "stored element (" + std::to_string(p) + ", " + std::to_string(qq) +
                            "): decoded BF16 bits " + hex16(got) + ", expected " + hex16(want) +
                            " from the reference decode " +
                            float_str(logical[static_cast<std::size_t>(i * cols + j)]);
              }
            CHECK_MESSAGE(problem.empty(), problem);
            CHECK_MESSAGE((miss[d] != 0) == want_miss,
                          "the miss word is " << miss[d] << " but the values "
                                              << (want_miss ? "include" : "do not include")
                                              << " a finite value BF16 cannot hold");
          }
        });
      }
    }
  }
}

}  // namespace qrecipe::conformance::detail
