#!/usr/bin/env bash
# Configure and build qrecipe into BUILD_DIR (default build/). Extra arguments go to CMake.
#   QRECIPE_CUDA=AUTO|ON|OFF (env) picks the CUDA build (default AUTO).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# ccache, when the machine has it, makes rebuilds of unchanged sources (another checkout, a
# fresh build directory) cheap; QRECIPE_CCACHE=0 turns it off.
launcher=()
if [[ "${QRECIPE_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
    -DQRECIPE_CUDA=${QRECIPE_CUDA:-AUTO} "${launcher[@]}" "$@"
else
  cmake -S "$root" -B "$build" -DQRECIPE_CUDA=${QRECIPE_CUDA:-AUTO} "$@" >/dev/null
fi
cmake --build "$build" -j "${JOBS:-$(nproc)}"
