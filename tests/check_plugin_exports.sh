#!/usr/bin/env bash
# Every plugin in DIR exports exactly its two entry symbols (docs/architecture.md, "The C plugin
# boundary"): qrecipe_plugin_abi and qrecipe_plugin_entry. Anything else leaking out of a
# plugin can clash with another plugin's symbols or the host's.
set -euo pipefail
dir=${1:?usage: check_plugin_exports.sh PLUGIN_DIR}
shopt -s nullglob
plugins=("$dir"/libqrecipe_*.so)
if ((${#plugins[@]} == 0)); then
  echo "no plugins found in $dir"; exit 1
fi
status=0
for p in "${plugins[@]}"; do
  all=$(nm -D --defined-only "$p" | awk '{print $NF}' | sort | tr '\n' ' ')
  if [[ "$all" == "qrecipe_plugin_abi qrecipe_plugin_entry " ]]; then
    echo "ok   $(basename "$p"): $all"
  else
    echo "FAIL $(basename "$p") exports: $all (expected exactly: qrecipe_plugin_abi qrecipe_plugin_entry)"
    status=1
  fi
done
exit $status
