"""qrecipe.autocast: nesting, enabled=False, default recipe, and the once-per-step
delayed-scaling update (docs/adapter.md, "autocast")."""
import pytest
import torch
import torch.nn.functional as F

import qrecipe


def test_nesting_and_disabled_blocks():
    a = qrecipe.Recipe.builtin("mxfp8")
    b = qrecipe.Recipe.builtin("blockwise")
    assert qrecipe.current_recipe() is None
    with qrecipe.autocast(a):
        assert qrecipe.current_recipe() is a
        with qrecipe.autocast(b):
            assert qrecipe.current_recipe() is b
            with qrecipe.autocast(enabled=False):
                assert qrecipe.current_recipe() is None and not qrecipe.is_enabled()
            assert qrecipe.current_recipe() is b
        assert qrecipe.current_recipe() is a
    assert qrecipe.current_recipe() is None
    with qrecipe.autocast():
        assert qrecipe.current_recipe() is qrecipe.Recipe.default()


def test_disabled_inside_enabled_runs_high_precision():
    lin = qrecipe.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with qrecipe.autocast():
        with qrecipe.autocast(enabled=False):
            y = lin(x)
        y_q = lin(x)
    assert torch.equal(y, F.linear(x, lin.weight, lin.bias))
    assert not torch.equal(y_q, y)


def test_autocast_accepts_paths_dicts_and_works_as_decorator(tmp_path):
    from conftest import REPO
    with qrecipe.autocast(REPO / "recipes" / "mxfp8.yaml") as ctx:
        assert qrecipe.current_recipe().name == "mxfp8"
    with qrecipe.autocast({"version": 1, "name": "d", "defaults": {"format": "float8"}}):
        assert qrecipe.current_recipe().name == "d"

    @qrecipe.autocast(qrecipe.Recipe.builtin("nvfp4"))
    def inner():
        return qrecipe.current_recipe().name
    assert inner() == "nvfp4"
    with pytest.raises(TypeError):
        qrecipe.autocast(42)


def test_exception_inside_block_restores_state():
    with pytest.raises(RuntimeError):
        with qrecipe.autocast():
            raise RuntimeError("boom")
    assert qrecipe.current_recipe() is None


def states(recipe):
    # Creation order of the states of one Linear: input, weight, grad_output.
    return recipe.scaling_states()


def test_delayed_scaling_updates_once_per_step_at_next_outermost_entry():
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    lin = qrecipe.nn.Linear(16, 8, name="fc")
    x1 = torch.randn(32, 16) * 3
    x2 = torch.randn(32, 16) * 5

    with qrecipe.autocast(recipe):  # step 1: scales 1, amaxes recorded
        y = lin(x1.requires_grad_())
    y.sum().backward()
    s = states(recipe)
    assert len(s) == 3
    assert [st["scale"] for st in s] == [1.0, 1.0, 1.0]  # nothing updated between fwd and bwd
    assert s[0]["amax_history"][0] == x1.abs().max().item()
    assert s[2]["amax_history"][0] == 1.0  # d(sum)/dy

    with qrecipe.autocast(recipe):  # step 2: entry applies step 1's amaxes, once
        s = states(recipe)
        amax_x1 = x1.abs().max()
        assert s[0]["scale"] == (torch.tensor(448.0) / amax_x1).item()
        assert s[0]["amax_history"][-1] == amax_x1.item() and s[0]["amax_history"][0] == 0.0
        assert s[2]["scale"] == 57344.0
        with qrecipe.autocast(recipe):  # nested entry: no update
            lin(x2)
        lin(x2)  # a second micro-batch in the same step
        assert states(recipe)[0]["scale"] == s[0]["scale"]
        assert states(recipe)[0]["amax_history"][0] == x2.abs().max().item()

    with qrecipe.autocast(recipe):  # step 3: history max over {amax1, amax2}
        s = states(recipe)
        amax = torch.maximum(x1.abs().max(), x2.abs().max())
        assert s[0]["scale"] == (torch.tensor(448.0) / amax).item()
        assert s[0]["amax_history"][-2:] == [x1.abs().max().item(), x2.abs().max().item()]


def test_recipes_without_activity_are_not_updated():
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    with qrecipe.autocast(recipe):
        pass
    with qrecipe.autocast(recipe):
        pass
    assert recipe.scaling_states() == []


def test_pending_update_is_per_thread():
    # Which recipes' update is due is per thread, like the autocast stack: a step run in a
    # worker thread is updated by that thread's next outermost entry, not by another thread's.
    import threading
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    lin = qrecipe.nn.Linear(16, 8, name="fc")
    x = torch.randn(32, 16) * 3
    seen = {}
    worker_stepped, main_entered = threading.Event(), threading.Event()

    def worker():
        try:
            with qrecipe.autocast(recipe):
                lin(x)
            seen["pending"] = recipe.update_pending
            seen["state_dict"] = recipe.state_dict()["update_pending"]
        finally:
            worker_stepped.set()
        main_entered.wait()
        with qrecipe.autocast(recipe):  # the worker's next step: its update runs now
            seen["scale after entry"] = states(recipe)[0]["scale"]
        seen["pending after entry"] = recipe.update_pending

    thread = threading.Thread(target=worker)
    thread.start()
    worker_stepped.wait()
    try:
        assert seen["pending"] and seen["state_dict"]
        assert not recipe.update_pending and not qrecipe.autocasting.update_pending(recipe)
        with qrecipe.autocast(recipe):  # the main thread's entry: nothing of its own is due
            assert states(recipe)[0]["scale"] == 1.0
    finally:
        main_entered.set()
        thread.join()
    assert seen["scale after entry"] == (torch.tensor(448.0) / x.abs().max()).item()
    assert not seen["pending after entry"]
