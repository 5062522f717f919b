"""``quantized_linear``: the one entry every qrecipe module uses for its GEMMs, and
``LinearFunction``, its eager autograd node. The GEMMs themselves (operands, forward,
backward) are linear_gemms.py's.

Training-loop features, here so every module gets them through ``quantized_linear``:
``is_first_microbatch`` keeps the quantized weight across micro-batches (weight_cache.py);
``fuse_wgrad_accumulation`` accumulates wgrad into ``weight.main_grad`` (FP32) in the GEMM's
epilogue; a ``QuantizedWeight`` parameter (quantized_model_init) is used as the GEMM operand
as stored. Under ``torch.no_grad()`` (or when nothing needs a gradient) no autograd node is
made: only rowwise copies are quantized and nothing is saved. While torch.compile traces, the
plain path is one ``torch.library`` operator (compile_ops.py); the features above run eagerly
behind a graph break.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..quantized_param import QuantizedWeight
from . import compile_ops as _compile_ops
from .compile_ops import compiled_linear
from .linear_gemms import (LinearRoles, linear_backward, linear_forward, stored_dgrad_operand,
                           weight_operand_of)
from .saved_operands import pack_all, unpack_all


class LinearFunction(torch.autograd.Function):
    """Autograd for ``linear_forward`` / ``linear_backward`` (linear_gemms.py); made by
    ``quantized_linear`` only."""

    @staticmethod
    def forward(ctx, x, weight, bias, roles: LinearRoles, need_dgrad: bool, need_wgrad: bool,
                weight_op=None, fuse_wgrad_accumulation: bool = False):
        y, (saved_x, saved_w) = linear_forward(x, weight, bias, roles, need_dgrad, need_wgrad,
                                               weight_op, share_input=True)
        # A QuantizedWeight's dgrad bytes are read from the weight when backward runs (FSDP2
        # may have gathered them again into new memory by then).
        ctx.stored_weight = weight if isinstance(weight, QuantizedWeight) and need_dgrad else None
        if ctx.stored_weight is not None:
            saved_w = None
        ctx.roles = roles
        # main_grad accumulation: the Parameter itself is kept to reach .main_grad in backward.
        ctx.main_grad_weight = weight if (fuse_wgrad_accumulation and need_wgrad) else None
        ctx.need_dgrad, ctx.need_wgrad = need_dgrad, need_wgrad
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # Everything saved goes through save_for_backward as plain tensors (a quantized operand
        # as the tensors of its bytes and scales, saved_operands.py), so saved-tensor hooks
        # (CPU offload, activation checkpointing) see it, and in-place changes of a dense one
        # are detected. A weight operand the caller gave (cached across micro-batches, stored
        # quantized, a grouped quantization's) belongs to the weight, not to this step: it
        # stays on ctx.
        ctx.given_w = saved_w if weight_op is not None else None
        tensors, ctx.packed = pack_all((saved_x, None if weight_op is not None else saved_w))
        ctx.save_for_backward(*tensors)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved_x, saved_w = unpack_all(ctx.saved_tensors, ctx.packed)
        if ctx.given_w is not None:
            saved_w = ctx.given_w
        if ctx.stored_weight is not None:
            saved_w = stored_dgrad_operand(ctx.stored_weight, "qrecipe module")
        dy2 = dy.reshape(-1, ctx.roles.plan["out_features"]).contiguous()
        dx, dw = linear_backward(dy2, saved_x, saved_w, ctx.roles, x_shape=ctx.x_shape,
                                 x_dtype=ctx.x_dtype, w_dtype=ctx.w_dtype,
                                 need_dgrad=ctx.need_dgrad and ctx.needs_input_grad[0],
                                 need_wgrad=ctx.need_wgrad and ctx.needs_input_grad[1],
                                 main_grad_weight=ctx.main_grad_weight)
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(ctx.bias_dtype)
        ctx.given_w = None
        ctx.stored_weight = None
        ctx.main_grad_weight = None
        return dx, dw, db, None, None, None, None, None


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     roles: LinearRoles, *, is_first_microbatch: Optional[bool] = None,
                     fuse_wgrad_accumulation: bool = False,
                     who: str = "qrecipe module",
                     weight_group: Optional[Tuple[torch.Tensor, int]] = None,
                     weight_operand=None, scaling_generation: int = 0) -> torch.Tensor:
    """``y = x W^T + b`` under `roles`: the one entry every qrecipe module uses for its GEMMs.

    Builds the autograd graph only when something needs a gradient, so under
    ``torch.no_grad()`` (or for frozen inputs and weights) only the rowwise copies the
    forward needs are made and nothing is saved.

    is_first_microbatch: None quantizes the weight every call; True quantizes it and keeps the
    quantized operand, False reuses it (weight_cache.py). fuse_wgrad_accumulation: wgrad is
    accumulated into ``weight.main_grad`` (FP32) by the GEMM and the weight gets no ``.grad``.
    `who` names the calling module in errors. `weight_group`: ``(parameter, index)`` when
    `weight` is a view of rows of a grouped parameter (GroupedLinear), the weight cache's key.
    `weight_operand`: the weight already quantized by the caller with the directions this call
    needs (GroupedLinear's one grouped quantization of all experts); used as is, not cached."""
    if _compile_ops.AVAILABLE and torch.compiler.is_compiling():
        if is_first_microbatch is None and not fuse_wgrad_accumulation and \
                not isinstance(weight, QuantizedWeight) and weight_operand is None:
            return compiled_linear(x, weight, bias, roles)  # custom operators (compile_ops.py)
        # Weight caching, main_grad and stored quantized weights run eagerly: one clean graph
        # break instead of dynamo trying to trace the engine bindings.
        return _quantized_linear_not_traced(x, weight, bias, roles, is_first_microbatch,
                                            fuse_wgrad_accumulation, who, weight_group,
                                            weight_operand, scaling_generation)
    return _quantized_linear_eager(x, weight, bias, roles, is_first_microbatch,
                                   fuse_wgrad_accumulation, who, weight_group, weight_operand,
                                   scaling_generation)


def _quantized_linear_eager(x, weight, bias, roles, is_first_microbatch,
                            fuse_wgrad_accumulation, who, weight_group, weight_operand=None,
                            scaling_generation=0):
    grad = torch.is_grad_enabled()
    need_dgrad = grad and x.requires_grad
    need_wgrad = grad and weight.requires_grad
    needs_bias_grad = grad and bias is not None and bias.requires_grad
    weight_op = weight_operand  # quantized by the caller (a grouped quantization), or None
    if weight_op is None:
        weight_op = weight_operand_of(weight, roles, need_dgrad, is_first_microbatch, who,
                                      weight_group, scaling_generation)
    if not (need_dgrad or need_wgrad or needs_bias_grad):
        return linear_forward(x, weight, bias, roles, False, False, weight_op,
                              share_input=True)[0]
    return LinearFunction.apply(x, weight, bias, roles, need_dgrad, need_wgrad, weight_op,
                                bool(fuse_wgrad_accumulation))


# The same, run by dynamo as an opaque call (a graph break) rather than traced.
_quantized_linear_not_traced = torch.compiler.disable(_quantized_linear_eager)
