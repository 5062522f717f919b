"""Quantized weights kept across the micro-batches of one step (``is_first_microbatch``, as in
TransformerEngine; docs/adapter.md, "Training loop").

With gradient accumulation the weights do not change between the micro-batches of a step,
so quantizing them again for every micro-batch is wasted work. A module called with

    is_first_microbatch=True    quantizes its weight and keeps the quantized operand
    is_first_microbatch=False   reuses the kept operand (an error if there is none)
    is_first_microbatch=None    (default) quantizes every call and keeps nothing

The kept operand is keyed by the weight tensor (weakly: it goes when the weight goes) and the
quantizer that made it (a second recipe gets its own entry). A weight that is rows of a larger
parameter (GroupedLinear's single grouped parameter: each expert's view is a new tensor at
every call) is keyed by that parameter and the group's index instead, and the parameter's
``_version`` (which its views share) decides freshness. It remembers the weight's
``_version`` counter and storage address: an in-place change (an optimizer step, ``copy_``
under ``no_grad``) or a new ``.data`` makes the entry stale, and so does a change of the
recipe's delayed scales (``Recipe.scaling_generation``: a scaling update at the entry of the
next outermost ``autocast``, or a checkpoint load). A stale entry is never used:
``is_first_microbatch=False`` then quantizes again and replaces it (counted in
``stats["stale"]``), so forgetting ``True`` after an optimizer step costs time, never
correctness.

The operand holds the directions the step needs: rowwise for fprop, plus columnwise (dgrad)
when gradients are enabled at the first micro-batch, so a later micro-batch needing dgrad
finds it. Backward uses the kept operand as is (it is never trimmed to columnwise only).

Decoded copies. Where a GEMM of the weight is emulated (MXFP8 and NVFP4 on Hopper; every GEMM
on the CPU, which decodes to FP32), the engine decodes the weight's bytes before the GEMM. A
kept operand also keeps what each direction decodes to (``QuantizedTensor.keep_decoded``;
docs/gemm.md, "Decoded operands kept across GEMMs"): fprop decodes the rowwise bytes once,
dgrad the columnwise ones once, and later micro-batches reuse both. The copies belong to the
operand, so they go with it: a stale entry's replacement starts without any, and the engine
drops them when the bytes are requantized in place. Results are bit-identical either way.
Memory: 2 bytes per weight element and direction on CUDA (4 on the CPU), on top of the
quantized bytes (8192 x 8192: 128 MiB per direction). ``set_keep_decoded(False)`` (or the
environment variable ``QRECIPE_KEEP_DECODED_WEIGHTS=0`` at import) turns it off and drops the
copies held now.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..quantization import COLUMNWISE


@dataclass
class _Entry:
    operand: object        # _C.QuantizedTensor
    quantizer: object      # the _C.Quantizer that made it (kept so its id stays unique)
    usage: int
    version: int
    generation: int        # the recipe's scaling_generation when it was made
    data_ptr: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    def fresh_for(self, weight: torch.Tensor, owner: torch.Tensor, generation: int) -> bool:
        return (self.version == owner._version and self.generation == generation
                and self.data_ptr == weight.data_ptr()
                and self.shape == weight.shape and self.dtype == weight.dtype
                and self.device == weight.device)


# weight tensor (or grouped parameter) -> {(id(quantizer), group index): _Entry}
_cache: "WeakIdKeyDictionary" = WeakIdKeyDictionary()

# Counters for tests and for users checking that caching works.
stats: Dict[str, int] = {"quantized": 0, "reused": 0, "stale": 0}


def _env_keep_decoded() -> bool:
    value = os.environ.get("QRECIPE_KEEP_DECODED_WEIGHTS", "1").strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"QRECIPE_KEEP_DECODED_WEIGHTS={value!r}: expected 1 or 0 (whether kept "
                     "weights also keep their decoded copies for emulated GEMMs)")


_keep_decoded = _env_keep_decoded()


def keep_decoded() -> bool:
    """Whether kept weight operands also keep their decoded copies (module docstring)."""
    return _keep_decoded


def set_keep_decoded(on: bool) -> None:
    """Turns decoded copies of kept weights on or off; off drops the copies held now."""
    global _keep_decoded
    if not isinstance(on, bool):
        raise TypeError(f"set_keep_decoded takes True or False, got {on!r}")
    _keep_decoded = on
    for per_weight in list(_cache.values()):
        for entry in per_weight.values():
            entry.operand.keep_decoded = on


def cached_weight_operand(weight: torch.Tensor, quantizer, usage: int,
                          is_first_microbatch: Optional[bool],
                          quantize: Callable[[object, torch.Tensor, int], object],
                          who: str = "qrecipe module", generation: int = 0,
                          group: Optional[Tuple[torch.Tensor, int]] = None):
    """The quantized operand of `weight` for this call, or None when caching is off
    (``is_first_microbatch is None``: the caller quantizes as usual).

    `usage` is what this call needs; `quantize(quantizer, tensor, usage)` makes an operand;
    `generation` is the recipe's ``scaling_generation`` (a delayed scale changed since the
    entry was made makes it stale). `group`: ``(parameter, index)`` when `weight` is a view
    of rows of `parameter` (one expert of a grouped weight): the entry is kept under the
    parameter and index, and goes stale when the parameter changes."""
    if is_first_microbatch is None:
        return None
    if not isinstance(is_first_microbatch, bool):
        raise TypeError(f"{who}: is_first_microbatch must be True, False or None, got "
                        f"{is_first_microbatch!r}")
    owner, index = (weight, 0) if group is None else group
    key = (id(quantizer), index)
    per_weight = _cache.get(owner)
    entry = None if per_weight is None else per_weight.get(key)
    if not is_first_microbatch:
        if entry is None:
            what = "this weight" if group is None else f"group {index} of this weight"
            raise RuntimeError(
                f"{who}: is_first_microbatch=False but no quantized weight is cached for "
                f"{what} under quantizer {quantizer.describe()} ({quantizer.role}); call the "
                "module with is_first_microbatch=True on the first micro-batch of each step")
        fresh = entry.fresh_for(weight, owner, generation)
        if fresh and (entry.usage & usage) == usage:
            stats["reused"] += 1
            return entry.operand
        if not fresh:
            stats["stale"] += 1
        usage |= entry.usage  # keep every direction the step has needed so far
    elif torch.is_grad_enabled():
        usage |= COLUMNWISE  # dgrad of a later micro-batch
    source = weight.detach().contiguous()
    operand = quantize(quantizer, source, usage)
    keep(weight, quantizer, usage, operand, generation, group)
    return operand


def keep(weight: torch.Tensor, quantizer, usage: int, operand, generation: int = 0,
         group: Optional[Tuple[torch.Tensor, int]] = None) -> None:
    """Keeps `operand` (made by `quantizer` from `weight` with `usage`) as the entry of
    `weight` (or of `group` = (parameter, index)), counted in ``stats["quantized"]``: what
    ``is_first_microbatch=True`` does after quantizing, for callers that quantize themselves
    (GroupedLinear quantizes all experts in one grouped call, then keeps each expert's)."""
    owner, index = (weight, 0) if group is None else group
    stats["quantized"] += 1
    # The operand is this cache's own (nothing else writes its bytes), so its decoded copies
    # can be kept with it.
    operand.keep_decoded = _keep_decoded
    per_weight = _cache.get(owner)
    if per_weight is None:
        per_weight = {}
        _cache[owner] = per_weight
    per_weight[(id(quantizer), index)] = _Entry(
        operand, quantizer, usage, owner._version, generation, weight.data_ptr(), weight.shape,
        weight.dtype, weight.device)


def kept_operands(weight: torch.Tensor) -> List[object]:
    """The quantized operands kept for `weight` now (one per quantizer and group), e.g. to
    read their ``decoded_directions()`` or ``decoded_bytes()``."""
    return [entry.operand for entry in _cache.get(weight, {}).values()]


def clear(weight: Optional[torch.Tensor] = None) -> None:
    """Drops the kept quantized operands of `weight` (all its groups for a grouped
    parameter; all weights when None)."""
    if weight is None:
        _cache.clear()
    else:
        _cache.pop(weight, None)


def reset_stats() -> None:
    for key in stats:
        stats[key] = 0
