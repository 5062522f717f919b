// The small CUDA kernels around the engine's cuBLASLt GEMMs (internal header, CUDA builds only;
// implemented in gemm_cuda_kernels.cu). No CUDA types here, so gemm_cuda.cpp stays plain C++.
//
// Every entry enqueues on `stream` (a cudaStream_t; nullptr = legacy default stream) on the
// current device and throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the launch that
// failed. Matrices are row-major and contiguous. The arithmetic is the CPU reference's
// epilogue, operation for operation (the engine is compiled with -fmad=false): see finish().
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>

QR_INTERNAL_BEGIN
namespace qrecipe::detail::gemm_kernels {

// dst[i] = f32(src[i]) for n BF16 values (exact).
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, void* stream);

// out[i][j] += bias[j] for an FP32 [rows, cols] output (the bias the CPU adds last).
void add_bias_f32(float* out, const float* bias, std::int64_t rows, std::int64_t cols, void* stream);

// The CPU reference's epilogue for an output cuBLASLt could not write directly:
//   v = product ? product[i][j] : alpha * 0.0f    (product already holds alpha * AB)
//   if accumulate: v += out[i][j]
//   if bias:       v += bias[j]
//   out[i][j] = v, rounded to BF16 (RNE) when out_bf16, else stored as FP32.
// product may be out itself only for an FP32 output without accumulate (the bias pass); it
// never aliases bias. rows * cols may be 0. Four elements per thread when cols % 4 == 0.
void finish(void* out, bool out_bf16, const float* product, float alpha, bool accumulate,
            const float* bias, std::int64_t rows, std::int64_t cols, void* stream);

// ---------------------------------------------------------------- emulated GEMM operands
//
// The emulated GEMMs (docs/gemm.md) decode each quantized operand to BF16 in the order
// its data is stored ([rows, cols] row-major as stored, transposed or not) and move what a BF16
// value cannot carry exactly into the GEMM's alpha:
//   per-tensor FP8:      the code's value (exact in BF16: E4M3 and E5M2 are subsets of it);
//                        the FP32 scale_inv goes to alpha
//   E2M1 x E4M3 blocks:  q * s: at most 2 x 4 significant bits, magnitudes in [2^-10, 2688],
//                        always exact in BF16; with a block-and-tensor scale mode, the
//                        tensor factor (tensor_decode_factor of the stored amax and the
//                        format's tensor_scale_numerator, plugin_abi.h) goes to alpha
//   FP8 x E8M0 blocks:   q * 2^(e-127): exact unless the product falls below BF16's
//                        subnormal grid (2^-133), which needs e <= 2 (E4M3) or e <= 9 (E5M2)
//   FP8 x FP32 blocks:   q * s in FP32: exact when s is a power of two >= 2^-124 (E4M3) /
//                        2^-117 (E5M2), and otherwise only by luck
// The last two depend on the data, so their decoders check every value they write (a block
// whose scale proves it exact costs nothing more) and record a miss in an ExactnessFlag. The
// host never reads that flag: the BF16 GEMM runs anyway, and exact_gemm_if_flagged() then
// recomputes the whole output from the stored operands in FP32 (the reference decode), on the
// device, only when the flag says so. See gemm_cuda.cpp ("the emulated path").

enum class Code : std::int32_t { e4m3, e5m2, e2m1, bf16 };  // bf16: a dense operand (exact GEMM only)
enum class BlockScale : std::int32_t { none, e8m0, e4m3, f32 };

// One stored direction as the decoder reads it. The block grid and the scale index are in the
// stored frame: element (p, q) of the stored [rows, cols] array belongs to block
// (p >> block_rows_log2, q >> block_cols_log2), whose scale is at
//   scale_transposed ? bq * scale_ld + bp : bp * scale_ld + bq.
struct StoredOperand {
  const void* data = nullptr;      // codes; E2M1 packed two per byte, ceil(cols / 2) bytes a row
  Code code = Code::e4m3;
  std::int64_t rows = 0, cols = 0;
  BlockScale scale = BlockScale::none;
  const void* scales = nullptr;
  std::int64_t scale_ld = 0;
  int block_rows_log2 = 0, block_cols_log2 = 0;
  bool scale_transposed = false;
};

// What multiplies alpha for one operand, read on the device when the GEMM is enqueued.
enum class Factor : std::int32_t {
  none,       // 1
  value,      // *ptr (a per-tensor FP32 scale_inv)
  from_amax,  // tensor_decode_factor(*ptr, numerator): *ptr is the stored amax, numerator the
              // owning format's tensor_scale_numerator (qrecipe/scaling.hpp, plugin_abi.h)
};

