// GPU grouped GEMMs (qrecipe::gemm_grouped, docs/gemm.md "Grouped GEMMs") against the per-group
// GEMMs and the CPU reference, for the three GEMMs of an expert layer under every shipped
// recipe, with uneven routing (an empty expert, a single-token one, odd sizes):
//
//   cpu      quantize on the CPU group by group, gemm() per group: the reference
//   single   quantize on cuda:0 group by group, gemm() per group (the dense CUDA path)
//   host     gemm_grouped() on cuda:0 with per-group operands (host-known splits)
//   device   quantize_grouped() by offsets in device memory and gemm_grouped() on the split
//            operands and output: nothing about the group sizes reaches the host
//
// Checks, for every group and output element:
//   - host and device within the FP32-accumulation bound of the CPU reference (the bound of
//     test_gpu_gemm.cpp, with the accumulation of the plan that ran: native FP8 split/fast or
//     exactly decoded operands); for FP32 outputs the relative Frobenius error per group too;
//   - host == single bit for bit when the plan ran per group (the same cuBLASLt calls);
//   - device == host bit for bit (the same grouped kernel on the same bytes), and every
//     device-split group's data and scales byte-identical to the group quantized alone;
//   - the plan is one grouped launch whenever the build has the grouped kernels (CUTLASS),
//     with the path plan_gemm_grouped promises.
// Then: MXFP8 operands BF16 cannot hold (the device check and exact recompute), device splits
// refused for a format without device-split quantization, and a timing line (information).
//
// Without a usable CUDA device every case prints "not supported: no CUDA device" and passes.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm_grouped.hpp"

using namespace qrecipe;

