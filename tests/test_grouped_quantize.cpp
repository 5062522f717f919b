// Engine::quantize_grouped (plugin_abi.h quantize_grouped) on the CPU: for every shipped format
// -- through the plugin's quantize_grouped extra where it has one, through the engine's per-group loop
// otherwise -- each group's bytes, scales and amaxes equal quantizing that group's rows alone
// with an identical quantizer (a second engine, so delayed-scaling states and stochastic-
// rounding counters advance the same way on both sides). Then the argument checks (engine and
// plugin side) and how the extra is found (by name, through get_proc_address).
//
// Map
//   1. specs, group layouts, inputs, byte comparison
//   2. grouped == per group for every format, usage, source dtype and layout (+ delayed steps)
//   3. a strided source and an explicit rng offset
//   4. bad inputs: engine messages and the plugin extra's own checks
//   5. the extra is found by name; formats without it (and unknown names) get NULL
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "grouped_inputs.hpp"

using namespace qrecipe;

namespace {

// ---------------------------------------------------------------- 1. helpers

struct Spec {
  const char* label;
  const char* yaml;  // a quantizer spec as a recipe writes it
};

const Spec kSpecs[] = {
    {"float8/current_e4m3", "{format: float8}"},
    {"float8/e5m2_pow2", "{format: float8, dtype: e5m2, pow2_scales: true}"},
    {"float8/amax_epsilon", "{format: float8, amax_epsilon: 0.75}"},
    {"float8/delayed", "{format: float8, scaling: delayed, amax_history_len: 4, margin: 1}"},
    {"mxfp8/e4m3", "{format: mxfp8}"},
    {"blockwise/1x128", "{format: blockwise, block: 1x128}"},
    {"blockwise/128x128", "{format: blockwise, block: 128x128, pow2_scales: false}"},
    {"nvfp4/default", "{format: nvfp4}"},
    {"nvfp4/2d_sr", "{format: nvfp4, 2d: true, stochastic_rounding: true, seed: 11}"},
    {"hybrid/float8_mxfp8",
     "{format: hybrid, rowwise: {format: float8}, columnwise: {format: mxfp8}}"},
};

// The formats whose plugin fills the quantize_grouped extra (the others take the loop). A
// format that gains or loses the extra must be listed here, so the report stays true.
const std::set<std::string> kFormatsWithExtra = {"float8", "mxfp8", "blockwise", "nvfp4"};

using Layout = test::GroupLayout;
using test::states_of;
using test::total_rows;
// Odd and empty groups, partial blocks and tiles everywhere, one group, all-empty groups.
const Layout kLayouts[] = {
    {{3, 0, 5, 1}, 34}, {{128, 64}, 128}, {{1}, 1}, {{0, 0}, 16}, {{40, 33, 17}, 130},
    {{32, 32, 32}, 32},
};

const QuantizerRole kRole{"grouped_linear", "weight", "experts"};

TensorView rows_of(const TensorView& src, std::int64_t row, std::int64_t rows) {
  qr_tensor_view v = src.c();
  v.shape[0] = rows;
  if (rows > 0)
    v.data = static_cast<char*>(v.data) + row * v.strides[0] * dtype_bits(src.dtype()) / 8;
  return TensorView(v);
}

std::vector<std::uint8_t> bytes_of(const qr_tensor_view& v) {
  if (v.data == nullptr) return {};
  const TensorView t(v);
  const auto* p = static_cast<const std::uint8_t*>(t.data());
  return std::vector<std::uint8_t>(p, p + t.nbytes());
}

// Every buffer of every direction of `got` equals `want`.
void check_same(const QuantizedTensor& want, const QuantizedTensor& got, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.usage() == want.usage());
  REQUIRE(got.rows() == want.rows());
  REQUIRE(got.cols() == want.cols());
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!want.has(d)) continue;
    const std::string dir = direction_name(d);
    CAPTURE(dir);
    const qr_direction_data& a = want.direction(d);
    const qr_direction_data& b = got.direction(d);
    CHECK(bytes_of(a.data) == bytes_of(b.data));
    CHECK(bytes_of(a.scale_inv) == bytes_of(b.scale_inv));
    CHECK(bytes_of(a.amax) == bytes_of(b.amax));
  }
}

std::string yaml_of(const Spec& s) {
  return std::string("version: 1\nname: grouped\ndefaults: ") + s.yaml + "\n";
}

bool contains_text(const std::string& s, const std::string& part) {
  const bool found = s.find(part) != std::string::npos;
  if (!found) MESSAGE("'" << part << "' not in: " << s);
  return found;
}

