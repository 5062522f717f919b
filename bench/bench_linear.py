#!/usr/bin/env python3
"""bench_linear: one training step of ``qrecipe.nn.Linear`` per recipe on a CUDA device.

A step is forward + backward of ``y = x W^T`` (no bias; BF16 activations, weight and
gradients; eager mode, no torch.compile), inside ``qrecipe.autocast(recipe)`` so every
quantization the recipe asks for is included (x, W and dy in both directions, the delayed-
scaling update once per step). Per recipe, these sequences are timed in this one process,
their samples interleaved (one sample of each per round, in an order shuffled per round) so
clock and power drifts of the GPU hit all of them alike:

  step           the qrecipe step
  floor          what the step cannot avoid, executed: the copy of the x and W quantization
                 bytes, the raw fprop GEMM, the copy of the dy quantization bytes, the raw
                 dgrad and wgrad GEMMs. A raw GEMM is one cuBLASLt call of that GEMM's
                 precision, layout and shape (qrecipe._C.raw_cublaslt_gemm: the benchmarks'
                 raw cuBLASLt GEMM, bench/raw_cublaslt.hpp, set up as the engine's; no plan,
                 decode or epilogue kernel) on the buffers of real
                 quantized tensors; a GEMM that runs emulated on this device is floored at
                 the raw BF16 GEMM of its shape. A copy of B quantization bytes is torch's
                 device copy moving B bytes (read + write).
  floor GEMMs    the three raw GEMMs alone (the floor's breakdown)
  floor, two streams   where the step runs wgrad beside dgrad (qrecipe.nn.linear_gemms
                 does for large native GEMMs on CUDA), the floor with its raw wgrad beside its
                 raw dgrad too: a stricter floor, reported beside (ratio_to floor keeps the
                 floor above, the sum of the raw GEMM times plus the copies)
  engine         the step's engine work without torch.nn / autograd / autocast: the three
                 quantizations (both directions) and the three engine GEMMs called directly
                 (plus the delayed-scaling update), into preallocated outputs. step - engine
                 is the adapter's cost (Python, autograd, launch gaps); engine - floor is the
                 kernels' (quantization kernels against a copy, engine GEMMs against raw ones)
  bf16 step      the same step of torch.nn.Linear in BF16
  micro-batch    the qrecipe step of a later micro-batch (is_first_microbatch=False): the
                 weight's quantization and, for emulated GEMMs, its decoded copies kept
                 from a first call (weight_cache.py); reported as microbatch_ms and
                 microbatch_ratio_to_bf16

  ms             median ms per step of --samples batches of --steps calls (CUDA events)
  ratio_to floor median over the rounds of floor ms / step ms (1.0 = nothing but the
                 unavoidable work; the target for natively running recipes is >= 1/1.08)
  ratio_to bf16  median over the rounds of bf16 ms / step ms

Minimum quantization bytes per operand (x, W, dy; both directions): the BF16 input read once
per pass its quantizer cannot avoid (two where a tensor amax must be known before casting:
float8 current scaling, nvfp4; one otherwise; a hybrid reads once per sub-quantizer) plus the
bytes of every data and scale buffer the quantizer writes (measured from a real quantize).

usage: bench_linear.py [--out FILE.json] [--recipes default,blockwise,...] [--tokens 8192]
                       [--features 8192] [--steps 10] [--samples 7] [--profile]
The qrecipe package must be importable (PYTHONPATH=BUILD/python), built with CUDA.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import statistics
import sys

import torch

import qrecipe
from qrecipe._engine import _C
from qrecipe.nn import linear_gemms

ROWWISE, COLUMNWISE = 1, 2
GEMMS = ("fprop", "dgrad", "wgrad")
# The operands of each GEMM (docs/gemm.md): (tensor, direction) of A, then of B.
GEMM_OPERANDS = {"fprop": (("x", "rowwise"), ("w", "rowwise")),
                 "dgrad": (("dy", "rowwise"), ("w", "columnwise")),
                 "wgrad": (("dy", "columnwise"), ("x", "columnwise"))}
ROLE_OF = {"x": "input", "w": "weight", "dy": "grad_output"}


# ---------------------------------------------------------------- timing
def round_order(names: list, round_index: int) -> list:
    """The order of one round: a shuffle seeded by the round's index (the same in every run),
    so that no sequence always runs right after the same one. What runs just before heats the
    GPU or lets it cool: on an H100, a fixed order moved a sequence's time by up to ~3%."""
    order = list(names)
    random.Random(round_index).shuffle(order)
    return order