namespace {

// ---------------------------------------------------------------- helpers

Recipe load_recipe(const std::string& name) {
  const char* root = std::getenv("QRECIPE_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "QRECIPE_SOURCE_DIR is not set (run through ctest)");
  return Recipe::load(std::string(root) + "/recipes/" + name + ".yaml");
}

Tensor random_bf16(std::int64_t rows, std::int64_t cols, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Tensor t(DType::bf16, {rows, cols});
  for (std::int64_t i = 0; i < rows * cols; ++i) t.data_as<std::uint16_t>()[i] = num::f32_to_bf16(d(rng));
  return t;
}

Tensor to_device(const Tensor& host) {
  Tensor t(host.view().dtype(), host.shape(), Device::cuda(0), cuda_allocator());
  copy_to_device(t.view().data(), host.view().data(), static_cast<std::size_t>(host.view().nbytes()));
  return t;
}

TensorView rows_of(const TensorView& t, std::int64_t row, std::int64_t rows) {
  qr_tensor_view v = t.c();
  v.shape[0] = rows;
  if (rows > 0) v.data = static_cast<char*>(v.data) + row * t.cols() * dtype_bits(t.dtype()) / 8;
  return TensorView(v);
}

std::vector<std::uint8_t> bytes_of(const void* p, std::size_t n, bool device) {
  std::vector<std::uint8_t> out(n);
  if (n == 0) return out;
  if (device) copy_to_host(out.data(), p, n);
  else std::memcpy(out.data(), p, n);
  return out;
}

std::vector<float> values_of(const TensorView& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<float> v(n);
  const bool dev = t.device().is_cuda();
  if (t.dtype() == DType::f32) {
    const auto b = bytes_of(t.data(), n * 4, dev);
    if (n) std::memcpy(v.data(), b.data(), n * 4);
  } else {
    const auto b = bytes_of(t.data(), n * 2, dev);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = num::bf16_to_f32(h);
    }
  }
  return v;
}

// Euclidean norms of the decoded rows (along K) of an operand, from the CPU reference decode.
std::vector<double> row_norms(const GemmOperand& op) {
  const std::int64_t rows = op.rows(), cols = op.cols();
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  if (op.tensor) {
    op.quantizer->dequantize(*op.tensor, op.direction, TensorView(v.data(), DType::f32, {rows, cols}));
  } else {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = num::bf16_to_f32(op.high_precision.data_as<const std::uint16_t>()[i]);
  }
  std::vector<double> n(static_cast<std::size_t>(op.outer()), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const double x = v[static_cast<std::size_t>(r * cols + c)];
      n[static_cast<std::size_t>(op.direction == QR_DIRECTION_ROWWISE ? r : c)] += x * x;
    }
  for (auto& x : n) x = std::sqrt(x);
  return n;
}

// The bound of test_gpu_gemm.cpp (its header derives it) for the plan that ran.
double gamma_of(const GemmPlan& plan, std::int64_t k) {
  double g = static_cast<double>(k + 2) * std::ldexp(1.0, -22);
  if (plan.path == GemmPlan::Path::native) g += std::ldexp(1.0, plan.fast_accumulation ? -5 : -6);
  return g;
}

// Per-group operands of an expert layer on one device.
struct Side {
  std::vector<QuantizedTensor> q;
  std::vector<TensorView> dense;
  std::vector<GemmOperand> as(const Quantizer* quantizer, qr_direction d) const {
    std::vector<GemmOperand> out;
    if (quantizer)
      for (const auto& t : q) out.push_back(GemmOperand::quantized(t, *quantizer, d));
    else
      for (const auto& t : dense) out.push_back(GemmOperand::dense(t, d));
    return out;
  }
};

Side side(Engine& e, const Quantizer* q, const Tensor& t, const std::vector<std::int64_t>& rows,
          std::shared_ptr<Allocator> allocator) {
  Side s;
  if (q) {
    s.q = e.quantize_grouped(*q, t.view(), rows, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, {}, allocator);
  } else {
    std::int64_t row = 0;
    for (auto r : rows) {
      s.dense.push_back(rows_of(t.view(), row, r));
      row += r;
    }
  }
  return s;
}

// Whether group g of a device-split direction holds exactly the bytes of `alone` (the group
// quantized by itself on the device).
int compare_group(const qr_group_entry& e, const QuantizedTensor& alone, qr_direction d, const std::string& what) {
  if (e.rows == 0) return 0;
  const qr_direction_data& dd = alone.direction(d);
  const qr_direction_layout& l = dd.layout;
  int bad = 0;
  // Data: stored rows of the group, each data_ld apart in the packed buffer.
  const std::int64_t stored_rows = l.data_shape[0], row_bytes = storage_bytes(static_cast<DType>(l.data_dtype), 1, l.data_shape[1]);
  const std::int64_t ld_bytes = storage_bytes(static_cast<DType>(l.data_dtype), 1, e.data_ld);
  const auto want = bytes_of(dd.data.data, static_cast<std::size_t>(stored_rows * row_bytes), true);
  for (std::int64_t r = 0; r < stored_rows; ++r) {
    const auto got = bytes_of(static_cast<const char*>(e.data) + r * ld_bytes, static_cast<std::size_t>(row_bytes), true);
    if (std::memcmp(got.data(), want.data() + r * row_bytes, static_cast<std::size_t>(row_bytes)) != 0) {
      if (bad++ == 0) MESSAGE(what << " " << direction_name(d) << ": data row " << r << " differs");
    }
  }
  if (dd.scale_inv.data && e.scale_inv) {
    const TensorView s(dd.scale_inv);
    CHECK_MESSAGE((l.scale_ndim != 2 || e.scale_ld == l.scale_shape[1]), what, ": scale_ld ", e.scale_ld,
                  " but the group's own layout has ", l.scale_shape[1]);
    const auto a = bytes_of(s.data(), static_cast<std::size_t>(s.nbytes()), true);
    const auto b = bytes_of(e.scale_inv, static_cast<std::size_t>(s.nbytes()), true);
    if (a != b) {
      ++bad;
      MESSAGE(what << " " << direction_name(d) << ": scales differ");
    }
  }
  if (dd.amax.data && e.amax) {
    if (bytes_of(dd.amax.data, 4, true) != bytes_of(e.amax, 4, true)) {
      ++bad;
      MESSAGE(what << " " << direction_name(d) << ": amax differs");
    }
  }
  return bad;
}

struct Counts {
  int cases = 0, groups = 0, bound_failures = 0, exact_failures = 0, quantize_failures = 0;
  int grouped_launches = 0, per_group = 0;
};

// ---------------------------------------------------------------- one recipe

OperandTraits traits_of(const GemmOperand& g) {
  return g.tensor ? OperandTraits::of(g.tensor->layout(g.direction), g.direction)
                  : OperandTraits::high_precision(DType::bf16);
}

void check_recipe(const std::string& recipe, const std::vector<std::int64_t>& splits, std::int64_t K,
                  std::int64_t N, Counts& counts) {
  CAPTURE(recipe);
  Engine cpu_e(load_recipe(recipe)), gpu_e(load_recipe(recipe));
  const std::string name = "experts";
  const auto cq = [&](Engine& e, const char* t) { return e.resolve({"grouped_linear", t, name}); };
  const auto cx = cq(cpu_e, "input"), cw = cq(cpu_e, "weight"), cg = cq(cpu_e, "grad_output");
  const auto gx = cq(gpu_e, "input"), gw = cq(gpu_e, "weight"), gg = cq(gpu_e, "grad_output");
  const std::int64_t G = static_cast<std::int64_t>(splits.size());
  std::int64_t T = 0;
  for (auto r : splits) T += r;
  const Tensor x = random_bf16(T, K, 11, 1.0f), w = random_bf16(G * N, K, 12, 0.05f), dy = random_bf16(T, N, 13, 0.01f);
  const Tensor dx_dev = to_device(x), dw_dev = to_device(w), ddy_dev = to_device(dy);
  const std::vector<std::int64_t> w_rows(static_cast<std::size_t>(G), N);
  const auto alloc = cuda_allocator();
  const Side cxs = side(cpu_e, cx.get(), x, splits, nullptr), cws = side(cpu_e, cw.get(), w, w_rows, nullptr),
             cgs = side(cpu_e, cg.get(), dy, splits, nullptr);
  const Side gxs = side(gpu_e, gx.get(), dx_dev, splits, alloc), gws = side(gpu_e, gw.get(), dw_dev, w_rows, alloc),
             ggs = side(gpu_e, gg.get(), ddy_dev, splits, alloc);

  // Device splits: offsets in device memory, the inputs and gradients quantized by them.
  std::vector<std::int64_t> offsets{0};
  for (auto r : splits) offsets.push_back(offsets.back() + r);
  Tensor offsets_dev(DType::f64, {G + 1}, Device::cuda(0), alloc);  // 8-byte elements
  copy_to_device(offsets_dev.view().data(), offsets.data(), offsets.size() * 8);
  const GroupSplits dsplits = GroupSplits::of_offsets(static_cast<const std::int64_t*>(offsets_dev.view().data()), G, T,
                                                      Device::cuda(0));
  const auto usage = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
  bool device_ok = grouped_kernels_built();
  for (const Quantizer* q : {gx.get(), gg.get()})
    device_ok = device_ok && (!q || Engine::has_grouped_device_quantize(*q, Device::cuda(0)));
  std::optional<GroupedQuantizedTensor> x_split, dy_split;
  if (device_ok) {
    if (gx) x_split.emplace(gpu_e.quantize_grouped(*gx, dx_dev.view(), dsplits, usage, {}, alloc));
    if (gg) dy_split.emplace(gpu_e.quantize_grouped(*gg, ddy_dev.view(), dsplits, usage, {}, alloc));
    synchronize(Device::cuda(0));
    // Every device-split group holds the bytes of the group quantized alone.
    for (const auto& [t, host] : {std::pair{&x_split, &gxs}, std::pair{&dy_split, &ggs}}) {
      if (!*t) continue;
      for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
        std::vector<qr_group_entry> entries(static_cast<std::size_t>(G));
        copy_to_host(entries.data(), (*t)->direction(d).groups, entries.size() * sizeof(qr_group_entry));
        for (std::int64_t g = 0; g < G; ++g) {
          CHECK(entries[g].rows == splits[g]);
          counts.quantize_failures += compare_group(entries[g], host->q[g], d, recipe + " group " + std::to_string(g));
        }
      }
    }
  } else {
    MESSAGE("not supported: " << recipe << ": device splits (grouped kernels built: " << grouped_kernels_built() << ")");
  }

