#!/usr/bin/env bash
# ThreadSanitizer build of the CPU engine (no CUDA, no Python) into BUILD_DIR (default
# build-tsan) and its multi-threaded suite, tests/test_threads.cpp: quantize, dequantize, GEMM,
# delayed-scaling updates, role resolution and plugin loading from several threads. Only the
# engine, the plugins and that suite are built. Any data race report fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-tsan}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
launcher=()
if [[ "${QRECIPE_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DQRECIPE_CUDA=OFF -DQRECIPE_PYTHON=OFF -DQRECIPE_TSAN=ON "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target test_threads qrecipe_float8 \
  qrecipe_mxfp8 qrecipe_nvfp4 qrecipe_blockwise qrecipe_hybrid
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
  ctest --test-dir "$build" --output-on-failure -R '^test_threads$'
