#!/usr/bin/env bash
# The main job: set up, build, then show qrecipe at work.
#   1. a short tour of the CLI on the default recipe: the plugins, `recipe check`,
#      `recipe explain` for the demo model's layers on Hopper, and one quantize per format
#      (error, SNR, bytes per element);
#   2. examples/char_lm_demo.py: a small GPT-style character-level language model (qrecipe's
#      LayerNormLinear, LayerNormMLP and Linear) trained on Shakespeare under the recipes next
#      to a baseline from the same seed (FP32 on the CPU, BF16 on a GPU), with a progress bar,
#      a table of final losses, a PNG of the loss curves and a text sample.
#
#   tools/demo.sh [char_lm_demo.py options]
#   tools/demo.sh --recipe recipes/default.yaml recipes/mxfp8.yaml    # several recipes
#   tools/demo.sh --steps 8                                           # the short mode
#
# Exit status: 0 when every training run finished and its loss fell; non-zero otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/setup.sh >/dev/null
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "demo.sh: torch is not importable by $PY; the training demo needs it." >&2
  echo "  run tools/setup.sh without QRECIPE_SETUP_TORCH=0 (it installs the pinned CPU torch)" >&2
  exit 1
fi
BUILD_DIR="$root/build" bash tools/build.sh -DQRECIPE_PYTHON=ON \
  "-DPython_EXECUTABLE=$("$PY" -c "import sys; print(sys.executable)")" >/dev/null
qr="$root/build/bin/qrecipe"
recipe=recipes/default.yaml

run() { echo; echo "\$ qrecipe $*"; "$qr" "$@"; }
run plugins
run recipe check "$recipe"
# The demo model's GEMMs (examples/char_lm.py, at its GPU size: width 384, 32 x 256 tokens)
# as the recipe treats them on Hopper.
run recipe explain "$recipe" --device sm90 --tokens 8192 \
  --module layernorm_linear:layers.0.attn.qkv:384:1152 --module linear:layers.0.attn.proj:384:384 \
  --module layernorm_mlp:layers.0.mlp.fc1:384:1536 --module layernorm_mlp:layers.0.mlp.fc2:1536:384 \
  --module linear:lm_head:384:96
for fmt in $("$qr" plugins | awk '/^  [a-z0-9_]+ [0-9]/{print $1}'); do
  [[ "$fmt" == hybrid ]] && continue
  run quantize --format "$fmt" --shape 1024x1024 --seed 0
done

echo
echo "\$ python3 examples/char_lm_demo.py${*:+ $*}"
PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" examples/char_lm_demo.py "$@"
