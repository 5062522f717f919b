"""qrecipe.nn.Linear: bit-identity with torch.nn.Linear when nothing is quantized, the
quantized path's operands and saved tensors, the no-grad path."""
import pytest
import torch
import torch.nn.functional as F

import qrecipe
from conftest import forward_backward
from qrecipe import _C

NONE = qrecipe.Recipe.builtin("none")


def pair(in_features, out_features, bias, dtype=torch.float32):
    ref = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    ours = qrecipe.nn.Linear(in_features, out_features, bias=bias, dtype=dtype, name="fc")
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        if bias:
            ours.bias.copy_(ref.bias)
    return ref, ours


def run(module, x, dy, recipe=None, enabled=True):
    y, *grads = forward_backward(module, x, dy, recipe, enabled)
    return y, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["outside", "recipe-none", "disabled"])
def test_matches_torch_linear_bit_for_bit(dtype, bias, mode):
    ref, ours = pair(24, 40, bias, dtype)
    x = torch.randn(3, 5, 24, dtype=dtype)  # N-D input: leading dims are tokens
    dy = torch.randn(3, 5, 40, dtype=dtype)
    y_ref, g_ref = run(ref, x, dy, enabled=False)
    if mode == "outside":
        y, g = run(ours, x, dy, enabled=False)
    elif mode == "recipe-none":
        y, g = run(ours, x, dy, recipe=NONE)
    else:
        y, g = run(ours, x, dy, recipe=qrecipe.Recipe.default(), enabled=False)
    assert torch.equal(y, y_ref)
    assert len(g) == len(g_ref)
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)


def test_reset_parameters_matches_torch_init():
    torch.manual_seed(3)
    ref = torch.nn.Linear(16, 8)
    torch.manual_seed(3)
    ours = qrecipe.nn.Linear(16, 8)
    assert torch.equal(ref.weight, ours.weight) and torch.equal(ref.bias, ours.bias)


def test_forward_uses_the_recipes_quantized_operands():
    # fprop must equal the engine GEMM of the two rowwise operands quantized by the recipe's
    # own quantizers, plus the bias in FP32: exact equality, not a tolerance.
    recipe = qrecipe.Recipe.default()
    _, ours = pair(32, 16, bias=True)
    x = torch.randn(8, 32)
    with qrecipe.autocast(recipe):
        y = ours(x)
    qx = recipe.quantizer("linear", "input", "fc").quantize(x, "rowwise")
    qw = recipe.quantizer("linear", "weight", "fc").quantize(ours.weight.detach(), "rowwise")
    expected = qx.dequantize() @ qw.dequantize().t() + ours.bias.detach()
    # The engine sums in a fixed blocked order, torch.matmul in its own: same products,
    # different summation order, so compare at FP32 rounding level.
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(y, F.linear(x, ours.weight, ours.bias))  # it did quantize


def test_partial_none_recipe_uses_dense_operands():
    # Only the weight is quantized: input and grad_output stay high precision.
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "weight-only", "defaults": {"format": "none"},
        "rules": [{"match": {"tensor_type": "weight"}, "quantizer": {"format": "float8"}}]})
    _, ours = pair(32, 16, bias=False)
    x = torch.randn(8, 32, requires_grad=True)
    with qrecipe.autocast(recipe):
        y = ours(x)
    y.sum().backward()
    qw = recipe.quantizer("linear", "weight", "fc").quantize(ours.weight.detach())
    torch.testing.assert_close(y, x.detach() @ qw.dequantize().t(), rtol=1e-5, atol=1e-5)
    # dgrad: dy (dense ones) x W columnwise (quantized); wgrad: dy x x, both dense.
    torch.testing.assert_close(x.grad, torch.ones(8, 16) @ qw.dequantize("columnwise"),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, torch.ones(16, 8) @ x.detach(),
                               rtol=1e-5, atol=1e-5)


