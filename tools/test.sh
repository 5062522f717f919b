#!/usr/bin/env bash
# The one command that runs every test of qrecipe on a fresh machine (CI runs it too):
#   1. set-up (tools/setup.sh: apt + pip pins, quick when already there)
#   2. main build (CUDA sources compiled and linked when nvcc is present; the PyTorch extension
#      when torch is importable) + ctest
#   3. pytest: the adapter suites (tests/python) against the main build tree
#   4. demo-short: the training demo's short mode (examples/char_lm_demo.py --steps N) under
#      every shipped recipe (recipes/*.yaml): each must train and its loss must fall
#   5. sanitizer build (clang, ASan + UBSan, no CUDA, no Python extension, with the libFuzzer
#      targets) + ctest, then each fuzz target for QRECIPE_FUZZ_SECONDS (default 60) seconds
#      (tools/fuzz.sh)
#   6. ThreadSanitizer build of the CPU engine and its multi-threaded suite (tools/tsan.sh)
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

PY=${PYTHON:-python3}
stage setup bash tools/setup.sh
# The adapter is built and tested whenever torch is importable (setup.sh installs it unless
# QRECIPE_SETUP_TORCH=0); without torch the pytest stage is skipped, loudly.
python_flags=(-DQRECIPE_PYTHON=OFF)
if "$PY" -c "import torch" >/dev/null 2>&1; then
  python_flags=(-DQRECIPE_PYTHON=ON "-DPython_EXECUTABLE=$("$PY" -c "import sys; print(sys.executable)")")
fi
stage build env BUILD_DIR="$root/build" bash tools/build.sh "${python_flags[@]}"
stage ctest ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)"
run_pytest() {
  # Exit code 5 means "no tests collected": the suites must exist, so that is a failure too.
  local rc=0
  PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q \
    -p no:cacheprovider "$root/tests/python" || rc=$?
  if ((rc == 5)); then echo "pytest collected no tests in tests/python" >&2; fi
  return "$rc"
}
run_demo_short() {
  # The demo model a few steps under every shipped recipe, on the CPU (the reference GEMMs).
  PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" \
    "$root/examples/char_lm_demo.py" --device cpu --steps "${QRECIPE_DEMO_STEPS:-6}" \
    --sample-chars 40 --out "$root/build/demo-short" --recipe "$root"/recipes/*.yaml
}
if [[ "${python_flags[0]}" == -DQRECIPE_PYTHON=ON ]]; then
  stage pytest run_pytest
  stage demo-short run_demo_short
else
  echo "=== [pytest] SKIPPED: torch is not importable by $PY (the adapter was not built)"
  echo "=== [demo-short] SKIPPED: torch is not importable by $PY"
fi
if [[ "${QRECIPE_SKIP_SANITIZE:-0}" != 1 ]]; then
  # clang (tools/setup.sh installs it), so that the same build holds the libFuzzer targets. A
  # build directory configured with another compiler is configured afresh.
  sanitize_cache="$root/build-sanitize/CMakeCache.txt"
  if [[ -f "$sanitize_cache" ]] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang' "$sanitize_cache"; then
    rm -rf "$sanitize_cache" "$root/build-sanitize/CMakeFiles"
  fi
  stage build-sanitize env BUILD_DIR="$root/build-sanitize" QRECIPE_CUDA=OFF BUILD_TYPE=Debug \
    CC=clang CXX=clang++ bash tools/build.sh -DQRECIPE_SANITIZE=ON -DQRECIPE_FUZZ=ON \
    -DQRECIPE_PYTHON=OFF
  # LeakSanitizer: plugins are never unloaded by design (docs/architecture.md, "The C plugin
  # boundary"), so their one-time allocations are not leaks; detect_leaks stays on for
  # everything else.
  stage ctest-sanitize env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$root/build-sanitize" --output-on-failure -j "$(nproc)"
  stage fuzz env BUILD_DIR="$root/build-sanitize" bash tools/fuzz.sh
fi
if [[ "${QRECIPE_SKIP_TSAN:-0}" != 1 ]]; then
  stage tsan bash tools/tsan.sh
fi
echo "all tests passed"
