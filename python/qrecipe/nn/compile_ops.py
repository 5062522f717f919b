"""The quantized linear GEMMs as ``torch.library`` custom operators, so ``torch.compile`` can
put a qrecipe module's forward and backward in its graph instead of breaking the graph at
every engine call (DESIGN.md section 8).

    qrecipe::linear_forward(x, weight, bias?, roles) -> y
    qrecipe::linear_backward(dy, x, weight, roles, need_dgrad, need_wgrad) -> (dx, dw)

``roles`` is an integer handle of the module's ``LinearRoles`` (engine quantizers are not
tensors and cannot cross an operator boundary); the handle stays valid while the roles do.
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

import weakref
from typing import Optional, Tuple

import torch


_ROWWISE, _COLUMNWISE = 1, 2

# handle -> LinearRoles; weak, so the module's role cache decides how long roles live.
_ROLES: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register_roles(roles) -> None:
    """Called when a LinearRoles is made (outside the traced hot path: roles are cached), so
    the traced forward only takes ``id(roles)``, which dynamo folds into a constant."""
    _ROLES[id(roles)] = roles


def roles_handle(roles) -> int:
    return id(roles)


def _roles(handle: int):
    roles = _ROLES.get(handle)
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
        from .linear_function import linear_forward
        return linear_forward(x, weight, bias, _roles(roles), False, False)[0]

    @linear_forward_op.register_fake
    def _(x, weight, bias, roles):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.custom_op("qrecipe::linear_backward", mutates_args=())
    def linear_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, roles: int,
                           need_dgrad: bool, need_wgrad: bool
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
        from .linear_function import _gemm, _operand
        r = _roles(roles)
        out_features, in_features = weight.shape
        dy2 = dy.reshape(-1, out_features).contiguous()
        tokens = dy2.shape[0]
        dx = dy.new_empty(0)
        dw = weight.new_empty(0)
        usage = (_ROWWISE if need_dgrad else 0) | (_COLUMNWISE if need_wgrad else 0)
        if not usage:
            return dx, dw
        dy_op = _operand(r.grad_output, dy2, usage)
        if need_dgrad:
            # The forward quantized W with both directions when x needed a gradient: do the same.
            w_op = _operand(r.weight, weight.contiguous(), _ROWWISE | _COLUMNWISE)
            dx = _gemm("dgrad", dy_op, "rowwise", w_op, "columnwise", tokens, in_features, dy,
                       x.dtype).reshape(x.shape)
        if need_wgrad:
            x2 = x.reshape(-1, in_features).contiguous()
            x_op = _operand(r.input, x2, _ROWWISE | _COLUMNWISE)
            dw = _gemm("wgrad", dy_op, "columnwise", x_op, "columnwise", out_features, in_features,
                       dy, weight.dtype)
        return dx, dw

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
