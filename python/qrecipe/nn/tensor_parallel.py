"""Quantized GEMMs of a qrecipe Linear whose weight is a DTensor (tensor / sequence
parallelism through ``qrecipe.parallel``'s plan styles and torch's ``parallelize_module``).

Each rank runs the engine on its local shards; DTensor's differentiable ``to_local`` /
``from_local`` carry the placements (and the collectives of the gradients):

    ColwiseParallel   W Shard(0), x Replicate      y Shard(-1)    dx Partial (summed by torch)
    ColwiseParallel   W Shard(0), x Shard(seq)     the local x is quantized, then its bytes and
                      (sequence parallelism)       scales all-gathered (never a BF16 gather);
                                                   dx is reduce-scattered back to Shard(seq)
    RowwiseParallel   W Shard(1), x Shard(-1)      y Partial (+ the Replicate bias), reduced by
                                                   the style's output redistribution

Scales: a per-tensor scale (float8 current scaling, NVFP4's global scale) of a sharded operand
comes from the amax of the whole tensor: every rank computes its shard's amax
(``Quantizer.compute_amax``), a max all-reduce over the TP group combines them, and the
shard is quantized with it (``quantize(amax=...)``), so each rank's bytes are the rows or
columns of the whole tensor's quantization. A block-scaled operand needs its shards to start
on block boundaries along the sharded dimension; otherwise it is a clear error, as are delayed
scaling (its amax history is per rank), weight caching across micro-batches, main_grad fusion
and torch.compile of a DTensor Linear (not supported yet).
"""
from __future__ import annotations

import weakref
from typing import Dict, FrozenSet, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from .._engine import QrecipeError
from ..quantization import COLUMNWISE, DIRECTIONS, ROWWISE, spec_has, usage_bits
from . import input_sharing
from .linear_function import quantized_linear
from .linear_gemms import (LinearRoles, gemm, keep_columnwise, linear_backward, operand)
from .saved_operands import pack_all, unpack_all

_ROLE_TYPES = ("input", "weight", "grad_output")


class GroupAmaxQuantizer:
    """A ``_C.Quantizer`` whose quantizations take the amax reduced (max) over `group`: what a
    shard of a tensor needs to get the whole tensor's per-tensor scale. Everything else is the
    wrapped quantizer's (the operands it makes name the wrapped one)."""

    def __init__(self, quantizer, group) -> None:
        self._q = quantizer
        self._group = group

    def quantize(self, tensor: torch.Tensor, usage: int, rng_offset=None):
        amax = torch.tensor(self._q.compute_amax(tensor), dtype=torch.float32,
                            device=tensor.device)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self._group)
        return self._q.quantize(tensor, usage, rng_offset=rng_offset,
                                amax=tuple(float(a) for a in amax.tolist()))

    def __getattr__(self, name):
        return getattr(self._q, name)


def _has_tensor_scale(quantizer) -> bool:
    return any(quantizer.layout(128, 128, d)["scale_mode"] in ("tensor", "block+tensor")
               for d in DIRECTIONS)


# module -> {(id(roles), reduced role types, group): (roles, roles reducing those amaxes)}
_TP_ROLES: "weakref.WeakKeyDictionary[torch.nn.Module, Dict[tuple, tuple]]" = \
    weakref.WeakKeyDictionary()


def tp_roles(module: torch.nn.Module, roles: LinearRoles, reduced: FrozenSet[str],
             group, out_local: int) -> LinearRoles:
    """`roles` with the quantizers of `reduced` role types (those whose operand is sharded)
    reducing their amax over `group` when their format has a per-tensor scale, for a shard
    with `out_local` output features."""
    cache = _TP_ROLES.setdefault(module, {})
    key = (id(roles), reduced, id(group), out_local)
    hit = cache.get(key)
    if hit is not None and hit[0] is roles:
        return hit[1]
    quantizers = {}
    for role in _ROLE_TYPES:
        q = getattr(roles, role)
        if q is not None and role in reduced and _has_tensor_scale(q):
            q = GroupAmaxQuantizer(q, group)
        quantizers[role] = q
    made = LinearRoles(plan={**roles.plan, "out_features": out_local}, **quantizers)
    cache[key] = (roles, made)  # keeps `roles` alive so its id is not reused
    return made


