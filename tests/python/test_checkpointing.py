"""Activation checkpointing: torch.utils.checkpoint (reentrant and non-reentrant) and the
qrecipe.checkpoint alias recompute qrecipe modules under the forward's recipe and scales
(qrecipe/recomputation.py), so every output, gradient and delayed-scaling state equals that
of the same model without checkpointing, bit for bit, under every shipped recipe; and the
cases that cannot be replayed are errors."""
import functools

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import qrecipe

RECIPES = qrecipe.Recipe.builtin_names()
TOKENS, WIDTH = 16, 64  # NVFP4's Hadamard transform needs bf16 and tokens divisible by 16


class Block(torch.nn.Module):
    """Every qrecipe module once: LayerNormLinear -> Linear -> LayerNormMLP (SwiGLU) ->
    GroupedLinear (two experts, one of them without rows)."""

    def __init__(self, name="block"):
        super().__init__()
        dt = torch.bfloat16
        self.qkv = qrecipe.nn.LayerNormLinear(WIDTH, WIDTH, normalization="RMSNorm", dtype=dt,
                                              name=f"{name}.qkv")
        self.proj = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=dt, name=f"{name}.proj")
        self.mlp = qrecipe.nn.LayerNormMLP(WIDTH, 2 * WIDTH, activation="swiglu", dtype=dt,
                                           name=f"{name}.mlp")
        self.experts = qrecipe.nn.GroupedLinear(2, WIDTH, WIDTH, dtype=dt,
                                                name=f"{name}.experts")

    def forward(self, x):
        h = x + self.proj(F.gelu(self.qkv(x)))
        h = h + self.mlp(h)
        return h + self.experts(h, [h.shape[0], 0])


