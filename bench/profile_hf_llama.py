#!/usr/bin/env python3
"""profile_hf_llama: where the time of bench_hf_llama's step goes, per candidate.

bench_hf_llama.py says how fast each candidate's step is; this says why. For each candidate
(the same models and input as bench_hf_llama: Llama-3-8B layer shapes, 2 layers, 4 x 2048
tokens), a few warmed-up steps run under torch.profiler, and the CUDA kernels are summed by
category:

  gemm        cuBLAS/cuBLASLt/CUTLASS matrix products (BF16 and FP8)
  quantize    qrecipe's plugin kernels (amax, cast, transpose-cast) and torchao's casts
  attention   SDPA's flash / memory-efficient kernels
  fused       Triton kernels that torch.compile generated (norms, activations, casts)
  other       everything else (elementwise, norms and reductions in eager, copies)

Per candidate it prints wall ms per step, GPU busy ms per step (kernel time summed; kernels on
one stream do not overlap here), the idle fraction of the wall time (host overhead the GPU
waited on), the ms per category, and the top kernels. --out writes the same as JSON.

usage: profile_hf_llama.py [--candidates bf16_eager,qrecipe_default_eager,...] [--steps 3]
                           [--top 12] [--out OUT.json] [--md TABLE]
Needs a CUDA device, transformers and the qrecipe package (PYTHONPATH=BUILD/python).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict

import torch

from bench_hf_llama import base_model, candidates  # the benchmark's models (this folder)

DEFAULT = ("bf16_eager,bf16_compiled,torchao_tensorwise_compiled,qrecipe_default_eager,"
           "qrecipe_default_compiled")
# Order matters: the first pattern that matches a kernel's name names its category.
CATEGORIES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|matmul|scaled_mm", re.I)),
    ("quantize", re.compile(r"qrecipe|quantiz|amax|cast|float8|fp8|scale", re.I)),
    ("fused", re.compile(r"^triton_", re.I)),
)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def profile_one(step, steps: int):
    for _ in range(3):  # warm-up (compiled candidates compile here)
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    kernels = defaultdict(lambda: [0.0, 0])  # name -> [total us, calls]
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[event.name]
            k[0] += event.device_time
            k[1] += 1
    by_category = defaultdict(float)
    for name, (us, _) in kernels.items():
        by_category[category(name)] += us
    busy = sum(by_category.values()) / 1e3 / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {
        "wall_ms": wall,
        "gpu_busy_ms": busy,
        "idle_fraction": max(0.0, 1.0 - busy / wall) if wall > 0 else None,
        "kernel_launches_per_step": sum(c for _, c in kernels.values()) / steps,
        "ms_by_category": {k: v / 1e3 / steps for k, v in sorted(by_category.items())},
        "top": [{"kernel": n[:160], "category": category(n), "ms_per_step": us / 1e3 / steps,
                 "calls_per_step": calls / steps} for n, (us, calls) in top],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", default=DEFAULT)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out")
    parser.add_argument("--md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_hf_llama: needs a CUDA device", file=sys.stderr)
        return 2
    wanted = set(args.candidates.split(","))
    base = base_model(args)
    ids = torch.randint(0, base.config.vocab_size, (args.batch, args.seq), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    steps, skipped = candidates(base, ids, wanted)
    del base
    unknown = wanted - set(steps) - set(skipped)
    if unknown:
        print(f"profile_hf_llama: unknown candidates {sorted(unknown)}", file=sys.stderr)
        return 2
    results = {"device": torch.cuda.get_device_name(), "layers": args.layers,
               "tokens": f"{args.batch}x{args.seq}", "skipped": skipped, "candidates": {}}
    for name, step in steps.items():
        results["candidates"][name] = profile_one(step, args.steps)
    cats = sorted({c for r in results["candidates"].values() for c in r["ms_by_category"]})
    lines = [f"# Where a HF Llama step's time goes ({results['device']}, {args.layers} layers, "
             f"{results['tokens']} tokens)", "",
             "| candidate | wall ms | GPU busy ms | idle | launches | " +
             " | ".join(f"{c} ms" for c in cats) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(cats)]
    for name, r in results["candidates"].items():
        lines.append(f"| {name} | {r['wall_ms']:.2f} | {r['gpu_busy_ms']:.2f} | "
                     f"{r['idle_fraction']:.0%} | {r['kernel_launches_per_step']:.0f} | " +
                     " | ".join(f"{r['ms_by_category'].get(c, 0.0):.2f}" for c in cats) + " |")
    for name, r in results["candidates"].items():
        lines += ["", f"## {name}: top kernels", "", "| kernel | category | ms/step | calls |",
                  "|---|---|---:|---:|"]
        for k in r["top"][:args.top]:
            lines.append(f"| `{k['kernel'][:90]}` | {k['category']} | {k['ms_per_step']:.3f} | "
                         f"{k['calls_per_step']:.0f} |")
    for name, reason in skipped.items():
        lines.append(f"\nskipped {name}: {reason}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
