"""qrecipe.nn: torch.nn modules whose GEMMs follow the active recipe (docs/adapter.md).

  Linear            y = x W^T + b                             module_type linear
  LayerNormLinear   LayerNorm / RMSNorm, then a Linear        module_type layernorm_linear
  LayerNormMLP      norm -> fc1 -> activation -> fc2          module_type layernorm_mlp
  GroupedLinear     num_gemms experts on row groups of x      module_type grouped_linear
  QuantizedModule   the base of all four (roles per recipe, explain, input checks,
                    the GEMM dispatch, scaling state in state_dict)
  RMSNorm           Hugging Face's RMSNorm, fused on CUDA (no GEMM, no role; convert()
                    puts it in place of HF's LlamaRMSNorm and its copies)
"""
from .base import QuantizedModule
from .grouped_linear import GroupedLinear
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .rms_norm import RMSNorm

__all__ = ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear", "QuantizedModule",
           "RMSNorm"]
