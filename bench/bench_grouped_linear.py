#!/usr/bin/env python3
"""bench_grouped_linear: one training step of an MoE expert layer (``qrecipe.nn.GroupedLinear``)
per recipe on a CUDA device, against the grouped GEMMs users have.

A step is forward + backward (input and weight gradients) of every expert's ``y_i = x_i W_i^T``
(no bias; BF16 activations, weights and gradients; eager, no torch.compile) on one routed
input: the group sizes are drawn once per configuration (seeded, uneven, some experts empty),
each a multiple of 16 (what FP8 grouped GEMMs need), and live on the GPU as a router's output
would. All candidates of a configuration share the weights and are timed in this one process,
samples interleaved in a shuffled order per round (bench_linear's time_interleaved).

Table 1 (kind grouped_mm_step): against the baselines
  bf16       torch._grouped_mm (BF16, CUTLASS) with autograd: THE baseline
  torchao    torchao's FP8 rowwise grouped GEMM (torchao.prototype.moe_training.fp8_grouped_mm.
             _to_fp8_rowwise_then_scaled_grouped_mm, pad_token_groups_for_grouped_mm=False);
             skipped, with the reason printed, when torchao is not importable
  <recipe>   qrecipe.nn.GroupedLinear under qrecipe.autocast, m_splits a CUDA tensor
each with its ratio to bf16 (bf16 ms / its ms, median of per-round ratios; > 1 is faster) and,
for qrecipe, to torchao, and the issue's target with its gap: every native recipe faster than
torchao, >= 1.3x bf16 with many small experts (>= 32 experts of <= 1024 tokens), >= 1.5x with
few large ones (<= 8 experts of >= 4096 tokens), mxfp8 (emulated on Hopper) >= 0.9x.
Configurations: {8, 32, 64, 128} experts x {256, 512, 1024, 4096} tokens per expert x hidden
sizes of real MoE models (2048 -> 1408, 4096 -> 14336, 7168 -> 2048), pruned (printed) where
the estimated memory passes --max-gb or the running time would pass --budget-s.

Table 2 (kind grouped_layer): the per-layer comparison, GroupedLinear against the same experts
as separate qrecipe.nn.Linear layers and as BF16 torch.nn.Linear layers (--layer-configs).

usage: bench_grouped_linear.py [--out FILE.json] [--recipes default,float8_delayed,...]
                               [--experts 8,32,64,128] [--tokens 256,512,1024,4096]
                               [--hidden 2048x1408,4096x14336,7168x2048] [--budget-s 210]
                               [--max-gb 50] [--layer-configs 64x16384x2048x1408,...]
                               [--steps 3] [--samples 5] [--md MD_PATH]
The qrecipe package must be importable (PYTHONPATH=BUILD/python), built with CUDA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import qrecipe
# The same timing and results file as bench_linear.
from bench_linear import paired_ratio, time_interleaved, write_results

NATIVE_ON_HOPPER = {"default", "float8_delayed", "blockwise", "float8_e4m3"}


def routed_splits(experts: int, tokens: int, seed: int) -> list:
    """Row counts per expert, multiples of 16 summing to `tokens` (a multiple of 16): a
    seeded, uneven routing (some experts get several times the mean, some none)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(experts, generator=g) ** 2
    units = tokens // 16
    counts = torch.floor(weights / weights.sum() * units).long()
    counts[torch.argmax(weights)] += units - int(counts.sum())
    return [int(c) * 16 for c in counts]


def torchao_grouped_mm():
    """torchao's FP8 rowwise grouped GEMM, or (None, why)."""
    try:
        from torchao.prototype.moe_training.fp8_grouped_mm import (
            _to_fp8_rowwise_then_scaled_grouped_mm)
    except Exception as e:  # ImportError, or an incompatible build
        return None, f"{type(e).__name__}: {e}"
    return _to_fp8_rowwise_then_scaled_grouped_mm, ""