  const auto R = QR_DIRECTION_ROWWISE, C = QR_DIRECTION_COLUMNWISE;
  for (const GemmKind kind : {GemmKind::fprop, GemmKind::dgrad, GemmKind::wgrad}) {
    const bool fprop = kind == GemmKind::fprop, dgrad = kind == GemmKind::dgrad;
    const auto pick = [&](const Side& xs, const Side& ws, const Side& gs, const Quantizer* qx, const Quantizer* qw,
                          const Quantizer* qg) {
      return std::pair{fprop ? xs.as(qx, R) : dgrad ? gs.as(qg, R) : gs.as(qg, C),
                       fprop ? ws.as(qw, R) : dgrad ? ws.as(qw, C) : xs.as(qx, C)};
    };
    const auto [ca, cb] = pick(cxs, cws, cgs, cx.get(), cw.get(), cg.get());
    const auto [ga, gb] = pick(gxs, gws, ggs, gx.get(), gw.get(), gg.get());
    const std::int64_t cols = fprop ? N : K;
    for (const DType out : {DType::bf16, DType::f32}) {
      for (const bool accumulate : {false, true}) {
        const std::string kind_name = gemm_kind_name(kind);
        CAPTURE(kind_name);
        CAPTURE(dtype_name(out));
        CAPTURE(accumulate);
        ++counts.cases;
        // Per-group outputs with the same start values everywhere (accumulate reads them).
        std::vector<Tensor> cpu_out, single, host, device_g;
        std::vector<TensorView> host_views, device_views;
        for (std::int64_t g = 0; g < G; ++g) {
          const std::vector<std::int64_t> shape = kind == GemmKind::wgrad ? std::vector<std::int64_t>{N, K}
                                                                          : std::vector<std::int64_t>{splits[g], cols};
          Tensor start = random_bf16(shape[0], shape[1], 100 + g, 0.5f);
          Tensor s(out, shape);
          for (std::int64_t i = 0; i < s.numel(); ++i) {
            const float v = num::bf16_to_f32(start.data_as<std::uint16_t>()[i]);
            if (out == DType::f32) s.data_as<float>()[i] = v;
            else s.data_as<std::uint16_t>()[i] = start.data_as<std::uint16_t>()[i];
            (void)v;
          }
          cpu_out.push_back(std::move(s));
          single.push_back(to_device(cpu_out.back()));
          host.push_back(to_device(cpu_out.back()));
          host_views.push_back(host.back().view());
          if (kind == GemmKind::wgrad) {
            device_g.push_back(to_device(cpu_out.back()));
            device_views.push_back(device_g.back().view());
          }
        }
        GemmOptions o1;
        o1.kind = kind;
        o1.accumulate = accumulate;
        std::vector<std::vector<float>> start(static_cast<std::size_t>(G));
        for (std::int64_t g = 0; g < G; ++g) {
          start[g] = values_of(cpu_out[g].view());
          gemm(ca[g], cb[g], cpu_out[g].view(), o1);
          gemm(ga[g], gb[g], single[g].view(), o1);
        }
        GroupedGemmOptions o;
        o.kind = kind;
        o.accumulate = accumulate;
        const GroupedGemmPlan plan = gemm_grouped(GroupedOperand::per_group(ga), GroupedOperand::per_group(gb),
                                                  GroupedOutput{host_views, TensorView()}, o);
        CAPTURE(plan.str());
        if (grouped_kernels_built() && plan.mode != GroupedGemmPlan::Mode::grouped) {
          // One GEMM per group only for a reason the inputs give: a wgrad whose group rows TMA
          // cannot read (a group of tokens that is not a multiple of 16 bytes).
          const int bits = recipe == "none" ? 16 : 8;
          bool unaligned_wgrad = false;
          for (auto r : splits) unaligned_wgrad |= kind == GemmKind::wgrad && r > 0 && r * bits % 128 != 0;
          const bool unaligned = plan.reason.find("16-byte aligned") != std::string::npos;
          CHECK((unaligned && unaligned_wgrad));
        }
        counts.grouped_launches += plan.mode == GroupedGemmPlan::Mode::grouped;
        counts.per_group += plan.mode == GroupedGemmPlan::Mode::per_group;

        // The device-split run, where the device-split plan serves the pair; where it does not
        // (no grouped kernel for it), the call must be refused, never run per group on
        // guessed shapes.
        const GroupedGemmPlan split_plan =
            plan_gemm_grouped(kind, traits_of(ca[0]), traits_of(cb[0]), out, accumulate, false, cb[0].outer(),
                              kind == GemmKind::wgrad ? ca[0].outer() : ca[0].inner(), GemmTarget::sm90, true);
        const bool run_device = device_ok && split_plan.mode != GroupedGemmPlan::Mode::refused;
        std::optional<Tensor> split_out;
        if (device_ok) {
          o.splits = &dsplits;
          const auto split_side = [&](const std::optional<GroupedQuantizedTensor>& t, const Quantizer* q,
                                      const Tensor& dense, qr_direction d) {
            return t ? GroupedOperand::split(*t, *q, d) : GroupedOperand::split_dense(dense.view(), d);
          };
          const GroupedOperand sa = fprop ? split_side(x_split, gx.get(), dx_dev, R)
                                    : dgrad ? split_side(dy_split, gg.get(), ddy_dev, R)
                                            : split_side(dy_split, gg.get(), ddy_dev, C);
          const GroupedOperand sb = kind == GemmKind::wgrad ? split_side(x_split, gx.get(), dx_dev, C)
                                                            : GroupedOperand::per_group(gb);
          if (!run_device) {
            // Refused with the plan's reason, before anything runs.
            Tensor unused(out, {T, cols}, Device::cuda(0), alloc);
            try {
              gemm_grouped(sa, sb, kind == GemmKind::wgrad ? GroupedOutput{device_views, TensorView()}
                                                           : GroupedOutput{{}, unused.view()}, o);
              FAIL("a device-split GEMM the plan refuses ran");
            } catch (const Error& err) {
              CHECK(err.code() == QR_STATUS_UNSUPPORTED);
              CHECK(std::string(err.what()).find("with the splits on the device") != std::string::npos);
            }
          } else if (kind == GemmKind::wgrad) {
            gemm_grouped(sa, sb, GroupedOutput{device_views, TensorView()}, o);
          } else {
            // The split output starts like the per-group ones.
            Tensor host_packed(out, {T, cols});
            std::int64_t row = 0;
            for (std::int64_t g = 0; g < G; ++g) {
              const auto n = static_cast<std::size_t>(splits[g] * cols * dtype_bits(out) / 8);
              std::vector<float> s = start[g];
              if (n) {
                if (out == DType::f32) std::memcpy(static_cast<char*>(host_packed.view().data()) + row * cols * 4, s.data(), n);
                else
                  for (std::size_t i = 0; i < s.size(); ++i)
                    host_packed.data_as<std::uint16_t>()[row * cols + static_cast<std::int64_t>(i)] = num::f32_to_bf16(s[i]);
              }
              row += splits[g];
            }
            split_out.emplace(to_device(host_packed));
            gemm_grouped(sa, sb, GroupedOutput{{}, split_out->view()}, o);
          }
        }
        synchronize(Device::cuda(0));

        std::int64_t row = 0;
        for (std::int64_t g = 0; g < G; ++g) {
          ++counts.groups;
          const auto want = values_of(cpu_out[g].view());
          const auto got = values_of(host[g].view());
          const auto one = values_of(single[g].view());
          if (plan.mode == GroupedGemmPlan::Mode::per_group && got != one) {
            ++counts.exact_failures;
            MESSAGE("group " << g << ": per-group plan but not the per-group GEMMs' bytes");
          }
          std::vector<float> dev;
          if (run_device) {
            dev = kind == GemmKind::wgrad ? values_of(device_g[g].view())
                                          : values_of(rows_of(split_out->view(), row, splits[g]));
            // The same grouped kernel on the same bytes. (Host groups whose rows TMA cannot
            // read, a contraction that is not a multiple of 16, ran per group instead.)
            if (plan.mode == GroupedGemmPlan::Mode::grouped &&
                std::memcmp(dev.data(), got.data(), got.size() * 4) != 0) {
              ++counts.exact_failures;
              MESSAGE("group " << g << ": device-split result differs from the host-split one");
            }
          }
          row += splits[g];
          // The bound against the CPU reference.
          const std::vector<double> na = row_norms(ca[g]), nb = row_norms(cb[g]);
          const std::int64_t m = ca[g].outer(), n = cb[g].outer();
          // Both grouped results within the bound of the CPU reference (the device-split run
          // uses the grouped kernel's accumulation even where the host run went per group).
          GemmPlan device_plan = plan.gemm;
          if (grouped_kernels_built() && plan.mode == GroupedGemmPlan::Mode::per_group) {
            device_plan = plan_gemm_grouped(kind, traits_of(ca[g]), traits_of(cb[g]), out, accumulate, false, cb[g].outer(),
                                            kind == GemmKind::wgrad ? ca[g].outer() : ca[g].inner(),
                                            GemmTarget::sm90, true).gemm;
          }
          int bad = 0;
          for (const std::vector<float>* run : {&got, static_cast<const std::vector<float>*>(&dev)}) {
            if (run->empty() && !want.empty()) continue;
            const GemmPlan& p = run == &got ? plan.gemm : device_plan;
            const double gamma = gamma_of(p, ca[g].inner());
            double diff2 = 0, ref2 = 0;
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                const std::size_t idx = static_cast<std::size_t>(i * n + j);
                const double s = na[i] * nb[j];
                double tol = gamma * s + std::ldexp(1.0, -21) * (std::fabs(want[idx]) + (accumulate ? std::fabs(start[g][idx]) : 0.0));
                if (out == DType::bf16) tol += std::ldexp(1.0, -7) * (std::fabs(want[idx]) + gamma * s);
                const double d = std::fabs(static_cast<double>((*run)[idx]) - want[idx]);
                diff2 += d * d;
                ref2 += static_cast<double>(want[idx]) * want[idx];
                if (!(d <= tol) && !(std::isnan((*run)[idx]) && std::isnan(want[idx]))) {
                  if (bad++ < 3)
                    MESSAGE(std::string(run == &got ? "host" : "device") << " group " << g << " (" << i << ", " << j
                            << "): got " << (*run)[idx] << ", cpu " << want[idx] << ", bound " << tol);
                }
              }
            if (out == DType::f32 && ref2 > 0) {
              const double limit = p.path == GemmPlan::Path::native
                                       ? std::ldexp(1.0, p.fast_accumulation ? -4 : -7)
                                       : std::ldexp(1.0, -12);
              if (!(std::sqrt(diff2 / ref2) <= limit)) {
                ++bad;
                MESSAGE(std::string(run == &got ? "host" : "device") << " group " << g << ": relative Frobenius error "
                        << std::sqrt(diff2 / ref2) << " > " << limit);
              }
            }
          }
          counts.bound_failures += bad != 0;
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("GPU grouped GEMM == per-group GEMMs and the CPU reference, every shipped recipe") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device (" << cuda_status() << ")");
    return;
  }
  MESSAGE("grouped kernels built: " << std::string(grouped_kernels_built() ? "yes (CUTLASS)" : "no (per-group GEMMs)"));
  Counts counts;
  const std::vector<std::int64_t> uneven{96, 0, 1, 130, 48, 17};
  const std::vector<std::int64_t> runs16{96, 0, 16, 128, 48, 32};  // NVFP4's Hadamard: 16-row runs
  for (const std::string recipe : {"none", "default", "float8_delayed", "float8_e4m3", "blockwise", "mxfp8", "nvfp4",
                                   "hybrid_fp8_mx"})
    check_recipe(recipe, recipe == "nvfp4" ? runs16 : uneven, 256, 192, counts);
  // Every expert empty, and one large expert (K not a multiple of 128).
  check_recipe("default", {0, 0, 0}, 64, 32, counts);
  check_recipe("blockwise", {300}, 320, 144, counts);
  MESSAGE("grouped GEMM parity: " << counts.cases << " cases, " << counts.groups << " groups; "
          << counts.grouped_launches << " one-launch, " << counts.per_group << " per-group; failures: bound "
          << counts.bound_failures << ", exact " << counts.exact_failures << ", quantized bytes "
          << counts.quantize_failures);
  CHECK(counts.cases > 0);
  CHECK(counts.bound_failures == 0);
  CHECK(counts.exact_failures == 0);
  CHECK(counts.quantize_failures == 0);
}

TEST_CASE("GPU grouped GEMM: MXFP8 operands BF16 cannot hold are recomputed exactly on the device") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device");
    return;
  }
  // Tiny inputs give E8M0 block exponents <= 2 and subnormal codes: the grouped decode flags
  // them and the exact recompute writes every group's output (test_gpu_gemm's dense case).
  Engine e(load_recipe("mxfp8"));
  const auto qx = e.resolve({"grouped_linear", "input", "x"}), qw = e.resolve({"grouped_linear", "weight", "x"});
  const std::vector<std::int64_t> splits{32, 0, 64};
  const std::int64_t K = 128, N = 64, T = 96;
  Tensor x = random_bf16(T, K, 3, 1.0f);
  for (std::int64_t i = 0; i < T * K; ++i)
    x.data_as<std::uint16_t>()[i] = num::f32_to_bf16(num::bf16_to_f32(x.data_as<std::uint16_t>()[i]) * 1e-38f);
  const Tensor w = random_bf16(3 * N, K, 4, 1.0f);
  const Side cs = side(e, qx.get(), x, splits, nullptr), cws = side(e, qw.get(), w, {N, N, N}, nullptr);
  const Side gs = side(e, qx.get(), to_device(x), splits, cuda_allocator());
  const Side gws = side(e, qw.get(), to_device(w), {N, N, N}, cuda_allocator());
  const auto ca = cs.as(qx.get(), QR_DIRECTION_ROWWISE), cb = cws.as(qw.get(), QR_DIRECTION_ROWWISE);
  const auto ga = gs.as(qx.get(), QR_DIRECTION_ROWWISE), gb = gws.as(qw.get(), QR_DIRECTION_ROWWISE);
  std::vector<Tensor> want, got;
  std::vector<TensorView> views;
  for (int g = 0; g < 3; ++g) {
    want.emplace_back(DType::f32, std::vector<std::int64_t>{splits[g], N});
    got.emplace_back(DType::f32, std::vector<std::int64_t>{splits[g], N}, Device::cuda(0), cuda_allocator());
    views.push_back(got.back().view());
    GemmOptions o1;
    o1.kind = GemmKind::fprop;
    gemm(ca[g], cb[g], want.back().view(), o1);
  }
  GroupedGemmOptions o;
  o.kind = GemmKind::fprop;
  const GroupedGemmPlan plan = gemm_grouped(GroupedOperand::per_group(ga), GroupedOperand::per_group(gb),
                                            GroupedOutput{views, TensorView()}, o);
  MESSAGE(plan.str());
  synchronize(Device::cuda(0));
  for (int g = 0; g < 3; ++g) {
    const auto a = values_of(want[g].view()), b = values_of(got[g].view());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double tol = std::ldexp(1.0, -20) * std::fabs(a[i]) + 1e-44;
      REQUIRE_MESSAGE(std::fabs(static_cast<double>(a[i]) - b[i]) <= tol, "group ", g, " element ", i, ": ", b[i],
                      " vs ", a[i]);
    }
  }
}