bool have(const char* format) { return Registry::shared()->find(format) != nullptr; }

std::string format_of(const Spec& s) {
  const std::string label = s.label;
  return label.substr(0, label.find('/'));
}

// Quantizes `src` grouped with `grouped` and group by group with `reference` (two quantizers
// of identical engines) and compares. Returns false when the reference refuses the layout
// (then the grouped call must refuse it too).
bool compare_once(Engine& ge, Quantizer& grouped, Quantizer& reference, const TensorView& src,
                  const std::vector<std::int64_t>& group_rows, std::uint32_t usage,
                  const std::string& what) {
  std::vector<QuantizedTensor> want;
  try {
    std::int64_t row = 0;
    for (const auto r : group_rows) {
      want.push_back(reference.quantize(rows_of(src, row, r), usage));
      row += r;
    }
  } catch (const Error& e) {
    MESSAGE("not supported by the reference: " << what << ": " << e.message());
    CHECK_THROWS_AS(ge.quantize_grouped(grouped, src, group_rows, usage), Error);
    return false;
  }
  const std::vector<QuantizedTensor> got = ge.quantize_grouped(grouped, src, group_rows, usage);
  REQUIRE(got.size() == want.size());
  for (std::size_t g = 0; g < got.size(); ++g)
    check_same(want[g], got[g], what + " group " + std::to_string(g));
  return true;
}

}  // namespace

// ---------------------------------------------------------------- 2. grouped == per group

TEST_CASE("grouped quantize == each group quantized alone, every format (CPU)") {
  int compared = 0;
  for (const Spec& spec : kSpecs) {
    const std::string format = format_of(spec);
    if (!have(format.c_str()) || (format == "hybrid" && (!have("float8") || !have("mxfp8")))) {
      MESSAGE("not supported: plugin " << format << " not built");
      continue;
    }
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const std::uint32_t usage :
           {std::uint32_t{QR_USAGE_ROWWISE}, std::uint32_t{QR_USAGE_COLUMNWISE},
            std::uint32_t{QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE}}) {
        // Fresh engines per sweep: delayed states and SR counters start equal on both sides.
        Engine ge(Recipe::parse(yaml_of(spec), "grouped.yaml"));
        Engine re(Recipe::parse(yaml_of(spec), "grouped.yaml"));
        const auto gq = ge.resolve(kRole);
        const auto rq = re.resolve(kRole);
        REQUIRE(gq != nullptr);
        CHECK(Engine::has_grouped_quantize(*gq) == (kFormatsWithExtra.count(format) == 1));
        std::uint64_t seed = 1;
        for (const Layout& l : kLayouts) {
          const Tensor src =
              test::host_source(test::grouped_values(l, seed++), total_rows(l), l.cols, dtype);
          const std::string what = std::string(spec.label) + " " +
                                   std::string(dtype_name(dtype)) + " " + usage_str(usage) +
                                   " cols " + std::to_string(l.cols) + " groups " +
                                   std::to_string(l.group_rows.size());
          if (compare_once(ge, *gq, *rq, src.view(), l.group_rows, usage, what)) ++compared;
          // Delayed scaling: the step's amaxes agree, and after an update (which moves the
          // scale) so do the states; the next layout then runs with the new scale.
          CHECK(ge.current_amaxes() == re.current_amaxes());
          ge.update_scaling();
          re.update_scaling();
          CHECK(states_of(ge) == states_of(re));
        }
      }
    }
  }
  CHECK(compared > 0);
}

TEST_CASE("grouped quantize into existing tensors requantizes in place") {
  if (!have("float8")) return;
  Engine e(Recipe::parse(yaml_of(kSpecs[0]), "grouped.yaml"));
  const auto q = e.resolve(kRole);
  const Layout l{{4, 7, 2}, 20};
  const Tensor first =
      test::host_source(test::grouped_values(l, 91), total_rows(l), l.cols, DType::f32);
  const Tensor second =
      test::host_source(test::grouped_values(l, 92), total_rows(l), l.cols, DType::bf16);
  std::vector<QuantizedTensor> dst = e.quantize_grouped(*q, first.view(), l.group_rows, 3);
  std::vector<QuantizedTensor*> ptrs;
  for (auto& t : dst) ptrs.push_back(&t);
  e.quantize_grouped_into(*q, second.view(), l.group_rows, ptrs);
  std::int64_t row = 0;
  for (std::size_t g = 0; g < dst.size(); ++g) {
    check_same(q->quantize(rows_of(second.view(), row, l.group_rows[g]), 3), dst[g],
               "requantized group " + std::to_string(g));
    row += l.group_rows[g];
  }
}