def target_of(recipe: str, experts: int, tokens_each: int):
    """(target ratio to bf16, what it is) of the issue, or (None, '') where none applies."""
    if recipe == "mxfp8":
        return 0.9, "emulated mxfp8 >= 0.9x bf16"
    if recipe not in NATIVE_ON_HOPPER:
        return None, ""
    if experts >= 32 and tokens_each <= 1024:
        return 1.3, "many small experts >= 1.3x bf16"
    if experts <= 8 and tokens_each >= 4096:
        return 1.5, "few large experts >= 1.5x bf16"
    return None, ""


# ---------------------------------------------------------------- table 1: grouped GEMMs

def expert_steps(experts: int, tokens_each: int, n_in: int, n_out: int, name: str,
                 recipes: list, torchao_mm=None):
    """One configuration's training steps (forward, input and weight gradients) over the same
    inputs (uneven routing, seeded) and weights: {"bf16": torch._grouped_mm, "torchao": its FP8
    rowwise grouped GEMM (when given), recipe: the GroupedLinear under it}, and the splits.
    profile_grouped_linear.py profiles these same steps."""
    tokens = experts * tokens_each
    splits = routed_splits(experts, tokens, seed=experts * 7 + tokens_each)
    torch.manual_seed(0)
    x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
    grouped = qrecipe.nn.GroupedLinear(experts, n_in, n_out, bias=False, device="cuda",
                                       dtype=torch.bfloat16, name=name)
    # The baselines read the same weights: [E, out, in] sharing the module's storage, passed
    # to the grouped GEMMs as [E, in, out] views (column-major per expert).
    w3 = torch.nn.Parameter(grouped.weight.detach().view(experts, n_out, n_in))
    splits_dev = torch.tensor(splits, device="cuda", dtype=torch.int64)
    offs = torch.cumsum(splits_dev, 0).to(torch.int32)

    def bf16_step():
        y = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
        y.backward(dy)

    def torchao_step():
        y = torchao_mm(x, w3.transpose(-2, -1), offs, out_dtype=torch.bfloat16,
                       pad_token_groups_for_grouped_mm=False)
        y.backward(dy)

    def qrecipe_step(recipe):
        def step():
            with qrecipe.autocast(recipe):
                y = grouped(x, splits_dev)
            y.backward(dy)
        return step

    fns = {"bf16": bf16_step}
    if torchao_mm is not None:
        fns["torchao"] = torchao_step
    for r in recipes:
        fns[r] = qrecipe_step(qrecipe.Recipe.builtin(r))
    return splits, fns


def bench_grouped_config(experts: int, tokens_each: int, n_in: int, n_out: int, recipes: list,
                         torchao_mm, args) -> list:
    tokens = experts * tokens_each
    splits, fns = expert_steps(experts, tokens_each, n_in, n_out, "bench.experts", recipes,
                               torchao_mm)
    times = time_interleaved(fns, args.steps, args.samples, warmup=2)
    ms = {k: statistics.median(v) for k, v in times.items()}
    flops = 3 * 2 * tokens * n_in * n_out
    shape = [experts, tokens_each, n_in, n_out]
    label = f"{experts}x{tokens_each} {n_in}->{n_out}"
    line = f"{label:>22}: bf16 {ms['bf16']:.3f} ms"
    if "torchao" in ms:
        line += f" | torchao {ms['torchao']:.3f} ({paired_ratio(times['bf16'], times['torchao']):.2f}x)"
    records = []
    for name in ["torchao"] + recipes:
        if name not in ms:
            continue
        to_bf16 = paired_ratio(times["bf16"], times[name])
        rec = {"name": f"grouped step {name} {label}", "kind": "grouped_mm_step", "format": name,
               "shape": shape, "ms": ms[name], "value": flops / ms[name] / 1e9, "unit": "TFLOP/s",
               "ratio": to_bf16, "ratio_to": "bf16 torch._grouped_mm", "bf16_ms": ms["bf16"],
               "m_splits": splits}
        if name != "torchao":
            line += f" | {name} {ms[name]:.3f} ({to_bf16:.2f}x)"
            if "torchao" in ms:
                rec["torchao_ms"] = ms["torchao"]
                rec["ratio_to_torchao"] = paired_ratio(times["torchao"], times[name])
            target, what = target_of(name, experts, tokens_each)
            if target is not None:
                rec["target"] = target
                rec["target_what"] = what
                rec["gap"] = to_bf16 - target
            if name in NATIVE_ON_HOPPER and "torchao" in ms:
                rec["beats_torchao"] = rec["ratio_to_torchao"] > 1.0
        records.append(rec)
    print(line, flush=True)
    del fns  # the layer and its inputs, held by the steps
    return records


