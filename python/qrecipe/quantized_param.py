"""Quantized parameters: ``qrecipe.QuantizedWeight`` and ``qrecipe.quantized_model_init``
(docs/adapter.md, "Quantized parameters" and "FSDP2").

    with qrecipe.quantized_model_init(recipe):
        layer = qrecipe.nn.Linear(1024, 1024)     # layer.weight is a QuantizedWeight
    layer.weight.rowwise_data, layer.weight.dequantize()

A ``QuantizedWeight`` is a ``torch.Tensor`` wrapper subclass: to torch it is a tensor of the
original shape and dtype (so it can be an ``nn.Parameter``), but it stores only the engine's
quantized tensors (bytes and scales per direction, both directions) and the quantizer that
made them. qrecipe's GEMMs read those bytes directly, with no re-quantization. It is a view
of rows of a storage (quantized_storage.py) shared by its aliases. A grouped one
(GroupedLinear's single parameter) holds one quantized tensor per row group (expert), each
with its own scales; ``split_groups()`` hands them to the per-expert GEMMs.

What torch ops do with it (``__torch_dispatch__``), in three kinds:

1. They keep it quantized (what ``fully_shard``, DTensor, ``to_empty`` and
   torch.distributed.checkpoint apply to a parameter):
   - ``detach`` / ``alias`` / ``view`` / ``reshape`` / contiguous ``as_strided``: another
     wrapper over the same bytes (what Parameter and autograd use);
   - ``split`` / ``chunk`` / ``narrow`` / ``slice`` along dim 0: views of fewer rows, cut where
     the format's scale blocks allow (``row_multiple``: 32 rows for MXFP8, 16 for NVFP4, 128
     for blockwise, 1 for float8); an op along another dim is an error;
   - ``clone``, ``deepcopy``, ``pickle``, ``.to(device)``: a copy of the bytes (same format);
   - ``new_zeros`` / ``new_empty`` / ``empty_like`` / ``zeros_like`` (no dtype given):
     quantized zeros of the same format (and row groups); with a dtype given
     (``torch.zeros_like(w, dtype=torch.float32)`` for ``main_grad``): a plain tensor;
   - ``copy_(src)`` (``load_state_dict``, checkpoints, master weights copied in after an
     optimizer step): from a QuantizedWeight of the same format, a byte copy (of rows: into
     those rows); from any other tensor, its values quantized into the weight, each row group
     from its own rows (an FSDP2 shard of a float8 / nvfp4 weight with the amax all-reduced
     over the ranks holding the other rows, so the bytes are those of quantizing the whole
     weight in one process); in place: every alias sees it;
   - DTensor's all-gather (``full_tensor()``) and FSDP2's (the ``fsdp_pre_all_gather`` /
     ``fsdp_post_all_gather`` hooks): the quantized bytes cross the wire (quantized_shards.py).
2. They are refused with an error naming the op and the format and saying what to do:
   any in-place op other than ``copy_`` (``add_``, ``mul_``, the optimizers' ``_foreach_*_``:
   quantized weights cannot be updated in place; keep FP32 master weights:
   ``qrecipe.optim.FusedAdam``), ops that would
   cut scale blocks, ``ones_like`` / ``full_like`` / random ``*_like``, other collectives.
3. Every other op reads the weight's values: it runs on the dequantized tensor (rowwise
   decode, original dtype) and returns plain tensors: printing, comparisons, arithmetic,
   ``t()`` / ``F.linear`` outside autocast, ``.float()``.

``__tensor_flatten__`` / ``__tensor_unflatten__`` expose the plain byte and scale tensors
(``_rowwise_data``, ``_rowwise_scale_inv``, ...; ``_g<i>_rowwise_data``, ... per piece of a
grouped weight) and the quantizer's spec, so tensor-subclass aware code (saved-tensor
hooks, FSDP2-style code) sees ordinary tensors inside. Unflattening copies the bytes into a
new engine tensor; with fake tensors (torch.compile) that is not supported yet. Pickles load
with ``torch.load(..., weights_only=True)``: the rebuild function is allow-listed at import.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_map

from .quantization import COLUMNWISE, DIRECTIONS, ROWWISE, QuantizedTensor, usage_bits
from .quantized_rows import KINDS, parts_of, row_geometry
from .quantized_shards import (GatheredLayout, directions_to_send, fill_gathered,
                               gather_capacity, gather_sets, record_gather)
from .quantized_storage import QuantizedStorage, requantize_many, usage_names
from .recipe import Recipe, RecipeLike, as_recipe

aten = torch.ops.aten


def _quantizer_from_spec(spec: Dict[str, Any], role: Tuple[str, str, str]):
    """A _C.Quantizer for a spec dictionary (cached: one small engine per spec and role)."""
    key = json.dumps([spec, list(role)], sort_keys=True)
    q = _SPEC_QUANTIZERS.get(key)
    if q is None:
        recipe = Recipe.from_dict({"version": 1, "name": "quantized-weight", "defaults": spec},
                                  source_name="<QuantizedWeight spec>")
        q = recipe.engine.resolve(*role)
        _SPEC_QUANTIZERS[key] = q
    return q


_SPEC_QUANTIZERS: Dict[str, Any] = {}


def _inner_name(group: int, direction: str, kind: str, num_groups: int) -> str:
    """The attribute holding one plain byte / scale tensor: ``_rowwise_data`` for a weight of
    one piece, ``_g2_rowwise_data`` (piece 2) for a grouped one."""
    prefix = f"_g{group}" if num_groups > 1 else ""
    return f"{prefix}_{direction}_{kind}"


_INNER_NAME = re.compile(r"^(?:_g(\d+))?_(rowwise|columnwise)_(data|scale_inv|amax)$")


class _Dequantize(torch.autograd.Function):
    """``QuantizedWeight.dequantize()`` with a straight-through gradient, so a model that
    calls it explicitly still trains the parameter (as the fallback ops do)."""

    @staticmethod
    def forward(ctx, weight, dtype):
        return weight._decode(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SplitGroups(torch.autograd.Function):
    """``QuantizedWeight.split_groups()``: one QuantizedWeight per row group, each a view of
    the weight's storage (so it reads whatever bytes the weight holds when it is used, e.g.
    after FSDP2 gathered them again for the backward); the gradient of the grouped weight is
    the groups' gradients stacked in order (``None`` when no group got one, e.g. all
    accumulated into ``main_grad``)."""

    @staticmethod
    def forward(ctx, weight):
        ctx.set_materialize_grads(False)
        groups = tuple(weight.group(i) for i in range(weight.num_groups))
        ctx.group_shapes = [g.shape for g in groups]
        return groups

    @staticmethod
    def backward(ctx, *grads):
        given = [g for g in grads if g is not None]
        if not given:
            return None
        return torch.cat([g if g is not None else given[0].new_zeros(shape)
                          for g, shape in zip(grads, ctx.group_shapes)], dim=0)


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (FSDP2's test too)."""
    return torch._C._current_graph_task_id() != -1


