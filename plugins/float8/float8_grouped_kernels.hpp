// CUDA entry of grouped float8 quantization (implemented in float8_grouped_kernels.cu, compiled
// only when the plugin is built with CUDA). No CUDA types, so float8.cpp can call it.
//
// A grouped source is one contiguous [sum(rows_g), cols] tensor whose consecutive row groups
// (MoE experts) are quantized as tensors of their own: per group its own amax, scale,
// scale_inv and data, bit-identical to float8_ref.cpp applied to that group's rows alone (and
// so to cast_transpose on the group). What changes is the launch count, independent of G:
//   current scaling: one zeroing launch, ONE amax launch for all groups, ONE cast launch;
//   delayed scaling: one zeroing launch, ONE cast launch (it observes the amaxes).
// Groups travel in the kernel parameters, kMaxGroupsPerLaunch at a time: more groups than that
// take one launch of each kind per chunk of kMaxGroupsPerLaunch.
//
// Like the other entries (float8_kernels.hpp): device pointers, asynchronous on `stream`,
// `device_index` made current for the call, qrecipe::Error (QR_STATUS_DEVICE_ERROR) on a CUDA
// failure.
#pragma once

#include <cstdint>
#include <vector>

#include "qrecipe/checked.hpp"

#include "qrecipe/plugin_abi.h"

namespace qrecipe::float8::cuda {

inline constexpr int kMaxGroupsPerLaunch = 128;

// One group's outputs (device pointers). A direction is requested when its scale_inv is
// non-null; its data pointer may then be null only for an empty group (nothing is stored).
struct GroupOutputs {
  std::int64_t rows = 0;                  // rows of this group (>= 0)
  std::uint8_t* rowwise = nullptr;        // [rows, cols]
  std::uint8_t* columnwise = nullptr;     // [cols, rows]
  float* rowwise_scale_inv = nullptr;     // [1], or nullptr: rowwise not requested
  float* columnwise_scale_inv = nullptr;  // [1], or nullptr: columnwise not requested
  float* rowwise_amax = nullptr;          // [1]: the group's amax (before amax_epsilon)
  float* columnwise_amax = nullptr;       // [1]: the same value
};

struct GroupedCastArgs {
  const void* src = nullptr;          // device, contiguous [sum(rows), cols]
  qr_dtype src_dtype = QR_DTYPE_F32;  // f32, bf16 or f16
  std::int64_t cols = 0;
  qr_dtype data_dtype = QR_DTYPE_E4M3;  // e4m3 or e5m2
  std::vector<GroupOutputs> groups;     // in row order; at least one
  // Current scaling (delayed_scale == nullptr): scale_from_amax(group amax, fmax, pow2, eps).
  float fmax = 448.0f;
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;
  // Delayed scaling: the state's scale (device) read by every group, and the state's history
  // row 0 (device) into which every group's amax is max-accumulated.
  const float* delayed_scale = nullptr;
  float* history_row0 = nullptr;
  int device_index = 0;
  void* stream = nullptr;
};

// Quantizes every group (both directions as requested per group; every group must request the
// same directions). Writes each group's data, scale_inv and amax.
void quantize_grouped(const GroupedCastArgs& args);

// Device-split groups (plugin_abi.h QR_EXTRA_QUANTIZE_GROUPED_DEVICE): group g is rows
// [offsets[g], offsets[g + 1]) of src, the offsets in device memory, so the host never learns
// the group sizes; the same bytes per group as quantize_grouped. The outputs are packed:
// rowwise data [rows, cols] (group g from row offsets[g]); columnwise data group after group,
// each [cols, ld_g] with ld_g = rows_g rounded up to kColumnwiseRowAlign (16-byte aligned rows
// for the grouped GEMM's TMA loads; the padding is never written or read); one scale_inv and
// one amax per group and direction (zero-filled by the caller). A small kernel computes the
// layout from the offsets and writes the requested directions' qr_group_entry tables; the amax
// and cast launches are sized for any split (blocks past the real count return at once).
inline constexpr std::int64_t kColumnwiseRowAlign = 16;

struct DeviceGroupedArgs {
  const void* src = nullptr;          // device, contiguous [rows, cols]
  qr_dtype src_dtype = QR_DTYPE_F32;
  std::int64_t rows = 0, cols = 0;
  qr_dtype data_dtype = QR_DTYPE_E4M3;
  int groups = 0;
  const std::int64_t* offsets = nullptr;  // device [groups + 1]
  // A direction is requested when its data pointer is set.
  std::uint8_t* rowwise = nullptr;
  float* rowwise_scale_inv = nullptr;      // [groups]
  float* rowwise_amax = nullptr;           // [groups]
  qr_group_entry* rowwise_table = nullptr; // device [groups]
  std::uint8_t* columnwise = nullptr;
  float* columnwise_scale_inv = nullptr;
  float* columnwise_amax = nullptr;
  qr_group_entry* columnwise_table = nullptr;
  // Scaling, as GroupedCastArgs.
  float fmax = 448.0f;
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;
  const float* delayed_scale = nullptr;
  float* history_row0 = nullptr;
  int device_index = 0;
  void* stream = nullptr;
};

// Bytes of the packed columnwise data for any split of `rows` rows into `groups` groups.
// Checked: a qrecipe::Error rather than a wrapped size.
inline std::int64_t device_columnwise_bytes(std::int64_t rows, std::int64_t cols, std::int64_t groups) {
  using qrecipe::checked_add, qrecipe::checked_mul;
  constexpr const char* what = "device-split grouped columnwise bytes";
  const std::int64_t padded_rows =
      checked_add(rows, checked_mul(kColumnwiseRowAlign - 1, groups, what), what);
  return checked_mul(cols, padded_rows, what);
}

void quantize_grouped_device(const DeviceGroupedArgs& args);

}  // namespace qrecipe::float8::cuda