def estimated_gb(experts: int, tokens_each: int, n_in: int, n_out: int) -> float:
    """Weights (BF16 param and grads, quantized copies, baselines' transients) and activations
    (inputs, gradients, quantized copies, outputs) of one configuration, roughly."""
    tokens = experts * tokens_each
    return (experts * n_in * n_out * 10 + tokens * (n_in + n_out) * 12) / 1e9


def estimated_s(experts: int, tokens_each: int, n_in: int, n_out: int, candidates: int, args) -> float:
    """Seconds of one configuration at ~450 TFLOP/s plus ~0.6 ms of host time per step
    (before calibration: main scales it by what the configurations so far really took)."""
    steps = candidates * (2 + args.steps * args.samples)
    step_ms = 6 * experts * tokens_each * n_in * n_out / 4.5e11 + 0.6
    return steps * step_ms / 1e3


def estimated_layer_s(config: str, recipes: list, args) -> float:
    """Seconds of one table-2 configuration: per recipe, three candidates of (3 warm-up +
    steps x samples) steps; the separate layers cost ~0.3 ms of host time per expert."""
    experts, tokens, n_in, n_out = (int(v) for v in config.split("x"))
    step_ms = 6 * tokens * n_in * n_out / 4.5e11 + 0.3 * experts
    return len(recipes) * 3 * (3 + args.steps * args.samples) * step_ms / 1e3


# ---------------------------------------------------------------- table 2: per layer

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


def step_of(module, x, dy, splits, recipe):
    def step():
        with qrecipe.autocast(recipe, enabled=recipe is not None):
            y = module(x, splits)
        y.backward(dy)
    return step


def bench_layer_config(config: str, recipes: list, args) -> list:
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
        print(f"{config} {name:>16}: grouped {ms['grouped']:.3f} ms  separate "
              f"{ms['separate']:.3f} ms ({to_sep:.2f}x)  bf16 layers {ms['bf16']:.3f} ms "
              f"({to_bf16:.2f}x)", flush=True)
        common = {"kind": "grouped_layer", "format": name, "shape": shape, "ms": ms["grouped"],
                  "value": flops / ms["grouped"] / 1e9, "unit": "TFLOP/s",
                  "separate_ms": ms["separate"], "bf16_ms": ms["bf16"], "m_splits": splits}
        label = f"grouped linear step {name} {config}"
        records += [{"name": label + " vs separate", **common, "ratio": to_sep,
                     "ratio_to": "separate qrecipe.nn.Linear"},
                    {"name": label + " vs bf16 layers", **common, "ratio": to_bf16,
                     "ratio_to": "bf16 torch.nn.Linear layers"}]
    del grouped, separate, bf16
    return records


def ints(s: str) -> list:
    return [int(v) for v in s.split(",") if v]


# ---------------------------------------------------------------- markdown