def test_backward_keeps_only_columnwise_copies():
    # Each direction of a quantized tensor is one allocation (its data, scale_inv and amax).
    # Saved for backward: x columnwise (wgrad) and W columnwise (dgrad) = 2, not 4.
    _, ours = pair(32, 16, bias=True)
    x = torch.randn(8, 32, requires_grad=True)
    before = _C.live_allocations()
    with qrecipe.autocast():
        y = ours(x)
    assert _C.live_allocations() - before == 2
    y.sum().backward()
    del y
    assert _C.live_allocations() == before


def test_no_grad_quantizes_rowwise_only_and_saves_nothing():
    _, ours = pair(32, 16, bias=True)
    x = torch.randn(8, 32)
    before = _C.live_allocations()
    with torch.no_grad(), qrecipe.autocast():
        y_ng = ours(x)
    assert y_ng.grad_fn is None
    assert _C.live_allocations() == before
    with qrecipe.autocast():
        y = ours(x.clone().requires_grad_())
    assert torch.equal(y_ng, y.detach())


def test_float16_input_keeps_its_dtype():
    _, ours = pair(32, 16, bias=True, dtype=torch.float16)
    x = torch.randn(4, 32, dtype=torch.float16, requires_grad=True)
    with qrecipe.autocast():
        y = ours(x)
    y.float().sum().backward()
    assert y.dtype == torch.float16 and x.grad.dtype == torch.float16
    assert ours.weight.grad.dtype == torch.float16


def test_explain_names_roles_and_gemms():
    _, ours = pair(32, 16, bias=False)
    text = ours.explain(qrecipe.Recipe.builtin("hybrid_seed"))
    assert "linear fc under recipe hybrid-seed" in text
    for word in ("input", "weight", "grad_output", "fprop", "dgrad", "wgrad", "mxfp8", "nvfp4"):
        assert word in text


def test_plan_linear_gives_each_gemm_its_path_and_text():
    recipe = qrecipe.Recipe.builtin("mxfp8")
    cpu = recipe.engine.plan_linear("linear", "fc", 256, 128, 64)
    gpu = recipe.engine.plan_linear("linear", "fc", 256, 128, 64, "sm90")
    for kind in ("fprop", "dgrad", "wgrad"):
        assert cpu[kind].kind == kind and cpu[kind].path == _C.GemmPath.reference
        assert str(cpu[kind]) == f"{cpu[kind].a} x {cpu[kind].b}: reference ({cpu[kind].reason})"
        assert gpu[kind].path == _C.GemmPath.emulated  # Hopper has no MXFP8 tensor cores
    assert recipe.engine.plan_linear("linear", "fc", 256, 128, 64, "sm90")["fprop"].shape == \
        (64, 128, 256)
    fp8 = qrecipe.Recipe.builtin("float8_e4m3").engine.plan_linear("linear", "fc", 256, 128, 64,
                                                                  "sm90")
    assert [fp8[k].path for k in ("fprop", "dgrad", "wgrad")] == [_C.GemmPath.native] * 3
    assert fp8["fprop"].fast_accumulation and not fp8["wgrad"].fast_accumulation
    layer = qrecipe.nn.Linear(256, 128, name="fc")
    assert layer.roles(qrecipe.Recipe.builtin("float8_e4m3"), 64).plan["native_on_gpu"] == \
        {"fprop", "dgrad", "wgrad"}
    assert layer.roles(recipe, 64).plan["native_on_gpu"] == frozenset()
    assert f"  fprop        {cpu['fprop']}" in layer.explain(recipe)


