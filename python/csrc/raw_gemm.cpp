// qrecipe._C.raw_cublaslt_gemm (see raw_gemm.hpp).
//
// out[M, N] = A[M, K] . B[N, K]^T with both operands stored K-major, issued as exactly one
// raw cuBLASLt GEMM of the benchmarks' helper (bench/raw_cublaslt.hpp: the TN GEMM the engine
// issues for a native pair, set up as the engine sets it up, in the library the engine loaded).
// Nothing else runs: no plan, no decode, no epilogue kernel, so its time is the raw cuBLASLt
// time of that precision, layout and shape. It is a benchmark floor, not an engine entry
// point: the bytes are taken as they are (bench/bench_linear.py passes the buffers of real
// quantized tensors).
#include "raw_gemm.hpp"

#if defined(QRECIPE_RAW_GEMM)
#include <ATen/ATen.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "qrecipe/error.hpp"
#include "raw_cublaslt.hpp"  // bench/: the benchmarks' raw cuBLASLt GEMM
#endif

namespace qrecipe::python {

#if defined(QRECIPE_RAW_GEMM)
namespace {

namespace py = pybind11;

struct Operand {
  const char* what;  // "operand A", "operand B"
  const at::Tensor& data;
  const std::string& dtype;
  const std::optional<at::Tensor>& scale;
  const std::string& scale_mode;
};

cudaDataType_t data_type(const Operand& o) {
  if (o.dtype == "e4m3" || o.dtype == "e5m2") {
    QR_CHECK(o.data.scalar_type() == at::kByte, "raw_cublaslt_gemm: ", o.what, " of dtype ",
             o.dtype, " must be its FP8 bytes as a torch.uint8 tensor, got ",
             c10::toString(o.data.scalar_type()));
    QR_CHECK(o.scale.has_value(), "raw_cublaslt_gemm: ", o.what, " is FP8 and needs its "
             "scale_inv tensor (cuBLASLt's FP8 GEMMs read one)");
    return o.dtype == "e4m3" ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  }
  QR_CHECK(o.dtype == "bf16", "raw_cublaslt_gemm: ", o.what, " dtype '", o.dtype,
           "' is not known; expected 'e4m3', 'e5m2' or 'bf16'");
  QR_CHECK(o.data.scalar_type() == at::kBFloat16, "raw_cublaslt_gemm: ", o.what,
           " of dtype bf16 must be a torch.bfloat16 tensor, got ",
           c10::toString(o.data.scalar_type()));
  QR_CHECK(!o.scale.has_value(), "raw_cublaslt_gemm: ", o.what, " is BF16 and takes no scale");
  return CUDA_R_16BF;
}

// The cuBLASLt scale mode of a scale layout: what gemm_cuda.cpp's native_operand picks.
cublasLtMatmulMatrixScale_t scale_mode(const Operand& o) {
  if (o.scale_mode == "tensor") return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  if (o.scale_mode == "1x128") return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  if (o.scale_mode == "128x128") return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  QR_THROW("raw_cublaslt_gemm: ", o.what, " scale_mode '", o.scale_mode, "' is not known; "
           "expected 'tensor' (one FP32 scale_inv), '1x128' or '128x128' (FP32 block scales in "
           "the GEMM-ready layout)");
}

void check_on(const at::Tensor& t, const at::Tensor& out, const char* what) {
  QR_CHECK(t.is_cuda() && t.device() == out.device(), "raw_cublaslt_gemm: ", what, " is on ",
           t.device().str(), "; every tensor must be on the output's CUDA device (",
           out.device().str(), ")");
  QR_CHECK(t.is_contiguous(), "raw_cublaslt_gemm: ", what, " of shape ", t.sizes(),
           " is not contiguous");
}

// Our K-major operand [outer, K] row-major.
raw_cublaslt::Operand k_major(const Operand& o) {
  raw_cublaslt::Operand x;
  x.data = o.data.data_ptr();
  x.type = data_type(o);
  x.outer = o.data.size(0);
  if (o.scale) {
    x.scale = o.scale->data_ptr();
    x.scale_mode = scale_mode(o);
  }
  return x;
}

void raw_cublaslt_gemm(const at::Tensor& a, const std::string& a_dtype, const at::Tensor& b,
                       const std::string& b_dtype, const at::Tensor& out,
                       const std::optional<at::Tensor>& a_scale, const std::string& a_scale_mode,
                       const std::optional<at::Tensor>& b_scale, const std::string& b_scale_mode,
                       bool fast_accumulation, CurrentStreamFn current_stream) {
  QR_CHECK(out.is_cuda(), "raw_cublaslt_gemm: the output must be a CUDA tensor, got one on ",
           out.device().str());
  QR_CHECK(out.dim() == 2 && out.is_contiguous() &&
               (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat),
           "raw_cublaslt_gemm: the output must be a contiguous 2-D torch.bfloat16 or "
           "torch.float32 tensor, got ", c10::toString(out.scalar_type()), " of shape ",
           out.sizes());
  const Operand oa{"operand A", a, a_dtype, a_scale, a_scale_mode};
  const Operand ob{"operand B", b, b_dtype, b_scale, b_scale_mode};
  for (const Operand* o : {&oa, &ob}) {
    check_on(o->data, out, o->what);
    QR_CHECK(o->data.dim() == 2, "raw_cublaslt_gemm: ", o->what, " must be 2-D [outer, K] "
             "(K-major), got shape ", o->data.sizes());
    if (o->scale) {
      check_on(*o->scale, out, "a scale tensor");
      QR_CHECK(o->scale->scalar_type() == at::kFloat, "raw_cublaslt_gemm: the scale of ",
               o->what, " must be torch.float32, got ", c10::toString(o->scale->scalar_type()));
    }
  }
  const std::int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  QR_CHECK(b.size(1) == k && out.size(0) == m && out.size(1) == n, "raw_cublaslt_gemm: shapes "
           "do not make out[M, N] = A[M, K] . B[N, K]^T: A ", a.sizes(), ", B ", b.sizes(),
           ", out ", out.sizes());

  raw_cublaslt::Gemm x;
  x.device = out.device().index();
  x.a = k_major(oa);
  x.b = k_major(ob);
  x.k = k;
  x.out = out.data_ptr();
  x.out_type = out.scalar_type() == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  x.fast_accumulation = fast_accumulation;
  const auto stream = static_cast<cudaStream_t>(current_stream(x.device));
  try {
    py::gil_scoped_release no_gil;
    raw_cublaslt::run(x, stream);
  } catch (const raw_cublaslt::Unsupported& e) {
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "raw_cublaslt_gemm: cuBLASLt (",
                  raw_cublaslt::library_description(), ") has no algorithm for ", a_dtype, " (",
                  a_scale_mode, ") x ", b_dtype, " (", b_scale_mode, ") at ", m, "x", n, "x", k,
                  ": ", e.what());
  } catch (const std::runtime_error& e) {
    QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "raw_cublaslt_gemm ", a_dtype, " (", a_scale_mode,
                  ") x ", b_dtype, " (", b_scale_mode, ") at ", m, "x", n, "x", k, ": ", e.what());
  }
}

}  // namespace
#endif

