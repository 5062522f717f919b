// qrecipe::adam_step (qrecipe/optim.hpp): checks every tensor, sorts the quantized ones into
// the fused path (one plugin extra call per plugin) and the two-pass path, and runs the
// engine's update for the plain and two-pass tensors (CPU: adam_host.hpp; CUDA: one
// multi-tensor launch, optim/adam_cuda.cu), then the two-pass requantizations.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "qrecipe/adam_host.hpp"
#include "qrecipe/optim.hpp"
#include "qrecipe/registry.hpp"
#if defined(QRECIPE_WITH_CUDA)
#include "optim/adam_cuda.hpp"
#endif

namespace qrecipe {
namespace {

std::string who(const AdamTensor& t, std::size_t index) {
  return "optimizer step, tensor " + std::to_string(index) +
         (t.name.empty() ? std::string() : " " + t.name);
}

void check_part(const AdamTensor& t, std::size_t index, const TensorView& v, const char* part,
                bool moment, std::int64_t numel, const Device& device) {
  const bool dtype_ok = moment ? adam::is_moment_dtype(v.c().dtype)
                               : adam::is_value_dtype(v.c().dtype);
  QR_CHECK(dtype_ok, who(t, index), ": ", part, " has dtype ", dtype_name(v.dtype()),
           "; expected ", moment ? "f32 or bf16" : "f32, bf16 or f16");
  QR_CHECK(v.numel() == numel, who(t, index), ": ", part, " is ", v.str(), " but the parameter "
           "has ", numel, " elements; every tensor of a parameter's step has its shape");
  QR_CHECK(v.is_contiguous(), who(t, index), ": ", part, " ", v.str(), " is not contiguous; "
           "pass a contiguous tensor");
  QR_CHECK(v.data() != nullptr || numel == 0, who(t, index), ": ", part, " has no data pointer");
  QR_CHECK(v.device() == device, who(t, index), ": ", part, " is on ", v.device().str(),
           " but the step runs on ", device.str(), "; one step serves one device");
}

void check_tensor(AdamTensor& t, std::size_t index, const Device& device) {
  t.hyper.struct_size = sizeof(qr_adam_hyper);
  const std::int64_t n = t.param.numel();
  check_part(t, index, t.param, "parameter", false, n, device);
  check_part(t, index, t.grad, "gradient", false, n, device);
  check_part(t, index, t.exp_avg, "exp_avg", true, n, device);
  check_part(t, index, t.exp_avg_sq, "exp_avg_sq", true, n, device);
  if (t.copy.data() != nullptr) check_part(t, index, t.copy, "copy", false, n, device);
  QR_CHECK(t.hyper.step_device != nullptr || t.hyper.step >= 1, who(t, index), ": step count ",
           t.hyper.step, "; the count after this step's increment is at least 1");
  if (t.quantized == nullptr) return;
  QR_CHECK(t.quantizer != nullptr, who(t, index), ": a quantized target without its quantizer");
  QR_CHECK(t.param.dtype() == DType::f32, who(t, index), ": a quantized parameter is updated "
           "through its FP32 master, got a ", dtype_name(t.param.dtype()), " master");
  QR_CHECK(t.quantized->rows() * t.quantized->cols() == n, who(t, index), ": the quantized "
           "tensor is ", t.quantized->rows(), " x ", t.quantized->cols(), " but the master has ",
           n, " elements");
  QR_CHECK(t.copy.data() == nullptr, who(t, index), ": a quantized parameter has no "
           "high-precision copy to write");
}

// `view`'s memory as the [rows, cols] matrix of the quantized tensor (a contiguous view).
qr_tensor_view as_matrix(const TensorView& view, const QuantizedTensor& q) {
  qr_tensor_view v = view.c();
  v.ndim = 2;
  v.shape[0] = q.rows();
  v.shape[1] = q.cols();
  v.strides[0] = q.cols();
  v.strides[1] = 1;
  return v;
}

void update_host(const AdamTensor& t) {
  adam::update_host({t.param.data(), t.param.c().dtype}, {t.grad.data(), t.grad.c().dtype},
                    {t.exp_avg.data(), t.exp_avg.c().dtype},
                    {t.exp_avg_sq.data(), t.exp_avg_sq.c().dtype}, t.param.numel(),
                    adam::host_scalars(t.hyper),
                    {t.copy.data(), t.copy.data() ? t.copy.c().dtype : QR_DTYPE_F32});
}

void update_engine(const std::vector<AdamTensor*>& tensors, const Device& device,
                   void* stream) {
  if (tensors.empty()) return;
  if (device.is_cpu()) {
    for (const AdamTensor* t : tensors) update_host(*t);
    return;
  }
#if defined(QRECIPE_WITH_CUDA)
  std::vector<detail::AdamCudaItem> items;
  items.reserve(tensors.size());
  for (const AdamTensor* t : tensors) {
    detail::AdamCudaItem it;
    it.param = t->param.data();
    it.param_dtype = t->param.c().dtype;
    it.grad = t->grad.data();
    it.grad_dtype = t->grad.c().dtype;
    it.exp_avg = t->exp_avg.data();
    it.exp_avg_dtype = t->exp_avg.c().dtype;
    it.exp_avg_sq = t->exp_avg_sq.data();
    it.exp_avg_sq_dtype = t->exp_avg_sq.c().dtype;
    it.copy = t->copy.data();
    it.copy_dtype = t->copy.data() ? t->copy.c().dtype : QR_DTYPE_F32;
    it.numel = t->param.numel();
    it.hyper = t->hyper;
    items.push_back(it);
  }
  detail::adam_update_cuda(items, device.index, stream);
#else
  (void)stream;
  QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "optimizer step on ", device.str(), ": this build of "
                "libqrecipe has no CUDA kernels (QRECIPE_CUDA=OFF); rebuild with CUDA or keep "
                "the parameters on the CPU");
#endif
}

}  // namespace

