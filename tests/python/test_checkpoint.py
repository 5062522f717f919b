"""Checkpoints: the delayed-scaling state (amax histories, scales) in model.state_dict() and
Recipe.state_dict(), bit-exact resumption, and loading under another recipe."""
import io

import pytest
import torch

import qrecipe

def recipe_path(name):
    from qrecipe.recipe import _RECIPES_DIR
    return _RECIPES_DIR / f"{name}.yaml"


def make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16))
    return qrecipe.convert(model)


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(24, 32, generator=g), torch.randn(24, 16, generator=g)


def train(model, opt, recipe, steps):
    losses = []
    for step in steps:
        x, target = data(step)
        opt.zero_grad()
        with qrecipe.autocast(recipe):
            loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def make_opt(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # the default of torch.load: plain data only


def assert_same_states(a, b):
    assert len(a) == len(b)
    for s, t in zip(a, b):
        assert s["owner"] == t["owner"]
        assert s["amax_history"] == t["amax_history"]  # lists of floats: exact
        assert s["scale"] == t["scale"] and s["scale_inv"] == t["scale_inv"]


@pytest.fixture(scope="module")
def uninterrupted():
    model = make_model(0)
    opt = make_opt(model)
    recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    losses = train(model, opt, recipe, range(5))
    with qrecipe.autocast(recipe):  # the update the next step would run first
        pass
    return losses, model.state_dict(), recipe.scaling_states()


def first_three_steps():
    model = make_model(0)
    opt = make_opt(model)
    recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    losses = train(model, opt, recipe, range(3))
    return losses, model, opt, recipe


def check_resumed(uninterrupted, losses, model, recipe):
    ref_losses, ref_state, ref_scaling = uninterrupted
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    for key, value in model.state_dict().items():
        if not key.endswith("_extra_state"):
            assert torch.equal(value, ref_state[key]), key
    with qrecipe.autocast(recipe):
        pass
    assert_same_states(recipe.scaling_states(), ref_scaling)


@pytest.mark.parametrize("resolve_first", [False, True])
def test_model_state_dict_resumes_bit_for_bit(uninterrupted, resolve_first):
    losses, model, opt, recipe = first_three_steps()
    checkpoint = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    extra = checkpoint["model"]["0._extra_state"]
    owners = [s["owner"] for s in extra["entries"][0]["scaling_states"]]
    assert owners == ["linear:input@0 float8", "linear:weight@0 float8",
                      "linear:grad_output@0 float8"]
    assert extra["entries"][0]["update_pending"] is True  # saved before step 4's update

    fresh_recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    fresh = make_model(1)  # other initial weights: everything must come from the checkpoint
    if resolve_first:  # states written at load_state_dict time
        qrecipe.convert(fresh, recipe=fresh_recipe)
    fresh.load_state_dict(checkpoint["model"])
    if resolve_first:
        assert len(fresh_recipe.scaling_states()) == 6
    opt2 = make_opt(fresh)
    opt2.load_state_dict(checkpoint["opt"])
    losses += train(fresh, opt2, fresh_recipe, range(3, 5))
    check_resumed(uninterrupted, losses, fresh, fresh_recipe)


def test_recipe_state_dict_resumes_bit_for_bit(uninterrupted):
    losses, model, opt, recipe = first_three_steps()
    checkpoint = roundtrip({"model": qrecipe.drop_scaling_states(model.state_dict()),
                            "recipe": recipe.state_dict(), "opt": opt.state_dict()})
    assert not any(k.endswith("_extra_state") for k in checkpoint["model"])
    assert len(checkpoint["recipe"]["scaling_states"]) == 6

    fresh_recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    fresh_recipe.load_state_dict(checkpoint["recipe"])  # on a fresh engine: resolves the roles
    assert len(fresh_recipe.scaling_states()) == 6
    fresh = make_model(1)
    fresh.load_state_dict(checkpoint["model"])  # strict: no _extra_state is not an error
    opt2 = make_opt(fresh)
    opt2.load_state_dict(checkpoint["opt"])
    losses += train(fresh, opt2, fresh_recipe, range(3, 5))
    check_resumed(uninterrupted, losses, fresh, fresh_recipe)


def test_states_survive_state_dict_round_trip_exactly():
    _, model, _, recipe = first_three_steps()
    with qrecipe.autocast(recipe):
        pass  # apply the pending update: scales differ from 1 now
    saved = recipe.scaling_states()
    assert any(s["scale"] != 1.0 for s in saved)
    other = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    other.load_state_dict(roundtrip(recipe.state_dict()))
    assert_same_states(sorted(other.scaling_states(), key=lambda s: s["owner"]),
                       sorted(saved, key=lambda s: s["owner"]))


def test_plain_torch_checkpoint_loads_into_converted_model():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 4))
    converted = qrecipe.convert(torch.nn.Sequential(torch.nn.Linear(8, 4)))
    result = converted.load_state_dict(plain.state_dict())  # strict
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(converted[0].weight, plain[0].weight)


