"""``qrecipe.autocast``: which recipe the qrecipe modules run under, and when delayed scaling
advances (DESIGN.md section 8).

    with qrecipe.autocast(recipe):      # recipe None: Recipe.default()
        loss = model(x).sum()
    loss.backward()                     # backward may run outside the block

Blocks nest; the innermost decides (``enabled=False`` inside an enabled block runs its modules
in high precision). The state is per thread, like torch.autocast.

Scaling-update timing: quantizers with delayed scaling record amaxes during the step
(forward and backward) and read the scales computed before it. The update of every recipe
whose modules ran since the last update happens once, when the next *outermost* block is
entered, so it never falls between a forward and its backward, and micro-steps inside one
outer block share one set of scales.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Dict, List, Optional, Union

from .recipe import Recipe

RecipeLike = Union[Recipe, str, "os.PathLike[str]", dict, None]


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: List[Optional[Recipe]] = []  # None entries: disabled blocks
        self.pending: Dict[int, Recipe] = {}     # recipes whose modules ran since the update


_state = _State()


def as_recipe(recipe: RecipeLike) -> Recipe:
    """A Recipe from a Recipe, a YAML path, a dict, or None (the default recipe)."""
    if recipe is None:
        return Recipe.default()
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.from_dict(recipe)
    if isinstance(recipe, (str, os.PathLike)):
        return Recipe.load(recipe)
    raise TypeError(f"recipe must be a qrecipe.Recipe, a path to a YAML file, a dict or None, "
                    f"got {type(recipe).__name__}")


def current_recipe() -> Optional[Recipe]:
    """The recipe of the innermost enabled autocast block, or None (high precision)."""
    return _state.stack[-1] if _state.stack else None


def is_enabled() -> bool:
    return current_recipe() is not None


def note_step_activity(recipe: Recipe) -> None:
    """Called by modules that quantized under `recipe`: its scaling advances at the next
    outermost block entry."""
    _state.pending[id(recipe)] = recipe


def update_pending(recipe: Recipe) -> bool:
    """True when `recipe`'s modules ran since its last scaling update (the update is due at
    the next outermost block entry): checkpoints record it (nn/module_state.py)."""
    return id(recipe) in _state.pending


def _advance_scaling() -> None:
    pending = list(_state.pending.values())
    _state.pending.clear()
    for recipe in pending:
        recipe.update_scaling()


class autocast(contextlib.ContextDecorator):
    """Runs qrecipe modules under ``recipe`` (None: the default recipe) inside the block."""

    def __init__(self, recipe: RecipeLike = None, enabled: bool = True):
        self.enabled = bool(enabled)
        # Resolve now so a bad recipe fails where the user wrote it, not at the first module.
        self.recipe = as_recipe(recipe) if self.enabled else None

    def __enter__(self) -> "autocast":
        if not _state.stack:
            _advance_scaling()
        _state.stack.append(self.recipe)
        return self

    def __exit__(self, *exc) -> bool:
        _state.stack.pop()
        return False


@contextlib.contextmanager
def _replay(recipe: Optional[Recipe]):
    """Re-enters the autocast state a forward ran under (qrecipe.checkpoint's recomputation):
    `recipe` (None: high precision) becomes the innermost entry without running any pending
    scaling update, so a recomputation inside backward never advances the scales between a
    forward and its backward."""
    _state.stack.append(recipe)
    try:
        yield
    finally:
        _state.stack.pop()
