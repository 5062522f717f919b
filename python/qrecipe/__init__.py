"""qrecipe: low-precision (FP8 / FP4) training for PyTorch, driven by a recipe.

    import qrecipe
    model = qrecipe.convert(model)                 # nn.Linear -> qrecipe.nn.Linear
    with qrecipe.autocast(qrecipe.Recipe.load("recipes/mxfp8.yaml")):
        loss = loss_fn(model(x), y)
    loss.backward()

See docs/adapter.md. The package is built in layers; a module imports only from its own layer
and the layers below it, never upwards, and there are no import cycles
(tests/python/test_package_structure.py checks both on the source):

  ground floor (talks to the extension qrecipe._C; imports nothing of the floors above)
    _engine          loads the compiled extension _C with a clear error
    quantization     Quantizer, QuantizedTensor (inspection of bytes and scales), the usage bits
    scaling_state    delayed-scaling states in checkpoints; drop_scaling_states()
    roles            QuantizerRole: what a recipe factory receives; the roles of a model
    formats          quantizer specs built in Python (float8(), mxfp8(), delayed(), ...)
    factories        calling recipe factories for the engine (errors name factory and role)
    recipe           Recipe: load / validate a recipe (YAML, dict or a Python factory); owns
                     its engine and scaling state and knows whether its scaling update is
                     pending; check(model), explain(model); quantize() beside it
    autocasting      autocast: the active recipe and the once-per-step scaling update
    quantized_rows   row ranges of quantized tensors (cut, join, zeros, columnwise from
                     rowwise), read off each format's layouts
    quantized_shards shards across ranks: packing their bytes for an all-gather, rebuilding
                     the gathered tensor, the amax all-reduce of their requantization
    quantized_storage the bytes every alias of a QuantizedWeight shares (pieces, row groups)
    quantized_param  QuantizedWeight (its torch ops, FSDP2 hooks) and quantized_model_init
    recomputation    replaying a qrecipe forward when torch.utils.checkpoint (reentrant or
                     not; Hugging Face's gradient checkpointing) recomputes it in backward
    checkpointing    checkpoint(): an alias of torch's non-reentrant checkpoint
    telemetry        opt-in per-role numerics statistics of the quantized operands (amax,
                     scales, saturation, flush to zero, error): enable() / table()
  nn/              modules Linear, LayerNormLinear (LayerNorm / RMSNorm + Linear), LayerNormMLP
                   (norm -> fc1 -> GELU / SwiGLU / ... -> fc2), GroupedLinear (MoE experts in
                   one grouped parameter), their base QuantizedModule, the GEMM operations
                   (linear_gemms) and their eager / compiled dispatch; RMSNorm (Hugging
                   Face's norm, fused on CUDA; norm_amax hands its output amax to the next
                   Linears); imports the ground floor
  optim/           FusedAdam: Adam / AdamW with FP32 master weights; quantized parameters are
                   requantized from their masters by their format's plugin
  distributed/     FSDP2: fully_shard with checks and amax groups (fsdp); tensor parallelism
                   to come
                   optim/ and distributed/ may import nn/ and the ground floor, never the
                   reverse
  top              this __init__ (the public names) and convert (convert(): nn.Linear ->
                   qrecipe.nn.Linear in place, known HF RMSNorms -> qrecipe.nn.RMSNorm; names
                   every qrecipe module by its path);
                   parallel (tensor / sequence parallel plan styles for torch's
                   parallelize_module; imported explicitly, `import qrecipe.parallel`)
"""
from ._engine import QrecipeError, RecipeError, _C
from .autocasting import autocast, current_recipe, is_enabled
from .checkpointing import checkpoint
from .convert import convert
from .quantization import QuantizedTensor, Quantizer
from .recipe import Recipe, RecipeWarning, quantize
from .roles import QuantizerRole
from . import formats
from . import telemetry
from . import nn
from . import distributed
from . import optim
from .scaling_state import drop_scaling_states
from .quantized_param import QuantizedWeight, quantized_model_init

QuantizedParameter = QuantizedWeight  # an alias (docs/adapter.md, "Quantized parameters")

__version__ = "0.1.0"


def plugins():
    """The format plugins the engine loaded (name, version, path, devices)."""
    return [dict(p) for p in _C.plugins()]


def grouped_kernels_built() -> bool:
    """Whether this build of the engine has the grouped GEMM kernels (CUDA with CUTLASS):
    GroupedLinear then runs each GEMM kind of all experts as one launch on a GPU and can keep
    m_splits on the device (docs/gemm.md "Grouped GEMMs")."""
    return bool(_C.grouped_kernels_built())


__all__ = [
    "checkpoint",
    "QrecipeError", "RecipeError", "Recipe", "RecipeWarning", "QuantizerRole", "formats",
    "autocast", "current_recipe", "is_enabled",
    "convert", "quantize", "QuantizedTensor", "Quantizer", "nn", "plugins", "__version__",
    "grouped_kernels_built",
    "telemetry",
    "drop_scaling_states", "QuantizedWeight", "QuantizedParameter", "quantized_model_init",
    "distributed", "optim",
]
