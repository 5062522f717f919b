// The device tables of a grouped GEMM (internal, CUDA builds): what every grouped kernel reads
// about each group. Plain structs (no CUDA or CUTLASS types), shared by the host code
// (grouped_cuda.cpp), the helper kernels (grouped_cuda_kernels.cu) and the CUTLASS
// instantiations (cutlass/*.cu).
//
// A grouped GEMM first writes, on the device, one GroupOperand per group for A and for B and
// one GroupOutput per group, whatever the host knows: per-group tensors (their pointers travel
// in kernel parameters), a plugin's device table (qr_group_entry, plugin_abi.h) or a dense
// split tensor with its offsets. Every later kernel (decode, CUTLASS argument set-up, K = 0
// epilogue, exact recompute) reads only these tables, so the group sizes never reach the host.
#pragma once

#include "internal_visibility.hpp"

#include <cstdint>

#include "gemm/cuda/gemm_cuda_kernels.hpp"
#include "qrecipe/plugin_abi.h"

QR_INTERNAL_BEGIN
namespace qrecipe::detail::grouped {

using gemm_kernels::BlockScale;
using gemm_kernels::Code;
using gemm_kernels::Factor;

// What every group of an operand shares (host-known), in the stored frame: element (p, q) of
// a group's stored [rows, cols] array belongs to block (p >> block_rows_log2,
// q >> block_cols_log2) whose scale is at
//   scale_transposed ? bq * scale_ld + bp : bp * scale_ld + bq.
struct OperandInfo {
  Code code = Code::bf16;             // bf16: a dense BF16 operand (no scales)
  BlockScale scale = BlockScale::none;
  Factor factor = Factor::none;       // per group: tensor scale_inv (value) or amax (from_amax)
  float numerator = 0.0f;             // from_amax: the owning format's tensor_scale_numerator
  std::int32_t block_rows_log2 = 0, block_cols_log2 = 0;
  bool scale_transposed = false;
  bool k_major = true;                // stored [outer, inner] (else [inner, outer])
  bool check = false;                 // decoded values must be checked for BF16 exactness
};

// One group of one operand (device memory).
struct GroupOperand {
  const void* data = nullptr;
  const void* scales = nullptr;      // block scales (2-D, scale_ld), or nullptr
  const float* factor = nullptr;     // OperandInfo::factor's value (scale_inv or amax)
  std::int64_t rows = 0, cols = 0;   // stored extents
  std::int64_t ld = 0;               // elements between stored rows
  std::int64_t scale_ld = 0;
};

// One group's output: rows x cols, row-major with leading dimension ld.
struct GroupOutput {
  void* data = nullptr;
  std::int64_t rows = 0, cols = 0, ld = 0;
};

// Outer and inner extents of a group of an operand.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline std::int64_t outer_of(const GroupOperand& g, bool k_major) { return k_major ? g.rows : g.cols; }
#if defined(__CUDACC__)
__host__ __device__
#endif
inline std::int64_t inner_of(const GroupOperand& g, bool k_major) { return k_major ? g.cols : g.rows; }

// Where the describe kernel takes an operand's groups from.
enum class Source : std::int32_t {
  host,          // the kernel parameter table (host-known groups)
  plugin_table,  // a qr_group_entry table (a device-split quantized tensor)
  dense_split,   // rows of a dense [total, cols] tensor cut by the splits' offsets
};

struct OperandSource {
  Source source = Source::host;
  // plugin_table: the entries, whether the data is stored transposed ([cols, rows_g]) and the
  // split tensor's columns; the factor comes from the entry's scale_inv (value) or amax
  // (from_amax) as OperandInfo::factor says.
  const qr_group_entry* entries = nullptr;
  bool transposed = false;
  Factor factor = Factor::none;
  // dense_split: the tensor and its element size; plugin_table / dense_split: its columns.
  const void* base = nullptr;
  std::int32_t element_bytes = 0;
  std::int64_t cols = 0;
};

struct OutputSource {
  Source source = Source::host;  // host or dense_split (a [total, cols] output)
  void* base = nullptr;
  std::int32_t element_bytes = 0;
  std::int64_t cols = 0;
};

// Host-known groups travel in the describe kernel's parameters, this many per launch.
inline constexpr int kHostGroupsPerLaunch = 96;

struct HostTable {
  GroupOperand a[kHostGroupsPerLaunch];
  GroupOperand b[kHostGroupsPerLaunch];
  GroupOutput out[kHostGroupsPerLaunch];
  GroupOutput old[kHostGroupsPerLaunch];  // where a saved output is (accumulate + exact check)
};
static_assert(sizeof(HostTable) + 512 <= 32764, "the host table must fit the kernel parameters");

}  // namespace qrecipe::detail::grouped
QR_INTERNAL_END
