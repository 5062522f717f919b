"""The storage behind QuantizedWeight: the quantized bytes every alias of a weight shares,
like a torch tensor's storage (quantized_param.py is the tensor face over it).

A storage holds R rows x C columns of a weight (C: the product of the trailing dims) as
*pieces*: engine quantized tensors of consecutive rows, each with its own scales. The rows
belong to *groups* (``group_rows``): the row groups of the whole tensor it holds rows of
(GroupedLinear's experts; one group for an ordinary weight), each quantized as a tensor of its
own. ``row_start`` says where the storage's rows start in that whole tensor: 0 for a whole
weight, r * R for rank r's FSDP2 shard. Normally there is one piece per group part the
storage holds (its *canonical* form); a write of a row range may leave finer pieces, joined
back when they share their per-tensor values.

Invariants:
- a piece lies inside one group; a cut inside a group falls on a multiple of the quantizer's
  row multiple counted from the group's start (quantized_rows.py), so every piece holds the
  bytes quantizing its rows alone (with the group's per-tensor values) would give;
- pieces of one group share their per-tensor values (float8's scale, NVFP4's amax) once
  canonical: a shard is requantized with the amax of the whole group, all-reduced over
  ``amax_group`` (the ranks holding the other rows: set by qrecipe.distributed.fully_shard or
  the first FSDP2 all-gather).

A storage on the meta device holds no pieces, only the structure (meta-device init).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .quantization import COLUMNWISE, DIRECTIONS, ROWWISE, QuantizedTensor, usage_bits
from .quantized_rows import (Parts, build, check_cut as check_tensor_cut, cut_message,
                             join_rows, parts_of, row_geometry, same_tensor_values, take_rows)
from .quantized_shards import Piece, ShardPlan, pieces_of_rows, reduce_amaxes


def usage_names(bits: int) -> Tuple[str, ...]:
    return tuple(d for d in DIRECTIONS if bits & usage_bits(d))


class QuantizedStorage:
    """See the module docstring. `pieces`: QuantizedTensor per piece (None on the meta
    device), `piece_rows` their rows; `group_rows` / `row_start`: the whole tensor's groups
    and where these rows start in it (default: the pieces are the groups)."""

    def __init__(self, quantizer, dtype: torch.dtype, trailing: Sequence[int], usage: int,
                 pieces: Optional[List[QuantizedTensor]], piece_rows: Sequence[int],
                 group_rows: Optional[Sequence[int]] = None, row_start: int = 0,
                 device: Optional[torch.device] = None, structured: bool = True):
        self.quantizer = quantizer          # _C.Quantizer: decodes and requantizes the bytes
        self.dtype = dtype                  # the weight's dtype (what decoding gives)
        self.trailing = torch.Size(trailing)
        self.cols = int(torch.Size(trailing).numel())
        self.usage = int(usage)
        self.pieces = list(pieces) if pieces is not None else None
        self.piece_rows = [int(r) for r in piece_rows]
        self.rows = sum(self.piece_rows)
        self.group_rows = tuple(int(r) for r in (group_rows if group_rows is not None
                                                 else self.piece_rows))
        self.row_start = int(row_start)
        if device is None:
            if not self.pieces:
                raise ValueError("QuantizedStorage: pass the device of a storage without pieces")
            device = self.pieces[0]._buffer("data", usage_names(self.usage)[0]).device
        self.device = torch.device(device)
        # False for a storage made without knowing its structure (new_zeros of another
        # shape): the first whole copy_ from a QuantizedWeight gives it the source's.
        self.structured = structured
        self.amax_group = None              # process group holding the other rows (shards)
        self.reshard_after_forward: Optional[bool] = None  # FSDP2's setting, when known
        self.gathered = None                # FSDP2 unsharded weight: (layout, flat buffer)
        self._plans: Dict[Tuple[int, Tuple[str, ...]], ShardPlan] = {}

    # ------------------------------------------------------------ construction
    @classmethod
    def of_tensors(cls, tensors: Sequence[QuantizedTensor]) -> "QuantizedStorage":
        """A whole weight whose groups are `tensors` (one piece each)."""
        first = tensors[0]
        usage = usage_bits(first.usage)
        return cls(first._cpp.quantizer, first.dtype, first.shape[1:], usage, list(tensors),
                   [t.shape[0] for t in tensors])

    def like(self, rows: Optional[int] = None, device=None, pieces: Optional[list] = None,
             piece_rows: Optional[Sequence[int]] = None) -> "QuantizedStorage":
        """A storage of the same quantizer, dtype and columns: the same structure (groups,
        row_start, amax group) when it has this one's rows, else one unstructured group."""
        device = torch.device(device) if device is not None else self.device
        same = rows is None or rows == self.rows
        rows = self.rows if rows is None else rows
        if piece_rows is None:
            piece_rows = [p.rows for p in self.local_groups()] if same else [rows]
        out = QuantizedStorage(self.quantizer, self.dtype, self.trailing, self.usage, pieces,
                               piece_rows, self.group_rows if same else None,
                               self.row_start if same else 0, device, structured=same)
        if same:
            out.amax_group = self.amax_group
            out.reshard_after_forward = self.reshard_after_forward
        return out

    def zeros_like(self, rows: Optional[int] = None, device=None) -> "QuantizedStorage":
        """Zeros quantized (each group part on its own) in a storage like this one."""
        out = self.like(rows, device)
        if out.device.type != "meta":
            out.pieces = [self.quantize(torch.zeros(n, self.cols, dtype=self.dtype,
                                                    device=out.device), None)
                          for n in out.piece_rows]
        return out

    def quantize(self, values: torch.Tensor, amax: Optional[Tuple[float, float]]) -> QuantizedTensor:
        rows = values.shape[0]
        cpp = self.quantizer.quantize(values.contiguous(), self.usage, amax=amax)
        return QuantizedTensor(cpp, torch.Size([rows, *self.trailing]), self.dtype)

    # ------------------------------------------------------------ structure
    @property
    def is_meta(self) -> bool:
        return self.pieces is None

    @property
    def format(self) -> str:
        return self.quantizer.format

    def local_groups(self) -> List[Piece]:
        """The parts of the whole tensor's groups these rows hold (offsets: rows into the
        group), in order."""
        return pieces_of_rows(self.group_rows, self.row_start, self.row_start + self.rows)

    def group_bounds(self) -> List[Tuple[int, int]]:
        """[start, stop) of each group part, in this storage's rows."""
        out, at = [], 0
        for p in self.local_groups():
            out.append((at, at + p.rows))
            at += p.rows
        return out

    def piece_bounds(self) -> List[Tuple[int, int]]:
        out, at = [], 0
        for n in self.piece_rows:
            out.append((at, at + n))
            at += n
        return out

    @property
    def is_shard(self) -> bool:
        """Whether some group of the whole tensor has rows outside this storage."""
        return any(p.rows != self.group_rows[p.group] for p in self.local_groups())

    @property
    def canonical(self) -> bool:
        return self.piece_rows == [p.rows for p in self.local_groups()]

    def check_cut(self, at: int, what: str) -> None:
        """A cut at row `at` of this storage: at its ends, at a group boundary, or on the row
        multiple counted from the start of the group it falls in."""
        if at in (0, self.rows):
            return
        if at < 0 or at > self.rows:
            raise IndexError(f"{what}: row {at} is outside the {self.rows} rows")
        for (lo, hi), part in zip(self.group_bounds(), self.local_groups()):
            if lo < at < hi:
                check_tensor_cut(self.quantizer, self.cols, self.group_rows[part.group],
                                 part.offset + at - lo, what)
                return

    def row_multiple(self) -> int:
        return row_geometry(self.quantizer, self.cols).row_multiple

    def tensor_level(self) -> bool:
        return row_geometry(self.quantizer, self.cols).tensor_level

    # ------------------------------------------------------------ reading
    def tensors_in(self, start: int, stop: int) -> List[QuantizedTensor]:
        """The pieces covering rows [start, stop): whole pieces as they are, cut ones copied."""
        out = []
        for (lo, hi), piece in zip(self.piece_bounds(), self.pieces):
            a, b = max(lo, start), min(hi, stop)
            if a >= b:
                continue
            if (a, b) == (lo, hi):
                out.append(piece)
            else:
                out.append(self._tensor(take_rows(self.quantizer, piece._cpp, a - lo, b - lo),
                                        b - a))
        return out

    def groups_in(self, start: int, stop: int) -> List[QuantizedTensor]:
        """One tensor per group part covering rows [start, stop): a piece as it is when one
        piece is exactly that part, else its pieces joined (a copy)."""
        out = []
        for lo, hi in self.group_bounds():
            a, b = max(lo, start), min(hi, stop)
            if a >= b:
                continue
            tensors = self.tensors_in(a, b)
            if len(tensors) == 1:
                out.append(tensors[0])
            else:
                rows = [t.shape[0] for t in tensors]
                joined = join_rows(self.quantizer, [parts_of(t._cpp) for t in tensors], rows,
                                   self.cols)
                out.append(self._tensor(joined, b - a))
        return out

    def _tensor(self, parts: Parts, rows: int, borrow: bool = False) -> QuantizedTensor:
        cpp = build(self.quantizer, rows, self.cols, parts, self.device, borrow)
        return QuantizedTensor(cpp, torch.Size([rows, *self.trailing]), self.dtype)

    # ------------------------------------------------------------ writing
    def set_pieces(self, pieces: List[QuantizedTensor], piece_rows: Sequence[int]) -> None:
        if sum(piece_rows) != self.rows:
            raise ValueError(f"{sum(piece_rows)} rows of pieces for a storage of {self.rows}")
        self.pieces, self.piece_rows = list(pieces), [int(r) for r in piece_rows]
        if pieces:
            self.usage = usage_bits(pieces[0].usage)

    def adopt_structure(self, group_rows: Sequence[int], row_start: int, amax_group) -> None:
        """Takes a source's groups and place (the first whole copy_ into an unstructured
        storage: FSDP2 copies each shard into a fresh new_zeros tensor)."""
        self.group_rows, self.row_start = tuple(group_rows), int(row_start)
        if self.amax_group is None:
            self.amax_group = amax_group
        self.structured = True

    def write(self, start: int, stop: int, tensors: List[QuantizedTensor], what: str) -> None:
        """Rows [start, stop) become copies of `tensors` (consecutive row ranges of the same
        quantizer, each inside one of this storage's groups). In place when the range's pieces
        have the same rows (every holder of the bytes sees the change)."""
        rows = [t.shape[0] for t in tensors]
        if sum(rows) != stop - start:
            raise ValueError(f"{what}: {sum(rows)} rows given for rows [{start}, {stop})")
        bounds = [b for b in self.piece_bounds() if b[0] < stop and b[1] > start]
        if self.is_meta:
            return
        if [hi - lo for lo, hi in bounds] == rows and bounds and bounds[0][0] == start and \
                bounds[-1][1] == stop:
            first = self.piece_bounds().index(bounds[0])
            for piece, src in zip(self.pieces[first:first + len(rows)], tensors):
                _copy_bytes(piece, src)
            # The copied pieces may now share their per-tensor values with their neighbours.
            self.join_pieces()
            return
        at = start
        for n in rows:  # each given range must sit inside one group of this storage
            self.check_cut(at, what)
            if not any(lo <= at and at + n <= hi for lo, hi in self.group_bounds()):
                raise ValueError(f"{what}: rows [{at}, {at + n}) of the source are one quantized "
                                 "tensor but span two row groups of the destination (each "
                                 "quantized on its own); copy group by group")
            at += n
        self.check_cut(stop, what)
        copies = [self._tensor(parts_of(t._cpp), t.shape[0]) for t in tensors]
        self._replace(start, stop, copies, rows)

    def _replace(self, start: int, stop: int, tensors: List[QuantizedTensor],
                 rows: List[int]) -> None:
        before, after = [], []
        for (lo, hi), piece in zip(self.piece_bounds(), self.pieces):
            if lo < start:
                b = min(hi, start)
                before.append((piece if b == hi else self._cut(piece, 0, b - lo), b - lo))
            if hi > stop:
                a = max(lo, stop)
                after.append((piece if a == lo else self._cut(piece, a - lo, hi - lo), hi - a))
        pieces = before + list(zip(tensors, rows)) + after
        self.pieces = [p for p, _ in pieces]
        self.piece_rows = [n for _, n in pieces]
        self.join_pieces()

    def _cut(self, piece: QuantizedTensor, a: int, b: int) -> QuantizedTensor:
        return self._tensor(take_rows(self.quantizer, piece._cpp, a, b), b - a)

    def join_pieces(self) -> None:
        """Joins the consecutive pieces of each group part that share their per-tensor values
        (the canonical form, one piece per part, when all of them do)."""
        if self.is_meta or self.canonical:
            return
        pieces, rows = [], []
        bounds = self.piece_bounds()
        for lo, hi in self.group_bounds():
            run = [(p, n) for (a, b), p, n in zip(bounds, self.pieces, self.piece_rows)
                   if lo <= a and b <= hi]
            parts = [parts_of(p._cpp) for p, _ in run]
            if len(run) > 1 and same_tensor_values(parts):
                joined = join_rows(self.quantizer, parts, [n for _, n in run], self.cols)
                pieces.append(self._tensor(joined, hi - lo))
                rows.append(hi - lo)
            else:
                pieces += [p for p, _ in run]
                rows += [n for _, n in run]
        self.pieces, self.piece_rows = pieces, rows

    def requantize(self, start: int, stop: int, values: torch.Tensor, what: str,
                   amaxes: Optional[Dict[int, Tuple[float, float]]] = None) -> None:
        """Quantizes `values` ([stop - start, cols], this storage's dtype and device) into rows
        [start, stop), each group part from its own rows. `amaxes`: {group: (rowwise,
        columnwise)} already reduced over the ranks holding the rest of the group (a shard's
        per-tensor values; see requantize_many)."""
        for (lo, hi), part in zip(self.group_bounds(), self.local_groups()):
            a, b = max(lo, start), min(hi, stop)
            if a >= b:
                continue
            if (a, b) != (lo, hi) and self.tensor_level():
                raise ValueError(
                    f"{what}: quantizing rows [{a}, {b}) of a {self.format} tensor whose group "
                    f"has rows [{lo}, {hi}) here: its rows share one per-tensor scale, computed "
                    "from the amax of all of them, so part of them cannot be quantized alone. "
                    "Copy the whole weight (or whole row groups)")
            amax = None if amaxes is None else amaxes.get(part.group)
            if amax is None and self.tensor_level() and part.rows != self.group_rows[part.group]:
                raise RuntimeError(shared_amax_message(self, what))
            rows_values = values[a - start:b - start]
            if self.is_meta:
                continue
            bounds = self.piece_bounds()
            if (a, b) in bounds:
                piece = self.pieces[bounds.index((a, b))]
                piece._cpp.requantize(rows_values.contiguous(), amax=amax)
            else:
                self._replace(a, b, [self.quantize(rows_values, amax)], [b - a])

    # ------------------------------------------------------------ shards
    def shard_plan(self, world: int, directions: Tuple[str, ...]) -> ShardPlan:
        key = (world, directions)
        plan = self._plans.get(key)
        if plan is None:
            plan = ShardPlan(self.quantizer, self.cols, self.group_rows, world, directions)
            self._plans[key] = plan
        return plan

    def canonical_parts(self, what: str) -> List[Parts]:
        """One Parts per group part (what a shard sends); joins finer pieces first."""
        self.join_pieces()
        if not self.canonical:
            raise ValueError(
                f"{what}: a row group of this {self.format} shard holds rows quantized with "
                "different per-tensor scales (a partial write), so it cannot be sent as one "
                "tensor; write whole groups (or load a whole checkpoint) first")
        return [parts_of(p._cpp) for p in self.pieces]