def test_another_recipe_loads_weights_and_rejects_scaling_states():
    _, model, _, _ = first_three_steps()
    state = model.state_dict()
    mxfp8 = qrecipe.Recipe.builtin("mxfp8")

    # Roles resolved before loading: the error comes from load_state_dict.
    fresh = qrecipe.convert(make_model(1), recipe=mxfp8)
    with pytest.raises(qrecipe.QrecipeError,
                       match=r"(?s)saved under recipe 'float8-delayed' into recipe 'mxfp8'.*"
                             r"linear:input@0 float8.*drop_scaling_states"):
        fresh.load_state_dict(state)

    # Not resolved yet: the error comes at the first forward, before anything is quantized.
    fresh = make_model(1)
    fresh.load_state_dict(state)
    with pytest.raises(qrecipe.QrecipeError, match="has no such state"):
        with qrecipe.autocast(mxfp8):
            fresh(torch.randn(4, 32))

    # Dropping the scaling states keeps the weights and starts scaling afresh.
    fresh = make_model(1)
    fresh.load_state_dict(qrecipe.drop_scaling_states(state))
    assert torch.equal(fresh[0].weight, model[0].weight)
    with qrecipe.autocast(mxfp8):
        fresh(torch.randn(4, 32))


def test_history_length_mismatch_is_an_error():
    _, model, _, recipe = first_three_steps()
    short = qrecipe.Recipe.from_dict({
        "version": 1, "name": "short", "defaults": {"format": "none"},
        "rules": [{"match": {"tensor_type": ["input", "weight", "grad_output"]},
                   "quantizer": {"format": "float8", "scaling": "delayed",
                                 "amax_history_len": 16}}]})
    with pytest.raises(qrecipe.QrecipeError, match="amax history of 1024 steps.*"
                                                   "amax_history_len 16"):
        short.load_state_dict(recipe.state_dict())
    assert all(s["scale"] == 1.0 for s in short.scaling_states())  # nothing written


def test_engine_binding_errors_name_the_owner():
    recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    recipe.quantizer("linear", "input", "fc")
    good = recipe.scaling_states()[0]
    with pytest.raises(qrecipe.QrecipeError, match="'linear:input@nope float8'.*its states: "
                                                   "'linear:input@fc float8'"):
        recipe.engine.load_scaling_states([dict(good, owner="linear:input@nope float8")])
    with pytest.raises(qrecipe.QrecipeError, match="no 'scale' entry"):
        recipe.engine.load_scaling_states([{k: v for k, v in good.items() if k != "scale"}])
    history = [0.0] * 1024
    history[0] = 3.5
    recipe.engine.load_scaling_states([dict(good, amax_history=history, scale=2.0,
                                            scale_inv=0.5)])
    state = recipe.scaling_states()[0]
    assert state["amax_history"][0] == 3.5 and state["scale"] == 2.0
    recipe.engine.load_scaling_states([dict(good, amax_history=history)], update=True)
    state = recipe.scaling_states()[0]
    assert state["amax_history"][0] == 0.0 and state["amax_history"][-1] == 3.5  # rolled
    assert state["scale"] == 128.0 and state["scale_inv"] == 1.0 / 128  # 448 / 3.5


