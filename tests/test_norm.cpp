// The fused RMSNorm's entry checks (qrecipe/norm.hpp): every bad tensor is refused with the
// tensor named, before any CUDA call, so these run on any machine. The CUDA views below carry
// a pointer that is never dereferenced (the checks fail first). Numerics against Hugging
// Face's formula: tests/python/test_rms_norm_cuda.py on a GPU.
#include <doctest/doctest.h>

#include <cstdint>

#include "qrecipe/error.hpp"
#include "qrecipe/norm.hpp"

using namespace qrecipe;

namespace {

// A CUDA view whose memory is never touched.
TensorView cuda_view(DType t, std::initializer_list<std::int64_t> shape) {
  static float never_read[1];
  return TensorView(never_read, t, shape, Device::cuda(0));
}

}  // namespace

TEST_CASE("rms_norm refuses CPU tensors and names the torch formula instead") {
  float x[8] = {}, w[4] = {}, y[8] = {}, r[2] = {};
  const TensorView xv(x, DType::f32, {2, 4}), wv(w, DType::f32, {4}), yv(y, DType::f32, {2, 4}),
      rv(r, DType::f32, {2});
  CHECK_THROWS_WITH_AS(rms_norm_forward(xv, wv, 1e-6, yv, rv, TensorView(), nullptr),
                       doctest::Contains("runs on CUDA tensors only"), Error);
  float ws[8] = {};
  CHECK_THROWS_WITH_AS(rms_norm_backward(yv, xv, wv, rv, yv, wv, TensorView(ws, DType::f32, {2, 4}),
                                         nullptr),
                       doctest::Contains("runs on CUDA tensors only"), Error);
}

TEST_CASE("rms_norm_forward names the bad tensor, what it is and what it must be") {
  const TensorView x = cuda_view(DType::bf16, {3, 64});
  const TensorView w = cuda_view(DType::bf16, {64});
  const TensorView y = cuda_view(DType::bf16, {3, 64});
  const TensorView r = cuda_view(DType::f32, {3});
  const TensorView none;
  CHECK_THROWS_WITH_AS(rms_norm_forward(x, cuda_view(DType::bf16, {63}), 1e-6, y, r, none, nullptr),
                       doctest::Contains("weight is bf16 [63] on cuda:0; expected a contiguous bf16 [64]"),
                       Error);
  CHECK_THROWS_WITH_AS(rms_norm_forward(x, cuda_view(DType::f32, {64}), 1e-6, y, r, none, nullptr),
                       doctest::Contains("weight is f32 [64]"), Error);
  CHECK_THROWS_WITH_AS(rms_norm_forward(x, w, 1e-6, cuda_view(DType::f16, {3, 64}), r, none, nullptr),
                       doctest::Contains("y is f16 [3, 64] on cuda:0; expected x's bf16 [3, 64]"),
                       Error);
  CHECK_THROWS_WITH_AS(rms_norm_forward(x, w, 1e-6, y, cuda_view(DType::f32, {4}), none, nullptr),
                       doctest::Contains("float32 tensor of 3 values (one per row of x)"), Error);
  CHECK_THROWS_WITH_AS(rms_norm_forward(x, w, 1e-6, y, r, cuda_view(DType::f32, {3}), nullptr),
                       doctest::Contains("amax is f32 [3] on cuda:0; expected 2 contiguous float32"),
                       Error);
  CHECK_THROWS_WITH_AS(rms_norm_forward(cuda_view(DType::e4m3, {3, 64}), w, 1e-6, y, r, none,
                                        nullptr),
                       doctest::Contains("expected float32, bfloat16 or float16"), Error);
  const std::int64_t wide = kRmsNormMaxHidden + 1;
  CHECK_THROWS_WITH_AS(rms_norm_forward(cuda_view(DType::bf16, {1, wide}),
                                        cuda_view(DType::bf16, {wide}), 1e-6,
                                        cuda_view(DType::bf16, {1, wide}), cuda_view(DType::f32, {1}),
                                        none, nullptr),
                       doctest::Contains("serves at most 49152"), Error);
}

TEST_CASE("rms_norm_backward checks dy, dx, dweight and the workspace") {
  const TensorView x = cuda_view(DType::bf16, {600, 64});
  const TensorView w = cuda_view(DType::bf16, {64});
  const TensorView r = cuda_view(DType::f32, {600});
  const TensorView ws = cuda_view(DType::f32, {600, 64});
  CHECK(rms_norm_backward_partials(600, 64) == 600);
  CHECK(rms_norm_backward_partials(600, 4096) == 512);
  CHECK(rms_norm_backward_partials(100000, 4096) == 512);
  CHECK(rms_norm_backward_partials(100000, 128) == 8192);
  CHECK(rms_norm_backward_partials(100000, 1000) == 1048);
  CHECK(rms_norm_backward_partials(3, 4096) == 3);
  CHECK(rms_norm_backward_partials(0, 64) == 1);
  CHECK_THROWS_AS(rms_norm_backward_partials(5, 0), Error);
  CHECK_THROWS_WITH_AS(rms_norm_backward(cuda_view(DType::bf16, {600, 32}), x, w, r, x, w, ws,
                                         nullptr),
                       doctest::Contains("dy is bf16 [600, 32]"), Error);
  CHECK_THROWS_WITH_AS(rms_norm_backward(x, x, w, r, x, cuda_view(DType::bf16, {32}), ws, nullptr),
                       doctest::Contains("dweight is bf16 [32]"), Error);
  CHECK_THROWS_WITH_AS(rms_norm_backward(x, x, w, r, x, w, cuda_view(DType::f32, {599, 64}),
                                         nullptr),
                       doctest::Contains("at least 600 x 64 values"), Error);
}
