"""qrecipe.checkpoint: a checkpointed segment recomputes under the forward's recipe, so the
gradients equal those of the same model without checkpointing bit for bit, delayed scaling
included; plain torch.utils.checkpoint recomputes in high precision and does not."""
import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import qrecipe


class Block(torch.nn.Module):
    def __init__(self, width=64, hidden=128):
        super().__init__()
        self.fc1 = qrecipe.nn.Linear(width, hidden, dtype=torch.bfloat16, name="block.fc1")
        self.fc2 = qrecipe.nn.Linear(hidden, width, dtype=torch.bfloat16, name="block.fc2")

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def train(recipe_name, wrap, steps=3):
    """Gradients of every step of a fresh model (same seed) whose block runs through `wrap`."""
    torch.manual_seed(0)
    block = Block()
    recipe = qrecipe.Recipe.builtin(recipe_name)
    out = []
    for step in range(steps):
        x = torch.randn(32, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(step))
        x.requires_grad_()
        block.zero_grad()
        with qrecipe.autocast(recipe):
            y = wrap(block, x)
        # backward outside the block, as in a usual loop: the recomputation runs here
        y.float().square().sum().backward()
        out.append([x.grad.clone()] + [p.grad.clone() for p in block.parameters()])
    return out


def plain(block, x):
    return block(x)


def checkpointed(block, x):
    return qrecipe.checkpoint(block, x)


@pytest.mark.parametrize("name", ["default", "float8_delayed", "mxfp8", "blockwise", "nvfp4"])
def test_recomputation_reproduces_the_forward_bit_for_bit(name):
    expected = train(name, plain)
    got = train(name, checkpointed)
    for step, (a_step, b_step) in enumerate(zip(expected, got)):
        for a, b in zip(a_step, b_step):
            assert torch.equal(a, b), f"{name}: step {step} gradients differ"


def test_plain_torch_checkpoint_recomputes_in_high_precision():
    # The failure qrecipe.checkpoint exists for: torch's checkpoint recomputes outside the
    # autocast block, so the saved operands are not the quantized ones the forward used.
    # Depending on what the segment saves, torch notices the mismatch itself (CheckpointError)
    # or the gradients come out different; either way it is not the forward that ran.
    expected = train("default", plain, steps=1)
    try:
        got = train("default", lambda b, x: torch.utils.checkpoint.checkpoint(
            b, x, use_reentrant=False), steps=1)
    except torch.utils.checkpoint.CheckpointError:
        return
    assert any(not torch.equal(a, b) for a, b in zip(expected[0], got[0]))


def test_recomputation_does_not_advance_delayed_scaling():
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    block = Block()
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(recipe):
        y = qrecipe.checkpoint(block, x)
    before = [s["scale"] for s in recipe.scaling_states()]
    y.float().sum().backward()  # recomputes the forward under the replayed recipe
    assert [s["scale"] for s in recipe.scaling_states()] == before
    assert qrecipe.autocasting.update_pending(recipe)  # the update still waits for the next step


def test_disabled_forward_recomputes_disabled():
    block = Block()
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    with qrecipe.autocast(enabled=False):
        y = qrecipe.checkpoint(block, x)
    y.float().sum().backward()
    ref = x.detach().clone().requires_grad_()
    block2 = Block()
    block2.load_state_dict(block.state_dict())
    block2(ref).float().sum().backward()
    assert torch.equal(x.grad, ref.grad)


def test_rejects_torch_only_options():
    with pytest.raises(TypeError, match="non-reentrant"):
        qrecipe.checkpoint(Block(), torch.randn(2, 64), use_reentrant=True)
