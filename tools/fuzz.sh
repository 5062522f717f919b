#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD_DIR (default build-sanitize: a clang build with
# -DQRECIPE_FUZZ=ON, ASan + UBSan) for QRECIPE_FUZZ_SECONDS seconds (default 60) from the
# committed seeds (tests/fuzz/corpus/<target>) and regression inputs
# (tests/fuzz/regressions/<target>). New inputs go to a scratch directory, never into the
# repository. A crash, a sanitizer report, a leak or an input slower than 10 s fails the run;
# libFuzzer writes the input to crash-*/timeout-* in the scratch directory and this script
# copies it to tests/fuzz/findings/ so it can become a regression input.
#   tools/fuzz.sh [target ...]      (default: every target)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-sanitize}
seconds=${QRECIPE_FUZZ_SECONDS:-60}
targets=("$@")
((${#targets[@]})) || targets=(fuzz_recipe fuzz_option_table fuzz_cli_args)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  exe=$build/bin/$t
  [[ -x $exe ]] || { echo "[fuzz] $exe is missing: configure with -DQRECIPE_FUZZ=ON (clang)" >&2; exit 1; }
  name=${t#fuzz_}
  mkdir -p "$scratch/$name"
  echo "[fuzz] $t for ${seconds} s"
  # detect_leaks: plugins are never unloaded (their one-time allocations are not leaks).
  if ! (cd "$scratch" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
          -print_final_stats=1 "$scratch/$name" "$root/tests/fuzz/corpus/$name" \
          "$root/tests/fuzz/regressions/$name" 2>&1 | tail -n 25); then
    status=1
  fi
  if compgen -G "$scratch/crash-*" >/dev/null || compgen -G "$scratch/timeout-*" >/dev/null ||
     compgen -G "$scratch/leak-*" >/dev/null || compgen -G "$scratch/oom-*" >/dev/null; then
    mkdir -p "$root/tests/fuzz/findings"
    cp "$scratch"/crash-* "$scratch"/timeout-* "$scratch"/leak-* "$scratch"/oom-* \
      "$root/tests/fuzz/findings/" 2>/dev/null || true
    echo "[fuzz] $t found a failing input: tests/fuzz/findings/" >&2
    status=1
  fi
done
exit $status