// ---------------------------------------------------------------- 3. strides, rng offsets

TEST_CASE("grouped quantize of a strided 2-D source and with an explicit rng offset") {
  for (const Spec& spec : {kSpecs[0], kSpecs[4], kSpecs[8]}) {
    const std::string format = format_of(spec);
    if (!have(format.c_str())) continue;
    CAPTURE(spec.label);
    Engine ge(Recipe::parse(yaml_of(spec), "grouped.yaml"));
    Engine re(Recipe::parse(yaml_of(spec), "grouped.yaml"));
    const auto gq = ge.resolve(kRole);
    const auto rq = re.resolve(kRole);
    // A [12, 32] view of a [12, 48] buffer: rows are 48 elements apart.
    const Layout wide{{5, 0, 7}, 48};
    const Tensor buffer = test::host_source(test::grouped_values(wide, 5), 12, 48, DType::f32);
    qr_tensor_view v = buffer.view().c();
    v.shape[1] = 32;
    const TensorView strided(v);
    REQUIRE_FALSE(strided.is_contiguous());
    compare_once(ge, *gq, *rq, strided, wide.group_rows, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE,
                 std::string(spec.label) + " strided");
    // An explicit offset: group g uses offset + g (what matters for stochastic rounding).
    const Tensor src = test::host_source(test::grouped_values(wide, 6), 12, 48, DType::bf16);
    QuantizeOptions options;
    options.rng_offset = 40;
    const auto got = ge.quantize_grouped(*gq, src.view(), wide.group_rows, QR_USAGE_ROWWISE,
                                         options);
    std::int64_t row = 0;
    for (std::size_t g = 0; g < got.size(); ++g) {
      QuantizeOptions per_group;
      per_group.rng_offset = 40 + g;
      check_same(rq->quantize(rows_of(src.view(), row, wide.group_rows[g]), QR_USAGE_ROWWISE,
                              per_group),
                 got[g], "rng offset group " + std::to_string(g));
      row += wide.group_rows[g];
    }
  }
}

TEST_CASE("a contiguous 3-D source is grouped along its flattened rows") {
  if (!have("float8")) return;
  Engine e(Recipe::parse(yaml_of(kSpecs[0]), "grouped.yaml"));
  const auto q = e.resolve(kRole);
  const Layout l{{3, 3}, 8};
  const Tensor src = test::host_source(test::grouped_values(l, 17), 6, 8, DType::f32);
  const TensorView as3d(src.view().data(), DType::f32, {2, 3, 8});
  const auto got = e.quantize_grouped(*q, as3d, l.group_rows, QR_USAGE_ROWWISE);
  REQUIRE(got.size() == 2);
  check_same(q->quantize(rows_of(src.view(), 3, 3), QR_USAGE_ROWWISE), got[1], "3-D group 1");
}

// ---------------------------------------------------------------- 4. bad inputs

