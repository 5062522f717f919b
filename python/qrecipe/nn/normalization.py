"""The normalizations and activations of ``LayerNormLinear`` and ``LayerNormMLP``, in high
precision with torch's own ops (torch's autograd differentiates them).

Normalization (TransformerEngine's names and parameters):
  "LayerNorm"  F.layer_norm(x, gamma, beta, eps)       parameters layer_norm_weight, _bias
  "RMSNorm"    F.rms_norm(x, gamma, eps)               parameter  layer_norm_weight
With ``zero_centered_gamma`` the stored weight is gamma - 1 (initialised to 0) and the norm
uses ``1 + weight``, formed in FP32; then the whole norm runs in FP32 and rounds once to the
input's dtype (as TransformerEngine's kernels do), so a small weight is not lost in
``1 + weight`` rounded to BF16. Without it the norm is exactly torch's op on the module's
parameters, so the module equals its torch.nn.LayerNorm / RMSNorm composition bit for bit.

Activations (TransformerEngine's set; a gated one splits fc1's output [.., 2*ffn] into halves
a | b and returns act(a) * b):
  gelu  geglu    GELU, tanh approximation (TransformerEngine's; torch.nn.GELU's default is erf)
  qgelu qgeglu   quick GELU a * sigmoid(1.702 a)
  relu  reglu    ReLU
  srelu sreglu   squared ReLU relu(a)^2
  silu  swiglu   SiLU a * sigmoid(a)
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(normalization: str, who: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{who}: normalization {normalization!r} is not known; expected "
                         f"{' or '.join(repr(n) for n in NORMALIZATIONS)}")


def make_norm_parameters(module: torch.nn.Module, size: int, normalization: str,
                         factory: dict) -> None:
    """Registers layer_norm_weight (and layer_norm_bias for LayerNorm) on `module`."""
    module.layer_norm_weight = torch.nn.Parameter(torch.empty(size, **factory))
    if normalization == "LayerNorm":
        module.layer_norm_bias = torch.nn.Parameter(torch.empty(size, **factory))
    else:
        module.register_parameter("layer_norm_bias", None)


def reset_norm_parameters(weight: torch.Tensor, bias: Optional[torch.Tensor],
                          zero_centered_gamma: bool) -> None:
    """gamma = 1 (stored as 0 when zero-centered), beta = 0."""
    if weight.is_meta:
        return
    (torch.nn.init.zeros_ if zero_centered_gamma else torch.nn.init.ones_)(weight)
    if bias is not None:
        torch.nn.init.zeros_(bias)


def _rms_norm(x: torch.Tensor, shape, weight: Optional[torch.Tensor],
              eps: float) -> torch.Tensor:
    """torch's F.rms_norm where it exists (torch >= 2.4); before, the same formula in FP32
    (feature-detected, not pinned: docs/adapter.md)."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, shape, weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float() if weight is not None else y).to(x.dtype)


def apply_norm(x: torch.Tensor, normalization: str, weight: torch.Tensor,
               bias: Optional[torch.Tensor], eps: float,
               zero_centered_gamma: bool) -> torch.Tensor:
    shape = (x.shape[-1],)
    if zero_centered_gamma:
        gamma = weight.float() + 1.0
        beta = bias.float() if bias is not None else None
        xf = x.float()
        if normalization == "LayerNorm":
            y = F.layer_norm(xf, shape, gamma, beta, eps)
        else:
            y = _rms_norm(xf, shape, gamma, eps)
        return y.to(x.dtype)
    if normalization == "LayerNorm":
        return F.layer_norm(x, shape, weight, bias, eps)
    return _rms_norm(x, shape, weight, eps)


def _quick_gelu(a: torch.Tensor) -> torch.Tensor:
    return a * torch.sigmoid(1.702 * a)


def _squared_relu(a: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(a))


def _gelu_tanh(a: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh")


# name -> (elementwise function, gated)
ACTIVATIONS: Dict[str, Tuple[Callable[[torch.Tensor], torch.Tensor], bool]] = {
    "gelu": (_gelu_tanh, False), "geglu": (_gelu_tanh, True),
    "qgelu": (_quick_gelu, False), "qgeglu": (_quick_gelu, True),
    "relu": (F.relu, False), "reglu": (F.relu, True),
    "srelu": (_squared_relu, False), "sreglu": (_squared_relu, True),
    "silu": (F.silu, False), "swiglu": (F.silu, True),
}


def check_activation(activation: str, who: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{who}: activation {activation!r} is not known; expected one of "
                         f"{', '.join(sorted(ACTIVATIONS))}")


def is_gated(activation: str) -> bool:
    return ACTIVATIONS[activation][1]


def apply_activation(activation: str, h: torch.Tensor) -> torch.Tensor:
    fn, gated = ACTIVATIONS[activation]
    if not gated:
        return fn(h)
    half = h.shape[-1] // 2
    return fn(h[..., :half]) * h[..., half:]