def time_interleaved(fns: dict, steps: int, samples: int, warmup: int = 3) -> dict:
    """{name: [ms per call of each sample]}: after `warmup` calls of each, `samples` rounds of
    one sample per callable (round_order), each sample `steps` back-to-back calls between
    two CUDA events."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(samples):
        for name in round_order(list(fns), r):
            fn = fns[name]
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / steps)
    return times


def paired_ratio(numerator: list, denominator: list) -> float:
    """Median over the rounds of numerator / denominator (samples of one round pair up)."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def write_results(path: str, device_name: str, records: list, note: str) -> None:
    """One benchmark file of the results format (tools/bench_table.py reads it): device,
    date, commit ($QRECIPE_COMMIT), note, records."""
    result = {"device": device_name,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": os.environ.get("QRECIPE_COMMIT", "unknown"),
              "note": note, "records": records}
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


# ---------------------------------------------------------------- floor: GEMMs
def native_operand(q, direction: str) -> dict:
    """The raw_cublaslt_gemm arguments of one direction of a quantized tensor: its data and
    scale_inv buffers as stored, their dtype and cuBLASLt scale mode (as the engine's native
    path reads them)."""
    layout = q.layout(direction)
    if layout["scale_mode"] == "tensor":
        mode = "tensor"
    else:  # blocks: their extent along the GEMM's output dimension decides the mode
        block_outer = layout["block"][0] if direction == "rowwise" else layout["block"][1]
        mode = "1x128" if block_outer == 1 else "128x128"
    return {"data": q.data(direction), "dtype": layout["data_dtype"],
            "scale": q.scale_inv(direction), "scale_mode": mode}


def raw_gemms(plan: dict, quantized: dict, dense: dict, outs: dict) -> list:
    """The three raw GEMMs of a plan as callables (fprop, dgrad, wgrad). `quantized`:
    {"x"|"w"|"dy": QuantizedTensor of both directions, or None}; `dense`: {(tensor,
    direction): its BF16 K-major [outer, K] tensor} for the BF16 floors of emulated GEMMs."""
    calls = []
    for gemm in GEMMS:
        (ta, da), (tb, db) = GEMM_OPERANDS[gemm]
        if plan[gemm].path == _C.GemmPath.native:
            a = native_operand(quantized[ta], da)
            b = native_operand(quantized[tb], db)
            args = dict(a=a["data"], a_dtype=a["dtype"], b=b["data"], b_dtype=b["dtype"],
                        out=outs[gemm], a_scale=a["scale"], a_scale_mode=a["scale_mode"],
                        b_scale=b["scale"], b_scale_mode=b["scale_mode"],
                        fast_accumulation=plan[gemm].fast_accumulation)
        else:  # high precision, or emulated: at best one BF16 GEMM of the shape
            args = dict(a=dense[(ta, da)], a_dtype="bf16", b=dense[(tb, db)], b_dtype="bf16",
                        out=outs[gemm])
        calls.append(lambda args=args: _C.raw_cublaslt_gemm(**args))
    return calls


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


def quantization_bytes(quantizer, q, tensor: torch.Tensor) -> int:
    """Minimum bytes to quantize `tensor` in both directions with `quantizer` (None: 0); `q`
    is a real quantization of it in both directions (its buffers are what gets written)."""
    if quantizer is None:
        return 0
    written = 0
    for direction in ("rowwise", "columnwise"):
        for buffer in (q.data(direction), q.scale_inv(direction)):
            if buffer is not None:
                written += buffer.numel() * buffer.element_size()
    read = sum(read_passes(s) for s in sub_specs(quantizer.describe()))
    return read * tensor.numel() * tensor.element_size() + written


# ---------------------------------------------------------------- steps
def linear_step(module, x, dy, recipe, is_first_microbatch=None):
    """One step; is_first_microbatch=False: a later micro-batch of a gradient-accumulation
    step, reusing the weight kept by a call with True (weight_cache.py: the quantized weight
    and, for emulated GEMMs, its decoded copies)."""
    def step():
        x.grad = None
        module.weight.grad = None
        if recipe is None:
            y = module(x)
        else:
            with qrecipe.autocast(recipe):
                y = module(x, is_first_microbatch=is_first_microbatch)
        y.backward(dy)
    return step


