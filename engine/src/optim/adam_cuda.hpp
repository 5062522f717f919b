// Engine-internal (CUDA builds only): the multi-tensor Adam update of the plain and two-pass
// tensors of a step (qrecipe/optim.hpp) in one launch per up to kMaxTensorsPerLaunch tensors.
// No CUDA types, so adam_step.cpp (host compiler) can call it.
#pragma once

#include <cstdint>
#include <vector>

#include "qrecipe/plugin_abi.h"

namespace qrecipe::detail {

// One tensor: n contiguous elements of each buffer on the launch's device.
struct AdamCudaItem {
  void* param = nullptr;          // F32, BF16 or F16, updated in place
  std::int32_t param_dtype = QR_DTYPE_F32;
  const void* grad = nullptr;     // F32, BF16 or F16
  std::int32_t grad_dtype = QR_DTYPE_F32;
  void* exp_avg = nullptr;        // F32 or BF16
  std::int32_t exp_avg_dtype = QR_DTYPE_F32;
  void* exp_avg_sq = nullptr;     // F32 or BF16
  std::int32_t exp_avg_sq_dtype = QR_DTYPE_F32;
  void* copy = nullptr;           // optional: the new value rounded to copy_dtype
  std::int32_t copy_dtype = QR_DTYPE_F32;
  std::int64_t numel = 0;
  qr_adam_hyper hyper{};          // lr_device / step_device are read on the device
};

// Updates every item (qrecipe/adam.hpp) on `device`, asynchronously on `stream` (cudaStream_t;
// nullptr: the legacy default stream): no allocation, no host synchronization, so a CUDA graph
// may capture it. Throws qrecipe::Error naming the failing CUDA call.
void adam_update_cuda(const std::vector<AdamCudaItem>& items, int device, void* stream);

}  // namespace qrecipe::detail
