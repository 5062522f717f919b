"""Per-role numerics statistics of the quantized tensors (opt-in; docs/adapter.md, telemetry).

    qrecipe.telemetry.enable(every=10, roles=["linear:*@layers.*"])   # or the recipe's key:
    #   telemetry: {every: 10, roles: ["linear:*@layers.*"]}
    ... train ...
    table = qrecipe.telemetry.table()          # one row per observed quantization
    print(table.worst("saturated", 5))
    table.to_csv("numerics.csv"); table.to_jsonl("numerics.jsonl")

What is gathered, for every quantization of a qrecipe module's operand (inputs, weights and
output gradients; the weight when it is quantized, so once per step with the weight cache):
``amax`` of the whole tensor, the range of the decode scales actually used
(``scale_min`` / ``scale_max``, as ``scale`` = 1 / scale_inv: equal for per-tensor scaling),
and, on a sample of up to ``SAMPLE_ELEMENTS`` elements (evenly spaced rows), the fraction
``saturated`` (clipped: stored as the format's largest finite magnitude while the input was
beyond it by more than rounding, e.g. above 464 where e4m3's largest value is 448), the
fraction ``flushed`` (a non-zero input stored as zero) and ``error``, the
relative RMS error of the dequantized sample. Statistics are computed on the tensor's device
and kept there as tensors; they are copied to the host only when :func:`table` is called, so
gathering adds kernels but no host synchronisation.

Which quantizations: the ``every``-th of each role (1st, every+1-th, ...), for roles whose
string ``module_type:tensor_type@name`` matches one of ``roles`` (shell globs; no list: every
role). The switch: :func:`enable` (every recipe), :func:`disable` (nothing, the recipes'
keys included) or :func:`use_recipes` (the default: a recipe's ``telemetry:`` key decides
for the modules running under it).

Cost when off: one attribute test per quantization (``state.on``). When on, each observed
quantization adds a dequantization of the tensor and a few reductions on its device
(docs/adapter.md gives the measured cost).
"""
from __future__ import annotations

import csv
import fnmatch
import json
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch

COLUMNS = ("role", "format", "call", "direction", "rows", "cols", "amax", "scale_min",
           "scale_max", "saturated", "flushed", "error", "sampled")
SAMPLE_ELEMENTS = 1 << 16
_STAT_COLUMNS = ("amax", "scale_min", "scale_max", "saturated", "flushed", "error", "sampled")

# The largest finite magnitude code of each element type, and how far above that value an
# input must be to be clipped rather than rounded down to it: the midpoint to the next value
# the format would have with one more binade (e4m3 448 -> 480: 464/448; e5m2 57344 -> 65536:
# 61440/57344; e2m1 6 -> 8: 7/6; a tie rounds to the even mantissa, the largest value).
_MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B, "e2m1": 0x7}
_CLIP_RATIO = {"e4m3": 464 / 448, "e5m2": 61440 / 57344, "e2m1": 7 / 6}
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Settings:
    """Gather the `every`-th quantization of each role matching one of `roles` (None: all)."""
    every: int
    roles: Optional[Sequence[str]] = None

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"telemetry every={self.every!r}: expected a positive integer "
                             "(1: every quantization of a role, 100: every 100th)")
        if self.roles is not None:
            roles = self.roles
            if not isinstance(roles, (str, bytes)):
                roles = tuple(roles)
            if isinstance(roles, (str, bytes)) or not all(isinstance(r, str) for r in roles):
                raise TypeError(f"telemetry roles={self.roles!r}: expected a list of globs on "
                                "'module_type:tensor_type@name', e.g. ['linear:weight@*']")
            object.__setattr__(self, "roles", roles)

    def selects(self, role: str) -> bool:
        return self.roles is None or any(fnmatch.fnmatchcase(role, g) for g in self.roles)


def settings_of_recipe(key: Optional[dict]) -> Optional[Settings]:
    """The Settings of a recipe's parsed ``telemetry:`` key (``_C.Recipe.telemetry()``)."""
    if key is None:
        return None
    return Settings(int(key["every"]), list(key["roles"]) or None)


class _State:
    """What the hot path reads: ``on`` is False unless something may be gathered."""

    def __init__(self) -> None:
        self.mode = "recipes"  # "recipes", "enabled" or "disabled"
        self.settings: Optional[Settings] = None  # enable()'s
        self.recipes_with_key = 0  # live recipes whose telemetry key is set
        self.on = False
        self.lock = threading.Lock()
        self.calls: Dict[str, int] = {}
        self.records: List[dict] = []
        # The quantizers of the roles of recipes with a telemetry key -> its Settings, noted
        # when a module resolves its roles: a backward runs outside autocast, so the active
        # recipe cannot say which key applies to a gradient's quantizer.
        self.keyed: "weakref.WeakKeyDictionary[Any, Settings]" = weakref.WeakKeyDictionary()

    def refresh(self) -> None:
        self.on = self.mode == "enabled" or (self.mode == "recipes" and self.recipes_with_key > 0)


