// Row groups of one tensor (MoE experts' tokens): how a tensor is split (GroupSplits) and the
// groups quantized each as a tensor of its own (GroupedQuantizedTensor). Used by
// Engine::quantize_grouped and qrecipe::gemm_grouped (gemm_grouped.hpp); docs/gemm.md
// "Grouped GEMMs" explains the device-split path.
//
// Lifetime: GroupSplits and GroupedQuantizedTensor never own the offsets array they point to;
// the caller keeps it alive (and unchanged) while they are used, GEMMs queued on a stream
// included (the PyTorch adapter keeps the offsets tensor with the grouped tensor).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qrecipe/plugin_abi.h"
#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

// How the `total` rows of a tensor split into `groups` consecutive row groups: the group sizes
// known on the host (`rows`), or only their prefix sums `offsets` ([groups + 1] int64,
// offsets[0] = 0, offsets[groups] = total) in the memory of `device`: host memory for the CPU,
// device memory for CUDA (a router's output, read only by kernels, so nothing waits for it).
struct GroupSplits {
  std::int64_t groups = 0;
  std::int64_t total = 0;
  std::vector<std::int64_t> rows;         // host sizes; empty when only `offsets` is given
  const std::int64_t* offsets = nullptr;  // when rows is empty
  Device device = Device::cpu();

  // Sizes known on the host (each >= 0, at least one group).
  static GroupSplits of_rows(std::span<const std::int64_t> rows);
  // Prefix sums in the memory of `device` (checked when they are host memory).
  static GroupSplits of_offsets(const std::int64_t* offsets, std::int64_t groups,
                                std::int64_t total, Device device);
  // Whether the host can read the group sizes (given as rows, or offsets in host memory).
  bool host_readable() const { return !rows.empty() || device.is_cpu(); }
  // The group sizes (rows as given, or read from host offsets and checked: non-decreasing,
  // starting at 0 and ending at total). Throws for offsets in device memory.
  std::vector<std::int64_t> host_rows() const;
  std::string str() const;  // "8 groups of 4096 rows (sizes on the host)" / "... (offsets on cuda:0)"
};

// The row groups of one [total, cols] tensor, each quantized as a tensor of its own (its own
// scales and amax; bytes identical to quantizing its rows alone). Made by
// Engine::quantize_grouped from GroupSplits:
//   - splits the host can read: one QuantizedTensor per group (groups());
//   - splits only the device knows (CUDA offsets): ONE buffer per direction for every group
//     and a device table saying where each group lies (c(), plugin_abi.h
//     QR_EXTRA_QUANTIZE_GROUPED_DEVICE); the host never learns the group sizes.
// Move-only. A device-split tensor points to its splits' offsets (not owned).
class GroupedQuantizedTensor {
 public:
  GroupedQuantizedTensor() { c_.struct_size = sizeof(qr_grouped_quantized); }
  // Host-known groups (each [rows_g, cols], the same usage).
  GroupedQuantizedTensor(std::vector<QuantizedTensor> groups, std::int64_t cols);
  // Device split: per direction of `usage` ONE allocation holding the group table, the amaxes,
  // the scales and the data (sizes[d] = {data bytes, scale bytes} from the plugin), the table,
  // amaxes and scales zero-filled. The plugin then fills it (Engine::quantize_grouped).
  GroupedQuantizedTensor(const std::string& format, std::int64_t rows, std::int64_t cols,
                         std::uint32_t num_groups, const std::int64_t* offsets,
                         std::uint32_t usage, const std::array<qr_direction_layout, 2>& layouts,
                         const std::array<std::array<std::size_t, 2>, 2>& sizes, Device device,
                         const std::shared_ptr<Allocator>& allocator);

  GroupedQuantizedTensor(GroupedQuantizedTensor&& o) noexcept { *this = std::move(o); }
  GroupedQuantizedTensor& operator=(GroupedQuantizedTensor&& o) noexcept;
  GroupedQuantizedTensor(const GroupedQuantizedTensor&) = delete;
  GroupedQuantizedTensor& operator=(const GroupedQuantizedTensor&) = delete;

  bool device_split() const { return device_split_; }
  const std::string& format() const { return format_; }
  std::int64_t num_groups() const { return c_.num_groups; }
  std::int64_t rows() const { return c_.rows; }
  std::int64_t cols() const { return c_.cols; }
  std::uint32_t usage() const { return c_.usage; }
  bool has(qr_direction d) const { return (c_.usage & usage_bit(d)) != 0; }
  Device device() const { return device_; }
  // The layout the groups of direction d share (dtypes, scale mode, block shape, transposition).
  const qr_direction_layout& layout(qr_direction d) const;

  // Host-known groups only.
  const std::vector<QuantizedTensor>& groups() const;
  std::vector<QuantizedTensor>& groups();
  // Device split only: the C struct (plugin_abi.h) and one direction of it.
  const qr_grouped_quantized& c() const;
  qr_grouped_quantized& c();
  const qr_grouped_direction& direction(qr_direction d) const;

  // Frees one direction (every group's) and removes it from usage: what a layer keeps for its
  // backward (the columnwise copies once fprop has used the rowwise ones).
  void drop(qr_direction d);

 private:
  qr_grouped_direction& direction_data(qr_direction d) {
    return d == QR_DIRECTION_ROWWISE ? c_.rowwise : c_.columnwise;
  }

  bool device_split_ = false;
  std::string format_;
  std::array<std::string, 2> formats_;  // the layouts' format strings (device split)
  std::vector<QuantizedTensor> groups_;
  std::array<std::shared_ptr<Buffer>, 2> storage_;
  Device device_ = Device::cpu();
  qr_grouped_quantized c_{};
};

}  // namespace qrecipe
