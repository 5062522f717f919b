"""Clear errors for bad inputs: recipe files (with line numbers), dicts, dtypes, shapes."""
import pytest
import torch

import qrecipe


def test_recipe_file_error_names_file_line_and_allowed_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nname: bad\nrules:\n  - match: {tensor_type: weight}\n"
                    "    quantizer: {format: float8, dtyp: e4m3}\n")
    with pytest.raises(qrecipe.RecipeError) as info:
        qrecipe.Recipe.load(path)
    message = str(info.value)
    assert f"{path}:5:" in message and "dtyp" in message and "dtype" in message


def test_recipe_yaml_syntax_error_has_a_location(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("version: 1\nrules: [\n")
    with pytest.raises(qrecipe.RecipeError, match=str(path) + ":"):
        qrecipe.Recipe.load(path)


def test_missing_recipe_file():
    with pytest.raises(qrecipe.QrecipeError, match="cannot open recipe file"):
        qrecipe.Recipe.load("/nonexistent/recipe.yaml")


def test_from_dict_errors_say_dict():
    with pytest.raises(qrecipe.RecipeError, match="<dict>:.*unknown format|<dict>:.*nofmt"):
        qrecipe.Recipe.from_dict({"version": 1, "defaults": {"format": "nofmt"}})
    with pytest.raises(TypeError):
        qrecipe.Recipe.from_dict([1, 2])
    with pytest.raises(TypeError, match="not a string, number"):
        qrecipe.Recipe.from_dict({"version": 1, "defaults": {"format": torch.float32}})


def test_builtin_lists_available_recipes():
    with pytest.raises(ValueError, match="mxfp8"):
        qrecipe.Recipe.builtin("mxfp9")


def test_quantize_rejects_bad_tensors_and_options():
    with pytest.raises(TypeError, match="dtype"):
        qrecipe.quantize(torch.arange(8), "float8")
    with pytest.raises(TypeError, match="torch.Tensor"):
        qrecipe.quantize([1.0, 2.0], "float8")
    with pytest.raises(qrecipe.RecipeError, match="unknown option"):
        qrecipe.quantize(torch.randn(4, 4), "float8", bogus=1)
    with pytest.raises(ValueError, match="usage"):
        qrecipe.quantize(torch.randn(4, 4), "float8", usage="diagonal")
    q = qrecipe.quantize(torch.randn(4, 4), "float8", usage="rowwise")
    with pytest.raises(ValueError, match="columnwise"):
        q.dequantize("columnwise")


def test_linear_input_errors_under_autocast():
    lin = qrecipe.nn.Linear(16, 8, name="fc")
    with qrecipe.autocast():
        with pytest.raises(ValueError, match="'fc'.*in_features=16"):
            lin(torch.randn(4, 12))
        with pytest.raises(TypeError, match="float64"):
            lin.double()(torch.randn(4, 16, dtype=torch.float64))


def test_format_constraints_surface_engine_messages():
    # NVFP4's Hadamard needs bf16 and 16-row multiples: the plugin's message reaches Python.
    lin = qrecipe.nn.Linear(32, 16, dtype=torch.bfloat16)
    x = torch.randn(10, 32, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(qrecipe.QrecipeError, match="multiple of 16"):
        with qrecipe.autocast(qrecipe.Recipe.builtin("nvfp4")):
            lin(x)
