#!/usr/bin/env bash
# The engine names no format: every format is a plugin, and what the engine knows of one comes
# through the plugin ABI (layouts, scale modes, descriptor fields), never by its name.
#
#   check_engine_names.sh ENGINE_DIR     (ctest runs it on the source tree's engine/)
#
# The rule, precisely: no file under ENGINE_DIR (sources, headers, CMake files, whatever the
# directory holds) contains any of the shipped format names
#     float8  mxfp8  nvfp4  blockwise  hybrid
# anywhere, in any letter case: as an identifier or part of one (is_blockwise_fp32, kNvfp4),
# in a string, or in a comment. Words that describe what an operand is ("E4M3 with FP32
# 1x128 block scales", "a format built from other formats", "block-and-tensor scaled") say
# what the engine needs to know; an example format name in a comment or message is
# "myformat" or "<name>". There are no exceptions: a name that must appear belongs in the
# plugin, in tests/ or in docs/.
#
# Exit status: 0 when the rule holds, 1 with every offending line listed otherwise, 2 on bad
# usage.
set -euo pipefail
dir=${1:?usage: check_engine_names.sh ENGINE_DIR}
if [[ ! -d $dir ]]; then
  echo "check_engine_names.sh: '$dir' is not a directory" >&2
  exit 2
fi
names='float8|mxfp8|nvfp4|blockwise|hybrid'
# -r every file, -I skip binary files, -i any case, -n line numbers, -E the alternation.
if hits=$(grep -rInE -i "$names" "$dir"); then
  echo "FAIL: files under $dir name a format ($names, any case):"
  echo "$hits"
  echo "Reword them in terms of what the engine sees (dtypes, scale modes, block shapes," \
       "descriptor fields) or move them to the plugin; see the rule at the top of $0."
  exit 1
fi
echo "ok: no file under $dir names a format ($names)"
