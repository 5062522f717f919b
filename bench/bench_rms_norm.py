#!/usr/bin/env python3
"""bench_rms_norm: Hugging Face's RMSNorm (LlamaRMSNorm's torch formula, eager and compiled)
against qrecipe.nn.RMSNorm's fused kernels (docs/adapter.md, "Fused RMSNorm"), forward and
forward + backward, interleaved in one process (bench_linear's time_interleaved).

Shapes: tokens x hidden in BF16 (default the Llama-3-8B benchmark's 8192 x 4096, plus a
per-head norm 262144 x 128). Printed and written (--out, the results format of
tools/bench_table.py): median ms per call, the ratio to the HF formula in eager mode, and the
fused kernels' share of their byte floor (forward: x read, y written; backward: dy and x read,
dx written, at --peak-gbs) so a slow kernel shows against the memory system, not just against
torch. The "fused + amax" forward also computes max |y| (the handoff of nn/norm_amax.py).

usage: bench_rms_norm.py [--out FILE.json] [--shapes 8192x4096,262144x128] [--steps 20]
                         [--samples 7] [--peak-gbs 4800]
The qrecipe package must be importable (PYTHONPATH=BUILD/python), built with CUDA.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from qrecipe.nn import rms_norm as fused_norm
from bench_linear import paired_ratio, time_interleaved, write_results

EPS = 1e-5


def candidates(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict:
    hf = fused_norm.hf_rms_norm
    hf_compiled = torch.compile(hf)
    op = torch.ops.qrecipe.rms_norm_forward

    def fwd_bwd(fn):
        def step():
            x.grad = w.grad = None
            fn(x, w, EPS).backward(dy)
        return step

    return {
        "hf_eager fwd": lambda: hf(x, w, EPS),
        "hf_compiled fwd": lambda: hf_compiled(x, w, EPS),
        "fused fwd": lambda: op(x, w, EPS, False),
        "fused + amax fwd": lambda: op(x, w, EPS, True),
        "hf_eager fwd+bwd": fwd_bwd(hf),
        "hf_compiled fwd+bwd": fwd_bwd(hf_compiled),
        "fused fwd+bwd": fwd_bwd(fused_norm.rms_norm),
    }


def floor_ms(name: str, x: torch.Tensor, peak_gbs: float) -> float:
    """The byte floor of a fused candidate: the forward reads x and writes y (2 tensor passes);
    forward + backward also reads dy and x and writes dx (5 passes; weight, rstd and the
    dweight partials are small beside them)."""
    tensor = x.numel() * x.element_size()
    passes = 2 if name.endswith(" fwd") else 5
    return passes * tensor / (peak_gbs * 1e9) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--shapes", default="8192x4096,262144x128")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--peak-gbs", type=float, default=4800.0,
                        help="the device's DRAM bandwidth in GB/s (H200: 4800, H100 SXM: 3350)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_rms_norm: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    records = []
    print(f"{device}; BF16, eps {EPS}; floor at {args.peak_gbs:.0f} GB/s\n")
    print("| shape | candidate | ms | vs hf_eager | of byte floor |")
    print("|---|---|---:|---:|---:|")
    for shape in args.shapes.split(","):
        rows, hidden = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, hidden, device="cuda", generator=g).to(torch.bfloat16)
        x.requires_grad_()
        w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(rows, hidden, device="cuda", generator=g).to(torch.bfloat16)
        fns = candidates(x, w, dy)
        times = time_interleaved(fns, args.steps, args.samples)
        for name, samples in times.items():
            ms = statistics.median(samples)
            base = times["hf_eager fwd" if name.endswith(" fwd") else "hf_eager fwd+bwd"]
            ratio = paired_ratio(base, samples)
            record = {"name": f"rms_norm {shape} {name}", "kind": "rms_norm", "ms": ms,
                      "shape": shape, "ratio": ratio, "ratio_to": "hf_eager"}
            share = ""
            if name.startswith("fused"):
                record["floor_ms"] = floor_ms(name, x, args.peak_gbs)
                share = f"{record['floor_ms'] / ms:.0%}"
            records.append(record)
            print(f"| {shape} | {name} | {ms:.3f} | {ratio:.2f}x | {share} |")
    if args.out:
        write_results(args.out, device, records,
                      "HF RMSNorm formula vs qrecipe's fused kernels (bench/bench_rms_norm.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