const char* adam_path_name(AdamPath path) {
  switch (path) {
    case AdamPath::plain: return "plain";
    case AdamPath::fused: return "fused";
    default: return "two_pass";
  }
}

AdamPath adam_path(const Quantizer& q, Device device, bool fused, bool capturable,
                   std::string* why) {
  const auto supports = q.plugin().adam_requantize_supports_extra();
  auto set_why = [&](const std::string& text) {
    if (why != nullptr) *why = text;
  };
  if (!fused) {
    set_why("the fused path is turned off");
    return AdamPath::two_pass;
  }
  if (supports == nullptr || q.plugin().adam_requantize_extra() == nullptr) {
    set_why("plugin '" + q.format() + "' (" + q.plugin().path() + ") has no fused Adam extra "
            "(" QR_EXTRA_ADAM_REQUANTIZE ")");
    return AdamPath::two_pass;
  }
  char reason[512] = {0};
  if (supports(q.handle(), device.to_c(), capturable ? 1 : 0, reason, sizeof reason) == 1)
    return AdamPath::fused;
  set_why("plugin '" + q.format() + "' does not fuse the Adam step of " + q.describe() +
          " on " + device.str() + (capturable ? " capturably" : "") + ": " + reason);
  return AdamPath::two_pass;
}

std::vector<AdamPath> adam_step(std::span<AdamTensor> tensors, const AdamStepOptions& options) {
  QR_CHECK(!tensors.empty(), "optimizer step: no tensors given");
  const Device device = tensors[0].param.device();
  for (std::size_t i = 0; i < tensors.size(); ++i) check_tensor(tensors[i], i, device);

  std::vector<AdamPath> paths(tensors.size(), AdamPath::plain);
  std::vector<AdamTensor*> engine_updates, two_pass;
  // Fused tensors per plugin, in order of first appearance (a stable launch order).
  std::vector<const FormatPlugin*> plugins;
  std::map<const FormatPlugin*, std::vector<std::size_t>> fused;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    AdamTensor& t = tensors[i];
    if (t.quantized == nullptr) {
      engine_updates.push_back(&t);
      continue;
    }
    std::string why;
    paths[i] = adam_path(*t.quantizer, device, options.fused, options.capturable, &why);
    if (paths[i] == AdamPath::fused) {
      const FormatPlugin* p = &t.quantizer->plugin();
      if (!fused.count(p)) plugins.push_back(p);
      fused[p].push_back(i);
      continue;
    }
    QR_CHECK_CODE(!options.capturable, QR_STATUS_UNSUPPORTED, who(t, i), ": a capturable step "
                  "cannot requantize this parameter: ", why, ". Use capturable=False, or a "
                  "recipe whose weight formats provide the fused extra (qrecipe list-plugins and "
                  "docs/plugins.md say which)");
    engine_updates.push_back(&t);
    two_pass.push_back(&t);
  }

  update_engine(engine_updates, device, options.stream);
  for (AdamTensor* t : two_pass) {
    QuantizeOptions q;
    q.stream = options.stream;
    try {
      t->quantizer->quantize_into(TensorView(as_matrix(t->param, *t->quantized)), *t->quantized,
                                  q);
    } catch (const Error& e) {
      throw Error(e.code(), e.where(), who(*t, static_cast<std::size_t>(t - tensors.data())) +
                                           ", requantizing from the new master: " + e.message());
    }
  }
  for (const FormatPlugin* p : plugins) {
    const std::vector<std::size_t>& indices = fused[p];
    std::vector<qr_adam_tensor> c(indices.size());
    std::ostringstream names;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      AdamTensor& t = tensors[indices[k]];
      qr_adam_tensor& a = c[k];
      a.struct_size = sizeof(qr_adam_tensor);
      a.quantizer = t.quantizer->handle();
      a.hyper = &t.hyper;
      a.master = as_matrix(t.param, *t.quantized);
      a.grad = as_matrix(t.grad, *t.quantized);
      a.exp_avg = as_matrix(t.exp_avg, *t.quantized);
      a.exp_avg_sq = as_matrix(t.exp_avg_sq, *t.quantized);
      a.dst = &t.quantized->c();
      names << (k ? ", " : "") << k << " = " << (t.name.empty() ? "?" : t.name);
    }
    if (qr_status status = p->adam_requantize_extra()(c.data(),
                                                      static_cast<std::uint32_t>(c.size()),
                                                      options.stream)) {
      throw_if_error(status, "optimizer step, fused Adam + requantize of format '" + p->name() +
                                 "' (" + p->path() + ") over tensors " + names.str());
    }
  }
  return paths;
}

}  // namespace qrecipe
