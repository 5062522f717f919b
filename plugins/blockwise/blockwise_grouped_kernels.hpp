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

#include "blockwise_kernels.hpp"

namespace qrecipe::blockwise::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// Quantizes every group, in row order: groups[g] is exactly the QuantizeArgs that `quantize`
// would get for group g alone (src: the group's first row; rows: its row count; its own
// destination buffers and scale leading dimensions). All groups must share the source dtype,
// cols, block shape, scale options, requested directions, device and stream (one quantizer,
// one call); an empty group (rows or cols 0) writes nothing.
void quantize_grouped(const std::vector<QuantizeArgs>& groups);

}  // namespace qrecipe::blockwise::cuda
