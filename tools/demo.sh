#!/usr/bin/env bash
# The main job: set up, build, then walk through qrecipe on the default recipe on the CPU:
# list the plugins, validate and explain the recipe for a small model, and quantize random
# data with each format to show its error and size. (The training demo replaces the last
# step once the PyTorch adapter lands.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/setup.sh >/dev/null
BUILD_DIR="$root/build" bash tools/build.sh >/dev/null
qr="$root/build/bin/qrecipe"
recipe=${1:-recipes/default.yaml}

run() { echo; echo "\$ qrecipe $*"; "$qr" "$@"; }
run plugins
run recipe check "$recipe"
run recipe explain "$recipe" --module linear:layers.0.attn.qkv --module linear:layers.0.mlp.fc1 \
  --module linear:lm_head
for fmt in $("$qr" plugins | awk '/^  [a-z0-9_]+ [0-9]/{print $1}'); do
  [[ "$fmt" == hybrid ]] && continue
  run quantize --format "$fmt" --shape 1024x1024 --seed 0
done
