"""torch.compile of qrecipe modules through the torch.library operators (nn/compile_ops.py):
the traced graph holds the qrecipe operators and computes what eager mode computes, bit for bit."""
import pytest
import torch

import qrecipe
from qrecipe import autocasting


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Each test builds new modules and recipes, which dynamo guards on: start from an empty
    # cache so the suite never reaches the recompile limit.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def layer_and_data(dtype=torch.float32, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = qrecipe.nn.Linear(32, 16, bias=bias, dtype=dtype, name="fc")
    x = torch.randn(2, 8, 32, dtype=dtype)  # N-D: leading dims are tokens
    dy = torch.randn(2, 8, 16, dtype=dtype)
    return layer, x, dy


def step(module, params, x, dy, recipe):
    for p in params:
        p.grad = None
    x = x.clone().requires_grad_()
    with qrecipe.autocast(recipe):
        y = module(x)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in params]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("recipe_name,dtype,bias", [("default", torch.float32, True),
                                                    ("mxfp8", torch.bfloat16, False),
                                                    ("hybrid_fp8_mx", torch.float32, True)])
def test_compiled_linear_matches_eager_bit_for_bit(backend, recipe_name, dtype, bias):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer, x, dy = layer_and_data(dtype, bias)
    params = list(layer.parameters())
    eager = step(layer, params, x, dy, recipe)
    layer.roles(recipe)  # resolving roles makes engine objects: not traceable, do it first
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    traced = step(compiled, params, x, dy, recipe)
    assert len(eager) == len(traced)
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe_name,dtype,bias", [("default", torch.float32, True),
                                                    ("mxfp8", torch.bfloat16, False)])
def test_inductor_keeps_qrecipe_results_bit_for_bit(recipe_name, dtype, bias):
    # The default backend generates code around the qrecipe operators (here on the CPU).
    # Everything qrecipe computes (y, dx, the weight's gradient) stays bit-identical to eager;
    # the bias gradient is torch's own sum over the tokens, which inductor reduces in another
    # order, so it is held to FP32-summation tolerance instead.
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer, x, dy = layer_and_data(dtype, bias)
    params = list(layer.parameters())
    eager = step(layer, params, x, dy, recipe)
    layer.roles(recipe)
    compiled = torch.compile(layer, backend="inductor", fullgraph=True)
    traced = step(compiled, params, x, dy, recipe)
    assert len(eager) == len(traced) == 3 + int(bias)
    for a, b in zip(eager[:3], traced[:3]):
        assert torch.equal(a, b)
    if bias:
        torch.testing.assert_close(traced[3], eager[3], rtol=1e-5, atol=1e-5)


def test_graph_holds_the_qrecipe_operator():
    recipe = qrecipe.Recipe.default()
    layer, x, _ = layer_and_data()
    layer.roles(recipe)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    with qrecipe.autocast(recipe):
        compiled(x)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    # The operator, then taking y out of its (y, saved tensors) result.
    assert [t for t in targets if "getitem" not in t] == ["qrecipe.linear_forward"]
    # Outside autocast the same compiled module is F.linear (dynamo guards on the recipe).
    assert torch.equal(compiled(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_delayed_scaling_steps_match_eager():
    def train(compile_it):
        layer, _, _ = layer_and_data(seed=4)
        recipe = qrecipe.Recipe.builtin("float8_delayed")
        layer.roles(recipe)
        module = torch.compile(layer, backend="eager", fullgraph=True) if compile_it else layer
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        outs = []
        for i in range(3):
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            with qrecipe.autocast(recipe):
                y = module(x)
            assert autocasting.update_pending(recipe)  # the traced forward marked the step
            y.square().sum().backward()
            opt.step()
            outs.append(y.detach())
        return outs, [s["scale"] for s in recipe.scaling_states()]

    eager_outs, eager_scales = train(False)
    outs, scales = train(True)
    assert all(torch.equal(a, b) for a, b in zip(outs, eager_outs))
    assert scales == eager_scales and any(s != 1.0 for s in scales)


def test_unresolved_roles_and_eager_only_features_fall_back_with_graph_breaks():
    recipe = qrecipe.Recipe.default()
    layer, x, dy = layer_and_data()
    params = list(layer.parameters())
    eager = step(layer, params, x, dy, recipe)
    fresh, _, _ = layer_and_data()
    compiled = torch.compile(fresh, backend="eager")  # not fullgraph: breaks are allowed
    assert all(torch.equal(a, b) for a, b in
               zip(step(compiled, list(fresh.parameters()), x, dy, recipe), eager))
    with qrecipe.autocast(recipe):  # weight caching takes the eager path inside the graph
        y = compiled(x, is_first_microbatch=True)
    assert torch.equal(y.detach(), eager[0])


@pytest.mark.parametrize("recipe_name", ["default", "mxfp8", "hybrid_fp8_mx"])
def test_operators_pass_opcheck(recipe_name):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    layer, x, dy = layer_and_data()
    handle = id(layer.roles(recipe))
    x = x.reshape(-1, 32)
    torch.library.opcheck(torch.ops.qrecipe.linear_forward.default,
                          (x.clone().requires_grad_(), layer.weight, layer.bias, handle, True,
                           True))
    _, saved = torch.ops.qrecipe.linear_forward(x, layer.weight, layer.bias, handle, True, True)
    assert [t.dtype for t in saved] == [torch.uint8, torch.uint8]  # x and W, quantized
    torch.library.opcheck(torch.ops.qrecipe.linear_backward.default,
                          (dy.reshape(-1, 16), saved, None, None, handle, [16, 32],
                           torch.float32, torch.float32, True, True))


@pytest.mark.parametrize("recipe_name", ["default", "mxfp8"])
def test_compiled_grouped_linear_matches_eager_bit_for_bit(recipe_name, monkeypatch):
    """Under torch.compile GroupedLinear traces its experts one by one (one qrecipe operator
    per expert); eager runs them as one autograd node with grouped quantization. Both give
    the numbers of separate Linears, so they agree bit for bit."""
    recipe = qrecipe.Recipe.builtin(recipe_name)
    torch.manual_seed(4)
    module = qrecipe.nn.GroupedLinear(3, 32, 16, name="moe.experts")
    params = list(module.parameters())
    x = torch.randn(96, 32)
    dy = torch.randn(96, 16)
    splits = [32, 0, 64]

    def run(m):
        for p in params:
            p.grad = None
        xg = x.clone().requires_grad_()
        with qrecipe.autocast(recipe):
            y = m(xg, splits)
        y.backward(dy)
        return [y.detach(), xg.grad] + [p.grad for p in params]

    from qrecipe.nn import grouped_linear_function
    grouped_calls = []
    original = grouped_linear_function._quantize_rows

    def counting(*args):
        grouped_calls.append(args[1].shape)
        return original(*args)

    monkeypatch.setattr(grouped_linear_function, "_quantize_rows", counting)
    eager = run(module)
    assert len(grouped_calls) == 2  # eager: the inputs and the gradients, one call each
    module.roles(recipe)
    compiled = torch.compile(module, backend="aot_eager")
    traced = run(compiled)
    assert len(grouped_calls) == 2  # traced: expert by expert, no grouped call
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)
