#!/usr/bin/env python3
"""bench_fsdp: FSDP2 training steps (forward, backward, optimizer) of a model whose GEMM
weights are stored quantized (qrecipe.quantized_model_init), per recipe, against the same
model in BF16 under FSDP2, and the N-rank vs 1-rank equality check.

The model: --blocks blocks of LayerNormLinear (qkv, d -> 3d), Linear (proj, d -> d) and
LayerNormMLP (d -> --ffn -> d, GELU; d = --hidden), BF16 compute; every block and the root sharded with
``qrecipe.distributed.fully_shard`` (torch's FSDP2 plus the shard-boundary checks),
reshard_after_forward=True. Defaults: d=2048, ffn=8192, 8 blocks: 403M parameters.

  bf16       FP32 parameters sharded by FSDP2 with MixedPrecisionPolicy(param_dtype=bf16):
             BF16 all-gather, BF16 reduce-scatter; torch.optim.AdamW(fused=True) steps the
             FP32 shards (DTensors).
  <recipe>   the model built under qrecipe.quantized_model_init(recipe): every GEMM weight a
             QuantizedWeight (BF16 dtype); FSDP2 all-gathers its quantized bytes (the hooks of
             QuantizedWeight, docs/adapter.md "FSDP2") and reduce-scatters BF16 gradients.
             Optimizer: FP32 master copies of the local shards stepped by
             torch.optim.AdamW(fused=True), then requantized into the quantized shards with
             qrecipe.quantized_param.requantize_ (one amax all-reduce for all the per-tensor
             scaled shards). (qrecipe.optim.FusedAdam is not on main; this is the master-weight
             path main has.)

Per configuration, on each rank: --warmup steps, then --steps timed steps (CUDA events on the
GPU), of --tokens tokens per rank:
  ms/step, tokens/s/GPU, MB all-gathered and MB reduce-scattered per step (the output bytes
  of every all-gather and the input bytes of every reduce-scatter torch.distributed runs in
  a step: counted at dist.all_gather_single / all_gather_into_tensor / reduce_scatter_single /
  reduce_scatter_tensor; 0 at world size 1, where FSDP2 skips the collectives), the FSDP2
  all-gather input bytes x world size (what a collective would move, also at world size 1),
  peak memory allocated per GPU (max over ranks).

Equality (--equality-steps, default 20; 0 skips it): for bf16 and each recipe of
--equality-recipes, a model of --equality-blocks blocks trained that many steps by FSDP2 at
this world size (each rank a 1/world slice of one global batch) and by FSDP2 on one GPU
(rank 0 alone, a one-rank mesh) on the whole batch. Not bit-exact: each rank's wgrad GEMM
sums its own tokens, then the BF16 reduce-scatter sums the ranks (another order of
additions, and one more BF16 rounding of the gradient); the check states the tolerance on
the losses (--equality-rtol, relative) and reports the largest difference.

Runs under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set), or as one process (world size 1).
NCCL on the GPU; --device cpu runs the same steps with gloo (a smoke test, not a benchmark).
Rank 0 writes --out (the results format of tools/bench_table.py) and --md (markdown).

  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=build/python \\
    torchrun --standalone --nproc_per_node=2 bench/bench_fsdp.py \\
    --out $OUT/bench_fsdp_ws2.json --md $OUT/bench_fsdp_ws2.md
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import qrecipe
from qrecipe.distributed import fully_shard
from qrecipe.quantized_param import QuantizedWeight, requantize_

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_linear import write_results  # noqa: E402


# ---------------------------------------------------------------- the model
class Block(torch.nn.Module):
    def __init__(self, d: int, ffn: int, name: str, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.qkv = qrecipe.nn.LayerNormLinear(d, 3 * d, name=f"{name}.qkv", **kw)
        self.proj = qrecipe.nn.Linear(d, d, name=f"{name}.proj", **kw)
        self.mlp = qrecipe.nn.LayerNormMLP(d, ffn, activation="gelu", name=f"{name}.mlp", **kw)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # A cheap token mix in place of attention: the GEMMs are what FSDP2 feeds.
        x = x + self.proj(q * torch.sigmoid(k) + v)
        return x + self.mlp(x)


class Model(torch.nn.Module):
    def __init__(self, d, ffn, blocks, device, dtype):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d, ffn, f"blocks.{i}", device, dtype)
                                          for i in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build(name, recipe, d, ffn, blocks, device, shard: bool, mesh=None):
    """(model, optimizer step function) of configuration `name` ("bf16" or a recipe),
    sharded over `mesh` (default: the world)."""
    torch.manual_seed(0)
    if recipe is None:
        model = Model(d, ffn, blocks, device, torch.float32)
        kwargs = {}
        if shard:
            from torch.distributed.fsdp import MixedPrecisionPolicy
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                       reduce_dtype=torch.bfloat16)
    else:
        with qrecipe.quantized_model_init(recipe):
            model = Model(d, ffn, blocks, device, torch.bfloat16)
        kwargs = {}
    if shard:
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True, **kwargs)
        fully_shard(model, mesh=mesh, **kwargs)
    if recipe is None:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            opt.step()
            opt.zero_grad(set_to_none=True)
        return model, step
    return model, master_adamw(model)


def master_adamw(model):
    """FP32 masters of every parameter's local shard (the decoded quantized values), stepped
    by torch.optim.AdamW(fused=True); the quantized weights requantized from them in one
    requantize_ call, the others copied."""
    params = list(model.parameters())
    locals_ = [getattr(p, "_local_tensor", p) for p in params]
    masters = [(l._decode() if isinstance(l, QuantizedWeight) else l.detach())
               .float().clone() for l in locals_]
    opt = torch.optim.AdamW(masters, lr=1e-4, fused=True)
    quantized = [i for i, l in enumerate(locals_) if isinstance(l, QuantizedWeight)]
    plain = [i for i, l in enumerate(locals_) if not isinstance(l, QuantizedWeight)]

    @torch.no_grad()
    def step():
        for p, m in zip(params, masters):
            g = p.grad
            m.grad = None if g is None else getattr(g, "_local_tensor", g).float()
        opt.step()
        requantize_([params[i] for i in quantized], [masters[i] for i in quantized])
        for i in plain:
            locals_[i].copy_(masters[i])
        for p in params:
            p.grad = None
    return step


def train_step(model, recipe, opt_step, x):
    if recipe is None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=False):
            loss = model(x).float().square().mean()
    else:
        with qrecipe.autocast(recipe):
            loss = model(x).float().square().mean()
    loss.backward()
    opt_step()
    return loss.detach()


# ---------------------------------------------------------------- counting
class CollectiveBytes:
    """Bytes of the all-gathers (output) and reduce-scatters (input) torch.distributed runs
    while installed, and the FSDP2 all-gather inputs (FSDPParam.all_gather_inputs)."""

    GATHERS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
    SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")

    def __init__(self):
        self.gathered = self.scattered = self.inputs = 0
        self.patched = {}
        for names, kind in ((self.GATHERS, "gathered"), (self.SCATTERS, "scattered")):
            for fn in names:
                original = getattr(dist, fn, None)
                if original is None:
                    continue
                self.patched[fn] = original
                setattr(dist, fn, self._counting(original, kind))
        if not self.patched:
            raise SystemExit("bench_fsdp: this torch.distributed has none of "
                             f"{self.GATHERS + self.SCATTERS}; update the counter")
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
        except ImportError as error:
            raise SystemExit(f"bench_fsdp: no FSDP2 FSDPParam in this torch ({error})") from None
        self.cls = FSDPParam
        self.original = FSDPParam.__dict__.get("all_gather_inputs")
        if not isinstance(self.original, property):
            raise SystemExit("bench_fsdp: FSDPParam.all_gather_inputs is not a property in this "
                             "torch; update the counter")
        counter = self

        def inputs(fsdp_param):
            out = counter.original.fget(fsdp_param)
            counter.inputs += sum(t.numel() * t.element_size() for t in out)
            return out
        FSDPParam.all_gather_inputs = property(inputs)

    def _counting(self, original, kind):
        def counted(*args, **kwargs):
            if kind == "gathered":
                t = kwargs.get("output_tensor", kwargs.get("output", args[0] if args else None))
            else:
                t = kwargs.get("input", args[1] if len(args) > 1 else None)
            if t is not None:
                setattr(self, kind, getattr(self, kind) + t.numel() * t.element_size())
            return original(*args, **kwargs)
        return counted

    def reset(self):
        self.gathered = self.scattered = self.inputs = 0

    def close(self):
        for fn, original in self.patched.items():
            setattr(dist, fn, original)
        self.cls.all_gather_inputs = self.original


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, n: int) -> float:
        """ms per call of `n` back-to-back calls."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e3 / n


