"""Row ranges of quantized tensors, for every format, read off the layouts its quantizer
describes (docs/numerics.md): cutting a quantized tensor into row ranges, joining row ranges
back into one tensor, quantized zeros, and the columnwise copy built from the rowwise one
where a format defines it as a transpose. QuantizedWeight's dim-0 ops (split, narrow, ...),
its FSDP2 shards and their all-gather (quantized_shards.py) are made of these.

    geometry = row_geometry(quantizer, cols)      # per direction: where rows run in each buffer
    parts = take_rows(quantizer, tensor, 0, 64)   # rows [0, 64): {direction: {kind: tensor}}
    joined = join_rows(quantizer, [parts_a, parts_b], [64, 64], cols)
    tensor = build(quantizer, 128, cols, usage, joined, device)

A quantized tensor is 2-D [rows, cols] (leading dims flattened). Per direction it holds:
- data: its row axis is 0, or 1 when the layout stores it transposed; 4-bit codes packed two
  per byte along the row axis take half a byte per row;
- block scales (``scale_mode`` block / block+tensor): the scale array's row axis is 0, or 1
  when ``scale_transposed``; one entry covers ``block[0]`` rows; entries past
  ceil(rows / block[0]) are the layout's zero padding;
- per-tensor quantities (the FP32 ``scale_inv`` of ``scale_mode`` tensor, the FP32 ``amax``):
  shared by every row, so a row range keeps its tensor's values and two row ranges join only
  when theirs are equal.

A cut inside a tensor must fall on a multiple of :func:`row_multiple` rows (the block height
of every direction the quantizer makes: 32 for MXFP8, 16 for NVFP4, 128 for blockwise, 1 for
float8), so no scale block is split and each range holds exactly the bytes quantizing those
rows on their own would give (with the tensor's per-tensor values).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .quantization import DIRECTIONS, usage_bits

KINDS = ("data", "scale_inv", "amax")
# {direction: {kind: tensor or None}}: one quantized tensor's buffers as plain tensors.
Parts = Dict[str, Dict[str, Optional[torch.Tensor]]]

_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def storage_dtype(engine_dtype: str) -> torch.dtype:
    """The torch dtype a buffer of an engine dtype is stored as (8- and 4-bit codes: uint8)."""
    return _TORCH_DTYPES.get(engine_dtype, torch.uint8)


@dataclasses.dataclass(frozen=True)
class DirectionRows:
    """Where the rows of the tensor run in one direction's buffers."""
    direction: str
    format: str              # this direction's format (a hybrid's side)
    data_dtype: torch.dtype
    data_axis: int           # the data buffer's dimension along the tensor's rows
    packed_rows: bool        # 4-bit codes packed two per byte along data_axis
    scale_mode: str          # "tensor", "block", "block+tensor" (or "none")
    scale_dtype: torch.dtype
    scale_axis: int          # block scales: the scale buffer's dimension along the rows
    rows_per_scale: int      # block scales: rows one entry covers
    cols_per_scale: int      # block scales: columns one entry covers
    has_amax: bool

    @property
    def block_scales(self) -> bool:
        return self.scale_mode in ("block", "block+tensor")

    @property
    def tensor_scale(self) -> bool:
        """A per-tensor FP32 scale_inv (float8)."""
        return self.scale_mode == "tensor"

    @property
    def tensor_level(self) -> bool:
        """Whether some value of this direction is shared by every row."""
        return self.tensor_scale or self.has_amax


@dataclasses.dataclass(frozen=True)
class RowGeometry:
    cols: int
    directions: Dict[str, DirectionRows]
    row_multiple: int        # a cut inside a tensor falls on a multiple of this many rows

    @property
    def tensor_level(self) -> bool:
        """Whether the quantizer keeps a per-tensor quantity (float8's scale, NVFP4's amax):
        rows quantized apart then need the amax of the whole tensor to match it."""
        return any(d.tensor_level for d in self.directions.values())


