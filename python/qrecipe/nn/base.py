"""What every ``qrecipe.nn`` module shares: its name, its GEMMs' quantizer roles (resolved
once per recipe and cached), the autocast dispatch of one GEMM, input checks and ``explain``.

A module lists its GEMMs in :meth:`QuantizedModule.gemms` as ``{key: (in, out)}``; the key
is ``""`` for a module with a single GEMM (whose roles are named by the module's name alone)
and a suffix such as ``"fc1"`` otherwise (roles named ``"<name>.fc1"``). Every GEMM runs
through :meth:`QuantizedModule._linear`, which calls ``torch.nn.functional.linear`` outside
``qrecipe.autocast`` or when the recipe gives the GEMM's three roles format ``none`` (so the
module is bit-identical to its plain torch composition) and ``quantized_linear`` otherwise.

How to add a module: subclass, set ``MODULE_TYPE`` (the recipe's ``module_type``; list it in
docs/recipes.md), implement ``gemms()``, and call ``self._linear(x, w, b, key)`` per GEMM.
``qrecipe.convert`` names every ``QuantizedModule`` of a model by its path.
"""
from __future__ import annotations

import math
import weakref
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import autocasting as _autocast
from .. import recomputation as _recompute
from .. import telemetry as _telemetry
from .._engine import _C
from ..quantization import SUPPORTED_DTYPES
from ..quantized_param import QuantizedWeight
from ..recipe import Recipe, as_recipe
from .input_sharing import share_key
from .linear_function import quantized_linear
from .linear_gemms import LinearRoles, refuse_graph_capture
from .module_state import ScalingStateMixin

_ROLE_TYPES = ("input", "weight", "grad_output")
_RESOLVE = object()  # _linear's default: resolve the recipe of the call itself
_GEMM_KINDS = ("fprop", "dgrad", "wgrad")


def register_linear_parameters(module: torch.nn.Module, weight_name: str, bias_name: str,
                               in_features: int, out_features: int, bias: bool,
                               factory: dict) -> None:
    """Registers an uninitialised [out, in] weight and, when `bias`, an [out] bias (else
    `bias_name` as None, as torch.nn.Linear does) on `module`; ``factory``: device and dtype."""
    module.register_parameter(weight_name, torch.nn.Parameter(
        torch.empty((out_features, in_features), **factory)))
    module.register_parameter(
        bias_name, torch.nn.Parameter(torch.empty(out_features, **factory)) if bias else None)


