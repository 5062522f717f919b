// The delayed-scaling update of every CUDA-resident scaling state of one device in a single
// kernel launch (DESIGN.md section 7; the arithmetic is delayed_scaling_update of scaling.hpp,
// the same function the CPU path runs). Built only with CUDA.
#pragma once

#include <vector>

namespace qrecipe::detail {

struct DeviceScalingUpdate {
  float* history;    // device pointers of one state
  float* scale;
  float* scale_inv;
  int length;
  int most_recent;
  int margin;
  float fmax;
  float reduced_amax;  // the caller-reduced amax of this step (or history[0])
};

// Updates every state in `updates` (all on CUDA device `device`) with one launch on the legacy
// default stream, then synchronizes it. Throws qrecipe::Error naming the failing CUDA call.
void update_scaling_cuda(const std::vector<DeviceScalingUpdate>& updates, int device);

}  // namespace qrecipe::detail
