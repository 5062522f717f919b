"""The three GEMMs of a quantized linear layer ``y = x W^T + b`` (docs/gemm.md): the
operands, one engine GEMM into a torch tensor, and a layer's forward and backward GEMMs.

    fprop  y  = x  rowwise    . W  rowwise
    dgrad  dx = dy rowwise    . W  columnwise
    wgrad  dW = dy columnwise . x  columnwise

An operand whose role resolved to a quantizer is quantized with exactly the directions its
GEMMs need; one whose role is ``none`` stays in high precision (a dense engine operand).
For backward only the columnwise copies are kept (the rowwise ones were for fprop), so an
activation saved for wgrad costs its quantized size, as in TransformerEngine. The GEMMs
accumulate in FP32; the engine adds the bias in FP32 (a BF16 bias widened exactly) and rounds
once to the output dtype (BF16 or FP32 written directly, on the CUDA path without extra
passes; a native FP8 GEMM with a BF16 output and a BF16 bias adds it inside cuBLASLt's
epilogue). On CUDA, large native dgrad and wgrad GEMMs run side by side on two streams (same
bytes).

Who uses it: the eager autograd function and the dispatch (linear_function.py), the
torch.library operators (compile_ops.py) and GroupedLinear's autograd
(grouped_linear_function.py). It imports none of them. The weight operand of a call
(``weight_operand_of``) is a ``QuantizedWeight``'s stored bytes, the weight cache's entry
(``is_first_microbatch``, weight_cache.py) or the weight quantized now; wgrad accumulates into
``weight.main_grad`` (FP32, in the GEMM's epilogue) with ``main_grad_weight``.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .. import telemetry as _telemetry
from .._engine import _C
from ..quantization import COLUMNWISE, ROWWISE
from ..quantized_param import QuantizedWeight
from . import input_sharing, norm_amax
from .weight_cache import cached_weight_operand


# id(roles) -> LinearRoles: the integer handle by which the torch.library operators
# (compile_ops.py) name a module's roles, since engine quantizers cannot cross an operator
# boundary. Registered when the roles are made (outside the traced hot path: roles are cached),
# so a traced forward only takes ``id(roles)``, which dynamo folds into a constant. Weak: the
# module's role cache decides how long roles live.
_BY_HANDLE: "weakref.WeakValueDictionary[int, LinearRoles]" = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class LinearRoles:
    """The quantizers (``_C.Quantizer`` or None for high precision) of one linear layer under
    one recipe, plus how its GEMMs run (for ``explain``)."""
    input: Optional["_C.Quantizer"]
    weight: Optional["_C.Quantizer"]
    grad_output: Optional["_C.Quantizer"]
    plan: dict

    def __post_init__(self):
        _BY_HANDLE[id(self)] = self  # the handle the torch.library operators take

    @property
    def all_none(self) -> bool:
        return self.input is None and self.weight is None and self.grad_output is None


def roles_by_handle(handle: int) -> Optional[LinearRoles]:
    """The LinearRoles whose ``id`` is `handle`, or None once they are gone."""
    return _BY_HANDLE.get(handle)


def dense(t: torch.Tensor) -> torch.Tensor:
    """A high-precision engine operand: the engine reads FP32 and BF16."""
    return t if t.dtype in (torch.float32, torch.bfloat16) else t.float()


# CUDA graphs: the engine's quantizers read amaxes back to the host (per-tensor current
# scaling, NVFP4's tensor amax) and delayed scaling updates its scales through the host, so a
# captured graph would replay stale host values (and the stream capture fails at the first
# synchronisation with an error that names no qrecipe module). Capture is refused up front.
GRAPH_CAPTURE_REFUSED = (
    "{who}: the {step} ran during CUDA graph capture "
    "(torch.cuda.graph, torch.cuda.make_graphed_callables or torch.compile's "
    "mode='reduce-overhead'). qrecipe cannot be captured yet: its quantizers read amaxes back "
    "to the host and delayed scaling updates its scales through the host, which a replayed "
    "graph would not redo. Run the qrecipe modules eagerly: capture only the parts of the "
    "model outside them (make_graphed_callables on those submodules), or use torch.compile "
    "without mode='reduce-overhead'")


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (tests replace it)."""
    return torch.cuda.is_current_stream_capturing()


