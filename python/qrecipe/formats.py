"""``qrecipe.formats``: quantizer specs built in Python, what a recipe factory returns
(docs/recipes.md, "Recipes in Python").

    from qrecipe import formats
    def qfactory(role):
        if role.tensor_type == "weight":
            return formats.nvfp4(two_d=True)
        return formats.mxfp8()

A :class:`Spec` is a format name plus options, exactly what a YAML rule's ``quantizer:`` map
holds, and it is checked by the same validator when a role is resolved (the engine reports
an unknown option or value naming the factory and the role). The builders below only spell
the shipped formats' options as keyword arguments; an option left out (``None``) takes the
plugin's default. Any loaded plugin's format is reachable by name, ``formats.spec("myfmt",
opt=1)`` or ``formats.myfmt(opt=1)``; ``qrecipe plugins`` lists every format's options.

Ground floor: imports only the extension.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

from ._engine import _C

# Option values a spec may hold: what a YAML scalar converts to, or a nested spec.
_SCALARS = (bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A quantizer spec: ``format`` and its options, in the order given. Frozen, hashable,
    comparable; ``to_dict()`` gives the YAML rule's map."""

    format: str
    options: Tuple[Tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not self.format:
            raise TypeError(f"a quantizer spec's format is a non-empty string (a format name "
                            f"such as 'float8', or 'none'), got {self.format!r}")
        for item in self.options:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError(f"Spec options are (name, value) pairs, got {item!r}")
            key, value = item
            if not isinstance(value, _SCALARS + (Spec,)):
                raise TypeError(f"option '{key}' of format '{self.format}': a value is a bool, "
                                f"int, float, str or a nested Spec, got {type(value).__name__} "
                                f"{value!r}")

    def to_dict(self) -> Dict[str, Any]:
        """``{"format": ..., option: value, ...}``, nested specs as dicts: the structure of a
        YAML rule's ``quantizer:`` (``Recipe.from_dict({"version": 1, "defaults":
        spec.to_dict()})`` is a recipe giving every role this spec)."""
        out: Dict[str, Any] = {"format": self.format}
        for key, value in self.options:
            out[key] = value.to_dict() if isinstance(value, Spec) else value
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"formats.spec({self.format!r}{', ' if args else ''}{args})"


def spec(format: str, **options: Any) -> Spec:
    """A spec of any loaded format by name; options left as None take the plugin's default.
    ``share`` (any format with delayed scaling) names a shared scaling state."""
    return Spec(format, tuple((k, v) for k, v in options.items() if v is not None))


def none() -> Spec:
    """High precision (no quantization); a factory may also return None."""
    return Spec("none")


def float8(scaling: str = "current", dtype: Optional[str] = None, **options: Any) -> Spec:
    """Per-tensor FP8. ``scaling``: current or delayed; ``dtype``: e4m3 or e5m2 (default
    e4m3 for input and weight, e5m2 for grad_output); also ``pow2_scales``,
    ``amax_epsilon`` (current) and ``amax_history_len``, ``amax_compute_algo``, ``margin``
    (delayed)."""
    return spec("float8", scaling=scaling, dtype=dtype, **options)


def delayed(history: int = 1024, margin: int = 0, algo: str = "max",
            dtype: Optional[str] = None, share: Optional[str] = None) -> Spec:
    """Per-tensor FP8 with delayed scaling (TransformerEngine's ``DelayedScalingRequest``):
    the scale comes from the amax history of the last ``history`` steps (``algo``: max or
    most_recent), with ``margin``. Roles given the same ``share`` name keep ONE amax history
    and scale (they need the same history, algo, margin and dtype)."""
    return float8("delayed", dtype=dtype, amax_history_len=history, amax_compute_algo=algo,
                  margin=margin, share=share)


def mxfp8(dtype: Optional[str] = None, **options: Any) -> Spec:
    """MXFP8: 1x32 blocks with E8M0 scales; ``dtype`` e4m3 (default) or e5m2."""
    return spec("mxfp8", dtype=dtype, **options)


def nvfp4(two_d: Optional[bool] = None, hadamard: Optional[bool] = None,
          stochastic_rounding: Optional[bool] = None, seed: Optional[int] = None,
          **options: Any) -> Spec:
    """NVFP4: 1x16 blocks (``two_d``: 16x16 tiles, the recipe option ``2d``), ``hadamard`` on
    the columnwise (wgrad) copy (needs bf16 tensors), ``stochastic_rounding`` with ``seed``."""
    return spec("nvfp4", **{"2d": two_d}, hadamard=hadamard,
                stochastic_rounding=stochastic_rounding, seed=seed, **options)


def blockwise(block: Optional[str] = None, pow2_scales: Optional[bool] = None,
              **options: Any) -> Spec:
    """DeepSeek-style FP8 blocks: ``block`` 1x128 or 128x128, power-of-two scales."""
    return spec("blockwise", block=block, pow2_scales=pow2_scales, **options)


def hybrid(rowwise: Spec, columnwise: Spec, columnwise_source: Optional[str] = None) -> Spec:
    """A format per direction: ``rowwise`` (fprop, and dgrad's grad_output) and
    ``columnwise`` (dgrad's weight, wgrad) are specs of other formats;
    ``columnwise_source``: input or rowwise_dequantized."""
    for side, value in (("rowwise", rowwise), ("columnwise", columnwise)):
        if not isinstance(value, Spec):
            raise TypeError(f"formats.hybrid: {side} must be a spec such as formats.mxfp8(), "
                            f"got {type(value).__name__} {value!r}")
    return spec("hybrid", rowwise=rowwise, columnwise=columnwise,
                columnwise_source=columnwise_source)


def __getattr__(name: str):
    """``formats.<plugin format>(**options)`` for any loaded plugin (``formats.myfmt(x=1)``)."""
    if name.startswith("__"):
        raise AttributeError(name)
    loaded = sorted(p["name"] for p in _C.plugins())
    if name in loaded:
        return functools.partial(spec, name)
    raise AttributeError(f"qrecipe.formats has no format '{name}'; loaded formats: "
                         f"{', '.join(loaded)} (formats.spec(name, **options) takes any)")
