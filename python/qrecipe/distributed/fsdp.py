"""FSDP2 (``torch.distributed.fsdp.fully_shard``) with quantized parameters (docs/adapter.md,
"FSDP2").

    with torch.device("meta"), qrecipe.quantized_model_init(recipe):
        model = build_model()                          # QuantizedWeight parameters, no bytes
    for block in model.blocks:
        qrecipe.distributed.fully_shard(block)
    qrecipe.distributed.fully_shard(model)
    model.to_empty(device="cuda"); model.reset_parameters()   # quantized shards

What makes it work lives on ``QuantizedWeight`` itself (quantized_param.py), so torch's own
``fully_shard`` works on a quantized model too: its dim-0 ops keep shards quantized, its FSDP2
extension hooks all-gather the quantized bytes (quantized_shards.py), and ``copy_`` into a
shard of a per-tensor-scaled format all-reduces the amax. This module adds what only a
sharding call knows:

- :func:`fully_shard` checks, before torch shards anything, that no shard boundary would cut a
  scale block (an error naming each parameter and the multiple its first dimension needs);
  records on every quantized shard the process group holding the other rows (the amax
  group: needed before the first all-gather, e.g. by ``reset_parameters`` after meta-device
  init) and whether FSDP2 reshards it after the forward (then the forward all-gathers the
  rowwise copy only; otherwise it takes the columnwise copy for the backward too).
- :func:`shard_problems`: the same check, as a list of messages.
- :func:`set_amax_group` for shards made by other means.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..quantized_param import QuantizedWeight


def _torch_fully_shard():
    """torch's fully_shard, wherever this torch keeps it (2.6+: torch.distributed.fsdp)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            raise ImportError("qrecipe.distributed.fully_shard needs torch's FSDP2 "
                              "(torch.distributed.fsdp.fully_shard, torch >= 2.4)") from None
    return fully_shard


def _local(param: torch.Tensor) -> torch.Tensor:
    return getattr(param, "_local_tensor", param)


def shard_problems(module: torch.nn.Module, world_size: int) -> List[str]:
    """Why sharding `module`'s quantized parameters (not sharded yet) along dim 0 over
    `world_size` ranks would cut a scale block, one message per parameter ([] when none):
    each rank's rows must be a whole number of the format's row multiple (counted from the
    start of each row group of a grouped weight)."""
    problems = []
    for name, param in module.named_parameters():
        if not isinstance(param, QuantizedWeight) or world_size <= 1:
            continue
        rows = param.shape[0]
        storage = param._qstorage
        per_rank, left = divmod(storage.rows, world_size)
        multiple = param.row_multiple
        groups = f", {param.num_groups} row groups of {storage.group_rows[0]}" \
            if param.num_groups > 1 else ""
        what = (f"parameter '{name}' ({param.format}, shape {list(param.shape)}{groups})")
        if left:
            problems.append(f"{what}: {rows} rows do not split evenly over {world_size} ranks; "
                            f"quantized weights are sharded evenly: the first dimension must "
                            f"be a multiple of {world_size} x {multiple}")
            continue
        for r in range(1, world_size):
            try:
                storage.check_cut(r * per_rank, "fully_shard")
            except ValueError:
                problems.append(
                    f"{what}: sharding over {world_size} ranks cuts it at row {r * per_rank}, "
                    f"inside a scale block ({param.format} needs cuts at multiples of "
                    f"{multiple} rows{' within each row group' if groups else ''}); the first "
                    f"dimension must be a multiple of {world_size} x {multiple} = "
                    f"{world_size * multiple} (or shard over fewer ranks, or pad the layer)")
                break
    return problems


def _shard_group(mesh):
    """The process group of the mesh dimension FSDP2 shards over (the last one: HSDP's
    meshes are (replicate, shard))."""
    return mesh.get_group(mesh.ndim - 1) if mesh.ndim > 1 else mesh.get_group()


def set_amax_group(param: torch.Tensor, group) -> None:
    """Records `group` (the ranks holding the other rows) on a quantized shard (a DTensor over
    a QuantizedWeight, or the QuantizedWeight), for the amax all-reduce of its
    requantization."""
    local = _local(param)
    if not isinstance(local, QuantizedWeight):
        raise TypeError(f"set_amax_group takes a QuantizedWeight or a DTensor of one, got "
                        f"{type(local).__name__}")
    local._qstorage.amax_group = group


def fully_shard(module: torch.nn.Module, *, mesh=None,
                reshard_after_forward: Optional[bool] = None, **kwargs):
    """torch's ``fully_shard(module, mesh=..., reshard_after_forward=..., **kwargs)`` for a
    module with quantized parameters: refuses shard boundaries that would cut a scale block
    (a ValueError listing every such parameter, before anything is sharded), then records
    on each quantized shard its amax group and `reshard_after_forward` (see the module).
    Returns what torch's returns."""
    torch_fully_shard = _torch_fully_shard()
    if mesh is not None:
        world_size = mesh.size(mesh.ndim - 1) if mesh.ndim > 1 else mesh.size()
    else:
        import torch.distributed as dist
        world_size = dist.get_world_size() if dist.is_initialized() else 1
    problems = shard_problems(module, world_size)
    if problems:
        raise ValueError("qrecipe.distributed.fully_shard: quantized parameters cannot be "
                         "sharded as asked:\n  " + "\n  ".join(problems))
    if reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = reshard_after_forward
    result = torch_fully_shard(module, mesh=mesh, **kwargs)
    for param in module.parameters():
        local = _local(param)
        if isinstance(local, QuantizedWeight) and local is not param:
            storage = local._qstorage
            storage.amax_group = _shard_group(mesh if mesh is not None else param.device_mesh)
            if reshard_after_forward is not None:
                storage.reshard_after_forward = bool(reshard_after_forward)
    return result
