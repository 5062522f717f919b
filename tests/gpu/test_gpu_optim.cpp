// The optimizer step on the GPU == the same step on the CPU, bit for bit (qrecipe::adam_step,
// qrecipe/optim.hpp): every format's fused Adam + requantize kernels
// (plugins/<format>/<format>_adam_kernels.cu), the two-pass path (the engine's multi-tensor
// update, engine/src/optim/adam_cuda.cu, then quantize), hyperparameters read from device
// memory (a capturable step), many tensors in one call (more than one launch table), and
// plain tensors of every dtype. Each case runs three steps on a CPU engine and a GPU engine
// from the same values and compares the master, the moments (two NaNs compare equal whatever
// their payloads: x86 propagates an operand's, CUDA returns its canonical NaN) and every
// quantized buffer, and the delayed-scaling states after an update.
//
// Without a usable CUDA device it prints "not supported: no CUDA device" and passes.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../grouped_inputs.hpp"  // states_of
#include "../optim_inputs.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/optim.hpp"
#include "qrecipe/registry.hpp"

using namespace qrecipe;

namespace {

std::vector<std::uint8_t> bytes(const qr_tensor_view& v) {
  return test::bytes_of(v, [](void* dst, const void* src, std::size_t n) {
    copy_to_host(dst, src, n);
  });
}

Tensor to_device(const Tensor& host) {
  Tensor t(host.view().dtype(), host.shape(), Device::cuda(0), cuda_allocator());
  if (host.view().nbytes() > 0)
    copy_to_device(t.view().data(), host.view().data(),
                   static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

// One parameter on one device.
struct Param {
  Tensor master, grad, exp_avg, exp_avg_sq;
  QuantizedTensor quantized;
  std::shared_ptr<Quantizer> quantizer;
  Tensor lr, step;  // device scalars of a capturable step (else no data)
  Tensor copy;      // plain parameters: the master rounded to the copy's dtype (else no data)
  std::vector<std::int64_t> shape;
  // Elements between each of master, grad, exp_avg, exp_avg_sq's allocation and its data: a
  // shift of 1 leaves FP32 data 4-byte and 16-bit data 2-byte aligned, never 8 or 16.
  std::int64_t shift = 0;
};

// The data of buffer t of p: from element p.shift of its allocation on, with p's shape.
TensorView at(const Param& p, const Tensor& t) {
  if (p.shift == 0 || t.view().data() == nullptr) return t.view();
  const DType dtype = t.view().dtype();
  auto* data = static_cast<std::uint8_t*>(t.view().data()) + p.shift * (dtype_bits(dtype) / 8);
  return TensorView(data, dtype, p.shape, t.view().device());
}

struct Host {
  Tensor master, exp_avg, exp_avg_sq;
};

Host host_values(test::Shape s, DType moments, std::uint64_t seed) {
  const std::int64_t n = s.rows * s.cols;
  auto v = test::normal_values(n, 1e-2f, seed + 2);
  for (auto& x : v) x = x * x;
  return {test::host_tensor(test::normal_values(n, 1.0f, seed), {s.rows, s.cols}, DType::f32),
          test::host_tensor(test::normal_values(n, 0.01f, seed + 1), {s.rows, s.cols}, moments),
          test::host_tensor(v, {s.rows, s.cols}, moments)};
}

// A copy of a host tensor, on the device or on the host.
Tensor copy_of(const Tensor& host, bool cuda) {
  if (cuda) return to_device(host);
  Tensor t(host.view().dtype(), host.shape());
  if (host.view().nbytes() > 0)
    std::memcpy(t.view().data(), host.view().data(), static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

// A device copy of a host tensor whose data starts `shift` elements into its allocation.
Tensor shifted_copy(const Tensor& host, std::int64_t shift) {
  Tensor t(host.view().dtype(), {host.numel() + shift}, Device::cuda(0), cuda_allocator());
  if (host.view().nbytes() > 0)
    copy_to_device(static_cast<std::uint8_t*>(t.view().data()) +
                       shift * (dtype_bits(host.view().dtype()) / 8),
                   host.view().data(), static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

// `shift` (device only): the buffers' data starts that many elements into their allocations.
Param make_param(const Host& h, Engine& engine, bool cuda, DType grad_dtype,
                 std::int64_t shift = 0) {
  Param p;
  p.shape = h.master.shape();
  p.shift = cuda ? shift : 0;
  auto copy = [&](const Tensor& host) {
    return p.shift == 0 ? copy_of(host, cuda) : shifted_copy(host, p.shift);
  };
  p.master = copy(h.master);
  p.exp_avg = copy(h.exp_avg);
  p.exp_avg_sq = copy(h.exp_avg_sq);
  p.grad = copy(Tensor(grad_dtype, p.shape));
  p.quantizer = engine.resolve(test::kOptimRole);
  if (p.quantizer)
    p.quantized = p.quantizer->quantize(at(p, p.master), QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE,
                                        {}, cuda ? cuda_allocator() : nullptr);
  return p;
}

void set_grad(Param& p, std::int64_t step, bool cuda) {
  std::int64_t numel = 1;
  for (const std::int64_t d : p.shape) numel *= d;
  const Tensor host = test::host_tensor(
      test::normal_values(numel, 0.01f, 1000 + static_cast<std::uint64_t>(step)), p.shape,
      p.grad.view().dtype());
  p.grad = p.shift == 0 ? copy_of(host, cuda) : shifted_copy(host, p.shift);
}

AdamTensor step_tensor(Param& p, std::int64_t step, const std::string& name) {
  AdamTensor t;
  t.name = name;
  t.hyper = test::optim_hyper(step);
  t.param = at(p, p.master);
  t.grad = at(p, p.grad);
  t.exp_avg = at(p, p.exp_avg);
  t.exp_avg_sq = at(p, p.exp_avg_sq);
  if (p.quantizer) {
    t.quantized = &p.quantized;
    t.quantizer = p.quantizer.get();
  }
  if (p.copy.view().data() != nullptr) t.copy = p.copy.view();
  if (p.step.view().data() != nullptr) {  // capturable: read on the device
    t.hyper.lr = 0.0;
    t.hyper.lr_device = p.lr.data_as<float>();
    t.hyper.step = 0;
    t.hyper.step_device = p.step.data_as<float>();
  }
  return t;
}

// Mismatching buffers between a CPU and a GPU parameter (each reported).
int compare(const Param& cpu, const Param& gpu, const std::string& what) {
  int bad = 0;
  auto check = [&](const qr_tensor_view& a, const qr_tensor_view& b, const char* part) {
    const std::string m = test::compare_values(bytes(a), bytes(b), static_cast<DType>(a.dtype));
    if (m.empty()) return;
    if (++bad <= 3) MESSAGE(what << " " << part << ": " << m);
  };
  check(at(cpu, cpu.master).c(), at(gpu, gpu.master).c(), "master");
  if (cpu.copy.view().data() != nullptr) check(cpu.copy.view().c(), gpu.copy.view().c(), "copy");
  check(at(cpu, cpu.exp_avg).c(), at(gpu, gpu.exp_avg).c(), "exp_avg");
  check(at(cpu, cpu.exp_avg_sq).c(), at(gpu, gpu.exp_avg_sq).c(), "exp_avg_sq");
  if (!cpu.quantizer) return bad;
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!cpu.quantized.has(d)) continue;
    const auto& a = cpu.quantized.direction(d);
    const auto& b = gpu.quantized.direction(d);
    check(a.data, b.data, d == QR_DIRECTION_ROWWISE ? "rowwise data" : "columnwise data");
    check(a.scale_inv, b.scale_inv, d == QR_DIRECTION_ROWWISE ? "rowwise scale" : "columnwise scale");
    check(a.amax, b.amax, d == QR_DIRECTION_ROWWISE ? "rowwise amax" : "columnwise amax");
  }
  return bad;
}

Tensor device_scalar(float value) {
  return to_device(test::host_tensor({value}, {1}, DType::f32));
}

}  // namespace

TEST_CASE("GPU adam_step == CPU adam_step, every format, path and dtype") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device (" << cuda_status() << ")");
    return;
  }
  int cases = 0, failures = 0;
  for (const test::OptimSpec& spec : test::kOptimSpecs) {
    for (const bool fused : {true, false}) {
      for (const test::Shape shape : test::kOptimShapes) {
        for (const DType grad_dtype : {DType::f32, DType::bf16, DType::f16}) {
          for (const bool capturable : {false, true}) {
            if (capturable && (!fused || grad_dtype != DType::bf16)) continue;
            const DType moments = grad_dtype == DType::f16 ? DType::bf16 : DType::f32;
            const std::string what = std::string(spec.label) + (fused ? " fused" : " two-pass") +
                                     (capturable ? " capturable " : " ") +
                                     std::to_string(shape.rows) + "x" +
                                     std::to_string(shape.cols) + " grad " +
                                     std::string(dtype_name(grad_dtype));
            CAPTURE(what);
            Engine cpu_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
            Engine gpu_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
            const Host h = host_values(shape, moments, 11);
            Param cpu = make_param(h, cpu_engine, false, grad_dtype);
            Param gpu = make_param(h, gpu_engine, true, grad_dtype);
            AdamStepOptions options;
            options.fused = fused;
            options.capturable = capturable;
            if (capturable) gpu.lr = device_scalar(1e-2f);
            bool refused = false;
            for (std::int64_t step = 1; step <= 3 && !refused; ++step) {
              set_grad(cpu, step, false);
              set_grad(gpu, step, true);
              if (capturable) gpu.step = device_scalar(static_cast<float>(step));
              AdamTensor tc = step_tensor(cpu, step, "'w'"), tg = step_tensor(gpu, step, "'w'");
              if (capturable) tc.hyper.lr = static_cast<double>(1e-2f);  // the device's value
              adam_step(std::span<AdamTensor>(&tc, 1), {nullptr, fused, false});
              std::vector<AdamPath> paths;
              try {
                paths = adam_step(std::span<AdamTensor>(&tg, 1), options);
              } catch (const Error& e) {
                // A capturable step refuses what its format does not fuse; nothing else.
                CHECK((capturable && !spec.fused_on_cuda));
                MESSAGE("refused: " << what << ": " << e.message());
                refused = true;
                break;
              }
              CHECK(paths[0] == (fused && spec.fused_on_cuda ? AdamPath::fused
                                                             : AdamPath::two_pass));
              synchronize(Device::cuda(0));
              failures += compare(cpu, gpu, what + " step " + std::to_string(step));
            }
            if (refused) continue;
            cpu_engine.update_scaling();
            gpu_engine.update_scaling();
            synchronize(Device::cuda(0));
            CHECK(test::states_of(cpu_engine) == test::states_of(gpu_engine));
            ++cases;
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases, " << failures << " mismatching buffers");
  CHECK(failures == 0);
}

TEST_CASE("GPU adam_step: buffers aligned or not, runs cut by the tensor's end") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device (" << cuda_status() << ")");
    return;
  }
  // The kernels load and store a run of 4 elements as one vector only when all 4 exist and
  // every buffer is aligned for it, else element by element (adam_cuda.cuh). Data one element
  // into its allocation (shift 1) takes the element path for every run; shift 0 the vector
  // path wherever cols % 4 == 0. The shapes end runs, 4x4 register blocks (1, 2 and 3 rows or
  // columns left), 64- and 128-wide tiles and the 4096-element chunks of the flat kernels at
  // other remainders, and 64x128 / 130x260 hold whole interior tiles.
  const test::Shape shapes[] = {{64, 128}, {33, 70}, {1, 4099}, {130, 260}, {67, 132}, {67, 71}};
  int cases = 0, failures = 0;
  for (const test::OptimSpec& spec : test::kOptimSpecs) {
    for (const bool fused : {true, false}) {
      for (const test::Shape shape : shapes) {
        for (const DType grad_dtype : {DType::bf16, DType::f32}) {
          for (const std::int64_t shift : {0, 1}) {
            const std::string what = std::string(spec.label) + (fused ? " fused " : " two-pass ") +
                                     std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                                     " grad " + std::string(dtype_name(grad_dtype)) + " shift " +
                                     std::to_string(shift);
            CAPTURE(what);
            Engine cpu_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
            Engine gpu_engine(Recipe::parse(test::optim_yaml(spec.yaml), "optim.yaml"));
            const Host h = host_values(shape, DType::f32, 23);
            Param cpu = make_param(h, cpu_engine, false, grad_dtype);
            Param gpu = make_param(h, gpu_engine, true, grad_dtype, shift);
            for (std::int64_t step = 1; step <= 2; ++step) {
              set_grad(cpu, step, false);
              set_grad(gpu, step, true);
              AdamTensor tc = step_tensor(cpu, step, "'w'"), tg = step_tensor(gpu, step, "'w'");
              adam_step(std::span<AdamTensor>(&tc, 1), {nullptr, fused, false});
              adam_step(std::span<AdamTensor>(&tg, 1), {nullptr, fused, false});
              synchronize(Device::cuda(0));
              failures += compare(cpu, gpu, what + " step " + std::to_string(step));
            }
            ++cases;
          }
        }
      }
    }
  }
  // Plain parameters updated in their own dtype, shifted the same way.
  Engine none(Recipe::parse(test::optim_yaml("{format: none}"), "none.yaml"));
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Host h = host_values({3, 1367}, DType::f32, 31);
    std::vector<float> values(static_cast<std::size_t>(h.master.numel()));
    std::memcpy(values.data(), h.master.view().data(), values.size() * 4);
    const Tensor master = test::host_tensor(values, h.master.shape(), dtype);
    Param cpu = make_param(h, none, false, DType::bf16);
    Param gpu = make_param(h, none, true, DType::bf16, /*shift=*/1);
    cpu.master = copy_of(master, false);
    gpu.master = shifted_copy(master, 1);
    const std::string what = "plain " + std::string(dtype_name(dtype)) + " shifted";
    for (std::int64_t step = 1; step <= 2; ++step) {
      set_grad(cpu, step, false);
      set_grad(gpu, step, true);
      AdamTensor tc = step_tensor(cpu, step, "'w'"), tg = step_tensor(gpu, step, "'w'");
      adam_step(std::span<AdamTensor>(&tc, 1));
      adam_step(std::span<AdamTensor>(&tg, 1));
      synchronize(Device::cuda(0));
      failures += compare(cpu, gpu, what + " step " + std::to_string(step));
    }
    ++cases;
  }
  MESSAGE(cases << " cases, " << failures << " mismatching buffers");
  CHECK(failures == 0);
}

TEST_CASE("GPU adam_step: many tensors of mixed formats and plain tensors in one call") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device (" << cuda_status() << ")");
    return;
  }
  // 70 quantized tensors per format (more than one launch table of 64) plus plain tensors of
  // every dtype (updated in their dtype, and an FP32 master with a copy), all in one call.
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<Param> cpu, gpu;
  std::vector<std::string> names;
  for (const test::OptimSpec& spec : test::kOptimSpecs) {
    engines.push_back(std::make_unique<Engine>(Recipe::parse(test::optim_yaml(spec.yaml), "o.yaml")));
    engines.push_back(std::make_unique<Engine>(Recipe::parse(test::optim_yaml(spec.yaml), "o.yaml")));
    Engine& ce = *engines[engines.size() - 2];
    Engine& ge = *engines.back();
    for (int i = 0; i < 70; ++i) {
      const test::Shape s{1 + (i * 7) % 40, 1 + (i * 13) % 50};
      const Host h = host_values(s, DType::f32, 100 + static_cast<std::uint64_t>(i));
      cpu.push_back(make_param(h, ce, false, DType::bf16));
      gpu.push_back(make_param(h, ge, true, DType::bf16));
      names.push_back(std::string(spec.label) + " #" + std::to_string(i));
    }
  }
  Engine none(Recipe::parse(test::optim_yaml("{format: none}"), "none.yaml"));
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int i = 0; i < 3; ++i) {  // #0, #1: updated in their own dtype; #2: master + copy
      const Host h = host_values({5, 33 + i}, DType::f32, 500 + static_cast<std::uint64_t>(i));
      for (const bool cuda : {false, true}) {
        Param p = make_param(h, none, cuda, dtype);
        if (i < 2) {
          std::vector<float> values(static_cast<std::size_t>(h.master.numel()));
          std::memcpy(values.data(), h.master.view().data(), values.size() * 4);
          p.master = copy_of(test::host_tensor(values, h.master.shape(), dtype), cuda);
        } else {
          p.copy = copy_of(Tensor(dtype, h.master.shape()), cuda);
        }
        (cuda ? gpu : cpu).push_back(std::move(p));
      }
      names.push_back("plain " + std::string(dtype_name(dtype)) + " #" + std::to_string(i));
    }
  }
  int failures = 0;
  for (std::int64_t step = 1; step <= 2; ++step) {
    std::vector<AdamTensor> tc, tg;
    for (std::size_t k = 0; k < cpu.size(); ++k) {
      set_grad(cpu[k], step, false);
      set_grad(gpu[k], step, true);
      tc.push_back(step_tensor(cpu[k], step, names[k]));
      tg.push_back(step_tensor(gpu[k], step, names[k]));
    }
    adam_step(tc);
    adam_step(tg);
    synchronize(Device::cuda(0));
    for (std::size_t k = 0; k < cpu.size(); ++k)
      failures += compare(cpu[k], gpu[k], names[k] + " step " + std::to_string(step));
  }
  CHECK(failures == 0);
}