class QuantizedWeight(torch.Tensor):
    """A parameter stored quantized (see the module docstring). Build one with
    :meth:`from_tensor` or under :func:`quantized_model_init`.

    A grouped weight (``num_groups > 1``; GroupedLinear's single parameter under
    ``quantized_model_init``) stacks several tensors quantized separately along its rows:
    group ``i`` is rows ``[i*r, (i+1)*r)``, with its own scales, exactly the bytes a weight
    of those rows alone would hold. ``group(i)`` / ``split_groups()`` give one group as a
    QuantizedWeight; the per-direction buffer properties exist on single-group weights only.

    Every QuantizedWeight is a view of rows [start, stop) of a storage
    (quantized_storage.py) that its aliases (``detach``, ``view``, a Parameter made of it)
    share; ``split`` / ``narrow`` give views of fewer rows."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, quantized: Union[QuantizedTensor, Sequence[QuantizedTensor]],
                requires_grad: bool = False):
        groups = tuple(quantized) if isinstance(quantized, (list, tuple)) else (quantized,)
        if not groups or not all(isinstance(q, QuantizedTensor) for q in groups):
            raise TypeError("QuantizedWeight wraps a qrecipe.QuantizedTensor or a non-empty "
                            f"sequence of them (row groups), got {quantized!r}")
        first = groups[0]
        for i, q in enumerate(groups[1:], 1):
            if q.shape[1:] != first.shape[1:] or q.dtype != first.dtype or \
                    q.options != first.options or q.usage != first.usage:
                raise ValueError(
                    f"QuantizedWeight row groups must share their trailing shape, dtype, "
                    f"quantizer and usage: group 0 is {first!r} ({first.dtype}), group {i} is "
                    f"{q!r} ({q.dtype})")
        storage = QuantizedStorage.of_tensors(groups)
        return cls._view(storage, 0, storage.rows, None, requires_grad)

    @classmethod
    def _view(cls, storage: QuantizedStorage, start: int, stop: int,
              shape: Optional[Sequence[int]] = None,
              requires_grad: bool = False) -> "QuantizedWeight":
        """A QuantizedWeight over rows [start, stop) of `storage`; `shape`: its torch shape
        (default [rows, *trailing]), any shape of (stop - start) x cols elements."""
        if shape is None:
            shape = (stop - start, *storage.trailing)
        shape = torch.Size(shape)
        if shape.numel() != (stop - start) * storage.cols:
            raise ValueError(f"a QuantizedWeight view of {stop - start} rows x {storage.cols} "
                             f"columns cannot have shape {tuple(shape)}")
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=storage.dtype, device=storage.device, requires_grad=requires_grad)
        self._qstorage, self._start, self._stop = storage, int(start), int(stop)
        return self

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, quantizer, requires_grad: Optional[bool] = None,
                    groups: int = 1) -> "QuantizedWeight":
        """Quantizes `tensor` (both directions) with `quantizer` (a ``qrecipe.Quantizer`` or
        the engine's ``_C.Quantizer``). `groups` > 1 splits its rows into that many equal
        groups, each quantized as a tensor of its own (GroupedLinear's experts). A tensor on
        the meta device gives a QuantizedWeight on the meta device: the structure, no bytes
        (``to_empty`` then makes quantized zeros, and ``copy_`` quantizes values into it)."""
        cpp = getattr(quantizer, "_cpp", quantizer)
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or \
                tensor.dim() == 0 or tensor.shape[0] % groups:
            raise ValueError(f"QuantizedWeight.from_tensor: groups={groups!r} must be a positive "
                             f"int dividing the first dimension of the tensor of shape "
                             f"{tuple(tensor.shape)}")
        grad = tensor.requires_grad if requires_grad is None else requires_grad
        rows = [tensor.shape[0] // groups] * groups
        if tensor.is_meta:
            storage = QuantizedStorage(cpp, tensor.dtype, tensor.shape[1:], ROWWISE | COLUMNWISE,
                                       None, rows, device="meta")
            return cls._view(storage, 0, storage.rows, tensor.shape, grad)
        source = tensor.detach().contiguous()
        quantized = [QuantizedTensor(cpp.quantize(part, ROWWISE | COLUMNWISE), part.shape,
                                     part.dtype)
                     for part in source.chunk(groups, dim=0)]
        return cls(quantized, requires_grad=grad)

    # ------------------------------------------------------------ what it holds
    @property
    def num_groups(self) -> int:
        """How many row groups were quantized separately (1 for an ordinary weight)."""
        return len(self._group_bounds())

    def _group_bounds(self) -> List[Tuple[int, int]]:
        """[start, stop) of each row group (part) in this view, in storage rows."""
        return [(max(lo, self._start), min(hi, self._stop))
                for lo, hi in self._qstorage.group_bounds()
                if max(lo, self._start) < min(hi, self._stop)]

    def group(self, index: int) -> "QuantizedWeight":
        """Row group `index` as a QuantizedWeight viewing the same storage (not
        differentiable; see :meth:`split_groups`)."""
        bounds = self._group_bounds()
        if not -len(bounds) <= index < len(bounds):
            raise IndexError(f"group {index} of a QuantizedWeight of {len(bounds)} row groups")
        lo, hi = bounds[index]
        return QuantizedWeight._view(self._qstorage, lo, hi)

    def split_groups(self) -> Tuple["QuantizedWeight", ...]:
        """Every row group as a QuantizedWeight viewing the same storage, differentiable: their
        gradients reach this weight stacked in group order."""
        return _SplitGroups.apply(self)

    @property
    def _groups(self) -> List[QuantizedTensor]:
        """One QuantizedTensor per row group of this view (see QuantizedStorage.groups_in)."""
        self._require_bytes("reading its bytes")
        return self._qstorage.groups_in(self._start, self._stop)

    @property
    def quantized(self) -> QuantizedTensor:
        """The ``qrecipe.QuantizedTensor`` (inspection object) holding the bytes."""
        if self.num_groups != 1:
            raise ValueError(f"this QuantizedWeight holds {self.num_groups} row groups "
                             "quantized separately; inspect one with .group(i)")
        return self._groups[0]

    @property
    def engine_tensor(self):
        """The engine's quantized tensor (``_C.QuantizedTensor``): a GEMM operand."""
        return self.quantized._cpp

    format = property(lambda self: self._qstorage.format)
    options = property(lambda self: self._qstorage.quantizer.describe())
    usage = property(lambda self: usage_names(self._qstorage.usage))
    rowwise_data = property(lambda self: self.quantized.rowwise_data)
    rowwise_scale_inv = property(lambda self: self.quantized.rowwise_scale_inv)
    rowwise_amax = property(lambda self: self.quantized.rowwise_amax)
    columnwise_data = property(lambda self: self.quantized.columnwise_data)
    columnwise_scale_inv = property(lambda self: self.quantized.columnwise_scale_inv)
    columnwise_amax = property(lambda self: self.quantized.columnwise_amax)

    def layout(self, direction: str) -> dict:
        return self.quantized.layout(direction)

    @property
    def row_multiple(self) -> int:
        """Rows a cut inside this weight (or inside one of its row groups) must be a multiple
        of: the block height of the format's scales (quantized_rows.py)."""
        return self._qstorage.row_multiple()

    @property
    def needs_shared_amax(self) -> bool:
        """Whether requantizing these rows needs the amax of rows other ranks hold: a shard
        (FSDP2) of a format with a per-tensor scale or amax (float8, nvfp4). ``copy_`` then
        all-reduces it (every rank holding a shard must call it, SPMD); an optimizer writing
        the bytes itself must do the same (``qrecipe.quantized_param.requantize_``)."""
        return self._qstorage.is_shard and self._qstorage.tensor_level()

    # ------------------------------------------------------------ initial value
    def get_high_precision_init_val(self) -> Optional[torch.Tensor]:
        """The high-precision value this parameter was quantized from, when it was created
        under ``quantized_model_init(..., keep_init_values=True)`` and no optimizer has taken
        it yet (a CPU tensor of the parameter's shape and dtype); otherwise None.
        ``qrecipe.optim.FusedAdam`` starts its FP32 master from it (TransformerEngine's
        ``preserve_high_precision_init_val``)."""
        return getattr(self, "_high_precision_init_val", None)

    def clear_high_precision_init_val(self) -> None:
        """Drops the kept initial value (the optimizer calls it once its master holds it)."""
        if hasattr(self, "_high_precision_init_val"):
            del self._high_precision_init_val

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The decoded tensor (rowwise data; the original dtype unless `dtype`), a plain tensor.
        Differentiable (straight-through) when the weight requires grad."""
        return _Dequantize.apply(self, dtype or self.dtype)

    def _decode(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        self._require_bytes("decoding it")
        direction = "rowwise" if self._qstorage.usage & ROWWISE else "columnwise"
        parts = [t.dequantize(direction, dtype or self.dtype)
                 for t in self._qstorage.tensors_in(self._start, self._stop)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return out.reshape(self.shape)

    def _require_bytes(self, what: str) -> None:
        if self._qstorage.is_meta:
            raise RuntimeError(
                f"{what}: this {self.format} QuantizedWeight is on the meta device and holds no "
                "bytes yet; materialize the module first (module.to_empty(device=...), then "
                "reset_parameters() or load a checkpoint)")

    def __repr__(self, *, tensor_contents=None) -> str:
        groups = f", groups={self.num_groups}" if self.num_groups > 1 else ""
        return (f"QuantizedWeight(format={self.format!r}, shape={tuple(self.shape)}, "
                f"dtype={self.dtype}, device={self.device}, usage={'+'.join(self.usage)}"
                f"{groups}, requires_grad={self.requires_grad}, options={self.options!r})")

    # ------------------------------------------------------------ rows of the view
    def _whole(self) -> bool:
        return self._start == 0 and self._stop == self._qstorage.rows

    def _rows_per_index(self, op) -> int:
        """Rows of the storage one index of dim 0 covers (1 for a [rows, ...] view)."""
        inner = math.prod(self.shape[1:]) if self.dim() > 1 else 1
        if self.dim() == 0 or inner % self._qstorage.cols:
            raise RuntimeError(_refusal(op, self, "along dim 0 of this view, whose dim-0 "
                                        "entries do not hold whole rows of the quantized "
                                        f"tensor (it is viewed as {tuple(self.shape)})",
                                        "apply the op to a [rows, ...] view of the weight"))
        return inner // self._qstorage.cols

    def _row_slice(self, op, begin: int, end: int) -> "QuantizedWeight":
        """Entries [begin, end) of dim 0 as a view of the same storage."""
        per = self._rows_per_index(op)
        return self._rows(op, self._start + begin * per, self._start + end * per,
                          (end - begin, *self.shape[1:]))

    def _rows(self, op, start: int, stop: int, shape) -> "QuantizedWeight":
        """Storage rows [start, stop) as a view of shape `shape`, cut where the format's
        blocks allow (quantized_rows.py)."""
        if (start, stop) != (self._start, self._stop):
            for at in (start, stop):
                try:
                    self._qstorage.check_cut(at, str(op))
                except ValueError as error:
                    raise ValueError(f"{error}. Under FSDP2 (fully_shard) a quantized weight's "
                                     "first dimension must be a multiple of world size x "
                                     f"{self.row_multiple}") from None
        return QuantizedWeight._view(self._qstorage, start, stop, shape)

    # ------------------------------------------------------------ copies
    def _spec(self) -> Dict[str, Any]:
        return self._qstorage.quantizer.spec_dict()

    def _role(self) -> Tuple[str, str, str]:
        """(module_type, tensor_type, name) of the quantizer that made the bytes."""
        return tuple(self._qstorage.quantizer.role_fields)

    def _group_rows(self) -> Tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self._group_bounds())

    def _pieces(self) -> List[QuantizedTensor]:
        return [] if self._qstorage.is_meta else self._qstorage.tensors_in(self._start, self._stop)

    def _buffers(self) -> List[Dict[str, Dict[str, Optional[torch.Tensor]]]]:
        """Per piece: {direction: {kind: plain tensor or None}} of the directions it holds."""
        return [parts_of(p._cpp) for p in self._pieces()]

    def _usage_bits(self) -> int:
        return self._qstorage.usage

    def _copy_view(self, device=None, requires_grad: bool = False) -> "QuantizedWeight":
        """A QuantizedWeight of new bytes (on `device`) equal to this view's, with its place in
        the whole tensor (groups, first row, amax group) kept."""
        s = self._qstorage
        device = torch.device(device) if device is not None else s.device
        pieces = self._pieces()
        copies = None
        if device.type != "meta" and not s.is_meta:
            copies = []
            for p in pieces:
                moved = {d: {k: (None if t is None else t.to(device, copy=True))
                             for k, t in b.items()} for d, b in parts_of(p._cpp).items()}
                cpp = s.quantizer.from_buffers(p.shape[0], s.cols, s.usage, moved, device)
                copies.append(QuantizedTensor(cpp, p.shape, s.dtype))
            rows = [p.shape[0] for p in pieces]
        else:
            rows = [min(hi, self._stop) - max(lo, self._start) for lo, hi in s.piece_bounds()
                    if max(lo, self._start) < min(hi, self._stop)]
        storage = QuantizedStorage(s.quantizer, s.dtype, s.trailing, s.usage, copies, rows,
                                   s.group_rows, s.row_start + self._start, device)
        storage.amax_group, storage.reshard_after_forward = s.amax_group, s.reshard_after_forward
        return QuantizedWeight._view(storage, 0, storage.rows, self.shape, requires_grad)

    def __getattr__(self, name: str):
        # The plain tensors __tensor_flatten__ names (_rowwise_data, _g2_columnwise_amax, ...),
        # read from the pieces this view covers.
        match = _INNER_NAME.match(name)
        if match is None or "_qstorage" not in self.__dict__:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        pieces = self._pieces()
        index = int(match.group(1) or 0)
        if (match.group(1) is None) != (len(pieces) == 1) or index >= len(pieces):
            raise AttributeError(f"this QuantizedWeight has {len(pieces)} pieces; no {name}")
        return pieces[index]._buffer(match.group(3), match.group(2))

    def __tensor_flatten__(self):
        pieces = self._pieces()
        n = len(pieces)
        names = [_inner_name(i, d, k, n) for i, p in enumerate(pieces)
                 for d, kinds in parts_of(p._cpp).items() for k, t in kinds.items()
                 if t is not None]
        s = self._qstorage
        ctx = {"spec": self._spec(), "role": self._role(), "shape": tuple(self.shape),
               "dtype": self.dtype, "usage": s.usage,
               "group_rows": tuple(p.shape[0] for p in pieces) if pieces else
               tuple(self._group_rows()),
               "groups": s.group_rows, "row_start": s.row_start + self._start,
               "meta": s.is_meta}
        return names, ctx

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        return _rebuild(inner_tensors, ctx, False, False)

    def __reduce_ex__(self, protocol):
        names, ctx = self.__tensor_flatten__()
        inner = {n: getattr(self, n).detach().clone() for n in names}
        return (_rebuild, (inner, ctx, self.requires_grad, getattr(self, "_is_param", False)))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        copy = self._copy_view(requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        init = self.get_high_precision_init_val()
        if init is not None:  # a copy made before the optimizer took it keeps it too
            copy._high_precision_init_val = init.clone()
        memo[id(self)] = copy
        return copy

    # ------------------------------------------------------------ in-place copy
    def _copy_from(self, src: torch.Tensor) -> None:
        what = "copy_ into a QuantizedWeight"
        s = self._qstorage
        if tuple(src.shape) != tuple(self.shape):
            raise RuntimeError(f"copy_ into a QuantizedWeight of shape {tuple(self.shape)} from "
                               f"a tensor of shape {tuple(src.shape)}")
        if isinstance(src, QuantizedWeight) and src.options == self.options and \
                src._qstorage.usage == s.usage:
            theirs = src._qstorage
            if self._whole() and not s.structured:
                # A fresh tensor (new_zeros of another shape; FSDP2 copies each shard into
                # one) takes the source's place in the whole weight: its groups, first row
                # and amax group.
                s.adopt_structure(theirs.group_rows, theirs.row_start + src._start,
                                  theirs.amax_group)
                if s.is_meta:
                    s.piece_rows = [p.rows for p in s.local_groups()]
            if s.is_meta:
                return
            src._require_bytes("copy_ from it")
            s.write(self._start, self._stop, src._pieces(), what)
            return
        if isinstance(src, QuantizedWeight):
            src = src._decode()
        if s.is_meta:
            return
        if src.is_meta:
            raise RuntimeError("copy_ of a meta tensor into a QuantizedWeight that holds bytes")
        values = src.detach().to(self.device, self.dtype).reshape(self._stop - self._start,
                                                                  s.cols)
        requantize_many([(s, self._start, self._stop, values)], what)

    # ------------------------------------------------------------ FSDP2 extension hooks
    def fsdp_pre_all_gather(self, mesh, outer_size=None, outer_stride=None, module=None,
                            mp_policy=None):
        """FSDP2: the bytes this rank's shard contributes to the all-gather (ONE uint8 buffer:
        quantized_shards.py), never the decoded values. torch calls it with (mesh) or (mesh,
        outer_size, outer_stride, module, mp_policy) depending on its version."""
        s = self._qstorage
        what = f"FSDP2 all-gather of a {s.format} QuantizedWeight"
        world, rank = mesh.size(), mesh.get_local_rank()
        if not self._whole():
            # FSDP2 pads an uneven shard: it is then a view of fewer rows of a padded buffer.
            total = outer_size[0] if outer_size is not None else "?"
            raise RuntimeError(
                f"{what}: rank {rank} of {world} holds {self.shape[0]} rows of a padded shard "
                f"of {s.rows} rows (the weight has {total} rows): FSDP2 pads uneven shards, "
                f"but quantized weights are sharded evenly. The weight's first dimension must "
                f"be a multiple of {world} x {s.row_multiple()} (world size x the format's "
                "row multiple): shard over fewer ranks or pad the layer")
        self._require_bytes(what)
        if s.amax_group is None:
            s.amax_group = mesh.get_group()
        directions, derive = directions_to_send(
            s.quantizer, usage_names(s.usage), _in_backward(), torch.is_grad_enabled(),
            s.reshard_after_forward)
        check_even_shard(s, world, rank, what)
        plan = s.shard_plan(world, directions)
        capacity = gather_capacity([s.shard_plan(world, d) for d in gather_sets(
            s.quantizer, usage_names(s.usage), s.reshard_after_forward)] + [plan])
        packed = plan.pack(rank, s.canonical_parts(what), s.device, capacity)
        record_gather(packed.numel(), world)
        return (packed,), (directions, derive, world, capacity)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """FSDP2: the unsharded weight from the gathered bytes: every group's buffers rebuilt
        in one flat buffer FSDP2 frees after use (it is returned as the inner tensor), and the
        engine tensors made over it again after every all-gather (`out`: the unsharded
        parameter of the earlier ones)."""
        (gathered,) = all_gather_outputs
        directions, derive, world, capacity = metadata
        s = self._qstorage
        plan = s.shard_plan(world, directions)
        dtype = param_dtype or s.dtype
        if out is not None:
            target = out._qstorage
            layout, flat = target.gathered
        else:
            layout = GatheredLayout(s.quantizer, s.cols, s.group_rows, s.usage)
            flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=gathered.device)
            target = None
        groups = fill_gathered(plan, layout, flat, gathered, derive, capacity)
        tensors = []
        for rows, parts in zip(s.group_rows, groups):
            cpp = s.quantizer.from_tensors(rows, s.cols, sum(usage_bits(d) for d in parts),
                                             parts, gathered.device)
            tensors.append(QuantizedTensor(cpp, torch.Size([rows, *s.trailing]), dtype))
        if target is not None:
            target.set_pieces(tensors, s.group_rows)
            return None
        storage = QuantizedStorage(s.quantizer, dtype, s.trailing, usage_bits(tensors[0].usage),
                                   tensors, s.group_rows, device=gathered.device)
        storage.gathered = (layout, flat)
        return QuantizedWeight._view(storage, 0, storage.rows), (flat,)

    # ------------------------------------------------------------ dispatch
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            result = handler(func, *args, **kwargs)
            if result is not NotImplemented:
                return result
        if func.name() == "_c10d_functional::_wrap_tensor_autograd" and \
                isinstance(args[0], QuantizedWeight):
            return _wrap_result(func, args[0])
        if func.namespace in ("c10d", "_c10d_functional") and \
                any(isinstance(a, QuantizedWeight) for a in _flat(args, kwargs)):
            raise RuntimeError(_refusal(func, _first_weight(args, kwargs),
                                        "as a collective's input",
                                        "gather it with DTensor.full_tensor() / FSDP2, or run "
                                        "the collective on w.dequantize()"))
        _refuse_mutation(func, args, kwargs)
        if func in _REFUSED_CREATION:
            raise RuntimeError(_refusal(func, _first_weight(args, kwargs),
                                        "to make a new tensor of given values like it",
                                        "make a plain tensor (torch.ones(w.shape, "
                                        "dtype=w.dtype)) and copy_ it into a QuantizedWeight"))

        def unwrap(t):
            return t._decode() if isinstance(t, QuantizedWeight) else t

        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


def _flat(args, kwargs) -> list:
    out = []
    for a in list(args) + list(kwargs.values()):
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


def _first_weight(args, kwargs) -> "QuantizedWeight":
    return next(a for a in _flat(args, kwargs) if isinstance(a, QuantizedWeight))


def _refusal(op, weight: "QuantizedWeight", why: str, todo: str) -> str:
    return (f"{op} on a {weight.format} QuantizedWeight of shape {tuple(weight.shape)} is not "
            f"supported {why}: it cannot keep the tensor quantized, and qrecipe never "
            f"dequantizes a parameter silently. {todo[0].upper() + todo[1:]}")


def check_even_shard(storage: QuantizedStorage, world: int, rank: int, what: str) -> None:
    """A shard FSDP2 gathers must be rank's equal share of the whole weight's rows."""
    total = sum(storage.group_rows)
    if total % world or storage.rows * world != total or \
            storage.row_start != rank * storage.rows:
        raise RuntimeError(
            f"{what}: rank {rank} of {world} holds rows [{storage.row_start}, "
            f"{storage.row_start + storage.rows}) of {total}; quantized weights are sharded "
            f"evenly, rank r holding rows [r*{total}/{world}, (r+1)*{total}/{world}). The "
            f"weight's first dimension must be a multiple of {world} x "
            f"{storage.row_multiple()} (world size x the format's row multiple): shard over "
            "fewer ranks or pad the layer")


# -------------------------------------------------------------------- the ops
_HANDLERS: Dict[Any, Callable] = {}


def _handles(*ops):
    def register(fn):
        for op in ops:
            _HANDLERS[op] = fn
        return fn
    return register


@_handles(aten.detach.default, aten.alias.default)
def _alias(func, self):
    return QuantizedWeight._view(self._qstorage, self._start, self._stop, self.shape)


@_handles(aten.view.default, aten._unsafe_view.default)
def _reshape(func, self, size):
    shape = _infer_shape(size, self.numel())
    return QuantizedWeight._view(self._qstorage, self._start, self._stop, shape)


def _infer_shape(size, numel: int) -> torch.Size:
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = numel // known if known else 0
    return torch.Size(size)


@_handles(aten.as_strided.default)
def _as_strided(func, self, size, stride, storage_offset=None):
    """A contiguous view of whole rows (FSDP2 makes the unsharded parameter with one); the
    offset counts elements from this view's first row."""
    size = torch.Size(size)
    contiguous = tuple(torch.empty(size, device="meta").stride())
    offset = int(storage_offset or 0)
    cols = self._qstorage.cols
    if (size.numel() and tuple(stride) != contiguous) or offset % cols or \
            size.numel() % cols or offset + size.numel() > self.numel():
        raise RuntimeError(_refusal(func, self, f"with size {tuple(size)}, stride "
                                    f"{tuple(stride)} and offset {offset}",
                                    "only contiguous views of whole rows stay quantized"))
    start = self._start + offset // cols
    return self._rows(func, start, start + size.numel() // cols, size)


@_handles(aten.split.Tensor)
def _split(func, self, split_size, dim=0):
    length = self.shape[dim] if self.dim() else 0
    sizes = [min(split_size, length - i) for i in range(0, length, split_size)] if split_size \
        else [length]
    return _split_with_sizes(func, self, sizes or [0], dim)


@_handles(aten.split_with_sizes.default)
def _split_with_sizes(func, self, split_sizes, dim=0):
    dim = dim % max(self.dim(), 1)
    if dim != 0:
        if len(split_sizes) == 1:
            return [_alias(func, self)]
        raise RuntimeError(_refusal(func, self, f"along dim {dim}", "cut quantized weights "
                                    "along dim 0 (FSDP2: the default Shard(0) placement)"))
    out, at = [], 0
    for n in split_sizes:
        out.append(self._row_slice(func, at, at + n))
        at += n
    return out


@_handles(aten.slice.Tensor)
def _slice(func, self, dim=0, start=None, end=None, step=1):
    dim = dim % max(self.dim(), 1)
    length = self.shape[dim]
    begin, stop = slice(start, end).indices(length)[:2]
    stop = max(begin, stop)
    if (begin, stop) == (0, length) and step == 1:
        return _alias(func, self)
    if dim != 0 or step != 1:
        raise RuntimeError(_refusal(func, self, f"along dim {dim} with step {step}",
                                    "slice quantized weights along dim 0 with step 1, or "
                                    "slice w.dequantize()"))
    return self._row_slice(func, begin, stop)


@_handles(aten.clone.default)
def _clone(func, self, memory_format=None):
    return self._copy_view()


@_handles(aten._to_copy.default)
def _to_copy(func, self, **kwargs):
    if _is_device_move(self, kwargs):
        return self._copy_view(device=kwargs["device"])
    return NotImplemented  # a dtype or layout change: the decoded values (documented)


@_handles(aten.copy_.default)
def _copy(func, dst, src, non_blocking=False):
    if not isinstance(dst, QuantizedWeight):
        return NotImplemented  # a plain tensor receives the decoded values
    dst._copy_from(src)
    return dst


@_handles(aten._foreach_copy_.default)
def _foreach_copy(func, dsts, srcs, non_blocking=False):
    for d, s in zip(dsts, srcs):
        d.copy_(s)
    return None


def _like_dtype_given(self, kwargs) -> bool:
    """`*_like` / `new_*` with a dtype given: a plain buffer of that dtype shaped like the
    weight (e.g. ``main_grad = torch.zeros_like(w, dtype=torch.float32)``), not a weight."""
    return kwargs.get("dtype") is not None


@_handles(aten.new_zeros.default, aten.new_empty.default)
def _new_zeros(func, self, size, **kwargs):
    if _like_dtype_given(self, kwargs):
        return NotImplemented
    return _zeros(func, self, torch.Size(size), kwargs.get("device"))


@_handles(aten.new_empty_strided.default)
def _new_empty_strided(func, self, size, stride, **kwargs):
    if _like_dtype_given(self, kwargs):
        return NotImplemented
    return _zeros(func, self, torch.Size(size), kwargs.get("device"))


@_handles(aten.empty_like.default, aten.zeros_like.default)
def _zeros_like(func, self, **kwargs):
    if _like_dtype_given(self, kwargs):
        return NotImplemented
    return _zeros(func, self, self.shape, kwargs.get("device"), same_rows=True)


def _zeros(func, self, size: torch.Size, device, same_rows: bool = False) -> "QuantizedWeight":
    """A QuantizedWeight of the same format holding zeros (``empty`` too: quantized zeros,
    deterministic); the same row groups and place in the whole tensor when it has this
    view's rows."""
    cols = self._qstorage.cols
    if size.numel() % cols:
        raise RuntimeError(_refusal(func, self, f"with size {tuple(size)}", "new quantized "
                                    f"tensors hold whole rows of {cols} elements"))
    rows = size.numel() // cols
    storage = self._qstorage
    if same_rows or (rows == storage.rows and self._whole()):
        out = storage.zeros_like(device=device)
    else:
        out = storage.zeros_like(rows, device)
    return QuantizedWeight._view(out, 0, out.rows, size)


@_handles(aten.is_pinned.default)
def _is_pinned(func, self, device=None):
    pieces = self._pieces()
    return bool(pieces) and all(t is None or t.is_pinned() for p in pieces
                                for b in parts_of(p._cpp).values() for t in b.values())


@_handles(aten.is_same_size.default)
def _is_same_size(func, a, b):
    return a.shape == b.shape


@_handles(torch.ops._c10d_functional.all_gather_into_tensor.default)
def _all_gather(func, self, group_size, group_name):
    """DTensor's all-gather of a Shard(0) QuantizedWeight (``full_tensor()``, a replicated
    redistribute, a full state dict): its bytes gathered like FSDP2's (one uint8 buffer per
    rank), giving the whole quantized weight."""
    import torch.distributed as dist
    s = self._qstorage
    what = f"all-gathering a {s.format} QuantizedWeight"
    self._require_bytes(what)
    if not self._whole():
        raise RuntimeError(f"{what}: the input is a view of part of its storage")
    resolve = getattr(dist.distributed_c10d, "_resolve_process_group", None)
    if resolve is None:
        raise RuntimeError(f"{what}: this torch has no way to resolve the group name "
                           f"{group_name!r} of a functional collective")
    group = resolve(group_name)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world != group_size:
        raise RuntimeError(f"{what}: the process group has {world} ranks, not {group_size}")
    check_even_shard(s, world, rank, what)
    directions = usage_names(s.usage)
    plan = s.shard_plan(world, directions)
    packed = plan.pack(rank, s.canonical_parts(what), s.device)
    gathered = torch.ops._c10d_functional.wait_tensor(func(packed, group_size, group_name))
    layout = GatheredLayout(s.quantizer, s.cols, s.group_rows, s.usage)
    flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=s.device)
    groups = fill_gathered(plan, layout, flat, gathered, False)
    tensors = []
    for rows, parts in zip(s.group_rows, groups):
        cpp = s.quantizer.from_buffers(rows, s.cols, s.usage, parts, s.device)
        tensors.append(QuantizedTensor(cpp, torch.Size([rows, *s.trailing]), s.dtype))
    storage = QuantizedStorage(s.quantizer, s.dtype, s.trailing, s.usage, tensors, s.group_rows,
                               device=s.device)
    shape = (world * self.shape[0], *self.shape[1:]) if self.dim() else self.shape
    return QuantizedWeight._view(storage, 0, storage.rows, shape)


@_handles(torch.ops._c10d_functional.wait_tensor.default)
def _wait(func, self):
    return self  # the gather above already waited for its bytes



def _wrap_result(func, self):
    """``_c10d_functional._wrap_tensor_autograd`` (newer torch wraps a functional
    collective's result for autograd; registered when torch.distributed's functional
    collectives are imported, so matched by name in __torch_dispatch__): the gathered weight
    as it is (another wrapper over it), complete already, no pending collective to wait for."""
    return _alias(func, self)


# Creation ops with given values "like" a weight: refused (quantizing ones or random values
# into the weight's format is never what FSDP2, DTensor or an optimizer means).
_REFUSED_CREATION = {getattr(aten, n).default for n in
                     ("ones_like", "full_like", "rand_like", "randn_like", "new_ones",
                      "new_full")}


def _is_device_move(src, kwargs) -> bool:
    """``_to_copy`` that only changes the device (``.to(device)``, ``.cuda()``, ``.cpu()``):
    the bytes move as they are. A dtype or layout change goes through the decoded tensor."""
    if not isinstance(src, QuantizedWeight) or kwargs.get("device") is None:
        return False
    neutral = {"dtype": (None, src.dtype), "layout": (None, torch.strided),
               "pin_memory": (None, False), "non_blocking": (None, False, True),
               "memory_format": (None, torch.preserve_format, torch.contiguous_format)}
    return all(k == "device" or (k in neutral and v in neutral[k]) for k, v in kwargs.items())


def _refuse_mutation(func, args, kwargs) -> None:
    """In-place ops that would write a QuantizedWeight: a clear error, never a silent no-op
    on a dequantized copy."""
    if not func._schema.is_mutable:
        return
    values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
    for arg, value in zip(func._schema.arguments, values):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, QuantizedWeight) for v in items):
            raise RuntimeError(
                f"{func} would modify a qrecipe QuantizedWeight in place, which is not "
                "supported: the weight is stored quantized and an update applied to its "
                "dequantized copy would be lost. Train it with qrecipe.optim.FusedAdam, which "
                "keeps an FP32 master weight and requantizes the parameter from it each step "
                "(or build the model without qrecipe.quantized_model_init, so qrecipe "
                "quantizes the high-precision weights each step). To change a weight's value, "
                "use copy_.")


