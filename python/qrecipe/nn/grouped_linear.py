"""``qrecipe.nn.GroupedLinear``: ``num_gemms`` linear layers of the same shape (MoE experts)
applied to consecutive row groups of one input, as TransformerEngine's module of the same
name.

    y = module(x, m_splits)     # x [sum(m_splits), in] (or [..., in]); y [..., out]

Rows ``[sum(m_splits[:i]), sum(m_splits[:i+1]))`` of ``x`` go to expert ``i``. Storage:
with ``single_grouped_parameter=True`` (the default) all experts' weights live in ONE
contiguous Parameter ``weight`` of shape [num_gemms * out, in]: expert ``i`` is rows
``[i*out, (i+1)*out)``, i.e. element offset ``i*out*in`` (and one ``bias`` [num_gemms * out],
expert ``i`` at ``[i*out, (i+1)*out)``); otherwise ``weight0`` .. ``weight{n-1}`` and
``bias0`` .. ``bias{n-1}`` as in TransformerEngine.

Numerics: each expert is exactly a ``qrecipe.nn.Linear`` on its rows (the same GEMMs, each
expert's input, weight and output gradient quantized as tensors of their own, so their scales
are those separate layers would have); outputs are concatenated in expert order. Roles:
module_type ``grouped_linear``, name = the module's name for every expert, so the experts
share one quantizer per role: a delayed-scaling role keeps one amax
history for all experts (their max), and a stochastic-rounding role one call counter. An
expert with no rows still runs (empty GEMMs), so every expert's weight gets a gradient (zero)
and is quantized each step whatever the routing.

Grouped quantization: in the single-parameter layout the experts' weights are quantized by ONE
engine call over the whole parameter (``_C.quantize_grouped``, Engine::quantize_grouped): each
expert's bytes and scales are exactly those of quantizing its rows alone (so the numbers above
do not change). A format whose plugin provides the optional ``quantize_grouped`` extra does it
in one plugin call (float8: one amax launch and one cast launch for all experts on the GPU;
mxfp8, blockwise: one launch; nvfp4 without 2d and Hadamard: three); the other formats go
through the engine's per-expert loop. It runs when the module quantizes its weight every call
or at the first micro-batch (``is_first_microbatch`` None or True; the kept experts then go
into the weight cache); later micro-batches reuse the cache (a stale expert is re-quantized on
its own). Under autocast the experts' GEMMs are one autograd node (grouped_linear_function.py)
whose forward quantizes all experts' inputs with one grouped call and whose backward does the
same for their output gradients, each GEMM kind of all experts one grouped engine GEMM (one
kernel launch on a GPU with the grouped kernels, docs/gemm.md "Grouped GEMMs"); torch.compile
traces the per-expert path instead.

Splits on the device: ``m_splits`` may be a tensor (a router's output). On a GPU, when every
GEMM and quantization of the call has a device-split path (``device_splits_plan``: the grouped
kernels are built, the formats of input and grad_output quantize device-split groups (float8,
blockwise 1x128, mxfp8), no bias, every expert's weight needs a gradient or none does), the
sizes are never read on the host: the forward and backward run without a host
synchronization (the values are checked on the device by ``torch._assert_async``). Otherwise
the tensor is read on the host (``tolist()``, a synchronization) and the host path runs. A CPU
tensor is read by the engine on the CPU: the same numbers as a list.
"""
from __future__ import annotations

import math
import operator
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .._engine import _C
from ..quantization import COLUMNWISE, ROWWISE
from ..recipe import as_recipe
from ..quantized_param import QuantizedInitMixin, QuantizedWeight
from .. import telemetry as _telemetry
from . import weight_cache as _weight_cache
from .base import QuantizedModule, init_linear_parameters, register_linear_parameters
from .grouped_linear_function import (GroupedCall, GroupedLinearFunction, TensorSplits,
                                      grouped_forward)
from .linear_gemms import observe_groups, refuse_graph_capture, weight_operand_of

Splits = Union[Sequence[int], torch.Tensor]


def _quantize_grouped(quantizer, weight: torch.Tensor, group_rows: List[int], usage: int):
    """Every grouped weight quantization goes through here (tests count the calls): one
    QuantizedTensor per group of rows, each as if quantized alone."""
    refuse_graph_capture(weight, f"grouped quantization of role {quantizer.role}")
    quantized = _C.quantize_grouped(quantizer, weight, group_rows, usage)
    observe_groups(quantizer, weight, group_rows, quantized)
    return quantized


