"""Delayed-scaling states in checkpoints: the form ``Recipe.state_dict`` and the modules'
``state_dict`` (nn/module_state.py) store them in, and ``qrecipe.drop_scaling_states``.

The engine reads and writes a state as a dict (``Engine.scaling_states()`` /
``Engine.load_scaling_states``): ``owner`` ("<module_type>:<tensor_type>@<name> <format>"),
``index`` (the k-th state of that owner: a hybrid quantizer with delayed scaling in both
halves has two), ``amax_history``, ``scale`` and ``scale_inv``. A checkpoint holds the history
as a float32 tensor; everything else as plain numbers and strings.

A module's states travel in ``model.state_dict()`` under ``<module path>._extra_state``, as a
dict marked with :data:`EXTRA_STATE_MARKER` (its value the format version,
:data:`EXTRA_STATE_VERSION`); :func:`drop_scaling_states` removes exactly those entries, so a
model's weights load under another recipe with its scaling started afresh.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import torch

from ._engine import _C

EXTRA_STATE_MARKER = "qrecipe_scaling_state"
EXTRA_STATE_VERSION = 1


def quantizers_in(obj: Any) -> List["_C.Quantizer"]:
    """Every ``_C.Quantizer`` in a roles object (dataclass fields, dict values, sequences)."""
    if isinstance(obj, _C.Quantizer):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    else:
        return []
    return [q for item in items for q in quantizers_in(item)]


def state_to_checkpoint(state: dict) -> dict:
    """A state dict of ``Engine.scaling_states()`` in checkpoint form (history as a tensor)."""
    return {
        "owner": state["owner"],
        "index": int(state["index"]),
        "amax_history": torch.tensor(state["amax_history"], dtype=torch.float32),
        "scale": float(state["scale"]),
        "scale_inv": float(state["scale_inv"]),
    }


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.dtype.is_complex and value.dtype != torch.bool
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def state_from_checkpoint(state: Any, where: str = "scaling state") -> dict:
    """A checkpointed state in the form ``Engine.load_scaling_states`` takes. A state that is
    not one (an entry missing, a value of another type) is a ValueError naming ``where`` and
    the key; the engine checks the values themselves (a finite scale > 0, scale_inv its
    float reciprocal, no NaN or negative amax: Engine::check_scaling_values)."""
    if not isinstance(state, dict):
        raise ValueError(f"{where} has type {type(state).__name__}; expected a dict with "
                         f"owner, amax_history, scale and scale_inv")
    for key in ("owner", "amax_history", "scale", "scale_inv"):
        if key not in state:
            raise ValueError(f"{where}: no '{key}' entry; a scaling state has owner, "
                             f"amax_history, scale and scale_inv (the checkpoint is corrupt)")
    if not isinstance(state["owner"], str):
        raise ValueError(f"{where}.owner has type {type(state['owner']).__name__}; expected a "
                         f"str such as 'linear:input@fc float8'")
    history = state["amax_history"]
    if isinstance(history, torch.Tensor):
        if history.dim() != 1 or not history.is_floating_point():
            raise ValueError(f"{where}.amax_history is a {history.dim()}-D {history.dtype} "
                             f"tensor; expected a 1-D float tensor")
        history = history.detach().to("cpu", torch.float32).tolist()
    elif isinstance(history, (list, tuple)) and all(_is_number(v) for v in history):
        history = [float(v) for v in history]
    else:
        raise ValueError(f"{where}.amax_history has type {type(history).__name__}; expected a "
                         f"1-D float tensor or a list of numbers")
    for key in ("scale", "scale_inv", "index"):
        if key in state and not _is_number(state[key]):
            raise ValueError(f"{where}.{key} has type {type(state[key]).__name__}; expected a "
                             f"number")
    return {"owner": state["owner"], "index": int(state.get("index", 0)),
            "amax_history": history, "scale": float(state["scale"]),
            "scale_inv": float(state["scale_inv"])}


def check_extra_state_entries(entries: Any, where: str) -> None:
    """ValueError naming the key unless ``entries`` (of a module's extra state) has the
    structure the modules write: a list of dicts whose 'scaling_states' is a list of states."""
    if not isinstance(entries, list):
        raise ValueError(f"{where}: entries has type {type(entries).__name__}; expected a list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: entries[{i}] has type {type(entry).__name__}; expected "
                             f"a dict")
        states = entry.get("scaling_states", [])
        if not isinstance(states, list):
            raise ValueError(f"{where}: entries[{i}].scaling_states has type "
                             f"{type(states).__name__}; expected a list")
        for j, state in enumerate(states):
            state_from_checkpoint(state, f"{where}: entries[{i}].scaling_states[{j}]")


def is_scaling_extra_state(value: Any) -> bool:
    return isinstance(value, dict) and value.get(EXTRA_STATE_MARKER) is not None


def drop_scaling_states(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a model state dict without qrecipe scaling states: load it to keep the
    weights but start delayed scaling afresh (e.g. under another recipe)."""
    return {k: v for k, v in state_dict.items()
            if not (k.endswith("_extra_state") and is_scaling_extra_state(v))}