def _check_recipe(roles: LinearRoles, who: str) -> None:
    for role in _ROLE_TYPES:
        q = getattr(roles, role)
        if q is not None and spec_has(q.spec_dict(), "scaling", "delayed"):
            raise QrecipeError(
                f"{who}: tensor parallelism with delayed scaling ({role} role: "
                f"{q.describe()}) is not supported: each rank's amax history would scale its "
                "shard differently. Use a current-scaling or block-scaled recipe (default, "
                "blockwise, mxfp8, nvfp4) for the parallelized layers")


def _check_blocks(quantizer, role: str, rows: int, cols: int, dim: int, tp: int,
                  who: str) -> None:
    """A shard [rows, cols] of a tensor split along `dim` over `tp` ranks is quantized as
    that part of the whole tensor only when the shards meet on block boundaries."""
    if quantizer is None or tp == 1:
        return
    for d in DIRECTIONS:
        layout = quantizer.layout(rows, cols, d)
        extent = layout["block"][dim]
        local = (rows, cols)[dim]
        if extent > 1 and local % extent:
            raise QrecipeError(
                f"{who}: the {role} shard is [{rows}, {cols}] on each rank, split along "
                f"{('rows', 'columns')[dim]}, but its {d} quantization "
                f"({quantizer.describe()}) uses blocks of {layout['block'][0]}x"
                f"{layout['block'][1]}: a shard must hold whole blocks ({local} is not a "
                f"multiple of {extent}). Choose a tensor-parallel size or widths that divide "
                "into whole blocks, or a per-tensor recipe for this layer")


def _waited(t):
    """The engine reads a tensor's memory: an async collective's result is waited for first
    (torch's styles redistribute with async_op=True)."""
    return t.wait() if isinstance(t, AsyncCollectiveTensor) else t