def max_over_ranks(value: float, device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def peak_memory(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


# ---------------------------------------------------------------- the runs
def bench_config(name, args, rank, world, device, counter, timer) -> dict:
    recipe = None if name == "bf16" else qrecipe.Recipe.builtin(name)
    gc.collect()  # the previous configuration's model and optimizer state
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model, opt_step = build(name, recipe, args.hidden, args.ffn, args.blocks, device, shard=True)
    params = sum(p.numel() for p in model.parameters())
    torch.manual_seed(100 + rank)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16)

    def step():
        train_step(model, recipe, opt_step, x)
    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    counter.reset()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    gathered, scattered, inputs = counter.gathered, counter.scattered, counter.inputs
    samples = [timer(step, args.steps) for _ in range(args.samples)]
    ms = max_over_ranks(statistics.median(samples), device)  # the slowest rank sets the pace
    peak = max_over_ranks(peak_memory(device), device)
    del model, opt_step
    return {"config": name, "ms": ms, "tokens_per_s_per_gpu": args.tokens / ms * 1e3,
            "mb_all_gathered": gathered / 1e6, "mb_reduce_scattered": scattered / 1e6,
            "mb_gather_inputs_x_world": inputs * world / 1e6, "peak_gib": peak,
            "parameters": params}


def equality(name, args, rank, world, device) -> dict:
    """Losses of --equality-steps steps: FSDP2 at this world size (each rank a slice of the
    global batch) against FSDP2 on one GPU (rank 0 alone, a mesh of one rank) on the whole
    batch: the same code path, one process."""
    from torch.distributed.device_mesh import DeviceMesh
    alone = dist.new_group([0])  # every rank takes part in creating it
    recipe = None if name == "bf16" else qrecipe.Recipe.builtin(name)
    d, ffn, blocks = args.hidden, args.ffn, args.equality_blocks
    g = torch.Generator(device="cpu").manual_seed(1234)
    batches = [torch.randn(args.equality_tokens, d, generator=g).to(device, torch.bfloat16)
               for _ in range(args.equality_steps)]
    share = args.equality_tokens // world
    model, opt_step = build(name, recipe, d, ffn, blocks, device, shard=True)
    sharded = []
    for x in batches:
        loss = train_step(model, recipe, opt_step, x[rank * share:(rank + 1) * share])
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        sharded.append(float(loss) / world)
    del model, opt_step
    single = None
    if rank == 0:
        ref_recipe = None
        if recipe is not None:
            ref_recipe = qrecipe.Recipe.builtin(name)
            ref_recipe.amax_reduction_group = None  # one process: its own amaxes
        mesh = DeviceMesh.from_group(alone, device.type)
        model, opt_step = build(name, ref_recipe, d, ffn, blocks, device, shard=True, mesh=mesh)
        single = [float(train_step(model, ref_recipe, opt_step, x)) for x in batches]
        del model, opt_step
    dist.barrier()
    if rank != 0:
        return {}
    diffs = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(sharded, single)]
    worst = max(diffs)
    return {"config": name, "steps": args.equality_steps, "world_size": world,
            "bit_exact": sharded == single, "max_rel_loss_diff": worst,
            "rtol": args.equality_rtol, "ok": worst <= args.equality_rtol,
            "losses_sharded": sharded, "losses_single": single}


