"""GroupedLinear on CUDA with m_splits on the device (run by tools/gpu_check.sh on a GPU
machine; skipped without one): a forward and backward with the splits a CUDA tensor run with no
host synchronization (torch.cuda.set_sync_debug_mode("error") raises on any), give the numbers
of the same call with host splits bit for bit (the same grouped kernels on the same bytes), and
stay within the recipe's tolerance of the CPU module; the grouped GEMM of each kind is one
engine call; formats without device-split quantization read the splits on the host and say
why."""

import pytest
import torch

import qrecipe
from qrecipe import _C
from qrecipe.nn import grouped_linear_function
from test_recipes import TOLERANCE, rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE_SPLIT_RECIPES = ["default", "float8_delayed", "float8_e4m3", "blockwise", "mxfp8"]
# Uneven routing with an empty expert and a single-token one (device splits need no multiples
# of 16), and the same with multiples of 16: host groups whose wgrad contraction is not a
# multiple of 16 run per expert (cuBLASLt), so bit equality of device and host splits is
# checked on those.
SPLITS = [160, 0, 1, 303, 48, 64]
SPLITS16 = [160, 0, 16, 304, 48, 64]
IN, OUT = 256, 192


def make(n=len(SPLITS), device="cuda", dtype=torch.bfloat16, seed=7):
    torch.manual_seed(seed)
    return qrecipe.nn.GroupedLinear(n, IN, OUT, bias=False, device=device, dtype=dtype,
                                    name="moe.experts")


def step(module, x, dy, splits, recipe):
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    with qrecipe.autocast(recipe):
        y = module(x, splits)
    y.backward(dy)
    return [y.detach(), x.grad, module.weight.grad]


def test_the_build_has_the_grouped_kernels():
    # Device splits and one-launch grouped GEMMs need them: a GPU build without CUTLASS
    # headers runs one GEMM per expert and reads tensor splits on the host.
    assert qrecipe.grouped_kernels_built(), (
        "this CUDA build has no grouped GEMM kernels: install the nvidia-cutlass wheel "
        "(tools/setup.sh) and reconfigure")


@pytest.mark.parametrize("name", DEVICE_SPLIT_RECIPES)
@pytest.mark.parametrize("splits", [SPLITS, SPLITS16])
def test_device_splits_run_without_host_synchronization(name, splits):
    # Three recipe objects (device splits, host splits, CPU), each driven through the same two
    # steps, so delayed-scaling states advance alike and the second steps compare.
    r_dev, r_host, r_cpu = (qrecipe.Recipe.builtin(name) for _ in range(3))
    module = make()
    plan = module.device_splits_plan(r_dev, torch.bfloat16)
    assert plan["served"], plan
    x = torch.randn(sum(splits), IN, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(sum(splits), OUT, device="cuda", dtype=torch.bfloat16) * 0.01
    on_device = torch.tensor(splits, device="cuda")
    step(module, x, dy, on_device, r_dev)  # first use: allocations and plans may synchronize
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = step(module, x, dy, on_device, r_dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    if splits is SPLITS16:  # host splits: the same grouped kernels on the same bytes
        step(module, x, dy, splits, r_host)
        want = step(module, x, dy, splits, r_host)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"{name}: output {i} differs between device and host splits"
    # The CPU module (the reference) within the recipe's tolerance.
    cpu = make(device="cpu")
    with torch.no_grad():
        cpu.weight.copy_(module.weight.cpu())
    step(cpu, x.cpu(), dy.cpu(), splits, r_cpu)
    ref = step(cpu, x.cpu(), dy.cpu(), splits, r_cpu)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert rel(a.cpu().float(), b.float()) <= TOLERANCE[name], (name, i)


@pytest.mark.parametrize("name", ["default", "mxfp8"])
def test_one_grouped_gemm_per_kind_and_one_split_quantization_per_tensor(name, monkeypatch):
    calls = []
    gemm, split = grouped_linear_function._gemm_grouped, grouped_linear_function._quantize_split

    def counting_gemm(a, da, b, db, out, kind, offsets=None, accumulate=False, bias=None):
        plan = gemm(a, da, b, db, out, kind, offsets=offsets, accumulate=accumulate, bias=bias)
        calls.append((kind, plan))
        return plan

    def counting_split(quantizer, tensor, splits, usage):
        calls.append(("quantize", quantizer.role))
        return split(quantizer, tensor, splits, usage)

    monkeypatch.setattr(grouped_linear_function, "_gemm_grouped", counting_gemm)
    monkeypatch.setattr(grouped_linear_function, "_quantize_split", counting_split)
    module = make()
    x = torch.randn(sum(SPLITS), IN, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(sum(SPLITS), OUT, device="cuda", dtype=torch.bfloat16)
    step(module, x, dy, torch.tensor(SPLITS, device="cuda"), qrecipe.Recipe.builtin(name))
    kinds = [c[0] for c in calls if c[0] in ("fprop", "dgrad", "wgrad")]
    assert kinds == ["fprop", "dgrad", "wgrad"]
    for kind, plan in calls:
        if kind in ("fprop", "dgrad", "wgrad"):
            assert plan.startswith("one launch"), (kind, plan)
    assert len([c for c in calls if c[0] == "quantize"]) == 2


@pytest.mark.parametrize("name", ["nvfp4"])
def test_formats_without_device_split_paths_read_the_splits_on_the_host(name):
    module = make()
    plan = module.device_splits_plan(qrecipe.Recipe.builtin(name), torch.bfloat16)
    assert not plan["served"]
    assert "nvfp4" in plan["why"] and "device-split" in plan["why"]
    splits = [32, 0, 16, 304, 48, 64]
    x = torch.randn(sum(splits), IN, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(sum(splits), OUT, device="cuda", dtype=torch.bfloat16) * 0.01
    # The tensor is read on the host, so the numbers are the list's (fresh recipe objects:
    # the stochastic-rounding counters advance alike).
    got = step(module, x, dy, torch.tensor(splits, device="cuda"), qrecipe.Recipe.builtin(name))
    want = step(module, x, dy, splits, qrecipe.Recipe.builtin(name))
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), i


def test_grouped_gemm_on_cuda_with_device_offsets_equals_host_groups():
    recipe = qrecipe.Recipe.builtin("default")
    plan = recipe.engine.plan_linear("grouped_linear", "moe", IN, OUT, 16)
    qx, qw = plan["input"], plan["weight"]
    x = torch.randn(sum(SPLITS), IN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(len(SPLITS) * OUT, IN, device="cuda", dtype=torch.bfloat16) * 0.05
    ws = _C.quantize_grouped(qw, w, [OUT] * len(SPLITS), 3)
    xs = _C.quantize_grouped(qx, x, SPLITS, 3)
    offsets = torch.tensor([0] + SPLITS, device="cuda").cumsum(0)  # fprop: any sizes
    xg = _C.quantize_grouped_split(qx, x, offsets, 3)
    assert xg.device_split
    outs = [torch.empty(r, OUT, device="cuda", dtype=torch.bfloat16) for r in SPLITS]
    _C.gemm_grouped(xs, "rowwise", ws, "rowwise", outs, kind="fprop")
    y = torch.empty(sum(SPLITS), OUT, device="cuda", dtype=torch.bfloat16)
    _C.gemm_grouped(xg, "rowwise", ws, "rowwise", y, kind="fprop")
    assert torch.equal(y, torch.cat(outs))
