"""``qrecipe.autocast``: which recipe the qrecipe modules run under, and when delayed scaling
advances (docs/adapter.md, "autocast").

    with qrecipe.autocast(recipe):      # recipe None: Recipe.default()
        loss = model(x).sum()
    loss.backward()                     # backward may run outside the block

Blocks nest; the innermost decides (``enabled=False`` inside an enabled block runs its modules
in high precision). The state is per thread, like torch.autocast (and so is which recipes'
update is pending: ``Recipe.update_pending``, recipe.py).

Scaling-update timing: quantizers with delayed scaling record amaxes during the step
(forward and backward) and read the scales computed before it. The update of every recipe
whose modules ran since the last update happens once, when the next *outermost* block is
entered, so it never falls between a forward and its backward, and micro-steps inside one
outer block share one set of scales.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, List, Optional

import torch

from .recipe import Recipe, RecipeLike, as_recipe


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: List[Optional[Recipe]] = []  # None entries: disabled blocks


_state = _State()

# Called (on this thread) when its outermost block exits: per-forward caches that must not
# outlive the forward register here (nn/input_sharing.py drops its kept input operand).
_outermost_exit_hooks: List[Callable[[], None]] = []


def on_outermost_exit(hook: Callable[[], None]) -> None:
    """Runs `hook()` each time the outermost autocast block of a thread exits."""
    _outermost_exit_hooks.append(hook)


def current_recipe() -> Optional[Recipe]:
    """The recipe of the innermost enabled autocast block, or None (high precision)."""
    return _state.stack[-1] if _state.stack else None


def is_enabled() -> bool:
    return current_recipe() is not None


def is_active() -> bool:
    """Whether any autocast block (enabled or not) is open on this thread."""
    return bool(_state.stack)


def update_pending(recipe: Recipe) -> bool:
    """True when `recipe`'s modules ran on this thread since its last scaling update (the
    update is due at the next outermost block entry): ``recipe.update_pending``."""
    return recipe.update_pending


class autocast(contextlib.ContextDecorator):
    """Runs qrecipe modules under ``recipe`` (None: the default recipe) inside the block."""

    def __init__(self, recipe: RecipeLike = None, enabled: bool = True):
        self.enabled = bool(enabled)
        # Resolve now so a bad recipe fails where the user wrote it, not at the first module.
        self.recipe = as_recipe(recipe) if self.enabled else None

    def __enter__(self) -> "autocast":
        # Never during a backward: a block entered there (a checkpointed function recomputed
        # by torch.utils.checkpoint) must not change the scales between a forward and its
        # backward.
        if not _state.stack and torch._C._current_graph_task_id() == -1:
            Recipe.run_pending_updates()
        _state.stack.append(self.recipe)
        return self

    def __exit__(self, *exc) -> bool:
        _state.stack.pop()
        if not _state.stack:
            for hook in _outermost_exit_hooks:
                hook()
        return False
