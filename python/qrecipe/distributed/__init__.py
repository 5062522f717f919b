"""qrecipe.distributed: qrecipe models across ranks.

  fsdp    FSDP2 with quantized parameters: fully_shard (torch's, plus checks and the amax
          groups of the shards), the quantized all-gather's byte counts; the hooks themselves
          live on QuantizedWeight (quantized_param.py), so torch's own fully_shard works too

Builds on the ground floor and nn/; nothing below imports it.
"""
from .fsdp import fully_shard, set_amax_group, shard_problems

__all__ = ["fully_shard", "set_amax_group", "shard_problems"]
