// The one raw cuBLASLt GEMM of the benchmarks: the floor qrecipe's GEMMs are measured against
// (bench/bench_gemm.cu's raw side, and qrecipe._C.raw_cublaslt_gemm, with which
// bench/bench_linear.py floors a Linear step). A small static library, outside the engine on
// purpose: libqrecipe exports no cuBLASLt layer (cmake/libqrecipe.version).
//
// The GEMM is the one the engine issues for a native (FP8) or BF16 pair, set up as the engine
// sets it up (engine/src/gemm/cuda/cublaslt.cpp), and nothing around it: no plan, no decode,
// no epilogue kernel:
//   out[M, N] = A[M, K] . B[N, K]^T, both operands K-major ([outer, K] row-major), issued as
//   the TN cuBLASLt GEMM D = op(A_c) op(B_c) with A_c = our B (op T), B_c = our A (op N),
//   m = N, n = M (the engine's transposition convention, gemm_cuda.cpp); FP32 compute and
//   scale type; FP8: CUBLASLT_MATMUL_DESC_FAST_ACCUM as asked, each operand's scale mode and
//   scale pointer; default epilogue; host alpha = 1, beta = 0; a 32 MiB workspace; the
//   heuristic's minimum alignments from the actual pointers, and its first algorithm.
// Same library, same descriptors, same heuristic inputs: on the same buffers it gives the
// engine's native GEMM bit for bit (tests/python/test_raw_gemm.py checks that).
//
// cuBLASLt is loaded, never linked (as the engine does): the libcublasLt.so.<major> the
// process already holds (the engine loads it on its first GPU GEMM, so both sides of a
// comparison use one library), else $QRECIPE_CUBLASLT_LIBRARY, else the library through the
// dynamic loader's search.
//
// Errors are exceptions: Unsupported when cuBLASLt has no algorithm for the combination,
// std::runtime_error (naming the call, its status and the GEMM) for anything else.
// Not thread-safe across threads sharing one Prepared; run() keeps its state per thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace raw_cublaslt {

// One K-major operand: `outer` rows of K values, [outer, K] row-major on the GEMM's device.
struct Operand {
  const void* data = nullptr;
  cudaDataType_t type = CUDA_R_16BF;  // CUDA_R_16BF, CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2
  std::int64_t outer = 0;
  // FP8 only (required there): the device scale_inv the mode reads.
  const void* scale = nullptr;
  cublasLtMatmulMatrixScale_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

// out[a.outer, b.outer] (row-major, CUDA_R_16BF or CUDA_R_32F) = A . B^T over k.
struct Gemm {
  Operand a, b;
  std::int64_t k = 0;
  void* out = nullptr;
  cudaDataType_t out_type = CUDA_R_16BF;
  bool fast_accumulation = false;  // FP8 only
  int device = 0;                  // where every buffer lives
};

// cuBLASLt has no algorithm for this combination (its heuristic says so, or the first
// cublasLtMatmul answers CUBLAS_STATUS_NOT_SUPPORTED).
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
class Combination;  // raw_cublaslt.cpp: the cuBLASLt objects of one prepared combination
}

// One prepared GEMM: descriptors, layouts and the heuristic's algorithm, made once for these
// shapes, types, scale modes and pointer alignments. run() enqueues it on `stream` with the
// buffers it was prepared with (they must stay valid).
class Prepared {
 public:
  explicit Prepared(const Gemm& gemm);  // throws Unsupported / std::runtime_error
  ~Prepared();
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  void run(cudaStream_t stream) const;

 private:
  Gemm gemm_;
  std::unique_ptr<detail::Combination> combination_;
};

// Runs `gemm` on `stream`, preparing it on first use per thread and combination (everything the
// heuristic sees) and reusing that preparation afterwards, as the engine does.
void run(const Gemm& gemm, cudaStream_t stream);

// "<path> (cuBLASLt <version>)" of the loaded library; loads it when needed.
std::string library_description();

}  // namespace raw_cublaslt
