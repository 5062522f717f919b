#!/usr/bin/env bash
# The main job: set up, build, then walk through qrecipe on the default recipe on the CPU:
# list the plugins, validate and explain the recipe for a small model, quantize random data
# with each format to show its error and size, and finally train a small model with the
# PyTorch adapter (examples/train_demo.py: qrecipe.convert + qrecipe.autocast, ~100 steps)
# next to an FP32 baseline trained identically.
#   tools/demo.sh [RECIPE.yaml]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/setup.sh >/dev/null
PY=${PYTHON:-python3}
python_flags=(-DQRECIPE_PYTHON=OFF)
if "$PY" -c "import torch" >/dev/null 2>&1; then
  python_flags=(-DQRECIPE_PYTHON=ON "-DPython_EXECUTABLE=$("$PY" -c "import sys; print(sys.executable)")")
fi
BUILD_DIR="$root/build" bash tools/build.sh "${python_flags[@]}" >/dev/null
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

echo
if [[ "${python_flags[0]}" == -DQRECIPE_PYTHON=ON ]]; then
  echo "\$ python3 examples/train_demo.py --recipe $recipe"
  PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" examples/train_demo.py \
    --recipe "$recipe"
else
  echo "training demo skipped: torch is not importable by $PY (run tools/setup.sh)"
fi
