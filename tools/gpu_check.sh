#!/usr/bin/env bash
# The one script for a GPU machine: build with CUDA, run every C++ suite (test_gpu_parity
# included: CUDA == CPU bit for bit), the benchmarks, the training demo on the GPU and the
# README's pip install path.
#
#   tools/gpu_check.sh [configure|build|test|bench|demo|llama|tp|fsdp|optim|grouped|pip|all]...
#                                     (default: all = build test bench demo llama tp fsdp pip)
#
#   configure  unpack .deps and configure only (build does this too when needed)
#   build      unpack, configure unless $BUILD_DIR/CMakeCache.txt exists, build everything
#   test       ctest -j8 (every suite, the test_gpu_parity_<format> entries included)
#   grouped    the MoE grouped GEMMs alone (docs/gemm.md "Grouped GEMMs"; not part of all, whose
#              test and bench stages run the same suites and benchmark): the grouped ctest
#              suites (test_gpu_grouped_gemm: grouped == per-expert GEMMs and the CPU reference,
#              every shipped recipe, host and device splits), the adapter's grouped pytest files
#              (device splits with no host synchronization), then bench_grouped_linear.py with
#              a budget that keeps it under 3 minutes on an H100, writing
#              $OUT/bench_grouped_linear.json and $OUT/bench_grouped_linear.md
#   bench      bench_quantize --out $OUT/bench.json, bench_gemm --out $OUT/bench_gemm.json,
#              bench/bench_linear.py --out $OUT/bench_linear.json and
#              bench/bench_grouped_linear.py --out $OUT/bench_grouped_linear.json and
#              bench/bench_fsdp.py --out $OUT/bench_fsdp.json (world size 1) and
#              bench/bench_optimizer.py --out $OUT/bench_optimizer.json and
#              bench/bench_telemetry.py --out $OUT/bench_telemetry.json (when the adapter is
#              built)
#   demo       examples/char_lm_demo.py --device cuda (the demo of tools/demo.sh at its GPU size:
#              1000 steps of a 4-block GPT) under recipes/default.yaml (native FP8 on Hopper),
#              mxfp8.yaml and nvfp4.yaml (emulated there) next to a BF16 baseline; its table,
#              sample and $OUT/demo/char_lm_loss.png (skipped without the adapter). Needs tqdm
#              and matplotlib: when python3 lacks them they are installed offline from .whl/
#              (git-ignored; carry it), filled beforehand on a machine with network by
#                pip download --only-binary=:all: --python-version 3.12 --no-deps \
#                  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#                  -d .whl tqdm==4.70.1 matplotlib==3.10.8 contourpy==1.3.3 \
#                  cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 pillow==13.0.0 \
#                  pyparsing==3.3.2 python-dateutil==2.9.0.post0 six==1.17.0 packaging==26.2
#   llama      bench/bench_rms_norm.py --out $OUT/bench_rms_norm.json (the fused RMSNorm
#              against HF's formula), then bench/bench_hf_llama.py --out
#              $OUT/bench_hf_llama.json: a Hugging Face Llama
#              step with Llama-3-8B layer shapes, BF16 / torchao / qrecipe, eager and compiled
#              (needs the adapter and transformers; skipped, not failed, without them)
#   tp         torchrun on 2 GPUs (NCCL; NVLink multicast off) of bench/bench_tp.py --check
#              --out $OUT/bench_tp.json: a tensor + sequence parallel block, qrecipe against
#              BF16, step time and collective bytes; skipped when fewer than 2 GPUs are visible
#   fsdp       torchrun on FSDP_WORLD GPUs (default 2; NCCL; NVLink multicast off) of
#              bench/bench_fsdp.py --out $OUT/bench_fsdp_ws<N>.json (and .md): FSDP2 steps
#              per recipe (qrecipe.optim.FusedAdam; <recipe>+adamw: FP32 masters + AdamW +
#              requantize_) against BF16 FSDP2 + AdamW(fused), bytes all-gathered and
#              reduce-scattered, peak memory, and the world-size-N vs one-GPU equality check
#              (about 2 minutes on 2 H100s); skipped when fewer than 2 GPUs are visible
#   optim      the optimizer's GPU checks alone, after the build stage (about a minute on an
#              H100): ctest test_gpu_optim (qrecipe::adam_step on CUDA == on the CPU, bit for
#              bit: every format's fused kernels, the two-pass path, plain tensors, capturable),
#              pytest tests/python/test_optim_cuda.py (qrecipe.optim.FusedAdam on CUDA == on the
#              CPU under every shipped recipe, CUDA-graph replay) and bench/bench_optimizer.py
#              --out $OUT/bench_optimizer.json (fused step vs its byte floor, vs
#              torch.optim.AdamW(fused=True) + quantize per parameter, vs TE's order), its
#              table in $OUT/optim.md. The test and bench stages run the same suites among
#              the others.
#   pip        the README's install path (issue 23): `pip install --no-build-isolation` of the
#              repository into a fresh --target directory ($BUILD_DIR-pip-target; its CMake
#              build in $BUILD_DIR-pip, kept between calls), then tests/check_library_exports.sh
#              on the installed libraries (shared libstdc++, API-only exports) and, with only
#              that directory on PYTHONPATH, tools/pip_smoke.py: a CUDA qrecipe.nn.Linear
#              forward+backward and a GroupedLinear forward under every shipped recipe
#
# It needs nvcc, cmake (>= 3.24), ninja (or make) and python3 on the machine, and the Debian
# packages of the other dependencies in .deps/ (libyaml-cpp-dev, libyaml-cpp0.7,
# libboost1.74-dev, doctest-dev): they are unpacked with `dpkg -x` into $QRECIPE_DEPS_PREFIX
# (default /opt/deps; nothing is installed system-wide, no network is used). The CUTLASS
# headers of the grouped GEMMs come from the nvidia-cutlass wheel: the installed package when
# python3 imports cutlass_library, else .whl/nvidia_cutlass-*.whl unzipped into the same prefix
# (without either the build has no grouped kernels, and the configure log says so).
#
# Environment:
#   OUT                  where logs and bench.json go (default ./gpu-out)
#   BUILD_DIR            build directory (default build-gpu-run; kept between calls, configure
#                        is skipped when its CMakeCache.txt exists)
#   QRECIPE_DEPS_PREFIX  where the .deb files are unpacked (default /opt/deps, or
#                        $BUILD_DIR-deps when /opt is not writable)
#   CUDA_ARCHS           CMAKE_CUDA_ARCHITECTURES (default 90a)
#   JOBS                 build and ctest parallelism (default: nproc for the build, 8 for ctest)
#   BENCH_ARGS           extra arguments for bench_quantize (e.g. "--runs 50")
#   BENCH_GEMM_ARGS      extra arguments for bench_gemm (e.g. "--shapes 4096x4096x4096")
#   BENCH_LINEAR_ARGS    extra arguments for bench_linear.py (e.g. "--recipes default,blockwise")
#   BENCH_GROUPED_ARGS   extra arguments for bench_grouped_linear.py (e.g. "--experts 64 --tokens 512")
#   GROUPED_BUDGET_S     the grouped stage's benchmark budget in seconds after start-up (default 130)
#   BENCH_HF_ARGS        extra arguments for bench_hf_llama.py (e.g. "--check --samples 7")
#   BENCH_TP_ARGS        extra arguments for bench_tp.py (e.g. "--recipes default --seq 4096")
#   BENCH_FSDP_ARGS      extra arguments for bench_fsdp.py in the bench stage (world size 1)
#   FSDP_WORLD           GPUs the fsdp stage runs on (default 2)
#   FSDP_ARGS            extra arguments for bench_fsdp.py in the fsdp stage
#   DEMO_ARGS            arguments for char_lm_demo.py instead of the three recipes (e.g.
#                        "--recipe recipes/default.yaml --steps 300")
#   BENCH_OPTIMIZER_ARGS extra arguments for bench_optimizer.py (e.g. "--recipes default,mxfp8")
#   QRECIPE_GPU_PYTHON   0: do not build the PyTorch adapter (default: built when python3 has
#                        a CUDA torch; then the test stage also runs pytest tests/python).
#                        The pip stage needs a CUDA torch whatever this says
#   CMAKE_ARGS           extra arguments for the configure step
#   QRECIPE_COMMIT       recorded in bench.json (default: git rev-parse HEAD, or "unknown")
#
# Output: $OUT/<stage>.log per stage (plus env.log, configure.log, ctest_full.log with the
# output of every test, bench.json), each stage timed, and a summary table printed last.
# Exit status: non-zero if any stage failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-gpu-run}
DEPS=${QRECIPE_DEPS_PREFIX:-/opt/deps}
# Without write access to /opt (not root), unpack beside the build instead.
if [[ -z ${QRECIPE_DEPS_PREFIX:-} ]] && ! mkdir -p "$DEPS" 2>/dev/null; then DEPS=$BUILD_DIR-deps; fi
CUDA_ARCHS=${CUDA_ARCHS:-90a}
NPROC=$(nproc 2>/dev/null || echo 8)
BUILD_JOBS=${JOBS:-$NPROC}
TEST_JOBS=${JOBS:-8}
MULTIARCH=x86_64-linux-gnu

stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(all)
if [[ " ${stages[*]} " == *" all "* ]]; then stages=(build test bench demo llama tp fsdp pip); fi
for s in "${stages[@]}"; do
  case $s in configure|build|test|bench|demo|llama|tp|fsdp|optim|grouped|pip) ;;
    *) echo "gpu_check.sh: unknown stage '$s' (configure, build, test, bench, demo, llama, tp, fsdp, optim, grouped, pip, all)" >&2
       exit 2 ;;
  esac
done

declare -A status seconds
summary_order=()

# stage NAME FUNCTION: runs FUNCTION with its output in $OUT/NAME.log (tail shown on failure).
# FUNCTION returns SKIPPED when the machine cannot run the stage (its log says why).
SKIPPED=77
stage() {
  local name=$1 fn=$2 t0=$SECONDS rc
  echo "=== [$name] start (log: $OUT/$name.log)"
  "$fn" >"$OUT/$name.log" 2>&1
  rc=$?
  seconds[$name]=$((SECONDS - t0))
  summary_order+=("$name")
  if [[ $rc -eq $SKIPPED ]]; then
    status[$name]=skipped
    tail -n 3 "$OUT/$name.log"
    rc=0
  elif [[ $rc -eq 0 ]]; then
    status[$name]=ok
  else
    status[$name]="FAILED (rc $rc)"
    echo "--- last 60 lines of $name.log:"
    tail -n 60 "$OUT/$name.log"
  fi
  echo "=== [$name] ${status[$name]} in ${seconds[$name]} s"
  return $rc
}

