// The CPU engine used from several threads at once (issue 19). CI runs this suite in a
// ThreadSanitizer build (tools/tsan.sh); in the ordinary builds it checks the results.
//
// What may run concurrently (engine.hpp, registry.hpp, quantizer.hpp):
//   - building registries (each loads the plugins: dlopen of the same files) and the first
//     Registry::shared() call;
//   - Engine::resolve of any roles (one quantizer per role, one scaling state per stateful
//     quantizer, however many threads ask);
//   - quantize / dequantize / compute_amax with one shared quantizer, delayed scaling
//     included (its step amax max-accumulates atomically, so the order does not matter) and
//     stochastic rounding (each call takes its own offset);
//   - gemm on shared operands into separate outputs.
// What may not: Engine::update_scaling with quantize calls that use the states. The test runs
// the update between phases (a barrier) on a shared engine, and freely on per-thread engines.
// Every result is compared with the single-threaded one, byte for byte.
#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"

using namespace qrecipe;

namespace {

constexpr int kThreads = 4;

const char* kRecipe = R"(
version: 1
name: threads
defaults: {format: none}
rules:
  - match: {name: "delayed.*"}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 8}
  - match: {name: "mx.*"}
    quantizer: {format: mxfp8}
  - match: {name: "fp4.*"}
    quantizer: {format: nvfp4, 2d: true}
  - match: {name: "block.*"}
    quantizer: {format: blockwise}
  - match: {name: "hybrid.*"}
    quantizer:
      format: hybrid
      rowwise: {format: float8, scaling: delayed, amax_history_len: 4}
      columnwise: {format: mxfp8}
  - match: {}
    quantizer: {format: float8}
)";

std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Every byte of every direction (data, scale_inv, amax) of a quantized tensor.
std::string bytes_of(const QuantizedTensor& t) {
  std::string out;
  for (const auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!t.has(d)) continue;
    const auto& dd = t.direction(d);
    for (const qr_tensor_view* v : {&dd.data, &dd.scale_inv, &dd.amax}) {
      if (v->ndim == 0 || v->data == nullptr) continue;
      const TensorView view(*v);
      out.append(static_cast<const char*>(view.data()), static_cast<std::size_t>(view.nbytes()));
    }
  }
  return out;
}

// Runs fn(thread index) on kThreads threads and joins them.
void on_threads(const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(fn, t);
  for (auto& th : threads) th.join();
}

bool have_plugins() {
  for (const char* f : {"float8", "mxfp8", "nvfp4", "blockwise", "hybrid"})
    if (!Registry::shared()->find(f)) return false;
  return true;
}

}  // namespace

TEST_CASE("registries load the plugins from several threads at once") {
  std::vector<std::shared_ptr<Registry>> made(kThreads);
  std::vector<std::shared_ptr<Registry>> shared(kThreads);
  on_threads([&](int t) {
    shared[t] = Registry::shared();  // first use from several threads: one instance
    made[t] = std::make_shared<Registry>();
  });
  for (int t = 0; t < kThreads; ++t) {
    CHECK(shared[t] == shared[0]);
    CHECK(made[t]->loaded_names() == shared[0]->loaded_names());
    CHECK(made[t]->failures().size() == shared[0]->failures().size());
  }
}

