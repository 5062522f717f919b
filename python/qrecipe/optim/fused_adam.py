"""``qrecipe.optim.FusedAdam``: Adam / AdamW with FP32 master weights, for a mix of plain
parameters and quantized ones (``qrecipe.QuantizedWeight``; docs/adapter.md, "Optimizer").

    with qrecipe.quantized_model_init(recipe, keep_init_values=True):
        model = build_model()                      # GEMM weights stored quantized
    opt = qrecipe.optim.FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    ...
    loss.backward()
    opt.step()                                     # masters updated, weights requantized
    opt.zero_grad()

State per parameter (``optimizer.state[p]``): ``step`` (float32 scalar tensor; on the CPU, on
the parameter's device with ``capturable=True``), ``exp_avg`` and ``exp_avg_sq`` (the
parameter's shape, ``exp_avg_dtype`` / ``exp_avg_sq_dtype``), and ``master`` (FP32, the
parameter's shape) for a QuantizedWeight and for a BF16/FP16 parameter with
``master_weights=True``. An FP32 parameter is its own master. The keys and the layout of
``state_dict()`` are torch's, so a ``torch.optim.AdamW`` state dict loads for plain parameters.

The arithmetic is the engine's (qrecipe/adam.hpp; the CPU and CUDA paths agree bit for bit):
the step runs as ``_C.adam_step`` per device, all tensors of the device in one engine call
(on CUDA: one multi-tensor launch for the plain parameters, one per format for the quantized
ones; engine/include/qrecipe/optim.hpp).

DTensor parameters (FSDP2's ``fully_shard``, tensor parallelism) are stepped through their
local shards; their state tensors are DTensors of the parameter's mesh and placements, so
``torch.distributed.checkpoint`` saves and reshards them. A QuantizedWeight shard whose format
keeps its scales inside blocks the shard does not cut (mxfp8, blockwise) takes the fused path
as a whole weight does: its bytes are the rows of quantizing the whole master. A shard of a
format with a per-tensor scale or amax (float8 current and delayed, nvfp4, hybrid with such a
side) needs the amax of the whole new master: its master is updated, then all such shards are
quantized by ONE ``qrecipe.quantized_param.requantize_`` call (one amax all-reduce per process
group), after the other parameters' step. Every rank must step the same parameters (SPMD).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .._engine import _C
from ..quantized_param import QuantizedWeight, requantize_

try:  # FSDP2 / tensor parallelism: the step touches a DTensor's local shard
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # pragma: no cover - torch built without distributed
    _DTensor = None

_VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MOMENT_DTYPES = (torch.float32, torch.bfloat16)
_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "master")
_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "adam_w_mode")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a step reads and writes: a DTensor's local shard, else the tensor itself."""
    if _DTensor is not None and isinstance(tensor, _DTensor):
        return tensor.to_local()  # a view of the shard's memory: the step writes through it
    return tensor


def _as_param(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """A state tensor made for a parameter's local tensor, as the parameter holds it: a
    DTensor with the parameter's mesh and placements when the parameter is one (so
    ``state_dict()`` holds DTensors and torch.distributed.checkpoint saves and reshards it),
    else the tensor itself."""
    if _DTensor is not None and isinstance(p, _DTensor):
        return _DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                   shape=p.shape, stride=p.stride())
    return local


def _shared_amax_shard(local: torch.Tensor) -> bool:
    """A QuantizedWeight shard whose requantization needs the amax of rows other ranks hold
    (float8 current and delayed, nvfp4's tensor scale, a hybrid side with one): the step
    updates its master, then quantizes all such shards with ONE amax all-reduce per process
    group (qrecipe.quantized_param.requantize_). Delayed scaling too: its data is cast with
    its state's scale, but the tensor keeps the amax it was quantized from, which the gathered
    weight's row ranges must share (the all-gather refuses ranges of different amaxes)."""
    return isinstance(local, QuantizedWeight) and local.needs_shared_amax