def beside(first, second, device):
    """Enqueues second() on the current stream while first() runs on the second stream the
    library gives wgrad (linear_gemms._wgrad_stream), as a Linear backward does."""
    current = torch.cuda.current_stream(device)
    side = linear_gemms._wgrad_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        first()
    second()
    current.wait_stream(side)


class Floor:
    """The floor of one recipe's step as executed work (see the module docstring): `run()`
    the whole floor, `gemms()` its three raw GEMMs alone, `run_two_streams()` the floor with
    wgrad beside dgrad as the step may run them (a stricter floor, reported beside)."""

    def __init__(self, plan: dict, tensors: dict):
        quantizer = {t: plan[ROLE_OF[t]] for t in tensors}
        quantized = {t: None if quantizer[t] is None else
                     quantizer[t].quantize(tensors[t], ROWWISE | COLUMNWISE) for t in tensors}
        self.bytes = {t: quantization_bytes(quantizer[t], quantized[t], tensors[t])
                      for t in tensors}
        # K-major BF16 operands for the GEMMs that are not native: [outer, K] per direction.
        dense = {}
        for gemm in GEMMS:
            if plan[gemm].path != _C.GemmPath.native:
                for t, d in GEMM_OPERANDS[gemm]:
                    dense[(t, d)] = tensors[t] if d == "rowwise" else tensors[t].t().contiguous()
        tokens, features_in = tensors["x"].shape
        features_out = tensors["w"].shape[0]
        like = {"dtype": torch.bfloat16, "device": tensors["x"].device}
        outs = {"fprop": torch.empty(tokens, features_out, **like),
                "dgrad": torch.empty(tokens, features_in, **like),
                "wgrad": torch.empty(features_out, features_in, **like)}
        self._quantized = quantized  # keeps the buffers the GEMMs read alive
        self._fprop, self._dgrad, self._wgrad = raw_gemms(plan, quantized, dense, outs)
        # A copy moving B bytes (read + write) copies B / 2 bytes.
        forward_half = (self.bytes["x"] + self.bytes["w"]) // 2
        backward_half = self.bytes["dy"] // 2
        src = torch.empty(max(forward_half, backward_half, 1), dtype=torch.uint8,
                          device=tensors["x"].device).random_(0, 256)
        dst = torch.empty_like(src)
        self._copy_forward = (dst[:forward_half], src[:forward_half])
        self._copy_backward = (dst[:backward_half], src[:backward_half])
        self._device = tensors["x"].device

    def run(self):
        dst, src = self._copy_forward
        dst.copy_(src)
        self._fprop()
        dst, src = self._copy_backward
        dst.copy_(src)
        self._dgrad()
        self._wgrad()

    def run_two_streams(self):
        dst, src = self._copy_forward
        dst.copy_(src)
        self._fprop()
        dst, src = self._copy_backward
        dst.copy_(src)
        beside(self._wgrad, self._dgrad, self._device)

    def gemms(self):
        self._fprop()
        self._dgrad()
        self._wgrad()


def engine_step(recipe, plan: dict, tensors: dict, two_streams: bool):
    """The step's engine calls alone (see the module docstring), as one callable; with
    `two_streams`, wgrad beside dgrad as the step runs them."""
    quantizer = {t: plan[ROLE_OF[t]] for t in tensors}
    x, w, dy = tensors["x"], tensors["w"], tensors["dy"]
    like = {"dtype": torch.bfloat16, "device": x.device}
    y = torch.empty(x.shape[0], w.shape[0], **like)
    dx = torch.empty(x.shape[0], w.shape[1], **like)
    dw = torch.empty(w.shape[0], w.shape[1], **like)

    def operand(t):
        q = quantizer[t]
        return tensors[t] if q is None else q.quantize(tensors[t], ROWWISE | COLUMNWISE)

    def run():
        recipe.update_scaling()  # what the step's autocast entry runs (no launch if no state)
        xq, wq = operand("x"), operand("w")
        _C.gemm(xq, "rowwise", wq, "rowwise", y, kind="fprop")
        dyq = operand("dy")

        def dgrad():
            _C.gemm(dyq, "rowwise", wq, "columnwise", dx, kind="dgrad")

        def wgrad():
            _C.gemm(dyq, "columnwise", xq, "columnwise", dw, kind="wgrad")
        if two_streams:
            beside(wgrad, dgrad, x.device)
        else:
            dgrad()
            wgrad()
    return run