TEST_CASE("resolve from several threads: one quantizer per role, one state per stateful one") {
  if (!have_plugins()) {
    MESSAGE("not supported: the shipped plugins are not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "threads.yaml"));
  const std::vector<std::string> names = {"delayed.a", "mx.b", "fp4.c", "block.d", "hybrid.e",
                                          "plain.f"};
  std::vector<std::vector<std::shared_ptr<Quantizer>>> got(kThreads);
  on_threads([&](int t) {
    for (int round = 0; round < 3; ++round)
      for (const auto& name : names)
        for (const char* tensor : {"input", "weight", "grad_output"})
          got[t].push_back(engine.resolve({"linear", tensor, name}));
  });
  for (int t = 1; t < kThreads; ++t) CHECK(got[t] == got[0]);
  // delayed.* (3 tensor types) and hybrid.*'s delayed rowwise half (3): six states, no orphans
  // from a race between two threads creating the same role.
  CHECK(engine.scaling_states().size() == 6);
  // All threads ask for each new role at the same moment: one creation wins, the others
  // wait for it (a second creation would leave an orphan state with the same owner).
  constexpr int kRoles = 40;
  std::barrier start(kThreads);
  on_threads([&](int) {
    for (int k = 0; k < kRoles; ++k) {
      start.arrive_and_wait();
      engine.resolve({"linear", "input", "delayed.race" + std::to_string(k)});
    }
  });
  CHECK(engine.scaling_states().size() == 6 + kRoles);
}

TEST_CASE("quantize, dequantize and gemm with shared quantizers equal the single-threaded run") {
  if (!have_plugins()) {
    MESSAGE("not supported: the shipped plugins are not built");
    return;
  }
  const std::int64_t rows = 64, cols = 96;
  const std::vector<float> x = normal_values(rows * cols, 1);
  const std::vector<float> w = normal_values(48 * cols, 2);
  const TensorView xv(const_cast<float*>(x.data()), DType::f32, {rows, cols});
  const TensorView wv(const_cast<float*>(w.data()), DType::f32, {48, cols});
  const std::vector<std::string> names = {"mx.a", "fp4.b", "block.c", "plain.d"};
  constexpr int kIterations = 6;

  // The single-threaded reference of each name: quantized bytes, decoded values, GEMM output.
  struct Result {
    std::string bytes;
    std::vector<float> decoded, product;
  };
  auto run = [&](Engine& engine, const std::string& name) {
    const auto qx = engine.resolve({"linear", "input", name});
    const auto qw = engine.resolve({"linear", "weight", name});
    const QuantizedTensor tx = qx->quantize(xv, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
    const QuantizedTensor tw = qw->quantize(wv, QR_USAGE_ROWWISE);
    Result r;
    r.bytes = bytes_of(tx) + bytes_of(tw);
    r.decoded.resize(x.size());
    qx->dequantize(tx, QR_DIRECTION_ROWWISE, TensorView(r.decoded.data(), DType::f32, {rows, cols}));
    r.product.resize(rows * 48);
    gemm(GemmOperand::quantized(tx, *qx, QR_DIRECTION_ROWWISE),
         GemmOperand::quantized(tw, *qw, QR_DIRECTION_ROWWISE),
         TensorView(r.product.data(), DType::f32, {rows, 48}));
    return r;
  };
  std::vector<Result> expected;
  {
    Engine single(Recipe::parse(kRecipe, "threads.yaml"));
    for (const auto& name : names) expected.push_back(run(single, name));
  }
  Engine shared(Recipe::parse(kRecipe, "threads.yaml"));
  std::atomic<int> mismatches{0};
  on_threads([&](int t) {
    for (int i = 0; i < kIterations; ++i) {
      const std::size_t k = static_cast<std::size_t>(t + i) % names.size();
      const Result r = run(shared, names[k]);
      if (r.bytes != expected[k].bytes || r.decoded != expected[k].decoded ||
          r.product != expected[k].product)
        ++mismatches;
    }
  });
  CHECK(mismatches == 0);
}

TEST_CASE("delayed scaling: concurrent quantizes accumulate one amax; updates between phases") {
  if (!have_plugins()) {
    MESSAGE("not supported: the shipped plugins are not built");
    return;
  }
  Engine engine(Recipe::parse(kRecipe, "threads.yaml"));
  const auto q = engine.resolve({"linear", "input", "delayed.x"});
  const auto h = engine.resolve({"linear", "input", "hybrid.y"});
  REQUIRE(engine.scaling_states().size() == 2);
  std::vector<std::vector<float>> data;
  for (int t = 0; t < kThreads; ++t) data.push_back(normal_values(32 * 64, 10 + t));
  std::barrier sync(kThreads);
  constexpr int kSteps = 4;
  std::vector<std::vector<float>> scales(kSteps);
  on_threads([&](int t) {
    const TensorView v(data[t].data(), DType::f32, {32, 64});
    for (int step = 0; step < kSteps; ++step) {
      q->quantize(v, QR_USAGE_ROWWISE);
      h->quantize(v, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
      sync.arrive_and_wait();  // every quantize of the step is done
      if (t == 0) {
        engine.update_scaling();
        scales[step] = {*engine.scaling_states()[0]->c.scale, *engine.scaling_states()[1]->c.scale};
      }
      sync.arrive_and_wait();  // the update is done before the next step quantizes
    }
  });
  // The same steps on one thread: the step amax is the max over all threads' data.
  Engine single(Recipe::parse(kRecipe, "threads.yaml"));
  const auto q1 = single.resolve({"linear", "input", "delayed.x"});
  const auto h1 = single.resolve({"linear", "input", "hybrid.y"});
  for (int step = 0; step < kSteps; ++step) {
    for (int t = 0; t < kThreads; ++t) {
      const TensorView v(data[t].data(), DType::f32, {32, 64});
      q1->quantize(v, QR_USAGE_ROWWISE);
      h1->quantize(v, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
    }
    single.update_scaling();
    CHECK(scales[step][0] == *single.scaling_states()[0]->c.scale);
    CHECK(scales[step][1] == *single.scaling_states()[1]->c.scale);
  }
  CHECK(engine.scaling_values(0).amax_history == single.scaling_values(0).amax_history);
}

TEST_CASE("per-thread engines quantize and update their own delayed states freely") {
  if (!have_plugins()) {
    MESSAGE("not supported: the shipped plugins are not built");
    return;
  }
  std::vector<std::vector<float>> history(kThreads);
  on_threads([&](int t) {
    Engine engine(Recipe::parse(kRecipe, "threads.yaml"));
    const auto q = engine.resolve({"linear", "weight", "delayed.w"});
    const std::vector<float> x = normal_values(16 * 32, 7);  // the same data on every thread
    for (int step = 0; step < 5; ++step) {
      q->quantize(TensorView(const_cast<float*>(x.data()), DType::f32, {16, 32}), QR_USAGE_ROWWISE);
      engine.update_scaling();
    }
    history[t] = engine.scaling_values(0).amax_history;
  });
  for (int t = 1; t < kThreads; ++t) CHECK(history[t] == history[0]);
}