state = _State()


def enable(every: int = 1, roles: Optional[Iterable[str]] = None) -> None:
    """Gathers statistics for every recipe (its own ``telemetry:`` key is then ignored)."""
    settings = Settings(every, roles)
    with state.lock:
        state.mode, state.settings = "enabled", settings
        state.refresh()


def disable() -> None:
    """Gathers nothing, the recipes' ``telemetry:`` keys included. Kept rows stay."""
    with state.lock:
        state.mode, state.settings = "disabled", None
        state.refresh()


def use_recipes() -> None:
    """The default: a recipe's ``telemetry:`` key decides for the modules it runs."""
    with state.lock:
        state.mode, state.settings = "recipes", None
        state.refresh()


def clear() -> None:
    """Forgets the kept rows and the per-role call counts."""
    with state.lock:
        state.records.clear()
        state.calls.clear()


def note_quantizers(quantizers: Iterable[Any], settings: Optional[Settings]) -> None:
    """A module resolved roles under a recipe whose telemetry key is `settings`: its
    quantizers (``_C.Quantizer``, None for high precision) follow that key."""
    if settings is None:
        return
    with state.lock:
        for q in quantizers:
            if q is not None:
                state.keyed[q] = settings


def note_recipe(recipe: Any, settings: Optional[Settings]) -> None:
    """Recipe.__init__: a recipe with a ``telemetry:`` key turns the hot-path test on while
    it lives."""
    if settings is None:
        return
    with state.lock:
        state.recipes_with_key += 1
        state.refresh()
    weakref.finalize(recipe, _recipe_gone)


def _recipe_gone() -> None:
    with state.lock:
        state.recipes_with_key -= 1
        state.refresh()


def _settings_for(quantizer: Any) -> Optional[Settings]:
    if state.mode == "enabled":
        return state.settings
    if state.mode == "disabled":
        return None
    return state.keyed.get(quantizer)


def observe(quantizer: Any, tensor: torch.Tensor, quantized: Any) -> None:
    """Called after `quantizer` (a ``_C.Quantizer``) made `quantized` (a
    ``_C.QuantizedTensor``) from `tensor` (2-D, or with leading dimensions flattened) while
    ``state.on``; keeps a row when the settings select this call."""
    settings = _settings_for(quantizer)
    if settings is None or tensor.numel() == 0:
        return
    role = quantizer.role
    if not settings.selects(role):
        return
    with state.lock:
        call = state.calls.get(role, 0) + 1
        state.calls[role] = call
    if (call - 1) % settings.every:
        return
    record = {"role": role, "format": quantizer.describe(), "call": call}
    record.update(_statistics(tensor, quantized))
    with state.lock:
        state.records.append(record)


def _codes(quantized: Any, direction: str, rows: int, cols: int) -> torch.Tensor:
    """The element codes of one direction as int32 [rows, cols] in the tensor's order."""
    layout = quantized.layout(direction)
    data = quantized.data(direction)
    if layout["data_dtype"] == "e2m1":
        packed = data.view(torch.uint8).to(torch.int32)
        codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    else:
        codes = data.view(torch.uint8).to(torch.int32)
    if layout["data_transposed"]:
        codes = codes.reshape(-1, codes.shape[-1])[:cols, :rows].t()
    else:
        codes = codes.reshape(-1, codes.shape[-1])[:rows, :cols]
    return codes


def _values(codes: torch.Tensor, data_dtype: str) -> torch.Tensor:
    """The element values (without scales) of `codes`."""
    if data_dtype == "e2m1":
        table = torch.tensor(_E2M1_VALUES + tuple(-v for v in _E2M1_VALUES),
                             dtype=torch.float32, device=codes.device)
        return table[codes]
    float8 = torch.float8_e4m3fn if data_dtype == "e4m3" else torch.float8_e5m2
    return codes.to(torch.uint8).view(float8).float()


