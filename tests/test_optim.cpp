// The optimizer step (qrecipe::adam_step, qrecipe/optim.hpp) on the CPU: every format's Adam
// extra (plugin_abi.h QR_EXTRA_ADAM_REQUANTIZE, the SDK's CPU path) equals the engine's
// two-pass path and an element loop of adam::update bit for bit, its quantized bytes equal
// quantizing the new master; plain tensors in their own dtype and with copies; which plugins
// have the extra; and every argument error names the tensor.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "grouped_inputs.hpp"  // states_of
#include "optim_inputs.hpp"
#include "qrecipe/adam.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/optim.hpp"
#include "qrecipe/plugin_sdk_tensor.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

std::vector<std::uint8_t> bytes(const qr_tensor_view& v) {
  return test::bytes_of(v, [](void*, const void*, std::size_t) {
    FAIL("a CPU test found device memory");
  });
}

// Every buffer of a quantized tensor, in a fixed order.
std::vector<std::vector<std::uint8_t>> all_bytes(const QuantizedTensor& q) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!q.has(d)) continue;
    const auto& dd = q.direction(d);
    out.push_back(bytes(dd.data));
    out.push_back(bytes(dd.scale_inv));
    out.push_back(bytes(dd.amax));
  }
  return out;
}

// One parameter's state for adam_step.
struct Param {
  Tensor master, grad, exp_avg, exp_avg_sq;
  QuantizedTensor quantized;
  std::shared_ptr<Quantizer> quantizer;

  AdamTensor step_tensor(std::int64_t step) {
    AdamTensor t;
    t.name = "'w'";
    t.hyper = test::optim_hyper(step);
    t.param = master.view();
    t.grad = grad.view();
    t.exp_avg = exp_avg.view();
    t.exp_avg_sq = exp_avg_sq.view();
    t.quantized = &quantized;
    t.quantizer = quantizer.get();
    return t;
  }
};

Param make_param(Engine& engine, test::Shape s, DType grad_dtype, DType moment_dtype) {
  Param p;
  const std::vector<std::int64_t> shape = {s.rows, s.cols};
  const std::int64_t n = s.rows * s.cols;
  p.master = test::host_tensor(test::normal_values(n, 1.0f, 1), shape, DType::f32);
  p.grad = test::host_tensor(std::vector<float>(static_cast<std::size_t>(n)), shape, grad_dtype);
  p.exp_avg = test::host_tensor(test::normal_values(n, 0.01f, 2), shape, moment_dtype);
  auto v = test::normal_values(n, 1e-2f, 3);
  for (auto& x : v) x = x * x;
  p.exp_avg_sq = test::host_tensor(v, shape, moment_dtype);
  p.quantizer = engine.resolve(test::kOptimRole);
  p.quantized = p.quantizer->quantize(p.master.view(), QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
  return p;
}

void set_grad(Param& p, std::int64_t step) {
  const std::int64_t n = p.grad.numel();
  const auto g = test::normal_values(n, 0.01f, 100 + static_cast<std::uint64_t>(step));
  p.grad = test::host_tensor(g, p.grad.shape(), p.grad.view().dtype());
}

std::string diff(const Tensor& a, const Tensor& b) {
  return test::compare_values(bytes(a.view().c()), bytes(b.view().c()), a.view().dtype());
}

}  // namespace

TEST_CASE("Adam extras: the formats that have them") {
  const auto registry = Registry::shared();
  for (const char* format : {"float8", "mxfp8", "blockwise", "nvfp4"}) {
    const auto plugin = registry->find(format);
    REQUIRE(plugin != nullptr);
    CHECK((plugin->adam_requantize_extra() != nullptr));
    CHECK((plugin->adam_requantize_supports_extra() != nullptr));
  }
  const auto hybrid = registry->find("hybrid");
  REQUIRE(hybrid != nullptr);
  CHECK((hybrid->adam_requantize_extra() == nullptr));  // served by the two-pass path
}

