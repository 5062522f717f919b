// qrecipe::gemm_grouped on the CPU (gemm_grouped.hpp): every group's result equals the
// per-group qrecipe::gemm bit for bit, for the three GEMMs of a grouped linear layer under the
// shipped recipes, with per-group operands and with split ones (GroupSplits whose offsets are a
// CPU array, what a router's output is on the CPU), empty and single-row groups included.
// Then the grouped plan on Hopper (keyed by traits, with and without the grouped kernels in
// the build) and the argument checks.
//
// Map
//   1. helpers: an expert layer's tensors, byte comparison
//   2. grouped == per group: per-group operands, split operands (CPU offsets), accumulate
//   3. GroupSplits and GroupedQuantizedTensor
//   4. plan_gemm_grouped on sm90
//   5. bad inputs
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm_grouped.hpp"

using namespace qrecipe;

namespace {

// ---------------------------------------------------------------- 1. helpers

const char* const kRecipes[] = {"none", "default", "float8_delayed", "blockwise", "mxfp8", "nvfp4",
                                "hybrid_fp8_mx"};

Recipe load_recipe(const char* name) {
  const char* root = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_SOURCE_DIR is not set (run through ctest)");
  return Recipe::load(std::string(root) + "/recipes/" + name + ".yaml");
}

Tensor random_bf16(std::int64_t rows, std::int64_t cols, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Tensor t(DType::bf16, {rows, cols});
  auto* p = t.data_as<std::uint16_t>();
  for (std::int64_t i = 0; i < rows * cols; ++i) p[i] = num::f32_to_bf16(d(rng));
  return t;
}

TensorView rows_of(const TensorView& t, std::int64_t row, std::int64_t rows) {
  qr_tensor_view v = t.c();
  v.shape[0] = rows;
  if (rows > 0) v.data = static_cast<char*>(v.data) + row * t.cols() * dtype_bits(t.dtype()) / 8;
  return TensorView(v);
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> o{0};
  for (auto r : rows) o.push_back(o.back() + r);
  return o;
}

// An expert layer: x [T, K], W [G * N, K] (expert g at rows [g N, (g + 1) N)), dy [T, N].
struct Layer {
  std::vector<std::int64_t> splits;
  std::int64_t in = 0, out = 0, tokens = 0;
  Tensor x, w, dy;
  Layer(std::vector<std::int64_t> s, std::int64_t k, std::int64_t n) : splits(std::move(s)), in(k), out(n) {
    for (auto r : splits) tokens += r;
    x = random_bf16(tokens, in, 1);
    w = random_bf16(static_cast<std::int64_t>(splits.size()) * out, in, 2, 0.1f);
    dy = random_bf16(tokens, out, 3, 0.01f);
  }
  std::int64_t groups() const { return static_cast<std::int64_t>(splits.size()); }
};

// The per-group GEMM operand of rows [row, row + rows) of `t` quantized by `q` (nullptr: dense).
struct Operands {
  std::vector<QuantizedTensor> q;  // quantized groups (empty when dense)
  std::vector<TensorView> dense;   // dense groups
  std::vector<GemmOperand> as(const Quantizer* quantizer, qr_direction d) const {
    std::vector<GemmOperand> out;
    if (quantizer)
      for (const auto& t : q) out.push_back(GemmOperand::quantized(t, *quantizer, d));
    else
      for (const auto& t : dense) out.push_back(GemmOperand::dense(t, d));
    return out;
  }
};

Operands operands(Engine& e, const Quantizer* q, const Tensor& t, const std::vector<std::int64_t>& rows) {
  Operands o;
  if (q) {
    o.q = e.quantize_grouped(*q, t.view(), rows, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
  } else {
    std::int64_t row = 0;
    for (auto r : rows) {
      o.dense.push_back(rows_of(t.view(), row, r));
      row += r;
    }
  }
  return o;
}

// ---------------------------------------------------------------- 2. grouped == per group

// Runs the three GEMMs of `layer` under `recipe` grouped (per-group operands, then split ones
// through CPU offsets) and per group, requiring equal bytes.
void check_layer(const char* recipe, const Layer& layer, DType out_dtype) {
  const std::string recipe_name = recipe, out_name(dtype_name(out_dtype));
  CAPTURE(recipe_name);
  CAPTURE(out_name);
  Engine e(load_recipe(recipe));
  const std::string name = "experts";
  const auto qx = e.resolve({"grouped_linear", "input", name});
  const auto qw = e.resolve({"grouped_linear", "weight", name});
  const auto qg = e.resolve({"grouped_linear", "grad_output", name});
  const std::int64_t G = layer.groups(), T = layer.tokens, K = layer.in, N = layer.out;
  const std::vector<std::int64_t> w_rows(static_cast<std::size_t>(G), N);
  // x and dy quantized once, by CPU offsets (the device-split API on the CPU): their groups
  // are the per-group operands too, so both paths read the same bytes (a stochastic-rounding
  // role would give a second quantization other bytes).
  const auto offsets = offsets_of(layer.splits);
  const GroupSplits splits = GroupSplits::of_offsets(offsets.data(), G, T, Device::cpu());
  const auto usage = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
  std::optional<GroupedQuantizedTensor> x_split, dy_split;
  if (qx) x_split.emplace(e.quantize_grouped(*qx, layer.x.view(), splits, usage));
  if (qg) dy_split.emplace(e.quantize_grouped(*qg, layer.dy.view(), splits, usage));
  const auto per_group = [&](const std::optional<GroupedQuantizedTensor>& t, const Quantizer* q,
                             const Tensor& dense, qr_direction d) {
    std::vector<GemmOperand> out;
    if (t) {
      for (const auto& g : t->groups()) out.push_back(GemmOperand::quantized(g, *q, d));
      return out;
    }
    std::int64_t row = 0;
    for (auto r : layer.splits) {
      out.push_back(GemmOperand::dense(rows_of(dense.view(), row, r), d));
      row += r;
    }
    return out;
  };
  const Operands ws = operands(e, qw.get(), layer.w, w_rows);
  const auto R = QR_DIRECTION_ROWWISE, C = QR_DIRECTION_COLUMNWISE;
  const auto x_r = per_group(x_split, qx.get(), layer.x, R), x_c = per_group(x_split, qx.get(), layer.x, C);
  const auto w_r = ws.as(qw.get(), R), w_c = ws.as(qw.get(), C);
  const auto dy_r = per_group(dy_split, qg.get(), layer.dy, R), dy_c = per_group(dy_split, qg.get(), layer.dy, C);

  const auto split_of = [&](const std::optional<GroupedQuantizedTensor>& t, const Quantizer* q,
                            const Tensor& dense, qr_direction d) {
    return t ? GroupedOperand::split(*t, *q, d) : GroupedOperand::split_dense(dense.view(), d);
  };

  for (const GemmKind kind : {GemmKind::fprop, GemmKind::dgrad, GemmKind::wgrad}) {
    const std::string kind_name = gemm_kind_name(kind);
    CAPTURE(kind_name);
    const auto& a = kind == GemmKind::fprop ? x_r : kind == GemmKind::dgrad ? dy_r : dy_c;
    const auto& b = kind == GemmKind::fprop ? w_r : kind == GemmKind::dgrad ? w_c : x_c;
    for (const bool accumulate : {false, true}) {
      CAPTURE(accumulate);
      // Outputs: per-group tensors, a split [T, cols] one (fprop, dgrad), the per-group truth.
      const std::int64_t cols = kind == GemmKind::fprop ? N : K;
      const auto shape_of = [&](std::int64_t g) {
        return kind == GemmKind::wgrad ? std::vector<std::int64_t>{N, K}
                                       : std::vector<std::int64_t>{layer.splits[g], cols};
      };
      std::vector<Tensor> want, got;
      std::vector<TensorView> got_views;
      for (std::int64_t g = 0; g < G; ++g) {
        want.emplace_back(out_dtype, shape_of(g));
        got.emplace_back(out_dtype, shape_of(g));
        // A non-zero start (accumulate reads it): the same on both sides.
        std::memset(want.back().view().data(), 0x3C, static_cast<std::size_t>(want.back().view().nbytes()));
        std::memset(got.back().view().data(), 0x3C, static_cast<std::size_t>(got.back().view().nbytes()));
        got_views.push_back(got.back().view());
      }
      GemmOptions single;
      single.kind = kind;
      single.accumulate = accumulate;
      for (std::int64_t g = 0; g < G; ++g) gemm(a[g], b[g], want[g].view(), single);

      GroupedGemmOptions o;
      o.kind = kind;
      o.accumulate = accumulate;
      const GroupedGemmPlan plan =
          gemm_grouped(GroupedOperand::per_group(a), GroupedOperand::per_group(b),
                       GroupedOutput{got_views, TensorView()}, o);
      CHECK(plan.mode == GroupedGemmPlan::Mode::grouped);
      for (std::int64_t g = 0; g < G; ++g) CHECK_MESSAGE(same_bytes(want[g].view(), got[g].view()), "group ", g);

      // Split operands and (fprop, dgrad) a split output.
      o.splits = &splits;
      GroupedOperand sa = kind == GemmKind::fprop  ? split_of(x_split, qx.get(), layer.x, R)
                          : kind == GemmKind::dgrad ? split_of(dy_split, qg.get(), layer.dy, R)
                                                    : split_of(dy_split, qg.get(), layer.dy, C);
      GroupedOperand sb = kind == GemmKind::wgrad ? split_of(x_split, qx.get(), layer.x, C)
                                                  : GroupedOperand::per_group(b);
      if (kind == GemmKind::wgrad) {
        std::vector<Tensor> out2;
        std::vector<TensorView> views2;
        for (std::int64_t g = 0; g < G; ++g) {
          out2.emplace_back(out_dtype, shape_of(g));
          std::memset(out2.back().view().data(), 0x3C, static_cast<std::size_t>(out2.back().view().nbytes()));
          views2.push_back(out2.back().view());
        }
        gemm_grouped(sa, sb, GroupedOutput{views2, TensorView()}, o);
        for (std::int64_t g = 0; g < G; ++g) CHECK_MESSAGE(same_bytes(want[g].view(), out2[g].view()), "group ", g);
      } else {
        Tensor split_out(out_dtype, {T, cols});
        std::memset(split_out.view().data(), 0x3C, static_cast<std::size_t>(split_out.view().nbytes()));
        gemm_grouped(sa, sb, GroupedOutput{{}, split_out.view()}, o);
        std::int64_t row = 0;
        for (std::int64_t g = 0; g < G; ++g) {
          CHECK_MESSAGE(same_bytes(want[g].view(), rows_of(split_out.view(), row, layer.splits[g])), "group ", g);
          row += layer.splits[g];
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("grouped GEMM == per-group GEMM bit for bit on the CPU, every shipped recipe") {
  // Uneven routing: an empty expert, a single-token one, odd sizes.
  const Layer layer({5, 0, 1, 17, 9}, 48, 40);
  // NVFP4's Hadamard (wgrad operands) needs groups of whole 16-row runs.
  const Layer runs_of_16({16, 0, 32, 16}, 64, 32);
  for (const char* recipe : kRecipes) {
    const Layer& l = std::string(recipe) == "nvfp4" ? runs_of_16 : layer;
    check_layer(recipe, l, DType::bf16);
    check_layer(recipe, l, DType::f32);
  }
}

TEST_CASE("grouped GEMM with every expert empty, and with one expert") {
  check_layer("default", Layer({0, 0, 0}, 32, 16), DType::bf16);
  check_layer("blockwise", Layer({33}, 256, 128), DType::bf16);
}

TEST_CASE("grouped GEMM adds each group's bias, and scales by alpha") {
  Engine e(load_recipe("default"));
  const Layer layer({3, 4}, 32, 16);
  const auto qx = e.resolve({"grouped_linear", "input", "e"});
  const auto qw = e.resolve({"grouped_linear", "weight", "e"});
  const Operands xs = operands(e, qx.get(), layer.x, layer.splits);
  const Operands ws = operands(e, qw.get(), layer.w, {16, 16});
  const auto a = xs.as(qx.get(), QR_DIRECTION_ROWWISE), b = ws.as(qw.get(), QR_DIRECTION_ROWWISE);
  std::vector<float> bias0(16, 0.5f), bias1(16, -2.0f);
  const void* biases[2] = {bias0.data(), bias1.data()};
  Tensor want0(DType::f32, {3, 16}), want1(DType::f32, {4, 16}), got0(DType::f32, {3, 16}), got1(DType::f32, {4, 16});
  GemmOptions s;
  s.kind = GemmKind::fprop;
  s.alpha = 0.25f;
  s.bias = bias0.data();
  gemm(a[0], b[0], want0.view(), s);
  s.bias = bias1.data();
  gemm(a[1], b[1], want1.view(), s);
  GroupedGemmOptions o;
  o.kind = GemmKind::fprop;
  o.alpha = 0.25f;
  o.bias = biases;
  const TensorView outs[2] = {got0.view(), got1.view()};
  gemm_grouped(GroupedOperand::per_group(a), GroupedOperand::per_group(b), GroupedOutput{outs, TensorView()}, o);
  CHECK(same_bytes(want0.view(), got0.view()));
  CHECK(same_bytes(want1.view(), got1.view()));
}

// ---------------------------------------------------------------- 3. splits, grouped tensors

TEST_CASE("GroupSplits: sizes and CPU offsets, read back and checked") {
  const std::vector<std::int64_t> rows{3, 0, 5};
  const GroupSplits s = GroupSplits::of_rows(rows);
  CHECK(s.groups == 3);
  CHECK(s.total == 8);
  CHECK(s.host_readable());
  CHECK(s.host_rows() == rows);
  const auto offsets = offsets_of(rows);
  const GroupSplits o = GroupSplits::of_offsets(offsets.data(), 3, 8, Device::cpu());
  CHECK(o.host_rows() == rows);
  CHECK(o.str().find("3 groups of 8 rows") != std::string::npos);
  // Bad offsets are refused where they are made.
  const std::int64_t decreasing[] = {0, 4, 2, 8};
  CHECK_THROWS_WITH_AS(GroupSplits::of_offsets(decreasing, 3, 8, Device::cpu()),
                       doctest::Contains("offsets decrease at group 1"), Error);
  const std::int64_t short_end[] = {0, 2, 4, 6};
  CHECK_THROWS_WITH_AS(GroupSplits::of_offsets(short_end, 3, 8, Device::cpu()),
                       doctest::Contains("end at 6"), Error);
  const std::int64_t bad_start[] = {1, 2, 4, 8};
  CHECK_THROWS_WITH_AS(GroupSplits::of_offsets(bad_start, 3, 8, Device::cpu()),
                       doctest::Contains("offsets[0] is 1"), Error);
  const std::vector<std::int64_t> negative{2, -1};
  CHECK_THROWS_WITH_AS(GroupSplits::of_rows(negative), doctest::Contains("group 1 has -1 rows"), Error);
  CHECK_THROWS_AS(GroupSplits::of_rows({}), Error);
  // Offsets said to live on a GPU are never read on the host.
  const GroupSplits dev = GroupSplits::of_offsets(offsets.data(), 3, 8, Device::cuda(0));
  CHECK_FALSE(dev.host_readable());
  CHECK_THROWS_WITH_AS(dev.host_rows(), doctest::Contains("cannot read them"), Error);
}

TEST_CASE("quantize_grouped by CPU offsets gives the groups' own tensors") {
  Engine e(load_recipe("default"));
  const auto q = e.resolve({"grouped_linear", "input", "e"});
  const std::vector<std::int64_t> rows{4, 0, 7};
  const Tensor x = random_bf16(11, 32, 9);
  const auto offsets = offsets_of(rows);
  const GroupSplits splits = GroupSplits::of_offsets(offsets.data(), 3, 11, Device::cpu());
  GroupedQuantizedTensor t = e.quantize_grouped(*q, x.view(), splits, QR_USAGE_ROWWISE);
  CHECK_FALSE(t.device_split());
  CHECK(t.num_groups() == 3);
  CHECK(t.rows() == 11);
  CHECK(t.cols() == 32);
  REQUIRE(t.groups().size() == 3);
  std::int64_t row = 0;
  for (std::size_t g = 0; g < rows.size(); ++g) {
    const QuantizedTensor alone = q->quantize(rows_of(x.view(), row, rows[g]), QR_USAGE_ROWWISE);
    CHECK(t.groups()[g].rows() == rows[g]);
    CHECK(same_bytes(alone.data(QR_DIRECTION_ROWWISE), t.groups()[g].data(QR_DIRECTION_ROWWISE)));
    CHECK(same_bytes(alone.scale_inv(QR_DIRECTION_ROWWISE), t.groups()[g].scale_inv(QR_DIRECTION_ROWWISE)));
    row += rows[g];
  }
  CHECK_THROWS_WITH_AS(t.c(), doctest::Contains("read them through groups()"), Error);
  CHECK_THROWS_WITH_AS(t.layout(QR_DIRECTION_COLUMNWISE), doctest::Contains("no columnwise data"), Error);
  t.drop(QR_DIRECTION_ROWWISE);
  CHECK(t.usage() == 0);
  // The splits must cover the source.
  const GroupSplits wrong = GroupSplits::of_rows(std::vector<std::int64_t>{4, 4});
  CHECK_THROWS_WITH_AS(e.quantize_grouped(*q, x.view(), wrong, QR_USAGE_ROWWISE),
                       doctest::Contains("cover 8 rows but the source"), Error);
}

// ---------------------------------------------------------------- 4. the grouped plan

namespace {
OperandTraits traits_of(Engine& e, const char* tensor_type, std::int64_t rows, std::int64_t cols, qr_direction d) {
  const auto q = e.resolve({"grouped_linear", tensor_type, "e"});
  if (!q) return OperandTraits::high_precision(DType::bf16);
  return OperandTraits::of(q->layout(rows, cols, d), d);
}
using Mode = GroupedGemmPlan::Mode;
using Path = GemmPlan::Path;
}  // namespace

TEST_CASE("grouped plan on Hopper: one launch per GEMM kind where a grouped kernel serves it") {
  const auto sm90 = GemmTarget::sm90;
  const auto R = QR_DIRECTION_ROWWISE, C = QR_DIRECTION_COLUMNWISE;
  const bool built = grouped_kernels_built();
  CAPTURE(built);
  struct Case {
    const char* recipe;
    GemmKind kind;
    DType out;
    Path path;  // with the grouped kernels built
    bool fast;
  };
  const Case cases[] = {
      {"default", GemmKind::fprop, DType::bf16, Path::native, true},
      {"default", GemmKind::dgrad, DType::bf16, Path::native, false},
      {"default", GemmKind::wgrad, DType::bf16, Path::native, false},
      {"default", GemmKind::wgrad, DType::f32, Path::native, false},
      {"default", GemmKind::fprop, DType::f32, Path::emulated, false},  // no FP32 fast kernel
      {"float8_e4m3", GemmKind::dgrad, DType::bf16, Path::native, false},
      {"blockwise", GemmKind::fprop, DType::bf16, Path::native, false},
      {"blockwise", GemmKind::dgrad, DType::bf16, Path::native, false},
      {"blockwise", GemmKind::wgrad, DType::f32, Path::native, false},
      {"mxfp8", GemmKind::fprop, DType::bf16, Path::emulated, false},
      {"mxfp8", GemmKind::wgrad, DType::f32, Path::emulated, false},
      {"nvfp4", GemmKind::dgrad, DType::bf16, Path::emulated, false},
      {"none", GemmKind::wgrad, DType::bf16, Path::dense, false},
  };
  for (const Case& c : cases) {
    const std::string recipe_name = c.recipe, kind_name = gemm_kind_name(c.kind);
    CAPTURE(recipe_name);
    CAPTURE(kind_name);
    Engine e(load_recipe(c.recipe));
    const std::int64_t T = 512, K = 256, N = 128;
    OperandTraits a, b;
    if (c.kind == GemmKind::fprop) {
      a = traits_of(e, "input", T, K, R);
      b = traits_of(e, "weight", N, K, R);
    } else if (c.kind == GemmKind::dgrad) {
      a = traits_of(e, "grad_output", T, N, R);
      b = traits_of(e, "weight", N, K, C);
    } else {
      a = traits_of(e, "grad_output", T, N, C);
      b = traits_of(e, "input", T, K, C);
    }
    const std::int64_t n = c.kind == GemmKind::fprop ? N : K, k_or_m = c.kind == GemmKind::wgrad ? N : c.kind == GemmKind::fprop ? K : N;
    for (const bool device_split : {false, true}) {
      const GroupedGemmPlan p = plan_gemm_grouped(c.kind, a, b, c.out, false, false, n, k_or_m, sm90, device_split);
      CAPTURE(p.str());
      if (built) {
        CHECK(p.mode == Mode::grouped);
        CHECK(p.gemm.path == c.path);
        CHECK(p.gemm.fast_accumulation == c.fast);
        CHECK(p.gemm.reason.find("CUTLASS grouped") != std::string::npos);
      } else {
        CHECK(p.mode == (device_split ? Mode::refused : Mode::per_group));
        CHECK(p.reason.find("no grouped kernels") != std::string::npos);
      }
      // What the grouped kernels never do: a bias, an FP32 dense operand, extents off 16.
      const GroupedGemmPlan biased = plan_gemm_grouped(c.kind, a, b, c.out, false, true, n, k_or_m, sm90, device_split);
      CHECK(biased.mode == (device_split ? Mode::refused : Mode::per_group));
      const GroupedGemmPlan odd = plan_gemm_grouped(c.kind, a, b, c.out, false, false, n + 8, k_or_m, sm90, device_split);
      CHECK(odd.mode == (device_split ? Mode::refused : Mode::per_group));
      if (device_split) CHECK(biased.reason.find("pass the splits as host sizes") != std::string::npos);
    }
  }
  const auto f32 = OperandTraits::high_precision(DType::f32);
  const GroupedGemmPlan dense32 = plan_gemm_grouped(GemmKind::fprop, f32, f32, DType::f32, false, false, 64, 64, sm90, false);
  CHECK(dense32.mode == Mode::per_group);
  // On the CPU every group is the reference GEMM.
  const GroupedGemmPlan cpu = plan_gemm_grouped(GemmKind::fprop, f32, f32, DType::f32, false, true, 63, 5, GemmTarget::cpu, true);
  CHECK(cpu.mode == Mode::grouped);
}

// ---------------------------------------------------------------- 5. bad inputs

TEST_CASE("grouped GEMM refuses mismatched groups, splits and shapes with clear errors") {
  Engine e(load_recipe("none"));
  const Tensor a0 = random_bf16(4, 8, 1), a1 = random_bf16(3, 8, 2), b0 = random_bf16(5, 8, 3);
  const Tensor bad_b = random_bf16(5, 9, 4);
  Tensor out0(DType::f32, {4, 5}), out1(DType::f32, {3, 5});
  const GemmOperand as[2] = {GemmOperand::dense(a0.view(), QR_DIRECTION_ROWWISE),
                             GemmOperand::dense(a1.view(), QR_DIRECTION_ROWWISE)};
  const GemmOperand bs[2] = {GemmOperand::dense(b0.view(), QR_DIRECTION_ROWWISE),
                             GemmOperand::dense(bad_b.view(), QR_DIRECTION_ROWWISE)};
  const TensorView outs[2] = {out0.view(), out1.view()};
  GroupedGemmOptions o;
  // Counts.
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::per_group(as), GroupedOperand::per_group({bs, 1}),
                                    GroupedOutput{outs, TensorView()}, o),
                       doctest::Contains("operand A has 2 groups but operand B has 1"), Error);
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::per_group(as), GroupedOperand::per_group(bs),
                                    GroupedOutput{{outs, 1}, TensorView()}, o),
                       doctest::Contains("1 outputs for 2 groups"), Error);
  // A shape mismatch names the group.
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::per_group(as), GroupedOperand::per_group(bs),
                                    GroupedOutput{outs, TensorView()}, o),
                       doctest::Contains("group 1 of 2"), Error);
  // Biases: one per group or none.
  const void* one_bias[1] = {nullptr};
  o.bias = one_bias;
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::per_group(as), GroupedOperand::per_group(bs),
                                    GroupedOutput{outs, TensorView()}, o),
                       doctest::Contains("1 biases for 2 groups"), Error);
  o.bias = {};
  // Split operands need splits that cover them.
  const Tensor x = random_bf16(7, 8, 5);
  const GroupedOperand split = GroupedOperand::split_dense(x.view(), QR_DIRECTION_ROWWISE);
  const GemmOperand b2[2] = {bs[0], bs[0]};
  Tensor y(DType::f32, {7, 5});
  CHECK_THROWS_WITH_AS(gemm_grouped(split, GroupedOperand::per_group(b2), GroupedOutput{{}, y.view()}, o),
                       doctest::Contains("no GroupSplits were given"), Error);
  const std::vector<std::int64_t> six{3, 3};
  const GroupSplits wrong = GroupSplits::of_rows(six);
  o.splits = &wrong;
  CHECK_THROWS_WITH_AS(gemm_grouped(split, GroupedOperand::per_group(b2), GroupedOutput{{}, y.view()}, o),
                       doctest::Contains("has 7 rows but the splits"), Error);
  const std::vector<std::int64_t> seven{4, 3};
  const GroupSplits right = GroupSplits::of_rows(seven);
  o.splits = &right;
  Tensor y_bad(DType::f32, {6, 5});
  CHECK_THROWS_WITH_AS(gemm_grouped(split, GroupedOperand::per_group(b2), GroupedOutput{{}, y_bad.view()}, o),
                       doctest::Contains("must be 2-D with 7 rows"), Error);
  // The right call works.
  gemm_grouped(split, GroupedOperand::per_group(b2), GroupedOutput{{}, y.view()}, o);
  // A split on other offsets than the call's is refused.
  const auto q = std::make_shared<Engine>(load_recipe("default"));
  const auto qx = q->resolve({"grouped_linear", "input", "e"});
  const GroupedQuantizedTensor xq = q->quantize_grouped(*qx, x.view(), GroupSplits::of_rows(seven), QR_USAGE_ROWWISE);
  const std::vector<std::int64_t> other{2, 5};
  const GroupSplits other_splits = GroupSplits::of_rows(other);
  o.splits = &other_splits;
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::split(xq, *qx, QR_DIRECTION_ROWWISE),
                                    GroupedOperand::per_group(b2), GroupedOutput{{}, y.view()}, o),
                       doctest::Contains("group 0 has 4 rows but the splits give it 2"), Error);
  // GPU tensors never run on the CPU: a CUDA output with CPU operands is refused.
  Tensor cpu_out(DType::f32, {4, 5});
  qr_tensor_view v = cpu_out.view().c();
  v.device = {QR_DEVICE_CUDA, 0};
  const TensorView fake_cuda_outs[2] = {TensorView(v), out1.view()};
  o.splits = nullptr;
  CHECK_THROWS_WITH_AS(gemm_grouped(GroupedOperand::per_group(as), GroupedOperand::per_group(b2),
                                    GroupedOutput{fake_cuda_outs, TensorView()}, o),
                       doctest::Contains("must live on one device"), Error);
}