# ---------------------------------------------------------------- dependencies

# Unpacks .deps/*.deb into $DEPS once (a stamp records which files were unpacked).
unpack_deps() {
  shopt -s nullglob
  local debs=("$root"/.deps/*.deb)
  shopt -u nullglob
  if [[ ${#debs[@]} -eq 0 ]]; then
    echo "no .deb files in $root/.deps; copy libyaml-cpp-dev, libyaml-cpp0.7, libboost1.74-dev" \
         "and doctest-dev there (the remote run must carry .deps: it is git-ignored)"
    return 1
  fi
  local stamp="$DEPS/.qrecipe-deps-stamp" want
  want=$(cd "$root/.deps" && ls -l --time-style=+%s ./*.deb | awk '{print $5, $6, $7}')
  if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    echo "dependencies already unpacked in $DEPS"
    return 0
  fi
  mkdir -p "$DEPS" || return 1
  for f in "${debs[@]}"; do
    echo "unpacking $(basename "$f") into $DEPS"
    if command -v dpkg >/dev/null; then
      dpkg -x "$f" "$DEPS" || return 1
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      python3 - "$f" "$DEPS" <<'PY' || return 1
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb + " is not a .deb (ar) archive"
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
    pos += 60 + size + (size & 1)
PY
    fi
  done
  echo "$want" >"$stamp"
}

# ---------------------------------------------------------------- configure + build

find_cublaslt_include() {
  local c
  for c in "${CUDAToolkit_ROOT:-}/include" /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include \
           /usr/local/cuda-*/include /usr/local/cuda-*/targets/x86_64-linux/include /usr/include; do
    [[ -f $c/cublasLt.h ]] && { echo "$c"; return 0; }
  done
  c=$(python3 - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for base in nvidia.__path__:
    for sub in ("cu13/include", "cublas/include"):
        if os.path.isfile(os.path.join(base, sub, "cublasLt.h")):
            print(os.path.join(base, sub)); raise SystemExit(0)
PY
)
  [[ -n $c ]] && echo "$c"
}

# The CUTLASS include folder (cutlass/cutlass.h): the installed nvidia-cutlass package, or
# .whl/nvidia_cutlass-*.whl unzipped once into $DEPS/nvidia-cutlass (a wheel is a zip).
find_cutlass_include() {
  local c
  c=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" 2>/dev/null)
  if [[ -n $c && -f $c/cutlass/cutlass.h ]]; then echo "$c"; return 0; fi
  shopt -s nullglob
  local wheels=("$root"/.whl/nvidia_cutlass-*.whl)
  shopt -u nullglob
  [[ ${#wheels[@]} -eq 0 ]] && return 0
  c=$DEPS/nvidia-cutlass/cutlass_library/source/include
  if [[ ! -f $c/cutlass/cutlass.h ]]; then
    mkdir -p "$DEPS/nvidia-cutlass" && python3 -m zipfile -e "${wheels[0]}" "$DEPS/nvidia-cutlass" >&2 || return 0
  fi
  [[ -f $c/cutlass/cutlass.h ]] && echo "$c"
}

find_nvcc() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  echo "$nvcc"
}

# The -D arguments every configure of this machine needs (the build stage's and the pip
# stage's): CUDA, the architectures and where the unpacked dependencies are (CUTLASS's headers
# for the grouped GEMM kernels included). The C++ runtime needs none: CMake links the shared
# libstdc++ itself (cmake/QrecipeRuntime.cmake), whatever the compiler's default, and stops at
# configure time if it cannot.
dependency_args() {
  local nvcc=$1 cublas=$2
  local args=(
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
    -DQRECIPE_CUDA=ON
    -DCMAKE_CUDA_COMPILER="$nvcc"
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"
    -DCMAKE_PREFIX_PATH="$DEPS/usr"
    # Explicit config directories: found even where CMake does not search the Debian
    # multiarch directory (CMAKE_LIBRARY_ARCHITECTURE empty on non-Debian hosts).
    -Dyaml-cpp_DIR="$DEPS/usr/lib/$MULTIARCH/cmake/yaml-cpp"
    -Ddoctest_DIR="$DEPS/usr/lib/cmake/doctest"
    -DBoost_DIR="$DEPS/usr/lib/$MULTIARCH/cmake/Boost-1.74.0"
    -DBoost_INCLUDE_DIR="$DEPS/usr/include"
    -DBOOST_ROOT="$DEPS/usr"
  )
  [[ -n $cublas ]] && args+=(-DQRECIPE_CUBLASLT_INCLUDE_DIR="$cublas")
  local cutlass
  cutlass=$(find_cutlass_include)
  [[ -n $cutlass ]] && args+=(-DQRECIPE_CUTLASS_INCLUDE_DIR="$cutlass")
  printf '%s\n' "${args[@]}"
}

configure() {
  local nvcc cublas generator=()
  nvcc=$(find_nvcc)
  if [[ -z $nvcc ]]; then echo "nvcc not found (PATH or /usr/local/cuda/bin)"; return 1; fi
  cublas=$(find_cublaslt_include)
  echo "nvcc: $nvcc"
  echo "cublasLt.h: ${cublas:-not found (configure will say what to do)}"
  local cutlass
  cutlass=$(find_cutlass_include)
  echo "CUTLASS headers: ${cutlass:-not found (no grouped GEMM kernels in this build)}"
  command -v ninja >/dev/null && generator=(-G Ninja)
  local args=(-S "$root" -B "$BUILD_DIR" "${generator[@]}" -DQRECIPE_PYTHON="$(python_adapter)")
  mapfile -t -O "${#args[@]}" args < <(dependency_args "$nvcc" "$cublas")
  # shellcheck disable=SC2206  # CMAKE_ARGS is a list of words on purpose
  [[ -n ${CMAKE_ARGS:-} ]] && args+=(${CMAKE_ARGS})
  echo "cmake ${args[*]}"
  cmake "${args[@]}" || return 1
  # Where the dependencies were found (they must all be under $DEPS on the GPU machine).
  grep -E '^(yaml-cpp_DIR|doctest_DIR|Boost_DIR|Boost_INCLUDE_DIR|QRECIPE_CUBLASLT_INCLUDE_DIR|QRECIPE_CUTLASS_INCLUDE_DIR|CMAKE_CUDA_COMPILER):' \
    "$BUILD_DIR/CMakeCache.txt"
}

# The PyTorch adapter is built (and its suites and the Linear step benchmark run) when the
# machine's python3 imports a CUDA torch; QRECIPE_GPU_PYTHON=0 turns it off.
python_adapter() {
  if [[ ${QRECIPE_GPU_PYTHON:-1} != 0 ]] &&
     python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo ON
  else
    echo OFF
  fi
}

has_adapter() { [[ -d $BUILD_DIR/python/qrecipe && -n $(ls "$BUILD_DIR"/python/qrecipe/_C*.so 2>/dev/null) ]]; }

print_env() {
  echo "--- environment"
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    uname -a
    nvidia-smi -L 2>&1 || echo "nvidia-smi not available"
    (command -v nvcc >/dev/null && nvcc --version) || /usr/local/cuda/bin/nvcc --version
    cmake --version | head -1
    command -v ninja >/dev/null && echo "ninja $(ninja --version)"
    echo "cores: $NPROC"
  } 2>&1 | tee "$OUT/env.log"
}

do_configure() {
  print_env
  echo "--- dependencies"
  unpack_deps || return 1
  echo "--- configure"
  configure  # this stage's log is configure.log already
}

do_build() {
  print_env
  echo "--- dependencies"
  unpack_deps || return 1
  if [[ -f $BUILD_DIR/CMakeCache.txt ]]; then
    echo "--- configure skipped: $BUILD_DIR/CMakeCache.txt exists (delete $BUILD_DIR to reconfigure)"
  else
    echo "--- configure"
    configure 2>&1 | tee "$OUT/configure.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || return 1
  fi
  echo "--- build (-j$BUILD_JOBS)"
  cmake --build "$BUILD_DIR" -j "$BUILD_JOBS"
}

# The shared libyaml-cpp.so.0.7 from the .deb (the static archive in libyaml-cpp-dev is not
# position-independent, so it cannot go into libqrecipe.so). CMake's build RPATH finds it too;
# this is a second way.
runtime_env() {
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$MULTIARCH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# ---------------------------------------------------------------- test

do_test() {
  runtime_env
  if [[ ! -f $BUILD_DIR/CTestTestfile.cmake ]]; then echo "no build in $BUILD_DIR: run the build stage first"; return 1; fi
  (cd "$BUILD_DIR" && ctest -j "$TEST_JOBS" --output-on-failure --timeout 1800)
  local rc=$?
  # ctest keeps the full output of every test, passing ones included.
  cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$OUT/ctest_full.log" 2>/dev/null || true
  if has_adapter; then
    # The adapter suites with this machine's CUDA torch: the CPU suites plus the CUDA ones
    # (tests/python/test_cuda.py: CUDA == CPU reference, current stream, no CPU fallback).
    echo "--- pytest (PyTorch adapter, $(python3 -c 'import torch; print(torch.__version__)'))"
    # A hung FSDP launch (tests/python/test_fsdp.py) fails after 5 minutes with its ranks' stacks.
    QRECIPE_FSDP_TIMEOUT_S=300 PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q -p no:cacheprovider "$root/tests/python" \
      || rc=1
    # FSDP2 with quantized parameters on the GPU: the same cases with NCCL at world size 1
    # (the all-gather hooks still pack and unpack every weight; tests/python/test_fsdp.py).
    echo "--- pytest test_fsdp.py with NCCL, world size 1"
    QRECIPE_FSDP_BACKEND=nccl QRECIPE_FSDP_WORLDS=1 QRECIPE_FSDP_TIMEOUT_S=240 PYTHONPATH="$BUILD_DIR/python" \
      python3 -m pytest -q -p no:cacheprovider "$root/tests/python/test_fsdp.py" || rc=1
  else
    echo "--- pytest skipped: the adapter was not built (no CUDA torch, or QRECIPE_GPU_PYTHON=0)"
  fi
  return $rc
}

# ---------------------------------------------------------------- bench

do_bench() {
  runtime_env
  local bin=$BUILD_DIR/bin/bench_quantize
  if [[ ! -x $bin ]]; then echo "no $bin: run the build stage first"; return 1; fi
  set_commit
  local rc=0
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words on purpose
  "$bin" --out "$OUT/bench.json" ${BENCH_ARGS:-} || rc=1
  # qrecipe::gemm() against raw cuBLASLt (bench/bench_gemm.cu).
  if [[ -x $BUILD_DIR/bin/bench_gemm ]]; then
    # shellcheck disable=SC2086  # BENCH_GEMM_ARGS is a list of words on purpose
    "$BUILD_DIR/bin/bench_gemm" --out "$OUT/bench_gemm.json" ${BENCH_GEMM_ARGS:-} || rc=1
    # qrecipe.nn.Linear steps per recipe against BF16 and their floor (bench/bench_linear.py).
    if has_adapter; then
      # shellcheck disable=SC2086  # BENCH_LINEAR_ARGS is a list of words on purpose
      PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_linear.py" \
        --out "$OUT/bench_linear.json" ${BENCH_LINEAR_ARGS:-} || rc=1
      # qrecipe.nn.GroupedLinear (MoE experts) against separate layers (bench/bench_grouped_linear.py).
      # shellcheck disable=SC2086  # BENCH_GROUPED_ARGS is a list of words on purpose
      PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_grouped_linear.py" \
        --out "$OUT/bench_grouped_linear.json" --md "$OUT/bench_grouped_linear.md" \
        ${BENCH_GROUPED_ARGS:-} || rc=1
      # FSDP2 steps with quantized parameters against BF16 FSDP2 at world size 1 (bytes the
      # all-gather would move, step time, the FSDP2-vs-one-GPU check; bench/bench_fsdp.py).
      # shellcheck disable=SC2086  # BENCH_FSDP_ARGS is a list of words on purpose
      PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_fsdp.py" \
        --out "$OUT/bench_fsdp.json" ${BENCH_FSDP_ARGS:-} || rc=1
      # qrecipe.optim.FusedAdam on ~1B quantized parameters per weight format, against its
      # byte floor, TE's order and torch AdamW + quantize (bench/bench_optimizer.py).
      # shellcheck disable=SC2086  # BENCH_OPTIMIZER_ARGS is a list of words on purpose
      PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_optimizer.py" \
        --out "$OUT/bench_optimizer.json" ${BENCH_OPTIMIZER_ARGS:-} || rc=1
      # What qrecipe.telemetry costs off and on (bench/bench_telemetry.py).
      PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_telemetry.py" \
        --out "$OUT/bench_telemetry.json" || rc=1
    fi
  fi
  merge_results || rc=1
  return $rc
}

# One file of the results format (bench/results/<date>-<gpu>.json) and its markdown table, of
# every benchmark file this run (or an earlier one into the same $OUT) wrote.
merge_results() {
  local parts=()
  for f in bench.json bench_gemm.json bench_linear.json bench_grouped_linear.json \
           bench_optimizer.json bench_rms_norm.json bench_hf_llama.json bench_tp.json bench_fsdp.json \
           "bench_fsdp_ws${FSDP_WORLD:-2}.json"; do
    [[ -f $OUT/$f ]] && parts+=("$OUT/$f")
  done
  [[ ${#parts[@]} -eq 0 ]] && return 0
  python3 "$root/tools/bench_table.py" --merge "$OUT/results.json" "${parts[@]}" >"$OUT/results.md"
}

# ---------------------------------------------------------------- demo

# The training demo on the GPU: every run must train and its loss fall (the demo's exit status).
do_demo() {
  runtime_env
  if ! has_adapter; then echo "demo: the adapter was not built (no CUDA torch)"; return $SKIPPED; fi
  if ! python3 -c 'import tqdm, matplotlib' 2>/dev/null; then
    shopt -s nullglob
    local wheels=("$root"/.whl/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
      echo "demo: python3 lacks tqdm or matplotlib and $root/.whl holds no wheels: download" \
           "them there (the pip download command in this script's header) and carry .whl"
      return 1
    fi
    echo "--- installing tqdm and matplotlib from .whl (offline)"
    python3 -m pip install --no-index --find-links "$root/.whl" tqdm matplotlib || return 1
  fi
  local args
  # shellcheck disable=SC2206  # DEMO_ARGS is a list of words on purpose
  args=(${DEMO_ARGS:---recipe recipes/default.yaml recipes/mxfp8.yaml recipes/nvfp4.yaml})
  echo "--- python3 examples/char_lm_demo.py --device cuda --out $OUT/demo ${args[*]}"
  PYTHONPATH="$BUILD_DIR/python" python3 "$root/examples/char_lm_demo.py" --device cuda \
    --out "$OUT/demo" "${args[@]}"
}

# ---------------------------------------------------------------- llama

# A Hugging Face Llama step (Llama-3-8B layer shapes): BF16, torchao float8 and qrecipe, eager
# and compiled (bench/bench_hf_llama.py).
do_llama() {
  runtime_env
  if ! has_adapter; then echo "llama: the adapter was not built (no CUDA torch)"; return $SKIPPED; fi
  if ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "llama: no CUDA device visible to torch"; return $SKIPPED
  fi
  if ! python3 -c "import transformers" >/dev/null 2>&1; then
    echo "llama: transformers is not importable by python3"; return $SKIPPED
  fi
  local rc=0
  # The fused RMSNorm against HF's formula (a few seconds), then the whole model.
  PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_rms_norm.py" \
    --out "$OUT/bench_rms_norm.json" || rc=1
  # shellcheck disable=SC2086  # BENCH_HF_ARGS is a list of words on purpose
  PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_hf_llama.py" \
    --out "$OUT/bench_hf_llama.json" ${BENCH_HF_ARGS:-} || rc=1
  merge_results || rc=1
  return $rc
}

# ---------------------------------------------------------------- tp

# Tensor + sequence parallelism on 2 GPUs (bench/bench_tp.py --check: the 2-rank output
# against one process, then step time and collective bytes against BF16 TP). NVLink
# multicast (NVLS, symmetric memory) stays off: the lent machines do not allow it.
do_tp() {
  runtime_env
  if ! has_adapter; then echo "tp: the adapter was not built (no CUDA torch)"; return $SKIPPED; fi
  local gpus
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [[ ${gpus:-0} -lt 2 ]]; then
    echo "tp: needs 2 GPUs, $gpus visible"; return $SKIPPED
  fi
  local rc=0
  # shellcheck disable=SC2086  # BENCH_TP_ARGS is a list of words on purpose
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    PYTHONPATH="$BUILD_DIR/python" timeout 300 python3 -m torch.distributed.run --standalone \
    --nproc-per-node 2 "$root/bench/bench_tp.py" --check --out "$OUT/bench_tp.json" \
    ${BENCH_TP_ARGS:-} || rc=1
  merge_results || rc=1
  return $rc
}

# ---------------------------------------------------------------- fsdp

# FSDP2 with quantized parameters on FSDP_WORLD GPUs (bench/bench_fsdp.py: steps per recipe
# against BF16 FSDP2, collective bytes, peak memory, the N-GPU vs one-GPU equality check).
# NVLink multicast stays off, in the ranks too (torchrun passes the environment on).
do_fsdp() {
  runtime_env
  if ! has_adapter; then echo "fsdp: the adapter was not built (no CUDA torch)"; return $SKIPPED; fi
  local gpus world=${FSDP_WORLD:-2}
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [[ ${gpus:-0} -lt 2 ]]; then
    echo "fsdp: needs 2 GPUs, $gpus visible"; return $SKIPPED
  fi
  if [[ $world -gt $gpus ]]; then echo "fsdp: FSDP_WORLD=$world but $gpus GPUs visible"; return 1; fi
  local rc=0
  # shellcheck disable=SC2086  # FSDP_ARGS is a list of words on purpose
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    PYTHONPATH="$BUILD_DIR/python" timeout 600 python3 -m torch.distributed.run --standalone \
    --nproc-per-node "$world" "$root/bench/bench_fsdp.py" --out "$OUT/bench_fsdp_ws$world.json" \
    --md "$OUT/bench_fsdp_ws$world.md" ${FSDP_ARGS:-} || rc=1
  [[ -f $OUT/bench_fsdp_ws$world.md ]] && cat "$OUT/bench_fsdp_ws$world.md"
  merge_results || rc=1
  return $rc
}

# ---------------------------------------------------------------- grouped

set_commit() {
  if [[ -z ${QRECIPE_COMMIT:-} ]]; then
    QRECIPE_COMMIT=$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null) || QRECIPE_COMMIT=unknown
    if [[ $QRECIPE_COMMIT != unknown ]] && [[ -n $(git -C "$root" status --porcelain 2>/dev/null) ]]; then
      QRECIPE_COMMIT="$QRECIPE_COMMIT-dirty"
    fi
  fi
  export QRECIPE_COMMIT
}

# The MoE grouped GEMMs: results on the GPU against per-expert GEMMs and the CPU reference,
# device splits without host synchronization, then the grouped benchmark in under 3 minutes.
do_grouped() {
  runtime_env
  set_commit
  if [[ ! -f $BUILD_DIR/CTestTestfile.cmake ]]; then echo "no build in $BUILD_DIR: run the build stage first"; return 1; fi
  if ! has_adapter; then
    echo "the grouped stage needs the PyTorch adapter (a CUDA torch for python3; QRECIPE_GPU_PYTHON not 0)"
    return 1
  fi
  local rc=0 t0
  echo "--- grouped GEMMs on the GPU == per-expert GEMMs and the CPU reference (ctest, verbose)"
  (cd "$BUILD_DIR" && ctest -V --timeout 1200 \
     -R '^(test_grouped_gemm|test_grouped_quantize|test_gpu_grouped|test_gpu_grouped_gemm)$') \
     >"$OUT/grouped_ctest.log" 2>&1 || rc=1
  grep -E '% tests passed|grouped kernels built|grouped GEMM parity|fprop .* grouped .* per expert|ERROR|not supported' \
    "$OUT/grouped_ctest.log" | sed -E 's/^[0-9]+: //' | head -n 40
  [[ $rc -eq 0 ]] || { echo "grouped ctest FAILED: see $OUT/grouped_ctest.log"; tail -n 80 "$OUT/grouped_ctest.log"; }
  echo "--- adapter: GroupedLinear on CUDA (device splits, no host synchronization) and on the CPU"
  local py_log=$OUT/grouped_pytest.log
  PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q -rs -p no:cacheprovider \
    "$root/tests/python/test_grouped_cuda.py" "$root/tests/python/test_grouped_linear.py" 2>&1 | tee "$py_log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  # On a GPU machine the CUDA cases must run: a skip there means no usable CUDA torch.
  if grep -qE 'SKIPPED .*needs a CUDA device' "$py_log"; then
    echo "FAILED: CUDA cases were skipped on the GPU machine (see above)"
    rc=1
  fi
  echo "--- bench_grouped_linear.py (budget ${GROUPED_BUDGET_S:-130} s after start-up)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # BENCH_GROUPED_ARGS is a list of words on purpose
  PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_grouped_linear.py" \
    --budget-s "${GROUPED_BUDGET_S:-130}" --out "$OUT/bench_grouped_linear.json" \
    --md "$OUT/bench_grouped_linear.md" ${BENCH_GROUPED_ARGS:-} || rc=1
  echo "bench_grouped_linear.py took $((SECONDS - t0)) s (must stay under 180 s)"
  return $rc
}

# ---------------------------------------------------------------- optim

# The optimizer alone: its CUDA == CPU suites, then its benchmark (targets are reported by
# bench_optimizer.py, not asserted: a missed target does not fail the stage).
do_optim() {
  runtime_env
  if [[ ! -f $BUILD_DIR/CTestTestfile.cmake ]]; then echo "no build in $BUILD_DIR: run the build stage first"; return 1; fi
  if ! has_adapter; then
    echo "the PyTorch adapter was not built in $BUILD_DIR (no CUDA torch, or QRECIPE_GPU_PYTHON=0):" \
         "the optim stage needs it for pytest and bench_optimizer.py"
    return 1
  fi
  local rc=0 t0=$SECONDS
  echo "--- ctest test_gpu_optim"
  (cd "$BUILD_DIR" && ctest -R '^test_gpu_optim$' --output-on-failure --timeout 600 -V) || rc=1
  echo "--- ctest took $((SECONDS - t0)) s"; t0=$SECONDS
  echo "--- pytest tests/python/test_optim_cuda.py"
  PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q -p no:cacheprovider -rs \
    "$root/tests/python/test_optim_cuda.py" || rc=1
  echo "--- pytest took $((SECONDS - t0)) s"; t0=$SECONDS
  [[ -n ${QRECIPE_COMMIT:-} ]] || QRECIPE_COMMIT=$(git -C "$root" rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
  export QRECIPE_COMMIT
  echo "--- bench/bench_optimizer.py"
  # shellcheck disable=SC2086  # BENCH_OPTIMIZER_ARGS is a list of words on purpose
  PYTHONPATH="$BUILD_DIR/python" python3 "$root/bench/bench_optimizer.py" \
    --out "$OUT/bench_optimizer.json" ${BENCH_OPTIMIZER_ARGS:-} || rc=1
  echo "--- bench took $((SECONDS - t0)) s"
  if [[ -f $OUT/bench_optimizer.json ]]; then
    python3 "$root/tools/bench_table.py" "$OUT/bench_optimizer.json" >"$OUT/optim.md" || rc=1
  fi
  return $rc
}

# ---------------------------------------------------------------- pip

# `pip install --no-build-isolation` imports the build backend (scikit-build-core) from this
# python3, and a GPU machine cannot reach an index: without it, install the wheels carried in
# .deps/wheels (`pip download --no-deps -d .deps/wheels scikit-build-core==1.1.2 packaging
# pathspec tomli exceptiongroup typing_extensions`, pure-Python wheels) into $BUILD_DIR-pip-tools
# and put that on PYTHONPATH, leaving the machine's site-packages alone.
ensure_build_backend() {
  if python3 -c 'import scikit_build_core' 2>/dev/null; then
    echo "scikit-build-core: $(python3 -c 'import scikit_build_core as s; print(s.__version__, s.__file__)')"
    return 0
  fi
  local tools=$BUILD_DIR-pip-tools
  shopt -s nullglob
  local wheels=("$root"/.deps/wheels/scikit_build_core-*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -eq 0 ]]; then
    echo "python3 has no scikit-build-core (pip install --no-build-isolation needs it) and" \
         "$root/.deps/wheels holds no scikit_build_core-*.whl to install offline; on a machine" \
         "with an index run: pip download --no-deps -d .deps/wheels scikit-build-core==1.1.2" \
         "packaging pathspec tomli exceptiongroup typing_extensions, and carry .deps"
    return 1
  fi
  echo "--- scikit-build-core from $root/.deps/wheels into $tools"
  rm -rf "$tools"
  python3 -m pip install -q --no-index --find-links "$root/.deps/wheels" --target "$tools" \
    scikit-build-core || return 1
  export PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c 'import scikit_build_core as s; print("scikit-build-core:", s.__version__, s.__file__)' \
    || return 1
}

# Exactly the README's install path, on this machine's python3 and CUDA torch: a fresh target
# directory, `pip install --no-build-isolation` of the repository (scikit-build-core runs the
# same CMake, with the dependency arguments of the build stage), then checks that use only the
# installed files.
do_pip() {
  print_env
  echo "--- dependencies"
  unpack_deps || return 1
  runtime_env  # libyaml-cpp.so.0.7 at run time, as the README says a user needs it
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "the pip stage needs python3 with a CUDA torch (the adapter is built against it)"
    return 1
  fi
  ensure_build_backend || return 1
  local nvcc cublas target=$BUILD_DIR-pip-target
  nvcc=$(find_nvcc)
  if [[ -z $nvcc ]]; then echo "nvcc not found (PATH or /usr/local/cuda/bin)"; return 1; fi
  cublas=$(find_cublaslt_include)
  local cmake_args
  cmake_args=$(dependency_args "$nvcc" "$cublas" | paste -sd ';')
  rm -rf "$target"
  echo "--- pip install --no-build-isolation --target $target (CMake build in $BUILD_DIR-pip)"
  echo "SKBUILD_CMAKE_ARGS=$cmake_args"
  QRECIPE_CUDA=ON SKBUILD_CMAKE_ARGS="$cmake_args" SKBUILD_BUILD_DIR="$BUILD_DIR-pip" \
    CMAKE_BUILD_PARALLEL_LEVEL="$BUILD_JOBS" \
    python3 -m pip install -v --no-build-isolation --target "$target" "$root" || return 1
  echo "--- installed: $(ls "$target/qrecipe" | tr '\n' ' ')"
  local rc=0
  echo "--- exports and C++ runtime of the installed libraries (tests/check_library_exports.sh)"
  bash "$root/tests/check_library_exports.sh" "$target/qrecipe" || rc=1
  echo "--- smoke test with only $target on PYTHONPATH (tools/pip_smoke.py)"
  (cd "$OUT" && PYTHONPATH="$target" python3 "$root/tools/pip_smoke.py" --device cuda \
     --expect-under "$target") || rc=1
  return $rc
}

# ---------------------------------------------------------------- summary

print_summary() {
  echo
  echo "================ gpu_check summary ================"
  printf '| %-9s | %-14s | %7s |\n' stage status seconds
  printf '|-----------|----------------|---------|\n'
  for s in "${summary_order[@]}"; do printf '| %-9s | %-14s | %7s |\n' "$s" "${status[$s]}" "${seconds[$s]}"; done
  if [[ -f $OUT/test.log && " ${summary_order[*]} " == *" test "* ]]; then
    echo
    grep -E '% tests passed' "$OUT/test.log" || echo "tests: no ctest summary line (see test.log)"
    grep -E '^\s+[0-9]+ - .* \((Failed|Timeout|Subprocess aborted|SEGFAULT|Not Run|Exception)' "$OUT/test.log" || true
    if [[ -f $OUT/ctest_full.log ]]; then
      # The parity suites' own output inside ctest's log (one entry per format): their
      # messages, first errors, doctest totals.
      echo "test_gpu_parity:"
      awk '/^[0-9]+\/[0-9]+ Test: test_gpu_parity/{on=1} on{print} on&&/^<end of output>/{on=0}' \
        "$OUT/ctest_full.log" >"$OUT/test_gpu_parity.log"
      grep -E 'MESSAGE: |ERROR: |\[doctest\] (test cases|assertions)' "$OUT/test_gpu_parity.log" \
        | sed -E 's/^.*(MESSAGE|ERROR): /  \1: /' | grep -v 'supports cpu only\|not in QRECIPE_GPU_PARITY_ONLY' | head -n 60
    fi
  fi
  if [[ " ${summary_order[*]} " == *" grouped "* ]]; then
    echo
    echo "grouped:"
    [[ -f $OUT/grouped_ctest.log ]] && grep -E '% tests passed|grouped GEMM parity|grouped kernels built' \
      "$OUT/grouped_ctest.log" | sed -E 's/^[0-9]+: //; s/^/  /'
    [[ -f $OUT/grouped_pytest.log ]] && tail -n 1 "$OUT/grouped_pytest.log" | sed 's/^/  pytest: /'
    grep -E '^bench_grouped_linear.py took' "$OUT/grouped.log" | sed 's/^/  /'
    [[ -f $OUT/bench_grouped_linear.md ]] && { echo; cat "$OUT/bench_grouped_linear.md"; }
  fi
  if [[ -f $OUT/demo.log && " ${summary_order[*]} " == *" demo "* ]]; then
    # The demo's table of losses and its time (tqdm's bars stay in demo.log).
    echo
    awk '/^final loss/{on=1} /^sample from/{on=0} on' "$OUT/demo.log"
    grep -E '^total training time|^FAILED' "$OUT/demo.log" || true
  fi
  if [[ -f $OUT/optim.log && " ${summary_order[*]} " == *" optim "* ]]; then
    # The optimizer stage: the CUDA == CPU suites' totals, the per-format benchmark lines and
    # their targets.
    echo
    echo "optim:"
    grep -E 'MESSAGE: |ERROR: |\[doctest\] (test cases|assertions)|[0-9]+ (passed|failed|skipped|errors?).* in [0-9.]+s|took [0-9]+ s|grads: |^targets|^ +(meets|BELOW)|copy bandwidth' \
      "$OUT/optim.log" | sed -E 's/^.*(MESSAGE|ERROR): /  \1: /' | head -n 80
  fi
  if [[ -f $OUT/pip.log && " ${summary_order[*]} " == *" pip "* ]]; then
    echo
    echo "pip install path:"
    grep -E '^(ok |FAIL|pip smoke test passed|qrecipe from|C\+\+ runtime)' "$OUT/pip.log" | sed 's/^/  /'
  fi
  if [[ -f $OUT/results.md && " ${summary_order[*]} " =~ \ (bench|llama|tp)\  ]]; then
    # Every benchmark record of this run (quantize, GEMM, Linear step), last.
    echo
    cat "$OUT/results.md"
  fi
}

failed=0
for s in "${stages[@]}"; do
  case $s in
    configure) stage configure do_configure || { failed=1; break; } ;;
    build) stage build do_build || { failed=1; break; } ;;  # nothing to test without a build
    test) stage test do_test || failed=1 ;;
    bench) stage bench do_bench || failed=1 ;;
    grouped) stage grouped do_grouped || failed=1 ;;
    demo) stage demo do_demo || failed=1 ;;
    llama) stage llama do_llama || failed=1 ;;
    tp) stage tp do_tp || failed=1 ;;
    fsdp) stage fsdp do_fsdp || failed=1 ;;
    optim) stage optim do_optim || failed=1 ;;
    pip) stage pip do_pip || failed=1 ;;
  esac
done
print_summary
exit $failed
