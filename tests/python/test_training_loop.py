"""Training-loop behaviour (docs/adapter.md, "Training loop"): the quantized weight kept across the
micro-batches of a step (``is_first_microbatch``) and FP32 ``main_grad`` accumulation."""
import contextlib

import pytest
import torch

import qrecipe
from qrecipe.nn import weight_cache  # weight_quantizations: conftest.py


def make_layer(fuse=False, dtype=torch.float32, seed=1):
    torch.manual_seed(seed)
    return qrecipe.nn.Linear(32, 16, bias=True, dtype=dtype, name="fc",
                             fuse_wgrad_accumulation=fuse)


def batches(n, dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(8, 32, generator=g).to(dtype), torch.randn(8, 16, generator=g).to(dtype))
            for _ in range(n)]


def run_microbatches(layer, data, recipe, flags, one_step=True):
    """Forward + backward of each micro-batch, all in one step (one outer autocast block) or
    each in its own; returns outputs and dx of each."""
    outs, dxs = [], []
    outer = qrecipe.autocast(recipe) if one_step else contextlib.nullcontext()
    with outer:
        for (x, dy), flag in zip(data, flags):
            x = x.clone().requires_grad_()
            with qrecipe.autocast(recipe):
                y = layer(x, is_first_microbatch=flag)
            y.backward(dy)
            outs.append(y.detach())
            dxs.append(x.grad)
    return outs, dxs


@pytest.mark.parametrize("recipe_name", ["default", "mxfp8", "float8_delayed"])
def test_cached_weight_gives_the_same_results_and_is_quantized_once(recipe_name,
                                                                    weight_quantizations):
    data = batches(3)
    ref = make_layer()
    out_ref, dx_ref = run_microbatches(ref, data, qrecipe.Recipe.builtin(recipe_name),
                                       [None, None, None])
    assert len(weight_quantizations) == 3  # no caching: every call quantizes the weight
    weight_quantizations.clear()

    cached = make_layer()
    out, dx = run_microbatches(cached, data, qrecipe.Recipe.builtin(recipe_name),
                               [True, False, False])
    assert len(weight_quantizations) == 1
    assert weight_quantizations[0] == 3  # both directions: fprop and dgrad of later batches
    assert weight_cache.stats == {"quantized": 1, "reused": 2, "stale": 0}
    for a, b in zip(out, out_ref):
        assert torch.equal(a, b)
    for a, b in zip(dx, dx_ref):
        assert torch.equal(a, b)
    assert torch.equal(cached.weight.grad, ref.weight.grad)
    assert torch.equal(cached.bias.grad, ref.bias.grad)


def test_a_delayed_scaling_update_makes_the_cache_stale(weight_quantizations):
    # Each micro-batch in its own outermost block: the delayed scales change between them, so
    # the kept weight (quantized with the old scale) must not be used.
    data = batches(3)
    out_ref, _ = run_microbatches(make_layer(), data, qrecipe.Recipe.builtin("float8_delayed"),
                                  [None] * 3, one_step=False)
    weight_quantizations.clear()
    out, _ = run_microbatches(make_layer(), data, qrecipe.Recipe.builtin("float8_delayed"),
                              [True, False, False], one_step=False)
    assert weight_cache.stats == {"quantized": 3, "reused": 0, "stale": 2}
    for a, b in zip(out, out_ref):
        assert torch.equal(a, b)


def test_cache_across_steps_with_delayed_scaling_matches_uncached(weight_quantizations):
    # Two steps of 2 micro-batches with an optimizer step between them: the cache must follow
    # the new weights and the new delayed scales of step 2.
    data = batches(4)

    def train(flags):
        layer = make_layer()
        recipe = qrecipe.Recipe.builtin("float8_delayed")
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        outs = []
        for step in range(2):
            opt.zero_grad()
            with qrecipe.autocast(recipe):
                for mb in range(2):
                    x, dy = data[2 * step + mb]
                    y = layer(x.clone().requires_grad_(), is_first_microbatch=flags[mb])
                    y.backward(dy)
                    outs.append(y.detach())
            opt.step()
        return outs, layer.weight.detach().clone()

    outs_ref, w_ref = train([None, None])
    assert len(weight_quantizations) == 4
    weight_quantizations.clear()
    outs, w = train([True, False])
    assert len(weight_quantizations) == 2  # once per step
    for a, b in zip(outs, outs_ref):
        assert torch.equal(a, b)
    assert torch.equal(w, w_ref)


