#!/usr/bin/env python3
"""bench_telemetry: what qrecipe.telemetry costs (docs/adapter.md, "Telemetry").

- off: the hot path's only cost is the test of ``telemetry.state.on`` per quantization; its
  time is measured (timeit) and printed per call and per Linear step (3 quantizations);
- on: a qrecipe.nn.Linear step (forward + backward, bf16) per recipe, telemetry off, then
  ``enable(every=1)`` (every quantization observed: the worst case) and ``enable(every=100)``,
  the median of --steps timed steps each (CUDA events).

usage: PYTHONPATH=BUILD/python bench_telemetry.py [--tokens 4096] [--features 4096]
       [--recipes float8_e4m3,mxfp8,nvfp4] [--steps 20] [--out telemetry.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit

import torch

import qrecipe
from qrecipe import telemetry


def step_ms(module, recipe, x, steps: int) -> float:
    times = []
    for i in range(steps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with qrecipe.autocast(recipe):
            y = module(x)
        y.backward(torch.ones_like(y))
        end.record()
        torch.cuda.synchronize()
        if i >= 3:  # warm-up
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--recipes", default="float8_e4m3,mxfp8,nvfp4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_telemetry: no CUDA device", file=sys.stderr)
        return 1
    test = timeit.Timer("state.on", globals={"state": telemetry.state})
    loops = 1_000_000
    off_ns = min(test.repeat(5, loops)) / loops * 1e9
    print(f"telemetry off: {off_ns:.1f} ns per quantization (the state.on test), "
          f"{3 * off_ns:.1f} ns per Linear step")
    results = {"off_test_ns_per_quantization": off_ns, "steps": []}
    n = args.features
    x = torch.randn(args.tokens, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for name in args.recipes.split(","):
        torch.manual_seed(0)
        module = qrecipe.nn.Linear(n, n, name="fc", device="cuda", dtype=torch.bfloat16)
        recipe = qrecipe.Recipe.builtin(name)
        row = {"recipe": name, "tokens": args.tokens, "features": n}
        telemetry.use_recipes()
        row["off_ms"] = step_ms(module, recipe, x, args.steps)
        for every in (1, 100):
            telemetry.enable(every=every)
            row[f"every_{every}_ms"] = step_ms(module, recipe, x, args.steps)
            telemetry.clear()
        telemetry.use_recipes()
        results["steps"].append(row)
        print(f"{name:>12}: step {row['off_ms']:.3f} ms off, {row['every_1_ms']:.3f} ms every=1 "
              f"(+{100 * (row['every_1_ms'] / row['off_ms'] - 1):.0f}%), "
              f"{row['every_100_ms']:.3f} ms every=100 "
              f"(+{100 * (row['every_100_ms'] / row['off_ms'] - 1):.1f}%)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
