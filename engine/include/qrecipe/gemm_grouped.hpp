// Grouped GEMMs: the same GEMM of a linear layer for G groups at once (MoE experts), one launch
// on the GPU where a grouped kernel serves the operands (docs/gemm.md "Grouped GEMMs").
//
// For every group g (the three GEMMs of gemm.hpp, group by group):
//   out_g = alpha * opA_g . opB_g^T  (+ out_g if accumulate)  (+ bias_g[j])
//   fprop  y_g  [m_g, N] = x_g  rowwise    . W_g rowwise
//   dgrad  dx_g [m_g, K] = dy_g rowwise    . W_g columnwise
//   wgrad  dW_g [N, K]   = dy_g columnwise . x_g columnwise        (grouped along the contraction)
//
// An operand is either one GemmOperand per group (shapes on the host), or ONE tensor whose rows
// the call's GroupSplits divide into the groups ("split"): a GroupedQuantizedTensor direction or
// a dense [total, cols] F32/BF16 tensor. A split operand used rowwise gives the group's output
// rows (fprop, dgrad), one used columnwise the group's contraction (wgrad). The output is one
// tensor per group, or one [total, n] tensor split like the operands (fprop, dgrad).
//
// Execution:
//   CPU   every group is qrecipe::gemm (the reference), so results equal per-group GEMMs bit
//         for bit; split operands are cut by the splits (offsets in host memory).
//   CUDA  the grouped kernels (CUTLASS SM90 ptr-array GEMMs, engine/src/gemm/cuda/cutlass/)
//         when plan_gemm_grouped says so: the group pointers and sizes are built on the device
//         by a small kernel, so splits that only the device knows never reach the host.
//         Otherwise, with host-known shapes, one qrecipe::gemm per group (the plan says why);
//         with device splits, an error (QR_STATUS_UNSUPPORTED) that says why and what to do:
//         the engine never waits for the device to read the splits.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "qrecipe/gemm.hpp"
#include "qrecipe/grouped_tensor.hpp"

namespace qrecipe {

struct GroupedOperand {
  // One operand per group...
  std::span<const GemmOperand> groups;
  // ...or one split tensor: a quantized grouped tensor (with the quantizer that made it) or a
  // dense [total, cols] F32/BF16 tensor (contiguous).
  const GroupedQuantizedTensor* tensor = nullptr;
  const Quantizer* quantizer = nullptr;
  TensorView dense;
  qr_direction direction = QR_DIRECTION_ROWWISE;

  static GroupedOperand per_group(std::span<const GemmOperand> groups) {
    GroupedOperand o;
    o.groups = groups;
    return o;
  }
  static GroupedOperand split(const GroupedQuantizedTensor& t, const Quantizer& q, qr_direction d) {
    GroupedOperand o;
    o.tensor = &t;
    o.quantizer = &q;
    o.direction = d;
    return o;
  }
  static GroupedOperand split_dense(const TensorView& t, qr_direction d) {
    GroupedOperand o;
    o.dense = t;
    o.direction = d;
    return o;
  }
  bool is_split() const { return groups.empty(); }
  bool is_quantized() const;
  // Columns of a split tensor (its groups' fixed dimension).
  std::int64_t split_cols() const;
  std::string str() const;  // "64 groups: myformat e4m3 ... rowwise" / "split myformat e4m3 [T x 2048] rowwise"
};

struct GroupedOutput {
  std::span<const TensorView> groups;  // [outer(A_g), outer(B_g)] per group, F32 or BF16...
  TensorView split;                    // ...or [total, n], rows split by the splits
  bool is_split() const { return groups.empty(); }
};

struct GroupedGemmOptions {
  GemmKind kind = GemmKind::fprop;  // decides a native FP8 GEMM's accumulation (as gemm.hpp)
  float alpha = 1.0f;
  bool accumulate = false;
  // One bias per group ([outer(B_g)] of bias_dtype, on the output's device; nullptr: none), or
  // empty for no bias at all.
  std::span<const void* const> bias;
  DType bias_dtype = DType::f32;
  // Required when an operand or the output is split; its `total` is the split tensors' rows.
  const GroupSplits* splits = nullptr;
  void* stream = nullptr;  // cudaStream_t for CUDA operands
};

// How a grouped GEMM runs.
struct GroupedGemmPlan {
  enum class Mode {
    grouped,    // every group in one grouped kernel launch (CUDA), or the CPU reference
    per_group,  // one qrecipe::gemm per group (host-known shapes only)
    refused     // device splits the grouped kernels cannot serve: gemm_grouped throws
  };
  Mode mode = Mode::grouped;
  GemmPlan gemm;       // the pairing of the operands (native / emulated / dense / reference)
  std::string reason;  // why this mode
  std::string str() const;  // "one launch: native (CUTLASS grouped FP8 e4m3 x e4m3, ...)"
};

// Whether this build has the grouped kernels (CUDA with CUTLASS headers at configure time).
// Without them a CUDA grouped GEMM runs one qrecipe::gemm per group and device splits are
// refused (the plans say so).
bool grouped_kernels_built();

// The plan for `kind` with operands like `a` and `b` on `target`: `out` the output dtype,
// `n` the fixed output columns and `k_or_m` the other fixed extent (K for fprop/dgrad, whose
// groups vary in rows; M for wgrad, whose groups vary in the contraction). `device_split`:
// the splits live on the device (then a plan that needs host shapes is `refused`).
GroupedGemmPlan plan_gemm_grouped(GemmKind kind, const OperandTraits& a, const OperandTraits& b,
                                  DType out, bool accumulate, bool bias, std::int64_t n,
                                  std::int64_t k_or_m, GemmTarget target, bool device_split);

// Runs the GEMM of every group (see the top of this file); returns the plan that ran. Throws on
// shape mismatches (naming the group), a missing direction, operands on different devices,
// and device splits without a grouped kernel for the operands. CUDA work is asynchronous on
// options.stream.
GroupedGemmPlan gemm_grouped(const GroupedOperand& a, const GroupedOperand& b,
                             const GroupedOutput& out, const GroupedGemmOptions& options);

}  // namespace qrecipe