def _statistics(tensor: torch.Tensor, quantized: Any) -> dict:
    rows, cols = quantized.rows, quantized.cols
    direction = "rowwise" if quantized.has("rowwise") else "columnwise"
    data_dtype = quantized.layout(direction)["data_dtype"]
    if data_dtype not in _MAX_CODE:
        raise RuntimeError(f"qrecipe telemetry: {quantized.format} stores {direction} elements "
                           f"as {data_dtype}, which telemetry cannot read (it reads e4m3, "
                           "e5m2 and e2m1); restrict telemetry's roles to other formats")
    with torch.no_grad():
        x = tensor.detach().reshape(rows, cols).float()
        amax = x.abs().amax() if x.numel() else torch.zeros((), device=x.device)
        # Evenly spaced rows holding at most SAMPLE_ELEMENTS elements (at least one row).
        take = max(1, min(rows, SAMPLE_ELEMENTS // max(1, cols)))
        index = torch.linspace(0, max(0, rows - 1), take, device=x.device).round().long()
        xs = x[index]
        deq = quantized.dequantize(direction, torch.float32).reshape(rows, cols)[index]
        codes = _codes(quantized, direction, rows, cols)[index]
        magnitude = codes & (0x7 if data_dtype == "e2m1" else 0x7F)
        values = _values(codes, data_dtype)
        stored = values != 0
        decode = torch.where(stored, deq / torch.where(stored, values, torch.ones_like(values)),
                             torch.zeros_like(deq))
        # Over the elements stored as non-zero (NaN when there are none: no scale was used).
        big = torch.full_like(decode, math.inf)
        nan = torch.full((), math.nan, device=x.device)
        scale_inv_min = torch.where(stored.any(), torch.where(stored, decode.abs(), big).amin(),
                                    nan)
        scale_inv_max = torch.where(stored.any(), torch.where(stored, decode.abs(), -big).amax(),
                                    nan)
        n = max(1, xs.numel())
        saturated = ((magnitude == _MAX_CODE[data_dtype]) &
                     (xs.abs() > deq.abs() * _CLIP_RATIO[data_dtype])).sum() / n
        flushed = ((xs != 0) & (deq == 0)).sum() / n
        norm = xs.square().sum().sqrt()
        error = (deq - xs).square().sum().sqrt() / torch.where(norm > 0, norm,
                                                               torch.ones_like(norm))
        stats = torch.stack([amax, 1 / scale_inv_max, 1 / scale_inv_min, saturated, flushed,
                             error, torch.tensor(float(xs.numel()), device=x.device)])
    return {"direction": direction, "rows": rows, "cols": cols, "_stats": stats.double()}


class Table:
    """Rows of statistics (dicts with the keys of ``COLUMNS``), in the order gathered."""

    def __init__(self, rows: List[dict]):
        self.rows = rows
        self.columns = COLUMNS

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def by_role(self) -> Dict[str, List[dict]]:
        out: Dict[str, List[dict]] = {}
        for r in self.rows:
            out.setdefault(r["role"], []).append(r)
        return out

    def worst(self, column: str = "saturated", n: int = 10) -> "Table":
        """Each role's row with the largest `column`, the `n` largest first (e.g. the layers
        that saturate most)."""
        if column not in _STAT_COLUMNS:
            raise ValueError(f"worst({column!r}): expected one of {', '.join(_STAT_COLUMNS)}")
        top = [max(rs, key=lambda r: _key(r[column])) for rs in self.by_role().values()]
        top.sort(key=lambda r: _key(r[column]), reverse=True)
        return Table(top[:n])

    def to_csv(self, path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)

    def to_jsonl(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for r in self.rows:
                # NaN / inf are not JSON: written as null and the strings "inf" / "-inf".
                f.write(json.dumps({k: _json_value(v) for k, v in r.items()},
                                   allow_nan=False) + "\n")

    def __str__(self) -> str:
        header = ("role", "format", "call", "amax", "scale_min", "scale_max", "saturated",
                  "flushed", "error")
        lines = [" ".join(f"{h:>12}" if i > 1 else h for i, h in enumerate(header))]
        for r in self.rows:
            fmt = r["format"].split("{")[0]  # the format's name; the CSV has the options
            lines.append(f"{r['role']} {fmt} {r['call']:>12} " + " ".join(
                f"{r[c]:>12.4g}" for c in header[3:]))
        return "\n".join(lines)

    __repr__ = __str__


def _key(value: float) -> float:
    return -math.inf if value != value else value


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if value != value else ("inf" if value > 0 else "-inf")
    return value


def table() -> Table:
    """Every kept row (host copies of the statistics: this synchronises with the devices)."""
    with state.lock:
        records = list(state.records)
    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k != "_stats"}
        stats = rec["_stats"]
        if not isinstance(stats, list):
            stats = stats.tolist()
            rec["_stats"] = stats  # copied once
        row.update(zip(_STAT_COLUMNS, stats))
        row["sampled"] = int(row["sampled"])
        rows.append({c: row[c] for c in COLUMNS})
    return Table(rows)
