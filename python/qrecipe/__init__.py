"""qrecipe: low-precision (FP8 / FP4) training for PyTorch, driven by a recipe.

    import qrecipe
    model = qrecipe.convert(model)                 # nn.Linear -> qrecipe.nn.Linear
    with qrecipe.autocast(qrecipe.Recipe.load("recipes/mxfp8.yaml")):
        loss = loss_fn(model(x), y)
    loss.backward()

See docs/adapter.md. Modules of the package, one responsibility each:
  recipe        Recipe: load / validate a recipe; owns its engine and scaling state
  autocasting   autocast: the active recipe and the once-per-step scaling update
  quantization  quantize(), Quantizer, QuantizedTensor (inspection of bytes and scales)
  nn            modules (Linear) and their autograd functions
  convert       convert(): nn.Linear -> qrecipe.nn.Linear in place
"""
from ._engine import QrecipeError, RecipeError, _C
from .autocasting import autocast, current_recipe, is_enabled
from .convert import convert
from .quantization import QuantizedTensor, Quantizer, quantize
from .recipe import Recipe
from . import nn

__version__ = "0.1.0"


def plugins():
    """The format plugins the engine loaded (name, version, path, devices)."""
    return [dict(p) for p in _C.plugins()]


__all__ = [
    "QrecipeError", "RecipeError", "Recipe", "autocast", "current_recipe", "is_enabled",
    "convert", "quantize", "QuantizedTensor", "Quantizer", "nn", "plugins", "__version__",
]