def refuse_graph_capture(like: torch.Tensor, step: str, name: str = "") -> None:
    """Raises GRAPH_CAPTURE_REFUSED when `like` is a CUDA tensor and the current stream is
    capturing: the forward, backward and every quantization of a module call this. `name`:
    the GEMM's role name, when known."""
    # Not while torch.compile traces (dynamo would have to trace the query; the operators'
    # own calls, which run when the compiled graph runs, check then).
    if like.is_cuda and not torch.compiler.is_compiling() and _capturing():
        who = f"qrecipe module {name!r}" if name else "qrecipe"
        raise RuntimeError(GRAPH_CAPTURE_REFUSED.format(who=who, step=step))


def _quantize(quantizer, tensor: torch.Tensor, usage: int,
              amax: Optional[torch.Tensor] = None, decoded: int = 0):
    """Every quantization of a linear layer's operands (here, in the operators of
    compile_ops.py and per expert in grouped_linear_function.py) goes through here (tests
    count the calls), and telemetry observes them here (only a flag test when it is off).
    `amax`: the tensor's amax already computed on the device (a fused norm's, norm_amax.py).
    `decoded`: the directions (of `usage`) whose GEMM runs emulated on this CUDA tensor
    (decoded_usage): the quantize kernel also writes their BF16 operand where the plugin can,
    so the GEMM does not decode the bytes again (docs/gemm.md, "Decoded operands")."""
    refuse_graph_capture(tensor, f"quantization of role {quantizer.role}")
    if amax is not None:
        quantized = quantizer.quantize(tensor, usage, amax=amax)
        norm_amax.stats["used"] += 1
    elif decoded and tensor.is_cuda:
        quantized = quantizer.quantize_decoded(tensor, usage, decoded)
    else:
        quantized = quantizer.quantize(tensor, usage)
    if _telemetry.state.on:
        _telemetry.observe(quantizer, tensor, quantized)
    return quantized


def observe_groups(quantizer, tensor: torch.Tensor, group_rows, quantized) -> None:
    """Telemetry of a grouped quantization (one QuantizedTensor per group of rows of
    `tensor`), when it is on."""
    if not _telemetry.state.on:
        return
    rows = tensor.reshape(-1, tensor.shape[-1])
    start = 0
    for n, q in zip(group_rows, quantized):
        _telemetry.observe(quantizer, rows[start:start + n], q)
        start += n


def operand(quantizer, tensor: torch.Tensor, usage: int, decoded: int = 0):
    """A GEMM operand: `tensor` quantized with `usage`, or dense when `quantizer` is None.
    `decoded`: as for _quantize."""
    if quantizer is None:
        return dense(tensor)
    if decoded and tensor.is_cuda:
        return _quantize(quantizer, tensor, usage, decoded=decoded)
    return _quantize(quantizer, tensor, usage)


def decoded_usage(plan: dict, **kinds: int) -> int:
    """The directions worth decoding in the quantize pass: for each GEMM kind given (``fprop=
    ROWWISE``: the direction of this operand that GEMM reads), when the GEMM is emulated on
    the GPU and reads the operand right away. Not for an operand saved for backward (its
    decoded copy would not survive saved_operands.py's packing, and would cost 2 bytes an
    element of activation memory), nor where nothing is emulated."""
    emulated = plan.get("emulated_on_gpu", frozenset())
    bits = 0
    for kind, direction in kinds.items():
        if kind in emulated:
            bits |= direction
    return bits


def keep_columnwise(op):
    """What backward keeps of a forward operand: its columnwise copy only."""
    if isinstance(op, _C.QuantizedTensor) and op.has("rowwise"):
        op.drop("rowwise")
    return op


