"""``qrecipe.nn.Linear``: a drop-in ``torch.nn.Linear`` whose GEMMs follow the recipe.

Outside ``qrecipe.autocast`` (or when the recipe gives all three roles format ``none``) it
calls ``torch.nn.functional.linear``, so it is bit-identical to ``torch.nn.Linear``. Inside,
it resolves its roles once per recipe (module_type ``linear``, tensor_type ``input`` /
``weight`` / ``grad_output``, name = its dotted path) and runs the quantized GEMMs of
``linear_function``.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
import torch.nn.functional as F

from .. import autocasting as _autocast
from ..quantization import SUPPORTED_DTYPES
from ..quantized_param import QuantizedInitMixin
from ..recipe import Recipe
from .linear_function import LinearRoles, quantized_linear
from .module_state import ScalingStateMixin


class Linear(ScalingStateMixin, QuantizedInitMixin, torch.nn.Module):
    """``y = x W^T + b`` with quantized GEMMs under ``qrecipe.autocast``.

    ``name`` is the module's dotted path used by recipe rules (``qrecipe.convert`` sets it
    from the model; set it yourself for modules you build directly).

    Training-loop options (docs/adapter.md): ``forward(x, is_first_microbatch=...)`` keeps
    the quantized weight across micro-batches; ``fuse_wgrad_accumulation=True`` accumulates
    wgrad into ``weight.main_grad`` (FP32) instead of ``weight.grad``; the delayed-scaling
    state of the layer's roles travels in ``state_dict()`` (``ScalingStateMixin``); under
    ``qrecipe.quantized_model_init`` the weight is created quantized (``QuantizedInitMixin``)."""

    MODULE_TYPE = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None, name: Optional[str] = None,
                 fuse_wgrad_accumulation: bool = False):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.name = name or ""
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self._roles: "weakref.WeakKeyDictionary[Recipe, LinearRoles]" = weakref.WeakKeyDictionary()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initialisation of torch.nn.Linear (Kaiming-uniform weight, uniform bias)."""
        if self.weight.is_meta:
            return
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, name: str = "") -> "Linear":
        """A qrecipe Linear sharing `linear`'s Parameter objects (no copy)."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                     device="meta", name=name)
        module.weight = linear.weight
        module.bias = linear.bias
        module.train(linear.training)
        return module

    # The role cache holds engine objects: never copied or pickled (a copy re-resolves).
    def __getstate__(self):
        state = super().__getstate__().copy()
        state["_roles"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._roles = weakref.WeakKeyDictionary()

    # ---------------------------------------------------------------- roles
    def roles(self, recipe: Recipe, tokens: int = 1) -> LinearRoles:
        """The quantizers `recipe` gives this layer (cached per recipe and name). Planning the
        three GEMMs here reports a quantizer that cannot serve a GEMM before the first step."""
        cached = self._roles.get(recipe)
        if cached is not None and cached.plan["name"] == self.name:
            return cached
        plan = dict(recipe.engine.plan_linear(self.MODULE_TYPE, self.name, self.in_features,
                                              self.out_features, max(1, tokens)))
        roles = LinearRoles(input=plan.pop("input"), weight=plan.pop("weight"),
                            grad_output=plan.pop("grad_output"),
                            plan={**plan, "name": self.name, "out_features": self.out_features})
        self._roles[recipe] = roles
        self._apply_loaded_scaling(recipe)  # scaling state from load_state_dict, if any
        return roles

    def explain(self, recipe: Optional[Recipe] = None) -> str:
        """Which quantizer each role gets and how each GEMM runs (on the CPU)."""
        recipe = _autocast.as_recipe(recipe)
        r = self.roles(recipe)
        lines = [f"{self.MODULE_TYPE} {self.name or '<unnamed>'} under recipe {recipe.name}:"]
        for role in ("input", "weight", "grad_output"):
            q = getattr(r, role)
            lines.append(f"  {role:<12} {'none' if q is None else q.describe()}")
        for gemm in ("fprop", "dgrad", "wgrad"):
            lines.append(f"  {gemm:<12} {r.plan[gemm]}")
        return "\n".join(lines)

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor,
                is_first_microbatch: Optional[bool] = None) -> torch.Tensor:
        recipe = _autocast.current_recipe()
        if recipe is None:
            return F.linear(x, self.weight, self.bias)
        self._check_input(x)
        tokens = x.numel() // self.in_features if self.in_features else 0
        roles = self.roles(recipe, tokens)
        if roles.all_none:
            return F.linear(x, self.weight, self.bias)
        _autocast.note_step_activity(recipe)
        return quantized_linear(x, self.weight, self.bias, roles,
                                is_first_microbatch=is_first_microbatch,
                                fuse_wgrad_accumulation=self.fuse_wgrad_accumulation,
                                who=f"qrecipe.nn.Linear {self.name!r}")

    def _check_input(self, x: torch.Tensor) -> None:
        who = f"qrecipe.nn.Linear {self.name!r}" if self.name else "qrecipe.nn.Linear"
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{who}: input of shape {tuple(x.shape)} does not end in "
                             f"in_features={self.in_features}")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{who}: input dtype {x.dtype} is not supported under "
                            "qrecipe.autocast; use float32, bfloat16 or float16")
        if self.weight.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{who}: weight dtype {self.weight.dtype} is not supported; use "
                            "float32, bfloat16 or float16")

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, "
             f"bias={self.bias is not None}")
        return s + (f", name={self.name!r}" if self.name else "")
