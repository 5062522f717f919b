// CUDA entry of grouped blockwise quantization (implemented in blockwise_grouped_kernels.cu,
// compiled only when the plugin is built with CUDA). No CUDA types, so blockwise.cpp can call it.
//
// A grouped source is one [sum(rows_g), cols] tensor whose consecutive row groups (MoE
// experts) are quantized as tensors of their own: each group's data and scales are
// bit-identical to blockwise_ref.cpp applied to that group's rows alone (its 128-row blocks and
// 128 x 128 tiles start at the group's first row and end, partial, at its last). blockwise has
// no tensor-level quantity, so all groups are ONE launch (every requested direction); groups
// travel in the kernel parameters, kMaxGroupsPerLaunch at a time (more groups: one launch per
// chunk).
//
// Like blockwise_kernels.hpp: device pointers, asynchronous on `stream`, `device_index` made
// current for the call, qrecipe::Error (QR_STATUS_DEVICE_ERROR) on a CUDA failure. Scale
// padding is never written (it stays as allocated: zero).
#pragma once

#include <vector>

#include "qrecipe/checked.hpp"

#include "blockwise_kernels.hpp"

namespace qrecipe::blockwise::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// Quantizes every group, in row order: groups[g] is exactly the QuantizeArgs that `quantize`
// would get for group g alone (src: the group's first row; rows: its row count; its own
// destination buffers and scale leading dimensions). All groups must share the source dtype,
// cols, block shape, scale options, requested directions, device and stream (one quantizer,
// one call); an empty group (rows or cols 0) writes nothing.
void quantize_grouped(const std::vector<QuantizeArgs>& groups);

// Device-split groups (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE), 1x128 blocks: group g
// is rows [offsets[g], offsets[g + 1]) of base.src (device offsets; the host never learns the
// sizes), quantized with the bytes quantize would write for it alone. Packed outputs: rowwise
// data [rows, cols] (group g from row offsets[g]) and its scales group after group, each the
// reference's [ceil(cols/128)][roundup(rows_g, 4)]; columnwise data group after group, each
// [cols, ld_g] with ld_g = rows_g rounded up to kColumnwiseRowAlign (16-byte aligned rows for the
// grouped GEMM; padding never written), and its scales group after group, each
// [ceil(rows_g/128)][roundup(cols, 4)]. The requested directions' qr_group_entry tables are
// written on the device. base's scale_ld fields are unused.
inline constexpr std::int64_t kColumnwiseRowAlign = 16;
inline constexpr std::int64_t kScalePad = 4;  // scale rows padded to 4 (blockwise_ref.hpp)

struct DeviceGroupedArgs {
  QuantizeArgs base;  // the whole [rows, cols] source, the packed buffers, scale options
  int groups = 0;
  const std::int64_t* offsets = nullptr;  // device [groups + 1]
  qr_group_entry* rowwise_table = nullptr;
  qr_group_entry* columnwise_table = nullptr;
};

// Bytes of the packed buffers of one direction for any split of `rows` into `groups` groups
// (checked: a qrecipe::Error rather than a wrapped size).
inline std::int64_t device_data_bytes(std::int64_t rows, std::int64_t cols, std::int64_t groups,
                                      bool columnwise) {
  using qrecipe::checked_add, qrecipe::checked_mul;
  constexpr const char* what = "device-split grouped data bytes";
  if (!columnwise) return checked_mul(rows, cols, what);
  const std::int64_t padded_rows =
      checked_add(rows, checked_mul(kColumnwiseRowAlign - 1, groups, what), what);
  return checked_mul(cols, padded_rows, what);
}
inline std::int64_t device_scale_bytes(std::int64_t rows, std::int64_t cols, std::int64_t groups,
                                       bool columnwise) {
  using qrecipe::checked_add, qrecipe::checked_mul;
  constexpr const char* what = "device-split grouped scale bytes";
  const std::int64_t blocks = qrecipe::ceil_div(cols, 128, what);
  const std::int64_t padded = qrecipe::round_up(cols, kScalePad, what);
  const std::int64_t n =
      columnwise ? checked_mul(padded, checked_add(rows / 128, groups, what), what)
                 : checked_mul(blocks, checked_add(rows, checked_mul(kScalePad - 1, groups, what), what),
                               what);
  return checked_mul(4, n, what);
}

void quantize_grouped_device(const DeviceGroupedArgs& args);

}  // namespace qrecipe::blockwise::cuda
