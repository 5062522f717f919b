"""Hostile input through the Python adapter (issue 19): broken plugin files on the search path,
recipes built from any Unicode, recipes that would fail at first use, corrupt checkpoints and
empty tensors with many rows. Each gives a result or a clear error, never a crash or a hang."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import qrecipe

PLUGIN_DIR = pathlib.Path(qrecipe.plugins()[0]["path"]).parent


def run_python(code, plugin_path):
    """Runs `code` in a fresh interpreter whose plugin search path starts with `plugin_path`
    (the registry is made once per process). The timeout only turns a hang into a failure."""
    env = dict(os.environ, QRECIPE_PLUGIN_PATH=f"{plugin_path}:{PLUGIN_DIR}",
               PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


LIST_PLUGINS = """
    import qrecipe
    names = sorted(p["name"] for p in qrecipe.plugins())
    assert "float8" in names, names
    for path, cause in qrecipe._C.plugin_failures():
        print(path, "->", cause)
"""


def test_truncated_plugin_is_listed_not_fatal(tmp_path):
    whole = (PLUGIN_DIR / "libqrecipe_float8.so").read_bytes()
    (tmp_path / "libqrecipe_x.so").write_bytes(whole[:4096])
    result = run_python(LIST_PLUGINS, tmp_path)
    assert result.returncode == 0, result.stderr  # was -7 (SIGBUS) inside dlopen
    assert "libqrecipe_x.so -> truncated" in result.stdout, result.stdout


def test_fifo_plugin_is_listed_not_waited_for(tmp_path):
    os.mkfifo(tmp_path / "libqrecipe_x.so")
    result = run_python(LIST_PLUGINS, tmp_path)  # was: blocked forever opening the FIFO
    assert result.returncode == 0, result.stderr
    assert "libqrecipe_x.so -> not a regular file (a FIFO)" in result.stdout, result.stdout


@pytest.mark.parametrize("text", ["emoji \U0001F600", "ideograph \U00020000",
                                  "mixed \u00e9\u4e2d\U0001F680 and a \"quote\""])
def test_from_dict_takes_any_unicode(text):
    recipe = qrecipe.Recipe.from_dict({"version": 1, "name": text, "description": text,
                                       "defaults": {"format": "none"},
                                       "rules": [{"match": {"name": text},
                                                  "quantizer": {"format": "float8"}}]})
    assert recipe.name == text
    assert recipe.resolve("linear", "input", text) != "none"
    assert recipe.resolve("linear", "input", "other") == "none"


def test_from_dict_refuses_a_lone_surrogate_clearly():
    with pytest.raises(ValueError, match=r"not valid Unicode.*\\ud800"):
        qrecipe.Recipe.from_dict({"version": 1, "name": "bad \ud800"})


def test_recipe_that_fails_at_first_use_fails_at_construction():
    with pytest.raises(qrecipe.RecipeError,
                       match=r"<dict>:\d+:\d+: defaults: .*amax_history_len' only applies to "
                             r"scaling: delayed"):
        qrecipe.Recipe.from_dict({"version": 1, "defaults": {"format": "float8",
                                                             "amax_history_len": 16}})
    recipe = qrecipe.Recipe.from_dict(
        {"version": 1, "defaults": {"format": "nvfp4", "seed": 3}}, validate=False)
    problems = recipe.check()
    assert len(problems) == 1 and "stochastic_rounding" in problems[0]


# ---------------------------------------------------------------- checkpoints

def delayed_model_state():
    model = qrecipe.convert(torch.nn.Sequential(torch.nn.Linear(16, 16)))
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "d", "defaults": {"format": "float8", "scaling": "delayed",
                                                 "amax_history_len": 4}})
    with qrecipe.autocast(recipe):
        model(torch.randn(8, 16)).sum().backward()
    return model, recipe, model.state_dict()


def fresh_model():
    return qrecipe.convert(torch.nn.Sequential(torch.nn.Linear(16, 16)))


@pytest.mark.parametrize("key,value,message", [
    ("scale", float("nan"), "scale is nan"),
    ("scale", float("inf"), "scale is inf"),
    ("scale", 0.0, "scale is 0"),
    ("scale", -1.0, "scale is -1"),
    ("scale_inv", 0.25, r"scale_inv is 0.25 but 1/scale is 1"),
    ("amax_history", torch.full((4,), float("nan")), r"amax_history\[0\] is nan"),
])
def test_corrupt_scaling_values_are_refused(key, value, message):
    _, _, state = delayed_model_state()
    state["0._extra_state"]["entries"][0]["scaling_states"][0][key] = value
    model = fresh_model()
    with pytest.raises(qrecipe.QrecipeError, match=message):
        model.load_state_dict(state)
        with qrecipe.autocast(qrecipe.Recipe.from_dict({
                "version": 1, "name": "d", "defaults": {"format": "float8", "scaling": "delayed",
                                                         "amax_history_len": 4}})):
            model(torch.randn(8, 16))


@pytest.mark.parametrize("corrupt,message", [
    (lambda s: s.pop("scale"), r"scaling_states\[0\].*no 'scale' entry"),
    (lambda s: s.pop("owner"), r"scaling_states\[0\].*no 'owner' entry"),
    (lambda s: s.update(amax_history="1,2,3,4"),
     r"scaling_states\[0\]\.amax_history has type str; expected"),
    (lambda s: s.update(scale="1.0"), r"scaling_states\[0\]\.scale has type str; expected"),
    (lambda s: s.update(amax_history=torch.zeros(2, 2, 1)),
     r"scaling_states\[0\]\.amax_history .*1-D"),
])
def test_corrupt_checkpoint_structure_names_the_key(corrupt, message):
    model, recipe, state = delayed_model_state()
    corrupt(state["0._extra_state"]["entries"][0]["scaling_states"][0])
    with pytest.raises(ValueError, match=message):
        recipe.load_state_dict({"recipe": "d", "update_pending": False,
                                "scaling_states": state["0._extra_state"]["entries"][0][
                                    "scaling_states"]})
    with pytest.raises(ValueError, match=message):
        model.load_state_dict(state)


@pytest.mark.parametrize("corrupt,message", [
    (lambda e: e.update(entries="x"), r"entries has type str; expected a list"),
    (lambda e: e.update(entries=[5]), r"entries\[0\] has type int; expected a dict"),
    (lambda e: e["entries"][0].update(scaling_states=7),
     r"entries\[0\]\.scaling_states has type int; expected a list"),
])
def test_corrupt_extra_state_names_the_key(corrupt, message):
    _, _, state = delayed_model_state()
    corrupt(state["0._extra_state"])
    with pytest.raises(ValueError, match=message):
        fresh_model().load_state_dict(state)


# ---------------------------------------------------------------- empty tensors

@pytest.mark.parametrize("format", ["float8", "mxfp8", "nvfp4", "blockwise"])
def test_empty_tensor_with_many_rows_returns_at_once(format):
    # No data: the work must not grow with the 2^40 rows (it ran for minutes).
    q = qrecipe.quantize(torch.empty(2**40, 0), format)
    assert q.shape == (2**40, 0)
    assert q.dequantize().shape == (2**40, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("format", ["float8", "mxfp8", "nvfp4", "blockwise"])
def test_empty_tensor_with_many_rows_returns_at_once_on_cuda(format):
    # The kernels' grids must not grow with the rows of an empty tensor either.
    q = qrecipe.quantize(torch.empty(2**40, 0, device="cuda"), format)
    assert q.shape == (2**40, 0)
    assert q.dequantize().shape == (2**40, 0)
    torch.cuda.synchronize()
