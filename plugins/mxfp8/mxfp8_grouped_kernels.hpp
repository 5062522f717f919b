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

#include <vector>

#include "mxfp8_kernels.hpp"

namespace qrecipe::mxfp8::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// Quantizes every group; groups[g] are the arguments cuda::quantize would take for group g
// alone (its rows of the source, its own buffers; null buffers allowed for an empty group).
// Every group with elements shares the source dtype, columns, data dtype, directions, device
// and stream of the others.
void quantize_grouped(const std::vector<QuantizeArgs>& groups);

}  // namespace qrecipe::mxfp8::cuda
