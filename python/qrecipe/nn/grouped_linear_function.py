"""GroupedLinear's autograd: all experts' GEMMs as ONE autograd node, so the experts' inputs
(forward) and output gradients (backward) are each quantized by one grouped engine call
(``_C.quantize_grouped``: one launch on the GPU for formats with the plugin extra) instead of
one call per expert.

Numerics are those of ``num_gemms`` separate ``qrecipe.nn.Linear`` layers sharing the roles:
a grouped call gives every group the bytes and scales of quantizing its rows alone, with the
shared quantizer's state advanced as by one call per group in expert order (a
stochastic-rounding role gives expert ``i`` the ``i``-th offset of the call; a delayed-scaling
role records every group's amax). The experts' GEMMs are linear_gemms.py's, each kind issued
for all experts in one engine call (``_C.gemm_many``: small experts are bound by host time),
writing straight into rows of one output and one input gradient; large native experts run
their backward expert by expert (``linear_backward``, dgrad beside wgrad on two streams).

Where a grouped call would change which directions an expert's tensor is quantized with (the
experts' weights disagree on ``requires_grad``), that tensor is quantized per expert instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .._engine import _C
from ..quantization import COLUMNWISE, ROWWISE
from ..quantized_param import QuantizedWeight
from .linear_gemms import (LinearRoles, backward_usage, engine_bias, gemm_destination,
                           gemm_output, gemm_result, keep_columnwise, linear_backward,
                           main_grad_of, observe_groups, operand, overlap_backward,
                           refuse_graph_capture, stored_dgrad_operand)
from .saved_operands import pack_all, unpack_all


def _quantize_rows(quantizer, tensor: torch.Tensor, group_rows: List[int], usage: int):
    """Every grouped quantization of the experts' inputs and output gradients goes through
    here (tests count the calls): one QuantizedTensor per expert."""
    refuse_graph_capture(tensor, f"grouped quantization of role {quantizer.role}")
    quantized = _C.quantize_grouped(quantizer, tensor, group_rows, usage)
    observe_groups(quantizer, tensor, group_rows, quantized)
    return quantized


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
    wgrad, W operand for dgrad) of expert i (None, None when not `saving`).

    What linear_forward does for one layer, for every expert at once: the operands (inputs
    by one grouped call), then every fprop GEMM in one engine call (_C.gemm_many), writing
    into the rows of y, then what backward keeps."""
    in_features, out_features = weights[0].shape[1], weights[0].shape[0]
    x2 = x.reshape(-1, in_features).contiguous()
    y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
    usages = [ROWWISE | (COLUMNWISE if (saving and w) else 0) for w in call.need_wgrad]
    x_ops = _grouped_operands(call.roles.input, x2, call, usages)
    need_dgrad = saving and call.need_dgrad
    w_usage = ROWWISE | (COLUMNWISE if need_dgrad else 0)
    rows = list(call.row_ranges())
    x_ops = [op if op is not None else operand(call.roles.input, x2[r0:r1], usage)
             for op, (r0, r1), usage in zip(x_ops, rows, usages)]
    w_ops = [op if op is not None else operand(call.roles.weight, w.contiguous(), w_usage)
             for op, w in zip(call.weight_ops, weights)]
    outs = [gemm_destination(r1 - r0, out_features, x, x.dtype, y[r0:r1]) for r0, r1 in rows]
    engine_biases = [engine_bias(b) for b in biases]
    _C.gemm_many(x_ops, "rowwise", w_ops, "rowwise", outs, kind="fprop",
                 bias=engine_biases if any(b is not None for b in engine_biases) else None)
    saved = []
    for i, (r0, r1) in enumerate(rows):
        gemm_result(outs[i], x.dtype, y[r0:r1])
        given = call.weight_ops[i]
        if call.trim_weight_ops and given is not None and given.has("rowwise") and \
                given.has("columnwise"):
            given.drop("rowwise")  # fprop is done; dgrad reads the columnwise copy
        saved_x = keep_columnwise(x_ops[i]) if saving and call.need_wgrad[i] else None
        saved_w = None
        if need_dgrad:  # a weight operand given by the caller is kept as it is
            saved_w = w_ops[i] if given is not None else keep_columnwise(w_ops[i])
        saved.append((saved_x, saved_w))
    return y, saved


def _batched_wgrad(dy2, dy_ops, saved_x, need_wgrad, main_grads, w_dtypes, out_features,
                   in_features) -> List[Optional[torch.Tensor]]:
    """Every expert's weight gradient dW_i = dy_i^T x_i in one engine call (the experts that
    need one): into a new [out, in] tensor each, or accumulated into main_grad (FP32, the
    weight then gets no gradient, as in linear_backward)."""
    experts = [i for i, need in enumerate(need_wgrad) if need]
    dws: List[Optional[torch.Tensor]] = [None] * len(need_wgrad)
    if not experts:
        return dws
    accumulate = main_grads[experts[0]] is not None  # fuse_wgrad_accumulation: all or none
    outs = [main_grad_of(main_grads[i], out_features, in_features, dy2.device) if accumulate
            else gemm_output(out_features, in_features, dy2, w_dtypes[i]) for i in experts]
    _C.gemm_many([dy_ops[i] for i in experts], "columnwise", [saved_x[i] for i in experts],
                 "columnwise", outs, accumulate=accumulate, kind="wgrad")
    if not accumulate:
        for i, out in zip(experts, outs):
            dws[i] = out if out.dtype == w_dtypes[i] else out.to(w_dtypes[i])
    return dws


