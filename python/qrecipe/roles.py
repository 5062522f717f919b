"""``qrecipe.QuantizerRole``: who consumes a tensor, as a recipe factory sees it, and the roles
a model's modules have (docs/recipes.md, "Roles" and "Recipes in Python").

A role is ``module_type:tensor_type@name`` in the engine (``linear:weight@layers.0.fc1``). A
factory gets more: the shape of the tensor as far as it is known when roles are resolved
(``None`` for the token dimension) and the dtype of the module's parameters, so it can decide
by shape or precision. Module types form families (``_C.module_types()``, from the engine's
table): ``role.is_a("linear")`` is true for every linear-like GEMM, as TransformerEngine
calls all of them ``linear``.

Ground floor: imports only the extension and torch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch

from ._engine import _C

TENSOR_TYPES = ("input", "weight", "grad_output")

# Which GEMMs of y = x W^T each tensor type feeds (docs/recipes.md "Hybrid recipes").
_GEMMS = {"input": ("fprop", "wgrad"), "weight": ("fprop", "dgrad"),
          "grad_output": ("dgrad", "wgrad")}

# module type -> its family ("" for a family's own name), the engine's table.
_FAMILY: Dict[str, str] = dict(_C.module_types())


def module_types() -> Dict[str, str]:
    """The module types qrecipe's modules use, each with its family (``""`` for a family's own
    name): ``{"linear": "", "layernorm_linear": "linear", ...}``."""
    return dict(_FAMILY)


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """A tensor entering a GEMM, as recipe factories receive it. Frozen and hashable.

    - ``module_type``: ``linear``, ``layernorm_linear``, ``layernorm_mlp`` or
      ``grouped_linear`` (qrecipe's modules); test ``role.is_a("linear")`` for all of them.
    - ``tensor_type``: ``input``, ``weight`` or ``grad_output``.
    - ``name``: the module's dotted path; LayerNormMLP's GEMMs add ``.fc1`` / ``.fc2``.
    - ``shape``: the tensor's 2-D shape with ``None`` for the token dimension: weight
      ``(out_features, in_features)``, input ``(None, in_features)``, grad_output
      ``(None, out_features)``; ``None`` when the role is resolved without a module.
    - ``dtype``: the module's parameter dtype (``torch.bfloat16``, ...) or ``None``.
    """

    module_type: str
    tensor_type: str
    name: str = ""
    shape: Optional[Tuple[Optional[int], int]] = None
    dtype: Optional[torch.dtype] = None

    def is_a(self, module_type: str) -> bool:
        """Whether ``module_type`` is this role's module type or its family:
        ``QuantizerRole("layernorm_mlp", "weight").is_a("linear")`` is True, as a recipe rule
        ``module_type: linear`` matches it."""
        return bool(_C.module_type_covers(module_type, self.module_type))

    @property
    def gemms(self) -> Tuple[str, ...]:
        """The GEMMs this tensor feeds: input ``("fprop", "wgrad")``, weight ``("fprop",
        "dgrad")``, grad_output ``("dgrad", "wgrad")``."""
        return _GEMMS.get(self.tensor_type, ())

    def __str__(self) -> str:
        return f"{self.module_type}:{self.tensor_type}@{self.name}"


def tensor_shape(tensor_type: str, in_features: int,
                 out_features: int) -> Tuple[Optional[int], int]:
    """The role shape of a tensor of a linear layer (``None`` for the token dimension)."""
    if tensor_type == "weight":
        return (out_features, in_features)
    return (None, in_features if tensor_type == "input" else out_features)


# ---------------------------------------------------------------- resolution context
class _Context(threading.local):
    def __init__(self) -> None:
        self.stack: List[Tuple[int, int, Optional[torch.dtype]]] = []


_context = _Context()


@contextlib.contextmanager
def resolving(in_features: int, out_features: int, dtype: Optional[torch.dtype]) -> Iterator[None]:
    """What the roles resolved inside the block know beyond their names (their GEMM's features
    and the module's dtype): Recipe.plan_linear wraps the engine's resolution in it, so a
    factory called from inside the engine gets a full QuantizerRole."""
    _context.stack.append((in_features, out_features, dtype))
    try:
        yield
    finally:
        _context.stack.pop()


def role_in_context(module_type: str, tensor_type: str, name: str) -> QuantizerRole:
    """The QuantizerRole of an engine role, with the shape and dtype of the innermost
    ``resolving`` block (none outside one)."""
    if not _context.stack:
        return QuantizerRole(module_type, tensor_type, name)
    in_features, out_features, dtype = _context.stack[-1]
    return QuantizerRole(module_type, tensor_type, name,
                         tensor_shape(tensor_type, in_features, out_features), dtype)


# ---------------------------------------------------------------- a model's roles
class ModuleGemm(NamedTuple):
    """One GEMM of a model's module, as the roles of its three tensors are named."""
    path: str            # the module's path in the model
    module_type: str
    name: str            # the roles' name (the module's name, plus ".fc1" etc.)
    in_features: int
    out_features: int
    dtype: Optional[torch.dtype]
    device: Optional[torch.device]
    module: torch.nn.Module
    gemm: str            # the module's key of this GEMM ("" for a single GEMM)


def _parameter_of(module: torch.nn.Module) -> Optional[torch.Tensor]:
    for p in module.parameters(recurse=False):
        if p.is_floating_point():
            return p
    return None


def model_gemms(model: torch.nn.Module) -> List[ModuleGemm]:
    """Every GEMM of `model` a recipe decides: each qrecipe module's GEMMs (any module with
    ``MODULE_TYPE``, ``gemms()`` and ``role_name()``) and each plain ``torch.nn.Linear``, which
    ``qrecipe.convert`` turns into a ``linear`` module. A module without a name is reported
    under the name ``qrecipe.convert`` gives it (its path)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    out: List[ModuleGemm] = []
    for path, module in model.named_modules():
        p = _parameter_of(module)
        dtype = p.dtype if p is not None else None
        device = p.device if p is not None else None
        module_type = getattr(module, "MODULE_TYPE", None)
        if module_type and callable(getattr(module, "gemms", None)) \
                and callable(getattr(module, "role_name", None)):
            for gemm, (in_features, out_features) in module.gemms().items():
                if getattr(module, "name", ""):
                    name = module.role_name(gemm)
                else:
                    name = f"{path}.{gemm}" if path and gemm else (path or gemm)
                out.append(ModuleGemm(path, module_type, name, in_features, out_features,
                                      dtype, device, module, gemm))
        elif type(module) is torch.nn.Linear:
            out.append(ModuleGemm(path, "linear", path, module.in_features,
                                  module.out_features, dtype, device, module, ""))
    return out
