// A planted host call of a __device__-only function, for check_device_stub_calls.py's own test:
// nvcc compiles it without a diagnostic (the caller is a template) and the host runs nvcc's
// exit(1) stub. Never linked into anything.
#include <cstdint>

namespace planted {

__device__ __forceinline__ std::int64_t device_only_cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The argument's type depends on T, so nvcc resolves the call only at instantiation, where it
// does not diagnose a host call of a __device__ function.
template <class T>
std::int64_t blocks_for(const T& n) {
  return device_only_cdiv(n, 256);
}

}  // namespace planted

// Host work before the call, as in the launcher that hit it: the stub lands inside a function
// that does other things.
extern "C" __attribute__((noinline)) void qrecipe_planted_note(std::int64_t* seen, std::int64_t n) { *seen = n; }

extern "C" std::int64_t qrecipe_planted_blocks(std::int64_t* seen, std::int64_t n) {
  qrecipe_planted_note(seen, n);
  return planted::blocks_for(n);
}
