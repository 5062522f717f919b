// Engine-internal (CUDA builds only): the one scope guard the engine's CUDA code uses to run
// on a device. Defined in cuda_runtime.cpp.
#pragma once

#include "internal_visibility.hpp"

QR_INTERNAL_BEGIN
namespace qrecipe::detail {

// Makes CUDA device `index` current for its lifetime and restores the previous device.
// cudaSetDevice runs even when the device is already current: that makes the device's
// primary context current on this thread, which cuBLASLt (driver API) needs on a fresh
// thread. Throws qrecipe::Error (QR_STATUS_DEVICE_ERROR) naming the failed call and `what`
// the caller was doing.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* what);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace qrecipe::detail
QR_INTERNAL_END