TEST_CASE("adam_step on the CPU: fused == two-pass == the element loop, bytes == quantize") {
  int cases = 0;
  for (const test::OptimSpec& spec : test::kOptimSpecs) {
    for (const test::Shape shape : test::kOptimShapes) {
      for (const DType grad_dtype : {DType::f32, DType::bf16, DType::f16}) {
        const DType moments = grad_dtype == DType::bf16 ? DType::bf16 : DType::f32;
        const std::string what = std::string(spec.label) + " " + std::to_string(shape.rows) +
                                 "x" + std::to_string(shape.cols) + " grad " +
                                 std::string(dtype_name(grad_dtype));
        CAPTURE(what);
        Engine fused_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
        Engine two_pass_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
        Param a = make_param(fused_engine, shape, grad_dtype, moments);
        Param b = make_param(two_pass_engine, shape, grad_dtype, moments);
        // The element loop of adam::update on host copies of the same values.
        const std::int64_t n = shape.rows * shape.cols;
        std::vector<float> rp(static_cast<std::size_t>(n)), rm(rp), rv(rp);
        for (std::int64_t i = 0; i < n; ++i) {
          rp[i] = a.master.data_as<float>()[i];
          rm[i] = sdk::load_f32(a.exp_avg.view().data(), a.exp_avg.view().c().dtype, i);
          rv[i] = sdk::load_f32(a.exp_avg_sq.view().data(), a.exp_avg_sq.view().c().dtype, i);
        }
        for (std::int64_t step = 1; step <= 3; ++step) {
          set_grad(a, step);
          set_grad(b, step);
          AdamTensor ta = a.step_tensor(step), tb = b.step_tensor(step);
          const auto pa = adam_step(std::span<AdamTensor>(&ta, 1));
          AdamStepOptions two_pass;
          two_pass.fused = false;
          const auto pb = adam_step(std::span<AdamTensor>(&tb, 1), two_pass);
          const bool has_extra = std::string(spec.label).rfind("hybrid", 0) != 0;
          CHECK(pa[0] == (has_extra ? AdamPath::fused : AdamPath::two_pass));
          CHECK(pb[0] == AdamPath::two_pass);
          CHECK(diff(a.master, b.master) == "");
          CHECK(diff(a.exp_avg, b.exp_avg) == "");
          CHECK(diff(a.exp_avg_sq, b.exp_avg_sq) == "");
          CHECK(all_bytes(a.quantized) == all_bytes(b.quantized));
          // The new master quantized by a fresh engine's quantizer (a delayed state's scale is
          // 1 in every engine until an update: the same scale; stochastic rounding takes its
          // engine's next call offset, which differs).
          Engine fresh(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
          if (std::string(spec.label) != "nvfp4/sr")
            CHECK(all_bytes(a.quantized) ==
                  all_bytes(fresh.resolve(test::kOptimRole)->quantize(
                      a.master.view(), QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)));
          const adam::Scalars sc = adam::scalars(1e-2, 0.9, 0.999, 1e-8, 0.05, true, step);
          for (std::int64_t i = 0; i < n; ++i) {
            const float g = sdk::load_f32(a.grad.view().data(), a.grad.view().c().dtype, i);
            adam::update(rp[i], rm[i], rv[i], g, sc);
            if (moments == DType::bf16) {
              rm[i] = num::round_to_bf16(rm[i]);
              rv[i] = num::round_to_bf16(rv[i]);
            }
          }
          CHECK(diff(a.master, test::host_tensor(rp, {shape.rows, shape.cols}, DType::f32)) == "");
          CHECK(diff(a.exp_avg, test::host_tensor(rm, {shape.rows, shape.cols}, moments)) == "");
          CHECK(diff(a.exp_avg_sq, test::host_tensor(rv, {shape.rows, shape.cols}, moments)) == "");
        }
        ++cases;
        CHECK(test::states_of(fused_engine) == test::states_of(two_pass_engine));
      }
    }
  }
  MESSAGE(cases << " cases");
}

TEST_CASE("adam_step: plain tensors in their own dtype and with copies") {
  const std::int64_t n = 37;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    Tensor param = test::host_tensor(test::normal_values(n, 1.0f, 9), {n}, dtype);
    std::vector<float> start(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      start[i] = sdk::load_f32(param.view().data(), param.view().c().dtype, i);
    Tensor master = test::host_tensor(start, {n}, DType::f32);  // exact: the widened values
    Tensor copy(dtype, {n});
    Tensor grad = test::host_tensor(test::normal_values(n, 0.1f, 10), {n}, DType::f32);
    Tensor m1(DType::f32, {n}), v1(DType::f32, {n}), m2(DType::f32, {n}), v2(DType::f32, {n});
    AdamTensor in_place, with_master;
    in_place.name = with_master.name = "'w'";
    in_place.hyper = with_master.hyper = test::optim_hyper(1);
    in_place.param = param.view();  // updated in its own dtype
    with_master.param = master.view();
    with_master.copy = copy.view();  // the master rounded to the parameter's dtype
    in_place.grad = with_master.grad = grad.view();
    in_place.exp_avg = m1.view();
    in_place.exp_avg_sq = v1.view();
    with_master.exp_avg = m2.view();
    with_master.exp_avg_sq = v2.view();
    AdamTensor both[2] = {in_place, with_master};
    CHECK(adam_step(both) == std::vector<AdamPath>{AdamPath::plain, AdamPath::plain});
    const adam::Scalars s = adam::scalars(1e-2, 0.9, 0.999, 1e-8, 0.05, true, 1);
    std::vector<float> want = start;
    for (std::int64_t i = 0; i < n; ++i) {
      float m = 0.0f, v = 0.0f;
      adam::update(want[i], m, v, grad.data_as<float>()[i], s);
    }
    CHECK(diff(master, test::host_tensor(want, {n}, DType::f32)) == "");
    CHECK(diff(param, test::host_tensor(want, {n}, dtype)) == "");
    CHECK(diff(copy, test::host_tensor(want, {n}, dtype)) == "");
  }
}

TEST_CASE("adam_step errors name the tensor and say what is wrong") {
  Engine engine(Recipe::parse(test::optim_yaml("{format: float8}"), "optim.yaml"));
  Param p = make_param(engine, {8, 16}, DType::f32, DType::f32);
  auto expect = [&](AdamTensor t, const std::string& needle, AdamStepOptions o = {}) {
    CAPTURE(needle);
    try {
      adam_step(std::span<AdamTensor>(&t, 1), o);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      CHECK(std::string(e.what()).find("'w'") != std::string::npos);
    }
  };
  Tensor small(DType::f32, {4, 16});
  AdamTensor t = p.step_tensor(1);
  t.grad = small.view();
  expect(t, "gradient is f32[4, 16] on cpu but the parameter has 128 elements");
  Tensor e4m3(DType::e4m3, {8, 16});
  t = p.step_tensor(1);
  t.exp_avg = e4m3.view();
  expect(t, "exp_avg has dtype e4m3; expected f32 or bf16");
  t = p.step_tensor(0);
  expect(t, "step count 0; the count after this step's increment is at least 1");
  Tensor bf16(DType::bf16, {8, 16});
  t = p.step_tensor(1);
  t.param = bf16.view();
  expect(t, "a quantized parameter is updated through its FP32 master, got a bf16 master");

  Engine hybrid(Recipe::parse(test::optim_yaml(test::kOptimSpecs[10].yaml), "optim.yaml"));
  Param h = make_param(hybrid, {8, 16}, DType::f32, DType::f32);
  AdamStepOptions capturable;
  capturable.capturable = true;
  expect(h.step_tensor(1), "a capturable step cannot requantize this parameter: plugin 'hybrid'",
         capturable);
  std::span<AdamTensor> none;
  CHECK_THROWS_WITH_AS(adam_step(none), doctest::Contains("no tensors given"), Error);
}
