"""Smoke test of an installed qrecipe: what a user runs right after `pip install`.

    PYTHONPATH=<pip --target dir> python3 tools/pip_smoke.py [--device cuda] [--expect-under DIR]

tools/gpu_check.sh's `pip` stage runs it against a fresh `pip install --no-build-isolation
--target` of the repository, with only that directory on PYTHONPATH (issue 23: the README's
install path crashed at the first GEMM while the build tree worked). It checks:
  - `import qrecipe` loads the installed package (under --expect-under), its plugins and its
    shipped recipes, and the process maps exactly one libstdc++;
  - under every shipped recipe, a qrecipe.nn.Linear (converted from torch.nn.Linear, BF16)
    forward and backward on --device: finite output and gradients of the right shapes, close
    to the BF16 layer's (relative Frobenius error below a bound loose enough for FP4);
  - under every shipped recipe, a qrecipe.nn.GroupedLinear forward (4 experts, one of them
    empty): each expert's rows close to its own BF16 product.
Prints one line per check; exits non-zero on the first failure, with what failed.
"""
import argparse
import os
import sys

import torch

# Quantized (FP8 / FP4) against BF16 on N(0, 1) data: FP8 stays near 0.05, NVFP4 near 0.1-0.15;
# a broken GEMM (wrong scale, wrong layout, garbage) is off by 1 or more.
MAX_RELATIVE_ERROR = 0.3


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def check(condition: bool, what: str) -> None:
    if not condition:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)


def check_install(qrecipe, expect_under: str) -> None:
    where = os.path.realpath(qrecipe.__file__)
    print(f"qrecipe from {where}")
    if expect_under:
        root = os.path.realpath(expect_under)
        check(where.startswith(root + os.sep),
              f"qrecipe was imported from {where}, not from the installed package under {root}")
    names = qrecipe.Recipe.builtin_names()
    check(len(names) > 0, "the installed package ships no recipes (qrecipe/recipes/*.yaml)")
    print(f"shipped recipes: {', '.join(names)}")
    # Every C++ runtime mapped into this process: one copy, shared by torch and qrecipe.
    with open("/proc/self/maps") as maps:
        runtimes = sorted({line.split()[-1] for line in maps if "libstdc++" in line.split()[-1]})
    check(len(runtimes) == 1, f"this process maps {len(runtimes)} libstdc++ files: {runtimes}")
    print(f"C++ runtime: {runtimes[0]}")


def linear_step(qrecipe, recipe, device: str) -> None:
    torch.manual_seed(0)
    dense = torch.nn.Linear(256, 512, bias=True).to(device=device, dtype=torch.bfloat16)
    model = qrecipe.convert(torch.nn.Sequential(dense)).to(device)
    weight = model[0].weight
    check(type(model[0]).__name__ == "Linear" and type(model[0]).__module__.startswith("qrecipe"),
          f"qrecipe.convert left {type(model[0])}")
    x = torch.randn(128, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(recipe):
        y = model(x)
    check(y.shape == (128, 512) and y.dtype == torch.bfloat16,
          f"{recipe.name}: output {tuple(y.shape)} {y.dtype}, expected (128, 512) bfloat16")
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    for name, t in (("output", y), ("input gradient", x.grad), ("weight gradient", weight.grad)):
        check(t is not None and bool(torch.isfinite(t).all()), f"{recipe.name}: {name} is missing "
              f"or not finite")
    check(x.grad.shape == x.shape and weight.grad.shape == weight.shape,
          f"{recipe.name}: gradient shapes {tuple(x.grad.shape)}, {tuple(weight.grad.shape)}")
    # The same layer in BF16 (no quantization), same weights.
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = weight.detach().clone().requires_grad_(True)
    y_ref = torch.nn.functional.linear(x_ref, w_ref, model[0].bias.detach())
    y_ref.backward(grad_y)
    errors = {"y": relative_error(y, y_ref), "dx": relative_error(x.grad, x_ref.grad),
              "dW": relative_error(weight.grad, w_ref.grad)}
    for name, e in errors.items():
        check(e < MAX_RELATIVE_ERROR, f"{recipe.name}: Linear {name} is {e:.3f} (relative) from "
              f"the BF16 layer's, above {MAX_RELATIVE_ERROR}")
    print(f"ok   Linear forward+backward under {recipe.name}: relative error vs BF16 "
          + ", ".join(f"{k} {v:.3f}" for k, v in errors.items()), flush=True)


def grouped_forward(qrecipe, recipe, device: str) -> None:
    torch.manual_seed(1)
    splits = [32, 0, 48, 48]
    experts = qrecipe.nn.GroupedLinear(len(splits), 256, 128, bias=True).to(
        device=device, dtype=torch.bfloat16)
    x = torch.randn(sum(splits), 256, device=device, dtype=torch.bfloat16)
    with qrecipe.autocast(recipe), torch.no_grad():
        y = experts(x, splits)
    check(y.shape == (sum(splits), 128) and bool(torch.isfinite(y).all()),
          f"{recipe.name}: GroupedLinear output {tuple(y.shape)} (finite: "
          f"{bool(torch.isfinite(y).all())}), expected ({sum(splits)}, 128) finite")
    weights = experts.weight.detach().view(len(splits), 128, 256)
    biases = experts.bias.detach().view(len(splits), 128)
    worst, row = 0.0, 0
    for i, rows in enumerate(splits):
        if rows:
            want = torch.nn.functional.linear(x[row:row + rows], weights[i], biases[i])
            worst = max(worst, relative_error(y[row:row + rows], want))
        row += rows
    check(worst < MAX_RELATIVE_ERROR, f"{recipe.name}: a GroupedLinear expert is {worst:.3f} "
          f"(relative) from its BF16 product, above {MAX_RELATIVE_ERROR}")
    print(f"ok   GroupedLinear forward under {recipe.name}: worst expert {worst:.3f} from BF16",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--expect-under", default="",
                        help="fail unless qrecipe is imported from this directory")
    args = parser.parse_args()
    if args.device.startswith("cuda"):
        check(torch.cuda.is_available(), f"--device {args.device} but torch {torch.__version__} "
              "sees no CUDA device")
    import qrecipe  # after torch, as a user does; the check above must not depend on qrecipe

    check_install(qrecipe, args.expect_under)
    for name in qrecipe.Recipe.builtin_names():
        recipe = qrecipe.Recipe.builtin(name)
        linear_step(qrecipe, recipe, args.device)
        grouped_forward(qrecipe, recipe, args.device)
    print(f"pip smoke test passed on {args.device} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
