// Entry of the CUTLASS grouped GEMMs (internal; CUDA builds with CUTLASS headers). No CUTLASS or
// CUDA types here: grouped_cuda.cpp calls it with device tables (grouped_tables.hpp) and the
// instantiations live in a few translation units (fp8_e4m3.cu, fp8_e5m2.cu, block_scaled.cu,
// bf16.cu; two or three kernels each), because each kernel costs about a minute of nvcc time.
//
// Every kernel is a CUTLASS 3 SM90 ptr-array grouped GEMM (GemmUniversal with
// GroupProblemShape, TMA + warp-specialized cooperative schedule, persistent group tile
// scheduler) with D = alpha_g * A_g B_g^T (+ D_g), where A_g is [M_g, K_g] and B_g [N_g, K_g],
// both K-major, and D_g row-major [M_g, N_g]. Before it, one small kernel turns the tables into
// CUTLASS's argument arrays on the device (problem sizes, pointers, strides, each group's alpha
// = alpha * (factor_a(g) * factor_b(g)); for block-scaled kernels, the block scales repacked into the
// layout CUTLASS reads), so the group sizes never reach the host: the kernel is launched
// without host problem shapes (its persistent grid comes from the SM count). Groups with
// K_g = 0 are given the empty problem (the caller writes their epilogue); groups with M_g = 0
// have no tiles.
//
// Tiles (CUTLASS's Hopper grouped examples 57 and 68): FP8 fast-accumulation 256x128x128 and
// BF16 256x128x64 cooperative; FP8 split-accumulation and block-scaled 128x128x128 cooperative
// (a split kernel's second accumulator does not fit a 256x128 tile's registers); all with 1x2x1
// clusters.
#pragma once

#include "internal_visibility.hpp"

#include <cstddef>
#include <cstdint>

#include "gemm/cuda/grouped_tables.hpp"
#include "gemm/grouped_kernels.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail::grouped {

// Device scratch for one call: `bytes` (256-byte aligned) in slot `slot`, valid for work queued
// on the call's stream after the request (the engine's per-stream scratch, reused call after call).
using ScratchFn = void* (*)(void* ctx, std::size_t bytes, int slot);
inline constexpr int kCutlassScratchSlot = 0;  // the caller's other slots start at 1

struct CutlassArgs {
  GroupedKernel kernel = GroupedKernel::none;
  bool out_f32 = false;
  int groups = 0;
  const GroupOperand* a = nullptr;  // device tables: K-major stored operands (ld in elements)
  const GroupOperand* b = nullptr;
  const GroupOutput* out = nullptr;
  OperandInfo info_a, info_b;       // factors (per-tensor scale_inv) and block-scale layout
  float alpha = 1.0f;
  bool accumulate = false;
  // Block-scaled kernels: bounds on the scale elements of all groups of A and of B once repacked
  // (the host knows them for any split).
  std::int64_t max_scales_a = 0, max_scales_b = 0;
  int device = 0;
  int sm_count = 0;
  void* stream = nullptr;
  ScratchFn scratch = nullptr;
  void* scratch_ctx = nullptr;
  // "fprop 64 groups: myformat ... x ...", built only for messages.
  const char* what = "";
};

// The translation units' entries (each dispatches on args.kernel and args.out_f32 among the
// kernels it instantiates; a combination it lacks is an internal error).
void run_fp8_e4m3(const CutlassArgs& args);   // fp8_e4m3.cu: e4m3 x e4m3, fast and split -> bf16
void run_fp8_e5m2(const CutlassArgs& args);   // fp8_e5m2.cu: e5m2 x e4m3 split -> bf16, f32
void run_block_scaled(const CutlassArgs& args);  // block_scaled.cu: 1x128 x 128x128 -> bf16,
                                              //   1x128 x 1x128 -> bf16, f32
void run_bf16(const CutlassArgs& args);       // bf16.cu: bf16 x bf16 -> bf16, f32

inline void run_cutlass(const CutlassArgs& args) {
  switch (args.kernel) {
    case GroupedKernel::fp8_e4m3_e4m3_fast:
    case GroupedKernel::fp8_e4m3_e4m3: return run_fp8_e4m3(args);
    case GroupedKernel::fp8_e5m2_e4m3: return run_fp8_e5m2(args);
    case GroupedKernel::block_1x128_128x128:
    case GroupedKernel::block_1x128_1x128: return run_block_scaled(args);
    case GroupedKernel::bf16: return run_bf16(args);
    case GroupedKernel::none: break;
  }
}

}  // namespace qrecipe::detail::grouped
QR_INTERNAL_END
