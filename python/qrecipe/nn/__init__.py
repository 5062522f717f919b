"""qrecipe.nn: torch.nn modules whose GEMMs follow the active recipe.

Implemented: Linear. Not yet: LayerNormLinear, LayerNormMLP, GroupedLinear (docs/adapter.md).
"""
from .linear import Linear

__all__ = ["Linear"]