// One operand's factor: its kind, the device pointer it reads, and (from_amax) the numerator.
struct FactorSource {
  Factor kind = Factor::none;
  const float* ptr = nullptr;
  float numerator = 0.0f;
};

// The GEMM's scalars in device memory: out[0] = out[2] = alpha * (factor_a * factor_b),
// out[1] = beta, out[3] = 0 ([alpha, beta] for a GEMM into the output, [alpha, 0] for one into
// an FP32 product buffer). Computed by one thread of the first decode launch (or by its own).
struct Scalars {
  float* out = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  FactorSource factor[2];
};

// A device word that a decoder sets to `epoch` when it writes a value BF16 could not hold
// exactly. Epochs let one word serve every GEMM of a stream without a reset: a word left from
// an earlier GEMM holds an older epoch. word == nullptr: nothing is checked.
struct ExactnessFlag {
  std::uint32_t* word = nullptr;
  std::uint32_t epoch = 0;
};

// One operand to decode: `op` into dst ([op.rows, op.cols] BF16, row-major). check: the
// decoder tests every value it writes and sets the flag on a miss (only FP8 codes with E8M0
// or FP32 block scales can miss; the others are exact by construction).
struct DecodeJob {
  StoredOperand op;
  std::uint16_t* dst = nullptr;
  bool check = false;
};

// Decodes `count` (0 to 2) operands: block scales applied, per-tensor factors not. Operands
// whose rows are whole 8-element units (cols % 8 == 0, aligned buffers) share one launch that
// reads 8 FP8 bytes (or 4 E2M1 bytes) and writes one 16-byte store per 8 elements; others run
// one element per thread. When scalars.out is set, the scalars are written too (by their own
// launch when count is 0). A value that misses exactness is truncated (the exact GEMM
// replaces the result).
void decode_to_bf16(const DecodeJob* jobs, int count, const Scalars& scalars, const ExactnessFlag& flag,
                    void* stream);

// Sets the flag (*flag.word = flag.epoch) when *a or *b (either may be nullptr) is nonzero: the
// miss words of decoded copies kept with their tensors (QuantizedTensor::decoded), written
// when the copy was decoded, so a GEMM that reuses a copy recomputes exactly as one that
// decoded it now would.
void inherit_misses(const std::uint32_t* a, const std::uint32_t* b, const ExactnessFlag& flag, void* stream);

// Copies `bytes` from src to dst when *flag.word == flag.epoch; otherwise returns at once.
// (Saves an output that an accumulating GEMM is about to overwrite, for the exact GEMM.)
void copy_if_flagged(void* dst, const void* src, std::int64_t bytes, const ExactnessFlag& flag, void* stream);

// ---------------------------------------------------------------- the exact GEMM

// One operand of the exact GEMM: its stored array (a dense BF16 operand has code bf16 and no
// scales) is [outer, inner] when k_major, else [inner, outer]; `factor` is its per-tensor
// factor, applied per element as the reference decode does.
struct ExactOperand {
  StoredOperand stored;
  bool k_major = true;
  FactorSource factor;
};

// out [m, n] = the CPU reference GEMM of gemm/gemm_cpu.cpp on the same operands, up to the order of
// the FP32 sums: every element decoded as the plugin's reference dequantize does (code *
// block scale, then * per-tensor factor: (q * s) * factor), FP32 accumulation, then
// v = alpha * acc; v += old (accumulate); v += bias[j]; stored as FP32 or rounded to BF16.
// `old` holds the output as it was before the GEMM (may be out itself when nothing
// overwrote it; unused without accumulate).
struct ExactGemm {
  ExactOperand a, b;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  bool accumulate = false;
  const void* old = nullptr;
  const float* bias = nullptr;
  void* out = nullptr;
  bool out_bf16 = false;
};

// Runs the exact GEMM when *flag.word == flag.epoch; otherwise every block returns at once
// (a persistent grid of two blocks per SM of `device`, so the unflagged case costs one short
// launch). A SIMT kernel (128 x 128 tiles, no tensor cores): far slower than the BF16 GEMM,
// for the rare data that needs it.
void exact_gemm_if_flagged(const ExactGemm& gemm, const ExactnessFlag& flag, int device, void* stream);

// Only the scalars (when no operand is decoded).
void write_scalars(const Scalars& scalars, void* stream);

// Multiprocessors of `device` (cached; 132, an H100's, if the query fails: only grid sizes
// depend on it).
int multiprocessor_count(int device);

}  // namespace qrecipe::detail::gemm_kernels
QR_INTERNAL_END
