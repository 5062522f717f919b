"""Saved quantized operands pass through torch's saved-tensor hooks (nn/saved_operands.py):
the hooks see the bytes and scales themselves (not a dequantized copy), CPU offload with
torch.autograd.graph.save_on_cpu gives bit-identical results under every shipped recipe, and
on CUDA the device memory held after the forward drops by the quantized bytes."""
import pytest
import torch

import qrecipe

RECIPES = qrecipe.Recipe.builtin_names()
TOKENS, WIDTH = 32, 64


def make_model(dtype=torch.bfloat16, device="cpu", seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleDict({
        "ln": qrecipe.nn.LayerNormLinear(WIDTH, WIDTH, dtype=dtype, device=device, name="ln"),
        "mlp": qrecipe.nn.LayerNormMLP(WIDTH, 2 * WIDTH, activation="swiglu", dtype=dtype,
                                       device=device, name="mlp"),
        "fc": qrecipe.nn.Linear(WIDTH, WIDTH, dtype=dtype, device=device, name="fc"),
        "experts": qrecipe.nn.GroupedLinear(2, WIDTH, WIDTH, dtype=dtype, device=device,
                                            name="experts"),
    })


def run(model, x):
    h = model["ln"](x)
    h = h + model["mlp"](h)
    h = model["fc"](h)
    return model["experts"](h, [TOKENS // 2, TOKENS - TOKENS // 2])


def step(recipe_name, context, device="cpu"):
    recipe = qrecipe.Recipe.builtin(recipe_name)  # fresh delayed-scaling state per run
    model = make_model(device=device)
    x = torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(1)).to(
        device, torch.bfloat16).requires_grad_()
    with qrecipe.autocast(recipe), context():
        y = run(model, x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


class Recording(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that keep every packed tensor (a copy, as offload would)."""

    def __init__(self):
        self.packed = []

        def pack(t):
            self.packed.append((t.dtype, tuple(t.shape)))
            return t.clone()

        super().__init__(pack, lambda t: t)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_offload_is_bit_identical(recipe_name):
    expected = step(recipe_name, lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t,
                                                                             lambda t: t))
    got = step(recipe_name, lambda: torch.autograd.graph.save_on_cpu(pin_memory=False))
    copied = step(recipe_name, Recording)
    for a, b, c in zip(expected, got, copied):
        assert torch.equal(a, b) and torch.equal(a, c)


def _quantized_bytes_saved(recipe_name):
    """The uint8 parts the hooks saw for one Linear step, and what the layer saves."""
    recipe = qrecipe.Recipe.builtin(recipe_name)
    torch.manual_seed(0)
    layer = qrecipe.nn.Linear(WIDTH, 2 * WIDTH, dtype=torch.bfloat16, name="fc")
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    hooks = Recording()
    with qrecipe.autocast(recipe), hooks:
        layer(x)
    x_q = recipe.quantizer("linear", "input", "fc").quantize(x, "columnwise")
    w_q = recipe.quantizer("linear", "weight", "fc").quantize(layer.weight, "columnwise")
    return hooks.packed, x_q, w_q


@pytest.mark.parametrize("recipe_name", ["default", "mxfp8", "nvfp4", "hybrid_fp8_mx"])
def test_hooks_see_the_quantized_bytes_and_scales(recipe_name):
    packed, x_q, w_q = _quantized_bytes_saved(recipe_name)
    expected = []
    for q in (x_q, w_q):  # columnwise copies only: what backward reads
        assert q.usage == ("columnwise",)
        for t in (q.columnwise_data, q.columnwise_scale_inv, q.columnwise_amax):
            if t is not None:
                expected.append((t.dtype, tuple(t.shape)))
    assert packed == expected
    assert not any(dtype == torch.bfloat16 for dtype, _ in packed)  # no dequantized copy


def test_high_precision_roles_are_saved_as_tensors():
    recipe = qrecipe.Recipe.from_dict({"version": 1, "name": "w-only", "defaults": {
        "format": "none"}, "rules": [{"match": {"tensor_type": "weight"},
                                      "quantizer": {"format": "float8"}}]})
    torch.manual_seed(0)
    layer = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16, name="fc")
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    hooks = Recording()
    with qrecipe.autocast(recipe), hooks:
        layer(x)
    assert hooks.packed[0] == (torch.bfloat16, (TOKENS, WIDTH))  # x, dense
    assert [d for d, _ in hooks.packed[1:]] == [torch.uint8, torch.float32, torch.float32]


def test_cached_weights_stay_with_the_weight():
    # A weight kept across micro-batches belongs to the weight, not to the step: only the
    # activation goes through the hooks.
    recipe = qrecipe.Recipe.default()
    torch.manual_seed(0)
    layer = qrecipe.nn.Linear(WIDTH, WIDTH, name="fc")
    x = torch.randn(TOKENS, WIDTH, requires_grad=True)
    hooks = Recording()
    with qrecipe.autocast(recipe), hooks:
        layer(x, is_first_microbatch=True)
    assert [d for d, _ in hooks.packed] == [torch.uint8, torch.float32, torch.float32]


def test_unpack_rejects_wrong_buffers():
    q = qrecipe.Recipe.default().quantizer("linear", "input", "fc")._cpp
    x = torch.randn(8, 32)
    op = q.quantize(x, qrecipe.quantization.COLUMNWISE)
    good = {"columnwise": {"data": op.data("columnwise"), "scale_inv": op.scale_inv(
        "columnwise"), "amax": op.amax("columnwise")}}
    rebuilt = q.from_tensors(8, 32, qrecipe.quantization.COLUMNWISE, good, x.device)
    assert torch.equal(rebuilt.data("columnwise"), op.data("columnwise"))
    bad = {"columnwise": dict(good["columnwise"], data=op.data("columnwise")[:4])}
    with pytest.raises(qrecipe.QrecipeError, match="columnwise data must be"):
        q.from_tensors(8, 32, qrecipe.quantization.COLUMNWISE, bad, x.device)
    with pytest.raises(qrecipe.QrecipeError, match="no 'rowwise' buffers"):
        q.from_tensors(8, 32, qrecipe.quantization.ROWWISE, good, x.device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe_name", ["default", "blockwise", "mxfp8"])
def test_cuda_offload_frees_the_quantized_bytes(recipe_name):
    # Memory held after the forward, without and with save_on_cpu: the difference is what
    # the forward saved on the device; with offload it is only the layers' outputs.
    recipe = qrecipe.Recipe.builtin(recipe_name)
    tokens, width = 4096, 1024
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[qrecipe.nn.Linear(width, width, dtype=torch.bfloat16,
                                                     device="cuda", name=f"l{i}")
                                   for i in range(4)])
    x = torch.randn(tokens, width, dtype=torch.bfloat16, device="cuda", requires_grad=True)

    def held_after_forward(context):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with qrecipe.autocast(recipe), context:
            y = layers(x)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        y.float().sum().backward()
        grads = [x.grad.clone()] + [p.grad.clone() for p in layers.parameters()]
        x.grad = None
        layers.zero_grad(set_to_none=True)
        return held, grads

    plain, g_plain = held_after_forward(torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t))
    offloaded, g_off = held_after_forward(torch.autograd.graph.save_on_cpu(pin_memory=True))
    assert all(torch.equal(a, b) for a, b in zip(g_plain, g_off))
    saved = 0
    for i, layer in enumerate(layers):
        h = x if i == 0 else None
        xq = recipe.quantizer("linear", "input", f"l{i}").quantize(
            torch.empty(tokens, width, dtype=torch.bfloat16, device="cuda"), "columnwise")
        wq = recipe.quantizer("linear", "weight", f"l{i}").quantize(layer.weight, "columnwise")
        for q in (xq, wq):
            for t in (q.columnwise_data, q.columnwise_scale_inv, q.columnwise_amax):
                if t is not None:
                    saved += t.numel() * t.element_size()
    assert plain - offloaded >= 0.95 * saved, (plain, offloaded, saved)