def bench_recipe(name, tensors, reference, args, bf16_samples: list) -> list:
    """The two records (vs floor, vs bf16) of one recipe's Linear step."""
    tokens, features = args.tokens, args.features
    flops = 3 * 2 * tokens * features * features
    x, dy = tensors["x"], tensors["dy"]
    recipe = qrecipe.Recipe.builtin(name)
    module = qrecipe.nn.Linear(features, features, bias=False, device="cuda",
                               dtype=torch.bfloat16, name="bench")
    with torch.no_grad():
        module.weight.copy_(reference.weight)
    plan = recipe.engine.plan_linear("linear", "bench", features, features, tokens, "sm90")
    floor = Floor(plan, {"x": x.detach(), "w": module.weight.detach(), "dy": dy})
    quant_bytes = sum(floor.bytes.values())
    # Whether the step runs wgrad beside dgrad: the library's own decision for this layer.
    two_streams = linear_gemms.overlap_backward(
        module.roles(recipe, tokens).plan, dy, tokens * features * features)
    engine = engine_step(recipe, plan, {"x": x.detach(), "w": module.weight.detach(), "dy": dy},
                         two_streams)
    # A later micro-batch: the weight (and its decoded copies) kept by one call with True.
    linear_step(module, x, dy, recipe, is_first_microbatch=True)()
    sequences = {"step": linear_step(module, x, dy, recipe),
                 "micro": linear_step(module, x, dy, recipe, is_first_microbatch=False),
                 "floor": floor.run,
                 "gemms": floor.gemms, "engine": engine,
                 "bf16": linear_step(reference, x, dy, None)}
    if two_streams:
        sequences["floor_two_streams"] = floor.run_two_streams
    times = time_interleaved(sequences, args.steps, args.samples)
    bf16_samples += times["bf16"]
    ms = statistics.median(times["step"])
    floor_ms = statistics.median(times["floor"])
    gemm_floor = statistics.median(times["gemms"])
    engine_ms = statistics.median(times["engine"])
    floor_two = statistics.median(times["floor_two_streams"]) if two_streams else None
    bf16_ms = statistics.median(times["bf16"])
    to_floor = paired_ratio(times["floor"], times["step"])
    to_bf16 = paired_ratio(times["bf16"], times["step"])
    micro_ms = statistics.median(times["micro"])
    micro_to_bf16 = paired_ratio(times["bf16"], times["micro"])
    emulated = [g for g in GEMMS if plan[g].path == _C.GemmPath.emulated]
    common = {"kind": "layer", "format": name, "shape": [tokens, features, features],
              "ms": ms, "value": flops / ms / 1e9, "unit": "TFLOP/s",
              "floor_ms": floor_ms, "gemm_floor_ms": gemm_floor, "engine_ms": engine_ms,
              "wgrad_beside_dgrad": two_streams, "floor_two_streams_ms": floor_two,
              "bf16_ms": bf16_ms, "microbatch_ms": micro_ms,
              "microbatch_ratio_to_bf16": micro_to_bf16,
              "quantization_bytes": quant_bytes, "emulated_gemms": emulated,
              "floor_gemms": {g: str(plan[g]) for g in GEMMS},
              "path": "native" if not emulated else "emulated: " + ",".join(emulated)}
    label = f"linear step {name} {tokens}x{features}->{features}"
    print(f"{name:>16}: {ms:.3f} ms  floor {floor_ms:.3f} ms (raw GEMMs {gemm_floor:.3f}, "
          f"{quant_bytes / 1e6:.0f} MB of quantization)  engine calls alone {engine_ms:.3f} ms  "
          f"floor/time {to_floor:.3f} "
          f"(time/floor {1 / to_floor:.3f}x)  bf16 {bf16_ms:.3f} ms: {to_bf16:.2f}x  "
          f"later micro-batch (weight kept) {micro_ms:.3f} ms: {micro_to_bf16:.2f}x  "
          f"{common['path']}" +
          (f"; wgrad beside dgrad (floor so run: {floor_two:.3f} ms, time/that "
           f"{1 / paired_ratio(times['floor_two_streams'], times['step']):.3f}x)"
           if two_streams else ""))
    return [{"name": label + " vs floor", **common, "ratio": to_floor, "ratio_to": "floor"},
            {"name": label + " vs bf16", **common, "ratio": to_bf16, "ratio_to": "bf16"}]