def requantize_(weights: Sequence["QuantizedWeight"], sources: Sequence[torch.Tensor]) -> None:
    """``w.copy_(src)`` for many weights at once, with ONE amax all-reduce per process group
    for all the FSDP2 shards among them whose format has a per-tensor scale or amax
    (``needs_shared_amax``): what an optimizer stepping sharded quantized weights calls after
    updating their FP32 masters (every rank the same weights, in the same order). A DTensor
    weight is written through its local shard."""
    writes = []
    for w, src in zip(weights, sources):
        local = getattr(w, "_local_tensor", w)
        values = getattr(src, "_local_tensor", src)
        if isinstance(values, QuantizedWeight):
            values = values._decode()
        if not isinstance(local, QuantizedWeight):
            raise TypeError(f"requantize_ takes QuantizedWeights (or DTensors of them), got "
                            f"{type(local).__name__}")
        if tuple(values.shape) != tuple(local.shape):
            raise ValueError(f"requantize_: a value of shape {tuple(values.shape)} for a weight "
                             f"of shape {tuple(local.shape)}")
        s = local._qstorage
        values = values.detach().to(local.device, local.dtype).reshape(
            local._stop - local._start, s.cols)
        writes.append((s, local._start, local._stop, values))
    with torch.no_grad():
        requantize_many(writes, "requantize_")


