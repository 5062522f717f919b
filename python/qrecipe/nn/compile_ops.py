"""The quantized linear GEMMs as ``torch.library`` custom operators, so ``torch.compile`` can
put a qrecipe module's forward and backward in its graph instead of breaking the graph at
every engine call (docs/adapter.md, "torch.compile").

    qrecipe::linear_forward(x, weight, bias?, roles, need_dgrad, need_wgrad)
        -> (y, saved: Tensor[])
    qrecipe::linear_backward(dy, saved, x?, weight?, roles, x_shape, x_dtype, w_dtype,
                             need_dgrad, need_wgrad) -> (dx, dw)

``roles`` is an integer handle of the module's ``LinearRoles`` (engine quantizers are not
tensors and cannot cross an operator boundary); the handle stays valid while the roles do.
The operators run linear_gemms.py's ``linear_forward`` and ``linear_backward``, the GEMMs
of the eager path, and backward reads exactly what the eager path saves: the forward returns
each saved quantized operand (the columnwise copies of x for wgrad and of W for dgrad) as one
uint8 tensor of its bytes and scales (``QuantizedTensor.storage``, an alias of its memory, no
copy), and backward rebuilds the operand over that tensor (``Quantizer.from_storage``). So
nothing is quantized twice: results are the eager bytes (stochastic rounding included), the
delayed-scaling amaxes are recorded once, and activations are kept quantized as in eager
mode. A role of format none saves the high-precision tensor itself. The fake (meta)
implementations compute the saved tensors' sizes from the quantizers' layouts.

Used by ``quantized_linear`` while ``torch.compiler.is_compiling()``; eager mode keeps
``LinearFunction``. Weight caching (``is_first_microbatch``), ``main_grad`` accumulation and
QuantizedWeight parameters take the eager path (a graph break).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .._engine import _C
from ..quantization import COLUMNWISE
from .linear_gemms import (LinearRoles, dense, linear_backward, linear_forward,
                           roles_by_handle)


def roles_handle(roles: LinearRoles) -> int:
    """The integer a LinearRoles crosses the operator boundary as (linear_gemms.py registers
    every LinearRoles under it when it is made)."""
    return id(roles)


def _roles(handle: int) -> LinearRoles:
    roles = roles_by_handle(handle)
    if roles is None:
        raise RuntimeError(f"qrecipe::linear operator: roles handle {handle} is unknown (its "
                           "module's roles were dropped); re-run the module's forward")
    return roles


def saved_plan(r: LinearRoles, tokens: int, in_features: int, out_features: int,
               need_dgrad: bool, need_wgrad: bool) -> List[Tuple[object, int, int]]:
    """(quantizer, rows, cols) of each quantized operand the forward saves, in order: x's
    columnwise copy for wgrad, then W's for dgrad (roles of format none save no such
    operand: the high-precision tensor is saved instead)."""
    plan = []
    if need_wgrad and r.input is not None:
        plan.append((r.input, tokens, in_features))
    if need_dgrad and r.weight is not None:
        plan.append((r.weight, out_features, in_features))
    return plan


# torch.library.custom_op arrived in torch 2.4: with an older torch there are no operators and
# quantized_linear keeps its eager path under torch.compile (graph breaks, still correct).
AVAILABLE = hasattr(torch.library, "custom_op") and hasattr(torch.compiler, "is_compiling")

if AVAILABLE:
    @torch.library.custom_op("qrecipe::linear_forward", mutates_args=())
    def linear_forward_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          roles: int, need_dgrad: bool, need_wgrad: bool
                          ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        y, (saved_x, saved_w) = linear_forward(x, weight, bias, _roles(roles), need_dgrad,
                                               need_wgrad)
        saved = [op.storage("columnwise") for op in (saved_x, saved_w)
                 if isinstance(op, _C.QuantizedTensor)]
        return y, saved

    @linear_forward_op.register_fake
    def _(x, weight, bias, roles, need_dgrad, need_wgrad):
        out_features, in_features = weight.shape
        tokens = x.numel() // in_features if in_features else 0
        plan = saved_plan(_roles(roles), tokens, in_features, out_features, need_dgrad,
                          need_wgrad)
        saved = [x.new_empty((q.storage_bytes(rows, cols, "columnwise"),), dtype=torch.uint8)
                 for q, rows, cols in plan]
        return x.new_empty((*x.shape[:-1], out_features)), saved

    @torch.library.custom_op("qrecipe::linear_backward", mutates_args=())
    def linear_backward_op(dy: torch.Tensor, saved: List[torch.Tensor],
                           x: Optional[torch.Tensor], weight: Optional[torch.Tensor], roles: int,
                           x_shape: List[int], x_dtype: torch.dtype, w_dtype: torch.dtype,
                           need_dgrad: bool, need_wgrad: bool
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
        r = _roles(roles)
        out_features, in_features = r.plan["out_features"], x_shape[-1]
        tokens = dy.numel() // out_features if out_features else 0
        plan = saved_plan(r, tokens, in_features, out_features, need_dgrad, need_wgrad)
        rebuilt = [q.from_storage(rows, cols, COLUMNWISE, {"columnwise": t}, t.device)
                   for (q, rows, cols), t in zip(plan, saved)]
        saved_x = saved_w = None
        if need_wgrad:
            saved_x = rebuilt.pop(0) if r.input is not None else \
                dense(x.reshape(-1, in_features).contiguous())
        if need_dgrad:
            saved_w = rebuilt.pop(0) if r.weight is not None else dense(weight.contiguous())
        dx, dw = linear_backward(dy.reshape(-1, out_features).contiguous(), saved_x, saved_w, r,
                                 x_shape=x_shape, x_dtype=x_dtype, w_dtype=w_dtype,
                                 need_dgrad=need_dgrad, need_wgrad=need_wgrad)
        # An operator returns tensors: an empty one stands for a gradient not asked for.
        return (dx if dx is not None else dy.new_empty(0),
                dw if dw is not None else dy.new_empty(0))

    @linear_backward_op.register_fake
    def _(dy, saved, x, weight, roles, x_shape, x_dtype, w_dtype, need_dgrad, need_wgrad):
        out_features = _roles(roles).plan["out_features"]
        dx = dy.new_empty(x_shape, dtype=x_dtype) if need_dgrad else dy.new_empty(0)
        dw = dy.new_empty((out_features, x_shape[-1]), dtype=w_dtype) if need_wgrad \
            else dy.new_empty(0)
        return dx, dw

    def _setup_context(ctx, inputs, output):
        x, weight, bias, roles, need_dgrad, need_wgrad = inputs
        r = _roles(roles)
        _, saved = output
        # The high-precision operands a role of format none reads in backward, saved as they
        # are; everything quantized is in `saved` (all through save_for_backward).
        dense_x = x if (need_wgrad and r.input is None) else None
        dense_w = weight if (need_dgrad and r.weight is None) else None
        ctx.save_for_backward(dense_x, dense_w, *saved)
        ctx.roles, ctx.need = roles, (need_dgrad, need_wgrad)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = list(x.shape), x.dtype, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype

    def _backward(ctx, dy, _saved_grads):
        dense_x, dense_w, *saved = ctx.saved_tensors
        need_dgrad = ctx.need[0] and ctx.needs_input_grad[0]
        need_wgrad = ctx.need[1] and ctx.needs_input_grad[1]
        dx = dw = db = None
        if need_dgrad or need_wgrad:
            # The saved tensors are those of the forward's need flags; backward may ask for
            # less (same plan order: x first, then W).
            if ctx.need != (need_dgrad, need_wgrad):
                saved = _subset(saved, ctx, need_dgrad, need_wgrad)
            gx, gw = linear_backward_op(dy, saved, dense_x, dense_w, ctx.roles, ctx.x_shape,
                                        ctx.x_dtype, ctx.w_dtype, need_dgrad, need_wgrad)
            dx = gx if need_dgrad else None
            dw = gw if need_wgrad else None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            out_features = _roles(ctx.roles).plan["out_features"]
            db = dy.reshape(-1, out_features).float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None

    def _subset(saved: Sequence[torch.Tensor], ctx, need_dgrad: bool, need_wgrad: bool):
        r = _roles(ctx.roles)
        kept, i = [], 0
        if ctx.need[1] and r.input is not None:
            if need_wgrad:
                kept.append(saved[i])
            i += 1
        if ctx.need[0] and r.weight is not None and need_dgrad:
            kept.append(saved[i])
        return kept

    linear_forward_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    roles) -> torch.Tensor:
    """``quantized_linear`` while torch.compile traces: one custom operator (whose autograd
    formula is the other)."""
    grad = torch.is_grad_enabled()
    y, _ = torch.ops.qrecipe.linear_forward(x, weight, bias, roles_handle(roles),
                                            grad and x.requires_grad,
                                            grad and weight.requires_grad)
    return y
