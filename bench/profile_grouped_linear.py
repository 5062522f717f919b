#!/usr/bin/env python3
"""profile_grouped_linear: where the time of bench_grouped_linear's step goes, per candidate.

bench_grouped_linear.py says how fast an expert layer's training step is against BF16
torch._grouped_mm; this says why. For one configuration (default: many small experts, 64 x 512
tokens, 2048 -> 1408, the same routing as the benchmark) each candidate's step (forward, input
and weight gradients, m_splits on the GPU) runs a few warmed-up times under torch.profiler, and
it prints per candidate:
  - wall ms per step, GPU busy ms per step (kernel time summed), the idle fraction;
  - kernel launches per step, and host synchronizations per step (cudaStreamSynchronize,
    cudaDeviceSynchronize, cudaEventSynchronize, and device values read on the host: each
    one stops the host until the GPU drains);
  - the top kernels by GPU time and the top host operators by CPU time.
--out writes the same as JSON.

usage: profile_grouped_linear.py [--config 64x512x2048x1408] [--recipes default,blockwise]
                                 [--steps 5] [--top 10] [--out OUT.json]
Needs a CUDA device and the qrecipe package (PYTHONPATH=BUILD/python).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

from bench_grouped_linear import expert_steps  # the benchmark's steps (this folder)

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def steps_of(config: str, recipes: list):
    experts, tokens_each, n_in, n_out = (int(v) for v in config.split("x"))
    _, fns = expert_steps(experts, tokens_each, n_in, n_out, "profile.experts", recipes)
    return {("bf16_grouped_mm" if k == "bf16" else f"qrecipe_{k}"): f for k, f in fns.items()}


def profile_one(step, steps: int, top: int) -> dict:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    kernels, host_ops = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])
    launches = syncs = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name]
            k[0] += e.device_time_total / 1e3
            k[1] += 1
            launches += 1
        else:
            # A reading of device values on the host (.item(), .tolist()) shows as
            # aten::_local_scalar_dense; the engine's own waits as the CUDA sync calls.
            if e.name in SYNCS or e.name == "aten::_local_scalar_dense":
                syncs += 1
            if not e.name.startswith("cuda"):
                h = host_ops[e.name]
                h[0] += e.cpu_time_total / 1e3
                h[1] += 1
    busy = sum(v[0] for v in kernels.values()) / steps
    return {
        "wall_ms": wall_ms, "gpu_busy_ms": busy, "idle_fraction": max(0.0, 1 - busy / wall_ms),
        "launches_per_step": launches / steps, "host_syncs_per_step": syncs / steps,
        "top_kernels": [{"name": n[:120], "ms_per_step": v[0] / steps, "count_per_step": v[1] / steps}
                        for n, v in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]],
        "top_host_ops": [{"name": n[:120], "cpu_ms_per_step": v[0] / steps, "count_per_step": v[1] / steps}
                         for n, v in sorted(host_ops.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="64x512x2048x1408")
    parser.add_argument("--recipes", default="default,float8_delayed,blockwise,mxfp8")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_grouped_linear: no CUDA device", file=sys.stderr)
        return 2
    results = {"device": torch.cuda.get_device_name(), "config": args.config, "candidates": {}}
    for name, step in steps_of(args.config, [r for r in args.recipes.split(",") if r]).items():
        r = profile_one(step, args.steps, args.top)
        results["candidates"][name] = r
        print(f"=== {name}: wall {r['wall_ms']:.3f} ms, GPU busy {r['gpu_busy_ms']:.3f} ms "
              f"(idle {100 * r['idle_fraction']:.0f}%), {r['launches_per_step']:.0f} launches, "
              f"{r['host_syncs_per_step']:.1f} host syncs per step")
        for k in r["top_kernels"]:
            print(f"  gpu {k['ms_per_step']:8.3f} ms x{k['count_per_step']:5.1f}  {k['name']}")
        for h in r["top_host_ops"]:
            print(f"  cpu {h['cpu_ms_per_step']:8.3f} ms x{h['count_per_step']:5.1f}  {h['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