def markdown(device_name: str, records: list, recipes: list, skipped: list, header: list) -> str:
    """The run as markdown: table 1 (one row per configuration, every candidate's ms and
    ratios), the issue's targets with the worst gap of each, and table 2."""
    out = [f"# bench_grouped_linear on {device_name}", ""] + header + [""]
    steps = [r for r in records if r["kind"] == "grouped_mm_step"]
    by_config = {}
    for r in steps:
        by_config.setdefault(tuple(r["shape"]), {})[r["format"]] = r
    names = [n for n in ["torchao"] + recipes if any(n in c for c in by_config.values())]
    out += ["## Table 1: training step (fwd + dgrad + wgrad) against BF16 torch._grouped_mm",
            "", "ratio = bf16 ms / candidate ms (median of per-round ratios; > 1 is faster)", "",
            "| experts x tokens each, in -> out | bf16 ms | " + " | ".join(names) + " |",
            "|---|---:|" + "---:|" * len(names)]
    for shape, c in by_config.items():
        e, t, n_in, n_out = shape
        any_rec = next(iter(c.values()))
        cells = []
        for n in names:
            r = c.get(n)
            if r is None:
                cells.append("")
                continue
            cell = f"{r['ms']:.3f} ({r['ratio']:.2f}x)"
            if r.get("ratio_to_torchao") is not None:
                cell += f", {r['ratio_to_torchao']:.2f}x torchao"
            if r.get("gap") is not None and r["gap"] < 0:
                cell = f"**{cell}**"
            cells.append(cell)
        out.append(f"| {e} x {t}, {n_in} -> {n_out} | {any_rec['bf16_ms']:.3f} | " +
                   " | ".join(cells) + " |")
    out += ["", "Bold: below its target.", "", "## Targets", "",
            "| target | recipe | configurations | met | worst ratio | worst gap (configuration) |",
            "|---|---|---:|---:|---:|---|"]
    targets = {}
    for r in steps:
        if r.get("target") is not None:
            targets.setdefault((r["target_what"], r["format"]), []).append(
                (r["ratio"], r["gap"], r["shape"]))
        if r.get("beats_torchao") is not None:
            targets.setdefault(("native recipe faster than torchao", r["format"]), []).append(
                (r["ratio_to_torchao"], r["ratio_to_torchao"] - 1.0, r["shape"]))
    for (what, name), rows in targets.items():
        worst = min(rows, key=lambda x: x[1])
        e, t, n_in, n_out = worst[2]
        out.append(f"| {what} | {name} | {len(rows)} | {sum(1 for x in rows if x[1] >= 0)} | "
                   f"{worst[0]:.2f}x | {worst[1]:+.2f} ({e} x {t}, {n_in} -> {n_out}) |")
    if not targets:
        out.append("| (no configuration with a target ran) | | | | | |")
    layers = [r for r in records if r["kind"] == "grouped_layer"]
    if layers:
        out += ["", "## Table 2: GroupedLinear against the same experts as separate layers", "",
                "| experts x tokens x in x out | recipe | grouped ms | separate qrecipe.nn.Linear ms "
                "| BF16 torch.nn.Linear layers ms | vs separate | vs bf16 layers |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for r in layers:
            if not r["name"].endswith("vs separate"):
                continue
            twin = next(x for x in layers if x["name"] == r["name"][:-len("vs separate")] + "vs bf16 layers")
            out.append(f"| {'x'.join(str(v) for v in r['shape'])} | {r['format']} | {r['ms']:.3f} | "
                       f"{r['separate_ms']:.3f} | {r['bf16_ms']:.3f} | {r['ratio']:.2f}x | "
                       f"{twin['ratio']:.2f}x |")
    if skipped:
        out += ["", "## Not run", ""] + [f"- {s}" for s in skipped]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench_grouped_linear.json")
    parser.add_argument("--md", default=None,
                        help="also write the tables and the targets' gaps as markdown here")
    parser.add_argument("--recipes", default="default,float8_delayed,blockwise,mxfp8")
    parser.add_argument("--experts", default="8,32,64,128")
    parser.add_argument("--tokens", default="256,512,1024,4096", help="tokens per expert")
    parser.add_argument("--hidden", default="2048x1408,4096x14336,7168x2048")
    parser.add_argument("--budget-s", type=float, default=210.0,
                        help="seconds for the whole run after start-up: table-1 configurations "
                             "that would pass it (with table 2's estimate set aside) are skipped")
    parser.add_argument("--max-gb", type=float, default=50.0)
    parser.add_argument("--first", default="64x512x2048x1408,8x4096x4096x14336",
                        help="table-1 configurations (experts x tokens each x in x out) run "
                             "before the others, when they are among them")
    parser.add_argument("--layer-configs", default="8x16384x4096x4096,64x8192x1024x1024")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_grouped_linear: no CUDA device", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    device_name = torch.cuda.get_device_name()
    kernels = "built" if qrecipe.grouped_kernels_built() else "NOT built (per-expert GEMMs)"
    print(f"device {device_name}; qrecipe grouped kernels: {kernels}")
    header = [f"qrecipe grouped kernels: {kernels}; commit {os.environ.get('QRECIPE_COMMIT', 'unknown')}"]
    recipes = [n for n in args.recipes.split(",") if n]
    torchao_mm, why = torchao_grouped_mm()
    if torchao_mm is None:
        print(f"torchao baseline skipped: {why}")
        header.append(f"torchao baseline skipped: {why}")
    candidates = 1 + (torchao_mm is not None) + len(recipes)
    configs = []
    for hidden in args.hidden.split(","):
        n_in, n_out = (int(v) for v in hidden.split("x"))
        for e in ints(args.experts):
            for t in ints(args.tokens):
                configs.append((e, t, n_in, n_out))
    layer_configs = [c for c in args.layer_configs.split(",") if c]
    # Table 2 runs last, whatever the budget; its estimate is set aside for it.
    reserve = sum(estimated_layer_s(c, recipes, args) for c in layer_configs)
    # The two measured shapes first (a budget cut never drops them), then the
    # cheapest first, so a budget cut drops the largest.
    first = [tuple(ints(c.replace("x", ","))) for c in args.first.split(",") if c]
    configs.sort(key=lambda c: (c not in first, estimated_s(*c, candidates, args)))
    records, skipped = [], []
    # Measured / estimated seconds of the last configuration run (the estimate knows neither
    # this GPU's speed nor the host time per step), applied to the next ones. The last one
    # only: the first configurations also pay one-time costs (Triton compiles in torchao).
    scale = 1.0
    for c in configs:
        label = f"{c[0]}x{c[1]} {c[2]}->{c[3]}"
        gb = estimated_gb(*c)
        if gb > args.max_gb:
            skipped.append(f"{label}: ~{gb:.0f} GB estimated > --max-gb {args.max_gb:.0f}")
            continue
        elapsed = time.monotonic() - t0
        est = estimated_s(*c, candidates, args)
        # The scale corrects this configuration's estimate; table 2's reserve is its own.
        if elapsed + scale * est + reserve > args.budget_s:
            skipped.append(f"{label}: would pass --budget-s {args.budget_s:.0f} "
                           f"({elapsed:.0f} s spent, ~{scale * est:.0f} s estimated)")
            continue
        t_config = time.monotonic()
        try:
            records += bench_grouped_config(*c, recipes, torchao_mm, args)
        except torch.OutOfMemoryError as e:
            skipped.append(f"{label}: out of memory ({e})")
        torch.cuda.empty_cache()
        scale = max(1.0, (time.monotonic() - t_config) / est)
    for s in skipped:
        print(f"skipped {s}")
    for config in layer_configs:
        records += bench_layer_config(config, recipes, args)
        torch.cuda.empty_cache()
    print(f"total {time.monotonic() - t0:.0f} s")
    missed = [r for r in records if r.get("gap") is not None and r["gap"] < 0]
    slower = [r for r in records if r.get("beats_torchao") is False]
    print(f"targets: {sum(1 for r in records if r.get('gap') is not None) - len(missed)} met, "
          f"{len(missed)} missed; native recipes slower than torchao: {len(slower)}")
    write_results(args.out, device_name, records,
                  "MoE expert layer training step (forward + input and weight gradients, BF16 "
                  "activations, uneven routing, m_splits on the GPU), eager. grouped_mm_step: "
                  "ratio = bf16 torch._grouped_mm ms / candidate ms (median of per-round "
                  "ratios), with ratio_to_torchao, target and gap; grouped_layer: the same "
                  "experts as separate layers. Skipped: " + ("; ".join(skipped) or "none"))
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(device_name, records, recipes, skipped, header))
        print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
