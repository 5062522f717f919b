"""``qrecipe.checkpoint``: activation checkpointing, an alias of torch's non-reentrant
``torch.utils.checkpoint.checkpoint``.

Every qrecipe module replays its forward when torch's checkpoint (reentrant or not, or Hugging
Face's ``gradient_checkpointing_enable()``) recomputes it during backward: the same recipe,
quantizers and scales, so the recomputed operands are the forward's bytes (recomputation.py).
This alias stays for code written when only it did so.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.utils.checkpoint


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)``
    (``use_reentrant=True`` may be passed too; both replay qrecipe's forward)."""
    kwargs.setdefault("use_reentrant", False)
    return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)
