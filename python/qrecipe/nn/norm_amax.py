"""The amax of a fused RMSNorm's output, handed to the Linears that quantize that output next.

Per-tensor current scaling (float8 ``scaling: current``, the default recipe's activations)
starts every quantization with an amax pass over the tensor. When the tensor is the output y
of ``qrecipe.nn.RMSNorm`` on CUDA, the norm's forward kernel has already seen every element
of y, so it computes max |y| too (``_C.rms_norm_forward(..., with_amax=True)``) and offers it
here; a Linear whose input is y, unchanged, and whose input quantizer takes a device amax
(``Quantizer.has_device_amax``) with exactly that meaning quantizes with it
(``quantize(amax=...)``) instead of computing its own. max is order-free, so the bytes, scales
and amaxes are those of the Linear's own pass, bit for bit (tests/python/test_norm_amax.py,
tests/python/test_rms_norm_cuda.py).

"The same tensor, unchanged" is input sharing's test (input_sharing.identity): the same
object or a view of the same base at the same offset, shape and strides, and the same
``_version``, so an in-place change of y in between (or of its base) drops the handoff and the
Linear computes the amax itself. One offer is kept per thread (the last norm's), and it is
forgotten when the outermost ``qrecipe.autocast`` block exits. Only the eager path uses it:
under torch.compile the norm computes no amax and the Linears' operators compute their own.
"""
from __future__ import annotations

import threading
import weakref
from typing import Optional

import torch

from .. import autocasting
from .._engine import _C
from ..quantization import spec_has
from .input_sharing import anchor, identity

# Tests switch the handoff off to compare against the Linears' own amax passes.
enabled = True

# offered: norm outputs with an amax; used: quantizations that took one (linear_gemms._quantize;
# Linears sharing one quantization of y count once).
stats = {"offered": 0, "used": 0}


class _Offer(threading.local):
    def __init__(self) -> None:
        self.anchor: Optional["weakref.ref"] = None
        self.identity: Optional[tuple] = None
        self.amax: Optional[torch.Tensor] = None


_offer = _Offer()


def wanted() -> bool:
    """Whether a norm's forward should compute its output's amax now: eager mode under an
    enabled qrecipe.autocast (the only place a Linear can take it)."""
    if torch.compiler.is_compiling():  # first: dynamo folds it, and traces nothing else
        return False
    return enabled and autocasting.is_enabled()


def offer(y: torch.Tensor, amax: torch.Tensor) -> None:
    """Keeps `amax` (float32 (2,), max |y| for both directions, on y's device) for y."""
    _offer.anchor = weakref.ref(anchor(y))
    _offer.identity = identity(y)
    _offer.amax = amax
    stats["offered"] += 1


def takes_max_abs(quantizer) -> bool:
    """Whether `quantizer` (an engine quantizer) scales by the per-tensor amax max |x| of
    both directions and takes a caller's amax on the device in its place: float8 with current
    scaling (delayed scaling keeps its own history; other formats scale per block, or, as
    nvfp4 with a Hadamard transform, take the amax of a transformed tensor)."""
    if not isinstance(quantizer, _C.Quantizer) or not quantizer.has_device_amax:
        return False
    spec = quantizer.spec_dict()
    return spec.get("format") == "float8" and not spec_has(spec, "scaling", "delayed")


def take(x: torch.Tensor, quantizer) -> Optional[torch.Tensor]:
    """The amax offered for `x` when `x` is that norm output, unchanged, and `quantizer` can
    use it; otherwise None (the quantizer computes its own)."""
    if _offer.identity is None or not enabled:
        return None
    if identity(x) != _offer.identity or _offer.anchor() is not anchor(x):
        return None
    if not takes_max_abs(quantizer):
        return None
    return _offer.amax


def clear() -> None:
    _offer.anchor = None
    _offer.identity = None
    _offer.amax = None


autocasting.on_outermost_exit(clear)


def reset_stats() -> None:
    for k in stats:
        stats[k] = 0
