"""qrecipe.optim: optimizers for models whose weights are stored quantized.

  fused_adam    FusedAdam: Adam / AdamW with FP32 master weights; quantized parameters
                (QuantizedWeight, every format) are requantized from their new master in the
                same pass by their format's plugin where it fuses the step (docs/adapter.md,
                "Optimizer")

Builds on the ground floor (quantized_param, _engine); nothing below imports it.
"""
from .fused_adam import FusedAdam

__all__ = ["FusedAdam"]
