"""GroupedLinear's autograd: all experts' GEMMs as ONE autograd node, so the experts' inputs
(forward) and output gradients (backward) are each quantized by one grouped engine call, and
each GEMM kind (fprop, dgrad, wgrad) of all experts is one grouped engine GEMM
(``_C.gemm_grouped``: one kernel launch on a GPU with the grouped kernels, docs/gemm.md
"Grouped GEMMs"; one GEMM per expert otherwise, or where the plan says so).

The splits come in two forms:

- host sizes (a list): every expert's rows are known, its tensors are quantized as tensors of
  their own by one grouped call (``_C.quantize_grouped``) and passed to the GEMMs per expert;
- a tensor (``TensorSplits``: the sizes and their running sums, on the tensor's device): the
  inputs and gradients are quantized by one device-split call
  (``_C.quantize_grouped_split``) whose groups only the device knows, and the GEMMs read them
  split, so a forward and backward never wait for the GPU to read the sizes. On the CPU the
  engine reads the offsets and runs the same numbers as the list path.

Numerics are those of ``num_gemms`` separate ``qrecipe.nn.Linear`` layers sharing the roles:
a grouped quantization gives every group the bytes and scales of quantizing its rows alone,
with the shared quantizer's state advanced as by one call per group in expert order (a
stochastic-rounding role gives expert ``i`` the ``i``-th offset of the call; a delayed-scaling
role records every group's amax). On the CPU every grouped GEMM is the per-expert reference,
bit for bit; on a GPU the grouped kernels accumulate within the documented FP32 bound of the
per-expert GEMMs. Large native experts without grouped kernels run their backward expert by
expert (``linear_backward``, dgrad beside wgrad on two streams).

Where a grouped quantization would change which directions an expert's tensor is quantized with
(the experts' weights disagree on ``requires_grad``), that tensor is quantized per expert
instead (host splits only: GroupedLinear reads tensor splits on the host for such calls).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch

from .._engine import _C
from ..quantization import COLUMNWISE, ROWWISE
from ..quantized_param import QuantizedWeight
from .linear_gemms import (LinearRoles, backward_usage, dense, engine_bias, gemm_destination,
                           gemm_output, gemm_result, keep_columnwise, linear_backward,
                           main_grad_of, observe_groups, operand, overlap_backward,
                           refuse_graph_capture, stored_dgrad_operand)
from .saved_operands import pack_all, unpack_all


def _quantize_rows(quantizer, tensor: torch.Tensor, group_rows: List[int], usage: int):
    """Every grouped quantization of the experts' inputs and output gradients by host sizes
    goes through here (tests count the calls): one QuantizedTensor per expert."""
    refuse_graph_capture(tensor, f"grouped quantization of role {quantizer.role}")
    quantized = _C.quantize_grouped(quantizer, tensor, group_rows, usage)
    observe_groups(quantizer, tensor, group_rows, quantized)
    return quantized


def _quantize_split(quantizer, tensor: torch.Tensor, splits: "TensorSplits", usage: int):
    """Every grouped quantization by tensor splits goes through here (tests count the calls):
    one QuantizedGroups for all experts. Never while telemetry is on: GroupedLinear then
    passes host sizes (telemetry observes each expert's rows)."""
    refuse_graph_capture(tensor, f"grouped quantization of role {quantizer.role}")
    return _C.quantize_grouped_split(quantizer, tensor, splits.offsets, usage)


def _gemm_grouped(a, direction_a: str, b, direction_b: str, out, kind: str,
                  offsets: Optional[torch.Tensor] = None, accumulate: bool = False,
                  bias=None) -> str:
    """Every grouped GEMM of GroupedLinear goes through here (tests count the calls)."""
    return _C.gemm_grouped(a, direction_a, b, direction_b, out, kind=kind, accumulate=accumulate,
                           offsets=offsets, bias=bias)


@dataclass
class TensorSplits:
    """``m_splits`` given as a tensor: the sizes and their running sums ``offsets`` ([G + 1]
    int64, offsets[0] = 0) on the tensor's device, never read on the host for a GPU tensor."""
    sizes: torch.Tensor
    offsets: torch.Tensor

    @staticmethod
    def of(sizes: torch.Tensor) -> "TensorSplits":
        sizes = sizes.to(torch.int64)
        offsets = torch.zeros(sizes.numel() + 1, dtype=torch.int64, device=sizes.device)
        torch.cumsum(sizes, 0, out=offsets[1:])
        return TensorSplits(sizes, offsets)


@dataclass
class GroupedCall:
    """One GroupedLinear call: the experts' rows, roles and per-expert weight operands.

    splits: host sizes, or TensorSplits. weight_ops[i]: expert i's weight already quantized
    (grouped, cached or stored) or None (format none: the dense weight is used). need_wgrad[i]:
    expert i's weight needs a gradient. main_grad_weights[i]: the tensor whose ``.main_grad``
    expert i's wgrad accumulates into (fuse_wgrad_accumulation), else None. trim_weight_ops:
    the operands were made for this call alone, so their rowwise copies are dropped after
    fprop."""
    splits: Union[List[int], TensorSplits]
    roles: LinearRoles
    weight_ops: List[object]
    need_dgrad: bool
    need_wgrad: List[bool]
    main_grad_weights: List[Optional[torch.Tensor]]
    trim_weight_ops: bool

    @property
    def split_on_device(self) -> bool:
        return isinstance(self.splits, TensorSplits)

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


def _direct_output(rows: int, cols: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [rows, cols] output the engine writes itself: `dtype` when it is FP32 or BF16, else
    FP32 (converted by the caller)."""
    return gemm_output(rows, cols, like, dtype)


def _weight_operands(call: GroupedCall, weights: Sequence[torch.Tensor], usage: int) -> list:
    return [op if op is not None else operand(call.roles.weight, w.contiguous(), usage)
            for op, w in zip(call.weight_ops, weights)]


def _keep_weight_ops(call: GroupedCall, w_ops: list, need_dgrad: bool) -> list:
    """What backward keeps of the experts' weight operands (and the trim after fprop)."""
    saved = []
    for given, op in zip(call.weight_ops, w_ops):
        if call.trim_weight_ops and given is not None and given.has("rowwise") and \
                given.has("columnwise"):
            given.drop("rowwise")  # fprop is done; dgrad reads the columnwise copy
        if not need_dgrad:
            saved.append(None)
        else:  # a weight operand given by the caller is kept as it is
            saved.append(op if given is not None else keep_columnwise(op))
    return saved


def grouped_forward(x: torch.Tensor, call: GroupedCall, weights: Sequence[torch.Tensor],
                    biases: Sequence[Optional[torch.Tensor]], saving: bool):
    """y [tokens, out] of every expert; returns (y, saved_x, saved_w): saved_x is one split
    operand of all experts (tensor splits) or one operand per expert, saved_w one per expert
    (None where not `saving`)."""
    if call.split_on_device:
        return _split_forward(x, call, weights, saving)
    in_features, out_features = weights[0].shape[1], weights[0].shape[0]
    x2 = x.reshape(-1, in_features).contiguous()
    y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
    usages = [ROWWISE | (COLUMNWISE if (saving and w) else 0) for w in call.need_wgrad]
    x_ops = _grouped_operands(call.roles.input, x2, call, usages)
    need_dgrad = saving and call.need_dgrad
    rows = list(call.row_ranges())
    x_ops = [op if op is not None else operand(call.roles.input, x2[r0:r1], usage)
             for op, (r0, r1), usage in zip(x_ops, rows, usages)]
    w_ops = _weight_operands(call, weights, ROWWISE | (COLUMNWISE if need_dgrad else 0))
    outs = [gemm_destination(r1 - r0, out_features, x, x.dtype, y[r0:r1]) for r0, r1 in rows]
    engine_biases = [engine_bias(b) for b in biases]
    _gemm_grouped(x_ops, "rowwise", w_ops, "rowwise", outs, "fprop",
                  bias=engine_biases if any(b is not None for b in engine_biases) else None)
    for out, (r0, r1) in zip(outs, rows):
        gemm_result(out, x.dtype, y[r0:r1])
    saved_x = [keep_columnwise(op) if saving and call.need_wgrad[i] else None
               for i, op in enumerate(x_ops)]
    return y, saved_x, _keep_weight_ops(call, w_ops, need_dgrad)


def _split_forward(x: torch.Tensor, call: GroupedCall, weights: Sequence[torch.Tensor],
                   saving: bool):
    """grouped_forward with tensor splits: the inputs quantized by one device-split call, one
    grouped fprop into y, the split operand kept (columnwise) for wgrad."""
    in_features, out_features = weights[0].shape[1], weights[0].shape[0]
    x2 = x.reshape(-1, in_features).contiguous()
    offsets = call.splits.offsets
    need_wgrad = saving and any(call.need_wgrad)
    usage = ROWWISE | (COLUMNWISE if need_wgrad else 0)
    x_op = (_quantize_split(call.roles.input, x2, call.splits, usage)
            if call.roles.input is not None else dense(x2))
    need_dgrad = saving and call.need_dgrad
    w_ops = _weight_operands(call, weights, ROWWISE | (COLUMNWISE if need_dgrad else 0))
    y = _direct_output(x2.shape[0], out_features, x, x.dtype)
    _gemm_grouped(x_op, "rowwise", w_ops, "rowwise", y, "fprop", offsets=offsets)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    saved_x = None
    if need_wgrad:
        saved_x = x_op
        if isinstance(x_op, _C.QuantizedGroups) and x_op.has("rowwise"):
            x_op.drop("rowwise")  # wgrad reads the columnwise copy
    return y, saved_x, _keep_weight_ops(call, w_ops, need_dgrad)


def _batched_wgrad(dy2, dy_ops, saved_x, need_wgrad, main_grads, w_dtypes, out_features,
                   in_features, offsets=None) -> List[Optional[torch.Tensor]]:
    """Every expert's weight gradient dW_i = dy_i^T x_i in one grouped GEMM: into a new
    [out, in] tensor each, or accumulated into main_grad (FP32, the weight then gets no
    gradient, as in linear_backward). Host splits: the experts that need one; tensor splits
    (every expert needs one then): dy_ops and saved_x are the split operands."""
    experts = [i for i, need in enumerate(need_wgrad) if need]
    dws: List[Optional[torch.Tensor]] = [None] * len(need_wgrad)
    if not experts:
        return dws
    accumulate = main_grads[experts[0]] is not None  # fuse_wgrad_accumulation: all or none
    outs = [main_grad_of(main_grads[i], out_features, in_features, dy2.device) if accumulate
            else gemm_output(out_features, in_features, dy2, w_dtypes[i]) for i in experts]
    if offsets is None:
        _gemm_grouped([dy_ops[i] for i in experts], "columnwise", [saved_x[i] for i in experts],
                      "columnwise", outs, "wgrad", accumulate=accumulate)
    else:
        _gemm_grouped(dy_ops, "columnwise", saved_x, "columnwise", outs, "wgrad",
                      offsets=offsets, accumulate=accumulate)
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
        n = len(call.weight_ops)
        weights, biases = params[:n], params[n:]
        y, saved_x, saved_w = grouped_forward(x, call, weights, biases or [None] * n,
                                              saving=True)
        ctx.call = call
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.w_dtypes = [w.dtype for w in weights]
        ctx.bias_dtypes = [b.dtype for b in biases]
        # As LinearFunction: every operand of this call through save_for_backward as plain
        # tensors (saved_operands.py), so saved-tensor hooks see them; weight operands that
        # belong to the weight (cached across micro-batches, stored quantized) stay on ctx. A
        # grouped quantization made for this call alone (trim_weight_ops) is this call's.
        weights_own = [op is not None and not call.trim_weight_ops for op in call.weight_ops]
        ctx.given_w = [w if weights_own[i] else None for i, w in enumerate(saved_w)]
        xs = saved_x if isinstance(saved_x, list) else [saved_x]
        # Tensor splits: the inputs' split operand (_C.QuantizedGroups) cannot go through
        # pack_all (no binding hands out its buffers or rebuilds one over the tensors a hook
        # returns; on a GPU only the device knows its groups' sizes), so it stays on ctx:
        # saved-tensor hooks do not see it and save_on_cpu leaves its bytes on the device
        # (docs/adapter.md, "CPU offload"; test_grouped_linear.py shows it). The results are
        # the same, only that operand is not offloaded. Format none saves x as a tensor,
        # which is packed.
        ctx.split_x = xs[0] if isinstance(xs[0], _C.QuantizedGroups) else None
        if ctx.split_x is not None:
            xs = [None]
        ctx.x_count = len(xs)
        tensors, ctx.packed = pack_all(
            xs + [None if weights_own[i] else w for i, w in enumerate(saved_w)])
        ctx.save_for_backward(*tensors)
        # QuantizedWeight experts: dgrad reads their bytes when backward runs (FSDP2 may have
        # gathered them again into new memory by then), as LinearFunction does.
        ctx.stored_weights = [w if isinstance(w, QuantizedWeight) else None for w in weights]
        return y.reshape(*x.shape[:-1], y.shape[1])

    @staticmethod
    def backward(ctx, dy):
        call: GroupedCall = ctx.call
        refuse_graph_capture(dy, "backward", call.roles.plan.get("name", ""))
        n = len(call.weight_ops)
        ops = unpack_all(ctx.saved_tensors, ctx.packed)  # the x operands, then each W operand
        saved_x = [ctx.split_x] if ctx.split_x is not None else ops[:ctx.x_count]
        saved_w = [given if given is not None else op
                   for given, op in zip(ctx.given_w, ops[ctx.x_count:])]
        out_features = call.roles.plan["out_features"]
        in_features = ctx.x_shape[-1]
        dy2 = dy.reshape(-1, out_features).contiguous()
        need_dgrad = call.need_dgrad and ctx.needs_input_grad[0]
        need_wgrad = [call.need_wgrad[i] and ctx.needs_input_grad[2 + i] for i in range(n)]
        if need_dgrad:
            saved_w = [stored_dgrad_operand(w, "qrecipe.nn.GroupedLinear") if w is not None
                       else op for w, op in zip(ctx.stored_weights, saved_w)]
        main_grads = [call.main_grad_weights[i] if need_wgrad[i] else None for i in range(n)]
        if call.split_on_device:
            dx, dws = _split_backward(dy2, saved_x[0], saved_w, call, need_dgrad, need_wgrad,
                                      main_grads, ctx, in_features, out_features)
            dbs: List[Optional[torch.Tensor]] = [None] * len(ctx.bias_dtypes)  # no bias here
        else:
            dx, dws, dbs = _list_backward(dy2, saved_x, saved_w, call, need_dgrad, need_wgrad,
                                          main_grads, ctx, in_features, out_features)
        ctx.given_w = None
        ctx.stored_weights = None
        ctx.split_x = None
        ctx.call = None
        dx = dx.reshape(ctx.x_shape) if dx is not None else None
        return (dx, None, *dws, *dbs)


def _split_backward(dy2, saved_x, saved_w, call: GroupedCall, need_dgrad, need_wgrad, main_grads,
                    ctx, in_features, out_features):
    """Backward with tensor splits: the gradients quantized by one device-split call, one
    grouped dgrad into dx, one grouped wgrad (every expert needs one: GroupedLinear reads the
    splits on the host otherwise)."""
    offsets = call.splits.offsets
    usage = backward_usage(need_dgrad, any(need_wgrad))
    dy_op = None
    if usage:
        dy_op = (_quantize_split(call.roles.grad_output, dy2, call.splits, usage)
                 if call.roles.grad_output is not None else dense(dy2))
    dx = None
    if need_dgrad:
        dx = _direct_output(dy2.shape[0], in_features, dy2, ctx.x_dtype)
        _gemm_grouped(dy_op, "rowwise", saved_w, "columnwise", dx, "dgrad", offsets=offsets)
        if dx.dtype != ctx.x_dtype:
            dx = dx.to(ctx.x_dtype)
    dws = _batched_wgrad(dy2, dy_op, saved_x, need_wgrad, main_grads, ctx.w_dtypes,
                         out_features, in_features, offsets=offsets)
    return dx, dws


def _list_backward(dy2, saved_x, saved_w, call: GroupedCall, need_dgrad, need_wgrad, main_grads,
                   ctx, in_features, out_features):
    n = len(call.splits)
    dx = (torch.empty((dy2.shape[0], in_features), dtype=ctx.x_dtype, device=dy2.device)
          if need_dgrad else None)
    usages = [backward_usage(need_dgrad, w) for w in need_wgrad]
    dy_ops = _grouped_operands(call.roles.grad_output, dy2, call, usages)
    dws: List[Optional[torch.Tensor]] = [None] * n
    dbs: List[Optional[torch.Tensor]] = [None] * len(ctx.bias_dtypes)
    rows = list(call.row_ranges())
    # Large native experts without the grouped kernels run each expert's dgrad beside its
    # wgrad on two streams (linear_backward); everything else runs one grouped GEMM per kind.
    per_expert = not _C.grouped_kernels_built() and any(
        need_dgrad and need_wgrad[i] and overlap_backward(
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
            _gemm_grouped(dy_ops, "rowwise", saved_w, "columnwise", outs, "dgrad")
            for out, (r0, r1) in zip(outs, rows):
                gemm_result(out, ctx.x_dtype, dx[r0:r1])
        dws = _batched_wgrad(dy2, dy_ops, saved_x, need_wgrad, main_grads, ctx.w_dtypes,
                             out_features, in_features)
    for i, (r0, r1) in enumerate(rows):
        if dbs and ctx.needs_input_grad[2 + n + i]:
            dbs[i] = dy2[r0:r1].float().sum(0).to(ctx.bias_dtypes[i])
    return dx, dws, dbs
