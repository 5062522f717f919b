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
  quantized_param  QuantizedWeight and quantized_model_init (parameters stored quantized)
  nn            modules Linear, LayerNormLinear (LayerNorm / RMSNorm + Linear), LayerNormMLP
                (norm -> fc1 -> GELU / SwiGLU / ... -> fc2), GroupedLinear (MoE experts in
                one grouped parameter), their base QuantizedModule and autograd functions
  convert       convert(): nn.Linear -> qrecipe.nn.Linear in place; names every qrecipe
                module by its path
  checkpointing checkpoint(): activation checkpointing whose recomputation replays the
                forward's recipe
"""
from ._engine import QrecipeError, RecipeError, _C
from .autocasting import autocast, current_recipe, is_enabled
from .checkpointing import checkpoint
from .convert import convert
from .quantization import QuantizedTensor, Quantizer, quantize
from .recipe import Recipe
from . import nn
from .nn.module_state import drop_scaling_states
from .quantized_param import QuantizedWeight, quantized_model_init

QuantizedParameter = QuantizedWeight  # the name DESIGN.md section 8 also uses

__version__ = "0.1.0"


def plugins():
    """The format plugins the engine loaded (name, version, path, devices)."""
    return [dict(p) for p in _C.plugins()]


__all__ = [
    "checkpoint",
    "QrecipeError", "RecipeError", "Recipe", "autocast", "current_recipe", "is_enabled",
    "convert", "quantize", "QuantizedTensor", "Quantizer", "nn", "plugins", "__version__",
    "drop_scaling_states", "QuantizedWeight", "QuantizedParameter", "quantized_model_init",
]