def markdown(device_name, world, args, rows, checks) -> str:
    lines = [f"# FSDP2 step, {device_name}, world size {world}", "",
             f"Model: {args.blocks} blocks, hidden={args.hidden}, ffn={args.ffn} "
             f"({rows[0]['parameters'] / 1e6 if rows else 0:.0f}M parameters), "
             f"{args.tokens} tokens per GPU per step; step = forward + backward + optimizer; "
             "bf16 = FP32 params, BF16 gather/reduce, AdamW(fused); recipes = quantized "
             "weights, FP32 masters + AdamW(fused) + requantize_.", "",
             "| config | ms/step | vs bf16 | tokens/s/GPU | MB gathered | x bf16 | "
             "MB reduce-scattered | peak GiB |", "|---|---|---|---|---|---|---|---|"]
    base = next((r for r in rows if r["config"] == "bf16"), None)
    for r in rows:
        speed = f"{base['ms'] / r['ms']:.2f}x" if base else "-"
        gathered = r["mb_all_gathered"] or r["mb_gather_inputs_x_world"]
        base_g = (base["mb_all_gathered"] or base["mb_gather_inputs_x_world"]) if base else 0
        ratio = f"{gathered / base_g:.2f}" if base_g else "-"
        lines.append(f"| {r['config']} | {r['ms']:.2f} | {speed} | "
                     f"{r['tokens_per_s_per_gpu']:.0f} | {gathered:.1f} | {ratio} | "
                     f"{r['mb_reduce_scattered']:.1f} | {r['peak_gib']:.2f} |")
    if checks:
        lines += ["", f"Equality: {args.equality_steps} steps at world size {world} (global "
                  f"batch {args.equality_tokens} tokens split over the ranks) vs FSDP2 on one "
                  f"GPU on the whole batch, {args.equality_blocks} blocks; tolerance "
                  f"{args.equality_rtol} relative on each step's loss (not bit-exact: "
                  "per-rank wgrad sums and the BF16 reduce-scatter add in another order).", "",
                  "| config | bit-exact | max rel loss diff | ok |", "|---|---|---|---|"]
        for c in checks:
            lines.append(f"| {c['config']} | {c['bit_exact']} | {c['max_rel_loss_diff']:.2e} | "
                         f"{'yes' if c['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench_fsdp.json")
    parser.add_argument("--md", default=None, help="markdown table (default: --out with .md)")
    parser.add_argument("--recipes", default="default,float8_delayed,blockwise,hybrid_fp8_mx")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per GPU per step")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--equality-steps", type=int, default=20)
    parser.add_argument("--equality-recipes", default="default")
    parser.add_argument("--equality-blocks", type=int, default=2)
    parser.add_argument("--equality-tokens", type=int, default=4096,
                        help="global batch of the equality check (split over the ranks)")
    parser.add_argument("--equality-rtol", type=float, default=2e-2)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    md_path = args.md or os.path.splitext(args.out)[0] + ".md"
    if "RANK" not in os.environ:  # one process: world size 1
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29577"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_fsdp: no CUDA device (use --device cpu for a gloo smoke test)",
                  file=sys.stderr)
            return 2
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        device_name = "cpu (gloo smoke test)"
    if args.equality_tokens % world:
        raise SystemExit(f"bench_fsdp: --equality-tokens {args.equality_tokens} does not split "
                         f"over {world} ranks")
    counter, timer = CollectiveBytes(), Timer(device)
    rows, failures = [], 0
    for name in ["bf16"] + [n for n in args.recipes.split(",") if n]:
        try:
            row = bench_config(name, args, rank, world, device, counter, timer)
        except (ValueError, RuntimeError) as error:  # reported, the other configs still run
            failures += 1
            if rank == 0:
                print(f"{name:>16}: FAILED {error}", flush=True)
            continue
        rows.append(row)
        if rank == 0:
            print(f"{name:>16}: {row['ms']:.2f} ms/step, {row['tokens_per_s_per_gpu']:.0f} "
                  f"tokens/s/GPU, {row['mb_all_gathered']:.1f} MB all-gathered, "
                  f"{row['mb_reduce_scattered']:.1f} MB reduce-scattered "
                  f"({row['mb_gather_inputs_x_world']:.1f} MB gather inputs x world), "
                  f"peak {row['peak_gib']:.2f} GiB", flush=True)
    counter.close()
    checks = []
    if args.equality_steps > 0:
        for name in ["bf16"] + [n for n in args.equality_recipes.split(",") if n]:
            check = equality(name, args, rank, world, device)
            if rank == 0:
                checks.append(check)
                failures += 0 if check["ok"] else 1
                print(f"equality {name}: {args.equality_steps} steps world {world} vs 1: max "
                      f"relative loss difference {check['max_rel_loss_diff']:.2e} (tolerance "
                      f"{args.equality_rtol}, bit-exact {check['bit_exact']}): "
                      f"{'ok' if check['ok'] else 'FAILED'}", flush=True)
    if rank == 0:
        base = next((r for r in rows if r["config"] == "bf16"), None)
        records = []
        for r in rows:
            gathered = r["mb_all_gathered"] or r["mb_gather_inputs_x_world"]
            record = {"name": f"fsdp step {r['config']} ws{world}", "kind": "fsdp_step",
                      "format": r["config"], "ms": r["ms"], "value": gathered,
                      "unit": "MB all-gathered/step", "world_size": world, **r,
                      "model": {"hidden": args.hidden, "ffn": args.ffn, "blocks": args.blocks,
                                "tokens_per_gpu": args.tokens}}
            if base is not None and r is not base:
                record.update(ratio=base["ms"] / r["ms"], ratio_to="bf16 FSDP2 step",
                              bytes_ratio_to_bf16=gathered / (base["mb_all_gathered"] or
                                                              base["mb_gather_inputs_x_world"]))
            records.append(record)
        for c in checks:
            records.append({"name": f"fsdp equality {c['config']} ws{world} vs 1",
                            "kind": "fsdp_equality", "format": c["config"],
                            "value": c["max_rel_loss_diff"], "unit": "max rel loss diff", **c})
        write_results(args.out, device_name, records,
                      f"FSDP2 training step at world size {world} ({device_name}): forward + "
                      "backward + optimizer, quantized parameters per recipe against BF16 "
                      "FSDP2; value = MB all-gathered per step, ratio = bf16 ms / recipe ms")
        with open(md_path, "w") as f:
            f.write(markdown(device_name, world, args, rows, checks))
        print(f"wrote {md_path}")
        print(json.dumps({"failures": failures}))
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