def _rebuild(inner_tensors, ctx, requires_grad: bool, is_param: bool):
    """Unpickling / unflattening: a QuantizedWeight from its plain tensors and spec."""
    quantizer = _quantizer_from_spec(ctx["spec"], tuple(ctx["role"]))
    shape = torch.Size(ctx["shape"])
    piece_rows = tuple(ctx.get("group_rows", (shape[0],)))  # saved before groups: one
    rows_total = sum(piece_rows)
    cols = shape.numel() // rows_total if rows_total else 0
    trailing = tuple(shape[1:]) if shape and shape[0] == rows_total else (cols,)
    groups = ctx.get("groups", piece_rows)
    row_start = ctx.get("row_start", 0)
    if ctx.get("meta"):
        storage = QuantizedStorage(quantizer, ctx["dtype"], trailing, ctx["usage"], None,
                                   piece_rows, groups, row_start, device="meta")
    else:
        pieces = []
        for i, rows in enumerate(piece_rows):
            buffers: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
            device = None
            for d in DIRECTIONS:
                if ctx["usage"] & usage_bits(d):
                    buffers[d] = {k: inner_tensors.get(_inner_name(i, d, k, len(piece_rows)))
                                  for k in KINDS}
                    device = device or buffers[d]["data"].device
            cpp = quantizer.from_buffers(rows, cols, ctx["usage"], buffers, device)
            pieces.append(QuantizedTensor(cpp, torch.Size([rows, *trailing]), ctx["dtype"]))
        storage = QuantizedStorage(quantizer, ctx["dtype"], trailing, ctx["usage"], pieces,
                                   piece_rows, groups, row_start)
    weight = QuantizedWeight._view(storage, 0, storage.rows, shape, requires_grad)
    if is_param:
        weight = torch.nn.Parameter(weight, requires_grad=requires_grad)
    return weight


