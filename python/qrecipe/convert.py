"""``qrecipe.convert``: swap a model's ``torch.nn.Linear`` layers for ``qrecipe.nn.Linear``
in place, keeping the same Parameter objects and naming each layer, and every qrecipe module
already in the model (LayerNormLinear, LayerNormMLP, GroupedLinear, ...), by its module
path; and Hugging Face's RMSNorm modules of known classes for the fused
``qrecipe.nn.RMSNorm``."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from .recipe import RecipeLike, as_recipe
from .nn.base import QuantizedModule
from .nn.linear import Linear
from .nn.rms_norm import RMSNorm

FilterFn = Callable[[str, torch.nn.Module], bool]

# Hugging Face RMSNorm classes whose forward is LlamaRMSNorm's formula (qrecipe.nn.RMSNorm's
# hf_rms_norm). Gemma's (1 + weight) and Olmo2's (weight before the cast) differ, and are not
# listed. A listed class is replaced only if its forward is still that formula: its bytecode
# must equal _hf_rms_norm_forward's, so a transformers release that changes the formula, or a
# forward patched by a kernel hub, leaves the module alone.
HF_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm",
                "Qwen2MoeRMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm",
                "GraniteRMSNorm")


def _hf_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # LlamaRMSNorm.forward of transformers, verbatim: compared by bytecode, never called.
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def _code_signature(fn) -> tuple:
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    return (code.co_code, code.co_consts, code.co_names, code.co_varnames, code.co_argcount,
            code.co_kwonlyargcount)


_HF_FORWARD = _code_signature(_hf_rms_norm_forward)


def fusable_hf_norm(module: torch.nn.Module) -> bool:
    """Whether `module` is a Hugging Face RMSNorm qrecipe.nn.RMSNorm computes exactly: a listed
    class from transformers.models whose forward is the known formula, not patched on the
    instance, with only a 1-D ``weight`` Parameter, a float ``variance_epsilon``, no children,
    no buffers and no hooks (which the replacement would drop)."""
    cls = type(module)
    if cls.__name__ not in HF_RMS_NORMS or not cls.__module__.startswith("transformers.models."):
        return False
    if _code_signature(cls.forward) != _HF_FORWARD or "forward" in module.__dict__:
        return False
    weight = module._parameters.get("weight")
    if (set(module._parameters) != {"weight"} or not isinstance(weight, torch.nn.Parameter)
            or type(weight) is not torch.nn.Parameter or weight.dim() != 1):
        return False
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(eps, (float, int)) or isinstance(eps, bool):
        return False
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
             "_load_state_dict_post_hooks")
    return (not module._modules and not module._buffers
            and not any(getattr(module, h, None) for h in hooks))


def convert(model: torch.nn.Module, recipe: RecipeLike = None,
            filter_fn: Optional[FilterFn] = None, fuse_norms: bool = True) -> torch.nn.Module:
    """Replaces every ``torch.nn.Linear`` (exactly that class; subclasses such as
    MultiheadAttention's out_proj are left alone) for which ``filter_fn(name, module)`` is
    true. Parameters are shared, not copied, so an optimizer built before the call still
    updates them. Existing qrecipe modules (every ``qrecipe.nn.QuantizedModule``: Linear,
    LayerNormLinear, LayerNormMLP, GroupedLinear) without a name get their path; filter_fn
    does not apply to them (they are already qrecipe's).

    ``recipe`` (a Recipe, a path, a dict): when given, every converted layer resolves its
    roles and plans its GEMMs under it now (every GEMM of every qrecipe module, converted or
    already there), so a recipe that cannot serve a layer fails here
    rather than at the first step.

    ``fuse_norms`` (default True): Hugging Face RMSNorm modules of the classes in
    ``HF_RMS_NORMS`` (LlamaRMSNorm, Qwen2RMSNorm, ...; see ``fusable_hf_norm``) become
    ``qrecipe.nn.RMSNorm`` over the same ``weight`` Parameter and ``variance_epsilon`` (the
    state_dict is unchanged). On the CPU it computes HF's formula with torch's ops, bit for bit;
    on CUDA one fused kernel each way, which differs from torch's kernels only in the order of
    the row sums (docs/adapter.md, "Fused RMSNorm"). filter_fn does not apply to norms;
    ``fuse_norms=False`` leaves every norm alone.

    Returns the model (a new module when `model` itself is an ``nn.Linear`` or a fusable norm)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"convert takes a torch.nn.Module, got {type(model).__name__}")
    checked = as_recipe(recipe) if recipe is not None else None

    def wanted(name: str, module: torch.nn.Module) -> bool:
        return type(module) is torch.nn.Linear and (filter_fn is None or filter_fn(name, module))

    def finish(name: str, module: torch.nn.Module) -> torch.nn.Module:
        if not module.name:
            module.name = name
        if checked is not None:
            module.resolve_roles(checked)
        return module

    if wanted("", model):
        return finish("", Linear.from_linear(model, ""))
    if fuse_norms and fusable_hf_norm(model):
        return RMSNorm.from_hf(model)
    fused: Dict[int, Tuple[torch.nn.Module, RMSNorm]] = {}  # a shared norm stays one module
    for path, parent in list(model.named_modules()):
        # _modules, not named_children (which yields a module once per parent): a norm under
        # two names of one parent is replaced under both
        for child_name, child in list(parent._modules.items()) if fuse_norms else ():
            if child is not None and (id(child) in fused or fusable_hf_norm(child)):
                if id(child) not in fused:
                    fused[id(child)] = (child, RMSNorm.from_hf(child))
                setattr(parent, child_name, fused[id(child)][1])
        for child_name, child in list(parent.named_children()):
            full = f"{path}.{child_name}" if path else child_name
            if wanted(full, child):
                setattr(parent, child_name, finish(full, Linear.from_linear(child, full)))
            elif isinstance(child, QuantizedModule):
                finish(full, child)
    return model
