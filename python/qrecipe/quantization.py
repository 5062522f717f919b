"""Quantizers and quantized tensors on the Python side (``qrecipe.quantize``, beside
``Recipe`` in recipe.py, makes them from a format and its options).

``QuantizedTensor`` is the inspection tool: its bytes and scales per direction are torch
tensors that alias the engine's buffers (no copy), and ``dequantize`` decodes through the
format's own plugin, the same code the GEMMs use.

Directions (docs/architecture.md, "Core types"): **rowwise** blocks run along the last dimension
(what fprop reads); **columnwise** blocks run along the first dimension, the data stored transposed
when the format's GEMM needs it (what dgrad reads of the weight and wgrad of both operands).
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple, Union

import torch

from ._engine import _C

DIRECTIONS = ("rowwise", "columnwise")
# The engine's usage bits (QR_USAGE_* of plugin_abi.h): which directions a quantization makes.
ROWWISE: int = _C.USAGE_ROWWISE
COLUMNWISE: int = _C.USAGE_COLUMNWISE
_USAGE_BITS = {"rowwise": ROWWISE, "columnwise": COLUMNWISE}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Usage = Union[str, Iterable[str]]


def usage_bits(usage: Usage) -> int:
    """'rowwise', 'columnwise' or a collection of them, as the engine's usage bit mask."""
    names = (usage,) if isinstance(usage, str) else tuple(usage)
    bits = 0
    for n in names:
        if n not in _USAGE_BITS:
            raise ValueError(f"usage {n!r} is not known; expected 'rowwise' and/or 'columnwise'")
        bits |= _USAGE_BITS[n]
    if bits == 0:
        raise ValueError("usage is empty; pass 'rowwise', 'columnwise' or both")
    return bits


def check_source(tensor, what: str) -> None:
    """The checks every tensor entering a quantizer passes, with errors saying what to do."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} has dtype {tensor.dtype}; qrecipe quantizes torch.float32, "
                        "torch.bfloat16 or torch.float16 tensors")
    if tensor.dim() == 0:
        raise ValueError(f"{what} is a 0-d tensor; quantize tensors of at least one dimension")


class Quantizer:
    """A quantizer resolved for one role (or made by :func:`quantize`)."""

    def __init__(self, cpp: "_C.Quantizer"):
        self._cpp = cpp

    @property
    def format(self) -> str:
        return self._cpp.format

    @property
    def role(self) -> str:
        return self._cpp.role

    def describe(self) -> str:
        """The resolved options, e.g. ``float8{dtype=e4m3, scaling=current, ...}``."""
        return self._cpp.describe()

    def quantize(self, tensor: torch.Tensor,
                 usage: Usage = ("rowwise", "columnwise")) -> "QuantizedTensor":
        check_source(tensor, "tensor to quantize")
        source = tensor.detach().contiguous()
        return QuantizedTensor(self._cpp.quantize(source, usage_bits(usage)), source.shape,
                               source.dtype)

    def __repr__(self) -> str:
        return f"Quantizer({self.describe()}, role={self.role!r})"


class QuantizedTensor:
    """A tensor quantized by a format plugin: bytes and scales per direction.

    Per direction (``rowwise_*`` / ``columnwise_*``): ``*_data`` holds the quantized elements
    (uint8 for FP8 and FP4 formats, E2M1 packed two per byte, even index in the low nibble),
    ``*_scale_inv`` the decode scales (float32 for FP32 scales, uint8 for E8M0 / E4M3 scales;
    padded as the layout says), ``*_amax`` the FP32 amax when the format stores one. A missing
    direction or buffer is None. The logical tensor is 2-D: leading dimensions flattened.
    """

    def __init__(self, cpp: "_C.QuantizedTensor", shape: torch.Size, dtype: torch.dtype):
        self._cpp = cpp
        self.shape = torch.Size(shape)
        self.dtype = dtype  # of the tensor that was quantized

    # ------------------------------------------------------------ identity
    @property
    def format(self) -> str:
        return self._cpp.format

    @property
    def options(self) -> str:
        """The quantizer's resolved options (a stable string)."""
        return self._cpp.quantizer.describe()

    @property
    def usage(self) -> Tuple[str, ...]:
        return tuple(d for d in DIRECTIONS if self._cpp.has(d))

    def has(self, direction: str) -> bool:
        return self._cpp.has(direction)

    def layout(self, direction: str) -> dict:
        """How a direction is stored: data/scale dtypes and shapes, block shape, transposes."""
        return dict(self._cpp.layout(direction))

    # ------------------------------------------------------------ buffers
    def _buffer(self, kind: str, direction: str) -> Optional[torch.Tensor]:
        if not self._cpp.has(direction):
            return None
        return getattr(self._cpp, kind)(direction)

    rowwise_data = property(lambda self: self._buffer("data", "rowwise"))
    rowwise_scale_inv = property(lambda self: self._buffer("scale_inv", "rowwise"))
    rowwise_amax = property(lambda self: self._buffer("amax", "rowwise"))
    columnwise_data = property(lambda self: self._buffer("data", "columnwise"))
    columnwise_scale_inv = property(lambda self: self._buffer("scale_inv", "columnwise"))
    columnwise_amax = property(lambda self: self._buffer("amax", "columnwise"))

    # ------------------------------------------------------------ decoding
    def dequantize(self, direction: str = "rowwise",
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decodes one direction to a new tensor of the original shape."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} is not known; expected 'rowwise' or "
                             "'columnwise'")
        if not self._cpp.has(direction):
            raise ValueError(f"this {self.format} tensor holds {'+'.join(self.usage)} data only; "
                             f"quantize with usage including {direction!r}")
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dequantize to {dtype}: expected one of {SUPPORTED_DTYPES}")
        decode = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        out = self._cpp.dequantize(direction, decode).reshape(self.shape)
        return out if out.dtype == dtype else out.to(dtype)

    def __repr__(self) -> str:
        return (f"QuantizedTensor(format={self.format!r}, shape={tuple(self.shape)}, "
                f"usage={'+'.join(self.usage)}, options={self.options!r})")



def spec_has(spec: dict, key: str, value) -> bool:
    """Whether a quantizer's spec dictionary (``Quantizer.spec_dict()``, nested for a hybrid's
    halves) sets option `key` to `value` anywhere."""
    for k, v in spec.items():
        if isinstance(v, dict) and spec_has(v, key, value):
            return True
        if k == key and v == value:
            return True
    return False


def is_stateless(quantizer) -> bool:
    """Whether quantizing a tensor with `quantizer` (a ``_C.Quantizer``) depends on the tensor
    alone: no delayed-scaling state, no stochastic-rounding call counter. Two stateless
    quantizers of the same spec give the same bytes for the same tensor."""
    spec = quantizer.spec_dict()
    return not (spec_has(spec, "scaling", "delayed") or
                spec_has(spec, "stochastic_rounding", True))