# torch.load(..., weights_only=True) (torch's default since 2.6, and what
# torch.distributed.checkpoint reads with) may call _rebuild: it builds a QuantizedWeight from
# tensors and a spec validated like a recipe, and runs nothing else.
torch.serialization.add_safe_globals([_rebuild])


# -------------------------------------------------------------------- quantized_model_init
class _InitState(threading.local):
    def __init__(self) -> None:
        # (recipe or None when disabled, keep_init_values) per enclosing block
        self.stack: List[Tuple[Optional[Any], bool]] = []


_init_state = _InitState()


def current_init_recipe():
    """The recipe of the innermost enabled quantized_model_init block, or None."""
    return _init_state.stack[-1][0] if _init_state.stack else None


def current_init_keeps_values() -> bool:
    """Whether the innermost quantized_model_init block keeps the initial values."""
    return _init_state.stack[-1][1] if _init_state.stack else False


@contextlib.contextmanager
def quantized_model_init(recipe: RecipeLike = None, enabled: bool = True,
                         keep_init_values: bool = False):
    """Parameters of the qrecipe modules created inside are quantized at creation: each GEMM
    weight becomes a :class:`QuantizedWeight` (both directions) quantized by the quantizer
    `recipe` gives its role (module type, ``weight``, the name passed to the constructor);
    GroupedLinear's single grouped parameter becomes a grouped QuantizedWeight, each expert's
    rows quantized on their own. Biases and norm parameters stay high precision. Nestable;
    ``enabled=False`` turns it off.

    ``keep_init_values=True`` (TransformerEngine's ``preserve_high_precision_init_val``) also
    keeps each weight's high-precision initial value, on the CPU, on the parameter
    (``get_high_precision_init_val()``) until an optimizer takes it:
    ``qrecipe.optim.FusedAdam`` starts its FP32 master from that exact value and then frees it.
    Without it the master starts from the dequantized weight.

    Training such a model needs FP32 master weights (``qrecipe.optim.FusedAdam``): an optimizer
    updating the quantized parameters in place raises an error saying so."""
    if not isinstance(keep_init_values, bool):
        raise TypeError(f"quantized_model_init: keep_init_values must be a bool, got "
                        f"{keep_init_values!r}")
    _init_state.stack.append((as_recipe(recipe) if enabled else None, keep_init_values))
    try:
        yield
    finally:
        _init_state.stack.pop()


