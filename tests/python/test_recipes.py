"""Every shipped recipe on a small MLP: forward and gradients within a per-format tolerance of
the high-precision reference, and 50 steps of SGD reduce the loss.

Tolerances (relative error norm ||q - ref|| / ||ref||, checked on the output and on every
gradient; the reference is the same model in FP32) are documented in docs/adapter.md. Each is
about 1.6-2x the worst error the recipe gives here (in brackets), so a format that decodes
wrongly (a factor of 2, a transposed scale) fails by far:
  none                                             0     bit-identical (torch's F.linear)
  E4M3 everywhere: mxfp8, blockwise, float8_e4m3   0.10  [0.058]
  E5M2 gradients: default, float8_delayed,
                  hybrid_fp8_mx, float8_bf16_ends  0.15  [0.093]
(float8_bf16_ends keeps `layers.0.*` and `lm_head` in high precision; this MLP's layers
fc1 / fc2 are neither, so it quantizes them as default does.)
  NVFP4 wgrad operands: hybrid_seed                0.30  [0.149]
  NVFP4 everywhere: nvfp4 (bf16 model)             0.45  [0.257]
"""
import pytest
import torch
import torch.nn.functional as F

import qrecipe

TOLERANCE = {
    "none": 0.0,
    "default": 0.15,
    "float8_delayed": 0.15,
    "float8_bf16_ends": 0.15,
    "float8_e4m3": 0.10,
    "mxfp8": 0.10,
    "blockwise": 0.10,
    "hybrid_fp8_mx": 0.15,
    "hybrid_seed": 0.30,
    "nvfp4": 0.45,
}
# NVFP4's Hadamard transform (wgrad operands) needs bf16 activations and tokens % 16 == 0.
DTYPE = {"nvfp4": torch.bfloat16}
TOKENS = 32


def test_every_shipped_recipe_has_a_tolerance():
    assert sorted(TOLERANCE) == qrecipe.Recipe.builtin_names()


class MLP(torch.nn.Module):
    def __init__(self, d_in=64, d_hidden=128, d_out=32, dtype=torch.float32):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden, dtype=dtype)
        self.fc2 = torch.nn.Linear(d_hidden, d_out, dtype=dtype)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def forward_backward(model, x, dy, recipe=None):
    model.zero_grad()
    x = x.detach().clone().requires_grad_()
    if recipe is None:
        y = model(x)
    else:
        with qrecipe.autocast(recipe):
            y = model(x)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_mlp_forward_and_gradients_close_to_reference(name):
    recipe = qrecipe.Recipe.builtin(name)
    dtype = DTYPE.get(name, torch.float32)
    model = MLP(dtype=dtype)
    reference = MLP(dtype=torch.float32)  # FP32 copy of the same (possibly bf16) weights
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    qrecipe.convert(model)
    x = torch.randn(TOKENS, 64, dtype=dtype)
    dy = torch.randn(TOKENS, 32, dtype=dtype)
    if name == "float8_delayed":
        # Delayed scaling starts at scale 1 with an empty history: one step records the
        # amaxes, the next autocast entry turns them into scales (docs/adapter.md).
        forward_backward(model, x, dy, recipe)
    got = forward_backward(model, x, dy, recipe)
    want = forward_backward(reference, x.float(), dy.float())
    labels = ["output", "grad input", "grad fc1.weight", "grad fc1.bias", "grad fc2.weight",
              "grad fc2.bias"]
    errors = {label: rel(g, w) for label, g, w in zip(labels, got, want)}
    if name == "none":
        assert all(e == 0.0 for e in errors.values()), errors
    else:
        worst = max(errors.values())
        assert worst <= TOLERANCE[name], f"{name}: {errors}"
        assert errors["output"] > 0.0  # quantization happened


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_sgd_on_tiny_regression_reduces_loss(name):
    recipe = qrecipe.Recipe.builtin(name)
    dtype = DTYPE.get(name, torch.float32)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 16, generator=g) / 32 ** 0.5
    x = torch.randn(64, 32, generator=g)
    target = torch.tanh(x @ teacher) * 2.0
    model = MLP(32, 64, 16, dtype=dtype)
    qrecipe.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(50):
        opt.zero_grad()
        with qrecipe.autocast(recipe):
            out = model(x.to(dtype))
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], f"{name}: {losses[0]:.4f} -> {losses[-1]:.4f}"
