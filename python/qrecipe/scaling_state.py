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


def state_from_checkpoint(state: dict) -> dict:
    """A checkpointed state in the form ``Engine.load_scaling_states`` takes."""
    history = state["amax_history"]
    if isinstance(history, torch.Tensor):
        history = history.detach().to("cpu", torch.float32).reshape(-1).tolist()
    return {"owner": state["owner"], "index": int(state.get("index", 0)),
            "amax_history": list(history), "scale": float(state["scale"]),
            "scale_inv": float(state["scale_inv"])}


def is_scaling_extra_state(value: Any) -> bool:
    return isinstance(value, dict) and value.get(EXTRA_STATE_MARKER) is not None


def drop_scaling_states(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a model state dict without qrecipe scaling states: load it to keep the
    weights but start delayed scaling afresh (e.g. under another recipe)."""
    return {k: v for k, v in state_dict.items()
            if not (k.endswith("_extra_state") and is_scaling_extra_state(v))}
