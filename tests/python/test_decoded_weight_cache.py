"""Decoded copies of cached weights (weight_cache.py, "Decoded copies"; docs/gemm.md, "Decoded
operands kept across GEMMs"): with ``is_first_microbatch`` the kept weight operand also keeps
what its GEMMs decode it to. Results are bit-identical with and without the copies over
micro-batches and optimizer steps; the copies never outlive the bytes they were decoded from;
``set_keep_decoded(False)`` turns them off."""
import pytest
import torch

import qrecipe
from qrecipe.nn import weight_cache  # weight_quantizations: conftest.py

# mxfp8 and nvfp4 are the recipes whose GEMMs are emulated on Hopper; on the CPU every GEMM
# decodes (to FP32), so CI checks the mechanism there.
RECIPES = ["mxfp8", "nvfp4"]


@pytest.fixture
def keep_decoded_restored():
    before = weight_cache.keep_decoded()
    yield
    weight_cache.set_keep_decoded(before)


def make_layer(seed=3):
    torch.manual_seed(seed)
    # bf16 and multiples of 16: what nvfp4's Hadamard transform needs.
    return qrecipe.nn.Linear(64, 32, bias=True, dtype=torch.bfloat16, name="fc")


def data(steps, micro, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(16, 64, generator=g).to(torch.bfloat16),
              torch.randn(16, 32, generator=g).to(torch.bfloat16)) for _ in range(micro)]
            for _ in range(steps)]


def train(layer, recipe_name, batches, flags, keep):
    """Steps of micro-batches with an SGD step after each; returns every output, input
    gradient and weight after each step, and the decoded directions kept after each step.
    A fresh recipe per run: stochastic rounding's call counter starts at 0 in each."""
    recipe = qrecipe.Recipe.builtin(recipe_name)
    weight_cache.set_keep_decoded(keep)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    seen, kept = [], []
    with qrecipe.autocast(recipe):
        for step in batches:
            for (x, dy), flag in zip(step, flags):
                x = x.clone().requires_grad_()
                y = layer(x, is_first_microbatch=flag)
                y.backward(dy)
                seen += [y.detach(), x.grad]
            kept.append(sorted(d for op in weight_cache.kept_operands(layer.weight)
                               for d in op.decoded_directions()))
            opt.step()
            opt.zero_grad()
            seen.append(layer.weight.detach().clone())
    return seen, kept


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_results_are_bit_identical_with_and_without_decoded_copies(
        recipe_name, weight_quantizations, keep_decoded_restored):
    batches = data(steps=3, micro=3)
    uncached, _ = train(make_layer(), recipe_name, batches, [None] * 3, keep=True)
    weight_cache.clear()
    without, kept_without = train(make_layer(), recipe_name, batches, [True, False, False],
                                  keep=False)
    weight_cache.clear()
    with_copies, kept_with = train(make_layer(), recipe_name, batches, [True, False, False],
                                   keep=True)
    assert kept_without == [[]] * 3
    # fprop decoded the rowwise bytes, dgrad the columnwise ones: both kept through the step.
    assert kept_with == [["columnwise", "rowwise"]] * 3
    for a, b, c in zip(uncached, without, with_copies):
        assert torch.equal(a, b) and torch.equal(b, c)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_an_in_place_weight_change_never_reuses_a_decoded_copy(recipe_name, weight_quantizations,
                                                               keep_decoded_restored):
    weight_cache.set_keep_decoded(True)
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer = make_layer()
    x = torch.randn(16, 64).to(torch.bfloat16)
    with qrecipe.autocast(recipe):
        layer(x, is_first_microbatch=True)
        (first,) = weight_cache.kept_operands(layer.weight)
        assert first.decoded_directions() == ["rowwise"]
        assert first.decoded_bytes() > 0
        with torch.no_grad():
            layer.weight.mul_(-2.0)  # the version bump of an optimizer step
        y_stale_flag = layer(x, is_first_microbatch=False)
        (second,) = weight_cache.kept_operands(layer.weight)
        assert second is not first and weight_cache.stats["stale"] == 1
        with torch.no_grad():
            layer.weight.copy_(layer.weight.detach() * 0.5)  # copy_ under no_grad
        y_copy = layer(x, is_first_microbatch=False)
        assert weight_cache.stats["stale"] == 2
        weight_cache.clear()
        y_fresh = layer(x)  # no cache at all
    assert not torch.equal(y_stale_flag, y_copy)
    assert torch.equal(y_copy, y_fresh)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_requantize_drops_the_decoded_copies(recipe_name, keep_decoded_restored):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer = make_layer()
    x = torch.randn(16, 64).to(torch.bfloat16)
    weight_cache.set_keep_decoded(True)
    with qrecipe.autocast(recipe):
        layer(x, is_first_microbatch=True)
        (op,) = weight_cache.kept_operands(layer.weight)
        assert op.decoded_directions() == ["rowwise"]
        before = layer(x, is_first_microbatch=False)
        op.requantize(layer.weight.detach() * -1.0)
        assert op.decoded_directions() == []
        after = layer(x, is_first_microbatch=False)  # the requantized bytes, decoded again
        assert op.decoded_directions() == ["rowwise"]
        op.requantize(layer.weight.detach())
        assert torch.equal(layer(x, is_first_microbatch=False), before)
    assert not torch.equal(before, after)


def test_the_off_switch_drops_what_is_kept_and_keeps_nothing(keep_decoded_restored):
    recipe = qrecipe.Recipe.builtin("mxfp8")
    layer = make_layer()
    x = torch.randn(16, 64).to(torch.bfloat16)
    weight_cache.set_keep_decoded(True)
    with qrecipe.autocast(recipe):
        y = layer(x, is_first_microbatch=True)
        (op,) = weight_cache.kept_operands(layer.weight)
        assert op.keep_decoded and op.decoded_directions() == ["rowwise"]
        weight_cache.set_keep_decoded(False)
        assert not op.keep_decoded and op.decoded_directions() == []
        assert torch.equal(layer(x, is_first_microbatch=False), y)
        assert op.decoded_directions() == []
    with pytest.raises(TypeError, match="True or False"):
        weight_cache.set_keep_decoded(1)


def test_invalidate_decoded_after_writing_through_an_alias(keep_decoded_restored):
    recipe = qrecipe.Recipe.builtin("mxfp8")
    layer = make_layer()
    x = torch.randn(16, 64).to(torch.bfloat16)
    weight_cache.set_keep_decoded(True)
    with qrecipe.autocast(recipe):
        y = layer(x, is_first_microbatch=True)
        (op,) = weight_cache.kept_operands(layer.weight)
        data = op.data("rowwise")
        saved = data.clone()
        data.zero_()  # behind the engine's back: the kept copy is now stale ...
        op.invalidate_decoded()  # ... until invalidated, as the docs require
        assert op.decoded_directions() == []
        # All-zero codes: the product is 0, the output the bias alone.
        y_zero = layer(x, is_first_microbatch=False)
        assert torch.equal(y_zero, layer.bias.detach().expand_as(y_zero))
        data.copy_(saved)
        op.invalidate_decoded()
        assert torch.equal(layer(x, is_first_microbatch=False), y)


def test_the_environment_switch_is_checked(monkeypatch):
    monkeypatch.setenv("QRECIPE_KEEP_DECODED_WEIGHTS", "0")
    assert weight_cache._env_keep_decoded() is False
    monkeypatch.setenv("QRECIPE_KEEP_DECODED_WEIGHTS", "maybe")
    with pytest.raises(ValueError, match="expected 1 or 0"):
        weight_cache._env_keep_decoded()