class _WaitGrad(torch.autograd.Function):
    """Identity whose backward waits for an async collective's gradient (the redistribution
    of the output's gradient) before qrecipe's backward GEMMs read it."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        return _waited(dy)


def _local_input(x: DTensor, **kw) -> torch.Tensor:
    return _waited(x.to_local(**kw))


def _placement(t) -> Optional[object]:
    return t.placements[0] if isinstance(t, DTensor) else None


def linear(module, x, weight, bias, roles: LinearRoles, *, who: str,
           is_first_microbatch=None, fuse_wgrad_accumulation: bool = False,
           weight_operand=None) -> DTensor:
    """``y = x W^T + b`` of a qrecipe Linear whose weight (and input) are DTensors."""
    if torch.compiler.is_compiling():
        raise NotImplementedError(
            f"{who}: torch.compile of a tensor-parallel qrecipe Linear (DTensor weight) is not "
            "supported yet; compile the model without parallelize_module, or run it eagerly")
    if is_first_microbatch is not None or fuse_wgrad_accumulation or weight_operand is not None:
        raise NotImplementedError(
            f"{who}: is_first_microbatch, fuse_wgrad_accumulation and stored quantized weights "
            "are not supported with tensor parallelism yet; call the module without them")
    if not isinstance(weight, DTensor) or not isinstance(x, DTensor):
        raise NotImplementedError(
            f"{who}: its {'input' if isinstance(weight, DTensor) else 'weight'} is a plain "
            "tensor while the other is a DTensor: parallelize the module with "
            "qrecipe.parallel.ColwiseParallel or RowwiseParallel, which make both DTensors")
    mesh = weight.device_mesh
    if mesh.ndim != 1 or x.device_mesh != mesh:
        raise NotImplementedError(
            f"{who}: tensor parallelism runs on a 1-D device mesh shared by input and weight; "
            f"got weight mesh {weight.device_mesh}, input mesh {x.device_mesh}")
    _check_recipe(roles, who)
    wp, xp, tp = _placement(weight), _placement(x), mesh.size()
    group = mesh.get_group()
    w_local = _waited(weight.to_local())
    out_l, in_f = w_local.shape
    last = x.dim() - 1
    if wp == Shard(0) and (xp == Replicate() or (isinstance(xp, Shard) and xp.dim not in
                                                   (last, -1))):
        # Column parallel: local output features. The sharded operands are the weight (rows)
        # and the output gradient (columns).
        _check_blocks(roles.weight, "weight", out_l, in_f, 0, tp, who)
        tokens = x.numel() // in_f  # dy has every token (x's global shape)
        _check_blocks(roles.grad_output, "grad_output", max(tokens, 1), out_l, 1, tp, who)
        b_local = bias.to_local() if isinstance(bias, DTensor) else bias
        if xp == Replicate():
            r = tp_roles(module, roles, frozenset({"weight", "grad_output"}), group,
                         out_l)
            y = quantized_linear(_local_input(x, grad_placements=[Partial()]), w_local,
                                 b_local, r, who=who)
        else:
            r = tp_roles(module, roles, frozenset(_ROLE_TYPES), group, out_l)
            # q / k / v (gate / up) read the same sharded input: one quantized gather.
            y = GatheredColwise.apply(_local_input(x), w_local, b_local, r, mesh, xp.dim, who,
                                      _Source(x._local_tensor))
        return DTensor.from_local(_WaitGrad.apply(y), mesh, [Shard(y.dim() - 1)],
                                  run_check=False)
    if wp == Shard(1) and isinstance(xp, Shard) and xp.dim in (last, -1):
        # Row parallel: partial sums of the output. The sharded operands are the input and the
        # weight (columns); the output gradient is replicated.
        x_local = _local_input(x)
        tokens = x_local.numel() // in_f
        _check_blocks(roles.input, "input", max(tokens, 1), in_f, 1, tp, who)
        _check_blocks(roles.weight, "weight", out_l, in_f, 1, tp, who)
        r = tp_roles(module, roles, frozenset({"input", "weight"}), group, out_l)
        y = quantized_linear(x_local, w_local, None, r, who=who)
        y = DTensor.from_local(_WaitGrad.apply(y), mesh, [Partial()], run_check=False)
        return y if bias is None else y + bias
    raise NotImplementedError(
        f"{who}: weight placement {wp} with input placement {xp} (over {tp} ranks) is not a "
        "supported tensor-parallel layout: qrecipe runs Shard(0) weights with Replicate or "
        "sequence-sharded inputs (ColwiseParallel) and Shard(1) weights with inputs sharded on "
        "the last dimension (RowwiseParallel)")


# ---------------------------------------------------------------- quantized all-gather

def _token_axis(local_shape: Sequence[int], full_shape: Sequence[int], tp: int) -> Optional[int]:
    """The axis of a buffer along which the whole tensor's buffer is the ranks' buffers one
    after the other, or None when the layout does not split so (padding, swizzled tiles)."""
    axes = [a for a in range(len(local_shape))
            if full_shape[a] == tp * local_shape[a] and
            all(full_shape[b] == local_shape[b] for b in range(len(local_shape)) if b != a)]
    return axes[0] if len(axes) == 1 else None


def gather_operand(op, quantizer, rows: int, cols: int, group, tp: int, who: str):
    """The operand of the [tp * rows, cols] tensor whose rows rank r holds as rows
    [r * rows, (r + 1) * rows), from each rank's quantized rows `op`: its bytes and block
    scales all-gathered and put side by side (a per-tensor scale and amax are the same on
    every rank: the amax was reduced before quantizing). A clear error where a direction's
    layout does not split along rows (so the bytes would have to be re-quantized)."""
    if isinstance(op, torch.Tensor):  # a high-precision operand: gathered as it is
        parts = [torch.empty_like(op) for _ in range(tp)]
        dist.all_gather(parts, op.contiguous(), group=group)
        return torch.cat(parts, 0)
    held = [d for d in DIRECTIONS if op.has(d)]
    buffers: Dict[str, Dict[str, torch.Tensor]] = {}
    for d in held:
        local, full = quantizer.layout(rows, cols, d), quantizer.layout(tp * rows, cols, d)
        buffers[d] = {}
        for kind in ("data", "scale_inv", "amax"):
            t = getattr(op, kind)(d)
            if t is None:
                continue
            if kind == "amax" or (kind == "scale_inv" and local["scale_mode"] == "tensor"):
                buffers[d][kind] = t  # the reduced amax's: the same on every rank
                continue
            shape_key = "data_shape" if kind == "data" else "scale_shape"
            axis = _token_axis(local[shape_key], full[shape_key], tp)
            if axis is None or t.dim() != len(local[shape_key]):
                raise QrecipeError(
                    f"{who}: the sequence-parallel all-gather of the quantized input cannot "
                    f"join the ranks' {d} {kind} ({quantizer.describe()}): a shard of "
                    f"{rows} rows has {kind} shape {local[shape_key]}, the whole {tp * rows} "
                    f"rows {full[shape_key]}, which is not {tp} shards side by side (padded "
                    "or tiled). Use a sequence length per rank that fills whole tiles, or "
                    "input_layouts=Replicate() (a high-precision all-gather) for this layer")
            t = t.contiguous()
            as_bytes = t.view(torch.uint8)  # any 1-, 2- or 4-byte type through one path
            parts = [torch.empty_like(as_bytes) for _ in range(tp)]
            dist.all_gather(parts, as_bytes, group=group)
            buffers[d][kind] = torch.cat(parts, axis).view(t.dtype)
    return quantizer.from_tensors(tp * rows, cols, usage_bits(held), buffers,
                                  op.data(held[0]).device)


class _Source:
    """The tensor whose identity says 'the same input' to input sharing (a DTensor's local
    tensor: ``to_local`` makes a new view at every call), passed through autograd's apply as
    a plain object."""
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class GatheredColwise(torch.autograd.Function):
    """A column-parallel Linear whose input arrives sharded along the sequence: each rank
    quantizes its rows (amax reduced over the group), the quantized rows are all-gathered
    (``gather_operand``), and the GEMMs run on the whole sequence. Linears reading the same
    input under the same stateless spec take the first one's gathered operand
    (input_sharing.py). Backward: dgrad gives each rank a partial sum of the whole input
    gradient, reduce-scattered back to its rows."""

    @staticmethod
    def forward(ctx, x_local, w_local, b_local, roles: LinearRoles, mesh, seq_dim: int,
                who: str, source: _Source):
        tp, group = mesh.size(), mesh.get_group()
        seq_dim = seq_dim % x_local.dim()
        if any(x_local.shape[i] != 1 for i in range(seq_dim)):
            raise NotImplementedError(
                f"{who}: a sequence-parallel input of local shape {tuple(x_local.shape)} is "
                f"sharded along dim {seq_dim} with larger dims before it: gathering rows of "
                "the flattened input would interleave them. Use batch size 1 or a "
                "sequence-first layout ([seq, batch, hidden]) with Shard(0)")
        out_l, in_f = w_local.shape
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        x2 = x_local.reshape(-1, in_f).contiguous()
        rows = x2.shape[0]
        usage = ROWWISE | (COLUMNWISE if need_wgrad else 0)

        def gathered(q, t, u):
            return gather_operand(operand(q, t, u), q, rows, in_f, group, tp, who)

        key = roles.plan.get("input_share")
        if key is not None:
            x_op = input_sharing.operand(source.tensor, x2, roles.input,
                                         ("gathered", key, id(group)), usage, gathered)
        else:
            x_op = gathered(roles.input, x2, usage)
        w_op = operand(roles.weight, w_local, ROWWISE | (COLUMNWISE if need_dgrad else 0))
        y = gemm("fprop", x_op, "rowwise", w_op, "rowwise", tp * rows, out_l, x_local,
                 x_local.dtype, b_local)
        full_shape = list(x_local.shape)
        full_shape[seq_dim] *= tp
        ctx.mesh, ctx.seq_dim, ctx.roles = mesh, seq_dim, roles
        ctx.full_shape, ctx.x_dtype, ctx.w_dtype = full_shape, x_local.dtype, w_local.dtype
        ctx.bias_dtype = None if b_local is None else b_local.dtype
        saved_x = None
        if need_wgrad:  # a shared operand keeps its rowwise copy for the next Linear
            saved_x = input_sharing.columnwise_view(x_op) if key is not None else \
                keep_columnwise(x_op)
        tensors, ctx.packed = pack_all((saved_x, keep_columnwise(w_op) if need_dgrad else None))
        ctx.save_for_backward(*tensors)
        return y.reshape(*full_shape[:-1], out_l)

    @staticmethod
    def backward(ctx, dy):
        saved_x, saved_w = unpack_all(ctx.saved_tensors, ctx.packed)
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        out_l = dy.shape[-1]
        dy2 = dy.reshape(-1, out_l).contiguous()
        dx, dw = linear_backward(dy2, saved_x, saved_w, ctx.roles, x_shape=ctx.full_shape,
                                 x_dtype=ctx.x_dtype, w_dtype=ctx.w_dtype,
                                 need_dgrad=need_dgrad, need_wgrad=need_wgrad)
        if dx is not None:  # partial sums of the whole input gradient -> this rank's rows
            dx = DTensor.from_local(dx.reshape(ctx.full_shape), ctx.mesh, [Partial()],
                                    run_check=False).redistribute(
                ctx.mesh, [Shard(ctx.seq_dim)]).to_local()
            dx = _waited(dx)
        db = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None
