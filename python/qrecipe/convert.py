"""``qrecipe.convert``: swap a model's ``torch.nn.Linear`` layers for ``qrecipe.nn.Linear``
in place, keeping the same Parameter objects and naming each layer, and every qrecipe module
already in the model (LayerNormLinear, LayerNormMLP, GroupedLinear, ...), by its module
path."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .recipe import RecipeLike, as_recipe
from .nn.base import QuantizedModule
from .nn.linear import Linear

FilterFn = Callable[[str, torch.nn.Module], bool]


def convert(model: torch.nn.Module, recipe: RecipeLike = None,
            filter_fn: Optional[FilterFn] = None) -> torch.nn.Module:
    """Replaces every ``torch.nn.Linear`` (exactly that class; subclasses such as
    MultiheadAttention's out_proj are left alone) for which ``filter_fn(name, module)`` is
    true. Parameters are shared, not copied, so an optimizer built before the call still
    updates them. Existing qrecipe modules (every ``qrecipe.nn.QuantizedModule``: Linear,
    LayerNormLinear, LayerNormMLP, GroupedLinear) without a name get their path; filter_fn
    does not apply to them (they are already qrecipe's).

    ``recipe`` (a Recipe, a path, a dict): when given, every converted layer resolves its
    roles and plans its GEMMs under it now (every GEMM of every qrecipe module, converted or
    already there), so a recipe that cannot serve a layer fails here
    rather than at the first step. Returns the model (a new module when `model` itself is an
    ``nn.Linear``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"convert takes a torch.nn.Module, got {type(model).__name__}")
    checked = as_recipe(recipe) if recipe is not None else None

    def wanted(name: str, module: torch.nn.Module) -> bool:
        return type(module) is torch.nn.Linear and (filter_fn is None or filter_fn(name, module))

    def finish(name: str, module: torch.nn.Module) -> torch.nn.Module:
        if not module.name:
            module.name = name
        if checked is not None:
            module.resolve_roles(checked)
        return module

    if wanted("", model):
        return finish("", Linear.from_linear(model, ""))
    for path, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{path}.{child_name}" if path else child_name
            if wanted(full, child):
                setattr(parent, child_name, finish(full, Linear.from_linear(child, full)))
            elif isinstance(child, QuantizedModule):
                finish(full, child)
    return model