class GroupedLinearFunction(torch.autograd.Function):
    """``apply(x, call, *weights, *biases)``: every expert's ``x_i W_i^T + b_i``, rows of x
    in expert order (GroupedLinear only). `biases` is empty for a module without bias."""

    @staticmethod
    def forward(ctx, x, call: GroupedCall, *params):
        refuse_graph_capture(x, "forward", call.roles.plan.get("name", ""))
        n = len(call.splits)
        weights, biases = params[:n], params[n:]
        y, saved = grouped_forward(x, call, weights, biases or [None] * n, saving=True)
        ctx.call = call
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.w_dtypes = [w.dtype for w in weights]
        ctx.bias_dtypes = [b.dtype for b in biases]
        # As LinearFunction: every operand of this call through save_for_backward as plain
        # tensors (saved_operands.py), so saved-tensor hooks see them; weight operands that
        # belong to the weight (cached across micro-batches, stored quantized) stay on ctx. A
        # grouped quantization made for this call alone (trim_weight_ops) is this call's.
        weights_own = [op is not None and not call.trim_weight_ops for op in call.weight_ops]
        ctx.given_w = [w if weights_own[i] else None for i, (_, w) in enumerate(saved)]
        ops = [op for i, (x_op, w_op) in enumerate(saved)
               for op in (x_op, None if weights_own[i] else w_op)]
        tensors, ctx.packed = pack_all(ops)
        ctx.save_for_backward(*tensors)
        # QuantizedWeight experts: dgrad reads their bytes when backward runs (FSDP2 may have
        # gathered them again into new memory by then), as LinearFunction does.
        ctx.stored_weights = [w if isinstance(w, QuantizedWeight) else None for w in weights]
        return y.reshape(*x.shape[:-1], y.shape[1])

    @staticmethod
    def backward(ctx, dy):
        call: GroupedCall = ctx.call
        refuse_graph_capture(dy, "backward", call.roles.plan.get("name", ""))
        n = len(call.splits)
        dense = unpack_all(ctx.saved_tensors, ctx.packed)  # (x op, W op) of each expert
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
        rows = list(call.row_ranges())
        saved_x, saved_w = dense[0::2], [ctx.given_w[i] if ctx.given_w[i] is not None
                                         else op for i, op in enumerate(dense[1::2])]
        if need_dgrad:
            saved_w = [stored_dgrad_operand(w, "qrecipe.nn.GroupedLinear") if w is not None
                       else op for w, op in zip(ctx.stored_weights, saved_w)]
        main_grads = [call.main_grad_weights[i] if need_wgrad[i] else None for i in range(n)]
        # Large native experts run each expert's dgrad beside its wgrad on two streams
        # (linear_backward); small ones, whose host time dominates, run batched.
        per_expert = any(need_dgrad and need_wgrad[i] and overlap_backward(
            call.roles.plan, dy2, (r1 - r0) * in_features * out_features)
            for i, (r0, r1) in enumerate(rows))
        if per_expert:
            for i, (r0, r1) in enumerate(rows):
                _, dws[i] = linear_backward(
                    dy2[r0:r1], saved_x[i], saved_w[i], call.roles,
                    x_shape=(r1 - r0, in_features), x_dtype=ctx.x_dtype,
                    w_dtype=ctx.w_dtypes[i], need_dgrad=need_dgrad, need_wgrad=need_wgrad[i],
                    main_grad_weight=main_grads[i], dy_op=dy_ops[i],
                    dx_into=dx[r0:r1] if dx is not None else None)
        else:
            dy_ops = [op if op is not None or not usage
                      else operand(call.roles.grad_output, dy2[r0:r1], usage)
                      for op, usage, (r0, r1) in zip(dy_ops, usages, rows)]
            if need_dgrad:
                outs = [gemm_destination(r1 - r0, in_features, dy2, ctx.x_dtype, dx[r0:r1])
                        for r0, r1 in rows]
                _C.gemm_many(dy_ops, "rowwise", saved_w, "columnwise", outs, kind="dgrad")
                for out, (r0, r1) in zip(outs, rows):
                    gemm_result(out, ctx.x_dtype, dx[r0:r1])
            dws = _batched_wgrad(dy2, dy_ops, saved_x, need_wgrad, main_grads, ctx.w_dtypes,
                                 out_features, in_features)
        for i, (r0, r1) in enumerate(rows):
            if dbs and ctx.needs_input_grad[2 + n + i]:
                dbs[i] = dy2[r0:r1].float().sum(0).to(ctx.bias_dtypes[i])
        ctx.given_w = None
        ctx.stored_weights = None
        ctx.call = None
        dx = dx.reshape(ctx.x_shape) if dx is not None else None
        return (dx, None, *dws, *dbs)