def _in_place_target(local: "QuantizedWeight") -> Optional[List[Any]]:
    """The engine tensors the fused step writes for a QuantizedWeight: one per row group,
    each the storage's own piece (so the parameter sees the new bytes). None where a group
    is not one piece here (a shard holding finer pieces): it then takes requantize_."""
    storage = local._qstorage
    if not local._whole():
        return None
    storage.join_pieces()
    if not storage.canonical:
        return None
    return [piece._cpp for piece in storage.pieces]


def _check_hyperparameters(lr, betas, eps, weight_decay, where: str) -> None:
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1 or not lr.is_floating_point():
            raise ValueError(f"{where}: a tensor lr must hold one floating-point value, got "
                             f"{lr.dtype} of shape {tuple(lr.shape)}")
    elif not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr >= 0.0:
        raise ValueError(f"{where}: lr must be a number >= 0 (or a tensor), got {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or \
            not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{where}: betas must be two numbers in [0, 1), got {betas!r}")
    if not isinstance(eps, (int, float)) or not eps >= 0.0:
        raise ValueError(f"{where}: eps must be a number >= 0, got {eps!r}")
    if not isinstance(weight_decay, (int, float)) or not weight_decay >= 0.0:
        raise ValueError(f"{where}: weight_decay must be a number >= 0, got {weight_decay!r}")


