"""Activation recomputation that replays the forward (docs/adapter.md, "Activation
checkpointing").

``torch.utils.checkpoint`` (reentrant and non-reentrant; Hugging Face's
``gradient_checkpointing_enable()`` calls it) runs a segment's forward a second time during
backward, usually after the ``qrecipe.autocast`` block has closed. A qrecipe GEMM there must
compute exactly what it computed in the forward: the same recipe (or high precision), hence
the same quantizers and, for delayed scaling, the same scales. So:

- In the forward, every qrecipe GEMM call made inside a checkpointed segment appends a
  :class:`Record` (the module, which of its GEMMs, the recipe or None, the recipe's
  ``scaling_generation``) to that segment.
- A GEMM call that runs while the autograd engine executes a backward on this thread is a
  recomputation when it runs inside a checkpoint's recomputation; it takes the segment's
  records in order, checks it is the same module and GEMM, and runs under the recorded
  recipe. Delayed scales change only when an outermost ``autocast`` is entered (never during
  a backward, see autocasting.py); if one was entered between the forward and this
  recomputation and the GEMM's roles use delayed scaling, the scales differ and the
  recomputation is refused with an error. Its amaxes are the forward's own values, so their
  max-accumulation into the step's history row changes nothing. An input or weight role with
  stochastic rounding would draw new random offsets: refused too (not supported yet).

How a segment is found (torch's own checkpoint objects, checked on every torch this was tested
with; if they change, the forward records nothing and the recomputation fails loudly below):
- non-reentrant: the innermost saved-tensors hooks are the checkpoint's; the segment is its
  ``_CheckpointFrame`` (in the forward ``_checkpoint_hook``, in the recomputation
  ``_recomputation_hook``, which reaches the same frame);
- reentrant: the forward runs inside ``CheckpointFunction.forward`` (found on the Python stack,
  only while grad mode is off, as it is there); the segment is that function's ctx, which is
  the autograd node whose backward recomputes it.

A qrecipe GEMM that runs during a backward outside any recognised recomputation and outside
any ``qrecipe.autocast`` block cannot be told apart from a recomputation of a checkpoint
implementation qrecipe does not know: it is an error that says to state the intent with an
explicit ``qrecipe.autocast(...)`` (enabled or not) around that call.
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.utils.checkpoint as _torch_checkpoint

from . import autocasting
from ._engine import QrecipeError
from .quantization import spec_has
from .recipe import Recipe

_RECORDS = "_qrecipe_records"      # attribute of a segment: the forward's records, in order
_REPLAYED = "_qrecipe_replayed"    # attribute of a segment: {graph task id: records taken}


@dataclass(frozen=True)
class Record:
    """One qrecipe GEMM call of a checkpointed forward."""
    module: "weakref.ref"          # the QuantizedModule
    gemm: str                      # its GEMM key ("" for a single-GEMM module)
    recipe: Optional[Recipe]       # None: high precision (outside autocast or disabled)
    generation: int                # recipe.scaling_generation at the forward (0 for None)
    who: str                       # the module's name, for errors


def in_backward() -> bool:
    """Whether the autograd engine is executing a backward on this thread now."""
    return torch._C._current_graph_task_id() != -1


def _frame_of_hook(hook) -> Any:
    """The ``_CheckpointFrame`` a checkpoint pack hook closes over (directly, or through the
    weak reference the recomputation hook holds), or None."""
    hook = getattr(hook, "__wrapped__", hook)  # torch._dynamo.disable wraps the recompute hook
    frame_type = getattr(_torch_checkpoint, "_CheckpointFrame", None)
    if frame_type is None:
        return None
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, weakref.ReferenceType):
            value = value()
        if isinstance(value, frame_type):
            return value
    return None


def _non_reentrant_segment(recomputing: bool) -> Any:
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is None:
        return None
    pack = hooks[0]
    name = getattr(getattr(pack, "__wrapped__", pack), "__qualname__", "")
    wanted = "_recomputation_hook." if recomputing else "_checkpoint_hook."
    if not name.startswith(wanted):
        return None
    return _frame_of_hook(pack)


_REENTRANT_FORWARD = getattr(getattr(_torch_checkpoint, "CheckpointFunction", None), "forward",
                             None)
_REENTRANT_CODE = getattr(_REENTRANT_FORWARD, "__code__", None)


def _reentrant_forward_segment() -> Any:
    """The ctx of the ``CheckpointFunction.forward`` this call runs inside, or None. That
    forward runs its function under ``torch.no_grad()``, so the stack is searched only then."""
    if _REENTRANT_CODE is None or torch.is_grad_enabled():
        return None
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _REENTRANT_CODE:
            return frame.f_locals.get("ctx")
        frame = frame.f_back
    return None


def _reentrant_recompute_segment() -> Any:
    node = torch._C._current_autograd_node()
    if node is not None and type(node).__name__ == "CheckpointFunctionBackward" and \
            hasattr(node, "run_function"):
        return node
    return None


def forward_segment() -> Any:
    """The checkpointed segment this forward call runs in (innermost), or None."""
    segment = _non_reentrant_segment(recomputing=False)
    return segment if segment is not None else _reentrant_forward_segment()


def recompute_segment() -> Any:
    """The checkpointed segment this backward-time call recomputes, or None."""
    segment = _non_reentrant_segment(recomputing=True)
    return segment if segment is not None else _reentrant_recompute_segment()


def _records(segment) -> List[Record]:
    records = getattr(segment, _RECORDS, None)
    if records is None:
        records = []
        setattr(segment, _RECORDS, records)
    return records


def _next_record(segment, module, gemm: str, who: str) -> Record:
    records = getattr(segment, _RECORDS, None) or []
    replayed = getattr(segment, _REPLAYED, None)
    if replayed is None:
        replayed = {}
        setattr(segment, _REPLAYED, replayed)
    task = torch._C._current_graph_task_id()
    index = replayed.get(task, 0)
    if index >= len(records):
        raise QrecipeError(
            f"{who}: this recomputation of a checkpointed segment runs qrecipe GEMM number "
            f"{index + 1}, but its forward ran {len(records)}; the recomputed function must "
            "run the same qrecipe modules in the same order as the forward (is its control "
            "flow data-dependent, or did the forward run outside torch.utils.checkpoint?)")
    record = records[index]
    if record.module() is not module or record.gemm != gemm:
        raise QrecipeError(
            f"{who}: this recomputation of a checkpointed segment runs GEMM {gemm!r} of "
            f"{who} as its qrecipe GEMM number {index + 1}, but the forward ran GEMM "
            f"{record.gemm!r} of {record.who} there; the recomputed function must run the "
            "same qrecipe modules in the same order as the forward")
    replayed[task] = index + 1
    return record


def _check_replayable(record: Record, roles_of) -> None:
    recipe = record.recipe
    if recipe is None:
        return
    roles = roles_of(recipe)
    for role, q in (("input", roles.input), ("weight", roles.weight)):
        if q is not None and spec_has(q.spec_dict(), "stochastic_rounding", True):
            raise QrecipeError(
                f"{record.who}: recomputing a checkpointed forward whose {role} role "
                f"({q.describe()}) uses stochastic rounding: the recomputation would draw other "
                "random offsets than the forward, which is not supported yet. Keep this "
                "module out of checkpointed segments, or use a recipe without stochastic "
                "rounding on input and weight (the shipped nvfp4 recipe uses it on grad_output "
                "only, which is never recomputed)")
    if recipe.scaling_generation == record.generation:
        return
    if any(_is_delayed(q) for q in (roles.input, roles.weight, roles.grad_output)):
        raise QrecipeError(
            f"{record.who}: recomputing a checkpointed forward under recipe {recipe.name!r} "
            "after its delayed scales were updated (an outermost qrecipe.autocast block was "
            "entered between this forward and its backward); the recomputation would quantize "
            "with other scales than the forward did. Run each backward before the next step's "
            "outermost autocast block (for micro-batches, enter one outer block around all of "
            "a step's forwards and backwards)")


def _is_delayed(quantizer) -> bool:
    return quantizer is not None and spec_has(quantizer.spec_dict(), "scaling", "delayed")


def gemm_recipe(module, gemm: str, who: str, roles_of=None) -> Optional[Recipe]:
    """The recipe (None: high precision) GEMM `gemm` of `module` runs under now, and the
    record-keeping of checkpointing: recorded in a checkpointed forward, replayed in its
    recomputation. `roles_of(recipe)` gives the GEMM's LinearRoles (for the delayed-scaling
    check of a replay)."""
    if not in_backward():
        recipe = autocasting.current_recipe()
        segment = forward_segment()
        if segment is not None:
            _records(segment).append(Record(
                weakref.ref(module), gemm, recipe,
                recipe.scaling_generation if recipe is not None else 0, who))
        return recipe
    segment = recompute_segment()
    if segment is not None:
        record = _next_record(segment, module, gemm, who)
        if roles_of is not None:
            _check_replayable(record, roles_of)
        return record.recipe
    if autocasting.is_active():
        return autocasting.current_recipe()  # the caller said what this call runs under
    raise QrecipeError(
        f"{who}: a qrecipe GEMM runs during a backward, outside any qrecipe.autocast block and "
        "outside a recomputation of torch.utils.checkpoint (reentrant or not) that qrecipe "
        "recognises, so which recipe its forward used cannot be told. If this is the "
        "recomputation of another checkpoint implementation, use torch.utils.checkpoint; if "
        "the call is meant to run now, wrap it in qrecipe.autocast(recipe) or "
        "qrecipe.autocast(enabled=False) to say how")


def peek_recipe(module, gemm: str) -> Optional[Recipe]:
    """The recipe the next :func:`gemm_recipe` call of this module would return, without
    recording or taking a record (input checks run before the GEMM)."""
    if not in_backward():
        return autocasting.current_recipe()
    segment = recompute_segment()
    if segment is not None:
        records = getattr(segment, _RECORDS, None) or []
        index = (getattr(segment, _REPLAYED, None) or {}).get(
            torch._C._current_graph_task_id(), 0)
        return records[index].recipe if index < len(records) else None
    return autocasting.current_recipe()