def device_gaps(prof, steps: int) -> str:
    """The GPU's idle time between consecutive device activities of the profiled steps (per
    step) and the largest gaps with the activities around them."""
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if len(kernels) < 2:
        return "  (no device activities recorded)"
    gaps = []
    end = kernels[0].time_range.end
    for prev, e in zip(kernels, kernels[1:]):
        gap = e.time_range.start - max(end, prev.time_range.end)
        end = max(end, e.time_range.end)
        if gap > 0:
            gaps.append((gap, prev.name[:60], e.name[:60]))
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    lines = [f"  GPU span {span / 1e3 / steps:.3f} ms per step, idle between activities "
             f"{sum(g for g, _, _ in gaps) / 1e3 / steps:.3f} ms per step; largest gaps:"]
    for gap, before, after in sorted(gaps, reverse=True)[:8]:
        lines.append(f"    {gap:8.1f} us  after {before}  before {after}")
    return "\n".join(lines)


def profile_steps(args) -> int:
    """Per recipe: the host time to enqueue a step, the CUDA kernels of 5 steps sorted by
    total GPU time, how much of a step the GPU spent in them, and its idle gaps."""
    import time
    from torch.profiler import ProfilerActivity, profile
    features, tokens = args.features, args.tokens
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
    steps = 5
    for name in [n for n in args.recipes.split(",") if n]:
        module = qrecipe.nn.Linear(features, features, bias=False, device="cuda",
                                   dtype=torch.bfloat16, name="bench")
        step = linear_step(module, x, dy, qrecipe.Recipe.builtin(name))
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        # Host cost of a step: enqueueing 10 steps (the launch queue does not fill).
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        host_ms = (time.perf_counter() - t0) * 1e3 / 10
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:  # light: device only
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        print(f"==== {name}: host enqueues a step in {host_ms:.3f} ms (unprofiled)")
        print(device_gaps(prof, steps))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        print(events.table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=90))
        syncs = [e for e in events if re.search(r"Synchronize|Memcpy|cudaFree\b|cudaMalloc\b",
                                                 e.key)]
        print("  synchronizing calls: " + (", ".join(f"{e.key} x{e.count}" for e in syncs)
                                          or "none"))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    if not hasattr(_C, "raw_cublaslt_gemm"):
        print("bench_linear: this qrecipe was built without CUDA (no _C.raw_cublaslt_gemm); "
              "build it with -DQRECIPE_CUDA=ON", file=sys.stderr)
        return 2

    tokens, features = args.tokens, args.features
    if args.profile:
        return profile_steps(args)
    device_name = torch.cuda.get_device_name()
    flops = 3 * 2 * tokens * features * features  # fprop + dgrad + wgrad
    torch.manual_seed(0)
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
    reference = torch.nn.Linear(features, features, bias=False, device="cuda",
                                dtype=torch.bfloat16)
    print(f"device {device_name}")

    records, failures, bf16_samples = [], [], []
    for name in [n for n in args.recipes.split(",") if n]:
        try:
            records += bench_recipe(name, {"x": x, "dy": dy}, reference, args, bf16_samples)
        except (qrecipe.QrecipeError, RuntimeError) as error:  # reported, never hidden
            failures.append(name)
            message = str(error).splitlines()[0]
            print(f"{name:>16}: FAILED: {message}")
            records.append({"name": f"linear step {name} {tokens}x{features}->{features}",
                            "kind": "layer", "format": name,
                            "shape": [tokens, features, features], "ms": None, "value": None,
                            "unit": "TFLOP/s", "ratio": None, "ratio_to": "floor",
                            "error": message})
    if bf16_samples:  # every recipe's interleaved BF16 samples
        bf16_ms = statistics.median(bf16_samples)
        records.insert(0, {
            "name": f"linear step bf16 torch.nn.Linear {tokens}x{features}->{features}",
            "kind": "layer", "format": "bf16", "shape": [tokens, features, features],
            "ms": bf16_ms, "value": flops / bf16_ms / 1e9, "unit": "TFLOP/s",
            "ratio": 1.0, "ratio_to": "bf16"})
        print(f"torch.nn.Linear BF16 step {bf16_ms:.3f} ms (median of every recipe's samples)")

    write_results(args.out, device_name, records,
                  "qrecipe.nn.Linear training step (fprop + dgrad + wgrad, all quantization "
                  "included), eager; floor = raw cuBLASLt GEMMs + minimum quantization bytes "
                  "copied, executed in the same process, samples interleaved with the steps; "
                  "ratio_to floor: floor/time; ratio_to bf16: torch.nn.Linear BF16 time / time "
                  "(median of per-round ratios)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
