#!/usr/bin/env python3
"""bench_host_time: the host time of small adapter calls on a CUDA device (wall time per call
over back-to-back calls of a tiny problem, so the GPU never is the bottleneck).

It is what a layer with few tokens, or a MoE expert with few rows, pays per call, and what
the numbers in bench/results/2026-11-22-h100-d603e17.md came from. torch.mm on the same
shapes is printed as the host's own yardstick: host machines differ between runs, so
compare calls against it, not milliseconds across runs.

usage: PYTHONPATH=BUILD/python bench_host_time.py [--calls 500]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import qrecipe
from qrecipe import _C


def per_call_us(fn, calls: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_host_time: no CUDA device", file=sys.stderr)
        return 2
    n = args.calls
    recipe = qrecipe.Recipe.default()
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    q_in = recipe.quantizer("linear", "input", "fc")._cpp
    q_w = recipe.quantizer("linear", "weight", "fc")._cpp
    qx, qw = q_in.quantize(x, 1), q_w.quantize(w, 1)
    out = torch.empty(128, 256, device="cuda", dtype=torch.bfloat16)
    layer = qrecipe.nn.Linear(256, 256, bias=False, name="fc", device="cuda",
                              dtype=torch.bfloat16)
    reference = torch.nn.Linear(256, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    xg = x.clone().requires_grad_()

    def qrecipe_step():
        with qrecipe.autocast(recipe):
            y = layer(xg)
        y.backward(x)

    def torch_step():
        reference(xg).backward(x)

    print(f"device {torch.cuda.get_device_name()}; us per call, {n} calls of 128 x 256 (-> 256)")
    rows = [("torch.mm BF16 (yardstick)", lambda: torch.mm(x, w.t(), out=out)),
            ("quantize float8, rowwise", lambda: q_in.quantize(x, 1)),
            ("quantize float8, both directions", lambda: q_in.quantize(x, 3)),
            ("_C.gemm FP8 fprop", lambda: _C.gemm(qx, "rowwise", qw, "rowwise", out,
                                                   kind="fprop")),
            ("torch.nn.Linear step (forward + backward)", torch_step),
            ("qrecipe.nn.Linear step, default recipe", qrecipe_step)]
    for label, fn in rows:
        print(f"{label:>44}: {per_call_us(fn, n):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
