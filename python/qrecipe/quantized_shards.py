"""QuantizedWeight shards across ranks (FSDP2, DTensor): the all-gather of their quantized
bytes and the amax their requantization shares. quantized_param.py's FSDP2 extension hooks
(``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``) and DTensor's all-gather of a
QuantizedWeight are made of these.

A weight of R rows sharded over W ranks holds rows [r*R/W, (r+1)*R/W) on rank r. A grouped
weight's rows are row groups (GroupedLinear's experts), each quantized on its own; a shard
holds *pieces*: the parts of the groups that fall in its rows. What crosses the wire per rank
is ONE uint8 buffer (so FSDP2's world-size-1 path, which copies only a hook's first tensor,
works too):

    for each direction sent (rowwise, then columnwise):
        for each piece: its data bytes, then its block scales that hold values
    for each direction sent, per-tensor values of every group of the weight:
        scale_inv (per-tensor formats) [groups] f32, amax [groups] f32
        (the rank's own value for a group it holds a piece of, 0 for the others)

each part starting on a 16-byte boundary, padded to the largest rank's size. After the
all-gather every group's buffers are rebuilt (data and block scales joined in rank order,
per-tensor values from the first rank holding the group): the bytes quantizing the whole
weight in one process gives, because a shard's per-tensor values are the whole weight's
(its amax is all-reduced before its rows are quantized: :func:`reduce_amaxes`).

What is sent (:func:`directions_to_send`): the rowwise copy for the forward; the columnwise
copy for the backward (dgrad). A format whose columnwise copy is the transpose of the rowwise
one (float8, blockwise 128x128, nvfp4 2-D; quantized_rows.columnwise_is_transpose) sends
only the rowwise copy and builds the columnwise copy locally (a transpose is cheaper than
moving the bytes again, and exact); the other formats send the columnwise copy itself.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .quantization import DIRECTIONS, usage_bits
from .quantized_rows import (Parts, columnwise_from_rowwise, columnwise_is_transpose,
                             empty_parts, join_rows, row_geometry, scale_entries)

_ALIGN = 16

# Bytes the gathers of this process sent, for benchmarks and tests (``gather_stats()``).
_STATS = {"gathers": 0, "bytes_sent": 0, "bytes_gathered": 0}


def gather_stats(reset: bool = False) -> Dict[str, int]:
    """{"gathers", "bytes_sent" (this rank's input bytes), "bytes_gathered" (the all-gather
    output bytes: input x world size)} of the quantized all-gathers run so far; `reset` zeroes
    the counters after reading them."""
    out = dict(_STATS)
    if reset:
        for k in _STATS:
            _STATS[k] = 0
    return out


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows of one group held by one rank: group index, first row within the group, rows."""
    group: int
    offset: int
    rows: int


def pieces_of_rows(group_rows: Sequence[int], start: int, stop: int) -> List[Piece]:
    """The pieces of the groups (of `group_rows` rows each) that rows [start, stop) hold."""
    out, at = [], 0
    for g, n in enumerate(group_rows):
        lo, hi = max(start, at), min(stop, at + n)
        if lo < hi:
            out.append(Piece(g, lo - at, hi - lo))
        at += n
    return out


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


@dataclasses.dataclass
class _Part:
    offset: int
    shape: Tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        """This part of a packed uint8 buffer, as a tensor of its shape and dtype."""
        return buffer.narrow(-1, self.offset, self.nbytes).view(self.dtype).view(self.shape)