_GEOMETRY: Dict[Tuple[str, int], RowGeometry] = {}
# A probe row count every block height divides (16, 32, 128) with every padding (4, 128).
_PROBE_ROWS = 1024


def row_geometry(quantizer, cols: int) -> RowGeometry:
    """The row geometry of tensors `quantizer` (a ``_C.Quantizer``) makes with `cols` columns
    (both directions, whatever a given tensor holds: a cut must suit both). Cached per
    quantizer spec and column count."""
    key = (quantizer.describe(), int(cols))
    cached = _GEOMETRY.get(key)
    if cached is not None:
        return cached
    directions = {}
    multiple = 1
    for d in DIRECTIONS:
        layout = quantizer.layout(_PROBE_ROWS, cols, d)
        data_shape = list(layout["data_shape"])
        axis = 1 if layout["data_transposed"] else 0
        if data_shape[axis] != _PROBE_ROWS:
            raise ValueError(
                f"{quantizer.describe()}: its {d} data layout {data_shape} does not run along "
                f"the tensor's {_PROBE_ROWS} rows in dimension {axis}; qrecipe cannot cut it "
                "into row ranges (FSDP2 shards, split) - report this format's layout")
        mode = layout["scale_mode"]
        block_rows, block_cols = (int(b) for b in layout["block"])
        scale_axis = 1 if layout["scale_transposed"] else 0
        if mode in ("block", "block+tensor"):
            if block_rows < 1 or block_cols < 1:
                raise ValueError(f"{quantizer.describe()}: {d} block scales with block "
                                 f"{layout['block']}; expected positive block sides")
            entries = list(layout["scale_shape"])[scale_axis]
            if entries < _PROBE_ROWS // block_rows:
                raise ValueError(
                    f"{quantizer.describe()}: its {d} scale layout {layout['scale_shape']} "
                    f"does not hold one entry per {block_rows} rows in dimension {scale_axis}")
            multiple = math.lcm(multiple, block_rows)
        dtype_bits = 4 if layout["data_dtype"] == "e2m1" else 8
        directions[d] = DirectionRows(
            direction=d, format=layout["format"] or quantizer.format,
            data_dtype=storage_dtype(layout["data_dtype"]), data_axis=axis,
            packed_rows=dtype_bits == 4 and axis == len(data_shape) - 1,
            scale_mode=mode, scale_dtype=storage_dtype(layout["scale_dtype"]),
            scale_axis=scale_axis, rows_per_scale=max(block_rows, 1),
            cols_per_scale=max(block_cols, 1), has_amax=bool(layout["has_amax"]))
    if any(d.packed_rows for d in directions.values()):
        multiple = math.lcm(multiple, 2)  # whole bytes of codes packed along the rows
    geometry = RowGeometry(cols=int(cols), directions=directions, row_multiple=multiple)
    _GEOMETRY[key] = geometry
    return geometry


def row_multiple(quantizer, cols: int) -> int:
    """Rows a cut inside a tensor of `quantizer` must be a multiple of (see the module)."""
    return row_geometry(quantizer, cols).row_multiple


def parts_of(tensor) -> Parts:
    """The buffers of an engine quantized tensor (``_C.QuantizedTensor``), as plain tensors
    aliasing its memory, per direction it holds."""
    out: Parts = {}
    for d in DIRECTIONS:
        if tensor.has(d):
            out[d] = {k: getattr(tensor, k)(d) for k in KINDS}
    return out


