#!/usr/bin/env python3
"""bench_tp: a tensor + sequence parallel transformer block's training step (forward +
backward) on 2 GPUs, qrecipe against BF16, with the bytes each rank's collectives move.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=build/python \\
        torchrun --standalone --nproc-per-node 2 bench/bench_tp.py --out $OUT/bench_tp.json

Block (Llama-3-8B layer shapes): RMSNorm (torch's SequenceParallel) -> q / k / v projections
(4096 -> 4096 / 1024 / 1024, ColwiseParallel with a sequence-sharded input) -> o
(RowwiseParallel, output reduce-scattered along the sequence) on silu(q) + k, v broadcast (an
attention stand-in: the GEMMs and collectives of attention's projections, not its softmax),
then RMSNorm -> gate / up (4096 -> 14336, ColwiseParallel, sequence-sharded input) -> down
(RowwiseParallel, reduce-scattered), with residuals. Input 1 x --seq tokens (each rank holds
seq / 2 of them), BF16 parameters.

  bf16                 torch.nn.Linear with torch's ColwiseParallel / RowwiseParallel: the
                       norm outputs are all-gathered in BF16
  qrecipe_<recipe>     qrecipe.convert + qrecipe.parallel's styles: each rank quantizes its
                       rows and the quantized bytes and scales are all-gathered (amaxes of
                       per-tensor scales max-reduced over the group)

Reported per candidate (rank 0; the ranks step together): median ms per step over
interleaved samples, the ratio to bf16 (> 1: faster), and the bytes one rank's collectives
took as input in one step (all-gathers, reduce-scatters, all-reduces: counted at the
collective ops), next to bf16's. Printed as a markdown table and written (--out) in the
results format of tools/bench_table.py (records of kind tp_step). --check: also compare each
candidate's first-step output on the 2 ranks with the same block in one process on rank 0
(relative error of the output, printed; the exit status is 1 when it exceeds 5%: a broken
gather or a wrong scale shows as an error of order 1).
--device cpu (gloo, small shapes: --seq 256 --width 256 --hidden 512) runs the same code
without GPUs (a smoke test).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import qrecipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_linear import paired_ratio, round_order, write_results  # noqa: E402

# Native FP8 GEMMs on Hopper (mxfp8 and nvfp4 are not): --recipes adds others.
RECIPES = ("default", "blockwise")


class Block(torch.nn.Module):
    def __init__(self, width, hidden, kv, dtype):
        super().__init__()
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False, dtype=dtype)  # noqa: E731
        self.norm1 = torch.nn.RMSNorm(width, dtype=dtype)
        self.q, self.k, self.v, self.o = lin(width, width), lin(width, kv), lin(width, kv), \
            lin(width, width)
        self.norm2 = torch.nn.RMSNorm(width, dtype=dtype)
        self.gate, self.up, self.down = lin(width, hidden), lin(width, hidden), \
            lin(hidden, width)
        self.rep = width // kv

    def forward(self, x):
        h = self.norm1(x)
        # Attention stand-in: the projections' GEMMs and layouts, not the softmax. k and v
        # (fewer heads) are repeated over the query heads' width as GQA does.
        kv = (self.k(h) + self.v(h)).repeat_interleave(self.rep, dim=-1)
        x = x + self.o(torch.nn.functional.silu(self.q(h)) * kv)
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def plan(colwise, rowwise):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel
    sp_in = lambda: colwise(input_layouts=Shard(1))  # noqa: E731
    return {"norm1": SequenceParallel(), "q": sp_in(), "k": sp_in(), "v": sp_in(),
            "o": rowwise(output_layouts=Shard(1)), "norm2": SequenceParallel(),
            "gate": sp_in(), "up": sp_in(), "down": rowwise(output_layouts=Shard(1))}


class CollectiveBytes(TorchDispatchMode):
    """Sums the input bytes of every collective op (c10d and functional collectives)."""

    def __init__(self):
        super().__init__()
        self.bytes = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns = getattr(func, "namespace", "")
        if ns in ("c10d", "_c10d_functional"):
            name = func.__name__.split(".")[0]
            if not name.startswith(("wait", "barrier", "_wrap")):  # not data movement
                for t in torch.utils._pytree.tree_leaves((args, kwargs or {})):
                    if isinstance(t, torch.Tensor):
                        self.bytes[name] += t.numel() * t.element_size()
                        break  # the input (first tensor argument)
        return func(*args, **(kwargs or {}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=14336)
    p.add_argument("--kv", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise
    from torch.distributed.tensor.parallel import RowwiseParallel as TorchRowwise
    from torch.distributed.tensor.parallel import parallelize_module
    from qrecipe.parallel import ColwiseParallel, RowwiseParallel
    mesh = init_device_mesh(args.device, (world,))
    device = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    with device:
        base = Block(args.width, args.hidden, args.kv, dtype)
    x_full = torch.randn(1, args.seq, args.width, dtype=dtype, device=device,
                         generator=torch.Generator(device=device).manual_seed(1))
    rows = args.seq // world
    x_local = x_full[:, rank * rows:(rank + 1) * rows].contiguous().requires_grad_()
    grad = torch.randn_like(x_local)

    candidates, references = {}, {}
    bf16 = parallelize_module(copy.deepcopy(base), mesh, plan(TorchColwise, TorchRowwise))
    candidates["bf16"] = (bf16, None)
    for name in args.recipes.split(","):
        recipe = qrecipe.Recipe.builtin(name)
        model = qrecipe.convert(copy.deepcopy(base), recipe)
        if args.check:
            references[name] = copy.deepcopy(model)
        candidates[f"qrecipe_{name}"] = (parallelize_module(model, mesh,
                                                            plan(ColwiseParallel,
                                                                 RowwiseParallel)), recipe)

    def step_of(model, recipe):
        def step():
            x_local.grad = None
            with qrecipe.autocast(recipe, enabled=recipe is not None):  # bf16: torch modules
                y = model(x_local)
            y.backward(grad)
            return y
        return step

    steps = {name: step_of(m, r) for name, (m, r) in candidates.items()}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    failures = []
    moved = {}
    for name, step in steps.items():
        for _ in range(2):  # warm-up
            step()
        counter = CollectiveBytes()
        with counter:
            y = step()
        moved[name] = dict(counter.bytes)
        if args.check and name.startswith("qrecipe_"):
            recipe = candidates[name][1]
            full = [torch.empty_like(y) for _ in range(world)]
            dist.all_gather(full, y.detach().contiguous())
            if rank == 0:
                with qrecipe.autocast(recipe):
                    want = references[name[len("qrecipe_"):]](x_full)
                got = torch.cat(full, 1)
                err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                print(f"check {name}: 2-rank output vs one process: relative error {err:.2e}")
                if not err < 0.05:
                    failures.append(f"{name}: relative error {err:.3f}")
    references.clear()
    times = {name: [] for name in steps}
    for r in range(args.samples):
        for name in round_order(list(steps), r):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3 / args.steps)
    if rank == 0:
        dev = torch.cuda.get_device_name() if cuda else "cpu"
        shape = (f"TP=SP={world}, 1x{args.seq} tokens, width {args.width}, hidden "
                 f"{args.hidden}, kv {args.kv}")
        records = []
        print(f"\n{dev} x{world}; {shape}\n")
        print("| candidate | ms/step | vs bf16 | MB moved/step/rank | vs bf16 bytes | by op |")
        print("|---|---:|---:|---:|---:|---|")
        base_bytes = sum(moved["bf16"].values())
        for name, samples in times.items():
            ms = statistics.median(samples)
            ratio = paired_ratio(times["bf16"], samples)
            total = sum(moved[name].values())
            ops = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(moved[name].items()))
            print(f"| {name} | {ms:.2f} | {ratio:.3f}x | {total / 1e6:.1f} | "
                  f"{total / base_bytes:.3f} | {ops} |")
            records.append({"name": f"tp {name}", "kind": "tp_step", "ms": ms,
                            "ratio": ratio, "ratio_to": "bf16", "shape": shape,
                            "value": total, "unit": "collective input bytes/step/rank",
                            "bytes_by_op": moved[name]})
        if args.out:
            write_results(args.out, dev, records, f"bench_tp: TP+SP block step, {shape}")
        for f in failures:
            print("check failed:", f)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
