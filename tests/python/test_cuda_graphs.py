"""CUDA graphs: capturing a qrecipe module's forward or backward is refused with an error
that says what to do (docs/adapter.md, CUDA graphs), never a CUDA error from inside the
engine, and the module runs eagerly as before afterwards. The wiring is checked on the CPU
(the capture test replaced); the captures themselves need a GPU (tools/gpu_check.sh)."""
import pytest
import torch

import qrecipe
from qrecipe.nn import linear_gemms

FLOAT8 = {"version": 1, "name": "f8", "defaults": {"format": "float8"}}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def step(module, recipe, x):
    with qrecipe.autocast(recipe):
        y = module(x)
    y.sum().backward()
    return y


def test_every_step_asks_whether_it_is_captured(monkeypatch):
    seen = []
    real = linear_gemms.refuse_graph_capture

    def record(like, what, name=""):
        seen.append((what, name))
        real(like, what, name)
    monkeypatch.setattr(linear_gemms, "refuse_graph_capture", record)
    torch.manual_seed(0)
    step(qrecipe.nn.Linear(32, 32, name="fc"), qrecipe.Recipe.from_dict(FLOAT8),
         torch.randn(4, 32))
    assert ("forward", "fc") in seen and ("backward", "fc") in seen
    assert {w for w, _ in seen} >= {"quantization of role linear:input@fc",
                                    "quantization of role linear:weight@fc",
                                    "quantization of role linear:grad_output@fc"}


def test_refusal_message(monkeypatch):
    class CudaLike:
        is_cuda = True
    monkeypatch.setattr(linear_gemms, "_capturing", lambda: True)
    with pytest.raises(RuntimeError) as error:
        linear_gemms.refuse_graph_capture(CudaLike(), "backward", "layers.0.fc1")
    message = str(error.value)
    assert message.startswith("qrecipe module 'layers.0.fc1': the backward ran during CUDA "
                              "graph capture (torch.cuda.graph")
    assert "Run the qrecipe modules eagerly" in message
    linear_gemms.refuse_graph_capture(torch.zeros(1), "forward")  # CPU: nothing is captured


def test_autocast_entry_refuses_a_due_update_during_capture_and_keeps_it_due(monkeypatch):
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    recipe.note_step_activity()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="entered during CUDA graph capture .* with a "
                                           "delayed-scaling update due"):
        with qrecipe.autocast(recipe):
            pass
    assert recipe.update_pending  # nothing ran: the update is still due
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with qrecipe.autocast(recipe):
        pass
    assert not recipe.update_pending


# ---------------------------------------------------------------- on a GPU

def cuda_linear(recipe_name):
    torch.manual_seed(0)
    module = qrecipe.nn.Linear(64, 64, name="fc", device="cuda", dtype=torch.bfloat16)
    return module, qrecipe.Recipe.builtin(recipe_name)


@needs_cuda
@pytest.mark.parametrize("recipe_name", ["float8_e4m3", "float8_delayed", "mxfp8", "nvfp4"])
def test_forward_capture_refused_then_eager_unchanged(recipe_name):
    """A warmed-up module (the usual order: eager steps, then capture) refuses the capture and
    its next eager step equals that of a twin that never saw one (delayed scaling too: the
    refused call does not mark the step for a scaling update)."""
    module, recipe = cuda_linear(recipe_name)
    twin, twin_recipe = cuda_linear(recipe_name)
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    step(module, recipe, x)
    step(twin, twin_recipe, x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # Delayed scaling refuses already at the autocast entry (its update is due), the others
    # at the forward.
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        with torch.cuda.graph(g):
            with qrecipe.autocast(recipe):
                module(x)
    assert not torch.cuda.is_current_stream_capturing()
    for m in (module, twin):
        m.zero_grad()
    y = step(module, recipe, x)
    y_twin = step(twin, twin_recipe, x)
    torch.testing.assert_close(y, y_twin, rtol=0, atol=0)
    torch.testing.assert_close(module.weight.grad, twin.weight.grad, rtol=0, atol=0)


@needs_cuda
def test_backward_capture_refused():
    """Capturing the backward of an eager forward: autograd runs a node on its forward's
    stream, so the forward runs on the stream that then captures (as make_graphed_callables
    arranges it)."""
    module, recipe = cuda_linear("float8_e4m3")
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with qrecipe.autocast(recipe):
            y = module(x)
        loss = y.float().sum()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="the backward ran during CUDA graph capture"):
        with torch.cuda.graph(g, stream=side):
            loss.backward()
    assert not torch.cuda.is_current_stream_capturing()


@needs_cuda
def test_make_graphed_callables_refused():
    module, recipe = cuda_linear("mxfp8")
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(recipe):
        with pytest.raises(RuntimeError, match="during CUDA graph capture"):
            torch.cuda.make_graphed_callables(module, (x,))


@needs_cuda
def test_grouped_linear_capture_refused():
    torch.manual_seed(0)
    module = qrecipe.nn.GroupedLinear(2, 64, 64, name="experts", device="cuda",
                                      dtype=torch.bfloat16)
    x = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        with torch.cuda.graph(g):
            with qrecipe.autocast(qrecipe.Recipe.builtin("mxfp8")):
                module(x, [16, 32])
