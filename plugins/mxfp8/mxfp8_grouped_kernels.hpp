// CUDA entry of grouped mxfp8 quantization (implemented in mxfp8_grouped_kernels.cu, compiled
// only when the plugin is built with CUDA). No CUDA types, so mxfp8.cpp can call it.
//
// A grouped source is one contiguous [sum(rows_g), cols] tensor whose consecutive row groups
// (MoE experts) are quantized as tensors of their own: each group's data and E8M0 scales are
// bit-identical to mxfp8_ref.cpp applied to that group's rows alone (its columnwise blocks of
// 32 rows start at the group's first row and end, partial, at its last). mxfp8 has no
// tensor-level quantity, so all groups are ONE launch (both directions); groups travel in the
// kernel parameters, kMaxGroupsPerLaunch at a time (more groups: one launch per chunk).
//
// Like mxfp8_kernels.hpp: device pointers, asynchronous on `stream`, `device_index` made
// current for the call, qrecipe::Error (QR_STATUS_DEVICE_ERROR) on a CUDA failure. Scale
// padding is never written (it stays as allocated: zero).
#pragma once

#include <cstdint>
#include <vector>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::mxfp8::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// One group's outputs (device pointers; both nullptr for a direction not requested; may be
// nullptr for an empty group, which writes nothing).
struct GroupOutputs {
  std::int64_t rows = 0;
  std::uint8_t* rowwise_data = nullptr;      // [rows, cols]
  std::uint8_t* rowwise_scale = nullptr;     // [roundup(rows,128), rowwise_scale_ld]
  std::uint8_t* columnwise_data = nullptr;   // [rows, cols] (not transposed)
  std::uint8_t* columnwise_scale = nullptr;  // [roundup(ceil(rows/32),4), columnwise_scale_ld]
};

struct GroupedQuantizeArgs {
  const void* src = nullptr;          // device, contiguous [sum(rows), cols]
  qr_dtype src_dtype = QR_DTYPE_F32;  // f32, bf16 or f16
  std::int64_t cols = 0;
  qr_dtype data_dtype = QR_DTYPE_E4M3;
  bool rowwise = false, columnwise = false;  // the directions every group requests
  std::int64_t rowwise_scale_ld = 0;         // roundup(ceil(cols/32), 4)
  std::int64_t columnwise_scale_ld = 0;      // roundup(cols, 128)
  std::vector<GroupOutputs> groups;          // in row order; at least one
  int device_index = 0;
  void* stream = nullptr;
};

void quantize_grouped(const GroupedQuantizeArgs& args);

}  // namespace qrecipe::mxfp8::cuda
