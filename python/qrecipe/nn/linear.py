"""``qrecipe.nn.Linear``: a drop-in ``torch.nn.Linear`` whose GEMMs follow the recipe.

Outside ``qrecipe.autocast`` (or when the recipe gives all three roles format ``none``) it
calls ``torch.nn.functional.linear``, so it is bit-identical to ``torch.nn.Linear``. Inside,
it resolves its roles once per recipe (module_type ``linear``, tensor_type ``input`` /
``weight`` / ``grad_output``, name = its dotted path) and runs the quantized GEMMs of
``linear_function``. Roles, ``explain``, input checks, copying and the scaling state come
from the shared base ``QuantizedModule`` (base.py), as for every qrecipe module.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..quantized_param import QuantizedInitMixin
from .base import QuantizedModule, init_linear_parameters, register_linear_parameters


class Linear(QuantizedInitMixin, QuantizedModule):
    """``y = x W^T + b`` with quantized GEMMs under ``qrecipe.autocast``.

    ``name`` is the module's dotted path used by recipe rules (``qrecipe.convert`` sets it
    from the model; set it yourself for modules you build directly). ``roles(recipe)`` gives
    the quantizers of its three roles (resolved once per recipe), ``explain(recipe)`` prints
    them and how each GEMM runs (``QuantizedModule``).

    Training-loop options (docs/adapter.md): ``forward(x, is_first_microbatch=...)`` keeps
    the quantized weight across micro-batches; ``fuse_wgrad_accumulation=True`` accumulates
    wgrad into ``weight.main_grad`` (FP32) instead of ``weight.grad``; the delayed-scaling
    state of the layer's roles travels in ``state_dict()``; under
    ``qrecipe.quantized_model_init`` the weight is created quantized (``QuantizedInitMixin``)."""

    MODULE_TYPE = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None, name: Optional[str] = None,
                 fuse_wgrad_accumulation: bool = False):
        super().__init__(name)
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        register_linear_parameters(self, "weight", "bias", in_features, out_features, bias,
                                   factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initialisation of torch.nn.Linear (Kaiming-uniform weight, uniform bias)."""
        init_linear_parameters(self.weight, self.bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, name: str = "") -> "Linear":
        """A qrecipe Linear sharing `linear`'s Parameter objects (no copy)."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                     device="meta", name=name)
        module.weight = linear.weight
        module.bias = linear.bias
        module.train(linear.training)
        return module

    def gemms(self) -> Dict[str, Tuple[int, int]]:
        return {"": (self.in_features, self.out_features)}

    def forward(self, x: torch.Tensor,
                is_first_microbatch: Optional[bool] = None) -> torch.Tensor:
        self._check_input(x, self.in_features, (self.weight,))
        return self._linear(x, self.weight, self.bias, "", is_first_microbatch,
                            self.fuse_wgrad_accumulation)

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, "
             f"bias={self.bias is not None}")
        return s + self._name_repr()