def quantize_module_parameters(module: torch.nn.Module, recipe,
                               keep_init_values: bool = False) -> None:
    """Replaces the module's GEMM weights (``module._quantized_weight_roles()``) by
    QuantizedWeight parameters quantized under `recipe`, each in the row groups
    ``module._quantized_weight_groups(name)`` says. A weight on the meta device becomes a
    QuantizedWeight on the meta device (structure only; ``to_empty`` + ``reset_parameters``
    quantize its values later: meta-device init, FSDP2's included). With `keep_init_values` each keeps a CPU copy of
    the value it was quantized from (not a meta one: it has no value)."""
    for param_name, role in module._quantized_weight_roles().items():
        param = getattr(module, param_name)
        if param is None or isinstance(param, QuantizedWeight):
            continue
        quantizer = recipe.engine.resolve(*role)
        if quantizer is None:
            continue  # the recipe keeps this weight in high precision
        weight = QuantizedWeight.from_tensor(param, quantizer, requires_grad=param.requires_grad,
                                             groups=module._quantized_weight_groups(param_name))
        new_param = torch.nn.Parameter(weight, requires_grad=param.requires_grad)
        # On the parameter object itself (a detached alias does not carry it); a meta weight
        # has no value to keep.
        if keep_init_values and not param.is_meta:
            new_param._high_precision_init_val = param.detach().to("cpu", copy=True)
        setattr(module, param_name, new_param)


