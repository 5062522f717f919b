#!/usr/bin/env python3
"""bench_linear: one training step of ``qrecipe.nn.Linear`` per recipe on a CUDA device.

A step is forward + backward of ``y = x W^T`` (no bias; BF16 activations, weight and
gradients; eager mode, no torch.compile), inside ``qrecipe.autocast(recipe)`` so every
quantization the recipe asks for is included (x, W and dy in both directions, the delayed-
scaling update once per step). Figures, all taken in this one run:

  layer step     ms per step (median of --samples batches of --steps steps, CUDA events)
  bf16 step      the same step of torch.nn.Linear in BF16; ratio_to "bf16" = bf16 ms / ms
  floor          the raw cuBLASLt time of the recipe's three GEMMs (bench_gemm, this run;
                 a GEMM that runs emulated on this device is floored at the raw BF16 GEMM)
                 + the recipe's minimum quantization bytes at this run's copy bandwidth;
                 ratio_to "floor" = floor ms / ms (1.0 = nothing but the unavoidable work)

Minimum quantization bytes per operand (x, W, dy; both directions): the BF16 input read once
per pass its quantizer cannot avoid (two where a tensor amax must be known before casting:
float8 current scaling, nvfp4; one otherwise; a hybrid reads once per sub-quantizer) plus the
bytes of every data and scale buffer the quantizer writes (measured from a real quantize).

usage: bench_linear.py --bench-gemm BUILD/bin/bench_gemm [--out FILE.json]
                       [--recipes default,blockwise,...] [--tokens 8192] [--features 8192]
The qrecipe package must be importable (PYTHONPATH=BUILD/python).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import torch

import qrecipe

ROWWISE, COLUMNWISE = 1, 2
COPY_BYTES = 1 << 30


# ---------------------------------------------------------------- timing
def time_ms(fn, steps: int, samples: int, warmup: int = 3) -> float:
    """Median over `samples` batches of `steps` calls, in ms per call (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / steps)
    return statistics.median(per_call)


def copy_bandwidth(samples: int) -> float:
    """Bytes/ms of torch's device copy (an SM copy kernel) of 1 GiB: read + write counted."""
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), steps=10, samples=samples)
    return 2 * COPY_BYTES / ms


# ---------------------------------------------------------------- floor: GEMMs
def raw_gemm_times(bench_gemm: str, m: int, n: int, k: int) -> dict:
    """Raw cuBLASLt ms per bench_gemm configuration label at m x n x k, measured now."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gemm.json")
        subprocess.run([bench_gemm, "--shapes", f"{m}x{n}x{k}", "--out", out], check=True,
                       stdout=subprocess.DEVNULL)
        records = json.load(open(out))["records"]
    return {r["config"]: r["raw_ms"] for r in records if r.get("raw_ms")}


# Operand text of a plan ("e4m3 tensor-scaled", "e4m3 1x128 blocks (f32 scales)") and the
# accumulation -> the bench_gemm configuration whose raw cuBLASLt call is that GEMM's floor.
def floor_config(plan: str, raw: dict) -> str:
    path = plan.split(": ", 1)[1] if ": " in plan else plan
    if not path.startswith("native"):
        return "bf16 dense"  # high precision, or emulated: at best one BF16 GEMM
    operands = plan.split(": ", 1)[0]
    if "blocks" in operands:
        blocks = re.findall(r"(\d+x\d+) blocks", operands)
        label = f"blockwise {blocks[0]} x {blocks[1]}"
    else:
        dtypes = re.findall(r"(e4m3|e5m2) tensor-scaled", operands)
        accumulation = "fprop (fast accumulation)" if "fast accumulation" in path \
            else "dgrad (split accumulation)"
        label = f"float8 {dtypes[0]} x {dtypes[1]} {accumulation}"
    matches = [c for c in raw if c == label or c.startswith(label)]
    if not matches:
        raise SystemExit(f"bench_linear: bench_gemm has no configuration '{label}' (for the "
                         f"plan '{plan}'); configurations: {sorted(raw)}")
    return matches[0]


# ---------------------------------------------------------------- floor: quantization
def read_passes(spec: str) -> int:
    """Passes over the input a (non-hybrid) quantizer cannot avoid."""
    if spec.startswith("nvfp4") or "scaling=current" in spec:
        return 2
    return 1


def sub_specs(describe: str) -> list:
    """The quantizer specs that read the input: the two halves of a hybrid, or itself."""
    if not describe.startswith("hybrid{"):
        return [describe]
    row = re.search(r"rowwise=(\w+\{[^{}]*\})", describe)
    col = re.search(r"columnwise=(\w+\{[^{}]*\})", describe)
    return [m.group(1) for m in (row, col) if m]


def quantization_bytes(quantizer, tensor: torch.Tensor) -> int:
    """Minimum bytes to quantize `tensor` in both directions with `quantizer` (None: 0)."""
    if quantizer is None:
        return 0
    q = quantizer.quantize(tensor, ROWWISE | COLUMNWISE)
    written = 0
    for direction in ("rowwise", "columnwise"):
        for buffer in (q.data(direction), q.scale_inv(direction)):
            if buffer is not None:
                written += buffer.numel() * buffer.element_size()
    read = sum(read_passes(s) for s in sub_specs(quantizer.describe()))
    return read * tensor.numel() * tensor.element_size() + written


# ---------------------------------------------------------------- steps
def linear_step(module, x, dy, recipe):
    def step():
        x.grad = None
        module.weight.grad = None
        if recipe is None:
            y = module(x)
        else:
            with qrecipe.autocast(recipe):
                y = module(x)
        y.backward(dy)
    return step


def bench_recipe(name, x, dy, weight, raw, bandwidth, bf16_ms, args) -> list:
    """The two records (vs floor, vs bf16) of one recipe's Linear step."""
    tokens, features = args.tokens, args.features
    flops = 3 * 2 * tokens * features * features
    recipe = qrecipe.Recipe.builtin(name)
    module = qrecipe.nn.Linear(features, features, bias=False, device="cuda",
                               dtype=torch.bfloat16, name="bench")
    with torch.no_grad():
        module.weight.copy_(weight)
    plan = recipe.engine.plan_linear("linear", "bench", features, features, tokens, "sm90")
    gemm_configs = {g: floor_config(plan[g], raw) for g in ("fprop", "dgrad", "wgrad")}
    gemm_floor = sum(raw[c] for c in gemm_configs.values())
    quant_bytes = (quantization_bytes(plan["input"], x.detach()) +
                   quantization_bytes(plan["weight"], module.weight.detach()) +
                   quantization_bytes(plan["grad_output"], dy))
    floor = gemm_floor + quant_bytes / bandwidth
    ms = time_ms(linear_step(module, x, dy, recipe), args.steps, args.samples)
    emulated = [g for g in ("fprop", "dgrad", "wgrad") if "emulated" in plan[g]]
    common = {"kind": "layer", "format": name, "shape": [tokens, features, features],
              "ms": ms, "value": flops / ms / 1e9, "unit": "TFLOP/s",
              "floor_ms": floor, "gemm_floor_ms": gemm_floor,
              "quantization_bytes": quant_bytes, "floor_gemms": gemm_configs,
              "emulated_gemms": emulated,
              "path": "native" if not emulated else "emulated: " + ",".join(emulated)}
    label = f"linear step {name} {tokens}x{features}->{features}"
    print(f"{name:>16}: {ms:.3f} ms  floor {floor:.3f} ms (GEMMs {gemm_floor:.3f}, "
          f"quantization {quant_bytes / bandwidth:.3f})  floor/time {floor / ms:.3f}  "
          f"vs bf16 {bf16_ms / ms:.2f}x  {common['path']}")
    return [{"name": label + " vs floor", **common, "ratio": floor / ms, "ratio_to": "floor"},
            {"name": label + " vs bf16", **common, "ratio": bf16_ms / ms, "ratio_to": "bf16"}]