def _data_rows(geometry: DirectionRows, data: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    if geometry.packed_rows:
        return data.narrow(geometry.data_axis, start // 2, (stop + 1) // 2 - start // 2)
    return data.narrow(geometry.data_axis, start, stop - start)


def scale_entries(geometry: DirectionRows, rows: int) -> int:
    """Block scale entries along the rows that hold values for `rows` rows."""
    return -(-rows // geometry.rows_per_scale)


def _scale_rows(geometry: DirectionRows, scale: torch.Tensor, start: int,
                stop: int) -> torch.Tensor:
    first = start // geometry.rows_per_scale
    return scale.narrow(geometry.scale_axis, first, scale_entries(geometry, stop) - first)


def _layout_of(quantizer, rows: int, cols: int, direction: str) -> dict:
    return quantizer.layout(rows, cols, direction)


def empty_parts(quantizer, rows: int, cols: int, usage: int, device,
                allocate=None) -> Parts:
    """Zero-filled buffers of a tensor of `rows` rows with the directions in `usage`.
    `allocate(shape, dtype)` makes each buffer (default: torch.zeros on `device`)."""
    geometry = row_geometry(quantizer, cols)
    make = allocate or (lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device))
    out: Parts = {}
    for d in DIRECTIONS:
        if not usage & usage_bits(d):
            continue
        g = geometry.directions[d]
        layout = _layout_of(quantizer, rows, cols, d)
        shape = list(layout["data_shape"])
        if layout["data_dtype"] == "e2m1":
            shape[-1] = (shape[-1] + 1) // 2
        scale_shape = list(layout["scale_shape"])
        out[d] = {"data": make(shape, g.data_dtype),
                  "scale_inv": make(scale_shape, g.scale_dtype) if scale_shape else None,
                  "amax": make([1], torch.float32) if layout["has_amax"] else None}
    return out


def take_rows(quantizer, tensor, start: int, stop: int) -> Parts:
    """Rows [start, stop) of an engine quantized tensor as new buffers (a copy): the bytes
    and block scales of those rows, the tensor's per-tensor values. `start` must be a multiple
    of the row multiple; `stop` too, or the tensor's last row."""
    rows, cols = tensor.rows, tensor.cols
    check_cut(quantizer, cols, rows, start, "take_rows")
    check_cut(quantizer, cols, rows, stop, "take_rows")
    geometry = row_geometry(quantizer, cols)
    source = parts_of(tensor)
    usage = sum(usage_bits(d) for d in source)
    out = empty_parts(quantizer, stop - start, cols, usage, _device_of(source))
    for d, buffers in source.items():
        g = geometry.directions[d]
        out[d]["data"].copy_(_data_rows(g, buffers["data"], start, stop))
        if g.block_scales:
            piece = _scale_rows(g, buffers["scale_inv"], start, stop)
            _valid_scales(g, out[d]["scale_inv"], stop - start).copy_(_fit(g, piece, out[d]))
        elif buffers["scale_inv"] is not None:
            out[d]["scale_inv"].copy_(buffers["scale_inv"])
        if buffers["amax"] is not None:
            out[d]["amax"].copy_(buffers["amax"])
    return out


def _fit(g: DirectionRows, piece: torch.Tensor, target: Dict[str, torch.Tensor]) -> torch.Tensor:
    """A block-scale slice cut to the target's extent across the rows (equal by layout)."""
    other = 1 - g.scale_axis
    width = target["scale_inv"].shape[other]
    if piece.shape[other] != width:
        raise ValueError(f"{g.format} {g.direction} scales: {piece.shape[other]} entries across "
                         f"the rows here, {width} in the target layout")
    return piece


def _valid_scales(g: DirectionRows, scale: torch.Tensor, rows: int) -> torch.Tensor:
    """The entries of a block-scale buffer that hold values for a tensor of `rows` rows."""
    return scale.narrow(g.scale_axis, 0, scale_entries(g, rows))


def _device_of(parts: Parts) -> torch.device:
    for buffers in parts.values():
        return buffers["data"].device
    raise ValueError("a quantized tensor without any direction")


def check_cut(quantizer, cols: int, rows: int, at: int, what: str) -> None:
    """A cut at row `at` of a tensor of `rows` rows: at its ends, or on the row multiple."""
    if at < 0 or at > rows:
        raise IndexError(f"{what}: row {at} is outside the tensor's {rows} rows")
    if at in (0, rows):
        return
    multiple = row_multiple(quantizer, cols)
    if at % multiple:
        raise ValueError(cut_message(quantizer, cols, at, what))


def cut_message(quantizer, cols: int, at: int, what: str) -> str:
    geometry = row_geometry(quantizer, cols)
    blocks = ", ".join(f"{d.direction} {d.format} blocks of {d.rows_per_scale} rows"
                       for d in geometry.directions.values() if d.block_scales and
                       d.rows_per_scale > 1)
    why = f" ({blocks})" if blocks else ""
    return (f"{what}: a cut at row {at} of a {quantizer.format} tensor would split a scale "
            f"block{why}; cuts inside a tensor (or one row group of a grouped weight) must fall "
            f"on multiples of {geometry.row_multiple} rows. Cut at a multiple of "
            f"{geometry.row_multiple}, or dequantize() first to work on the values")


def join_rows(quantizer, pieces: Sequence[Parts], piece_rows: Sequence[int], cols: int,
              into: Optional[Parts] = None, check_tensor_values: bool = True) -> Parts:
    """The buffers of the tensor whose consecutive row ranges are `pieces` (each with the
    rows `piece_rows` says, the directions of the first): data and block scales
    concatenated, per-tensor values from the first piece, which every piece must share
    (checked unless `check_tensor_values` is False: a caller that knows it and must not wait
    for the GPU). `into`: buffers of the joined layout to write (zero padding included);
    else new ones."""
    rows = sum(piece_rows)
    geometry = row_geometry(quantizer, cols)
    usage = sum(usage_bits(d) for d in pieces[0])
    out = into if into is not None else empty_parts(quantizer, rows, cols, usage,
                                                    _device_of(pieces[0]))
    for d in pieces[0]:
        g = geometry.directions[d]
        at = 0
        for piece, n in zip(pieces, piece_rows):
            _data_rows(g, out[d]["data"], at, at + n).copy_(_data_rows(g, piece[d]["data"], 0, n))
            if g.block_scales:
                first = at // g.rows_per_scale
                count = scale_entries(g, n)
                out[d]["scale_inv"].narrow(g.scale_axis, first, count).copy_(
                    _valid_scales(g, piece[d]["scale_inv"], n))
            at += n
        if g.block_scales:
            valid = scale_entries(g, rows)
            total = out[d]["scale_inv"].shape[g.scale_axis]
            if into is not None and total > valid:  # padding is zero (the layout's rule)
                out[d]["scale_inv"].narrow(g.scale_axis, valid, total - valid).zero_()
        for kind in ("scale_inv", "amax"):
            if kind == "scale_inv" and g.block_scales:
                continue
            first = pieces[0][d][kind]
            if first is None:
                continue
            for i, piece in enumerate(pieces[1:] if check_tensor_values else (), 1):
                if not torch.equal(piece[d][kind], first):
                    raise ValueError(
                        f"joining row ranges of a {quantizer.format} tensor: range {i} was "
                        f"quantized with another per-tensor {kind} ({piece[d][kind].tolist()} "
                        f"vs {first.tolist()}), so its bytes cannot share one tensor with range "
                        "0; each range of one tensor must be quantized with the amax of the "
                        "whole tensor (QuantizedWeight.copy_ does this for FSDP2 shards)")
            out[d][kind].copy_(first)
    return out


def same_tensor_values(pieces: Sequence[Parts]) -> bool:
    """Whether the pieces share their per-tensor values (scale_inv of per-tensor formats, amax)
    in every direction: the condition for joining them."""
    for d, first in pieces[0].items():
        for kind in ("scale_inv", "amax"):
            if first[kind] is None or first[kind].numel() != 1:
                continue
            if any(not torch.equal(p[d][kind], first[kind]) for p in pieces[1:]):
                return False
    return True


def build(quantizer, rows: int, cols: int, parts: Parts, device, borrow: bool = False):
    """An engine quantized tensor (``_C.QuantizedTensor``) of `rows` x `cols` holding `parts`:
    a copy of them, or (`borrow`) over their memory (each part then a contiguous, 16-byte
    aligned tensor of its own; the caller keeps it valid while the tensor is used)."""
    usage = sum(usage_bits(d) for d in parts)
    make = quantizer.from_tensors if borrow else quantizer.from_buffers
    return make(rows, cols, usage, parts, torch.device(device))


# ---------------------------------------------------------------- columnwise from rowwise
def columnwise_is_transpose(quantizer) -> bool:
    """Whether the format defines its columnwise copy as the transpose of the rowwise one
    (docs/numerics.md), so it can be built from the rowwise bytes alone, exactly:
    - float8 (current and delayed scaling): the transposed bytes, the same scale_inv and amax;
    - blockwise 128x128: transposed bytes and transposed tile scales;
    - nvfp4 with 2d tiles (and neither a Hadamard transform nor stochastic rounding, which
      treat the columnwise copy on its own): transposed codes, transposed tile scales, the
      same amax.
    Every other format (mxfp8, blockwise 1x128, nvfp4 1-D, hybrid) quantizes its columnwise
    copy from the source values on its own."""
    spec = quantizer.spec_dict()
    fmt = spec.get("format")
    if fmt == "float8":
        return True
    if fmt == "blockwise":
        block = quantizer.layout(128, 128, "rowwise")["block"]
        return tuple(block) == (128, 128)
    if fmt == "nvfp4":
        return bool(spec.get("2d")) and not spec.get("hadamard") and \
            not spec.get("stochastic_rounding")
    return False


def _unpack_nibbles(packed: torch.Tensor, length: int) -> torch.Tensor:
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)
    return codes[..., :length]


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def columnwise_from_rowwise(quantizer, rows: int, cols: int, rowwise: Dict[str, torch.Tensor],
                            into: Dict[str, torch.Tensor]) -> None:
    """Writes the columnwise buffers `into` (the columnwise layout's shapes) from the rowwise
    buffers of the same tensor, for a format where :func:`columnwise_is_transpose` holds:
    data transposed, each columnwise block scale taken from the rowwise block holding its
    first element, per-tensor values copied."""
    geometry = row_geometry(quantizer, cols)
    r, c = geometry.directions["rowwise"], geometry.directions["columnwise"]
    data = rowwise["data"]
    if r.data_dtype == torch.uint8 and quantizer.layout(rows, cols, "rowwise")["data_dtype"] == "e2m1":
        into["data"].copy_(_pack_nibbles(_unpack_nibbles(data, cols).t().contiguous()))
    else:
        into["data"].copy_(data.t())
    if c.block_scales:
        # Column-wise entry (i, j) in its stored orientation covers element (row, col); the
        # rowwise entry holding that element has the same scale in these formats.
        scale = into["scale_inv"]
        row_entries, col_entries = scale_entries(c, rows), -(-cols // c.cols_per_scale)
        if c.scale_axis == 0:
            i = torch.arange(row_entries, device=scale.device)[:, None] * c.rows_per_scale
            j = torch.arange(col_entries, device=scale.device)[None, :] * c.cols_per_scale
            element_rows, element_cols = i, j
            target = scale.narrow(0, 0, row_entries).narrow(1, 0, col_entries)
        else:
            i = torch.arange(col_entries, device=scale.device)[:, None] * c.cols_per_scale
            j = torch.arange(row_entries, device=scale.device)[None, :] * c.rows_per_scale
            element_rows, element_cols = j, i
            target = scale.narrow(0, 0, col_entries).narrow(1, 0, row_entries)
        a = element_rows // r.rows_per_scale
        b = element_cols // r.cols_per_scale
        source = rowwise["scale_inv"]
        picked = source[a, b] if r.scale_axis == 0 else source[b, a]
        scale.zero_()
        target.copy_(picked)
    elif into.get("scale_inv") is not None:
        into["scale_inv"].copy_(rowwise["scale_inv"])
    if into.get("amax") is not None:
        into["amax"].copy_(rowwise["amax"])