class ShardPlan:
    """Where each rank's pieces sit in its packed buffer, for one weight (quantizer, columns,
    group rows), world size and set of directions sent. Every rank computes the same plan."""

    def __init__(self, quantizer, cols: int, group_rows: Sequence[int], world: int,
                 directions: Sequence[str]):
        self.quantizer, self.cols, self.world = quantizer, cols, world
        self.group_rows = tuple(group_rows)
        self.directions = tuple(directions)
        total = sum(self.group_rows)
        if total % world:
            raise ValueError(f"{total} rows do not split evenly over {world} ranks")
        self.rows_per_rank = total // world
        geometry = row_geometry(quantizer, cols)
        self.geometry = geometry
        self.rank_pieces = [pieces_of_rows(self.group_rows, r * self.rows_per_rank,
                                           (r + 1) * self.rows_per_rank) for r in range(world)]
        # per rank: per piece: {direction: {"data": _Part, "scale_inv": _Part or None}}
        self.parts: List[List[Dict[str, Dict[str, Optional[_Part]]]]] = []
        # per rank: {direction: {"scale_inv"/"amax": _Part of [groups] f32}}
        self.tables: List[Dict[str, Dict[str, _Part]]] = []
        sizes = []
        for pieces in self.rank_pieces:
            at, parts = 0, []
            for p in pieces:
                parts.append({})
            for d in self.directions:
                g = geometry.directions[d]
                for i, p in enumerate(pieces):
                    layout = quantizer.layout(p.rows, cols, d)
                    shape = list(layout["data_shape"])
                    if layout["data_dtype"] == "e2m1":
                        shape[-1] = (shape[-1] + 1) // 2
                    data = _Part(at, tuple(shape), g.data_dtype)
                    at = _aligned(at + data.nbytes)
                    scale = None
                    if g.block_scales:
                        scale_shape = list(layout["scale_shape"])
                        scale_shape[g.scale_axis] = scale_entries(g, p.rows)
                        scale = _Part(at, tuple(scale_shape), g.scale_dtype)
                        at = _aligned(at + scale.nbytes)
                    parts[i][d] = {"data": data, "scale_inv": scale}
            tables = {}
            groups = len(self.group_rows)
            for d in self.directions:
                g = geometry.directions[d]
                tables[d] = {}
                for kind, present in (("scale_inv", g.tensor_scale), ("amax", g.has_amax)):
                    if present:
                        tables[d][kind] = _Part(at, (groups,), torch.float32)
                        at = _aligned(at + tables[d][kind].nbytes)
            self.parts.append(parts)
            self.tables.append(tables)
            sizes.append(at)
        self.nbytes = max(sizes) if sizes else 0

    # ------------------------------------------------------------ sending
    def pack(self, rank: int, pieces: Sequence[Parts], device,
             nbytes: Optional[int] = None) -> torch.Tensor:
        """The packed buffer of `rank`, whose pieces (in row order) hold `pieces`; `nbytes`
        (at least the plan's): its size, zero-padded (see gather_capacity)."""
        if len(pieces) != len(self.rank_pieces[rank]):
            raise ValueError(f"rank {rank} holds {len(pieces)} pieces; the plan expects "
                             f"{len(self.rank_pieces[rank])} (one per group its rows cover)")
        size = self.nbytes if nbytes is None else nbytes
        if size < self.nbytes:
            raise ValueError(f"a packed shard of {self.nbytes} bytes does not fit {size}")
        out = torch.zeros(size, dtype=torch.uint8, device=device)
        for i, (where, piece) in enumerate(zip(self.parts[rank], pieces)):
            for d in self.directions:
                if d not in piece:
                    raise ValueError(f"a shard piece holds no {d} data to send")
                g = self.geometry.directions[d]
                where[d]["data"].view(out).copy_(piece[d]["data"].reshape(where[d]["data"].shape))
                if where[d]["scale_inv"] is not None:
                    rows = self.rank_pieces[rank][i].rows
                    valid = piece[d]["scale_inv"].narrow(g.scale_axis, 0, scale_entries(g, rows))
                    where[d]["scale_inv"].view(out).copy_(valid)
        for d, kinds in self.tables[rank].items():
            for kind, part in kinds.items():
                table = part.view(out)
                for p, piece in zip(self.rank_pieces[rank], pieces):
                    table[p.group:p.group + 1].copy_(piece[d][kind].reshape(1))
        return out

    # ------------------------------------------------------------ receiving
    def unpack(self, gathered: torch.Tensor, groups: Sequence[Parts], check: bool,
               nbytes: Optional[int] = None) -> None:
        """Fills every group's buffers `groups` (the whole weight's layout per group, for the
        directions sent) from the all-gather output ([world * nbytes] uint8). `check`: verify
        that the ranks holding one group sent the same per-tensor values (no device sync
        wanted on the GPU's hot path, so the caller asks for it on the CPU)."""
        rows_of = gathered.view(self.world, self.nbytes if nbytes is None else nbytes)
        holders: Dict[int, List[Tuple[int, int]]] = {}
        for r, pieces in enumerate(self.rank_pieces):
            for i, p in enumerate(pieces):
                holders.setdefault(p.group, []).append((r, i))
        for g, into in enumerate(groups):
            held = holders.get(g, [])
            if sum(self.rank_pieces[r][i].rows for r, i in held) != self.group_rows[g]:
                raise ValueError(f"group {g} of {self.group_rows[g]} rows is not covered by the "
                                 "ranks' shards")
            pieces, rows = [], []
            for r, i in held:
                p = self.rank_pieces[r][i]
                parts: Parts = {}
                for d in self.directions:
                    where = self.parts[r][i][d]
                    buffers = {"data": where["data"].view(rows_of[r]),
                               "scale_inv": None, "amax": None}
                    if where["scale_inv"] is not None:
                        buffers["scale_inv"] = where["scale_inv"].view(rows_of[r])
                    for kind, part in self.tables[r].get(d, {}).items():
                        buffers[kind] = part.view(rows_of[r])[g:g + 1]
                    parts[d] = buffers
                pieces.append(parts)
                rows.append(p.rows)
            join_rows(self.quantizer, pieces, rows, self.cols, into=into,
                      check_tensor_values=check)


