"""``qrecipe.nn.LayerNormLinear``: a LayerNorm or RMSNorm followed by a linear layer whose
GEMMs follow the recipe, as TransformerEngine's module of the same name.

The norm runs in high precision with torch's ops (torch differentiates it); its output is the
GEMM's input and is quantized by the input role. Roles: module_type ``layernorm_linear``,
tensor_type ``input`` / ``weight`` / ``grad_output``, name = the module's name. Outside
``qrecipe.autocast`` (or when the recipe gives all three roles format ``none``) the module is
``F.linear(norm(x), weight, bias)``: bit-identical to torch.nn.LayerNorm / RMSNorm followed
by torch.nn.Linear.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..quantized_param import QuantizedInitMixin
from .base import QuantizedModule, init_linear_parameters, register_linear_parameters
from .normalization import (apply_norm, check_normalization, make_norm_parameters,
                            reset_norm_parameters)


class LayerNormLinear(QuantizedInitMixin, QuantizedModule):
    """``y = norm(x) W^T + b`` with quantized GEMMs under ``qrecipe.autocast``.

    Parameters (TransformerEngine's names): ``layer_norm_weight`` [in], ``layer_norm_bias``
    [in] (LayerNorm only), ``weight`` [out, in], ``bias`` [out]. With
    ``return_layernorm_output=True`` forward returns ``(y, norm(x))``.

    Training-loop options as ``qrecipe.nn.Linear`` (docs/adapter.md):
    ``forward(x, is_first_microbatch=...)`` keeps the quantized weight across micro-batches;
    ``fuse_wgrad_accumulation=True`` accumulates wgrad into ``weight.main_grad`` (FP32);
    under ``qrecipe.quantized_model_init`` ``weight`` is created quantized (the norm
    parameters and the bias stay high precision)."""

    MODULE_TYPE = "layernorm_linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 eps: float = 1e-5, normalization: str = "LayerNorm",
                 zero_centered_gamma: bool = False, return_layernorm_output: bool = False,
                 device=None, dtype=None, name: Optional[str] = None,
                 fuse_wgrad_accumulation: bool = False):
        super().__init__(name)
        check_normalization(normalization, self._who())
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.eps = eps
        self.normalization = normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        make_norm_parameters(self, in_features, normalization, factory)
        register_linear_parameters(self, "weight", "bias", in_features, out_features, bias,
                                   factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Norm weight 1 (0 when zero-centered) and bias 0; the linear part as
        torch.nn.Linear (Kaiming-uniform weight, uniform bias)."""
        reset_norm_parameters(self.layer_norm_weight, self.layer_norm_bias,
                              self.zero_centered_gamma)
        init_linear_parameters(self.weight, self.bias)

    def gemms(self) -> Dict[str, Tuple[int, int]]:
        return {"": (self.in_features, self.out_features)}

    def forward(self, x: torch.Tensor, is_first_microbatch: Optional[bool] = None):
        self._check_input(x, self.in_features, (self.weight,))
        ln_out = apply_norm(x, self.normalization, self.layer_norm_weight, self.layer_norm_bias,
                            self.eps, self.zero_centered_gamma)
        y = self._linear(ln_out, self.weight, self.bias, "", is_first_microbatch,
                         self.fuse_wgrad_accumulation)
        return (y, ln_out) if self.return_layernorm_output else y

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, "
             f"bias={self.bias is not None}, normalization={self.normalization}, eps={self.eps}")
        if self.zero_centered_gamma:
            s += ", zero_centered_gamma=True"
        return s + self._name_repr()
