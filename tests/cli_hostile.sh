#!/usr/bin/env bash
# cli_hostile.sh CASE QRECIPE_CLI GOOD_PLUGIN: the `qrecipe` CLI against hostile input (issue 19).
# Each case must end with its documented exit status and a clear message: never a crash (a
# signal), a hang, or output that hides the cause. `timeout` only turns a hang into a failure.
#   truncated_plugin  a plugin cut to 4096 bytes on QRECIPE_PLUGIN_PATH: listed, exit 0
#   fifo_plugin       a FIFO named libqrecipe_x.so on the path: listed, exit 0
#   fifo_recipe       a FIFO as the recipe file: exit 1 at once
#   devzero_recipe    /dev/zero as the recipe file: exit 1 at once
#   alias_bomb        the 929-byte alias bomb: exit 1, the limit named at file:line:col
#   shape_overflow    --shape 4294967296x4294967296: exit 2, "overflows"
#   tokens_overflow   recipe explain --tokens 9223372036854775807: exit 1, "overflow"
#   check_resolves    recipe check of amax_history_len without delayed scaling: exit 1
set -uo pipefail
case_name=$1 cli=$2 good_plugin=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plugin_dir=$(dirname "$good_plugin")

# run EXPECTED_RC PATTERN CMD...: runs CMD (60 s at most), checks its status and that its
# output matches the extended regex PATTERN.
run() {
  local expected=$1 pattern=$2; shift 2
  local out rc
  out=$(timeout 60 "$@" 2>&1); rc=$?
  echo "$out"
  if [[ $rc -eq 124 ]]; then echo "FAIL: hung (killed after 60 s): $*"; exit 1; fi
  if [[ $rc -ne $expected ]]; then echo "FAIL: exit status $rc, expected $expected: $*"; exit 1; fi
  if ! grep -Eq -- "$pattern" <<<"$out"; then echo "FAIL: output lacks /$pattern/"; exit 1; fi
  echo "ok"
}

case $case_name in
  truncated_plugin)
    head -c 4096 "$good_plugin" >"$tmp/libqrecipe_x.so"
    QRECIPE_PLUGIN_PATH="$tmp:$plugin_dir" run 0 \
      "libqrecipe_x.so: truncated.*4096 bytes" "$cli" plugins ;;
  fifo_plugin)
    mkfifo "$tmp/libqrecipe_x.so"
    QRECIPE_PLUGIN_PATH="$tmp:$plugin_dir" run 0 \
      "libqrecipe_x.so: not a regular file \(a FIFO\)" "$cli" plugins ;;
  fifo_recipe)
    mkfifo "$tmp/recipe.yaml"
    run 1 "is not a regular file \(a FIFO\)" "$cli" recipe check "$tmp/recipe.yaml" ;;
  devzero_recipe)
    run 1 "is not a regular file \(a character device\)" "$cli" recipe check /dev/zero ;;
  alias_bomb)
    {
      echo "version: 1"
      echo "defaults:"
      echo "  format: hybrid"
      echo "  l0: &l0 {format: float8}"
      for level in 1 2 3 4 5 6 7 8; do
        line="  l$level: &l$level {format: hybrid"
        for i in 0 1 2 3 4 5 6 7 8; do line+=", k$i: *l$((level - 1))"; done
        echo "$line}"
      done
    } >"$tmp/bomb.yaml"
    run 1 "bomb.yaml:[0-9]+:[0-9]+: .*aliases expand this recipe to more than" \
      "$cli" recipe check "$tmp/bomb.yaml" ;;
  shape_overflow)
    run 2 "--shape 4294967296x4294967296: 4294967296 x 4294967296 elements overflow" \
      "$cli" quantize --format float8 --shape 4294967296x4294967296 ;;
  tokens_overflow)
    printf 'version: 1\ndefaults: {format: mxfp8}\n' >"$tmp/r.yaml"
    run 1 "overflow" "$cli" recipe explain "$tmp/r.yaml" --module linear:fc:4096:4096 \
      --tokens 9223372036854775807 --device sm90 ;;
  check_resolves)
    printf 'version: 1\ndefaults: {format: float8, amax_history_len: 16}\n' >"$tmp/r.yaml"
    run 1 "r.yaml:2:11: defaults: .*amax_history_len' only applies to scaling: delayed" \
      "$cli" recipe check "$tmp/r.yaml" ;;
  *) echo "unknown case '$case_name'"; exit 2 ;;
esac
