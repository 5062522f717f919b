"""The adapter on CUDA tensors (run by tools/gpu_check.sh on a GPU machine; skipped without
one): the kernels' bytes equal the CPU reference's through the adapter, qrecipe.nn.Linear on
CUDA matches the same layer on the CPU, work runs on torch's current stream, and a CUDA
tensor never falls back to the CPU."""
import pytest
import torch

import qrecipe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RECIPES = [n for n in qrecipe.Recipe.builtin_names() if n != "none"]
ROLES = ("input", "weight", "grad_output")
BOTH = 3  # rowwise | columnwise


def quantizers(recipe):
    plan = recipe.engine.plan_linear("linear", "fc", 64, 64, 64)
    return [(role, plan[role]) for role in ROLES if plan[role] is not None]


def buffers(q):
    out = {}
    for direction in ("rowwise", "columnwise"):
        if not q.has(direction):
            continue
        for what in ("data", "scale_inv", "amax"):
            b = getattr(q, what)(direction)
            if b is not None:
                out[f"{direction} {what}"] = b.cpu()
    return out


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("shape", [(1, 1), (33, 70), (257, 384), (512, 1024)])
def test_quantize_bytes_equal_cpu_reference(name, shape):
    recipe = qrecipe.Recipe.builtin(name)
    x = torch.randn(*shape, dtype=torch.bfloat16) * 3
    x[0, 0] = float("nan") if shape[0] * shape[1] > 4 else x[0, 0]
    for role, q in quantizers(recipe):
        cpu = buffers(q.quantize(x, BOTH, rng_offset=7))
        gpu_q = q.quantize(x.cuda(), BOTH, rng_offset=7)
        assert gpu_q.data("rowwise").is_cuda
        gpu = buffers(gpu_q)
        assert cpu.keys() == gpu.keys(), (name, role)
        for key in cpu:
            assert torch.equal(cpu[key].view(torch.uint8), gpu[key].view(torch.uint8)), \
                f"{name} {role} {key} {shape}: CUDA bytes differ from the CPU reference"


def step(module, x, dy, recipe):
    x = x.detach().clone().requires_grad_()
    module.zero_grad()
    with qrecipe.autocast(recipe):
        y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad, module.bias.grad


def pair(features=256):
    cpu = qrecipe.nn.Linear(features, features, dtype=torch.bfloat16, name="fc")
    gpu = qrecipe.nn.Linear(features, features, dtype=torch.bfloat16, device="cuda", name="fc")
    with torch.no_grad():
        gpu.weight.copy_(cpu.weight)
        gpu.bias.copy_(cpu.bias)
    return cpu, gpu


@pytest.mark.parametrize("name", RECIPES)
def test_linear_on_cuda_matches_cpu(name):
    # Same quantized bytes on both devices; only the GEMM's FP32 summation order differs.
    cpu, gpu = pair()
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    dy = torch.randn(128, 256, dtype=torch.bfloat16)
    recipe_cpu, recipe_gpu = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    for _ in range(2):  # a second step uses the scales delayed scaling computed after the first
        ref = step(cpu, x, dy, recipe_cpu)
        out = step(gpu, x.cuda(), dy.cuda(), recipe_gpu)
    for a, b, what in zip(ref, out, ("y", "dx", "dW", "db")):
        assert b.is_cuda, f"{name}: {what} is not on the GPU"
        torch.testing.assert_close(b.cpu().float(), a.float(), rtol=2e-2, atol=2e-2,
                                   msg=lambda m: f"{name} {what}: {m}")


def test_recipe_none_on_cuda_is_torch_linear():
    ref = torch.nn.Linear(64, 32, device="cuda", dtype=torch.bfloat16)
    ours = qrecipe.nn.Linear(64, 32, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    with qrecipe.autocast(qrecipe.Recipe.builtin("none")):
        assert torch.equal(ours(x), ref(x))


def test_runs_on_the_current_stream():
    # The same step on a side stream gives the same bytes: every engine launch was ordered on
    # that stream (a launch on another stream would race with the inputs written on it).
    _, gpu = pair()
    recipe = qrecipe.Recipe.builtin("default")
    x = torch.randn(128, 256, dtype=torch.bfloat16, device="cuda")
    dy = torch.randn(128, 256, dtype=torch.bfloat16, device="cuda")
    expected = step(gpu, x, dy, recipe)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x_side = x * 1  # written on the side stream just before the layer reads it
        got = step(gpu, x_side, dy, recipe)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


def test_dequantize_on_cuda_matches_cpu():
    q = qrecipe.Recipe.builtin("mxfp8").quantizer("linear", "input")
    x = torch.randn(64, 96)
    assert torch.equal(q.quantize(x.cuda()).dequantize().cpu(), q.quantize(x).dequantize())
