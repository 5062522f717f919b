"""Quantized parameters: ``qrecipe.QuantizedWeight`` and ``qrecipe.quantized_model_init``
(DESIGN.md section 8).

    with qrecipe.quantized_model_init(recipe):
        layer = qrecipe.nn.Linear(1024, 1024)     # layer.weight is a QuantizedWeight
    layer.weight.rowwise_data, layer.weight.dequantize()

A ``QuantizedWeight`` is a ``torch.Tensor`` wrapper subclass: to torch it is a tensor of the
original shape and dtype (so it can be an ``nn.Parameter``), but it stores only the engine's
quantized tensor (bytes and scales per direction, both directions) and the quantizer that
made it. qrecipe's GEMMs read those bytes directly, with no re-quantization. A grouped one
(GroupedLinear's single parameter) holds one quantized tensor per row group (expert), each
with its own scales; ``split_groups()`` hands them to the per-expert GEMMs.

What torch ops do with it (``__torch_dispatch__``):
- ``detach`` / ``alias``: another wrapper over the same bytes (what Parameter and autograd use).
- ``clone``, ``deepcopy``, ``pickle``, ``.to(device)``: a copy of the bytes (the same format).
- ``copy_(src)`` (e.g. ``load_state_dict``, or master weights copied in after an optimizer
  step): a QuantizedWeight of the same format and row groups is copied byte for byte; any
  other tensor is quantized into the existing buffers, each group from its own rows (in
  place, every alias sees it).
- Any other in-place op (``add_``, ``mul_``, the optimizers' ``_foreach_*_`` ...) is an error
  saying what to do: quantized weights cannot be updated in place; keep FP32 master weights.
- Every other op runs on the dequantized tensor (rowwise decode, original dtype) and returns
  plain tensors: printing, comparisons, ``F.linear`` outside autocast, ``.float()``.

``__tensor_flatten__`` / ``__tensor_unflatten__`` expose the plain byte and scale tensors
(``_rowwise_data``, ``_rowwise_scale_inv``, ...; ``_g<i>_rowwise_data``, ... per group of a
grouped weight) and the quantizer's spec, so tensor-subclass aware code (saved-tensor
hooks, FSDP2-style code) sees ordinary tensors inside. Unflattening copies the bytes into a
new engine tensor; with fake tensors (torch.compile) that is not supported yet.
"""
from __future__ import annotations

import contextlib
import functools
import json
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_map

from .quantization import COLUMNWISE, DIRECTIONS, ROWWISE, QuantizedTensor, usage_bits
from .recipe import Recipe, RecipeLike, as_recipe

aten = torch.ops.aten

_KINDS = ("data", "scale_inv", "amax")
_PASS_THROUGH_METADATA = {aten.detach.default, aten.alias.default}


def _quantizer_from_spec(spec: Dict[str, Any], role: Tuple[str, str, str]):
    """A _C.Quantizer for a spec dictionary (cached: one small engine per spec and role)."""
    key = json.dumps([spec, list(role)], sort_keys=True)
    q = _SPEC_QUANTIZERS.get(key)
    if q is None:
        recipe = Recipe.from_dict({"version": 1, "name": "quantized-weight", "defaults": spec},
                                  source_name="<QuantizedWeight spec>")
        q = recipe.engine.resolve(*role)
        _SPEC_QUANTIZERS[key] = q
    return q


_SPEC_QUANTIZERS: Dict[str, Any] = {}


def _inner_name(group: int, direction: str, kind: str, num_groups: int) -> str:
    """The attribute holding one plain byte / scale tensor: ``_rowwise_data`` for a weight of
    one group, ``_g2_rowwise_data`` (group 2) for a grouped one."""
    prefix = f"_g{group}" if num_groups > 1 else ""
    return f"{prefix}_{direction}_{kind}"


