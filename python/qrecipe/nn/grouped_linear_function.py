"""GroupedLinear's autograd: all experts' GEMMs as ONE autograd node, so the experts' inputs
(forward) and output gradients (backward) are each quantized by one grouped engine call
(``_C.quantize_grouped``: one launch on the GPU for formats with the plugin extra) instead of
one call per expert.

Numerics are those of ``num_gemms`` separate ``qrecipe.nn.Linear`` layers sharing the roles:
a grouped call gives every group the bytes and scales of quantizing its rows alone, with the
shared quantizer's state advanced as by one call per group in expert order (a
stochastic-rounding role gives expert ``i`` the ``i``-th offset of the call; a delayed-scaling
role records every group's amax). The per-expert GEMMs are linear_function's (``linear_forward``
and ``linear_backward``), writing straight into rows of one output and one input gradient.

Where a grouped call would change which directions an expert's tensor is quantized with (the
experts' weights disagree on ``requires_grad``), that tensor is quantized per expert instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .._engine import _C
from .linear_function import (LinearRoles, _COLUMNWISE, _ROWWISE, backward_usage,
                              linear_backward, linear_forward)


def _quantize_rows(quantizer, tensor: torch.Tensor, group_rows: List[int], usage: int):
    """Every grouped quantization of the experts' inputs and output gradients goes through
    here (tests count the calls): one QuantizedTensor per expert."""
    return _C.quantize_grouped(quantizer, tensor, group_rows, usage)


@dataclass
class GroupedCall:
    """One GroupedLinear call: the experts' rows, roles and per-expert weight operands.

    weight_ops[i]: expert i's weight already quantized (grouped, cached or stored) or None
    (format none: the dense weight is used). need_wgrad[i]: expert i's weight needs a
    gradient. main_grad_weights[i]: the tensor whose ``.main_grad`` expert i's wgrad
    accumulates into (fuse_wgrad_accumulation), else None. trim_weight_ops: the operands were
    made for this call alone, so their rowwise copies are dropped after fprop."""
    splits: List[int]
    roles: LinearRoles
    weight_ops: List[object]
    need_dgrad: bool
    need_wgrad: List[bool]
    main_grad_weights: List[Optional[torch.Tensor]]
    trim_weight_ops: bool

    def row_ranges(self):
        start = 0
        for rows in self.splits:
            yield start, start + rows
            start += rows


def _grouped_operands(quantizer, tensor: torch.Tensor, call: GroupedCall, usages: Sequence[int]):
    """Each expert's rows of `tensor` quantized with its usage by one grouped call, or None
    per expert where the caller quantizes them itself (no quantizer, nothing needed, or
    experts needing different directions)."""
    n = len(call.splits)
    if quantizer is None or len(set(usages)) != 1 or usages[0] == 0:
        return [None] * n
    return _quantize_rows(quantizer, tensor, call.splits, usages[0])


def grouped_forward(x: torch.Tensor, call: GroupedCall, weights: Sequence[torch.Tensor],
                    biases: Sequence[Optional[torch.Tensor]], saving: bool):
    """y [tokens, out] of every expert; returns (y, saved) with saved[i] = (x operand for
    wgrad, W operand for dgrad) of expert i (None, None when not `saving`)."""
    in_features, out_features = weights[0].shape[1], weights[0].shape[0]
    x2 = x.reshape(-1, in_features).contiguous()
    y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
    usages = [_ROWWISE | (_COLUMNWISE if (saving and w) else 0) for w in call.need_wgrad]
    x_ops = _grouped_operands(call.roles.input, x2, call, usages)
    saved = []
    for i, (r0, r1) in enumerate(call.row_ranges()):
        need_wgrad = saving and call.need_wgrad[i]
        need_dgrad = saving and call.need_dgrad
        _, pair = linear_forward(x2[r0:r1], weights[i], biases[i], call.roles, need_dgrad,
                                 need_wgrad, call.weight_ops[i], x_ops[i], y_into=y[r0:r1])
        op = call.weight_ops[i]
        if call.trim_weight_ops and op is not None and op.has("rowwise") and \
                op.has("columnwise"):
            op.drop("rowwise")  # fprop is done; dgrad reads the columnwise copy
        saved.append(pair)
    return y, saved


class GroupedLinearFunction(torch.autograd.Function):
    """``apply(x, call, *weights, *biases)``: every expert's ``x_i W_i^T + b_i``, rows of x
    in expert order (GroupedLinear only). `biases` is empty for a module without bias."""

    @staticmethod
    def forward(ctx, x, call: GroupedCall, *params):
        n = len(call.splits)
        weights, biases = params[:n], params[n:]
        y, saved = grouped_forward(x, call, weights, biases or [None] * n, saving=True)
        ctx.call = call
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.w_dtypes = [w.dtype for w in weights]
        ctx.bias_dtypes = [b.dtype for b in biases]
        # Quantized operands are engine objects kept on ctx; dense ones (format none) are
        # tensors saved through save_for_backward so in-place changes are detected.
        ctx.saved_q = [tuple(o if isinstance(o, _C.QuantizedTensor) else None for o in pair)
                       for pair in saved]
        ctx.save_for_backward(*(o if isinstance(o, torch.Tensor) else None
                                for pair in saved for o in pair))
        return y.reshape(*x.shape[:-1], y.shape[1])

    @staticmethod
    def backward(ctx, dy):
        call: GroupedCall = ctx.call
        n = len(call.splits)
        dense = ctx.saved_tensors
        out_features = call.roles.plan["out_features"]
        in_features = ctx.x_shape[-1]
        dy2 = dy.reshape(-1, out_features).contiguous()
        need_dgrad = call.need_dgrad and ctx.needs_input_grad[0]
        need_wgrad = [call.need_wgrad[i] and ctx.needs_input_grad[2 + i] for i in range(n)]
        dx = (torch.empty((dy2.shape[0], in_features), dtype=ctx.x_dtype, device=dy.device)
              if need_dgrad else None)
        usages = [backward_usage(need_dgrad, w) for w in need_wgrad]
        dy_ops = _grouped_operands(call.roles.grad_output, dy2, call, usages)
        dws: List[Optional[torch.Tensor]] = [None] * n
        dbs: List[Optional[torch.Tensor]] = [None] * len(ctx.bias_dtypes)
        for i, (r0, r1) in enumerate(call.row_ranges()):
            saved_x = ctx.saved_q[i][0] if ctx.saved_q[i][0] is not None else dense[2 * i]
            saved_w = ctx.saved_q[i][1] if ctx.saved_q[i][1] is not None else dense[2 * i + 1]
            _, dws[i] = linear_backward(
                dy2[r0:r1], saved_x, saved_w, call.roles, x_shape=(r1 - r0, in_features),
                x_dtype=ctx.x_dtype, w_dtype=ctx.w_dtypes[i], need_dgrad=need_dgrad,
                need_wgrad=need_wgrad[i],
                main_grad_weight=call.main_grad_weights[i] if need_wgrad[i] else None,
                dy_op=dy_ops[i], dx_into=dx[r0:r1] if dx is not None else None)
            if dbs and ctx.needs_input_grad[2 + n + i]:
                dbs[i] = dy2[r0:r1].float().sum(0).to(ctx.bias_dtypes[i])
        ctx.saved_q = None
        ctx.call = None
        dx = dx.reshape(ctx.x_shape) if dx is not None else None
        return (dx, None, *dws, *dbs)
