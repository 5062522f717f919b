"""``qrecipe.checkpoint``: activation checkpointing that recomputes under the autocast state
of the original forward (DESIGN.md section 8).

``torch.utils.checkpoint`` recomputes a segment's forward during backward, usually outside
the ``qrecipe.autocast`` block of the step, so qrecipe modules would recompute in high
precision and save tensors that do not match the forward that produced the outputs.
``qrecipe.checkpoint`` records the recipe the segment ran under and replays it during the
recomputation without advancing delayed scaling. Scales are only updated at the next
outermost ``autocast`` entry, so the recomputation quantizes with the scales the forward
used. Its amaxes max-accumulate into the same history row, which changes nothing. The
recomputed quantized operands are therefore the forward's bytes.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch.utils.checkpoint

from . import autocasting


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)`` whose
    recomputation runs under the autocast state (recipe, or disabled) of the forward.
    Keyword arguments go to ``function``, except ``determinism_check`` and ``debug``, which go
    to torch."""
    if "use_reentrant" in kwargs or "context_fn" in kwargs:
        raise TypeError("qrecipe.checkpoint always uses torch's non-reentrant checkpoint with "
                        "its own context_fn; drop use_reentrant / context_fn")
    torch_options = {k: kwargs.pop(k) for k in ("determinism_check", "debug") if k in kwargs}
    recipe = autocasting.current_recipe()

    def contexts():
        return contextlib.nullcontext(), autocasting.replay(recipe)

    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False,
                                             context_fn=contexts, **torch_options, **kwargs)