def init_linear_parameters(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """torch.nn.Linear's initialisation of a [out, in] weight (Kaiming-uniform) and its bias
    (uniform in +-1/sqrt(in)), drawing from torch's RNG in the same order. A weight stored
    quantized (a QuantizedWeight, or an FSDP2 shard of one: a DTensor over it) gets the values
    drawn into a plain tensor of its kind, then quantized into it (``copy_``; a shard of a
    per-tensor-scaled format with the amax all-reduced across its ranks): the meta-device
    init path (``to_empty`` + ``reset_parameters``)."""
    if weight.is_meta:
        return
    if isinstance(getattr(weight, "_local_tensor", weight), QuantizedWeight):
        values = plain_like(weight)
        torch.nn.init.kaiming_uniform_(values, a=math.sqrt(5))
        with torch.no_grad():
            weight.copy_(values)
    else:
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = weight.shape[1]
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        torch.nn.init.uniform_(bias, -bound, bound)


def _is_dtensor(t) -> bool:
    dtensor = getattr(getattr(torch.distributed, "tensor", None), "DTensor", None)
    return dtensor is not None and isinstance(t, dtensor)
def plain_like(weight: torch.Tensor) -> torch.Tensor:
    """An uninitialised high-precision tensor of `weight`'s shape, dtype and device; for a
    DTensor, a DTensor of the same mesh and placements (so random init draws its values as
    for a plain sharded parameter)."""
    local = getattr(weight, "_local_tensor", None)
    if local is None:
        return torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(torch.empty(local.shape, dtype=weight.dtype, device=local.device),
                              weight.device_mesh, weight.placements, run_check=False,
                              shape=weight.shape, stride=weight.stride())


class QuantizedModule(ScalingStateMixin, torch.nn.Module):
    """Base of the qrecipe.nn modules. ``name`` is the dotted path recipe rules match
    (``qrecipe.convert`` sets it from the model; set it yourself for modules you build
    directly). The delayed-scaling state of the module's roles travels in its
    ``state_dict`` (``ScalingStateMixin``, nn/module_state.py)."""

    MODULE_TYPE = ""  # the recipe's module_type; every subclass sets it

    def __init__(self, name: Optional[str] = None):
        super().__init__()
        self.name = name or ""
        # recipe -> {gemm key: LinearRoles}. Weak keys: a recipe that is gone frees its
        # quantizers. Never copied or pickled (a copy re-resolves), see __getstate__.
        self._roles: "weakref.WeakKeyDictionary[Recipe, Dict[str, LinearRoles]]" = \
            weakref.WeakKeyDictionary()

    # ---------------------------------------------------------------- GEMMs and roles
    def gemms(self) -> Dict[str, Tuple[int, int]]:
        """``{key: (in_features, out_features)}`` of each GEMM, in forward order."""
        raise NotImplementedError(f"{type(self).__name__} must list its GEMMs in gemms()")

    def role_name(self, gemm: str = "") -> str:
        """The ``name`` part of the roles of GEMM `gemm`: the module's name, plus ``.<key>``
        for modules with several GEMMs (``"layers.0.mlp.fc1"``)."""
        if not gemm:
            return self.name
        return f"{self.name}.{gemm}" if self.name else gemm

    def roles(self, recipe: Recipe, tokens: int = 1, gemm: str = "") -> LinearRoles:
        """The quantizers `recipe` gives GEMM `gemm` (cached per recipe; re-resolved when the
        name changes). Planning the three GEMMs here reports a quantizer that cannot serve a
        GEMM before the first step. `tokens` only shapes that first plan."""
        shapes = self.gemms()
        if gemm not in shapes:
            raise KeyError(f"{self._who()}: no GEMM {gemm!r}; its GEMMs are "
                           f"{', '.join(repr(k) for k in shapes)}")
        per_recipe = self._roles.get(recipe)
        if per_recipe is not None:
            return self._plan(recipe, per_recipe, gemm, tokens)
        # First use of `recipe`: plan every GEMM (the requested one with its tokens), keep
        # them only when all succeeded, then write back a scaling state loaded from a
        # checkpoint (it names the roles of all GEMMs).
        per_recipe = {}
        roles = self._plan(recipe, per_recipe, gemm, tokens)
        for other in shapes:
            self._plan(recipe, per_recipe, other, 1)
        self._roles[recipe] = per_recipe
        self._apply_loaded_scaling(recipe)
        return roles

    def _plan(self, recipe: Recipe, per_recipe: Dict[str, LinearRoles], gemm: str,
              tokens: int) -> LinearRoles:
        in_features, out_features = self.gemms()[gemm]
        name = self.role_name(gemm)
        cached = per_recipe.get(gemm)
        if cached is not None and cached.plan["name"] == name:
            return cached
        dtype = self._parameter_dtype()  # what a recipe factory sees as QuantizerRole.dtype
        plan = dict(recipe.plan_linear(self.MODULE_TYPE, name, in_features, out_features,
                                       max(1, tokens), dtype=dtype))
        # Which GEMMs the quantizers' pairing runs natively on a GPU (the CUDA path plans for
        # sm90), for a token count the native GEMMs accept: the backward's stream decision.
        gpu_tokens = -(-max(1, tokens) // 128) * 128
        gpu = recipe.plan_linear(self.MODULE_TYPE, name, in_features, out_features, gpu_tokens,
                                 "sm90", dtype=dtype)
        native_on_gpu = frozenset(k for k in _GEMM_KINDS if gpu[k].path == _C.GemmPath.native)
        # And which it emulates there (decoded operands: linear_gemms.decoded_usage).
        emulated_on_gpu = frozenset(k for k in _GEMM_KINDS
                                    if gpu[k].path == _C.GemmPath.emulated)
        roles = LinearRoles(input=plan.pop("input"), weight=plan.pop("weight"),
                            grad_output=plan.pop("grad_output"),
                            plan={**plan, "name": name, "out_features": out_features,
                                  "native_on_gpu": native_on_gpu,
                                  "emulated_on_gpu": emulated_on_gpu})
        # Linears reading the same input under this stateless spec share its quantization.
        roles.plan["input_share"] = share_key(roles.input)
        per_recipe[gemm] = roles
        _telemetry.note_quantizers((roles.input, roles.weight, roles.grad_output),
                                   recipe.telemetry)
        return roles

    def resolve_roles(self, recipe: Recipe) -> Dict[str, LinearRoles]:
        """The roles of every GEMM under `recipe` (``qrecipe.convert(model, recipe)`` calls
        this so a recipe that cannot serve a module fails at conversion): resolved, planned,
        and each quantizer tried once on a small tensor of the module's dtype and device, so
        a format that cannot take them (NVFP4's Hadamard transform needs bf16) is refused
        here with the format's own explanation rather than at the first step."""
        roles = {gemm: self.roles(recipe, gemm=gemm) for gemm in self.gemms()}
        p = next((p for p in self.parameters() if p.is_floating_point()), None)
        if p is None or p.device.type == "meta":
            return roles
        probe = torch.zeros(32, 32, dtype=p.dtype, device=p.device)
        for gemm, r in roles.items():
            for tensor_type in _ROLE_TYPES:
                q = getattr(r, tensor_type)
                if q is None:
                    continue
                try:
                    # Both directions, as training needs them; an explicit call offset leaves
                    # a stochastic-rounding counter where it was.
                    q.quantize(probe, 3, rng_offset=0)
                except _C.QrecipeError as error:
                    raise _C.QrecipeError(
                        f"{self._who()}: recipe '{recipe.name}' cannot train this module in "
                        f"{p.dtype} on {p.device}: its {tensor_type} role "
                        f"({self.MODULE_TYPE}:{tensor_type}@{self.role_name(gemm)}) gets "
                        f"{q.describe()}, which refuses a {p.dtype} tensor: {error}. Convert "
                        f"the model to a dtype the format takes (model.to(torch.bfloat16)) "
                        f"or use a recipe without that option") from None
        return roles

    def _parameter_dtype(self) -> Optional[torch.dtype]:
        p = next((p for p in self.parameters() if p.is_floating_point()), None)
        return None if p is None else p.dtype

    def explain(self, recipe=None) -> str:
        """Which quantizer each role of each GEMM gets and how each GEMM runs (on the CPU).
        `recipe`: a Recipe, a path, a dict, or None for the default recipe."""
        recipe = as_recipe(recipe)
        lines: List[str] = []
        for gemm in self.gemms():
            r = self.roles(recipe, gemm=gemm)
            lines.append(f"{self.MODULE_TYPE} {self.role_name(gemm) or '<unnamed>'} "
                         f"under recipe {recipe.name}:")
            for role in _ROLE_TYPES:
                q = getattr(r, role)
                lines.append(f"  {role:<12} {'none' if q is None else q.describe()}")
            for kind in _GEMM_KINDS:
                lines.append(f"  {kind:<12} {r.plan[kind]}")
        lines.extend(self._explain_notes())
        return "\n".join(lines)

    def _explain_notes(self) -> List[str]:
        """Extra lines a module adds to explain() (how its GEMMs share roles, ...)."""
        return []

    # ---------------------------------------------------------------- forward helpers
    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                gemm: str = "", is_first_microbatch: Optional[bool] = None,
                fuse_wgrad_accumulation: bool = False,
                weight_group: Optional[Tuple[torch.Tensor, int]] = None,
                weight_operand=None, recipe=_RESOLVE) -> torch.Tensor:
        """``y = x W^T + b`` for GEMM `gemm` under the active recipe: torch's F.linear when
        nothing is quantized, else the quantized GEMMs of ``quantized_linear`` (with its
        weight caching across micro-batches and FP32 main_grad accumulation).
        `weight_group`: ``(parameter, index)`` when `weight` is rows of a grouped parameter
        (the weight cache keeps its entry there). `weight_operand`: `weight` already quantized
        by the caller for this call (GroupedLinear's grouped quantization), used as is.
        `recipe`: the recipe the caller already resolved for this call with
        :meth:`_gemm_recipe` (None: high precision); by default this call resolves it."""
        in_features = weight.shape[1]
        tokens = x.numel() // in_features if in_features else 0
        if recipe is _RESOLVE:
            recipe = self._gemm_recipe(gemm, tokens)
        if recipe is None:
            return F.linear(x, weight, bias)
        roles = self.roles(recipe, tokens, gemm)
        if roles.all_none:
            return F.linear(x, weight, bias)
        # Before the step is noted: a refused capture leaves the scaling update as it was.
        refuse_graph_capture(x, "forward", roles.plan.get("name", ""))
        if _is_dtensor(x) or _is_dtensor(weight):
            if self.MODULE_TYPE != "linear":
                raise NotImplementedError(
                    f"{self._who()}: its input or weight is a DTensor; tensor / sequence "
                    "parallelism runs qrecipe.nn.Linear only (qrecipe.parallel's plan "
                    f"styles), not {type(self).__name__}. Keep this module out of the "
                    "parallelized part of the model, or build the block from Linears")
            from . import tensor_parallel  # torch.distributed.tensor only when used
            recipe.note_step_activity()
            return tensor_parallel.linear(self, x, weight, bias, roles, who=self._who(),
                                          is_first_microbatch=is_first_microbatch,
                                          fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                                          weight_operand=weight_operand)
        recipe.note_step_activity()
        return quantized_linear(x, weight, bias, roles, is_first_microbatch=is_first_microbatch,
                                fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                                who=self._who(), weight_group=weight_group,
                                weight_operand=weight_operand,
                                scaling_generation=self._scaling_generation(recipe))

    @staticmethod
    def _scaling_generation(recipe: Recipe) -> int:
        """The recipe's count of delayed-scale changes, for the weight cache; not read while
        torch.compile traces (the compiled path has no weight cache, and a guard on a value
        that advances every step would recompile every step)."""
        if torch.compiler.is_compiling():
            return 0
        return recipe.scaling_generation

    def _gemm_recipe(self, gemm: str = "", tokens: int = 1) -> Optional[Recipe]:
        """The recipe GEMM `gemm` runs under now (None: high precision): the active autocast
        recipe, recorded when the call runs inside a checkpointed segment, or the recorded one
        when torch.utils.checkpoint recomputes the segment during backward
        (recomputation.py). Every GEMM of a module asks here once per call."""
        if torch.compiler.is_compiling():
            return _autocast.current_recipe()  # dynamo guards on the autocast state
        return _recompute.gemm_recipe(self, gemm, self._who(),
                                      lambda recipe: self.roles(recipe, tokens, gemm))

    def _peek_recipe(self, gemm: str = "") -> Optional[Recipe]:
        """What :meth:`_gemm_recipe` would return for the module's next GEMM, without
        recording or replaying (the input checks run before the GEMM)."""
        if torch.compiler.is_compiling():
            return _autocast.current_recipe()
        return _recompute.peek_recipe(self, gemm)

    def _who(self) -> str:
        kind = f"qrecipe.nn.{type(self).__name__}"
        return f"{kind} {self.name!r}" if self.name else kind

    def _check_input(self, x: torch.Tensor, in_features: int,
                     weights: Tuple[torch.Tensor, ...] = (), what: str = "in_features") -> None:
        """Type and last dimension always (cheap, and clearer than torch's own messages);
        the dtypes of `x` and `weights` only under autocast, where the engine reads them."""
        who = self._who()
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != in_features:
            raise ValueError(f"{who}: input of shape {tuple(x.shape)} does not end in "
                             f"{what}={in_features}")
        if self._peek_recipe() is None:
            return
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{who}: input dtype {x.dtype} is not supported under "
                            "qrecipe.autocast; use float32, bfloat16 or float16")
        for w in weights:
            if w.dtype not in SUPPORTED_DTYPES:
                raise TypeError(f"{who}: weight dtype {w.dtype} is not supported; use "
                                "float32, bfloat16 or float16")

    # ---------------------------------------------------------------- copy / pickle
    # The role cache holds engine objects: never copied or pickled (a copy re-resolves).
    def __getstate__(self):
        state = super().__getstate__().copy()
        state["_roles"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._roles = weakref.WeakKeyDictionary()

    def _name_repr(self) -> str:
        return f", name={self.name!r}" if self.name else ""