# ---------------------------------------------------------------- what to send
def directions_to_send(quantizer, held: Sequence[str], in_backward: bool, grad_enabled: bool,
                       reshard_after_forward: Optional[bool]) -> Tuple[Tuple[str, ...], bool]:
    """(directions to all-gather, whether to build the columnwise copy locally) for one
    unshard. Forward: the rowwise copy (fprop), plus the columnwise copy (dgrad) when
    gradients are on and the parameter may stay unsharded until its backward
    (`reshard_after_forward` not known to be True). Backward: the columnwise copy. A format
    whose columnwise copy is the rowwise one transposed sends rowwise only and builds it."""
    derive = columnwise_is_transpose(quantizer)
    want_columnwise = in_backward or (grad_enabled and reshard_after_forward is not True)
    want_rowwise = not in_backward
    if derive and want_columnwise:
        want_rowwise = True
    wanted = [d for d, w in (("rowwise", want_rowwise),
                             ("columnwise", want_columnwise and not derive)) if w]
    missing = [d for d in wanted if d not in held]
    if missing:
        raise RuntimeError(
            f"all-gathering a {quantizer.format} QuantizedWeight shard that holds "
            f"{'+'.join(held)} data: the {'backward' if in_backward else 'forward'} needs "
            f"{'+'.join(missing)}; create the weight with both directions "
            "(qrecipe.quantized_model_init does)")
    return tuple(wanted), bool(derive and want_columnwise)


def gather_sets(quantizer, held: Sequence[str],
                reshard_after_forward: Optional[bool]) -> List[Tuple[str, ...]]:
    """Every set of directions directions_to_send may choose for one parameter: FSDP2 sizes a
    parameter's all-gather buffers at its first all-gather and reuses them, so every gather of
    it must send the same number of bytes (gather_capacity)."""
    if columnwise_is_transpose(quantizer):
        return [("rowwise",)]
    sets = [("rowwise",), ("columnwise",)]
    if reshard_after_forward is not True:  # the forward may take both copies at once
        sets.append(("rowwise", "columnwise"))
    return [d for d in sets if all(x in held for x in d)]


