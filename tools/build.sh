#!/usr/bin/env bash
# Configure and build qrecipe into BUILD_DIR (default build/). Extra arguments go to CMake.
#   QRECIPE_CUDA=AUTO|ON|OFF (env) picks the CUDA build (default AUTO).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
    -DQRECIPE_CUDA=${QRECIPE_CUDA:-AUTO} "$@"
else
  cmake -S "$root" -B "$build" -DQRECIPE_CUDA=${QRECIPE_CUDA:-AUTO} "$@" >/dev/null
fi
cmake --build "$build" -j "${JOBS:-$(nproc)}"
