// The checks and the dispatch of the fused RMSNorm (qrecipe/norm.hpp): every view is checked
// here, with errors naming the tensor, before the CUDA launchers (rms_norm_cuda.hpp) run.
#include "qrecipe/norm.hpp"

#include <algorithm>

#include "qrecipe/error.hpp"

#if QRECIPE_WITH_CUDA
#include "norm/rms_norm_cuda.hpp"
#endif

namespace qrecipe {
namespace {

// Per-block dweight partials: a count that depends on the shape only (not on the device's SM
// count), so the summation order, and with it every bit of dweight, is the same on every GPU.
// About 2^20 elements of work in flight: 512 blocks of 256 threads at n >= 2048 (an H100 or
// H200 about four blocks deep), more blocks of fewer threads for narrow rows (up to 8192 at
// n = 128, a per-head norm), so narrow rows still fill the GPU. The partials are count x n FP32
// (8 MiB at n = 4096, at most 4 MiB below).
constexpr std::int64_t kBackwardWork = std::int64_t{1} << 20;
constexpr std::int64_t kMinPartials = 512;
constexpr std::int64_t kMaxPartials = 8192;
constexpr std::int64_t kMaxRows = 0x7fffffff;  // one block (forward) per row: gridDim.x

bool norm_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

std::string describe(const TensorView& t) {
  std::string s = std::string(dtype_name(t.dtype())) + " [";
  for (int d = 0; d < t.ndim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] on " + t.device().str();
}

// x: [..., n] contiguous on a CUDA device, F32/BF16/F16, n >= 1.
void check_input(const char* fn, const char* name, const TensorView& x) {
  QR_CHECK(x.device().is_cuda(), fn, ": ", name, " is ", describe(x), "; the fused RMSNorm runs "
           "on CUDA tensors only (on the CPU qrecipe.nn.RMSNorm runs the torch formula itself)");
  QR_CHECK(norm_dtype(x.dtype()), fn, ": ", name, " is ", describe(x), "; expected float32, "
           "bfloat16 or float16");
  QR_CHECK(x.ndim() >= 1 && x.cols() >= 1, fn, ": ", name, " is ", describe(x),
           "; expected at least one dimension and a last dimension (the hidden size) >= 1");
  QR_CHECK(x.is_contiguous(), fn, ": ", name, " ", describe(x), " is not contiguous");
  QR_CHECK(x.rows() <= kMaxRows, fn, ": ", name, " has ", x.rows(), " rows; at most ", kMaxRows);
  QR_CHECK(x.cols() <= kRmsNormMaxHidden, fn, ": ", name, " has a hidden size of ",
           x.cols(), "; the fused RMSNorm serves at most ", kRmsNormMaxHidden,
           " (its backward keeps one FP32 row of dweight in shared memory); use the torch formula "
           "(qrecipe.convert(..., fuse_norms=False))");
}

// `t` must have `like`'s shape, dtype and device, and be contiguous.
void check_like(const char* fn, const char* name, const TensorView& t, const char* like_name,
                const TensorView& like) {
  QR_CHECK(t.shape() == like.shape() && t.dtype() == like.dtype() &&
               t.device().type == like.device().type && t.device().index == like.device().index,
           fn, ": ", name, " is ", describe(t), "; expected ", like_name, "'s ", describe(like));
  QR_CHECK(t.is_contiguous(), fn, ": ", name, " ", describe(t), " is not contiguous");
}

void check_weight(const char* fn, const TensorView& weight, const TensorView& x) {
  const bool ok = weight.ndim() == 1 && weight.size(0) == x.cols() &&
                  weight.dtype() == x.dtype() && weight.device().type == x.device().type &&
                  weight.device().index == x.device().index && weight.is_contiguous();
  QR_CHECK(ok, fn, ": weight is ", describe(weight), "; expected a contiguous ",
           dtype_name(x.dtype()), " [", x.cols(), "] on ", x.device().str(),
           " (x's dtype, its last dimension and its device)");
}

void check_rstd(const char* fn, const TensorView& rstd, const TensorView& x) {
  QR_CHECK(rstd.dtype() == DType::f32 && rstd.numel() == x.rows() && rstd.is_contiguous() &&
               rstd.device().type == x.device().type && rstd.device().index == x.device().index,
           fn, ": rstd is ", describe(rstd), "; expected a contiguous float32 tensor of ",
           x.rows(), " values (one per row of x) on ", x.device().str());
}

#if QRECIPE_WITH_CUDA
detail::RmsNormCudaArgs args_of(const TensorView& x, void* stream) {
  detail::RmsNormCudaArgs a;
  a.dtype = static_cast<std::int32_t>(x.dtype());
  a.rows = x.rows();
  a.n = x.cols();
  a.device = x.device().index;
  a.stream = stream;
  return a;
}
#endif

#if !QRECIPE_WITH_CUDA
[[noreturn]] void no_cuda(const char* fn) {
  QR_THROW_CODE(QR_STATUS_UNSUPPORTED, fn, ": this libqrecipe was built without CUDA; the fused "
                "RMSNorm needs a CUDA build (on the CPU qrecipe.nn.RMSNorm runs the torch formula)");
}
#endif

}  // namespace

void rms_norm_forward(const TensorView& x, const TensorView& weight, double eps,
                      const TensorView& y, const TensorView& rstd, const TensorView& amax,
                      void* stream) {
  constexpr const char* fn = "rms_norm_forward";
  check_input(fn, "x", x);
  check_weight(fn, weight, x);
  check_like(fn, "y", y, "x", x);
  check_rstd(fn, rstd, x);
  const bool with_amax = amax.data() != nullptr;
  QR_CHECK(!with_amax || (amax.dtype() == DType::f32 && amax.numel() == 2 &&
                          amax.is_contiguous() && amax.device().type == x.device().type &&
                          amax.device().index == x.device().index),
           fn, ": amax is ", describe(amax), "; expected 2 contiguous float32 values on ",
           x.device().str(), " (or no amax)");
#if QRECIPE_WITH_CUDA
  detail::rms_norm_forward_cuda(args_of(x, stream), x.data(), weight.data(),
                                static_cast<float>(eps), y.data(), rstd.data_as<float>(),
                                with_amax ? amax.data_as<float>() : nullptr);
#else
  (void)eps;
  (void)stream;
  no_cuda(fn);
#endif
}

std::int64_t rms_norm_backward_partials(std::int64_t rows, std::int64_t n) {
  QR_CHECK(rows >= 0 && n >= 1, "rms_norm_backward_partials: rows ", rows, " and hidden size ",
           n, "; expected rows >= 0 and a hidden size >= 1");
  const std::int64_t wanted = std::clamp(kBackwardWork / n, kMinPartials, kMaxPartials);
  return std::max<std::int64_t>(1, std::min(rows, wanted));
}

void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       const TensorView& rstd, const TensorView& dx, const TensorView& dweight,
                       const TensorView& workspace, void* stream) {
  constexpr const char* fn = "rms_norm_backward";
  check_input(fn, "x", x);
  check_like(fn, "dy", dy, "x", x);
  check_weight(fn, weight, x);
  check_rstd(fn, rstd, x);
  check_like(fn, "dx", dx, "x", x);
  check_like(fn, "dweight", dweight, "weight", weight);
  const std::int64_t count = rms_norm_backward_partials(x.rows(), x.cols());
  QR_CHECK(workspace.dtype() == DType::f32 && workspace.is_contiguous() &&
               workspace.numel() >= count * x.cols() &&
               workspace.device().type == x.device().type &&
               workspace.device().index == x.device().index,
           fn, ": workspace is ", describe(workspace), "; expected a contiguous float32 tensor of "
           "at least ", count, " x ", x.cols(), " values on ", x.device().str(),
           " (rms_norm_backward_partials(rows, hidden size) x hidden size)");
#if QRECIPE_WITH_CUDA
  detail::rms_norm_backward_cuda(args_of(x, stream), dy.data(), x.data(), weight.data(),
                                 rstd.data_as<float>(), dx.data(), dweight.data(),
                                 workspace.data_as<float>(), count);
#else
  (void)stream;
  no_cuda(fn);
#endif
}

}  // namespace qrecipe
