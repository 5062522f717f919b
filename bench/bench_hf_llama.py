#!/usr/bin/env python3
"""bench_hf_llama: one training step (forward + backward, no optimizer) of a Hugging Face
``LlamaForCausalLM`` with Llama-3-8B layer shapes, per candidate, all in one process with the
samples interleaved (bench_linear's time_interleaved: a shuffled order per round).

Model: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, 2 layers, vocab 32000, BF16
parameters, SDPA attention; input 4 x 2048 tokens with labels (the loss is the HF loss). Every
candidate starts from the same BF16 weights. The quantized candidates convert the decoder's
Linear layers (q/k/v/o, gate/up/down) and keep ``lm_head`` in BF16 (qrecipe: convert's
filter_fn; torchao: its module filter), so both quantize the same GEMMs.

  bf16_eager / bf16_compiled             the model as it is, eager / torch.compile
  torchao_tensorwise_compiled            torchao.float8 convert_to_float8_training, recipe
  torchao_rowwise_compiled               "tensorwise" / "rowwise", torch.compile (torchao's
                                         intended use; skipped with the reason printed when
                                         torchao is not importable)
  qrecipe_<recipe>_eager / _compiled     qrecipe.convert(model, recipe) under
                                         qrecipe.autocast(recipe), eager / torch.compile, for
                                         recipes default, float8_delayed, blockwise; convert
                                         also puts the fused qrecipe.nn.RMSNorm in place of
                                         LlamaRMSNorm (fuse_norms, docs/adapter.md "Fused
                                         RMSNorm"), the BF16 and torchao candidates keep HF's

Printed and written (--out, the results format of tools/bench_table.py): median ms per step,
the ratio to bf16_eager (median over rounds of bf16_eager ms / candidate ms; > 1: faster) and,
for compiled qrecipe candidates, the ratio to torchao_tensorwise_compiled. The issue's
targets: qrecipe compiled faster than torchao tensorwise compiled and >= 1.45x bf16_eager;
qrecipe eager >= 1.30x bf16_eager (--check makes the exit status say whether they hold).

usage: bench_hf_llama.py [--out FILE.json] [--steps 5] [--samples 5] [--layers 2]
                         [--batch 4] [--seq 2048] [--candidates name,name,...] [--check]
The qrecipe package must be importable (PYTHONPATH=BUILD/python, built with CUDA), and
transformers installed.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch

import qrecipe
from bench_linear import paired_ratio, time_interleaved, write_results

QRECIPE_RECIPES = ("default", "float8_delayed", "blockwise")


def not_lm_head(name: str, module) -> bool:
    return name != "lm_head"


def base_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=args.layers, vocab_size=32000,
                         max_position_embeddings=max(4096, args.seq), use_cache=False,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.train()
    return model


def step_of(model, ids, recipe=None):
    def step():
        if recipe is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with qrecipe.autocast(recipe):
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in model.parameters():
            p.grad = None
    return step


def torchao_model(base, recipe_name):
    """(model, None) or (None, reason)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as error:  # noqa: BLE001 - any import failure is a reason to skip
        return None, f"torchao.float8 not importable: {error}"
    model = copy.deepcopy(base)
    config = Float8LinearConfig.from_recipe_name(recipe_name)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda m, fqn: fqn != "lm_head")
    return torch.compile(model), None


def candidates(base, ids, wanted):
    """{name: step callable}, and {name: reason} for those skipped."""
    steps, skipped = {}, {}

    def want(name):
        return wanted is None or name in wanted

    if want("bf16_eager"):
        steps["bf16_eager"] = step_of(copy.deepcopy(base), ids)
    if want("bf16_compiled"):
        steps["bf16_compiled"] = step_of(torch.compile(copy.deepcopy(base)), ids)
    for recipe_name in ("tensorwise", "rowwise"):
        name = f"torchao_{recipe_name}_compiled"
        if want(name):
            model, reason = torchao_model(base, recipe_name)
            if model is None:
                skipped[name] = reason
            else:
                steps[name] = step_of(model, ids)
    for recipe_name in QRECIPE_RECIPES:
        for mode in ("eager", "compiled"):
            name = f"qrecipe_{recipe_name}_{mode}"
            if not want(name):
                continue
            recipe = qrecipe.Recipe.builtin(recipe_name)
            model = qrecipe.convert(copy.deepcopy(base), recipe=recipe, filter_fn=not_lm_head)
            steps[name] = step_of(torch.compile(model) if mode == "compiled" else model, ids,
                                  recipe)
    return steps, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--candidates", help="comma-separated names (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the issue's speed targets hold")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_hf_llama: needs a CUDA device", file=sys.stderr)
        return 2
    wanted = set(args.candidates.split(",")) if args.candidates else None
    base = base_model(args)
    ids = torch.randint(0, base.config.vocab_size, (args.batch, args.seq), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    steps, skipped = candidates(base, ids, wanted)
    del base
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    # Warm-up doubles as compilation (each compiled candidate compiles at its first call).
    times = time_interleaved(steps, args.steps, args.samples, warmup=3)
    device = torch.cuda.get_device_name()
    shape = f"{args.layers} layers, {args.batch}x{args.seq} tokens"
    records, rows = [], []
    base_name = "bf16_eager" if "bf16_eager" in times else None
    peer = "torchao_tensorwise_compiled" if "torchao_tensorwise_compiled" in times else None
    for name, samples in times.items():
        ms = statistics.median(samples)
        record = {"name": f"hf_llama {name}", "kind": "hf_llama_step", "ms": ms,
                  "shape": shape}
        to_bf16 = paired_ratio(times[base_name], samples) if base_name else None
        if to_bf16 is not None:
            record.update(ratio=to_bf16, ratio_to="bf16_eager")
        to_peer = None
        if peer and name.startswith("qrecipe_") and name.endswith("_compiled"):
            to_peer = paired_ratio(times[peer], samples)
            record["ratio_to_torchao_tensorwise"] = to_peer
        records.append(record)
        rows.append((name, ms, to_bf16, to_peer))
    for name, reason in skipped.items():
        records.append({"name": f"hf_llama {name}", "kind": "hf_llama_step",
                        "error": f"skipped: {reason}"})
    print(f"\n{device}; LlamaForCausalLM 4096/14336, 32 heads, 8 KV heads, {shape}\n")
    print("| candidate | ms/step | vs bf16 eager | vs torchao tensorwise compiled |")
    print("|---|---:|---:|---:|")
    for name, ms, to_bf16, to_peer in rows:
        print(f"| {name} | {ms:.2f} | {'' if to_bf16 is None else f'{to_bf16:.3f}x'} | "
              f"{'' if to_peer is None else f'{to_peer:.3f}x'} |")
    if args.out:
        write_results(args.out, device, records,
                      f"bench_hf_llama: HF LlamaForCausalLM fwd+bwd step, {shape}")
    if not args.check:
        return 0
    failures = []
    for name, _, to_bf16, to_peer in rows:
        if not name.startswith("qrecipe_") or to_bf16 is None:
            continue
        if name.endswith("_compiled"):
            if to_bf16 < 1.45:
                failures.append(f"{name}: {to_bf16:.3f}x bf16 eager < 1.45x")
            if to_peer is not None and to_peer <= 1.0:
                failures.append(f"{name}: not faster than torchao tensorwise compiled "
                                f"({to_peer:.3f}x)")
        elif to_bf16 < 1.30:
            failures.append(f"{name}: {to_bf16:.3f}x bf16 eager < 1.30x")
    for f in failures:
        print("target missed:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