class _Dequantize(torch.autograd.Function):
    """``QuantizedWeight.dequantize()`` with a straight-through gradient, so a model that
    calls it explicitly still trains the parameter (as the fallback ops do)."""

    @staticmethod
    def forward(ctx, weight, dtype):
        return weight._decode(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SplitGroups(torch.autograd.Function):
    """``QuantizedWeight.split_groups()``: one QuantizedWeight per row group over the same
    bytes; the gradient of the grouped weight is the groups' gradients stacked in order
    (``None`` when no group got one, e.g. all accumulated into ``main_grad``)."""

    @staticmethod
    def forward(ctx, weight):
        ctx.set_materialize_grads(False)
        ctx.group_shapes = [g.shape for g in weight._groups]
        return tuple(QuantizedWeight(g) for g in weight._groups)

    @staticmethod
    def backward(ctx, *grads):
        given = [g for g in grads if g is not None]
        if not given:
            return None
        return torch.cat([g if g is not None else given[0].new_zeros(shape)
                          for g, shape in zip(grads, ctx.group_shapes)], dim=0)


class QuantizedWeight(torch.Tensor):
    """A parameter stored quantized (see the module docstring). Build one with
    :meth:`from_tensor` or under :func:`quantized_model_init`.

    A grouped weight (``num_groups > 1``; GroupedLinear's single parameter under
    ``quantized_model_init``) stacks several tensors quantized separately along its rows:
    group ``i`` is rows ``[i*r, (i+1)*r)``, with its own scales, exactly the bytes a weight
    of those rows alone would hold. ``group(i)`` / ``split_groups()`` give one group as a
    QuantizedWeight; the per-direction buffer properties exist on single-group weights only."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, quantized: Union[QuantizedTensor, Sequence[QuantizedTensor]],
                requires_grad: bool = False):
        groups = tuple(quantized) if isinstance(quantized, (list, tuple)) else (quantized,)
        if not groups or not all(isinstance(q, QuantizedTensor) for q in groups):
            raise TypeError("QuantizedWeight wraps a qrecipe.QuantizedTensor or a non-empty "
                            f"sequence of them (row groups), got {quantized!r}")
        first = groups[0]
        for i, q in enumerate(groups[1:], 1):
            if q.shape[1:] != first.shape[1:] or q.dtype != first.dtype or \
                    q.options != first.options or q.usage != first.usage:
                raise ValueError(
                    f"QuantizedWeight row groups must share their trailing shape, dtype, "
                    f"quantizer and usage: group 0 is {first!r} ({first.dtype}), group {i} is "
                    f"{q!r} ({q.dtype})")
        direction = "rowwise" if first.has("rowwise") else "columnwise"
        device = first._buffer("data", direction).device
        shape = torch.Size([sum(q.shape[0] for q in groups), *first.shape[1:]])
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=first.dtype, device=device, requires_grad=requires_grad)
        self._groups = groups
        for i, q in enumerate(groups):  # the plain tensors inside, aliasing the engine's buffers
            for d in DIRECTIONS:
                for kind in _KINDS:
                    setattr(self, _inner_name(i, d, kind, len(groups)), q._buffer(kind, d))
        return self

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, quantizer, requires_grad: Optional[bool] = None,
                    groups: int = 1) -> "QuantizedWeight":
        """Quantizes `tensor` (both directions) with `quantizer` (a ``qrecipe.Quantizer`` or
        the engine's ``_C.Quantizer``). `groups` > 1 splits its rows into that many equal
        groups, each quantized as a tensor of its own (GroupedLinear's experts)."""
        cpp = getattr(quantizer, "_cpp", quantizer)
        source = tensor.detach().contiguous()
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or \
                source.dim() == 0 or source.shape[0] % groups:
            raise ValueError(f"QuantizedWeight.from_tensor: groups={groups!r} must be a positive "
                             f"int dividing the first dimension of the tensor of shape "
                             f"{tuple(source.shape)}")
        quantized = [QuantizedTensor(cpp.quantize(part, ROWWISE | COLUMNWISE), part.shape,
                                     part.dtype)
                     for part in source.chunk(groups, dim=0)]
        grad = tensor.requires_grad if requires_grad is None else requires_grad
        return cls(quantized, requires_grad=grad)

    # ------------------------------------------------------------ what it holds
    @property
    def num_groups(self) -> int:
        """How many row groups were quantized separately (1 for an ordinary weight)."""
        return len(self._groups)

    def group(self, index: int) -> "QuantizedWeight":
        """Row group `index` as a QuantizedWeight over the same bytes (not differentiable;
        see :meth:`split_groups`)."""
        return QuantizedWeight(self._groups[index])

    def split_groups(self) -> Tuple["QuantizedWeight", ...]:
        """Every row group as a QuantizedWeight over the same bytes, differentiable: their
        gradients reach this weight stacked in group order."""
        return _SplitGroups.apply(self)

    @property
    def quantized(self) -> QuantizedTensor:
        """The ``qrecipe.QuantizedTensor`` (inspection object) holding the bytes."""
        if len(self._groups) != 1:
            raise ValueError(f"this QuantizedWeight holds {len(self._groups)} row groups "
                             "quantized separately; inspect one with .group(i)")
        return self._groups[0]

    @property
    def engine_tensor(self):
        """The engine's quantized tensor (``_C.QuantizedTensor``): a GEMM operand."""
        return self.quantized._cpp

    format = property(lambda self: self._groups[0].format)
    options = property(lambda self: self._groups[0].options)
    usage = property(lambda self: self._groups[0].usage)
    rowwise_data = property(lambda self: self.quantized.rowwise_data)
    rowwise_scale_inv = property(lambda self: self.quantized.rowwise_scale_inv)
    rowwise_amax = property(lambda self: self.quantized.rowwise_amax)
    columnwise_data = property(lambda self: self.quantized.columnwise_data)
    columnwise_scale_inv = property(lambda self: self.quantized.columnwise_scale_inv)
    columnwise_amax = property(lambda self: self.quantized.columnwise_amax)

    def layout(self, direction: str) -> dict:
        return self.quantized.layout(direction)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The decoded tensor (rowwise data; the original dtype unless `dtype`), a plain tensor.
        Differentiable (straight-through) when the weight requires grad."""
        return _Dequantize.apply(self, dtype or self.dtype)

    def _decode(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        direction = "rowwise" if self._groups[0].has("rowwise") else "columnwise"
        parts = [g.dequantize(direction, dtype or self.dtype) for g in self._groups]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def __repr__(self, *, tensor_contents=None) -> str:
        groups = f", groups={self.num_groups}" if self.num_groups > 1 else ""
        return (f"QuantizedWeight(format={self.format!r}, shape={tuple(self.shape)}, "
                f"dtype={self.dtype}, device={self.device}, usage={'+'.join(self.usage)}"
                f"{groups}, requires_grad={self.requires_grad}, options={self.options!r})")

    # ------------------------------------------------------------ copies
    def _spec(self) -> Dict[str, Any]:
        return self._groups[0]._cpp.quantizer.spec_dict()

    def _role(self) -> Tuple[str, str, str]:
        """(module_type, tensor_type, name) of the quantizer that made the bytes."""
        return tuple(self._groups[0]._cpp.quantizer.role_fields)

    def _group_rows(self) -> Tuple[int, ...]:
        return tuple(g.shape[0] for g in self._groups)

    def _buffers(self) -> List[Dict[str, Dict[str, Optional[torch.Tensor]]]]:
        """Per group: {direction: {kind: plain tensor or None}} of the directions it holds."""
        n = len(self._groups)
        return [{d: {k: getattr(self, _inner_name(i, d, k, n)) for k in _KINDS}
                 for d in DIRECTIONS if g.has(d)} for i, g in enumerate(self._groups)]

    def _usage_bits(self) -> int:
        return usage_bits(self.usage)

    def _with_buffers(self, buffers, device=None, requires_grad: bool = False
                      ) -> "QuantizedWeight":
        """A new QuantizedWeight of the same quantizer and groups holding copies of `buffers`
        (as :meth:`_buffers` gives them)."""
        device = torch.device(device) if device is not None else self.device
        quantizer = self._groups[0]._cpp.quantizer
        groups = []
        for g, group_buffers in zip(self._groups, buffers):
            moved = {d: {k: (None if t is None else t.to(device)) for k, t in b.items()}
                     for d, b in group_buffers.items()}
            cpp = quantizer.from_buffers(g.shape[0], g.shape.numel() // g.shape[0],
                                         self._usage_bits(), moved, device)
            groups.append(QuantizedTensor(cpp, g.shape, self.dtype))
        return QuantizedWeight(groups, requires_grad)

    def __tensor_flatten__(self):
        n = len(self._groups)
        names = [_inner_name(i, d, k, n) for i, b in enumerate(self._buffers())
                 for d, kinds in b.items() for k, t in kinds.items() if t is not None]
        ctx = {"spec": self._spec(), "role": self._role(), "shape": tuple(self.shape),
               "dtype": self.dtype, "usage": self._usage_bits(),
               "group_rows": self._group_rows()}
        return names, ctx

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        return _rebuild(inner_tensors, ctx, False, False)

    def __reduce_ex__(self, protocol):
        names, ctx = self.__tensor_flatten__()
        inner = {n: getattr(self, n).detach().clone() for n in names}
        return (_rebuild, (inner, ctx, self.requires_grad, getattr(self, "_is_param", False)))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        copy = self._with_buffers(self._buffers(), requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        memo[id(self)] = copy
        return copy

    # ------------------------------------------------------------ in-place copy
    def _copy_from(self, src: torch.Tensor) -> None:
        if isinstance(src, QuantizedWeight) and src.options == self.options and \
                src.usage == self.usage and src.shape == self.shape and \
                src._group_rows() == self._group_rows():
            for ours, theirs in zip(self._buffers(), src._buffers()):
                for d, kinds in ours.items():
                    for k, t in kinds.items():
                        if t is not None:
                            t.copy_(theirs[d][k])  # the aliases: writes the engine's bytes
            return
        if isinstance(src, QuantizedWeight):
            src = src._decode()
        if tuple(src.shape) != tuple(self.shape):
            raise RuntimeError(f"copy_ into a QuantizedWeight of shape {tuple(self.shape)} from "
                               f"a tensor of shape {tuple(src.shape)}")
        source = src.detach().to(self.device, self.dtype).contiguous()
        rows = source.reshape(self.shape[0], -1).split(self._group_rows(), dim=0)
        for g, part in zip(self._groups, rows):  # each group quantized on its own rows
            g._cpp.requantize(part)

    # ------------------------------------------------------------ dispatch
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PASS_THROUGH_METADATA:
            src = args[0]
            return QuantizedWeight(src._groups, requires_grad=False)
        if func is aten.clone.default:
            src = args[0]
            return src._with_buffers(src._buffers())
        if func is aten.copy_.default and isinstance(args[0], QuantizedWeight):
            args[0]._copy_from(args[1])
            return args[0]
        if func is aten._to_copy.default and _is_device_move(args[0], kwargs):
            src = args[0]
            return src._with_buffers(src._buffers(), device=kwargs["device"])
        _refuse_mutation(func, args, kwargs)

        def unwrap(t):
            return t._decode() if isinstance(t, QuantizedWeight) else t

        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


def _is_device_move(src, kwargs) -> bool:
    """``_to_copy`` that only changes the device (``.to(device)``, ``.cuda()``, ``.cpu()``):
    the bytes move as they are. A dtype or layout change goes through the decoded tensor."""
    if not isinstance(src, QuantizedWeight) or kwargs.get("device") is None:
        return False
    neutral = {"dtype": (None, src.dtype), "layout": (None, torch.strided),
               "pin_memory": (None, False), "non_blocking": (None, False, True),
               "memory_format": (None, torch.preserve_format, torch.contiguous_format)}
    return all(k == "device" or (k in neutral and v in neutral[k]) for k, v in kwargs.items())


def _refuse_mutation(func, args, kwargs) -> None:
    """In-place ops that would write a QuantizedWeight: a clear error, never a silent no-op
    on a dequantized copy."""
    if not func._schema.is_mutable:
        return
    values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
    for arg, value in zip(func._schema.arguments, values):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, QuantizedWeight) for v in items):
            raise RuntimeError(
                f"{func} would modify a qrecipe QuantizedWeight in place, which is not "
                "supported: the weight is stored quantized and an update applied to its "
                "dequantized copy would be lost. Keep FP32 master weights and update those "
                "(e.g. build the model without qrecipe.quantized_model_init, so qrecipe "
                "quantizes the high-precision weights each step, or keep a high-precision copy "
                "for the optimizer and `quantized_param.copy_(master)` after each step, which "
                "re-quantizes). To change a weight's value, use copy_.")


def _rebuild(inner_tensors, ctx, requires_grad: bool, is_param: bool):
    """Unpickling / unflattening: a QuantizedWeight from its plain tensors and spec."""
    quantizer = _quantizer_from_spec(ctx["spec"], tuple(ctx["role"]))
    shape = torch.Size(ctx["shape"])
    group_rows = tuple(ctx.get("group_rows", (shape[0],)))  # saved before groups: one
    cols = shape.numel() // shape[0]
    groups = []
    for i, rows in enumerate(group_rows):
        buffers: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
        device = None
        for d in DIRECTIONS:
            if ctx["usage"] & usage_bits(d):
                buffers[d] = {k: inner_tensors.get(_inner_name(i, d, k, len(group_rows)))
                              for k in _KINDS}
                device = device or buffers[d]["data"].device
        cpp = quantizer.from_buffers(rows, cols, ctx["usage"], buffers, device)
        groups.append(QuantizedTensor(cpp, torch.Size([rows, *shape[1:]]), ctx["dtype"]))
    weight = QuantizedWeight(groups, requires_grad)
    if is_param:
        weight = torch.nn.Parameter(weight, requires_grad=requires_grad)
    return weight


# -------------------------------------------------------------------- quantized_model_init
class _InitState(threading.local):
    def __init__(self) -> None:
        self.stack: List[Optional[Any]] = []


_init_state = _InitState()


def current_init_recipe():
    """The recipe of the innermost enabled quantized_model_init block, or None."""
    return _init_state.stack[-1] if _init_state.stack else None


@contextlib.contextmanager
def quantized_model_init(recipe: RecipeLike = None, enabled: bool = True):
    """Parameters of the qrecipe modules created inside are quantized at creation: each GEMM
    weight becomes a :class:`QuantizedWeight` (both directions) quantized by the quantizer
    `recipe` gives its role (module type, ``weight``, the name passed to the constructor);
    GroupedLinear's single grouped parameter becomes a grouped QuantizedWeight, each expert's
    rows quantized on their own. Biases and norm parameters stay high precision. Nestable; ``enabled=False`` turns it off.

    Training such a model needs FP32 master weights (see QuantizedWeight): an optimizer
    updating the quantized parameters in place raises an error saying so."""
    _init_state.stack.append(as_recipe(recipe) if enabled else None)
    try:
        yield
    finally:
        _init_state.stack.pop()


def quantize_module_parameters(module: torch.nn.Module, recipe) -> None:
    """Replaces the module's GEMM weights (``module._quantized_weight_roles()``) by
    QuantizedWeight parameters quantized under `recipe`, each in the row groups
    ``module._quantized_weight_groups(name)`` says. Meta tensors are left alone."""
    for param_name, role in module._quantized_weight_roles().items():
        param = getattr(module, param_name)
        if param is None or isinstance(param, QuantizedWeight) or param.is_meta:
            continue
        quantizer = recipe.engine.resolve(*role)
        if quantizer is None:
            continue  # the recipe keeps this weight in high precision
        weight = QuantizedWeight.from_tensor(param, quantizer, requires_grad=param.requires_grad,
                                             groups=module._quantized_weight_groups(param_name))
        setattr(module, param_name, torch.nn.Parameter(weight, requires_grad=param.requires_grad))


class QuantizedInitMixin:
    """Gives a qrecipe module quantized parameters under ``quantized_model_init``: after the
    outermost ``__init__`` of the module's class returns, its GEMM weights are quantized.
    A module lists them in ``_quantized_weight_roles()``: {parameter name: (module_type,
    tensor_type, role name)}; the default is ``weight`` with (MODULE_TYPE, "weight", name).
    A parameter stacking several GEMMs' weights along its rows (GroupedLinear's single
    parameter) says in ``_quantized_weight_groups(name)`` how many equal row groups to
    quantize separately (default 1)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        init = cls.__init__

        def __init__(self, *args, **kw):
            depth = getattr(self, "_qrecipe_init_depth", 0)
            object.__setattr__(self, "_qrecipe_init_depth", depth + 1)
            try:
                init(self, *args, **kw)
            finally:
                object.__setattr__(self, "_qrecipe_init_depth", depth)
            if depth == 0:
                recipe = current_init_recipe()
                if recipe is not None:
                    quantize_module_parameters(self, recipe)

        cls.__init__ = functools.wraps(init)(__init__)  # keeps the signature for help()

    def _quantized_weight_roles(self) -> Dict[str, Tuple[str, str, str]]:
        if getattr(self, "weight", None) is None:
            return {}
        return {"weight": (type(self).MODULE_TYPE, "weight", getattr(self, "name", ""))}

    def _quantized_weight_groups(self, param_name: str) -> int:
        return 1
