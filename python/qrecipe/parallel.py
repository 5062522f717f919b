"""Tensor and sequence parallelism plan styles for qrecipe modules, for torch's
``parallelize_module`` (docs/adapter.md, "Tensor and sequence parallelism").

    from torch.distributed.tensor.parallel import parallelize_module, SequenceParallel
    from qrecipe.parallel import ColwiseParallel, RowwiseParallel

    parallelize_module(block, tp_mesh, {
        "norm": SequenceParallel(),                                  # torch's, unchanged
        "gate": ColwiseParallel(input_layouts=Shard(1)),             # quantized all-gather
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),            # reduce-scatter
    })

They are torch's ``ColwiseParallel`` / ``RowwiseParallel`` (same arguments, same parameter
sharding: Shard(0) weight and bias; Shard(1) weight and Replicate bias), extended to
``qrecipe.nn.Linear``; torch's own styles accept only ``torch.nn.Linear`` and
``torch.nn.Embedding`` and refuse a qrecipe module. Other modules (torch's Linear, Embedding)
get torch's behaviour. Differences for a qrecipe Linear:

- a sequence-sharded input (``ColwiseParallel(input_layouts=Shard(d))``) reaches the module
  sharded: the module quantizes its rows and all-gathers the quantized bytes and scales
  instead of torch gathering the high-precision input (nn/tensor_parallel.py);
- per-tensor scales of sharded operands come from the amax reduced over the TP group.
The quantized GEMMs and what they refuse are nn/tensor_parallel.py's.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise
from torch.distributed.tensor.parallel.style import distribute_module

from .nn import Linear, QuantizedModule

__all__ = ["ColwiseParallel", "RowwiseParallel"]


def _check_module(module: torch.nn.Module, style: str) -> None:
    if isinstance(module, QuantizedModule) and not isinstance(module, Linear):
        raise NotImplementedError(
            f"qrecipe.parallel.{style}: {type(module).__name__} {module.name!r} is not "
            "supported; tensor parallelism runs qrecipe.nn.Linear only. Build the block from "
            "Linears (qrecipe.convert of a Hugging Face model does) or keep this module "
            "replicated")


class ColwiseParallel(_TorchColwise):
    """torch's ColwiseParallel, also for ``qrecipe.nn.Linear``: weight and bias Shard(0), the
    output sharded on the last dimension. With ``input_layouts=Shard(d)`` (sequence
    parallelism) the qrecipe Linear gathers its quantized input itself."""

    def _apply(self, module: torch.nn.Module, device_mesh):
        _check_module(module, "ColwiseParallel")
        if not isinstance(module, Linear):
            return super()._apply(module, device_mesh)
        sharded_input = isinstance(self.input_layouts[0], Shard)
        desired = self.input_layouts if sharded_input else (Replicate(),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, desired),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class RowwiseParallel(_TorchRowwise):
    """torch's RowwiseParallel, also for ``qrecipe.nn.Linear``: weight Shard(1), bias
    Replicate, the input sharded on its last dimension; the partial output is all-reduced
    (``output_layouts=Replicate()``) or reduce-scattered (``Shard(d)``) by torch."""

    def _apply(self, module: torch.nn.Module, device_mesh):
        _check_module(module, "RowwiseParallel")
        if not isinstance(module, Linear):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))