class Model(torch.nn.Module):
    """Two blocks, plus the first block applied once more (a module in two segments)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block("b0"), Block("b1")])

    def forward(self, x, run):
        for block in (self.blocks[0], self.blocks[1], self.blocks[0]):
            x = run(block, x)
        return x


def plain(block, x):
    return block(x)


def torch_checkpoint(reentrant):
    return lambda block, x: torch.utils.checkpoint.checkpoint(block, x,
                                                              use_reentrant=reentrant)


FLAVOURS = {
    "non_reentrant": torch_checkpoint(False),
    "reentrant": torch_checkpoint(True),
    "qrecipe_checkpoint": qrecipe.checkpoint,
}


def train(recipe_name, run, steps=2):
    """Outputs, input and parameter gradients of each step, and the final scaling states, of
    a fresh model (same seed) whose blocks run through `run`; backward outside autocast."""
    torch.manual_seed(0)
    model = Model()
    recipe = qrecipe.Recipe.builtin(recipe_name)
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(TOKENS, WIDTH, generator=g).to(torch.bfloat16).requires_grad_()
        model.zero_grad()
        with qrecipe.autocast(recipe):
            y = model(x, run)
        y.float().square().sum().backward()
        out.append([y.detach(), x.grad] + [p.grad for p in model.parameters()])
    with qrecipe.autocast(recipe):
        pass  # the last step's scaling update
    return out, recipe.scaling_states()


def assert_same(expected, got, what):
    (exp_steps, exp_states), (got_steps, got_states) = expected, got
    for step, (a_step, b_step) in enumerate(zip(exp_steps, got_steps)):
        assert len(a_step) == len(b_step)
        for i, (a, b) in enumerate(zip(a_step, b_step)):
            assert (a is None) == (b is None), f"{what}: step {step} tensor {i}"
            assert a is None or torch.equal(a, b), f"{what}: step {step} tensor {i} differs"
    assert [s["owner"] for s in exp_states] == [s["owner"] for s in got_states]
    for s, t in zip(exp_states, got_states):
        assert s["amax_history"] == t["amax_history"] and s["scale"] == t["scale"], \
            f"{what}: scaling state {s['owner']} differs"


@functools.lru_cache(maxsize=None)
def reference(recipe_name):
    return train(recipe_name, plain)


# Both torch flavours under every recipe; the alias (non-reentrant underneath) once.
@pytest.mark.parametrize("recipe_name,flavour",
                         [(r, f) for r in RECIPES for f in ("non_reentrant", "reentrant")] +
                         [("default", "qrecipe_checkpoint")])
def test_recomputation_is_bit_identical(recipe_name, flavour):
    assert_same(reference(recipe_name), train(recipe_name, FLAVOURS[flavour]),
                f"{recipe_name}, {flavour}")


def test_delayed_scaling_records_its_amaxes_once_per_step():
    # The recomputation's amaxes are the forward's own: the histories equal a run without
    # checkpointing, and the scales used in step 2 came from step 1's amaxes.
    (_, states) = reference("float8_delayed")
    assert any(s["scale"] != 1.0 for s in states)
    assert_same(reference("float8_delayed"), train("float8_delayed", torch_checkpoint(False)),
                "float8_delayed")


def _micro_batches(recipe_name, run, one_outer_block):
    """Two micro-batches whose forwards both run before either backward."""
    torch.manual_seed(0)
    block = Block()
    recipe = qrecipe.Recipe.builtin(recipe_name)
    xs = [torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16,
                      generator=torch.Generator().manual_seed(i)).requires_grad_()
          for i in range(2)]
    ys = []
    if one_outer_block:
        with qrecipe.autocast(recipe):
            ys = [run(block, x) for x in xs]
            for y in ys:
                y.float().sum().backward()
    else:
        for x in xs:
            with qrecipe.autocast(recipe):  # each an outermost block: scales may update
                ys.append(run(block, x))
        for y in ys:
            y.float().sum().backward()
    return [x.grad for x in xs] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("recipe_name", ["default", "float8_delayed"])
def test_forwards_before_backwards_in_one_outer_block(recipe_name):
    expected = _micro_batches(recipe_name, plain, True)
    got = _micro_batches(recipe_name, torch_checkpoint(False), True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_current_scaling_replays_across_outer_blocks():
    # Separate outermost blocks per micro-batch: current scaling has no scales to change.
    expected = _micro_batches("default", plain, False)
    got = _micro_batches("default", torch_checkpoint(True), False)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


@pytest.mark.parametrize("reentrant", [False, True])
def test_updated_delayed_scales_are_refused(reentrant):
    # The second outermost block updates float8_delayed's scales before the first
    # micro-batch's backward recomputes it: the forward cannot be replayed.
    with pytest.raises(qrecipe.QrecipeError, match="after its delayed scales were updated"):
        _micro_batches("float8_delayed", torch_checkpoint(reentrant), False)


def test_disabled_forward_recomputes_disabled():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(qrecipe.Recipe.default()):
        with qrecipe.autocast(enabled=False):
            y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    y.float().sum().backward()
    ref = x.detach().clone().requires_grad_()
    block2 = Block()
    block2.load_state_dict(block.state_dict())
    block2(ref).float().sum().backward()
    assert torch.equal(x.grad, ref.grad)


def test_autocast_inside_the_checkpointed_function_runs_no_update_in_backward():
    # A function that opens its own outermost autocast block is re-entered during backward:
    # that entry must not run the pending scaling update between forward and backward.
    recipe = qrecipe.Recipe.builtin("float8_delayed")

    def run(block, x):
        def inner(x):
            with qrecipe.autocast(recipe):
                return block(x)
        return torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)

    torch.manual_seed(0)
    block = Block()
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(recipe):
        pass
    y = run(block, x)  # outside any block: the function's own block is the outermost
    before = recipe.scaling_generation
    y.float().sum().backward()
    assert recipe.scaling_generation == before
    assert recipe.update_pending


def test_data_dependent_recomputation_is_refused():
    torch.manual_seed(0)
    a = qrecipe.nn.Linear(WIDTH, WIDTH, name="a")
    b = qrecipe.nn.Linear(WIDTH, WIDTH, name="b")
    calls = []

    def fn(x):
        calls.append(1)
        return (a if len(calls) == 1 else b)(x)  # the recomputation runs another module

    x = torch.randn(8, WIDTH, requires_grad=True)
    with qrecipe.autocast():
        y = torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)
    with pytest.raises(qrecipe.QrecipeError, match="same qrecipe modules in the same order"):
        y.sum().backward()


def test_unrecognised_backward_time_call_is_refused():
    layer = qrecipe.nn.Linear(WIDTH, WIDTH, name="hooked")
    x = torch.randn(8, WIDTH, requires_grad=True)
    with qrecipe.autocast():
        y = layer(x)
    y.register_hook(lambda grad: layer(grad))  # a qrecipe GEMM inside backward, no autocast
    with pytest.raises(qrecipe.QrecipeError, match="during a backward"):
        y.sum().backward()
    # Stating the intent with an explicit block makes the same call legal.
    with qrecipe.autocast():
        y = layer(x)
    seen = []

    def hook(grad):
        with qrecipe.autocast(enabled=False):
            seen.append(layer(grad))

    y.register_hook(hook)
    y.sum().backward()
    assert torch.equal(seen[0], F.linear(torch.ones(8, WIDTH), layer.weight, layer.bias))


def test_checkpoint_alias_takes_torch_options():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast():
        y = qrecipe.checkpoint(block, x, use_reentrant=True)
    y.float().sum().backward()
    assert x.grad is not None


def test_stochastic_rounding_on_recomputed_roles_is_refused():
    recipe = qrecipe.Recipe.from_dict({"version": 1, "name": "sr-input", "defaults": {
        "format": "none"}, "rules": [{"match": {"tensor_type": "input"}, "quantizer": {
            "format": "nvfp4", "stochastic_rounding": True}}]})
    layer = qrecipe.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16, name="sr")
    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(recipe):
        y = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
    with pytest.raises(qrecipe.QrecipeError, match="stochastic rounding"):
        y.float().sum().backward()