def profile_steps(args) -> int:
    """Prints, per recipe, the CUDA kernels of 5 steps sorted by total GPU time."""
    from torch.profiler import ProfilerActivity, profile
    features, tokens = args.features, args.tokens
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
    for name in [n for n in args.recipes.split(",") if n]:
        module = qrecipe.nn.Linear(features, features, bias=False, device="cuda",
                                   dtype=torch.bfloat16, name="bench")
        step = linear_step(module, x, dy, qrecipe.Recipe.builtin(name))
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"==== {name}: 5 steps")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14,
                                        max_name_column_width=70))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench-gemm", required=True, help="path of the bench_gemm binary")
    parser.add_argument("--out", default="bench_linear.json")
    parser.add_argument("--recipes", default=",".join(
        n for n in qrecipe.Recipe.builtin_names() if n != "none"))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--features", type=int, default=8192, help="in = out features")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="instead of timing: the GPU kernels of 5 steps per recipe "
                             "(torch.profiler), to see where a step's time goes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_linear: no CUDA device", file=sys.stderr)
        return 2

    tokens, features = args.tokens, args.features
    if args.profile:
        return profile_steps(args)
    device_name = torch.cuda.get_device_name()
    flops = 3 * 2 * tokens * features * features  # fprop + dgrad + wgrad
    torch.manual_seed(0)
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)

    bandwidth = copy_bandwidth(args.samples)  # bytes per ms
    raw = raw_gemm_times(args.bench_gemm, tokens, features, features)

    reference = torch.nn.Linear(features, features, bias=False, device="cuda",
                                dtype=torch.bfloat16)
    bf16_ms = time_ms(linear_step(reference, x, dy, None), args.steps, args.samples)
    records = [{
        "name": f"linear step bf16 torch.nn.Linear {tokens}x{features}->{features}",
        "kind": "layer", "format": "bf16", "shape": [tokens, features, features],
        "ms": bf16_ms, "value": flops / bf16_ms / 1e9, "unit": "TFLOP/s",
        "ratio": 1.0, "ratio_to": "bf16"}]
    print(f"device {device_name}; copy {bandwidth / 1e6:.0f} GB/s; torch.nn.Linear BF16 step "
          f"{bf16_ms:.3f} ms")

    failures = []
    for name in [n for n in args.recipes.split(",") if n]:
        try:
            records += bench_recipe(name, x, dy, reference.weight, raw, bandwidth, bf16_ms, args)
        except (qrecipe.QrecipeError, RuntimeError) as error:  # reported, never hidden
            failures.append(name)
            message = str(error).splitlines()[0]
            print(f"{name:>16}: FAILED: {message}")
            records.append({"name": f"linear step {name} {tokens}x{features}->{features}",
                            "kind": "layer", "format": name,
                            "shape": [tokens, features, features], "ms": None, "value": None,
                            "unit": "TFLOP/s", "ratio": None, "ratio_to": "floor",
                            "error": message})

    result = {"device": device_name,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": os.environ.get("QRECIPE_COMMIT", "unknown"),
              "note": "qrecipe.nn.Linear training step (fprop + dgrad + wgrad, all quantization "
                      "included), eager; ratio_to floor: floor/time; ratio_to bf16: "
                      "torch.nn.Linear BF16 time / time",
              "records": records}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