def gemm_output(rows: int, cols: int, like: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
    """The [rows, cols] tensor a GEMM writes on `like`'s device: `out_dtype` where the engine
    writes it itself (FP32, BF16), else FP32 (converted by the caller)."""
    direct = out_dtype in (torch.float32, torch.bfloat16)
    return torch.empty((rows, cols), dtype=out_dtype if direct else torch.float32,
                       device=like.device)


def engine_bias(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bias as the engine takes it: FP32 or BF16 as it is (the engine widens BF16 exactly,
    and a native FP8 GEMM with a BF16 output then adds it in cuBLASLt's epilogue), other
    dtypes as FP32."""
    if bias is None:
        return None
    bias = bias.detach()
    return (bias if bias.dtype in (torch.float32, torch.bfloat16) else bias.float()).contiguous()


def gemm(kind: str, a, direction_a: str, b, direction_b: str, rows: int, cols: int,
         like: torch.Tensor, out_dtype: torch.dtype,
         bias: Optional[torch.Tensor] = None,
         into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One engine GEMM into a new [rows, cols] tensor on `like`'s device. The engine writes
    FP32 or BF16 itself (rounding the FP32 accumulator once, after the FP32 bias); other
    dtypes are written as FP32 and converted. `into`: a contiguous [rows, cols] tensor of
    `out_dtype` (rows of a larger output) that receives the result instead; returned. The
    GEMM writes it directly when it starts on a 16-byte boundary (what a fresh tensor gives
    cuBLASLt; rows of an odd width may not), else through a fresh tensor and a copy."""
    out = gemm_destination(rows, cols, like, out_dtype, into)
    _C.gemm(a, direction_a, b, direction_b, out, kind=kind, bias=engine_bias(bias))
    return gemm_result(out, out_dtype, into)


def gemm_destination(rows: int, cols: int, like: torch.Tensor, out_dtype: torch.dtype,
                     into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The tensor a GEMM of `gemm` writes: `into` itself when the engine can write it (FP32 or
    BF16, on a 16-byte boundary), else a fresh one (gemm_output)."""
    direct = out_dtype in (torch.float32, torch.bfloat16)
    if into is not None and direct and into.data_ptr() % 16 == 0:
        return into
    return gemm_output(rows, cols, like, out_dtype)


def gemm_result(out: torch.Tensor, out_dtype: torch.dtype,
                into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What `gemm` returns once the engine wrote `out` (gemm_destination's tensor)."""
    if into is not None and out is not into:
        return into.copy_(out)  # converts FP32 to `out_dtype` too
    return out if out.dtype == out_dtype else out.to(out_dtype)


# ---- dgrad beside wgrad on the GPU
# dgrad and wgrad read the same quantized dy and are independent, so on CUDA wgrad runs on a
# second stream of the device while dgrad runs on the current one: each GEMM's last partial
# wave of tiles leaves most SMs idle, and the other GEMM's tiles fill them. Measured on an
# H100 at 8192 tokens, 8192 -> 8192: the engine calls of a step alone took 3.7% less time
# under float8_e4m3, 1.4% under blockwise, 1.0% under float8_delayed; whole Linear steps
# 0.8% (float8_e4m3), 1.5% (default), 0.7% (blockwise), +1.1% (float8_delayed, within that
# run's noise). Only for native GEMMs big enough for that tail to outweigh the host time of
# two stream waits; everything else, and every CPU GEMM, runs in order on the current stream.
# The results are the same bytes either way: each GEMM is the same cuBLASLt call.
_OVERLAP_MIN_MACS = 1 << 32  # tokens * in * out of one GEMM (e.g. 1024 tokens, 2048 -> 2048)
_wgrad_streams: Dict[int, "torch.cuda.Stream"] = {}


def _wgrad_stream(device: torch.device) -> "torch.cuda.Stream":
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _wgrad_streams.get(index)
    if stream is None:
        stream = _wgrad_streams[index] = torch.cuda.Stream(device=index)
    return stream


def overlap_backward(plan: dict, dy: torch.Tensor, macs: int) -> bool:
    """Whether a backward's dgrad and wgrad (`macs` = tokens * in * out) run side by side.
    plan["native_on_gpu"]: the GEMMs whose operand pairing is native on the GPU (base.py)."""
    return (dy.is_cuda and macs >= _OVERLAP_MIN_MACS and
            {"dgrad", "wgrad"} <= plan.get("native_on_gpu", frozenset()))


def linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   roles: LinearRoles, need_dgrad: bool, need_wgrad: bool, weight_op=None,
                   share_input: bool = False):
    """Returns (y, saved) where saved = (x operand for wgrad, W operand for dgrad).

    `weight_op`: an already quantized weight operand holding the directions needed (a cached
    or a stored one); it is used as is and never trimmed. (GroupedLinear does the same for
    all its experts at once: grouped_linear_function.grouped_forward.) `share_input`: take
    x's quantization from the Linear that read the same x just before under the same
    stateless spec, or keep it for the next one (input_sharing.py; the eager path)."""
    refuse_graph_capture(x, "forward", roles.plan.get("name", ""))
    in_features = weight.shape[1]
    x2 = x.reshape(-1, in_features).contiguous()
    x_usage = ROWWISE | (COLUMNWISE if need_wgrad else 0)
    key = roles.plan.get("input_share") if share_input else None
    # A fused norm's output amax, when x is that output (norm_amax.py): same bytes, one pass less.
    amax = norm_amax.take(x, roles.input) if roles.input is not None else None
    if key is not None:
        x_op = input_sharing.operand(
            x, x2, roles.input, key, x_usage,
            _quantize if amax is None else lambda q, t, u: _quantize(q, t, u, amax))
    elif amax is not None:
        x_op = _quantize(roles.input, x2, x_usage, amax)
    else:
        x_op = operand(roles.input, x2, x_usage, decoded_usage(roles.plan, fprop=ROWWISE))
    if weight_op is not None:
        w_op = weight_op
    else:
        w_op = operand(roles.weight, weight.contiguous(),
                       ROWWISE | (COLUMNWISE if need_dgrad else 0),
                       decoded_usage(roles.plan, fprop=ROWWISE))
    y = gemm("fprop", x_op, "rowwise", w_op, "rowwise", x2.shape[0], weight.shape[0], x,
             x.dtype, bias)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    saved_x = None
    if need_wgrad:  # a shared operand keeps its rowwise copy for the next Linear
        saved_x = input_sharing.columnwise_view(x_op) if key is not None else \
            keep_columnwise(x_op)
    saved_w = None
    if need_dgrad:
        saved_w = w_op if weight_op is not None else keep_columnwise(w_op)
    return y, (saved_x, saved_w)


def backward_usage(need_dgrad: bool, need_wgrad: bool) -> int:
    """The directions of dy its backward GEMMs read: rowwise for dgrad, columnwise for wgrad."""
    return (ROWWISE if need_dgrad else 0) | (COLUMNWISE if need_wgrad else 0)


def linear_backward(dy2: torch.Tensor, saved_x, saved_w, roles: LinearRoles, *, x_shape,
                    x_dtype: torch.dtype, w_dtype: torch.dtype, need_dgrad: bool,
                    need_wgrad: bool, main_grad_weight: Optional[torch.Tensor] = None,
                    dy_op=None, dx_into: Optional[torch.Tensor] = None):
    """dgrad and wgrad of one linear layer from what its forward saved; returns (dx, dw).

    `dy2`: the [tokens, out] contiguous output gradient. dx has `x_shape` (written into
    `dx_into`, rows of a larger input gradient, when given); dw is in `w_dtype`, or None when
    wgrad accumulates into ``main_grad_weight.main_grad`` (FP32, in the GEMM's epilogue; no
    .grad, as TE). `dy_op`: dy already quantized by the caller with the directions needed
    (GroupedLinear's grouped quantization)."""
    refuse_graph_capture(dy2, "backward", roles.plan.get("name", ""))
    dx = dw = None
    usage = backward_usage(need_dgrad, need_wgrad)
    if not usage:
        return dx, dw
    tokens, out_features = dy2.shape
    in_features = x_shape[-1]
    if dy_op is None:
        dy_op = operand(roles.grad_output, dy2, usage,
                        decoded_usage(roles.plan, dgrad=ROWWISE if need_dgrad else 0,
                                      wgrad=COLUMNWISE if need_wgrad else 0))
    wgrad_out = None
    if need_wgrad:
        # Either output is made here, on the current stream.
        wgrad_out = main_grad_of(main_grad_weight, out_features, in_features, dy2.device) \
            if main_grad_weight is not None else \
            gemm_output(out_features, in_features, dy2, w_dtype)

    def wgrad():
        _C.gemm(dy_op, "columnwise", saved_x, "columnwise", wgrad_out,
                accumulate=main_grad_weight is not None, kind="wgrad")

    def dgrad():
        dx = gemm("dgrad", dy_op, "rowwise", saved_w, "columnwise", tokens, in_features,
                  dy2, x_dtype, into=dx_into)
        return dx if dx_into is not None else dx.reshape(x_shape)

    if need_dgrad and need_wgrad and overlap_backward(
            roles.plan, dy2, tokens * in_features * out_features):
        current = torch.cuda.current_stream(dy2.device)
        side = _wgrad_stream(dy2.device)
        side.wait_stream(current)  # dy_op, saved_x and wgrad_out are ready there
        with torch.cuda.stream(side):
            wgrad()
        dx = dgrad()
        # Everything later on the current stream (using dw, freeing dy_op, saved_x or
        # wgrad_out, whose memory belongs to it) comes after wgrad.
        current.wait_stream(side)
    else:
        if need_dgrad:
            dx = dgrad()
        if need_wgrad:
            wgrad()
    if need_wgrad and main_grad_weight is None:
        dw = wgrad_out if wgrad_out.dtype == w_dtype else wgrad_out.to(w_dtype)
    return dx, dw


def main_grad_of(weight: torch.Tensor, rows: int, cols: int, device: torch.device):
    """weight.main_grad, checked: the FP32 buffer wgrad accumulates into."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise RuntimeError(
            "fuse_wgrad_accumulation=True but the weight has no .main_grad; allocate it before "
            "the first backward: weight.main_grad = torch.zeros_like(weight, "
            "dtype=torch.float32)")
    if not isinstance(main_grad, torch.Tensor) or main_grad.dtype != torch.float32 or \
            tuple(main_grad.shape) != (rows, cols) or not main_grad.is_contiguous() or \
            main_grad.device != device:
        what = (f"{main_grad.dtype} of shape {tuple(main_grad.shape)} on {main_grad.device}"
                f"{'' if main_grad.is_contiguous() else ' (not contiguous)'}"
                if isinstance(main_grad, torch.Tensor) else type(main_grad).__name__)
        raise RuntimeError(
            f"weight.main_grad must be a contiguous torch.float32 tensor of shape "
            f"{(rows, cols)} on {device}, got {what}")
    return main_grad


def _stored_weight_operand(weight: "QuantizedWeight", who: str):
    """The bytes a QuantizedWeight holds, used as they are (quantized_model_init) for fprop.
    They were made by the quantizer the recipe gave the weight's role at creation; the GEMM
    reads them with that quantizer whatever the active recipe says for the role. dgrad's
    columnwise copy is taken when backward runs (stored_dgrad_operand)."""
    stored = weight.engine_tensor
    if not stored.has("rowwise"):
        raise RuntimeError(f"{who}: its QuantizedWeight holds {stored.usage} data only but "
                           "fprop needs rowwise; create it with both directions "
                           "(quantized_model_init does)")
    return stored


def stored_dgrad_operand(weight: "QuantizedWeight", who: str):
    """The columnwise bytes a QuantizedWeight holds *now*, for dgrad: read when backward runs,
    not kept from the forward, because the weight's bytes may have moved in between (FSDP2
    frees a parameter after the forward and gathers it again, into new memory, for the
    backward)."""
    stored = weight.engine_tensor
    if not stored.has("columnwise"):
        raise RuntimeError(f"{who}: its QuantizedWeight holds {stored.usage} data only but "
                           "dgrad needs columnwise; create it with both directions "
                           "(quantized_model_init does)")
    return stored


def weight_operand_of(weight: torch.Tensor, roles: LinearRoles, need_dgrad: bool,
                      is_first_microbatch: Optional[bool], who: str,
                      weight_group: Optional[Tuple[torch.Tensor, int]] = None,
                      scaling_generation: int = 0):
    """The quantized weight operand of one GEMM call, or None when the weight stays in high
    precision (format none): a QuantizedWeight's stored bytes, else the weight quantized now
    or taken from the weight cache (`is_first_microbatch`, weight_cache.py; an entry made
    under another `scaling_generation` of the recipe, see Recipe, is stale)."""
    if isinstance(weight, QuantizedWeight):
        return _stored_weight_operand(weight, who)
    if roles.weight is None:
        return None
    return cached_weight_operand(
        weight, roles.weight, ROWWISE | (COLUMNWISE if need_dgrad else 0),
        is_first_microbatch, lambda q, t, u: _quantize(q, t, u), who, scaling_generation,
        weight_group)