def test_owner_roles_are_parsed_once_in_the_binding():
    # A state's owner is "<role> <format>"; the engine splits it for Recipe.load_state_dict,
    # and a quantizer gives its role's fields directly (QuantizedWeight's pickled role).
    assert qrecipe._C.role_of_owner("layernorm_mlp:weight@layers.0.mlp.fc1 nvfp4") == \
        ("layernorm_mlp", "weight", "layers.0.mlp.fc1")
    assert qrecipe._C.role_of_owner("linear:input@ float8") == ("linear", "input", "")
    assert qrecipe._C.role_of_owner("no-role") == ("no-role", "", "")
    recipe = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    q = recipe.engine.resolve("linear", "grad_output", "blocks.1.fc")
    assert q.role_fields == ("linear", "grad_output", "blocks.1.fc")
    [state] = recipe.scaling_states()
    assert qrecipe._C.role_of_owner(state["owner"]) == q.role_fields
    assert recipe.scaling_states(roles=["linear:grad_output@blocks.1.fc"]) == [state]
    assert recipe.scaling_states(roles=["linear:input@blocks.1.fc"]) == []


def test_hybrid_with_two_delayed_halves_round_trips_by_owner_and_order():
    spec = {"format": "hybrid",
            "rowwise": {"format": "float8", "scaling": "delayed", "amax_history_len": 8},
            "columnwise": {"format": "float8", "scaling": "delayed", "amax_history_len": 8,
                           "dtype": "e5m2"}}
    recipe_dict = {"version": 1, "name": "two-delayed", "defaults": {"format": "none"},
                   "rules": [{"match": {"tensor_type": "input"}, "quantizer": spec}]}
    recipe = qrecipe.Recipe.from_dict(recipe_dict)
    layer = qrecipe.nn.Linear(32, 16, name="fc")
    for i in range(2):
        with qrecipe.autocast(recipe):
            layer(torch.randn(8, 32) * (i + 1)).sum().backward()
    states = recipe.scaling_states()
    assert [(s["owner"], s["index"]) for s in states] == [("linear:input@fc float8", 0),
                                                         ("linear:input@fc float8", 1)]
    assert states[0]["fp8_max"] != states[1]["fp8_max"]  # e4m3 and e5m2 halves: distinct
    other = qrecipe.Recipe.from_dict(recipe_dict)
    fresh = qrecipe.nn.Linear(32, 16, name="fc")
    fresh.load_state_dict(roundtrip(layer.state_dict()))
    with qrecipe.autocast(other):
        fresh(torch.randn(8, 32))  # first use: the loaded states are written (and updated)
    loaded = other.scaling_states()  # before any later autocast entry updates `other` again
    with qrecipe.autocast(recipe):
        pass  # the update the original recipe owed since its last step
    for a, b in zip(loaded, recipe.scaling_states()):
        assert (a["owner"], a["index"]) == (b["owner"], b["index"])
        assert a["scale"] == b["scale"] and a["amax_history"][1:] == b["amax_history"][1:]


def test_loading_into_a_recipe_with_an_update_due_advances_the_states_once(uninterrupted):
    _, model, _, recipe = first_three_steps()
    state = recipe.state_dict()
    assert state["update_pending"]
    busy = qrecipe.Recipe.load(recipe_path("float8_delayed"))
    layer = qrecipe.nn.Linear(8, 8, name="other")
    with qrecipe.autocast(busy):
        layer(torch.randn(4, 8))  # busy now owes an update
    busy.load_state_dict(state)   # updates the loaded states (they were saved with one due)
    with qrecipe.autocast(busy):
        pass                      # busy's own update: no new amax for them, so no change
    with qrecipe.autocast(recipe):
        pass
    mine = {s["owner"]: s for s in recipe.scaling_states()}
    for s in busy.scaling_states():
        if s["owner"] in mine:
            assert s["amax_history"] == mine[s["owner"]]["amax_history"]
            assert s["scale"] == mine[s["owner"]]["scale"]