def test_linear_shares_the_base_implementation():
    # One implementation of roles, explain, input checks and copying for every module.
    assert issubclass(qrecipe.nn.Linear, qrecipe.nn.QuantizedModule)
    for attr in ("roles", "explain", "_check_input", "__getstate__", "__setstate__", "_linear"):
        assert attr not in vars(qrecipe.nn.Linear), attr
    recipe = qrecipe.Recipe.default()
    layer = qrecipe.nn.Linear(32, 16, name="blocks.0.fc1")
    roles = layer.roles(recipe)
    assert layer.roles(recipe, 64) is roles  # cached per recipe
    assert roles.weight.role == "linear:weight@blocks.0.fc1"
    assert layer.resolve_roles(recipe) == {"": roles}
    text = layer.explain(recipe)
    assert text.splitlines()[0] == "linear blocks.0.fc1 under recipe default:"
    assert [line.split()[0] for line in text.splitlines()[1:]] == [
        "input", "weight", "grad_output", "fprop", "dgrad", "wgrad"]
    layer.name = "blocks.1.fc1"  # a new name re-resolves
    assert layer.roles(recipe).weight.role == "linear:weight@blocks.1.fc1"
    assert "name='blocks.1.fc1'" in repr(layer)


def test_linear_checks_the_last_dimension_outside_autocast_too():
    layer = qrecipe.nn.Linear(16, 8, name="fc")
    with pytest.raises(ValueError, match="qrecipe.nn.Linear 'fc'.*does not end in "
                                         "in_features=16"):
        layer(torch.randn(4, 12))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        layer([1.0] * 16)
    x = torch.randn(4, 16, dtype=torch.float64)  # dtypes are torch's business outside autocast
    assert torch.equal(layer.double()(x), F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_gemm_bias_in_bf16_gives_the_numbers_of_its_fp32_copy(device):
    """A BF16 model's bias goes to the engine as it is (widened exactly there; on CUDA a native
    FP8 GEMM with a BF16 output adds it in cuBLASLt's epilogue): the same output as its FP32
    copy, bit for bit on the CPU, and on the GPU within the BF16 rounding of the output (the
    FP32-bias GEMM there writes an FP32 product first, possibly another cuBLASLt kernel)."""
    recipe = qrecipe.Recipe.default()
    x = torch.randn(64, 128, dtype=torch.bfloat16, device=device)
    w = torch.randn(96, 128, dtype=torch.bfloat16, device=device)
    bias = (torch.randn(96) * 4).to(torch.bfloat16).to(device)
    qx = recipe.quantizer("linear", "input", "fc").quantize(x, "rowwise")._cpp
    qw = recipe.quantizer("linear", "weight", "fc").quantize(w, "rowwise")._cpp
    outs = {}
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.empty(64, 96, dtype=torch.bfloat16, device=device)
        _C.gemm(qx, "rowwise", qw, "rowwise", out, kind="fprop", bias=bias.to(dtype))
        outs[dtype] = out
    if device == "cpu":
        assert torch.equal(outs[torch.bfloat16], outs[torch.float32])
    else:
        torch.testing.assert_close(outs[torch.bfloat16], outs[torch.float32], rtol=2 ** -7,
                                   atol=1e-3)
    with pytest.raises(qrecipe.QrecipeError, match="torch.float32 or torch.bfloat16"):
        _C.gemm(qx, "rowwise", qw, "rowwise", outs[torch.float32], bias=bias.half())


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("recipe_name", ["default", "mxfp8", "blockwise"])
def test_input_with_no_rows_trains(device, recipe_name):
    """An MoE expert that got no tokens: a [0, in] input gives a [0, out] output, an empty
    input gradient and a zero weight gradient (on CUDA the saved empty operands once failed
    to become tensors: from_blob rejects the pointer of an empty buffer)."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layer = qrecipe.nn.Linear(64, 32, name="fc", device=device, dtype=dtype)
    x = torch.zeros(0, 64, device=device, dtype=dtype, requires_grad=True)
    with qrecipe.autocast(qrecipe.Recipe.builtin(recipe_name)):
        y = layer(x)
    assert y.shape == (0, 32)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.count_nonzero(layer.weight.grad) == 0
