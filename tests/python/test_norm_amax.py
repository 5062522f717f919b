"""A fused norm's output amax handed to the Linears that quantize that output
(nn/norm_amax.py), on the CPU with the amax offered by hand (the CUDA norm offers it itself:
tests/python/test_rms_norm_cuda.py): the Linears use it (a wrong amax changes their outputs,
which proves it is read), a right one gives bit-identical outputs and gradients, and an
in-place change of the tensor, another tensor, a recipe without per-tensor current scaling
or the end of the autocast block drops it."""
import pytest
import torch

import qrecipe
from qrecipe.nn import norm_amax

WIDTH, TOKENS = 64, 32


class QKV(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16)
        self.k = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16)
        self.v = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16)

    def forward(self, h):
        return self.q(h), self.k(h), self.v(h)


def amax_of(y, scale=1.0):
    """max |y| as the handoff carries it, times `scale`: a wrong amax (the tests use 3; a power
    of two would only shift every exponent of the scaled values, exactly)."""
    return torch.full((2,), float(y.detach().float().abs().max()) * scale, dtype=torch.float32)


def hidden(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(TOKENS, WIDTH, generator=g) * 3).to(torch.bfloat16)


def run(recipe_name, y, offer=None, before=None):
    """Outputs and gradients of q/k/v of y; `offer` is offered for y first, `before(y)` runs
    after the offer."""
    model = qrecipe.convert(QKV())
    recipe = qrecipe.Recipe.builtin(recipe_name)
    y = y.clone().requires_grad_()
    norm_amax.reset_stats()
    with qrecipe.autocast(recipe):
        h = y * 1  # a fresh tensor, as a norm's output is
        if offer is not None:
            norm_amax.offer(h, offer(h))
        if before is not None:
            before(h)
        outs = model(h)
    sum(o.float().square().sum() for o in outs).backward()
    return [o.detach() for o in outs] + [y.grad] + [p.grad for p in model.parameters()]


def same(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))


def test_right_amax_is_used_and_bit_identical():
    y = hidden()
    ref = run("default", y)
    assert norm_amax.stats["used"] == 0
    got = run("default", y, offer=amax_of)
    assert norm_amax.stats["used"] == 1  # q, k, v share one quantization of y
    assert same(ref, got)


def test_a_wrong_amax_shows_it_is_read():
    y = hidden()
    ref = run("default", y)
    got = run("default", y, offer=lambda h: amax_of(h, 3.0))
    assert norm_amax.stats["used"] == 1
    assert not same(ref[:3], got[:3])


def test_in_place_change_drops_the_handoff():
    y = hidden()
    ref = run("default", y)
    got = run("default", y, offer=lambda h: amax_of(h, 3.0), before=lambda h: h.mul_(1))
    assert norm_amax.stats["used"] == 0
    assert same(ref, got)


def test_another_tensor_does_not_take_it():
    y = hidden()
    ref = run("default", y)
    model = qrecipe.convert(QKV())
    norm_amax.reset_stats()
    with qrecipe.autocast(qrecipe.Recipe.builtin("default")):
        other = y * 1
        norm_amax.offer(other + 0, amax_of(other, 3.0))
        outs = model(other)
    assert norm_amax.stats["used"] == 0
    assert same(ref[:3], outs)


@pytest.mark.parametrize("recipe_name", ["float8_delayed", "mxfp8", "nvfp4", "hybrid_fp8_mx"])
def test_other_scalings_ignore_it(recipe_name):
    y = hidden()
    ref = run(recipe_name, y)
    got = run(recipe_name, y, offer=lambda h: amax_of(h, 3.0))
    assert norm_amax.stats["used"] == 0
    assert same(ref, got)


def test_the_offer_ends_with_the_outermost_autocast():
    y = hidden()
    recipe = qrecipe.Recipe.builtin("default")
    quantizer = recipe.engine.plan_linear("linear", "q", TOKENS, WIDTH, WIDTH)["input"]
    with qrecipe.autocast(recipe):
        with qrecipe.autocast(recipe):
            norm_amax.offer(y, amax_of(y))
        assert norm_amax.take(y, quantizer) is not None  # an inner block's exit keeps it
    assert norm_amax.take(y, quantizer) is None


def test_switched_off_ignores_offers(monkeypatch):
    monkeypatch.setattr(norm_amax, "enabled", False)
    y = hidden()
    ref = run("default", y)
    got = run("default", y, offer=lambda h: amax_of(h, 3.0))
    assert norm_amax.stats["used"] == 0
    assert same(ref, got)
