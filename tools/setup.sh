#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and test qrecipe. Idempotent: a second run
# checks and returns in seconds. Pins are exact so every machine builds the same thing.
#   apt : yaml-cpp (recipes), Boost (Boost.DLL plugin loading), doctest (C++ tests), clang
#         with its runtimes (libFuzzer, ASan/UBSan/TSan: the sanitizer, fuzz and TSan stages)
#   pip : torch (CPU build, for the adapter), pytest, scikit-build-core (pip install of the
#         adapter), tqdm and matplotlib (the training demo's progress bar and loss plot),
#         cuBLASLt headers (CUDA build, compile only here), CUTLASS headers (the
#         nvidia-cutlass wheel: the grouped GEMMs of CUDA builds, docs/gemm.md; installed
#         without its Python dependencies, only its headers are used)
set -euo pipefail

APT_PACKAGES=(libyaml-cpp-dev libboost-dev doctest-dev clang libclang-rt-dev)
PIP_PINS=("nvidia-cublas==13.1.0.3")
# Header-only use: --no-deps keeps its Python runtime (cuda-python, ...) off the machine.
NODEPS_PINS=("nvidia-cutlass==4.2.0.0")
if [[ "${QRECIPE_SETUP_TORCH:-1}" == 1 ]]; then
  # scikit-build-core: `pip install --no-build-isolation .` of the adapter (pyproject.toml)
  PIP_PINS+=("torch==2.13.0" "pytest==8.3.3" "numpy>=1.26,<3" "scikit-build-core==1.1.2")
  # examples/char_lm_demo.py (tools/demo.sh, and its short mode in tools/test.sh)
  PIP_PINS+=("tqdm==4.70.1" "matplotlib==3.10.8")
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] apt-get install ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# The pins of a list that are missing or at another version.
missing_pins() {
  local pin name want have
  for pin in "$@"; do
    name=${pin%%[=<>]*}
    want=${pin#"$name"}
    have=$($PY -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    if [[ -z "$have" ]]; then echo "$pin"; continue; fi
    if [[ "$want" == ==* && "$have" != "${want#==}" ]]; then echo "$pin"; fi
  done
}
mapfile -t need_pip < <(missing_pins "${PIP_PINS[@]}")
if ((${#need_pip[@]})); then
  echo "[setup] pip install ${need_pip[*]}"
  $PY -m pip install -q --disable-pip-version-check "${need_pip[@]}"
fi
mapfile -t need_nodeps < <(missing_pins "${NODEPS_PINS[@]}")
if ((${#need_nodeps[@]})); then
  echo "[setup] pip install --no-deps ${need_nodeps[*]}"
  $PY -m pip install -q --disable-pip-version-check --no-deps "${need_nodeps[@]}"
fi
echo "[setup] ok"