TEST_CASE("GPU grouped GEMM: device splits of a format without device-split quantization are refused") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device");
    return;
  }
  Engine e(load_recipe("nvfp4"));
  const auto q = e.resolve({"grouped_linear", "input", "x"});
  CHECK_FALSE(Engine::has_grouped_device_quantize(*q, Device::cuda(0)));
  const Tensor x = to_device(random_bf16(32, 64, 1, 1.0f));
  std::vector<std::int64_t> offsets{0, 16, 32};
  Tensor offsets_dev(DType::f64, {3}, Device::cuda(0), cuda_allocator());
  copy_to_device(offsets_dev.view().data(), offsets.data(), 24);
  const GroupSplits s = GroupSplits::of_offsets(static_cast<const std::int64_t*>(offsets_dev.view().data()), 2, 32,
                                                Device::cuda(0));
  try {
    e.quantize_grouped(*q, x.view(), s, QR_USAGE_ROWWISE, {}, cuda_allocator());
    FAIL("expected an error");
  } catch (const Error& err) {
    CHECK(err.code() == QR_STATUS_UNSUPPORTED);
    CHECK(std::string(err.what()).find("no device-split grouped quantization") != std::string::npos);
  }
}

TEST_CASE("GPU grouped GEMM timing: one grouped launch vs one GEMM per expert (information)") {
  if (!cuda_available()) {
    MESSAGE("not supported: no CUDA device");
    return;
  }
  for (const std::string recipe : {"default", "blockwise", "mxfp8", "none"}) {
    Engine e(load_recipe(recipe));
    const auto qx = e.resolve({"grouped_linear", "input", "t"}), qw = e.resolve({"grouped_linear", "weight", "t"});
    const std::int64_t G = 64, M = 512, K = 2048, N = 1408;
    const std::vector<std::int64_t> splits(G, M), w_rows(G, N);
    const Tensor x = to_device(random_bf16(G * M, K, 1, 1.0f)), w = to_device(random_bf16(G * N, K, 2, 0.05f));
    const Side xs = side(e, qx.get(), x, splits, cuda_allocator()), ws = side(e, qw.get(), w, w_rows, cuda_allocator());
    const auto a = xs.as(qx.get(), QR_DIRECTION_ROWWISE), b = ws.as(qw.get(), QR_DIRECTION_ROWWISE);
    Tensor y(DType::bf16, {G * M, N}, Device::cuda(0), cuda_allocator());
    std::vector<TensorView> outs;
    for (std::int64_t g = 0; g < G; ++g) outs.push_back(rows_of(y.view(), g * M, M));
    GroupedGemmOptions o;
    o.kind = GemmKind::fprop;
    const auto time_ms = [&](auto&& fn) {
      for (int i = 0; i < 3; ++i) fn();
      synchronize(Device::cuda(0));
      const int reps = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) fn();
      synchronize(Device::cuda(0));
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    GroupedGemmPlan plan;
    const double grouped = time_ms([&] {
      plan = gemm_grouped(GroupedOperand::per_group(a), GroupedOperand::per_group(b), GroupedOutput{outs, TensorView()}, o);
    });
    const double per_expert = time_ms([&] {
      GemmOptions o1;
      o1.kind = GemmKind::fprop;
      for (std::int64_t g = 0; g < G; ++g) gemm(a[g], b[g], outs[g], o1);
    });
    const double tflops = 2.0 * G * M * K * N / (grouped * 1e-3) / 1e12;
    char line[300];
    std::snprintf(line, sizeof line, "%s fprop %lld x [%lld x %lld] x %lld -> bf16: grouped %.3f ms (%.0f TFLOP/s), per expert %.3f ms; %s",
                  recipe.c_str(), static_cast<long long>(G), static_cast<long long>(M), static_cast<long long>(K),
                  static_cast<long long>(N), grouped, tflops, per_expert, plan.str().c_str());
    MESSAGE(line);
    std::printf("%s\n", line);
  }
}
