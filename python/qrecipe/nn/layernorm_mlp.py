"""``qrecipe.nn.LayerNormMLP``: norm -> fc1 -> activation -> fc2, as TransformerEngine's
module of the same name, with both GEMMs following the recipe.

The norm and the activation run in high precision with torch's ops (torch differentiates
them); each of fc1 and fc2 runs the three quantized GEMMs of a linear layer. Roles:
module_type ``layernorm_mlp``, tensor_type ``input`` / ``weight`` / ``grad_output``, names
``<name>.fc1`` and ``<name>.fc2`` (``fc1`` / ``fc2`` for an unnamed module), so a recipe can
treat the two GEMMs differently (``name: "*.fc2"``). A gated activation (``swiglu``,
``geglu``, ...) makes fc1 produce 2 * ffn_hidden_size features, split into halves a | b and
combined as act(a) * b. Outside ``qrecipe.autocast`` the module equals the same composition
of torch.nn.LayerNorm / RMSNorm, torch.nn.Linear and the activation, bit for bit.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..quantized_param import QuantizedInitMixin
from .base import QuantizedModule, init_linear_parameters, register_linear_parameters
from .normalization import (apply_activation, apply_norm, check_activation,
                            check_normalization, is_gated, make_norm_parameters,
                            reset_norm_parameters)


class LayerNormMLP(QuantizedInitMixin, QuantizedModule):
    """``y = fc2(act(fc1(norm(x))))`` with quantized GEMMs under ``qrecipe.autocast``.

    Parameters (TransformerEngine's names): ``layer_norm_weight`` / ``layer_norm_bias``
    [hidden] (the bias for LayerNorm only), ``fc1_weight`` [ffn (x2 if gated), hidden],
    ``fc1_bias``, ``fc2_weight`` [hidden, ffn], ``fc2_bias`` [hidden]. With
    ``return_layernorm_output=True`` forward returns ``(y, norm(x))``.

    Training-loop options as ``qrecipe.nn.Linear`` (docs/adapter.md):
    ``forward(x, is_first_microbatch=...)`` keeps both quantized weights across
    micro-batches; ``fuse_wgrad_accumulation=True`` accumulates both wgrads into
    ``fc1_weight.main_grad`` / ``fc2_weight.main_grad`` (FP32); under
    ``qrecipe.quantized_model_init`` ``fc1_weight`` and ``fc2_weight`` are created quantized,
    each by its own GEMM's weight role."""

    MODULE_TYPE = "layernorm_mlp"

    def __init__(self, hidden_size: int, ffn_hidden_size: int, bias: bool = True,
                 eps: float = 1e-5, normalization: str = "LayerNorm", activation: str = "gelu",
                 zero_centered_gamma: bool = False, return_layernorm_output: bool = False,
                 device=None, dtype=None, name: Optional[str] = None,
                 fuse_wgrad_accumulation: bool = False):
        super().__init__(name)
        check_normalization(normalization, self._who())
        check_activation(activation, self._who())
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self.eps = eps
        self.normalization = normalization
        self.activation = activation
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        fc1_out = 2 * ffn_hidden_size if is_gated(activation) else ffn_hidden_size
        make_norm_parameters(self, hidden_size, normalization, factory)
        # Registered in TransformerEngine's order (state_dict and parameters() follow it).
        register_linear_parameters(self, "fc1_weight", "fc1_bias", hidden_size, fc1_out, bias,
                                   factory)
        register_linear_parameters(self, "fc2_weight", "fc2_bias", ffn_hidden_size, hidden_size,
                                   bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Norm weight 1 (0 when zero-centered) and bias 0; fc1 then fc2 as torch.nn.Linear
        (Kaiming-uniform weight, uniform bias)."""
        reset_norm_parameters(self.layer_norm_weight, self.layer_norm_bias,
                              self.zero_centered_gamma)
        init_linear_parameters(self.fc1_weight, self.fc1_bias)
        init_linear_parameters(self.fc2_weight, self.fc2_bias)

    def _quantized_weight_roles(self) -> Dict[str, Tuple[str, str, str]]:
        """The weights quantized_model_init quantizes, with the role of each."""
        return {f"{g}_weight": (self.MODULE_TYPE, "weight", self.role_name(g))
                for g in ("fc1", "fc2")}

    def gemms(self) -> Dict[str, Tuple[int, int]]:
        return {"fc1": (self.hidden_size, self.fc1_weight.shape[0]),
                "fc2": (self.ffn_hidden_size, self.hidden_size)}

    def forward(self, x: torch.Tensor, is_first_microbatch: Optional[bool] = None):
        self._check_input(x, self.hidden_size, (self.fc1_weight, self.fc2_weight),
                          what="hidden_size")
        ln_out = apply_norm(x, self.normalization, self.layer_norm_weight, self.layer_norm_bias,
                            self.eps, self.zero_centered_gamma)
        fuse = self.fuse_wgrad_accumulation
        h = self._linear(ln_out, self.fc1_weight, self.fc1_bias, "fc1", is_first_microbatch,
                         fuse)
        y = self._linear(apply_activation(self.activation, h), self.fc2_weight, self.fc2_bias,
                         "fc2", is_first_microbatch, fuse)
        return (y, ln_out) if self.return_layernorm_output else y

    def extra_repr(self) -> str:
        s = (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
             f"bias={self.fc1_bias is not None}, normalization={self.normalization}, "
             f"activation={self.activation}, eps={self.eps}")
        if self.zero_centered_gamma:
            s += ", zero_centered_gamma=True"
        return s + self._name_repr()
