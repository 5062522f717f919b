"""pytest configuration for the adapter suites (tests/python).

qrecipe is imported from wherever Python finds it: an installed package (pip install
--no-build-isolation .) or a build tree on PYTHONPATH (tools/test.sh uses <build>/python).
When neither is there, the default build tree <repo>/build/python is tried before giving up.
"""
import importlib.util
import pathlib
import sys

import pytest
import torch

if importlib.util.find_spec("qrecipe") is None:
    candidate = pathlib.Path(__file__).resolve().parents[2] / "build" / "python"
    if (candidate / "qrecipe").is_dir():
        sys.path.insert(0, str(candidate))

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def weight_quantizations(monkeypatch):
    """The usage bits of every quantization of a weight role made by
    qrecipe.nn.linear_gemms, in order, and of every group of GroupedLinear's grouped weight
    quantization (one entry per expert); the weight cache is emptied and its counters reset
    first (shared by the weight-cache and quantized-parameter tests)."""
    from qrecipe.nn import grouped_linear, linear_gemms, weight_cache
    calls = []
    original = linear_gemms._quantize
    original_grouped = grouped_linear._quantize_grouped

    def counting(quantizer, tensor, usage, *amax, **kw):
        if ":weight@" in quantizer.role:
            calls.append(usage)
        return original(quantizer, tensor, usage, *amax, **kw)

    def counting_grouped(quantizer, weight, group_rows, usage):
        calls.extend([usage] * len(group_rows))
        return original_grouped(quantizer, weight, group_rows, usage)

    monkeypatch.setattr(linear_gemms, "_quantize", counting)
    monkeypatch.setattr(grouped_linear, "_quantize_grouped", counting_grouped)
    weight_cache.clear()
    weight_cache.reset_stats()
    return calls


def forward_backward(module, x, dy, recipe=None, enabled=True, *args):
    """[output, input gradient, every parameter's gradient in registration order] of one step
    of `module` (extra forward arguments in `args`), under `recipe` unless recipe is None and
    not enabled (then outside any autocast block)."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad()
    if recipe is None and not enabled:
        y = module(x, *args)
    else:
        import qrecipe
        with qrecipe.autocast(recipe, enabled=enabled):
            y = module(x, *args)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in module.parameters()]

