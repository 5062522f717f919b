"""Tensor / sequence parallelism is not implemented for qrecipe modules yet: torch's DTensor
plans refuse them (they are not torch.nn.Linear subclasses), and a qrecipe GEMM given a
DTensor under autocast is a clear error instead of running the engine on a DTensor."""
import os

import pytest
import torch
import torch.distributed as dist

import qrecipe

pytest.importorskip("torch.distributed.tensor")


@pytest.fixture
def one_rank_group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_dtensor_operands_are_refused(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    layer = qrecipe.nn.Linear(32, 16, name="fc")
    layer.weight = torch.nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
    x = distribute_tensor(torch.randn(4, 32), mesh, [Shard(0)])
    with qrecipe.autocast(), pytest.raises(NotImplementedError, match="DTensor"):
        layer(x)


def test_torch_plans_refuse_qrecipe_modules(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (1,))
    with pytest.raises(NotImplementedError, match="nn.Linear"):
        parallelize_module(qrecipe.nn.Linear(32, 16, name="fc"), mesh, ColwiseParallel())
