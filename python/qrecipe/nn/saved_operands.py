"""GEMM operands saved for backward as plain tensors, so torch's saved-tensor hooks see them.

A quantized operand is an engine object (``_C.QuantizedTensor``); kept on the autograd ctx it
would be invisible to ``torch.autograd.graph.saved_tensors_hooks``: CPU offload
(``save_on_cpu``) would not move it and ``torch.utils.checkpoint`` would not drop it.
``pack`` turns an operand into the tensors that alias its bytes and scales (per direction it
holds: data, scale_inv, amax), which go through ``ctx.save_for_backward``; ``unpack`` makes
an engine operand over whatever tensors the hooks give back (the same ones, or copies moved
to the CPU and back) without copying them (``Quantizer.from_tensors``). A hybrid operand and
one holding its columnwise copy only are packed the same way: the directions it holds, each
part as its own layout says.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ..quantization import DIRECTIONS, usage_bits

_KINDS = ("data", "scale_inv", "amax")
_ALIGNMENT = 16  # what from_tensors requires of each part


@dataclass(frozen=True)
class Packed:
    """How to rebuild one operand from its saved tensors: a quantized operand (quantizer,
    logical rows x cols, usage bits, the (direction, part) of each tensor in order), a dense
    tensor (``quantizer`` None, one tensor) or nothing (no tensors)."""
    quantizer: Optional[object]
    rows: int
    cols: int
    usage: int
    parts: Tuple[Tuple[str, str], ...]
    dense: bool = False


_NOTHING = Packed(None, 0, 0, 0, (), False)
_DENSE = Packed(None, 0, 0, 0, (), True)


def pack(op) -> Tuple[List[torch.Tensor], Packed]:
    """(tensors to save, how to rebuild) of a saved operand: None, a dense tensor or a
    ``_C.QuantizedTensor``."""
    if op is None:
        return [], _NOTHING
    if isinstance(op, torch.Tensor):
        return [op], _DENSE
    tensors, parts = [], []
    held = [d for d in DIRECTIONS if op.has(d)]
    for d in held:
        for kind in _KINDS:
            t = getattr(op, kind)(d)
            if t is not None:
                tensors.append(t)
                parts.append((d, kind))
    return tensors, Packed(op.quantizer, op.rows, op.cols, usage_bits(held), tuple(parts))


def unpack(tensors: Sequence[torch.Tensor], packed: Packed):
    """The operand `pack` saved, over `tensors` (what the saved-tensor hooks returned)."""
    if packed.dense:
        return tensors[0]
    if not packed.parts:
        return None
    buffers = {}
    for (d, kind), t in zip(packed.parts, tensors):
        if not t.is_contiguous() or t.data_ptr() % _ALIGNMENT:
            t = t.clone(memory_format=torch.contiguous_format)  # a hook returned a view
        buffers.setdefault(d, {})[kind] = t
    device = tensors[0].device
    return packed.quantizer.from_tensors(packed.rows, packed.cols, packed.usage, buffers, device)


def pack_all(ops) -> Tuple[List[torch.Tensor], List[Tuple[Packed, int]]]:
    """Several operands: all their tensors in one list, and (how to rebuild, count) of each."""
    tensors: List[torch.Tensor] = []
    layout = []
    for op in ops:
        ts, packed = pack(op)
        tensors.extend(ts)
        layout.append((packed, len(ts)))
    return tensors, layout


def unpack_all(tensors: Sequence[torch.Tensor], layout) -> list:
    """The operands `pack_all` saved, in order."""
    ops, start = [], 0
    for packed, count in layout:
        ops.append(unpack(tensors[start:start + count], packed))
        start += count
    return ops
