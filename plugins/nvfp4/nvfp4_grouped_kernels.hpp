// CUDA entry of grouped nvfp4 quantization (implemented in nvfp4_grouped_kernels.cu, compiled
// only when the plugin is built with CUDA). No CUDA types, so nvfp4.cpp can call it.
//
// A grouped source is one [sum(rows_g), cols] tensor whose consecutive row groups (MoE
// experts) are quantized as tensors of their own: each group's data, scales and amax are
// bit-identical to nvfp4_ref.cpp applied to that group's rows alone (the tensor amax is the
// group's; its 16-row column blocks start at the group's first row). This entry covers the
// 1-D options (no 2d, no Hadamard; round to nearest or stochastic rounding with each group's
// own call offset): every group in three launches (zero the group amaxes, all group amaxes,
// all casts), kMaxGroupsPerLaunch groups at a time. nvfp4.cpp quantizes the other option sets
// one group at a time through quantize.
//
// Like nvfp4_kernels.hpp: device pointers, asynchronous on `stream`, `device_index` made
// current for the call, qrecipe::Error (QR_STATUS_DEVICE_ERROR) on a CUDA failure. Scale
// padding is never written (it stays as allocated: zero).
#pragma once

#include <vector>

#include "nvfp4_kernels.hpp"

namespace qrecipe::nvfp4::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// Quantizes every group, in row order: groups[g] is exactly the QuantizeArgs that `quantize`
// would get for group g alone (src: the group's first row; rows: its row count; its own
// buffers and call offset). All groups must share the source dtype, cols, options (two_d and
// hadamard false), directions, device and stream, and pass no given_amax.
void quantize_grouped(const std::vector<QuantizeArgs>& groups);

}  // namespace qrecipe::nvfp4::cuda
