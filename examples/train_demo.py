"""Train a small model under a qrecipe recipe, next to a high-precision baseline.

    PYTHONPATH=build/python python3 examples/train_demo.py            # default recipe, CPU
    python3 examples/train_demo.py --recipe recipes/mxfp8.yaml --steps 100
    python3 examples/train_demo.py --device cuda                      # kernels + cuBLASLt

The model is a 3-layer MLP (GELU) learning a fixed random "teacher" MLP from synthetic
Gaussian inputs. Two copies start from the same weights and see the same batches: one in
plain PyTorch (FP32, or BF16 with --baseline-dtype bfloat16), one converted with
qrecipe.convert and run under qrecipe.autocast. The loss is printed every 10 steps for both.

    python3 examples/train_demo.py --telemetry out/     # numerics of the quantized run

--telemetry DIR gathers qrecipe.telemetry every 10th quantization of each role during the
qrecipe run, writes DIR/telemetry.csv and DIR/telemetry.jsonl, prints the layers that
saturate most and plots their saturation over the run to DIR/saturation.png (matplotlib).
"""
import argparse
import copy
import os
import time

import torch
import torch.nn.functional as F

import qrecipe


def make_mlp(d_in, d_hidden, d_out):
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, d_hidden), torch.nn.GELU(),
        torch.nn.Linear(d_hidden, d_hidden), torch.nn.GELU(),
        torch.nn.Linear(d_hidden, d_out))


def batches(steps, batch, teacher, d_in, seed, device):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # targets normalised to unit variance: the loss starts near 1
        scale = teacher(torch.randn(4096, d_in, generator=torch.Generator().manual_seed(99))).std()
    for _ in range(steps):
        x = torch.randn(batch, d_in, generator=g)  # drawn on the CPU: same data on any device
        with torch.no_grad():
            y = teacher(x) / scale
        yield x.to(device), y.to(device)


def train(model, data, lr, recipe=None, dtype=torch.float32):
    model = model.to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        if recipe is None:
            out = model(x.to(dtype))
        else:
            with qrecipe.autocast(recipe):
                out = model(x.to(dtype))
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=None,
                        help="YAML recipe (default: the shipped default recipe)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--baseline-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu",
                        help="cpu (the reference path) or cuda (the plugins' kernels and "
                             "cuBLASLt; needs qrecipe built against a CUDA torch)")
    parser.add_argument("--telemetry", metavar="DIR", default=None,
                        help="gather qrecipe.telemetry during the qrecipe run and write the "
                             "table and a saturation plot of the worst layers into DIR")
    args = parser.parse_args()
    device = torch.device(args.device)

    torch.manual_seed(0)
    d_in, d_out = 64, 16
    recipe = qrecipe.Recipe.default() if args.recipe is None else qrecipe.Recipe.load(args.recipe)
    teacher = make_mlp(d_in, 128, d_out)
    baseline = make_mlp(d_in, args.hidden, d_out)
    quantized = qrecipe.convert(copy.deepcopy(baseline).to(device), recipe=recipe)
    baseline = baseline.to(device)
    # The recipe runs in the model's dtype; NVFP4's Hadamard needs bf16 activations.
    q_dtype = torch.bfloat16 if "nvfp4" in recipe.name else torch.float32

    print(f"recipe '{recipe.name}' ({recipe.source}); plugins: "
          f"{', '.join(p['name'] for p in qrecipe.plugins())}")
    print(quantized[2].explain(recipe))
    base_dtype = getattr(torch, args.baseline_dtype)
    # torch.optim's first step imports torch._dynamo (seconds): keep it out of the timings.
    warm = torch.nn.Parameter(torch.zeros(1))
    warm.grad = torch.zeros(1)
    torch.optim.AdamW([warm]).step()
    t0 = time.perf_counter()
    base_losses = train(baseline, batches(args.steps, args.batch, teacher, d_in, 1, device),
                        args.lr, dtype=base_dtype)
    t1 = time.perf_counter()
    if args.telemetry:
        qrecipe.telemetry.enable(every=10)
    q_losses = train(quantized, batches(args.steps, args.batch, teacher, d_in, 1, device),
                     args.lr, recipe=recipe, dtype=q_dtype)
    t2 = time.perf_counter()

    print(f"\n{'step':>6}  {args.baseline_dtype + ' baseline':>18}  {'qrecipe ' + recipe.name:>20}")
    for step in range(0, args.steps, 10):
        print(f"{step + 1:>6}  {base_losses[step]:>18.5f}  {q_losses[step]:>20.5f}")
    print(f"{'final':>6}  {base_losses[-1]:>18.5f}  {q_losses[-1]:>20.5f}")
    gap = (q_losses[-1] - base_losses[-1]) / base_losses[-1]
    print(f"\nfinal loss: {args.baseline_dtype} {base_losses[-1]:.5f}, qrecipe {recipe.name} "
          f"{q_losses[-1]:.5f} ({gap:+.1%} vs baseline); loss fell "
          f"{q_losses[0] / q_losses[-1]:.1f}x under the recipe")
    print(f"time on {device}: baseline {t1 - t0:.1f} s, qrecipe {t2 - t1:.1f} s" +
          (" (CPU reference GEMMs: exact, not fast)" if device.type == "cpu" else ""))
    if args.telemetry:
        qrecipe.telemetry.disable()
        report_telemetry(args.telemetry)


def report_telemetry(out_dir, worst=4):
    """The table as CSV / JSONL, the roles that saturate most, and their saturation over the
    run as a plot."""
    os.makedirs(out_dir, exist_ok=True)
    table = qrecipe.telemetry.table()
    table.to_csv(os.path.join(out_dir, "telemetry.csv"))
    table.to_jsonl(os.path.join(out_dir, "telemetry.jsonl"))
    top = table.worst("saturated", worst)
    print(f"\ntelemetry: {len(table)} observations in {out_dir}/telemetry.csv; the {len(top)} "
          "roles that saturate most (their worst observation):")
    print(top)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no saturation plot: matplotlib is not installed (pip install matplotlib); the "
              "CSV holds the same numbers")
        return
    by_role = table.by_role()
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in top:
        rows = by_role[row["role"]]
        ax.plot([r["call"] for r in rows], [100 * r["saturated"] for r in rows],
                marker="o", label=row["role"])
    ax.set_xlabel("quantization of the role (call)")
    ax.set_ylabel("saturated elements (%)")
    ax.set_title("qrecipe telemetry: the layers that saturate most")
    ax.legend(fontsize="small")
    path = os.path.join(out_dir, "saturation.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"saturation plot: {path}")


if __name__ == "__main__":
    main()