class GroupedLinear(QuantizedInitMixin, QuantizedModule):
    """``num_gemms`` experts ``y_i = x_i W_i^T + b_i`` with quantized GEMMs under
    ``qrecipe.autocast``; ``forward(x, m_splits)``.

    Training-loop options (docs/adapter.md), in both layouts:
    ``forward(x, m_splits, is_first_microbatch=...)`` keeps each expert's quantized weight
    across micro-batches; ``fuse_wgrad_accumulation=True`` accumulates wgrad into FP32
    ``main_grad`` buffers instead of ``.grad``: ``weight.main_grad`` [num_gemms * out, in] in
    the single-parameter layout (expert i's rows as above), ``weight{i}.main_grad`` otherwise;
    under ``qrecipe.quantized_model_init`` the weights are created quantized, each expert's
    on its own (the single parameter becomes a grouped ``QuantizedWeight``)."""

    MODULE_TYPE = "grouped_linear"

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 single_grouped_parameter: bool = True, device=None, dtype=None,
                 name: Optional[str] = None, fuse_wgrad_accumulation: bool = False):
        super().__init__(name)
        if isinstance(num_gemms, bool) or not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(f"{self._who()}: num_gemms must be a positive int (the number of "
                             f"experts), got {num_gemms!r}")
        factory = {"device": device, "dtype": dtype}
        self.num_gemms = num_gemms
        self.in_features = in_features
        self.out_features = out_features
        self.single_grouped_parameter = single_grouped_parameter
        self.use_bias = bias
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        if single_grouped_parameter:  # experts stacked along the rows of one weight
            register_linear_parameters(self, "weight", "bias", in_features,
                                       num_gemms * out_features, bias, factory)
        else:
            for i in range(num_gemms):
                register_linear_parameters(self, f"weight{i}", f"bias{i}", in_features,
                                           out_features, bias, factory)
        self.reset_parameters()

    # ---------------------------------------------------------------- experts
    def expert_weights(self) -> List[torch.Tensor]:
        """Each expert's [out, in] weight: views of ``weight`` (rows [i*out, (i+1)*out)) in
        the single-parameter layout, the parameters ``weight{i}`` otherwise. A grouped
        ``QuantizedWeight`` (quantized_model_init) gives its groups: each expert's own bytes,
        with gradients flowing back to ``weight``."""
        if not self.single_grouped_parameter:
            return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        if isinstance(self.weight, QuantizedWeight):
            if self.weight.num_groups != self.num_gemms:
                raise RuntimeError(
                    f"{self._who()}: its QuantizedWeight holds {self.weight.num_groups} row "
                    f"group(s) but the module has num_gemms={self.num_gemms} experts, each "
                    "quantized on its own; build it under qrecipe.quantized_model_init, or "
                    "copy_ the values into the existing weight instead of replacing it")
            return list(self.weight.split_groups())
        return list(self.weight.split(self.out_features, dim=0))

    def expert_biases(self) -> List[Optional[torch.Tensor]]:
        if not self.use_bias:
            return [None] * self.num_gemms
        if self.single_grouped_parameter:
            return list(self.bias.split(self.out_features, dim=0))
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    def reset_parameters(self) -> None:
        """Each expert as torch.nn.Linear (Kaiming-uniform weight, then uniform bias), expert
        0 first, so both storage layouts draw the same values from the same seed. A single
        grouped weight sharded by FSDP2 (a DTensor: meta-device init) is drawn in one call
        (the experts share their fan-in, so the bounds are the same), then each bias."""
        with torch.no_grad():
            if self.single_grouped_parameter and hasattr(self.weight, "_local_tensor"):
                init_linear_parameters(self.weight, None)
                fan_in = self.in_features
                bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
                if self.use_bias:
                    torch.nn.init.uniform_(self.bias, -bound, bound)
                return
            for w, b in zip(self.expert_weights(), self.expert_biases()):
                init_linear_parameters(w, b)

    def gemms(self) -> Dict[str, Tuple[int, int]]:
        return {"": (self.in_features, self.out_features)}

    def _quantized_weight_roles(self) -> Dict[str, Tuple[str, str, str]]:
        """quantized_model_init: every expert's weight by the module's one weight role."""
        role = (self.MODULE_TYPE, "weight", self.name)
        if self.single_grouped_parameter:
            return {"weight": role}
        return {f"weight{i}": role for i in range(self.num_gemms)}

    def _quantized_weight_groups(self, param_name: str) -> int:
        """The single parameter is quantized per expert: one row group each."""
        return self.num_gemms if self.single_grouped_parameter else 1

    def _explain_notes(self) -> List[str]:
        layout = ("one parameter 'weight', expert i at rows [i*out, (i+1)*out)"
                  if self.single_grouped_parameter else "parameters weight0..weight"
                  f"{self.num_gemms - 1}")
        return [f"  experts      {self.num_gemms} GEMMs share these roles; each expert's "
                f"tensors are quantized separately; {layout}"]

    # ---------------------------------------------------------------- forward
    def _check_splits(self, m_splits: Splits, x: torch.Tensor) -> Union[List[int], torch.Tensor]:
        """The splits as a list of ints, checked; or, for a tensor, the tensor itself (shape
        and dtype checked here; a GPU tensor's values by torch._assert_async, never read on
        the host; a CPU tensor's read and checked like a list)."""
        who = self._who()
        rows = x.numel() // self.in_features if self.in_features else 0
        if isinstance(m_splits, torch.Tensor):
            if m_splits.dim() != 1 or m_splits.is_floating_point() or m_splits.is_complex():
                raise TypeError(f"{who}: m_splits must be a 1-D integer tensor or a list of "
                                f"ints, got a {m_splits.dtype} tensor of shape "
                                f"{tuple(m_splits.shape)}")
            if m_splits.numel() != self.num_gemms:
                raise ValueError(f"{who}: m_splits has {m_splits.numel()} entries, expected "
                                 f"num_gemms={self.num_gemms} (one row count per expert)")
            if m_splits.device.type != "cpu":
                if m_splits.device != x.device:
                    raise ValueError(f"{who}: m_splits lives on {m_splits.device} but the "
                                     f"input on {x.device}; keep them on one device")
                # Checked where the values are, without waiting for them.
                torch._assert_async(torch.all(m_splits >= 0),
                                    f"{who}: m_splits has a negative row count")
                torch._assert_async(torch.sum(m_splits) == rows,
                                    f"{who}: m_splits does not sum to the input's {rows} rows")
                return m_splits
            self._check_split_values(m_splits.tolist(), x)
            return m_splits
        try:
            splits = [operator.index(m) for m in m_splits]
        except TypeError:
            raise TypeError(f"{who}: m_splits must be a list of ints (rows per expert), "
                            f"got {m_splits!r}") from None
        if len(splits) != self.num_gemms:
            raise ValueError(f"{who}: m_splits has {len(splits)} entries, expected "
                             f"num_gemms={self.num_gemms} (one row count per expert)")
        self._check_split_values(splits, x)
        return splits

    def _check_split_values(self, splits: List[int], x: torch.Tensor) -> None:
        who = self._who()
        rows = x.numel() // self.in_features if self.in_features else 0
        for i, m in enumerate(splits):
            if m < 0:
                raise ValueError(f"{who}: m_splits[{i}] = {m} is negative; row counts must be "
                                 ">= 0")
        if sum(splits) != rows:
            raise ValueError(f"{who}: m_splits sums to {sum(splits)} but the input of shape "
                             f"{tuple(x.shape)} has {rows} rows; the splits must cover every "
                             "row, in expert order")

    def device_splits_plan(self, recipe=None, dtype: torch.dtype = torch.bfloat16) -> dict:
        """Whether a call under `recipe` (the default recipe when None) with activations of
        `dtype` runs with m_splits on a GPU without reading them on the host: {'served':
        bool, 'why': str, 'fprop' | 'dgrad' | 'wgrad': the grouped plan of each GEMM}."""
        recipe = as_recipe(recipe)
        w_dtype = self.expert_weights()[0].dtype
        key = (recipe, dtype, self.fuse_wgrad_accumulation, self.use_bias, w_dtype)
        plans = self.__dict__.setdefault("_device_split_plans", {})
        if key not in plans:
            def written(t):  # what the engine writes for an output of dtype t
                return "bf16" if t == torch.bfloat16 else "f32"
            wgrad = "f32" if self.fuse_wgrad_accumulation else written(w_dtype)
            plan = dict(_C.plan_grouped_linear(
                recipe.engine, self.MODULE_TYPE, self.role_name(""), self.in_features,
                self.out_features, written(dtype), wgrad, self.fuse_wgrad_accumulation,
                self.use_bias))
            if not _C.grouped_kernels_built():
                plan["served"] = False
                plan["why"] = "this build has no grouped GEMM kernels (CUTLASS)"
            plans[key] = plan
        return plans[key]

    def _attach_main_grad_views(self, weights: List[torch.Tensor], recipe) -> None:
        """Single-parameter layout with fuse_wgrad_accumulation: each expert's view gets the
        matching rows of ``weight.main_grad`` as its own main_grad, so its wgrad GEMM
        accumulates straight into the one FP32 buffer (`recipe`: the one the call runs
        under, None outside autocast)."""
        if recipe is None or not torch.is_grad_enabled() or \
                not self.weight.requires_grad:
            return  # plain F.linear: autograd fills weight.grad as usual
        main_grad = getattr(self.weight, "main_grad", None)
        if main_grad is None:
            raise RuntimeError(
                f"{self._who()}: fuse_wgrad_accumulation=True but weight has no .main_grad; "
                "allocate it before the first backward: module.weight.main_grad = "
                "torch.zeros_like(module.weight, dtype=torch.float32)")
        if tuple(main_grad.shape) != tuple(self.weight.shape):
            raise RuntimeError(
                f"{self._who()}: weight.main_grad has shape {tuple(main_grad.shape)}, expected "
                f"{tuple(self.weight.shape)} (the grouped weight's)")
        for w, rows in zip(weights, main_grad.split(self.out_features, dim=0)):
            w.main_grad = rows

    def forward(self, x: torch.Tensor, m_splits: Splits,
                is_first_microbatch: Optional[bool] = None) -> torch.Tensor:
        """`is_first_microbatch` keeps each expert's quantized weight across micro-batches
        (docs/adapter.md): in the single-parameter layout the entries are kept under
        ``weight`` and the expert index, and an in-place change of ``weight`` (an optimizer
        step) makes all of them stale."""
        weights = self.expert_weights()
        self._check_input(x, self.in_features, tuple(weights))
        splits = self._check_splits(m_splits, x)
        tokens = x.numel() // self.in_features if self.in_features else 0
        # One recipe for all experts (recorded / replayed once under activation checkpointing).
        recipe = self._gemm_recipe("", tokens)
        if self.fuse_wgrad_accumulation and self.single_grouped_parameter:
            self._attach_main_grad_views(weights, recipe)
        roles = None
        if recipe is not None and not torch.compiler.is_compiling():
            roles = self.roles(recipe, tokens)
        if roles is None or roles.all_none:
            # Outside autocast, nothing quantized (F.linear per expert), or while
            # torch.compile traces (each expert one traced operator): expert by expert.
            sizes = splits.tolist() if isinstance(splits, torch.Tensor) else splits
            xs = x.reshape(-1, self.in_features).split(sizes, dim=0)
            outs = [self._linear(xi, wi, bi, "", is_first_microbatch,
                                 self.fuse_wgrad_accumulation,
                                 (self.weight, i) if self.single_grouped_parameter else None,
                                 recipe=recipe)
                    for i, (xi, wi, bi) in enumerate(zip(xs, weights, self.expert_biases()))]
            return torch.cat(outs, dim=0).reshape(*x.shape[:-1], self.out_features)
        # Before the step is noted: a refused capture leaves the scaling update as it was.
        refuse_graph_capture(x, "forward", roles.plan.get("name", ""))
        recipe.note_step_activity()
        if isinstance(splits, torch.Tensor):
            splits = self._tensor_splits(splits, x, weights, recipe)
        return self._grouped_forward(x, splits, weights, recipe, roles, is_first_microbatch)

    def _tensor_splits(self, splits: torch.Tensor, x: torch.Tensor, weights: List[torch.Tensor],
                       recipe) -> Union[List[int], TensorSplits]:
        """Tensor m_splits as the call uses them: TensorSplits when the whole call has a
        device-split path (always on the CPU, where the engine reads them), else the host
        list (on a GPU: tolist(), a synchronization; device_splits_plan says why)."""
        if _telemetry.state.on:
            # Telemetry observes each expert's rows (linear_gemms.observe_groups), which takes
            # the host sizes: read them once here rather than leave experts unobserved.
            return splits.tolist()
        grad = torch.is_grad_enabled()
        uniform = len({grad and w.requires_grad for w in weights}) == 1  # wgrad: all or none
        if splits.device.type == "cpu":
            return TensorSplits.of(splits) if uniform else splits.tolist()
        if uniform and self.device_splits_plan(recipe, x.dtype)["served"]:
            return TensorSplits.of(splits)
        return splits.tolist()  # reads the GPU tensor: a host synchronization

    def _grouped_forward(self, x: torch.Tensor, splits: Union[List[int], TensorSplits],
                         weights: List[torch.Tensor],
                         recipe, roles, is_first_microbatch: Optional[bool]) -> torch.Tensor:
        """Every expert under `roles` as one autograd node (grouped_linear_function.py): the
        experts' inputs and output gradients each quantized by one grouped call."""
        biases = self.expert_biases()
        grad = torch.is_grad_enabled()
        need_dgrad = grad and x.requires_grad
        need_wgrad = [grad and w.requires_grad for w in weights]
        needs_bias_grad = grad and any(b is not None and b.requires_grad for b in biases)
        grouped = self.single_grouped_parameter and not isinstance(self.weight, QuantizedWeight)
        weight_ops = (self._grouped_weight_operands(x, weights, is_first_microbatch, recipe,
                                                    roles) if grouped else None)
        trim = weight_ops is not None and is_first_microbatch is None
        if weight_ops is None:
            who = self._who()
            weight_ops = [weight_operand_of(w, roles, need_dgrad, is_first_microbatch, who,
                                            (self.weight, i) if grouped else None,
                                            self._scaling_generation(recipe))
                          for i, w in enumerate(weights)]
        fuse = self.fuse_wgrad_accumulation
        call = GroupedCall(splits=splits, roles=roles, weight_ops=weight_ops,
                           need_dgrad=need_dgrad, need_wgrad=need_wgrad,
                           main_grad_weights=[w if fuse else None for w in weights],
                           trim_weight_ops=trim)
        if not (need_dgrad or any(need_wgrad) or needs_bias_grad):
            y, _, _ = grouped_forward(x, call, weights, biases, saving=False)
            return y.reshape(*x.shape[:-1], self.out_features)
        bias_params = biases if self.use_bias else []
        return GroupedLinearFunction.apply(x, call, *weights, *bias_params)

    def _grouped_weight_operands(self, x: torch.Tensor, weights: List[torch.Tensor],
                                 is_first_microbatch: Optional[bool], recipe,
                                 roles) -> Optional[list]:
        """Every expert's quantized weight from ONE grouped quantization of the single
        parameter, with the directions the experts' GEMMs need (as quantized_linear would
        ask for each), or None when each expert's weight is taken on its own: a weight role
        of format none, or a later micro-batch (is_first_microbatch=False: the weight cache
        decides). At the first micro-batch the experts' operands are kept in the weight
        cache, exactly as quantizing each expert there would."""
        if not (is_first_microbatch is None or is_first_microbatch is True):
            return None
        if roles.weight is None:
            return None
        grad = torch.is_grad_enabled()
        usage = ROWWISE | (COLUMNWISE if grad and x.requires_grad else 0)
        if is_first_microbatch and grad:
            usage |= COLUMNWISE  # dgrad of a later micro-batch (as the weight cache does)
        operands = _quantize_grouped(roles.weight, self.weight.detach().contiguous(),
                                     [self.out_features] * self.num_gemms, usage)
        if is_first_microbatch:
            generation = recipe.scaling_generation
            for i, (w, op) in enumerate(zip(weights, operands)):
                _weight_cache.keep(w, roles.weight, usage, op, generation, (self.weight, i))
        return operands

    def extra_repr(self) -> str:
        s = (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
             f"out_features={self.out_features}, bias={self.use_bias}, "
             f"single_grouped_parameter={self.single_grouped_parameter}")
        return s + self._name_repr()
