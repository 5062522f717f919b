#!/usr/bin/env bash
# The one command that runs every test of qrecipe on a fresh machine (CI runs it too):
#   1. set-up (tools/setup.sh: apt + pip pins, quick when already there)
#   2. main build (CUDA sources compiled and linked when nvcc is present) + ctest
#   3. sanitizer build (ASan + UBSan, no CUDA) + ctest
# Each stage prints its duration. Exit status is non-zero if any stage fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

stage() {  # stage NAME COMMAND...
  local name=$1; shift
  local t0=$SECONDS
  echo "=== [$name] start"
  "$@"
  echo "=== [$name] done in $((SECONDS - t0)) s"
}

stage setup bash tools/setup.sh
stage build env BUILD_DIR="$root/build" bash tools/build.sh
stage ctest ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)"
if [[ "${QRECIPE_SKIP_SANITIZE:-0}" != 1 ]]; then
  stage build-sanitize env BUILD_DIR="$root/build-sanitize" QRECIPE_CUDA=OFF BUILD_TYPE=Debug \
    bash tools/build.sh -DQRECIPE_SANITIZE=ON
  # LeakSanitizer: plugins are never unloaded by design (DESIGN.md section 4), so their
  # one-time allocations are not leaks; detect_leaks stays on for everything else.
  stage ctest-sanitize env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$root/build-sanitize" --output-on-failure -j "$(nproc)"
fi
echo "all tests passed"
