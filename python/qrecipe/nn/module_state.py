"""The delayed-scaling state of a qrecipe module in its ``state_dict`` (docs/adapter.md,
checkpoints); the checkpoint form of a state is scaling_state.py's.

``ScalingStateMixin`` gives a module ``get_extra_state`` / ``set_extra_state``, so
``model.state_dict()`` carries, under ``<module path>._extra_state``, the amax histories and
scales of the delayed-scaling quantizers of the module's own roles, and
``model.load_state_dict()`` puts them back bit for bit.

A module using it keeps ``self._roles``, a mapping recipe -> the resolved roles of that recipe
(any object whose fields, items or elements are ``_C.Quantizer`` objects), and calls
``self._apply_loaded_scaling(recipe)`` right after it resolves its roles under a recipe.

When the states are written:
- at ``load_state_dict`` when the module has already resolved its roles under a recipe (e.g.
  ``qrecipe.convert(model, recipe=recipe)`` before loading): errors appear at load time;
- otherwise when the module first resolves its roles (its first forward under autocast),
  before it quantizes anything.

Which states: those whose owner ("<module_type>:<tensor_type>@<name> <format>") names one of
the module's roles. A checkpoint saved between a step and that step's scaling update (the
usual place: after ``optimizer.step()``) records ``update_pending``; loading then runs the
update of the loaded states at once, which is exactly what the next ``autocast`` entry would
have done, so a resumed run continues bit for bit.

Another recipe: a state whose owner does not exist under the recipe the module runs with (the
role has another format, no delayed scaling, another amax_history_len) is an error naming it;
remove the scaling states from the checkpoint with
``qrecipe.drop_scaling_states(state_dict)`` to start the new recipe's scaling afresh. The
high-precision weights always load.
"""
from __future__ import annotations

from typing import Any, List, Optional

from .._engine import _C
from ..scaling_state import (EXTRA_STATE_MARKER, EXTRA_STATE_VERSION,
                             check_extra_state_entries, is_scaling_extra_state, quantizers_in,
                             state_from_checkpoint, state_to_checkpoint)


class ScalingStateMixin:
    """Delayed-scaling state in ``state_dict`` for qrecipe modules (see the module docstring).
    Put it before ``torch.nn.Module`` in the bases."""

    _loaded_scaling: Optional[List[dict]] = None  # entries waiting for a recipe

    def _module_entries(self) -> List[dict]:
        entries = []
        for recipe, roles in list(getattr(self, "_roles", {}).items()):
            mine = sorted({q.role for q in quantizers_in(roles)})
            # Filtered in C++: no host copies of other modules' states.
            states = [state_to_checkpoint(s) for s in recipe.scaling_states(roles=mine)]
            entries.append({"recipe": recipe.name, "update_pending": recipe.update_pending,
                            "scaling_states": states})
        return entries

    def get_extra_state(self) -> dict:
        entries = self._module_entries()
        if not entries and self._loaded_scaling:
            entries = list(self._loaded_scaling)  # loaded, not used yet: pass it on
        return {EXTRA_STATE_MARKER: EXTRA_STATE_VERSION, "entries": entries}

    def set_extra_state(self, state: Any) -> None:
        if state is None:
            return
        if not is_scaling_extra_state(state):
            raise ValueError(
                f"{type(self).__name__} {getattr(self, 'name', '')!r}: the checkpoint's "
                "_extra_state is not a qrecipe scaling state (a dict with key "
                f"'{EXTRA_STATE_MARKER}'); was it saved from another module type?")
        if state[EXTRA_STATE_MARKER] != EXTRA_STATE_VERSION:
            raise ValueError(f"qrecipe scaling state version {state[EXTRA_STATE_MARKER]} is not "
                             f"supported (this qrecipe reads version {EXTRA_STATE_VERSION})")
        check_extra_state_entries(state.get("entries", []),
                                  f"{type(self).__name__} {getattr(self, 'name', '')!r}")
        entries = [e for e in state.get("entries", []) if e.get("scaling_states")]
        self._loaded_scaling = entries or None
        for recipe in list(getattr(self, "_roles", {}).keys()):
            self._apply_loaded_scaling(recipe)

    def _apply_loaded_scaling(self, recipe) -> None:
        """Writes loaded states into `recipe`'s engine (the module has resolved its roles)."""
        entries = self._loaded_scaling
        if not entries:
            return
        same = [e for e in entries if e.get("recipe") == recipe.name]
        entry = same[0] if same else entries[0]
        states = [state_from_checkpoint(s) for s in entry["scaling_states"]]
        try:
            recipe.engine.load_scaling_states(states, update=bool(entry.get("update_pending")))
            recipe.scaling_generation += 1
        except _C.QrecipeError as error:
            who = f"{type(self).__name__} {getattr(self, 'name', '')!r}"
            raise _C.QrecipeError(
                f"{who}: loading the scaling state saved under recipe "
                f"'{entry.get('recipe')}' into recipe '{recipe.name}': {error}. To keep the "
                "weights and start scaling afresh, load "
                "qrecipe.drop_scaling_states(state_dict)") from None
        self._loaded_scaling = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A plain torch checkpoint (or one passed through drop_scaling_states) has no scaling
        # state: that is not a missing key, scaling just starts afresh.
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)