class FusedAdam(torch.optim.Optimizer):
    """Adam (``adam_w_mode=False``: L2 decay added to the gradient) or AdamW (default:
    decoupled decay) with FP32 master weights.

    Args:
        params: parameters or parameter groups (named parameters name them in errors); each
            group may set its own ``lr``, ``betas``, ``eps``, ``weight_decay``, ``adam_w_mode``.
            Plain parameters may be float32, bfloat16 or float16; ``qrecipe.QuantizedWeight``
            parameters of every format (grouped ones included) are updated through an FP32
            master and requantized from it after every step; DTensors of either (FSDP2
            shards) through their local shards (see the module). Parameters that do not
            require grad, or have no gradient, are skipped.
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (``lr`` may be a tensor; with
            ``capturable=True`` a float32 tensor on the parameters' device is read by the step
            when it runs).
        adam_w_mode: True: decoupled weight decay (AdamW); False: L2, ``g + weight_decay * p``.
        master_weights: keep an FP32 master for BF16/FP16 parameters (the parameter is then
            its rounded copy). Must be True when a QuantizedWeight is trained.
        capturable: step counts on the parameters' device and read there, so a CUDA graph
            can capture the step (run one eager step first: it creates the state). Refused
            for a QuantizedWeight shard of a per-tensor-scaled format (its amax all-reduce
            is a collective outside the engine's step, and formats without the device-amax
            extras, such as hybrid, copy the amax through the host).
        exp_avg_dtype, exp_avg_sq_dtype: torch.float32 or torch.bfloat16.

    Gradients: ``p.main_grad`` when the parameter has one (``fuse_wgrad_accumulation``), else
    ``p.grad``; float32, bfloat16 or float16, read as they are (never reinterpreted), of the
    parameter's shape. A NaN or Inf gradient element propagates like in torch.optim.AdamW: it
    makes that element's moments and master NaN/Inf, and the quantized weight encodes them as
    its format does. To skip such steps, use ``torch.amp.GradScaler``: its ``step(opt)``
    unscales the gradients, finds non-finite ones and then does not call ``opt.step()``
    (tested; the masters, moments, step counts and quantized bytes stay as they were).
    """

    def __init__(self, params, lr=1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, adam_w_mode: bool = True,
                 master_weights: bool = True, capturable: bool = False,
                 exp_avg_dtype: torch.dtype = torch.float32,
                 exp_avg_sq_dtype: torch.dtype = torch.float32):
        _check_hyperparameters(lr, betas, eps, weight_decay, "FusedAdam")
        for what, dtype in (("exp_avg_dtype", exp_avg_dtype),
                            ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dtype not in _MOMENT_DTYPES:
                raise TypeError(f"FusedAdam: {what} must be torch.float32 or torch.bfloat16, "
                                f"got {dtype}")
        self.master_weights = bool(master_weights)
        self.capturable = bool(capturable)
        self.exp_avg_dtype = exp_avg_dtype
        self.exp_avg_sq_dtype = exp_avg_sq_dtype
        # False: quantized parameters take the two-pass path (update, then quantize) even
        # where their format fuses the step; the bytes are the same (tests, benchmarks).
        self._fused = True
        # The path of each parameter's last step ({name: "plain" | "fused" | "two_pass"}).
        self.last_paths: Dict[str, str] = {}
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        adam_w_mode=bool(adam_w_mode))
        super().__init__(params, defaults)

    # ------------------------------------------------------------ parameters
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        _check_hyperparameters(group["lr"], group["betas"], group["eps"],
                               group["weight_decay"], f"FusedAdam parameter group {index}")
        for position, p in enumerate(group["params"]):
            self._check_parameter(p, self._name(index, position))

    def _name(self, group_index: int, position: int) -> str:
        group = self.param_groups[group_index]
        p = group["params"][position]
        names = group.get("param_names")
        label = f"'{names[position]}'" if names else f"#{position}"
        local = getattr(p, "_local_tensor", p)  # a DTensor: what its shards are
        kind = f"QuantizedWeight {local.format}" if isinstance(local, QuantizedWeight) else \
            str(p.dtype)
        if local is not p:
            kind += f", DTensor shard of shape {list(local.shape)}"
        return (f"parameter {label} (group {group_index}, index {position}, shape "
                f"{list(p.shape)}, {kind})")

    def _check_parameter(self, p: torch.Tensor, name: str) -> None:
        if isinstance(_local(p), QuantizedWeight):
            if not self.master_weights:
                raise ValueError(
                    f"FusedAdam(master_weights=False) cannot train {name}: a QuantizedWeight "
                    "is stored quantized, so its updates accumulate in an FP32 master weight. "
                    "Use master_weights=True (the default)")
            if self.capturable and _shared_amax_shard(_local(p)):
                raise NotImplementedError(
                    f"FusedAdam(capturable=True) cannot train {name}: it is a shard (FSDP2 / "
                    "DTensor) of a QuantizedWeight whose format has a per-tensor scale or amax, "
                    "so each step all-reduces the amax of the new master over the shard group "
                    "in a collective outside the engine's step (and through the host for "
                    "formats without the device-amax extras), which this step does not capture "
                    "yet. Use capturable=False, or a block-scaled format (mxfp8, blockwise) for "
                    "sharded weights")
            return
        if p.dtype not in _VALUE_DTYPES:
            raise TypeError(f"FusedAdam: {name} has dtype {p.dtype}; FusedAdam updates "
                            "float32, bfloat16 and float16 parameters")

    @staticmethod
    def _gradient(p: torch.Tensor) -> Optional[torch.Tensor]:
        main_grad = getattr(p, "main_grad", None)
        return main_grad if main_grad is not None else p.grad

    @staticmethod
    def _checked_gradient(grad: torch.Tensor, local: torch.Tensor, name: str) -> torch.Tensor:
        grad = _local(grad)
        if isinstance(grad, QuantizedWeight):
            # zeros_like(param) of a quantized parameter (what torch.distributed.checkpoint's
            # get/set_optimizer_state_dict set as gradients to create the state): read as the
            # values it holds
            grad = grad._decode()
        if grad.layout != torch.strided:
            raise RuntimeError(f"FusedAdam: the gradient of {name} is {grad.layout}; FusedAdam "
                               "takes dense gradients")
        if grad.dtype not in _VALUE_DTYPES:
            raise TypeError(f"FusedAdam: the gradient of {name} has dtype {grad.dtype}; "
                            "expected torch.float32, torch.bfloat16 or torch.float16")
        if tuple(grad.shape) != tuple(local.shape):
            raise ValueError(f"FusedAdam: the gradient of {name} has shape "
                             f"{list(grad.shape)}, but the parameter has shape "
                             f"{list(local.shape)}; a gradient (.grad or .main_grad) must have "
                             "its parameter's shape")
        if grad.device != local.device:
            raise ValueError(f"FusedAdam: the gradient of {name} is on {grad.device}, the "
                             f"parameter on {local.device}")
        return grad if grad.is_contiguous() else grad.contiguous()

    # ------------------------------------------------------------ state
    def _initial_master(self, p: torch.Tensor, local: torch.Tensor) -> Optional[torch.Tensor]:
        """The FP32 master a parameter starts from: a QuantizedWeight's kept initial value
        (quantized_model_init(keep_init_values=True)), which it then drops, or its dequantized
        value; a BF16/FP16 parameter's value (with master_weights); none for FP32 ones."""
        if isinstance(local, QuantizedWeight):
            # A shard (FSDP2) keeps its rows' initial value on the DTensor's own local tensor
            # (to_local() may return another object over the same bytes).
            holder = p if isinstance(p, QuantizedWeight) else getattr(p, "_local_tensor", local)
            init = holder.get_high_precision_init_val()
            if init is not None and tuple(init.shape) == tuple(local.shape):
                master = init.to(device=local.device, dtype=torch.float32, copy=True)
                holder.clear_high_precision_init_val()
            else:
                master = local.dequantize(torch.float32).detach()
            return master.contiguous()
        if self.master_weights and local.dtype != torch.float32:
            return local.detach().to(torch.float32).contiguous()
        return None

    def _new_state(self, p: torch.Tensor, local: torch.Tensor) -> Dict[str, torch.Tensor]:
        step_device = local.device if self.capturable else torch.device("cpu")
        state = {
            "step": torch.zeros((), dtype=torch.float32, device=step_device),
            "exp_avg": torch.zeros(local.shape, dtype=self.exp_avg_dtype, device=local.device),
            "exp_avg_sq": torch.zeros(local.shape, dtype=self.exp_avg_sq_dtype,
                                      device=local.device),
        }
        master = self._initial_master(p, local)
        if master is not None:
            state["master"] = master
        return {k: v if k == "step" else _as_param(p, v) for k, v in state.items()}

    # ------------------------------------------------------------ the step
    def _hyper(self, group: Dict[str, Any], state: Dict[str, torch.Tensor],
               local: torch.Tensor, name: str) -> tuple:
        lr, lr_tensor = group["lr"], None
        if isinstance(lr, torch.Tensor):
            if self.capturable:
                if lr.dtype != torch.float32 or lr.device != local.device:
                    raise ValueError(f"FusedAdam(capturable=True): the lr tensor of {name}'s "
                                     f"group is {lr.dtype} on {lr.device}; pass a float32 "
                                     f"tensor on {local.device} (or a float)")
                lr_tensor, lr = lr, 0.0
            else:
                lr = float(lr)
        step = state["step"]
        beta1, beta2 = group["betas"]
        return (float(lr), lr_tensor, float(beta1), float(beta2), float(group["eps"]),
                float(group["weight_decay"]), bool(group["adam_w_mode"]),
                0 if self.capturable else int(step.item()),
                step if self.capturable else None)

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step over every parameter that has a gradient (see the class)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pending = []
        for group_index, group in enumerate(self.param_groups):
            for position, p in enumerate(group["params"]):
                grad = self._gradient(p)
                if grad is None or not p.requires_grad:
                    continue
                name = self._name(group_index, position)
                self._check_parameter(p, name)
                local = _local(p)
                grad = self._checked_gradient(grad, local, name)
                if not isinstance(local, QuantizedWeight) and not local.is_contiguous():
                    raise RuntimeError(f"FusedAdam: {name} is not contiguous; the step writes "
                                       "it in place (from its FP32 master when it has one)")
                state = self.state[p]
                if not state:
                    state.update(self._new_state(p, local))
                pending.append((p, local, grad, state, group, name))
        if not pending:
            return loss
        torch._foreach_add_([item[3]["step"] for item in pending], 1.0)

        by_device: Dict[torch.device, List[tuple]] = {}
        written: List[torch.Tensor] = []
        shared: List[Tuple[torch.Tensor, torch.Tensor, str]] = []  # (param, master, name)
        for p, local, grad, state, group, name in pending:
            state = {k: _local(v) for k, v in state.items()}  # a DTensor's state: its shard
            master = state.get("master")
            if isinstance(local, QuantizedWeight):
                target = None if _shared_amax_shard(local) else _in_place_target(local)
                param = master
                if target is None:  # the master here; its bytes after every device's step
                    shared.append((p, master, name))
            elif master is not None:
                param, target = master, local
                written.append(local)
            else:
                param, target = local, None
            written += [param, state["exp_avg"], state["exp_avg_sq"]]
            by_device.setdefault(local.device, []).append(
                (name, param, grad, state["exp_avg"], state["exp_avg_sq"], target,
                 self._hyper(group, state, local, name)))
        paths: Dict[str, str] = {}
        for entries in by_device.values():
            result = _C.adam_step(entries, fused=self._fused, capturable=self.capturable)
            paths.update(zip((entry[0] for entry in entries), result))
        if shared:
            # Shards of per-tensor-scaled formats: quantized from their new masters with the
            # amax of the whole new master (one all-reduce per process group for all of
            # them), so each shard's bytes are the rows of quantizing the whole master.
            requantize_([p for p, _, _ in shared], [m for _, m, _ in shared])
            paths.update((name, "two_pass") for _, _, name in shared)
            written += [_local(p) for p, _, _ in shared]
        self.last_paths = paths
        # The engine wrote these tensors behind autograd's back: caches keyed by _version
        # (the modules' weight cache) must see the change.
        torch.autograd.graph.increment_version(written)
        return loss

    def requantize_paths(self) -> Dict[str, Tuple[str, str]]:
        """For every QuantizedWeight parameter: (path, reason) of its requantization on its
        device, 'fused' (its format's plugin updates and requantizes it in the same pass) or
        'two_pass' (update, then quantize: the same bytes; the reason says why)."""
        out = {}
        for group_index, group in enumerate(self.param_groups):
            for position, p in enumerate(group["params"]):
                local = _local(p)
                if not isinstance(local, QuantizedWeight):
                    continue
                if _shared_amax_shard(local):
                    out[self._name(group_index, position)] = (
                        "two_pass", "a shard (FSDP2) of a format with a per-tensor scale or "
                        "amax: the new masters' amax is all-reduced over the shard group, then "
                        "quantized (qrecipe.quantized_param.requantize_)")
                    continue
                quantizer = local._qstorage.quantizer
                path, why = _C.adam_path(quantizer, str(local.device), self.capturable)
                out[self._name(group_index, position)] = (path if self._fused else "two_pass",
                                                          why if self._fused else "fused=False")
        return out

    # ------------------------------------------------------------ checkpoints
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads ``state_dict()`` of a FusedAdam (masters, moments and steps bit for bit) or of
        a ``torch.optim.AdamW`` / ``torch.optim.Adam`` (plain parameters: their moments and
        steps; a BF16/FP16 parameter's master then starts from its current value). The
        groups' hyperparameters are taken from the dict. Every tensor is copied into the
        optimizer's own (its moment dtypes, the parameters' devices). A QuantizedWeight needs
        its master in the dict; amsgrad or maximize state is refused."""
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"FusedAdam.load_state_dict: the dict has {len(saved_groups)} "
                             f"parameter groups, this optimizer {len(self.param_groups)}")
        new_state: Dict[torch.Tensor, Dict[str, torch.Tensor]] = {}
        for group_index, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"FusedAdam.load_state_dict: group {group_index} of the dict "
                                 f"has {len(saved['params'])} parameters, this optimizer's "
                                 f"{len(group['params'])}")
            for key in ("amsgrad", "maximize"):
                if saved.get(key):
                    raise ValueError(f"FusedAdam.load_state_dict: group {group_index} of the "
                                     f"dict was saved with {key}=True, which FusedAdam does "
                                     "not implement")
            for position, (saved_id, p) in enumerate(zip(saved["params"], group["params"])):
                if saved_id in state_dict["state"]:
                    name = self._name(group_index, position)
                    new_state[p] = self._loaded_state(p, state_dict["state"][saved_id], name)
        # Nothing is changed before every parameter's state has been read and checked.
        for group, saved in zip(self.param_groups, saved_groups):
            for key in _GROUP_KEYS:
                if key in saved:
                    group[key] = tuple(saved[key]) if key == "betas" else saved[key]
            if "decoupled_weight_decay" in saved and "adam_w_mode" not in saved:
                group["adam_w_mode"] = bool(saved["decoupled_weight_decay"])
            if "param_names" in saved:
                group["param_names"] = saved["param_names"]
        self.state.clear()
        self.state.update(new_state)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def _loaded_state(self, p: torch.Tensor, saved: Dict[str, Any],
                      name: str) -> Dict[str, torch.Tensor]:
        unknown = sorted(set(saved) - set(_STATE_KEYS))
        if unknown:
            raise ValueError(f"FusedAdam.load_state_dict: the state of {name} holds {unknown}, "
                             f"which FusedAdam does not keep (it keeps {list(_STATE_KEYS)}; "
                             "amsgrad is not implemented)")
        local = _local(p)
        fresh = self._new_state(p, local) if "master" not in saved else None
        state: Dict[str, torch.Tensor] = {}
        step = saved.get("step", 0.0)
        step_device = local.device if self.capturable else torch.device("cpu")
        state["step"] = torch.as_tensor(step, dtype=torch.float32).detach().clone().to(
            step_device).reshape(())
        for key, dtype in (("exp_avg", self.exp_avg_dtype),
                           ("exp_avg_sq", self.exp_avg_sq_dtype)):
            if key not in saved:
                raise ValueError(f"FusedAdam.load_state_dict: the state of {name} has no "
                                 f"'{key}'")
            state[key] = self._copied(saved[key], p, local, dtype, key, name)
        if "master" in saved:
            if isinstance(local, QuantizedWeight) or self.master_weights and \
                    local.dtype != torch.float32:
                state["master"] = self._copied(saved["master"], p, local, torch.float32,
                                               "master", name)
            else:  # an FP32 parameter is its own master: the saved one is its value
                with torch.no_grad():
                    local.copy_(_local(self._copied(saved["master"], p, local, local.dtype,
                                                    "master", name)))
        elif isinstance(local, QuantizedWeight):
            raise ValueError(f"FusedAdam.load_state_dict: the state of {name} has no FP32 "
                             "'master'; a QuantizedWeight's master is part of its optimizer "
                             "state (save it with FusedAdam.state_dict())")
        elif fresh is not None and "master" in fresh:
            state["master"] = fresh["master"]
        return state

    @staticmethod
    def _copied(value, p: torch.Tensor, local: torch.Tensor, dtype: torch.dtype, key: str,
                name: str) -> torch.Tensor:
        """`value` copied into a new tensor of `local`'s shape and device (wrapped as `p` is:
        a DTensor parameter's state is a DTensor). A DTensor value gives its local shard (it
        must be sharded as `p` is: what torch.distributed.checkpoint loads into this
        optimizer's own state_dict()); a whole tensor of a DTensor parameter's global shape
        gives this rank's rows of it (a state dict saved by one process)."""
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"FusedAdam.load_state_dict: '{key}' of {name} is a "
                            f"{type(value).__name__}, not a tensor")
        sharded = _DTensor is not None and isinstance(p, _DTensor)
        if _DTensor is not None and isinstance(value, _DTensor):
            if not sharded or value.device_mesh != p.device_mesh or \
                    tuple(value.placements) != tuple(p.placements):
                raise ValueError(
                    f"FusedAdam.load_state_dict: '{key}' of {name} is a DTensor placed "
                    f"{tuple(value.placements)}, but the parameter is "
                    f"{tuple(p.placements) if sharded else 'not a DTensor'}; load the "
                    "checkpoint through torch.distributed.checkpoint into this optimizer's "
                    "state_dict() (it reshards), or pass whole tensors")
            value = value.to_local()
        elif sharded and tuple(value.shape) == tuple(p.shape) != tuple(local.shape):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                  p.placements)
            value = value[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
        if tuple(value.shape) != tuple(local.shape):
            raise ValueError(f"FusedAdam.load_state_dict: '{key}' of {name} has shape "
                             f"{list(value.shape)}; the parameter has {list(local.shape)}"
                             f"{' here (its local shard)' if sharded else ''}")
        out = torch.empty(local.shape, dtype=dtype, device=local.device)
        out.copy_(value)
        return _as_param(p, out)