class QuantizedInitMixin:
    """Gives a qrecipe module quantized parameters under ``quantized_model_init``: after the
    outermost ``__init__`` of the module's class returns, its GEMM weights are quantized.
    A module lists them in ``_quantized_weight_roles()``: {parameter name: (module_type,
    tensor_type, role name)}; the default is ``weight`` with (MODULE_TYPE, "weight", name).
    A parameter stacking several GEMMs' weights along its rows (GroupedLinear's single
    parameter) says in ``_quantized_weight_groups(name)`` how many equal row groups to
    quantize separately (default 1)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__

        def __init__(self, *args, **kw):
            depth = getattr(self, "_qrecipe_init_depth", 0)
            object.__setattr__(self, "_qrecipe_init_depth", depth + 1)
            try:
                init(self, *args, **kw)
            finally:
                object.__setattr__(self, "_qrecipe_init_depth", depth)
            if depth == 0:
                recipe = current_init_recipe()
                if recipe is not None:
                    quantize_module_parameters(self, recipe, current_init_keeps_values())

        cls.__init__ = functools.wraps(init)(__init__)  # keeps the signature for help()

    def _quantized_weight_roles(self) -> Dict[str, Tuple[str, str, str]]:
        if getattr(self, "weight", None) is None:
            return {}
        return {"weight": (type(self).MODULE_TYPE, "weight", getattr(self, "name", ""))}

    def _quantized_weight_groups(self, param_name: str) -> int:
        return 1
