// CUDA entry of grouped mxfp8 quantization (implemented in mxfp8_grouped_kernels.cu, compiled
// only when the plugin is built with CUDA). No CUDA types, so mxfp8.cpp can call it.
//
// A grouped source is one contiguous [sum(rows_g), cols] tensor whose consecutive row groups
// (MoE experts) are quantized as tensors of their own: each group's data and E8M0 scales are
// bit-identical to mxfp8_ref.cpp applied to that group's rows alone (its columnwise blocks of
// 32 rows start at the group's first row and end, partial, at its last). mxfp8 has no
// tensor-level quantity, so all groups are ONE launch (both directions), each CTA running the
// one-tensor kernel's tile code; groups travel in the kernel parameters, kMaxGroupsPerLaunch
// at a time (more groups: one launch per chunk).
//
// Like mxfp8_kernels.hpp: device pointers, asynchronous on `stream`, `device_index` made
// current for the call, qrecipe::Error (QR_STATUS_DEVICE_ERROR) on a CUDA failure. Scale
// padding is never written (it stays as allocated: zero).
#pragma once

#include <cstdint>
#include <vector>

#include "qrecipe/checked.hpp"

#include "mxfp8_kernels.hpp"
#include "qrecipe/plugin_abi.h"

namespace qrecipe::mxfp8::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// Quantizes every group; groups[g] are the arguments cuda::quantize would take for group g
// alone (its rows of the source, its own buffers; null buffers allowed for an empty group).
// Every group with elements shares the source dtype, columns, data dtype, directions, device
// and stream of the others.
void quantize_grouped(const std::vector<QuantizeArgs>& groups);

// Device-split groups (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE): group g is rows
// [offsets[g], offsets[g + 1]) of src (device offsets; the host never learns the sizes), with
// the bytes quantize writes for it alone. Packed outputs: data [rows, cols] per direction
// (group g from row offsets[g]; columnwise data is not transposed); scales group after group,
// each the reference's layout for the group: rowwise [roundup(rows_g, 128), rowwise_scale_ld],
// columnwise [roundup(ceil(rows_g / 32), 4), columnwise_scale_ld]. One layout kernel (it also
// writes the requested directions' qr_group_entry tables) and one launch sized for any split.
struct DeviceGroupedArgs {
  // The whole [rows, cols] source and the packed buffers (null data: direction not
  // requested), with the reference's scale row lengths rowwise_scale_ld =
  // roundup(ceil(cols/32), 4) and columnwise_scale_ld = roundup(cols, 128).
  QuantizeArgs base;
  int groups = 0;
  const std::int64_t* offsets = nullptr;  // device [groups + 1]
  qr_group_entry* rowwise_table = nullptr;     // device [groups], rowwise requested
  qr_group_entry* columnwise_table = nullptr;  // device [groups], columnwise requested
};

// Scale bytes of one direction for any split of `rows` rows into `groups` groups.
// Checked: a qrecipe::Error rather than a wrapped size.
inline std::int64_t device_scale_bytes(std::int64_t rows, std::int64_t scale_ld, std::int64_t groups,
                                       bool columnwise) {
  using qrecipe::checked_add, qrecipe::checked_mul;
  constexpr const char* what = "device-split grouped scale bytes";
  const std::int64_t n = columnwise ? checked_add(rows / 32, checked_mul(4, groups, what), what)
                                    : checked_add(rows, checked_mul(127, groups, what), what);
  return checked_mul(scale_ld, n, what);
}

void quantize_grouped_device(const DeviceGroupedArgs& args);

}  // namespace qrecipe::mxfp8::cuda
