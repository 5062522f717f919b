"""The quantized linear GEMMs as ``torch.library`` custom operators, so ``torch.compile`` can
put a qrecipe module's forward and backward in its graph instead of breaking the graph at
every engine call (DESIGN.md section 8).

    qrecipe::linear_forward(x, weight, bias?, roles) -> y
    qrecipe::linear_backward(dy, x, weight, roles, need_dgrad, need_wgrad) -> (dx, dw)

``roles`` is an integer handle of the module's ``LinearRoles`` (engine quantizers are not
tensors and cannot cross an operator boundary); the handle stays valid while the roles do.
The operators run linear_gemms.py's ``linear_forward`` and ``linear_backward``, the GEMMs
of the eager path.
Both operators have fake (meta) implementations for tracing, and ``linear_forward`` has its
autograd formula registered, so dynamo and AOTAutograd see two opaque nodes.

Used by ``quantized_linear`` only while ``torch.compiler.is_compiling()``; eager mode keeps
``LinearFunction``. The compiled path computes the same GEMMs on the same quantized bytes, with
one difference in what is kept for backward: the operators can only save tensors, so
backward re-quantizes the high-precision ``x`` and ``W`` it saved (both directions, exactly as
the forward did, so the bytes are identical; for stochastic-rounding input or weight roles
the random stream advances once more). The memory saving of keeping activations quantized
therefore does not apply under torch.compile yet. Weight caching (``is_first_microbatch``),
``main_grad`` accumulation and QuantizedWeight parameters take the eager path (a graph
break).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..quantization import COLUMNWISE, ROWWISE
from .linear_gemms import LinearRoles, linear_backward, linear_forward, operand, roles_by_handle


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


# torch.library.custom_op arrived in torch 2.4: with an older torch there are no operators and
# quantized_linear keeps its eager path under torch.compile (graph breaks, still correct).
AVAILABLE = hasattr(torch.library, "custom_op") and hasattr(torch.compiler, "is_compiling")

if AVAILABLE:
    @torch.library.custom_op("qrecipe::linear_forward", mutates_args=())
    def linear_forward_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          roles: int) -> torch.Tensor:
        return linear_forward(x, weight, bias, _roles(roles), False, False)[0]

    @linear_forward_op.register_fake
    def _(x, weight, bias, roles):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.custom_op("qrecipe::linear_backward", mutates_args=())
    def linear_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, roles: int,
                           need_dgrad: bool, need_wgrad: bool
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
        r = _roles(roles)
        out_features, in_features = weight.shape
        # The forward quantized W with both directions when x needed a gradient, and x with
        # both when W did: the same again, so dgrad and wgrad read the forward's bytes.
        saved_w = operand(r.weight, weight.contiguous(), ROWWISE | COLUMNWISE) \
            if need_dgrad else None
        saved_x = operand(r.input, x.reshape(-1, in_features).contiguous(),
                          ROWWISE | COLUMNWISE) if need_wgrad else None
        dx, dw = linear_backward(dy.reshape(-1, out_features).contiguous(), saved_x, saved_w, r,
                                 x_shape=x.shape, x_dtype=x.dtype, w_dtype=weight.dtype,
                                 need_dgrad=need_dgrad, need_wgrad=need_wgrad)
        # An operator returns tensors: an empty one stands for a gradient not asked for.
        return (dx if dx is not None else dy.new_empty(0),
                dw if dw is not None else weight.new_empty(0))

    @linear_backward_op.register_fake
    def _(dy, x, weight, roles, need_dgrad, need_wgrad):
        dx = x.new_empty(x.shape) if need_dgrad else x.new_empty(0)
        dw = weight.new_empty(weight.shape) if need_wgrad else weight.new_empty(0)
        return dx, dw

    def _setup_context(ctx, inputs, output):
        x, weight, bias, roles = inputs
        ctx.save_for_backward(x, weight)
        ctx.roles = roles
        ctx.bias_dtype = None if bias is None else bias.dtype

    def _backward(ctx, dy):
        x, weight = ctx.saved_tensors
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = db = None
        if need_dgrad or need_wgrad:
            gx, gw = linear_backward_op(dy, x, weight, ctx.roles, need_dgrad, need_wgrad)
            dx = gx if need_dgrad else None
            dw = gw if need_wgrad else None
        if ctx.needs_input_grad[2]:
            db = dy.reshape(-1, weight.shape[0]).float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None

    linear_forward_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    roles) -> torch.Tensor:
    """``quantized_linear`` while torch.compile traces: one custom operator."""
    return torch.ops.qrecipe.linear_forward(x, weight, bias, roles_handle(roles))
