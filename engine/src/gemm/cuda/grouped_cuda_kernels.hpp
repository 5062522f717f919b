// The small kernels around a grouped GEMM (internal, CUDA builds; grouped_cuda_kernels.cu). No
// CUDA types here, so grouped_cuda.cpp stays plain C++. Every entry enqueues on `stream` (a
// cudaStream_t; nullptr = legacy default stream) and throws qrecipe::Error
// (QR_STATUS_DEVICE_ERROR) naming the launch that failed. What each reads and writes is a
// device table of grouped_tables.hpp; none of them needs the group sizes on the host.
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>

#include "gemm/cuda/grouped_tables.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail::grouped {

// Writes the tables of groups [first, first + count) (count <= kHostGroupsPerLaunch): A and B
// from their sources (host: host.a / host.b; plugin_table; dense_split with `offsets`), the
// output likewise, and `old` (where an accumulating output is saved for the exact recompute:
// host.old, or rows of `old_base` cut by `offsets`) when table_old is set.
struct DescribeArgs {
  OperandSource a, b;
  OutputSource out;
  void* old_base = nullptr;  // split save buffer (dense_split output), else host.old
  const std::int64_t* offsets = nullptr;
  GroupOperand* table_a = nullptr;
  GroupOperand* table_b = nullptr;
  GroupOutput* table_out = nullptr;
  GroupOutput* table_old = nullptr;
  int first = 0, count = 0;
};
void describe(const DescribeArgs& args, const HostTable& host, void* stream);

// Decodes every group of one operand to K-major BF16: group g's stored array (in[g], read as
// `info` says) becomes [outer, inner] BF16 with leading dimension roundup(inner, 8) at
// dst + prefix, and out[g] describes it (code bf16 from then on: no scales; the per-tensor
// factor pointer is kept, so alpha still gets it). Values are those of the dense emulation's
// decoders (block scales applied, per-tensor factors not); with info.check, every value is
// tested and a miss sets *flag.word = flag.epoch for the exact recompute. `layout` is device
// scratch of (groups + 1) * 2 int64. max_tiles bounds the 64 x 64 stored tiles of all groups
// (the grid); dst_elements the BF16 elements dst holds (a group that would not fit is an
// error the host sized away, checked again on the device by skipping it and setting the flag).
struct DecodeArgs {
  OperandInfo info;
  const GroupOperand* in = nullptr;
  GroupOperand* out = nullptr;
  int groups = 0;
  std::uint16_t* dst = nullptr;
  std::int64_t dst_elements = 0;
  std::int64_t* layout = nullptr;
  std::int64_t max_tiles = 0;
  gemm_kernels::ExactnessFlag flag;
};
void decode_to_bf16(const DecodeArgs& args, void* stream);

// The K = 0 groups of a grouped GEMM (an empty sum: the reference writes alpha * 0, plus the
// old output when accumulating): groups whose A has inner extent 0 get that epilogue; every
// other group is left alone. max_elements bounds a group's output elements.
struct EmptySumArgs {
  const GroupOperand* a = nullptr;
  bool a_k_major = true;
  const GroupOutput* out = nullptr;
  int groups = 0;
  float alpha = 1.0f;
  bool accumulate = false;
  bool out_bf16 = false;
  std::int64_t max_elements = 0;
};
void finish_empty_sums(const EmptySumArgs& args, void* stream);

// Copies every group's output (out[g]) to old[g] when *flag.word == flag.epoch (an
// accumulating GEMM whose decoded operands the exact recompute may replace); otherwise returns
// at once.
void save_outputs_if_flagged(const GroupOutput* out, const GroupOutput* old, int groups,
                             bool out_bf16, std::int64_t max_elements,
                             const gemm_kernels::ExactnessFlag& flag, void* stream);

// The exact recompute of a grouped GEMM whose decoded operands missed BF16 exactness: when
// *flag.word == flag.epoch, every group's output becomes the CPU reference GEMM of its stored
// operands (each element decoded as the reference does, factors included, FP32 accumulation,
// then alpha, + old, one rounding); otherwise every block returns at once. A SIMT kernel, for
// the rare data that needs it (gemm_cuda_kernels.hpp, exact_gemm_if_flagged).
struct ExactGroupedArgs {
  OperandInfo info_a, info_b;
  const GroupOperand* a = nullptr;
  const GroupOperand* b = nullptr;
  const GroupOutput* out = nullptr;
  const GroupOutput* old = nullptr;  // accumulate: the saved outputs
  int groups = 0;
  float alpha = 1.0f;
  bool accumulate = false;
  bool out_bf16 = false;
  gemm_kernels::ExactnessFlag flag;
  int device = 0;
};
void exact_grouped_if_flagged(const ExactGroupedArgs& args, void* stream);

}  // namespace qrecipe::detail::grouped
QR_INTERNAL_END