TEST_CASE("grouped quantize rejects bad arguments with clear messages") {
  for (const Spec& spec : {kSpecs[0], kSpecs[4], kSpecs[5]}) {  // each format's extra
    const std::string format = format_of(spec);
    if (!have(format.c_str())) continue;
    CAPTURE(spec.label);
    Engine e(Recipe::parse(yaml_of(spec), "grouped.yaml"));
    const auto q = e.resolve(kRole);
    const Layout l{{4, 3}, 8};
    const Tensor src = test::host_source(test::grouped_values(l, 3), 7, 8, DType::f32);
    const std::vector<std::int64_t> wrong_sum = {4, 4}, none = {}, negative = {8, -1};
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, src.view(), wrong_sum, QR_USAGE_ROWWISE),
                         doctest::Contains("group row counts sum to 8 but the source f32[7, 8]"),
                         Error);
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, src.view(), none, QR_USAGE_ROWWISE),
                         doctest::Contains("no groups given"), Error);
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, src.view(), negative, QR_USAGE_ROWWISE),
                         doctest::Contains("group 1 has -1 rows"), Error);
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, src.view(), l.group_rows, 0),
                         doctest::Contains("usage must be rowwise (1), columnwise (2) or both"),
                         Error);
    // Destinations: count, shapes, mixed usage.
    auto dst = e.quantize_grouped(*q, src.view(), l.group_rows, QR_USAGE_ROWWISE);
    std::vector<QuantizedTensor*> one = {&dst[0]};
    CHECK_THROWS_WITH_AS(e.quantize_grouped_into(*q, src.view(), l.group_rows, one),
                         doctest::Contains("1 destination tensors for 2 groups"), Error);
    std::vector<QuantizedTensor*> swapped = {&dst[1], &dst[0]};
    CHECK_THROWS_WITH_AS(e.quantize_grouped_into(*q, src.view(), l.group_rows, swapped),
                         doctest::Contains("destination 0 is 3x8 but group 0"), Error);
    QuantizedTensor both = q->quantize(rows_of(src.view(), 4, 3), 3);
    std::vector<QuantizedTensor*> mixed = {&dst[0], &both};
    CHECK_THROWS_WITH_AS(e.quantize_grouped_into(*q, src.view(), l.group_rows, mixed),
                         doctest::Contains("every group must hold the same directions"), Error);
    // A strided source of rank 3 cannot be split by rows.
    qr_tensor_view v = TensorView(src.view().data(), DType::f32, {7, 2, 4}).c();
    std::swap(v.strides[1], v.strides[2]);
    std::swap(v.shape[1], v.shape[2]);
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, TensorView(v), l.group_rows, QR_USAGE_ROWWISE),
                         doctest::Contains("neither 2-D nor contiguous"), Error);
    // A source dtype no format quantizes.
    Tensor bytes(DType::u8, {7, 8});
    CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, bytes.view(), l.group_rows, QR_USAGE_ROWWISE),
                         doctest::Contains("f32, bf16 or f16"), Error);
  }
}

TEST_CASE("the plugin extra checks its arguments itself (hosts other than the engine)") {
  if (!have("float8")) return;
  Engine e(Recipe::parse(yaml_of(kSpecs[0]), "grouped.yaml"));
  const auto q = e.resolve(kRole);
  const auto slot = q->plugin().quantize_grouped_extra();
  REQUIRE((slot != nullptr));
  const Layout l{{2, 2}, 4};
  const Tensor src = test::host_source(test::grouped_values(l, 4), 4, 4, DType::f32);
  auto dst = e.quantize_grouped(*q, src.view(), l.group_rows, QR_USAGE_ROWWISE);
  qr_quantized_tensor* c_dst[2] = {&dst[0].c(), &dst[1].c()};
  qr_quantize_args args{};
  args.struct_size = sizeof args;
  args.usage = QR_USAGE_ROWWISE;
  const std::int64_t rows[2] = {2, 2};
  const std::int64_t bad_rows[2] = {3, 2};
  const float amax[2] = {1.0f, 1.0f};
  const auto message = [&](qr_status status) -> std::string {
    if (status == nullptr) return "(success)";
    try {
      throw_if_error(status, "slot");
    } catch (const Error& err) {
      return err.message();
    }
    return "(no error)";
  };
  // The well-formed call succeeds through the C ABI and matches the engine's result.
  CHECK(message(slot(q->handle(), &src.view().c(), 2, rows, &args, c_dst)) == "(success)");
  CHECK(contains_text(message(slot(q->handle(), &src.view().c(), 0, rows, &args, c_dst)),
                      "num_groups is 0"));
  CHECK(contains_text(message(slot(q->handle(), &src.view().c(), 2, bad_rows, &args, c_dst)),
                      "sum to 5 but the source has 4 rows"));
  args.amax = amax;
  CHECK(contains_text(message(slot(q->handle(), &src.view().c(), 2, rows, &args, c_dst)),
                      "args.amax must be NULL"));
}

// ---------------------------------------------------------------- 5. the extra by name

TEST_CASE("grouped quantization is an extra found by name through get_proc_address") {
  for (const char* format : {"float8", "mxfp8", "nvfp4", "blockwise", "hybrid"}) {
    if (!have(format)) continue;
    CAPTURE(format);
    const FormatPlugin& plugin = Registry::shared()->get(format);
    REQUIRE((plugin.c().get_proc_address != nullptr));
    void* by_name = plugin.c().get_proc_address(QR_EXTRA_QUANTIZE_GROUPED);
    // What the engine looked up at load is what the plugin hands out now.
    CHECK((reinterpret_cast<void*>(plugin.quantize_grouped_extra()) == by_name));
    CHECK((by_name != nullptr) == (kFormatsWithExtra.count(format) == 1));
    // Unknown names (and a null name) are NULL, never a crash.
    CHECK((plugin.c().get_proc_address("qr_no_such_extra") == nullptr));
    CHECK((plugin.c().get_proc_address(nullptr) == nullptr));
  }
}
