#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD_DIR (default build-sanitize: a clang build with
# -DQRECIPE_FUZZ=ON, ASan + UBSan) for QRECIPE_FUZZ_SECONDS seconds (default 60) from the
# committed seeds (tests/fuzz/corpus/<target>) and regression inputs
# (tests/fuzz/regressions/<target>). New inputs go to a scratch directory, never into the
# repository. A crash, a sanitizer report, a leak or an input slower than 10 s fails the run;
# libFuzzer writes the input to crash-*/timeout-* in the scratch directory and this script
# copies it into tests/fuzz (its subfolder findings, made on the first failure) so it can
# become a regression input.
#   tools/fuzz.sh [target ...]      (default: every target)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-sanitize}
seconds=${QRECIPE_FUZZ_SECONDS:-60}
targets=("$@")
((${#targets[@]})) || targets=(fuzz_recipe fuzz_option_table fuzz_cli_args)
# Targets run side by side, up to QRECIPE_FUZZ_JOBS at once (default: the core count), each
# libFuzzer process on one core: on CI's 2 cores the stage takes 2 x QRECIPE_FUZZ_SECONDS,
# not 3 x.
jobs=${QRECIPE_FUZZ_JOBS:-$(nproc)}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

run_target() {  # run_target TARGET: its output in $scratch/TARGET.log; non-zero on a finding
  local t=$1 name=${1#fuzz_}
  local work=$scratch/$name
  mkdir -p "$work/corpus"
  local inputs=("$work/corpus" "$root/tests/fuzz/corpus/$name")
  # regressions/<name> exists once the target has a fixed failing input (git keeps no empty
  # folder), and libFuzzer stops on a folder that does not exist.
  [[ -d $root/tests/fuzz/regressions/$name ]] && inputs+=("$root/tests/fuzz/regressions/$name")
  # detect_leaks: plugins are never unloaded (their one-time allocations are not leaks).
  (cd "$work" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$build/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 "${inputs[@]}") >"$scratch/$t.log" 2>&1
}

for t in "${targets[@]}"; do
  [[ -x $build/bin/$t ]] || { echo "[fuzz] $build/bin/$t is missing: configure with -DQRECIPE_FUZZ=ON (clang)" >&2; exit 1; }
done
declare -A pids=()
status=0
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  echo "[fuzz] $t for ${seconds} s"
  run_target "$t" &
  pids[$t]=$!
done
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  rc=0
  wait "${pids[$t]}" || rc=$?
  echo "[fuzz] --- $t (exit $rc)"
  tail -n 25 "$scratch/$t.log"
  ((rc == 0)) || status=1
  work=$scratch/$name
  if compgen -G "$work/crash-*" >/dev/null || compgen -G "$work/timeout-*" >/dev/null ||
     compgen -G "$work/leak-*" >/dev/null || compgen -G "$work/oom-*" >/dev/null; then
    mkdir -p "$root/tests/fuzz/findings"
    cp "$work"/crash-* "$work"/timeout-* "$work"/leak-* "$work"/oom-* \
      "$root/tests/fuzz/findings/" 2>/dev/null || true
    echo "[fuzz] $t found a failing input: tests/fuzz/findings/" >&2
    status=1
  fi
done
exit $status
