// cuBLASLt for the engine's CUDA GEMMs, loaded lazily (internal header, CUDA builds only).
//
// libqrecipe is compiled against the cuBLASLt header (QRECIPE_CUBLASLT_INCLUDE_DIR) but never
// linked to libcublasLt: the library is dlopen'ed on the first GPU GEMM and every function the
// engine calls is looked up by name into one table (Api). A process that never runs a GPU GEMM
// never needs cuBLASLt, and a missing or wrong library is a clear error naming the library and
// the cuBLAS version this build expects (13.x).
//
// Where the library is looked for, in order:
//   1. $QRECIPE_CUBLASLT_LIBRARY (a full path),
//   2. libcublasLt.so.13 through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache),
//   3. the lib/ and lib64/ folders beside the cuBLASLt headers this build was configured with
//      (the CUDA toolkit, or the nvidia-cublas wheel's nvidia/cu13/lib),
//   4. $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and its targets/ folder.
//
// matmul() runs one cuBLASLt GEMM, D = alpha * op(A) op(B) + beta * C with C = D, plus an
// optional FP32 bias epilogue; alpha and beta are host values or one device array. Per (thread, device) it keeps the cuBLASLt handle; per
// (thread, device, stream) a 32 MiB workspace from the CUDA allocator; per thread the
// prepared descriptors and the heuristic's algorithm, keyed by everything the heuristic sees
// (shapes, leading dimensions, dtypes, transposes, scale modes, epilogue, accumulation mode,
// pointer alignment). Keeping these per thread makes matmul() safe to call from several
// threads without locks: a descriptor is only ever mutated (its scale and bias pointers) by
// the thread that owns it. Handles, workspaces and descriptors live until their thread exits.
#pragma once

#include "internal_visibility.hpp"

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

QR_INTERNAL_BEGIN
namespace qrecipe::cublaslt {

// The cuBLAS major version this build was compiled against (13 with the CUDA 13 toolkit).
inline constexpr int kExpectedMajor = CUBLAS_VER_MAJOR;
// Workspace handed to every cuBLASLt GEMM (what cuBLAS recommends on Hopper).
inline constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// Path and version of the loaded library; loads it on first use. Throws qrecipe::Error
// (QR_STATUS_UNSUPPORTED) when no usable libcublasLt.so.13 is found.
std::string library_description();  // "/usr/local/cuda/lib64/libcublasLt.so.13 (cuBLASLt 130100)"

// One operand in cuBLASLt's column-major terms: `rows` x `cols` as stored (before `op`) with
// leading dimension `ld`. scale: device pointer for the scale mode (nullptr: no scale).
struct Matrix {
  const void* data = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t rows = 0, cols = 0, ld = 0;
  const void* scale = nullptr;
  cublasLtMatmulMatrixScale_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct MatmulArgs {
  int device = 0;
  void* stream = nullptr;            // cudaStream_t
  Matrix a, b;                       // op(a) is m x k, op(b) is k x n
  void* d = nullptr;                 // m x n column-major, leading dimension ldd; also C
  cudaDataType_t d_type = CUDA_R_32F;
  std::int64_t m = 0, n = 0, k = 0, ldd = 0;
  float alpha = 1.0f, beta = 0.0f;   // host scalars
  // When set: [alpha, beta] in device memory on args.device (CUBLASLT_POINTER_MODE_DEVICE),
  // read when the GEMM runs; alpha and beta above are then unused. The emulated GEMMs use it
  // to fold per-tensor factors that live on the device into alpha without a synchronization.
  const float* device_scalars = nullptr;
  const void* bias = nullptr;        // device [m] added by the epilogue, or nullptr
  cudaDataType_t bias_type = CUDA_R_32F;  // FP32, or BF16 (an FP8 GEMM's BF16 output)
  bool fast_accumulation = false;    // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM
  // The GEMM in words for error messages; called only when a message is built (the first call
  // of a combination, or a failure), so the hot path formats no strings.
  std::function<std::string()> what;
};

enum class Outcome { done, unsupported };

// Enqueues the GEMM on args.stream. Returns Outcome::unsupported (and enqueues nothing) when the
// loaded cuBLASLt has no algorithm for this combination: the heuristic answers
// CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_INVALID_VALUE (an operand type, layout or scale
// mode combination it does not accept) or no result, or the first cublasLtMatmul of the
// combination answers CUBLAS_STATUS_NOT_SUPPORTED. The answer is cached and, when `why` is
// given, written there ("CUBLAS_STATUS_NOT_SUPPORTED (...)" or "no algorithm"). Any other
// failure throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the cuBLASLt call, its status
// and args.what.
Outcome matmul(const MatmulArgs& args, std::string* why = nullptr);

// "e4m3", "bf16", ... for messages.
const char* type_name(cudaDataType_t type);

}  // namespace qrecipe::cublaslt
QR_INTERNAL_END
