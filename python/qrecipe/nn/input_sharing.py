"""One quantization of an input that several Linears read in a row (a transformer's q / k / v
projections of the normalized hidden states, an MLP's gate / up projections).

Each of those Linears has roles of its own (their names differ), but a recipe usually gives
them the same quantizer spec; when that spec is stateless (no delayed scaling, no stochastic
rounding: ``quantization.is_stateless``), quantizing the same tensor with it gives the same
bytes every time, so the second and third quantizations are wasted work. Here the last input
seen (per thread) keeps its quantized operands, keyed by (spec, usage): a Linear that reads
the same tensor object, or a view of the same base at the same offset, shape and strides,
unchanged (same ``_version``), under the same spec and usage takes the operand already
made. The results are bit-identical to quantizing
again (tests/python/test_input_sharing.py).

Memory: the operand holds both directions (rowwise for fprop, columnwise for wgrad). Each
Linear saves a columnwise-only view of it for backward (``columnwise_view``, no copy), as
without sharing; the rowwise copy is dropped once a qrecipe GEMM reads another input (the
previous one's forward GEMMs are done then) and the kept operand is forgotten when the
outermost ``qrecipe.autocast`` block exits, so at most one extra rowwise copy is alive, and
only during the forward.

Only the eager forward path shares (``linear_forward(share_input=True)``); the torch.compile
operators and GroupedLinear quantize as before.
"""
from __future__ import annotations

import threading
import weakref
from typing import Dict, Optional, Tuple

import torch

from .. import autocasting
from ..quantization import COLUMNWISE, is_stateless


class _Last(threading.local):
    def __init__(self) -> None:
        self.x: Optional["weakref.ref"] = None
        self.key: Optional[tuple] = None
        self.ops: Dict[Tuple[str, int], object] = {}


_last = _Last()

# Counters for tests and for users checking that sharing happens.
stats: Dict[str, int] = {"quantized": 0, "shared": 0}


def share_key(quantizer) -> Optional[str]:
    """The key under which `quantizer`'s operands may be shared (its spec), or None when it
    keeps state and every quantization must be its own."""
    if quantizer is None or not is_stateless(quantizer):
        return None
    return quantizer.spec


def anchor(x: torch.Tensor) -> torch.Tensor:
    """The tensor whose lifetime and version stand for `x`'s bytes: its base when `x` is a
    view. Several Linears may each get their own view of one tensor (a tensor-parallel
    ColwiseParallel layer takes ``DTensor.to_local()``, a fresh view per call), and views of
    one base at the same offset, shape and strides hold the same bytes."""
    return x._base if x._base is not None else x


def identity(x: torch.Tensor) -> tuple:
    anchor_ = anchor(x)  # views share their base's version counter
    return (id(anchor_), anchor_._version, x.data_ptr(), tuple(x.shape), tuple(x.stride()),
            x.dtype, x.device)


def _evict() -> None:
    """Forget the last input's operands, dropping their rowwise copies (their fprop GEMMs
    ran; backward reads the columnwise views the Linears saved)."""
    for op in _last.ops.values():
        if op.has("rowwise") and op.has("columnwise"):
            op.drop("rowwise")
    _last.ops = {}
    _last.x = None
    _last.key = None


def operand(x: torch.Tensor, x2: torch.Tensor, quantizer, key: str, usage: int, quantize):
    """`x2` (x as [tokens, in]) quantized by `quantizer` with `usage`, shared with earlier
    Linears that read the same `x` under spec `key`; `quantize(quantizer, tensor, usage)`
    makes a new one."""
    key_now, base = identity(x), anchor(x)
    if _last.key != key_now or _last.x is None or _last.x() is not base:
        _evict()
        _last.x = weakref.ref(base)
        _last.key = key_now
    op = _last.ops.get((key, usage))
    if op is None:
        op = quantize(quantizer, x2, usage)
        _last.ops[(key, usage)] = op
        stats["quantized"] += 1
    else:
        stats["shared"] += 1
    return op


def columnwise_view(op):
    """A columnwise-only operand over `op`'s columnwise memory (no copy): what a Linear saves
    for wgrad when `op` is shared."""
    buffers = {kind: getattr(op, kind)("columnwise") for kind in ("data", "scale_inv", "amax")}
    device = buffers["data"].device
    return op.quantizer.from_tensors(op.rows, op.cols, COLUMNWISE,
                                     {"columnwise": {k: v for k, v in buffers.items()
                                                     if v is not None}}, device)


def clear() -> None:
    """Forget the kept operands (run when the outermost autocast block exits)."""
    _evict()


autocasting.on_outermost_exit(clear)


def reset_stats() -> None:
    for k in stats:
        stats[k] = 0