def shared_amax_message(storage: QuantizedStorage, what: str) -> str:
    return (f"{what}: these rows [{storage.row_start}, {storage.row_start + storage.rows}) are "
            f"a shard of a {storage.format} tensor of {sum(storage.group_rows)} rows whose "
            "scale is computed from the amax of the whole tensor, so their requantization "
            "needs the amax all-reduced over the ranks holding the other rows, and no process "
            "group is known for them. Shard the model with qrecipe.distributed.fully_shard "
            "(which records it), or set it with "
            "qrecipe.distributed.set_amax_group(param, group)")


def _copy_bytes(dst: QuantizedTensor, src: QuantizedTensor) -> None:
    ours, theirs = parts_of(dst._cpp), parts_of(src._cpp)
    for d, kinds in ours.items():
        if d not in theirs:
            raise ValueError(f"copy_: the source holds no {d} data")
        for k, t in kinds.items():
            if t is not None:
                t.copy_(theirs[d][k])


def requantize_many(writes: Sequence[Tuple[QuantizedStorage, int, int, torch.Tensor]],
                    what: str) -> None:
    """Quantizes values into row ranges of storages ((storage, start, stop, values) each),
    sharing the amax of every group a shard holds only part of: the local amaxes of all of
    them are all-reduced (max) in ONE collective per process group, so every rank's shard
    gets the per-tensor values quantizing the whole tensor in one process gives. Every rank
    of a group must make the same call (SPMD), as for any collective."""
    by_group: Dict[Any, List[Tuple[int, QuantizedStorage, int, torch.Tensor]]] = {}
    for index, (storage, start, stop, values) in enumerate(writes):
        if storage.is_shard and storage.tensor_level() and not storage.is_meta:
            if storage.amax_group is None:
                raise RuntimeError(shared_amax_message(storage, what))
            by_group.setdefault(storage.amax_group, []).append((index, storage, start, values))
    reduced: Dict[int, Dict[int, Tuple[float, float]]] = {}
    for group, items in by_group.items():
        offsets, rows = [], 0
        for _, storage, _, _ in items:
            offsets.append(rows)
            rows += len(storage.group_rows)
        table = torch.zeros(rows, 2, dtype=torch.float32)
        for offset, (_, storage, start, values) in zip(offsets, items):
            for (lo, hi), part in zip(storage.group_bounds(), storage.local_groups()):
                a, b = max(lo, start), min(hi, start + values.shape[0])
                if a < b:
                    amax = storage.quantizer.compute_amax(values[a - start:b - start].contiguous())
                    table[offset + part.group] = torch.tensor(amax, dtype=torch.float32)
        table = reduce_amaxes(table, group)
        for offset, (index, storage, _, _) in zip(offsets, items):
            reduced[index] = {g: (float(table[offset + g, 0]), float(table[offset + g, 1]))
                              for g in range(len(storage.group_rows))}
    for index, (storage, start, stop, values) in enumerate(writes):
        storage.requantize(start, stop, values, what, reduced.get(index))
