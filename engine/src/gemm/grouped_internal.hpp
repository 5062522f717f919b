// Internal pieces of qrecipe::gemm_grouped shared by the dispatcher (gemm/grouped_dispatch.cpp)
// and the CUDA back end (gemm/cuda/grouped_cuda.cpp).
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "qrecipe/gemm_grouped.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

// Every group's operands and output as host-shaped GEMM arguments: what the per-group loop
// runs. Split operands are cut by the splits (which the host must be able to read).
struct HostGroups {
  std::vector<GemmOperand> a, b;
  std::vector<TensorView> out;
};
HostGroups host_groups(const GroupedOperand& a, const GroupedOperand& b, const GroupedOutput& out,
                       const GroupedGemmOptions& options, std::int64_t groups);
// One side of it: an operand's groups (`which` names it in errors), or the outputs.
std::vector<GemmOperand> host_operands(const GroupedOperand& op, const GroupedGemmOptions& options,
                                       std::int64_t groups, const char* which);
std::vector<TensorView> host_outputs(const GroupedOutput& out, const GroupedGemmOptions& options);

// qrecipe::gemm for every group in order; errors name the group. Returns `plan` with the
// pairing of the first group that ran (or `plan` as given).
GroupedGemmPlan gemm_per_group(const HostGroups& groups, const GroupedGemmOptions& options,
                               GroupedGemmPlan plan);

// The traits every group of an operand shares (from the first group, or the grouped tensor).
OperandTraits grouped_traits(const GroupedOperand& op);

#if defined(QRECIPE_WITH_CUDA)
// The CUDA back end (gemm/cuda/grouped_cuda.cpp). The arguments were checked by gemm_grouped
// (counts, devices, splits); shapes are checked here or by the per-group loop.
GroupedGemmPlan gemm_grouped_cuda(const GroupedOperand& a, const GroupedOperand& b,
                                  const GroupedOutput& out, const GroupedGemmOptions& options,
                                  std::int64_t groups);
#endif

}  // namespace qrecipe::detail
QR_INTERNAL_END
