"""Linears reading the same input under the same stateless quantizer spec (q/k/v, gate/up)
quantize it once (nn/input_sharing.py), with results bit-identical to quantizing it for each;
delayed scaling, stochastic rounding, another spec, a changed or another input quantize anew."""
import pytest
import torch
import torch.nn.functional as F

import qrecipe
from qrecipe.nn import input_sharing, linear_gemms

RECIPES = qrecipe.Recipe.builtin_names()
TOKENS, WIDTH = 16, 64


class Attention(torch.nn.Module):
    """q / k / v of one normalized input, then o; gate / up of another, then down."""

    def __init__(self):
        super().__init__()
        dt = torch.bfloat16
        for n in ("q", "k", "v", "o", "gate", "up"):
            setattr(self, n, torch.nn.Linear(WIDTH, WIDTH, dtype=dt))
        self.down = torch.nn.Linear(WIDTH, WIDTH, dtype=dt)

    def forward(self, x):
        h = F.rms_norm(x, (WIDTH,))
        a = self.o(self.q(h) * torch.sigmoid(self.k(h)) + self.v(h))
        h = F.rms_norm(x + a, (WIDTH,))
        return self.down(F.silu(self.gate(h)) * self.up(h))


def run(recipe_name, share, monkeypatch):
    torch.manual_seed(0)
    model = qrecipe.convert(Attention())
    recipe = qrecipe.Recipe.builtin(recipe_name)
    if not share:
        monkeypatch.setattr(input_sharing, "share_key", lambda q: None)
        import qrecipe.nn.base as base
        monkeypatch.setattr(base, "share_key", lambda q: None)
    calls = []
    original = linear_gemms._quantize

    def counting(q, t, u, *amax, **kw):
        if ":input@" in q.role:
            calls.append(q.role)
        return original(q, t, u, *amax, **kw)

    monkeypatch.setattr(linear_gemms, "_quantize", counting)
    out = []
    for step in range(2):
        x = torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(step)).to(
            torch.bfloat16).requires_grad_()
        model.zero_grad()
        with qrecipe.autocast(recipe):
            y = model(x)
        y.float().square().sum().backward()
        out.append([y.detach(), x.grad] + [p.grad for p in model.parameters()])
    monkeypatch.undo()
    input_sharing.clear()
    return out, calls


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_sharing_is_bit_identical(recipe_name, monkeypatch):
    shared, shared_calls = run(recipe_name, True, monkeypatch)
    alone, alone_calls = run(recipe_name, False, monkeypatch)
    for a, b in zip(shared, alone):
        for u, v in zip(a, b):
            assert torch.equal(u, v)
    if recipe_name == "none":
        assert shared_calls == alone_calls == []
        return
    assert len(alone_calls) == 2 * 7  # every Linear, both steps
    recipe = qrecipe.Recipe.builtin(recipe_name)
    stateless = qrecipe.quantization.is_stateless(recipe.quantizer("linear", "input", "q")._cpp)
    # q/k/v share one quantization, gate/up one: 7 -> 4 per step.
    assert len(shared_calls) == (2 * 4 if stateless else 2 * 7), shared_calls


def test_changed_input_is_quantized_again():
    torch.manual_seed(0)
    a = qrecipe.nn.Linear(WIDTH, WIDTH, name="a")
    b = qrecipe.nn.Linear(WIDTH, WIDTH, name="b")
    x = torch.randn(TOKENS, WIDTH)
    input_sharing.reset_stats()
    with qrecipe.autocast():
        ya = a(x)
        x.mul_(2)  # in place: another _version
        yb = b(x)
    assert input_sharing.stats == {"quantized": 2, "shared": 0}
    with qrecipe.autocast(enabled=False):
        ref = F.linear(x, b.weight, b.bias)
    assert not torch.equal(yb, ref)  # quantized, from the changed values:
    with qrecipe.autocast():
        assert torch.equal(b(x.clone()), yb)
    assert ya.shape == yb.shape
    input_sharing.clear()


def test_views_of_one_base_share_and_other_views_do_not():
    # A tensor-parallel ColwiseParallel layer reads DTensor.to_local(): a fresh view of the
    # same local tensor per Linear. Views at the same offset, shape and strides hold the same
    # bytes and share; another offset, or the base changed in place, quantize anew.
    torch.manual_seed(0)
    a = qrecipe.nn.Linear(WIDTH, WIDTH, name="a")
    b = qrecipe.nn.Linear(WIDTH, WIDTH, name="b")
    base = torch.randn(2 * TOKENS, WIDTH)
    input_sharing.reset_stats()
    with qrecipe.autocast():
        ya = a(base[:TOKENS].view_as(base[:TOKENS]))
        yb = b(base[:TOKENS].view_as(base[:TOKENS]))  # another view object, same bytes
    assert input_sharing.stats == {"quantized": 1, "shared": 1}
    with qrecipe.autocast():
        assert torch.equal(b(base[:TOKENS].clone()), yb)  # bit-identical to its own quantization
    input_sharing.reset_stats()
    with qrecipe.autocast():
        a(base[:TOKENS])
        b(base[TOKENS:])  # same base, other rows
    assert input_sharing.stats == {"quantized": 2, "shared": 0}
    input_sharing.reset_stats()
    with qrecipe.autocast():
        a(base[:TOKENS])
        base.mul_(2)  # the base changed: its views' version moved too
        b(base[:TOKENS])
    assert input_sharing.stats == {"quantized": 2, "shared": 0}
    assert ya.shape == yb.shape
    input_sharing.clear()


def test_saved_operand_survives_the_next_input():
    # The shared operand's rowwise copy is dropped when another input comes; backward reads
    # the columnwise views each Linear saved.
    torch.manual_seed(0)
    q, k, o = (qrecipe.nn.Linear(WIDTH, WIDTH, name=n) for n in "qko")
    x = torch.randn(TOKENS, WIDTH, requires_grad=True)
    with qrecipe.autocast():
        y = o(q(x) + k(x))
    y.sum().backward()
    grads = [x.grad.clone(), q.weight.grad.clone(), k.weight.grad.clone()]
    input_sharing.clear()
    x.grad = None
    for m in (q, k, o):
        m.zero_grad()
    with qrecipe.autocast():
        y2 = o(q(x.clone()) + k(x.clone().add_(0)))  # two objects: no sharing
    y2.sum().backward()
    assert torch.equal(grads[0], x.grad)
    assert torch.equal(grads[1], q.weight.grad) and torch.equal(grads[2], k.weight.grad)
    input_sharing.clear()
