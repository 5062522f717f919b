"""dgrad beside wgrad on two CUDA streams (qrecipe.nn.linear_gemms, CUDA only).

Large native dgrad and wgrad GEMMs run on two streams of the device; the results must be the
bytes of the in-order backward, for every kind of native GEMM the shipped recipes use, with
main_grad accumulation, under a caller's side stream, and across steps of delayed scaling.
The size threshold is lowered here so that small layers take the two-stream path."""
import pytest
import torch

import qrecipe
from qrecipe.nn import linear_gemms

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TOKENS, IN, OUT = 256, 512, 384


@pytest.fixture
def two_stream_calls(monkeypatch):
    """Counts the backward passes that took the two-stream path."""
    calls = []
    original = linear_gemms._wgrad_stream

    def counting(device):
        calls.append(device)
        return original(device)
    monkeypatch.setattr(linear_gemms, "_wgrad_stream", counting)
    return calls


def run_steps(overlap: bool, recipe_name: str, main_grad: bool, monkeypatch, steps=2):
    """y, dx and dW (or main_grad) of `steps` steps of a fresh layer under a fresh recipe."""
    monkeypatch.setattr(linear_gemms, "_OVERLAP_MIN_MACS", 0 if overlap else 1 << 62)
    torch.manual_seed(0)
    layer = qrecipe.nn.Linear(IN, OUT, bias=False, device="cuda", dtype=torch.bfloat16,
                              name="fc", fuse_wgrad_accumulation=main_grad)
    if main_grad:
        layer.weight.main_grad = torch.zeros(OUT, IN, device="cuda", dtype=torch.float32)
    recipe = qrecipe.Recipe.builtin(recipe_name)
    results = []
    for i in range(steps):
        x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(TOKENS, OUT, device="cuda", dtype=torch.bfloat16)
        with qrecipe.autocast(recipe):
            y = layer(x)
        y.backward(dy)
        wgrad = layer.weight.main_grad if main_grad else layer.weight.grad
        results.append((y.detach().clone(), x.grad.clone(), wgrad.clone()))
        layer.weight.grad = None
    torch.cuda.synchronize()
    return results


@pytest.mark.parametrize("recipe_name", ["default", "float8_e4m3", "float8_delayed", "blockwise"])
@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_two_streams_give_the_in_order_bytes(recipe_name, main_grad, monkeypatch,
                                             two_stream_calls):
    in_order = run_steps(False, recipe_name, main_grad, monkeypatch)
    assert two_stream_calls == []
    overlapped = run_steps(True, recipe_name, main_grad, monkeypatch)
    assert len(two_stream_calls) == 2  # one backward per step took the two-stream path
    for step, (a, b) in enumerate(zip(in_order, overlapped)):
        for what, u, v in zip(("y", "dx", "dW"), a, b):
            assert torch.equal(u, v), f"{recipe_name} step {step}: {what} differs"


def test_two_streams_under_a_callers_side_stream(monkeypatch, two_stream_calls):
    expected = run_steps(True, "blockwise", False, monkeypatch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run_steps(True, "blockwise", False, monkeypatch)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert len(two_stream_calls) == 4
    for a, b in zip(expected, got):
        for u, v in zip(a, b):
            assert torch.equal(u, v)


def test_emulated_gemms_stay_on_one_stream(monkeypatch, two_stream_calls):
    # MXFP8 runs emulated on Hopper (and is not native anywhere this adapter plans for):
    # its backward never takes the two-stream path.
    run_steps(True, "mxfp8", False, monkeypatch, steps=1)
    assert two_stream_calls == []


@pytest.mark.parametrize("recipe_name", ["float8_e4m3", "blockwise"])
def test_compiled_backward_runs_the_shared_backward(recipe_name, monkeypatch, two_stream_calls):
    # Under torch.compile the backward operator (compile_ops.linear_backward_op) re-quantizes
    # x and W and calls linear_gemms.linear_backward: it takes the two-stream path too and
    # gives the bytes of the eager in-order backward.
    expected = run_steps(False, recipe_name, False, monkeypatch)
    monkeypatch.setattr(linear_gemms, "_OVERLAP_MIN_MACS", 0)
    torch.manual_seed(0)  # the layer and the data of run_steps
    layer = qrecipe.nn.Linear(IN, OUT, bias=False, device="cuda", dtype=torch.bfloat16,
                              name="fc")
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer.resolve_roles(recipe)  # engine objects are not traceable: resolve before compiling
    compiled = torch.compile(layer, backend="aot_eager")
    for step, want in enumerate(expected):
        x = torch.randn(TOKENS, IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(TOKENS, OUT, device="cuda", dtype=torch.bfloat16)
        with qrecipe.autocast(recipe):
            y = compiled(x)
        y.backward(dy)
        got = (y.detach(), x.grad, layer.weight.grad)
        for what, u, v in zip(("y", "dx", "dW"), want, got):
            assert torch.equal(u, v), f"{recipe_name} step {step}: {what} differs"
        layer.weight.grad = None
    assert len(two_stream_calls) == 2  # one per step's backward
