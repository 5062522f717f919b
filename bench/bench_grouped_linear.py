#!/usr/bin/env python3
"""bench_grouped_linear: one training step of ``qrecipe.nn.GroupedLinear`` (MoE experts) per
recipe on a CUDA device, against the same experts as separate layers.

A step is forward + backward of every expert's ``y_i = x_i W_i^T`` (no bias; BF16 activations,
weights and gradients; eager, no torch.compile) on one routed input: ``m_splits`` are drawn
once per configuration (seeded), each a multiple of 16 (as MoE routers pad for FP8 GEMMs).
Sequences timed in this one process, samples interleaved in a shuffled order per round
(bench_linear's time_interleaved):

  grouped    qrecipe.nn.GroupedLinear, single grouped parameter, under qrecipe.autocast: the
             experts' weights, inputs and output gradients each quantized by one grouped call
  separate   the same experts as separate qrecipe.nn.Linear layers on the row groups (one
             quantization of each tensor per expert), outputs concatenated
  bf16       the same experts as separate torch.nn.Linear layers in BF16

  ms                 median ms per step
  ratio_to separate  median over rounds of separate ms / grouped ms (>1: grouping helps)
  ratio_to bf16      median over rounds of bf16 ms / grouped ms

usage: bench_grouped_linear.py [--out FILE.json] [--recipes default,blockwise,...]
                               [--configs 8x16384x4096x4096,64x8192x1024x1024]
                               [--steps 10] [--samples 7]
A config is experts x tokens x in x out. The qrecipe package must be importable
(PYTHONPATH=BUILD/python), built with CUDA.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import qrecipe
# The same timing and results file as bench_linear.
from bench_linear import paired_ratio, time_interleaved, write_results


def routed_splits(experts: int, tokens: int, seed: int) -> list:
    """Row counts per expert, multiples of 16 summing to `tokens` (a multiple of 16): a
    seeded, uneven routing (some experts get several times the mean, some none)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(experts, generator=g) ** 2
    units = tokens // 16
    counts = torch.floor(weights / weights.sum() * units).long()
    counts[torch.argmax(weights)] += units - int(counts.sum())
    return [int(c) * 16 for c in counts]


def step_of(module, x, dy, splits, recipe):
    def step():
        with qrecipe.autocast(recipe, enabled=recipe is not None):
            y = module(x, splits)
        y.backward(dy)
    return step


class SeparateExperts(torch.nn.Module):
    """The experts as separate layers (`cls`: qrecipe.nn.Linear or torch.nn.Linear)."""

    def __init__(self, grouped, cls, **kwargs):
        super().__init__()
        self.experts = torch.nn.ModuleList()
        for w in grouped.expert_weights():
            layer = cls(grouped.in_features, grouped.out_features, bias=False, device="cuda",
                        dtype=torch.bfloat16, **kwargs)
            with torch.no_grad():
                layer.weight.copy_(w)
            self.experts.append(layer)

    def forward(self, x, splits):
        return torch.cat([e(xi) for e, xi in zip(self.experts, x.split(splits))])


def bench_config(config: str, recipes: list, args) -> list:
    experts, tokens, n_in, n_out = (int(v) for v in config.split("x"))
    splits = routed_splits(experts, tokens, seed=experts)
    torch.manual_seed(0)
    x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
    grouped = qrecipe.nn.GroupedLinear(experts, n_in, n_out, bias=False, device="cuda",
                                       dtype=torch.bfloat16, name="bench.experts")
    separate = SeparateExperts(grouped, qrecipe.nn.Linear, name="bench.experts")
    bf16 = SeparateExperts(grouped, torch.nn.Linear)
    flops = 3 * 2 * tokens * n_in * n_out
    shape = [experts, tokens, n_in, n_out]
    print(f"config {config}: m_splits min {min(splits)} max {max(splits)} "
          f"({sum(1 for s in splits if s == 0)} empty)")
    records = []
    for name in recipes:
        recipe = qrecipe.Recipe.builtin(name)
        times = time_interleaved({"grouped": step_of(grouped, x, dy, splits, recipe),
                                  "separate": step_of(separate, x, dy, splits, recipe),
                                  "bf16": step_of(bf16, x, dy, splits, None)},
                                 args.steps, args.samples)
        ms = {k: statistics.median(v) for k, v in times.items()}
        to_sep = paired_ratio(times["separate"], times["grouped"])
        to_bf16 = paired_ratio(times["bf16"], times["grouped"])
        print(f"{name:>16}: grouped {ms['grouped']:.3f} ms  separate {ms['separate']:.3f} ms "
              f"({to_sep:.2f}x)  bf16 {ms['bf16']:.3f} ms ({to_bf16:.2f}x)")
        common = {"kind": "grouped_layer", "format": name, "shape": shape,
                  "ms": ms["grouped"], "value": flops / ms["grouped"] / 1e9,
                  "unit": "TFLOP/s", "separate_ms": ms["separate"], "bf16_ms": ms["bf16"],
                  "m_splits": splits}
        label = f"grouped linear step {name} {config}"
        records += [{"name": label + " vs separate", **common, "ratio": to_sep,
                     "ratio_to": "separate"},
                    {"name": label + " vs bf16", **common, "ratio": to_bf16,
                     "ratio_to": "bf16"}]
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench_grouped_linear.json")
    parser.add_argument("--recipes", default="default,float8_delayed,blockwise,mxfp8")
    parser.add_argument("--configs", default="8x16384x4096x4096,64x8192x1024x1024")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_grouped_linear: no CUDA device", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name()
    print(f"device {device_name}")
    recipes = [n for n in args.recipes.split(",") if n]
    records = []
    for config in [c for c in args.configs.split(",") if c]:
        records += bench_config(config, recipes, args)
    write_results(args.out, device_name, records,
                  "qrecipe.nn.GroupedLinear training step (all experts' fprop, dgrad, wgrad and "
                  "quantizations), eager, against the same experts as separate qrecipe.nn.Linear "
                  "layers and as BF16 torch.nn.Linear layers, samples interleaved; ratio = other "
                  "time / grouped time (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