def test_stale_cache_is_never_used(weight_quantizations):
    recipe = qrecipe.Recipe.default()
    layer = make_layer()
    x = torch.randn(8, 32)
    with torch.no_grad(), qrecipe.autocast(recipe):
        layer(x, is_first_microbatch=True)
        layer.weight.mul_(0.5)  # in place: bumps the version counter
        y_stale = layer(x, is_first_microbatch=False)
        y_fresh = layer(x)
        layer.weight.data = layer.weight.data * 2  # new storage, version counter unchanged
        y_stale2 = layer(x, is_first_microbatch=False)
        y_fresh2 = layer(x)
    assert torch.equal(y_stale, y_fresh)
    assert torch.equal(y_stale2, y_fresh2)
    assert weight_cache.stats["stale"] == 2
    assert not torch.equal(y_stale, y_stale2)


def test_false_without_a_cached_weight_is_an_error():
    weight_cache.clear()
    layer = make_layer()
    with qrecipe.autocast(qrecipe.Recipe.default()):
        with pytest.raises(RuntimeError, match="is_first_microbatch=True on the first"):
            layer(torch.randn(4, 32), is_first_microbatch=False)
        with pytest.raises(TypeError, match="True, False or None"):
            layer(torch.randn(4, 32), is_first_microbatch=1)


def test_cache_is_per_recipe(weight_quantizations):
    layer = make_layer()
    x = torch.randn(8, 32)
    a, b = qrecipe.Recipe.builtin("default"), qrecipe.Recipe.builtin("mxfp8")
    with torch.no_grad():
        with qrecipe.autocast(a):
            layer(x, is_first_microbatch=True)
        with qrecipe.autocast(b):
            with pytest.raises(RuntimeError, match="no quantized weight is cached"):
                layer(x, is_first_microbatch=False)
            y = layer(x, is_first_microbatch=True)
            assert torch.equal(layer(x, is_first_microbatch=False), y)


# ------------------------------------------------------------------ main_grad accumulation
@pytest.mark.parametrize("recipe_name", ["default", "none", "hybrid_seed"])
def test_main_grad_accumulates_the_sum_of_the_micro_batch_grads(recipe_name):
    data = batches(3)
    ref = make_layer()
    ours = make_layer(fuse=True)
    ours.weight.main_grad = torch.zeros(16, 32, dtype=torch.float32)
    for layer in (ref, ours):
        recipe = qrecipe.Recipe.builtin(recipe_name)
        for x, dy in data:
            with qrecipe.autocast(recipe):
                y = layer(x)
            y.backward(dy)
    if recipe_name == "none":
        # Everything high precision: the module calls F.linear and autograd owns the grads.
        assert torch.equal(ours.weight.grad, ref.weight.grad)
        return
    assert ours.weight.grad is None  # as TransformerEngine: the gradient is in main_grad
    # autograd sums g1 + g2 + g3 in FP32 in the same order the GEMM epilogue does
    assert torch.equal(ours.weight.main_grad, ref.weight.grad)
    assert torch.equal(ours.bias.grad, ref.bias.grad)


def test_main_grad_with_bf16_weights_accumulates_in_fp32():
    data = batches(4, torch.bfloat16)
    ours = make_layer(fuse=True, dtype=torch.bfloat16)
    ours.weight.main_grad = torch.zeros(16, 32, dtype=torch.float32)
    ref = make_layer(dtype=torch.bfloat16)
    recipe = qrecipe.Recipe.default()
    expected = torch.zeros(16, 32)
    for x, dy in data:
        with qrecipe.autocast(recipe):
            y = ours(x)
            y_ref = ref(x)
        y.backward(dy)
        ref.weight.grad = None
        y_ref.backward(dy)
        expected += ref.weight.grad.float()  # bf16 per batch: rounded, so only close
    assert ours.weight.grad is None
    assert ours.weight.main_grad.dtype == torch.float32
    error = (ours.weight.main_grad - expected).norm() / expected.norm()
    assert error < 1e-2
    assert not torch.equal(ours.weight.main_grad, expected)  # it did keep FP32 precision


def test_main_grad_errors_say_what_to_do():
    layer = make_layer(fuse=True)
    x = torch.randn(8, 32)
    with qrecipe.autocast(qrecipe.Recipe.default()):
        y = layer(x)
    with pytest.raises(RuntimeError, match="weight.main_grad = torch.zeros_like"):
        y.sum().backward()
    layer.weight.main_grad = torch.zeros(16, 32, dtype=torch.bfloat16)
    with qrecipe.autocast(qrecipe.Recipe.default()):
        y = layer(x)
    with pytest.raises(RuntimeError, match="contiguous torch.float32 tensor of shape"):
        y.sum().backward()
