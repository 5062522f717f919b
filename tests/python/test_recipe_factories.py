"""Recipes in Python (docs/recipes.md "Recipes in Python"): QuantizerRole, qrecipe.formats,
factory recipes and YAML rules that delegate to a factory, shared delayed scaling.

TransformerEngine's custom-recipe examples are written both as Python factories and as YAML
recipes; each pair must give bit-identical training steps (outputs, gradients, weights after
the optimizer step, over several steps so delayed scaling takes effect). Every bad factory
answer has a test of its message.
"""
import re
import warnings

import pytest
import torch

import qrecipe
from qrecipe import QuantizerRole, RecipeError, formats

D = 32        # model width (a multiple of MXFP8's 32 and NVFP4's 16)
TOKENS = 32   # a multiple of 16 (NVFP4)
STEPS = 3


class Block(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.attn = qrecipe.nn.LayerNormLinear(D, D, dtype=dtype)
        self.mlp = qrecipe.nn.LayerNormMLP(D, 2 * D, dtype=dtype)

    def forward(self, x):
        return x + self.mlp(self.attn(x))


class Model(torch.nn.Module):
    """embed (first layer) -> 2 blocks of LayerNormLinear + LayerNormMLP -> head (last)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.embed = torch.nn.Linear(D, D, dtype=dtype)
        self.layers = torch.nn.ModuleList([Block(dtype) for _ in range(2)])
        self.head = torch.nn.Linear(D, 16, dtype=dtype)

    def forward(self, x):
        x = self.embed(x)
        for block in self.layers:
            x = block(x)
        return self.head(x)


def make_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return qrecipe.convert(Model(dtype))


def train(recipe, dtype=torch.float32, steps=STEPS):
    """Outputs, input gradients and every parameter after each of `steps` SGD steps."""
    model = make_model(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    trace = []
    for _ in range(steps):
        x = torch.randn(TOKENS, D, dtype=dtype, requires_grad=True)
        dy = torch.randn(TOKENS, 16, dtype=dtype)
        optimizer.zero_grad()
        with qrecipe.autocast(recipe):
            y = model(x)
        y.backward(dy)
        optimizer.step()
        trace += [y.detach(), x.grad] + [p.detach().clone() for p in model.parameters()]
    return trace, model


def assert_bit_identical(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"tensor {i} differs"


def yaml_recipe(text, name="yaml"):
    return qrecipe.Recipe.from_yaml("version: 1\nname: " + name + "\n" + text, f"<{name}>")


# ---------------------------------------------------------------- TE's examples, both ways

def nvfp4_weights_mxfp8_rest(role):
    """NVFP4 weights (16x16 tiles) + MXFP8 activations + MXFP8 gradients."""
    if role.tensor_type == "weight":
        return formats.nvfp4(two_d=True)
    return formats.mxfp8()


NVFP4_WEIGHTS_MXFP8_REST = """
rules:
  - match: {tensor_type: weight}
    quantizer: {format: nvfp4, 2d: true}
  - match: {tensor_type: [input, grad_output]}
    quantizer: {format: mxfp8}
"""


def first_last_high_precision(role):
    """First and last layers in high precision, float8 elsewhere (TE: BF16 first/last)."""
    if role.name in ("embed", "head"):
        return None
    return formats.float8()


FIRST_LAST_HIGH_PRECISION = """
rules:
  - match: {name: [embed, head]}
    quantizer: {format: none}
  - match: {}
    quantizer: {format: float8, scaling: current}
"""


def delayed_weights_only(role):
    """Delayed scaling for the weights only, current scaling for the rest."""
    if role.tensor_type == "weight":
        return formats.delayed(history=4)
    return formats.float8()


DELAYED_WEIGHTS_ONLY = """
rules:
  - match: {tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4}
  - match: {}
    quantizer: {format: float8}
"""


def shared_delayed_weights(role):
    """All weights share ONE delayed-scaling state (amax history and scale)."""
    if role.tensor_type == "weight":
        return formats.delayed(history=4, share="weights")
    return formats.float8()


SHARED_DELAYED_WEIGHTS = """
rules:
  - match: {tensor_type: weight}
    quantizer: {format: float8, scaling: delayed, amax_history_len: 4, amax_compute_algo: max,
                margin: 0, share: weights}
  - match: {}
    quantizer: {format: float8, scaling: current}
"""

EXAMPLES = {
    "nvfp4_weights_mxfp8_rest": (nvfp4_weights_mxfp8_rest, NVFP4_WEIGHTS_MXFP8_REST),
    "first_last_high_precision": (first_last_high_precision, FIRST_LAST_HIGH_PRECISION),
    "delayed_weights_only": (delayed_weights_only, DELAYED_WEIGHTS_ONLY),
    "shared_delayed_weights": (shared_delayed_weights, SHARED_DELAYED_WEIGHTS),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_te_example_factory_equals_its_yaml_bit_for_bit(example):
    factory, yaml = EXAMPLES[example]
    from_factory = qrecipe.Recipe.from_factory(factory)
    from_yaml = yaml_recipe(yaml, example)
    got, model = train(from_factory)
    want, _ = train(from_yaml)
    assert_bit_identical(got, want)
    # And the recipe did quantize: not the high-precision run.
    hp, _ = train(qrecipe.Recipe.builtin("none"))
    assert not torch.equal(got[0], hp[0])
    # Every role of every module got the same quantizer both ways (resolved options).
    def described(recipe, *role):
        q = recipe.engine.resolve(*role)
        return None if q is None else q.describe()

    for module in model.modules():
        if isinstance(module, qrecipe.nn.QuantizedModule):
            for gemm in module.gemms():
                for t in ("input", "weight", "grad_output"):
                    role = (module.MODULE_TYPE, t, module.role_name(gemm))
                    assert described(from_factory, *role) == described(from_yaml, *role)


def test_first_and_last_layers_stay_in_high_precision():
    recipe = qrecipe.Recipe.from_factory(first_last_high_precision)
    model = make_model()
    qrecipe.convert(model, recipe=recipe)
    assert model.embed.roles(recipe).all_none and model.head.roles(recipe).all_none
    assert recipe.resolve("layernorm_mlp", "weight", "layers.0.mlp.fc2").startswith("float8")


def test_a_shared_key_keeps_one_scale_for_its_roles():
    import numpy as np
    shared = qrecipe.Recipe.from_factory(shared_delayed_weights)
    own = qrecipe.Recipe.from_factory(delayed_weights_only)
    for recipe in (shared, own):
        train(recipe, steps=1)
        recipe.update_scaling()  # the update the next autocast entry would run
    amaxes = shared.engine.current_amaxes()  # row 0 after the update: zeros
    assert amaxes == [0.0] * 8
    weights = shared.scaling_states()
    assert len(weights) == 8  # embed, 2 x (attn, fc1, fc2), head: one state each ...
    own_states = own.scaling_states()
    step_amaxes = [s["amax_history"][-1] for s in own_states]  # each weight's amax
    assert len(set(step_amaxes)) > 1
    # ... acting as one: the history holds the max over the weights, the scale follows it.
    group = max(step_amaxes)
    for s in weights:
        assert s["amax_history"] == [0.0, 0.0, 0.0, group]
        assert s["scale"] == float(np.float32(448.0) / np.float32(group))
    assert len({s["scale"] for s in own_states}) > 1


def test_a_shared_state_survives_a_checkpoint_bit_for_bit():
    recipe = qrecipe.Recipe.from_factory(shared_delayed_weights)
    train(recipe, steps=2)
    saved = recipe.state_dict()  # saved before the step's update: loading runs it
    assert saved["update_pending"]
    fresh = qrecipe.Recipe.from_factory(shared_delayed_weights)
    fresh.load_state_dict(saved)
    recipe.update_scaling()
    assert fresh.scaling_states() == recipe.scaling_states()
    assert len({s["scale"] for s in fresh.scaling_states()}) == 1


# ---------------------------------------------------------------- QuantizerRole

def test_quantizer_role_is_a_frozen_hashable_value_with_a_family():
    role = QuantizerRole("layernorm_mlp", "weight", "layers.0.mlp.fc1", (128, 32),
                         torch.bfloat16)
    assert str(role) == "layernorm_mlp:weight@layers.0.mlp.fc1"
    assert role == QuantizerRole("layernorm_mlp", "weight", "layers.0.mlp.fc1", (128, 32),
                                 torch.bfloat16)
    assert len({role, QuantizerRole("layernorm_mlp", "weight", "layers.0.mlp.fc1", (128, 32),
                                    torch.bfloat16)}) == 1
    with pytest.raises(Exception):
        role.name = "x"
    assert role.is_a("linear") and role.is_a("layernorm_mlp")
    assert not role.is_a("layernorm_linear")
    assert role.gemms == ("fprop", "dgrad")
    assert QuantizerRole("linear", "input").gemms == ("fprop", "wgrad")
    assert qrecipe.roles.module_types()["grouped_linear"] == "linear"


def test_a_factory_sees_every_role_once_with_its_shape_and_dtype():
    seen = []

    def factory(role):
        seen.append(role)
        return formats.float8()

    recipe = qrecipe.Recipe.from_factory(factory)
    train(recipe, dtype=torch.bfloat16)
    names = {(r.module_type, r.tensor_type, r.name) for r in seen}
    assert len(names) == len(seen) == 3 * 8  # once per role, never per step
    fc1 = next(r for r in seen if r.name == "layers.0.mlp.fc1" and r.tensor_type == "weight")
    assert fc1 == QuantizerRole("layernorm_mlp", "weight", "layers.0.mlp.fc1", (2 * D, D),
                                torch.bfloat16)
    head_in = next(r for r in seen if r.name == "head" and r.tensor_type == "input")
    assert head_in.shape == (None, D) and head_in.module_type == "linear"
    head_dy = next(r for r in seen if r.name == "head" and r.tensor_type == "grad_output")
    assert head_dy.shape == (None, 16)


def test_autocast_takes_a_factory_and_keeps_one_recipe_for_it():
    calls = []

    def factory(role):
        calls.append(role)
        return formats.float8()

    with qrecipe.autocast(factory) as first:
        pass
    with qrecipe.autocast(factory) as second:
        pass
    assert first.recipe is second.recipe
    assert first.recipe.name == f"{__name__}.test_autocast_takes_a_factory_and_keeps_one_" \
        "recipe_for_it.<locals>.factory"
    train(factory)
    n = len(calls)
    train(factory)  # a new model: new names? no, the same names: no new roles
    assert len(calls) == n == 3 * 8


def test_autocast_warns_when_a_new_lambda_is_made_each_step():
    with pytest.warns(qrecipe.RecipeWarning, match="same code as an earlier one"):
        for _ in range(3):
            with qrecipe.autocast(lambda role: None):
                pass


# ---------------------------------------------------------------- bad factory answers

def resolve_error(factory, role=("linear", "weight", "fc")):
    recipe = qrecipe.Recipe.from_factory(factory)
    with pytest.raises(RecipeError) as info:
        recipe.quantizer(*role)
    return str(info.value), info.value


def origin(factory):
    line = factory.__code__.co_firstlineno
    return (f"factory '{__name__}.{factory.__qualname__}' "
            f"(tests/python/test_recipe_factories.py:{line}), role linear:weight@fc")


def yaml_problem(spec_text):
    """The validator's words for `spec_text` as a YAML recipe's defaults, after the location
    and the first part of the key path."""
    problems = qrecipe.Recipe.from_yaml(f"version: 1\ndefaults: {spec_text}\n", "y.yaml",
                                        validate=False).check()
    assert len(problems) == 1
    return re.sub(r"^y\.yaml:\d+:\d+: defaults", "", problems[0])


def returns_a_string(role):
    return "float8"


def returns_a_list(role):
    return [formats.float8()]


def raises(role):
    raise ValueError("no rule for " + role.name)


def unknown_format(role):
    return formats.spec("fp9")


def bad_value(role):
    return formats.float8(scaling="delay")


def unknown_option(role):
    return formats.float8(scalling="current")


def wrong_type(role):
    return formats.float8(margin=0.5, scaling="delayed")


def dict_without_format(role):
    return {"scaling": "current"}


def dict_with_a_list(role):
    return {"format": "float8", "dtype": ["e4m3"]}


def share_without_state(role):
    return formats.float8(share="w")


def share_mismatch(role):
    return formats.delayed(history=4, share="all")  # input e4m3, grad_output e5m2


def test_a_wrong_return_type_names_the_factory_and_the_role():
    for factory, what in ((returns_a_string, "str 'float8'"),
                          (returns_a_list, "list [formats.spec('float8', scaling='current')]")):
        message, _ = resolve_error(factory)
        assert message == (f"{origin(factory)}: the factory returned {what}; a factory returns "
                           "a quantizer spec from qrecipe.formats (formats.float8(), "
                           "formats.mxfp8(), formats.nvfp4(), formats.delayed(), ...), a dict "
                           "such as {'format': 'float8', 'scaling': 'current'}, or None for "
                           "high precision")


def test_a_raising_factory_names_the_factory_and_the_role():
    message, error = resolve_error(raises)
    assert message == f"{origin(raises)}: the factory raised ValueError: no rule for fc"
    assert isinstance(error.__cause__, ValueError)


@pytest.mark.parametrize("factory, spec_text", [
    (unknown_format, "{format: fp9}"),
    (bad_value, "{format: float8, scaling: delay}"),
    (unknown_option, "{format: float8, scalling: current}"),
    (wrong_type, "{format: float8, margin: 0.5, scaling: delayed}"),
])
def test_a_bad_spec_gets_the_yaml_validators_words(factory, spec_text):
    message, _ = resolve_error(factory)
    prefix = f"{origin(factory)}: quantizer"
    assert message.startswith(prefix)
    assert message[len(prefix):].split(" (and ")[0] == yaml_problem(spec_text).split(" (and ")[0]


def test_bad_dicts_and_shares_are_errors_naming_the_role():
    message, _ = resolve_error(dict_without_format)
    assert message == (f"{origin(dict_without_format)}: quantizer: the dict has no 'format' "
                       "key; a quantizer spec names its format, e.g. {'format': 'float8'} or "
                       "{'format': 'none'}")
    message, _ = resolve_error(dict_with_a_list)
    assert message == (f"{origin(dict_with_a_list)}: quantizer.dtype: an option value is a "
                       "bool, int, float, str or a nested spec, got list ['e4m3']")
    message, _ = resolve_error(share_without_state)
    assert message.startswith(f"{origin(share_without_state)}: share: float8{{scaling=current, "
                              "share=w} keeps no scaling state")
    recipe = qrecipe.Recipe.from_factory(share_mismatch)
    recipe.quantizer("linear", "input", "fc")
    with pytest.raises(qrecipe.QrecipeError, match=r"the delayed-scaling state shared as 'all' "
                       r"was made by linear:input@fc float8 .* fp8 max 448, but "
                       r"linear:grad_output@fc float8 asks for it .* fp8 max 57344"):
        recipe.quantizer("linear", "grad_output", "fc")


def test_builders_refuse_what_cannot_be_a_spec():
    with pytest.raises(TypeError, match="formats.hybrid: rowwise must be a spec"):
        formats.hybrid("float8", formats.mxfp8())
    with pytest.raises(TypeError, match="option 'x' of format 'float8': a value is a bool"):
        formats.spec("float8", x=[1])
    with pytest.raises(AttributeError, match="qrecipe.formats has no format 'fp9'; loaded "
                       "formats: .*float8"):
        formats.fp9()
    assert formats.float8().to_dict() == {"format": "float8", "scaling": "current"}
    assert formats.mxfp8() == formats.spec("mxfp8")  # loaded plugins by name too
    assert formats.hybrid(formats.float8(), formats.mxfp8()).to_dict() == {
        "format": "hybrid", "rowwise": {"format": "float8", "scaling": "current"},
        "columnwise": {"format": "mxfp8"}}
    assert formats.delayed(history=16, share="w").to_dict() == {
        "format": "float8", "scaling": "delayed", "amax_history_len": 16,
        "amax_compute_algo": "max", "margin": 0, "share": "w"}
    assert formats.nvfp4(two_d=True).to_dict() == {"format": "nvfp4", "2d": True}


def test_from_factory_refuses_a_non_callable():
    with pytest.raises(TypeError, match="Recipe.from_factory takes a function of a "
                       "QuantizerRole, got str"):
        qrecipe.Recipe.from_factory("recipes:qfactory")


# ---------------------------------------------------------------- YAML rules delegating

def test_a_yaml_rule_delegates_to_an_imported_factory():
    recipe = qrecipe.Recipe.load(f"{qrecipe_source()}/tests/recipes/good_factory_rule.yaml")
    assert recipe.delegates
    assert recipe.rules()[0] == ("{name: layers.0.*}",
                                 "factory recipe_factories_example:first_layer")
    model = make_model()
    qrecipe.convert(model, recipe=recipe)
    assert recipe.resolve("layernorm_linear", "weight", "layers.0.attn").startswith("mxfp8")
    assert recipe.resolve("layernorm_linear", "input", "layers.0.attn") == "none"
    assert recipe.resolve("layernorm_linear", "input", "layers.1.attn").startswith("float8")
    text = recipe.explain(model)
    assert re.search(r"layernorm_linear layers\.0\.attn \[32 -> 32\]:\n  input: none \(high "
                     r"precision\)  <- rules\[0\] \(.*good_factory_rule\.yaml:6:5\) -> factory "
                     r"'recipe_factories_example\.first_layer' \(.*recipe_factories_example\.py"
                     r":\d+\)", text), text
    assert "  weight: mxfp8{dtype=e4m3, block=32, scale=e8m0}  <- rules[0]" in text
    assert re.search(r"linear head \[32 -> 16\]:\n  input: none \(high precision\)  <- "
                     r"rules\[1\]", text), text


def test_a_factory_recipe_explains_every_role_and_where_it_came_from():
    recipe = qrecipe.Recipe.from_factory(first_last_high_precision)
    text = recipe.explain(make_model())
    line = first_last_high_precision.__code__.co_firstlineno
    where = (f"factory '{__name__}.first_last_high_precision' "
             f"(tests/python/test_recipe_factories.py:{line})")
    assert f"linear embed [32 -> 32]:\n  input: none (high precision)  <- {where}" in text
    assert f"layernorm_mlp layers.1.mlp.fc2 [64 -> 32]:\n  input: float8{{" in text
    assert text.count(f"<- {where}") == 3 * 8


def test_a_nested_class_factory_and_its_shape_argument():
    recipe = yaml_recipe("rules:\n  - match: {}\n"
                         "    factory: recipe_factories_example:Factories.by_shape\n")
    assert recipe.plan_linear("linear", "wide", 64, 8, 1)["weight"].format == "nvfp4"
    assert recipe.plan_linear("linear", "narrow", 32, 8, 1)["weight"].format == "float8"


@pytest.mark.parametrize("reference, message", [
    ("no_such_module_xyz:f", "rules[0] (<r>:3:5): factory 'no_such_module_xyz:f': cannot import "
     "module 'no_such_module_xyz' (ModuleNotFoundError: No module named 'no_such_module_xyz'); "
     "the module must be importable where the recipe runs (on sys.path or PYTHONPATH)"),
    ("recipe_factories_example:missing", "rules[0] (<r>:3:5): factory "
     "'recipe_factories_example:missing': module 'recipe_factories_example' ("),
    ("recipe_factories_example:NOT_A_FUNCTION", "rules[0] (<r>:3:5): factory "
     "'recipe_factories_example:NOT_A_FUNCTION': 'NOT_A_FUNCTION' is int 3, not a function of "
     "a role"),
])
def test_a_factory_that_cannot_be_imported_is_an_error_naming_the_rule(reference, message):
    recipe = qrecipe.Recipe.from_yaml(
        f"version: 1\nrules:\n  - match: {{}}\n    factory: {reference}\n", "<r>")
    with pytest.raises(RecipeError) as info:
        recipe.quantizer("linear", "weight", "fc")
    assert str(info.value).startswith(message)


def test_a_delegating_yaml_rule_without_python_is_a_clear_engine_error():
    # The bare C++ recipe (what the CLI has) cannot resolve it.
    recipe = qrecipe.Recipe.load(f"{qrecipe_source()}/tests/recipes/good_factory_rule.yaml")
    with pytest.raises(RecipeError, match=r"rules\[0\] delegates role "
                       r"linear:weight@layers.0.fc to the factory "
                       r"'recipe_factories_example:first_layer', which only an engine with a "
                       r"factory resolver can call"):
        recipe._cpp.resolve("linear", "weight", "layers.0.fc")


def qrecipe_source():
    import pathlib
    return str(pathlib.Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------- check(model)

def test_check_warns_of_rules_matching_nothing_and_near_misses():
    recipe = yaml_recipe("""
rules:
  - match: {name: "layer.*"}
    quantizer: {format: none}
  - match: {module_type: linear, name: "hea"}
    quantizer: {format: mxfp8}
  - match: {module_type: layernorm_mlp}
    quantizer: {format: float8}
""")
    model = make_model()
    with pytest.warns(qrecipe.RecipeWarning) as record:
        findings = recipe.check(model)
    assert findings == [str(w.message).split(": ", 1)[1] for w in record]
    assert findings[0].startswith("rules[0] {name: layer.*} (<yaml>:5:5) matches none of the "
                                  "roles (module types: linear, layernorm_linear, "
                                  "layernorm_mlp; names: embed, layers.0.attn, "
                                  "layers.0.mlp.fc1, layers.0.mlp.fc2, ...)")
    assert findings[1].startswith("rules[1] {module_type: linear, name: hea}")
    assert "linear head: input, weight, grad_output get no quantization (no rule matches them " \
           "and the defaults are none), but rules[1] {module_type: linear, name: hea} " \
           "(<yaml>:7:5) would give them mxfp8 if its name [hea] matched 'head'" in findings[2]
    assert len(findings) == 3


def test_check_of_every_shipped_recipe_on_a_model_is_quiet():
    model = make_model()
    for name in qrecipe.Recipe.builtin_names():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert qrecipe.Recipe.builtin(name).check(model) == [], name


# ---------------------------------------------------------------- module_type: linear

def test_hybrid_seed_quantizes_layernorm_linear_and_layernorm_mlp():
    recipe = qrecipe.Recipe.builtin("hybrid_seed")
    model = make_model()
    qrecipe.convert(model, recipe=recipe)
    for module in (model.layers[0].attn, model.layers[0].mlp, model.embed):
        for gemm, roles in module.resolve_roles(recipe).items():
            for t in ("input", "weight", "grad_output"):
                assert getattr(roles, t) is not None and getattr(roles, t).format == "hybrid", \
                    (module, gemm, t)
    got, _ = train(recipe, steps=1)
    hp, _ = train(qrecipe.Recipe.builtin("none"), steps=1)
    # The blocks' output (before head) is quantized: the model's output differs.
    assert not torch.equal(got[0], hp[0])
    grouped = qrecipe.nn.GroupedLinear(2, D, D, name="moe")
    assert grouped.resolve_roles(recipe)[""].weight.format == "hybrid"


# ---------------------------------------------------------------- FP32 models

@pytest.mark.parametrize("name", qrecipe.Recipe.builtin_names())
def test_every_shipped_recipe_trains_an_fp32_model_or_refuses_it_at_convert(name):
    recipe = qrecipe.Recipe.builtin(name)
    torch.manual_seed(0)
    model = Model(torch.float32)
    try:
        qrecipe.convert(model, recipe=recipe)
    except qrecipe.QrecipeError as error:
        # Only NVFP4's Hadamard transform refuses FP32 (it is defined on bf16).
        assert name == "nvfp4", f"{name}: {error}"
        assert re.search(r"recipe 'nvfp4' cannot train this module in torch.float32 on cpu: "
                         r"its input role \(.*\) gets nvfp4\{.*hadamard=true.*\}, which refuses "
                         r"a torch.float32 tensor: .*needs a bf16 source.*Convert the model to "
                         r"a dtype the format takes \(model.to\(torch.bfloat16\)\)", str(error)), \
            str(error)
        # The same model in bf16 trains.
        train(recipe, dtype=torch.bfloat16, steps=1)
        return
    trace, _ = train(recipe, steps=2)
    assert all(torch.isfinite(t).all() for t in trace)