def gather_capacity(plans: Sequence[ShardPlan]) -> int:
    """The bytes every all-gather of a parameter sends per rank: the largest of its plans.
    A smaller set is zero-padded to it: e.g. with reshard_after_forward not True, a gather
    under no_grad (rowwise only) still moves the size of both copies; with it True (the
    setting that saves bytes), forward and backward each move one copy (mxfp8: the rowwise and
    columnwise copies are the same size up to scale padding)."""
    return max(p.nbytes for p in plans)


# ---------------------------------------------------------------- the gathered weight
class GatheredLayout:
    """The buffers of the whole weight after an all-gather, carved from ONE flat uint8 tensor
    (FSDP2 frees and reallocates it between unshards: its storage is the parameter's memory)
    at 256-byte boundaries: per group, per direction, data / scale_inv / amax."""

    _BOUNDARY = 256

    def __init__(self, quantizer, cols: int, group_rows: Sequence[int], usage: int):
        self.quantizer, self.cols = quantizer, cols
        self.group_rows, self.usage = tuple(group_rows), usage
        self.offsets: List[Dict[str, Dict[str, Tuple[int, Tuple[int, ...], torch.dtype]]]] = []
        at = 0
        for rows in self.group_rows:
            meta = empty_parts(quantizer, rows, cols, usage, "meta")
            group = {}
            for d, kinds in meta.items():
                group[d] = {}
                for kind, t in kinds.items():
                    if t is None:
                        continue
                    group[d][kind] = (at, tuple(t.shape), t.dtype)
                    at += -(-_nbytes(t.shape, t.dtype) // self._BOUNDARY) * self._BOUNDARY
            self.offsets.append(group)
        self.nbytes = at

    def carve(self, flat: torch.Tensor, directions: Sequence[str]) -> List[Parts]:
        out = []
        for group in self.offsets:
            parts: Parts = {}
            for d in directions:
                parts[d] = {k: None for k in ("data", "scale_inv", "amax")}
                for kind, (offset, shape, dtype) in group[d].items():
                    parts[d][kind] = flat.narrow(0, offset, _nbytes(shape, dtype)).view(
                        dtype).view(shape)
            out.append(parts)
        return out


def fill_gathered(plan: ShardPlan, layout: GatheredLayout, flat: torch.Tensor,
                  gathered: torch.Tensor, derive_columnwise: bool,
                  nbytes: Optional[int] = None) -> List[Parts]:
    """Rebuilds every group's buffers in `flat` from the all-gather output; builds the
    columnwise copies from the rowwise ones when `derive_columnwise`. Returns per group the
    buffers of the directions now held."""
    held = list(plan.directions) + (["columnwise"] if derive_columnwise else [])
    groups = layout.carve(flat, held)
    sent = [{d: parts[d] for d in plan.directions} for parts in groups]
    plan.unpack(gathered, sent, check=flat.device.type == "cpu", nbytes=nbytes)
    if derive_columnwise:
        for rows, parts in zip(plan.group_rows, groups):
            columnwise_from_rowwise(plan.quantizer, rows, plan.cols, parts["rowwise"],
                                    parts["columnwise"])
    return groups


def record_gather(sent: int, world: int) -> None:
    _STATS["gathers"] += 1
    _STATS["bytes_sent"] += sent
    _STATS["bytes_gathered"] += sent * world


# ---------------------------------------------------------------- shared amax
def reduce_amaxes(table: torch.Tensor, group) -> torch.Tensor:
    """All-reduces (max) a [groups, 2] float32 table of (rowwise, columnwise) amaxes over the
    process group `group` (the ranks holding the other rows of the same tensors), in one
    collective; returns it on the CPU. NCCL reduces on the current CUDA device."""
    import torch.distributed as dist
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else \
        torch.device("cpu")
    work = table.to(device)
    dist.all_reduce(work, op=dist.ReduceOp.MAX, group=group)
    return work.cpu()
