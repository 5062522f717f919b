"""The adapter on CUDA tensors (run by tools/gpu_check.sh on a GPU machine; skipped without
one): the kernels' bytes equal the CPU reference's through the adapter, qrecipe.nn.Linear,
LayerNormLinear, LayerNormMLP (GELU, SwiGLU) and GroupedLinear (an expert without rows) on
CUDA match the same modules on the CPU under the shipped recipes, work runs on torch's
current stream, and a CUDA tensor never falls back to the CPU."""
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
        try:
            cpu = buffers(q.quantize(x, BOTH, rng_offset=7))
        except qrecipe.QrecipeError as cpu_error:
            # A shape the format rejects (e.g. NVFP4's Hadamard needs rows % 16 == 0) is
            # rejected on the GPU too, with the same reason.
            with pytest.raises(qrecipe.QrecipeError) as gpu_error:
                q.quantize(x.cuda(), BOTH, rng_offset=7)
            assert str(cpu_error).split(": ")[-1] == str(gpu_error.value).split(": ")[-1]
            continue
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


# ------------------------------------------------------------------ the other modules
MODULE_RECIPES = RECIPES
SPLITS = [64, 0, 64]  # an expert without rows; multiples of 32 (MXFP8 columnwise blocks)


def module_step(module, x, dy, recipe, *args):
    """Output, input gradient and every parameter's gradient of one step."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    with qrecipe.autocast(recipe):
        y = module(x, *args)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in module.parameters()]


def cpu_and_cuda(make):
    """The same module on both devices: built on the CPU, its state loaded into a CUDA one."""
    cpu = make("cpu")
    gpu = make("cuda")
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def run_both(name, cpu, gpu, x, dy, cpu_args=(), gpu_args=()):
    # Fresh recipes per device; a second step uses the scales delayed scaling computed.
    recipe_cpu, recipe_gpu = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    for _ in range(2):
        ref = module_step(cpu, x, dy, recipe_cpu, *cpu_args)
        out = module_step(gpu, x.cuda(), dy.cuda(), recipe_gpu, *gpu_args)
    assert len(ref) == len(out)
    for i, b in enumerate(out):
        assert b is not None and b.is_cuda, f"{name}: result {i} is not on the GPU"
    return ref, out


def assert_close_after_torch_ops(name, ref, out):
    """For modules whose norm / activation run as torch's own CPU and CUDA kernels: those may
    round a few elements one BF16 ulp apart, and such an element can land on the other side
    of a quantization boundary (one code apart, and with it a row or column of a GEMM
    result). So, rather than every element: each result's relative error norm stays below
    2e-2 and at most 5% of its elements are outside rtol = atol = 2e-2 (the Linear test's
    tolerance). Calibration on the CPU, nudging 30 norm outputs and 200 activation outputs
    by one BF16 ulp on one side (about ten times what different kernels are expected to
    round differently) under every recipe: at most 0.7% error norm and 1.6% of elements
    outside. A wrong decode or scale layout breaks whole blocks and fails both bounds."""
    for i, (a, b) in enumerate(zip(ref, out)):
        a, b = a.float(), b.cpu().float()
        assert a.shape == b.shape, f"{name} result {i}: shape {b.shape} vs {a.shape}"
        error = float((b - a).norm() / a.norm().clamp_min(1e-30))
        outside = float(((b - a).abs() > 2e-2 + 2e-2 * a.abs()).float().mean())
        assert error <= 2e-2 and outside <= 5e-2, \
            f"{name} result {i}: relative error {error:.3g}, {outside:.2%} of elements outside"


@pytest.mark.parametrize("name", MODULE_RECIPES)
def test_layernorm_linear_on_cuda_matches_cpu(name):
    cpu, gpu = cpu_and_cuda(lambda device: qrecipe.nn.LayerNormLinear(
        256, 256, dtype=torch.bfloat16, device=device, name="attn.qkv"))
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    dy = torch.randn(128, 256, dtype=torch.bfloat16)
    assert_close_after_torch_ops(name, *run_both(name, cpu, gpu, x, dy))


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("name", MODULE_RECIPES)
def test_layernorm_mlp_on_cuda_matches_cpu(name, activation):
    cpu, gpu = cpu_and_cuda(lambda device: qrecipe.nn.LayerNormMLP(
        256, 512, activation=activation, dtype=torch.bfloat16, device=device,
        name="layers.0.mlp"))
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    dy = torch.randn(128, 256, dtype=torch.bfloat16)
    assert_close_after_torch_ops(f"{name} {activation}", *run_both(name, cpu, gpu, x, dy))


@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("name", MODULE_RECIPES)
def test_grouped_linear_on_cuda_matches_cpu(name, single):
    # As the Linear test: each expert's GEMMs read the same quantized bytes on both devices
    # (no torch op before them); only the GEMMs' FP32 summation order differs.
    cpu, gpu = cpu_and_cuda(lambda device: qrecipe.nn.GroupedLinear(
        3, 256, 256, single_grouped_parameter=single, dtype=torch.bfloat16, device=device,
        name="moe.experts"))
    x = torch.randn(sum(SPLITS), 256, dtype=torch.bfloat16)
    dy = torch.randn(sum(SPLITS), 256, dtype=torch.bfloat16)
    ref, out = run_both(name, cpu, gpu, x, dy, (SPLITS,),
                        (torch.tensor(SPLITS, device="cuda"),))  # device splits: a sync
    for i, (a, b) in enumerate(zip(ref, out)):
        torch.testing.assert_close(b.cpu().float(), a.float(), rtol=2e-2, atol=2e-2,
                                   msg=lambda m: f"{name} result {i}: {m}")
    # Expert 1 has no rows: its weight gradient is exactly zero.
    empty_expert_grad = out[2][256:512] if single else out[4]  # [y, dx, w, b] / [y, dx, w0, b0, ..]
    assert torch.equal(empty_expert_grad.cpu(), torch.zeros(256, 256, dtype=torch.bfloat16))


def test_shared_delayed_scaling_on_cuda_matches_cpu():
    # Weights sharing one delayed-scaling state (`share: w`): on the GPU the group's amax is
    # taken by a kernel before the update kernel; the states must end as on the CPU (the same
    # weights on both devices, not updated, so every step's weight amaxes are equal).
    yaml = ("version: 1\nname: shared\nrules:\n  - match: {tensor_type: weight}\n"
            "    quantizer: {format: float8, scaling: delayed, amax_history_len: 4, share: w}\n"
            "  - match: {}\n    quantizer: {format: float8}\n")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(3)]
    layers[1].weight.data.mul_(3.0)  # a different amax per weight

    def states(device):
        recipe = qrecipe.Recipe.from_yaml(yaml, "<shared>")
        model = qrecipe.convert(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in layers]))
        model.load_state_dict(torch.nn.Sequential(*layers).state_dict())
        model.to(device)
        for _ in range(3):
            x = torch.randn(32, 64).to(device)
            with qrecipe.autocast(recipe):
                y = model(x)
            y.sum().backward()
        recipe.update_scaling()
        return [{k: v for k, v in s.items() if k != "device"} for s in recipe.scaling_states()]

    cpu, gpu = states("cpu"), states("cuda")
    assert len(cpu) == 3 and gpu == cpu
    assert all(s["scale"] == cpu[0]["scale"] and s["amax_history"] == cpu[0]["amax_history"]
               for s in gpu)
    assert cpu[0]["amax_history"][-1] == float(layers[1].weight.abs().max())
