// The delayed-scaling update of every CUDA-resident scaling state of one device in a single
// kernel launch (docs/numerics.md, delayed scaling; the arithmetic is delayed_scaling_update of
// scaling.hpp, the same function the CPU path runs). Built only with CUDA.
#pragma once

#include "internal_visibility.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

struct DeviceScalingUpdate {
  float* history;    // device pointers of one state
  float* scale;
  float* scale_inv;
  int length;
  int most_recent;
  int margin;
  float fmax;
  float reduced_amax;     // the caller-reduced amax of this step (unless amax_from_history)
  int amax_from_history;  // 1: the step's amax is history[0], read on the device
};

// A device-resident copy of one device's update table. It is uploaded only when the table
// changes (states added or moved, or caller-reduced amaxes), so the usual step — every state
// with its own row 0 — is one kernel launch on the caller's stream: no allocation, no copy,
// no host synchronization. Owns its device buffer (freed in the destructor).
// QR_INTERNAL: engine.hpp declares it first (internal_visibility.hpp).
class QR_INTERNAL DeviceScalingTable {
 public:
  explicit DeviceScalingTable(int device) : device_(device) {}
  ~DeviceScalingTable();
  DeviceScalingTable(const DeviceScalingTable&) = delete;
  DeviceScalingTable& operator=(const DeviceScalingTable&) = delete;

  // Runs the update of `updates` on `stream` (cudaStream_t; nullptr: legacy default stream).
  // `share_groups`: the history pointers of the members of each shared state whose members all
  // live on this device (Engine::acquire_scaling_state); before the update, one launch writes
  // each group's max row 0 into every member's row 0, so the members (which take their amax
  // from history[0]) update as one state. `version` identifies the contents of both tables:
  // equal to the last call's, the device copy is reused as is (the caller guarantees the tables
  // are then the same); 0 always uploads. Throws qrecipe::Error naming the failing CUDA call.
  void run(const std::vector<DeviceScalingUpdate>& updates,
           const std::vector<std::vector<float*>>& share_groups, std::uint64_t version,
           void* stream);

 private:
  int device_;
  // One allocation: the updates, then the groups' member row pointers, then their offsets.
  void* table_ = nullptr;
  std::size_t capacity_ = 0;  // bytes
  std::size_t count_ = 0;
  std::size_t groups_ = 0, members_ = 0;
  std::uint64_t version_ = 0;
  bool uploaded_ = false;
  void* last_stream_ = nullptr;
};

}  // namespace qrecipe::detail
QR_INTERNAL_END