void bind_raw_gemm(pybind11::module_& m, CurrentStreamFn current_stream) {
#if defined(QRECIPE_RAW_GEMM)
  m.def("raw_cublaslt_gemm",
        [current_stream](const at::Tensor& a, const std::string& a_dtype, const at::Tensor& b,
                         const std::string& b_dtype, const at::Tensor& out,
                         const std::optional<at::Tensor>& a_scale,
                         const std::string& a_scale_mode,
                         const std::optional<at::Tensor>& b_scale,
                         const std::string& b_scale_mode, bool fast_accumulation) {
          raw_cublaslt_gemm(a, a_dtype, b, b_dtype, out, a_scale, a_scale_mode, b_scale,
                            b_scale_mode, fast_accumulation, current_stream);
        },
        pybind11::arg("a"), pybind11::arg("a_dtype"), pybind11::arg("b"),
        pybind11::arg("b_dtype"), pybind11::arg("out"), pybind11::arg("a_scale") = std::nullopt,
        pybind11::arg("a_scale_mode") = "tensor", pybind11::arg("b_scale") = std::nullopt,
        pybind11::arg("b_scale_mode") = "tensor", pybind11::arg("fast_accumulation") = false,
        "Benchmarks only: out[M, N] = A[M, K] . B[N, K]^T (both K-major) as one raw cuBLASLt "
        "GEMM (the benchmarks' helper, set up as the engine's), on torch's current stream. dtypes 'e4m3', "
        "'e5m2' (uint8 bytes, with an FP32 scale_inv tensor) or 'bf16'; scale modes 'tensor', "
        "'1x128', '128x128'.");
#else
  (void)m;
  (void)current_stream;
#endif
}

}  // namespace qrecipe::python
