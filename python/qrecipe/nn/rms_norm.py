"""``qrecipe.nn.RMSNorm``: Hugging Face's RMSNorm (LlamaRMSNorm and its copies in Mistral,
Qwen2, Qwen3, ...) with the same parameter, attribute and numerics, fused on CUDA.

HF's formula, in the input dtype T and FP32::

    h = x.to(float32); var = h.pow(2).mean(-1, keepdim=True)
    y = weight * (h * rsqrt(var + eps)).to(T)

- CPU, and any case the fused kernels do not serve (weight dtype other than x's, a tensor
  subclass such as a DTensor, a hidden size above ``_C.RMS_NORM_MAX_HIDDEN``): exactly that
  torch code (``hf_rms_norm``), so the module equals HF's bit for bit, forward and backward.
- CUDA: the engine's fused kernels (engine/include/qrecipe/norm.hpp): one forward kernel (y and
  the FP32 rstd of each row, saved for backward) and one backward kernel plus a small dweight
  reduction, every elementwise step rounded as torch rounds it. Only the order of the row sums
  (and of dweight's sum over rows) differs from torch's kernels; docs/adapter.md ("Fused
  RMSNorm") states the bound.

The CUDA path is a pair of ``torch.library`` custom operators with fake (meta)
implementations and autograd, so ``torch.compile`` traces it without a graph break:

    qrecipe::rms_norm_forward(x, weight, eps, with_amax) -> (y, rstd, amax)
    qrecipe::rms_norm_backward(dy, x, weight, rstd) -> (dx, dweight)

With ``with_amax`` the forward kernel also computes max |y| (``amax``, shape (2,), NaN
ignored): in eager mode under ``qrecipe.autocast`` the module hands it to the Linears that
quantize y next with per-tensor current scaling, which then skip their own amax pass
(nn/norm_amax.py).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._engine import _C
from . import norm_amax

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm.forward, operation for operation (the specification)."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


# torch.library.custom_op arrived in torch 2.4; without it the module runs hf_rms_norm on CUDA
# too (the same formula in torch's kernels).
AVAILABLE = hasattr(torch.library, "custom_op")

if AVAILABLE:
    @torch.library.custom_op("qrecipe::rms_norm_forward", mutates_args=())
    def rms_norm_forward_op(x: torch.Tensor, weight: torch.Tensor, eps: float, with_amax: bool
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, rstd, amax = _C.rms_norm_forward(x, weight, eps, with_amax)
        return y, rstd, amax

    @rms_norm_forward_op.register_fake
    def _(x, weight, eps, with_amax):
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return (torch.empty_like(x, memory_format=torch.contiguous_format),
                x.new_empty((rows,), dtype=torch.float32),
                x.new_empty((2 if with_amax else 0,), dtype=torch.float32))

    @torch.library.custom_op("qrecipe::rms_norm_backward", mutates_args=())
    def rms_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                             rstd: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        dx, dw = _C.rms_norm_backward(dy, x, weight, rstd)
        return dx, dw

    @rms_norm_backward_op.register_fake
    def _(dy, x, weight, rstd):
        return torch.empty_like(x, memory_format=torch.contiguous_format), \
            torch.empty_like(weight, memory_format=torch.contiguous_format)

    def _setup_context(ctx, inputs, output):
        x, weight, _, _ = inputs
        _, rstd, _ = output
        ctx.save_for_backward(x, weight, rstd)

    def _backward(ctx, dy, _drstd, _damax):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward_op(dy.contiguous(), x, weight, rstd)
        return (dx if ctx.needs_input_grad[0] else None,
                dw if ctx.needs_input_grad[1] else None, None, None)

    torch.library.register_autograd("qrecipe::rms_norm_forward", _backward,
                                    setup_context=_setup_context)


def _plain(t: torch.Tensor) -> bool:
    # A tensor subclass (a DTensor under tensor / sequence parallelism) keeps torch's formula,
    # which the subclass's own dispatch understands; the kernels take plain tensors.
    return type(t) in (torch.Tensor, torch.nn.Parameter)


def fused_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the CUDA kernels serve this call (otherwise hf_rms_norm runs)."""
    return (AVAILABLE and x.is_cuda and x.dtype in FUSED_DTYPES and weight.dtype == x.dtype
            and weight.device == x.device and weight.dim() == 1 and x.dim() >= 1
            and 0 < x.shape[-1] <= _C.RMS_NORM_MAX_HIDDEN and _plain(x) and _plain(weight))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm of x: the fused kernels where they apply (handing y's amax to the next
    Linears when norm_amax.wanted()), hf_rms_norm otherwise."""
    if fused_applies(x, weight):
        with_amax = norm_amax.wanted()
        y, _, amax = rms_norm_forward_op(x.contiguous(), weight.contiguous(), float(eps),
                                         with_amax)
        if with_amax:
            norm_amax.offer(y, amax)
        return y
    return hf_rms_norm(x, weight, eps)


class RMSNorm(torch.nn.Module):
    """Hugging Face's RMSNorm: ``weight`` [hidden_size] (initialised to ones) and
    ``variance_epsilon``, the attribute and state_dict names of LlamaRMSNorm, so a checkpoint
    of either loads into the other. ``qrecipe.convert`` puts it in place of HF's norms
    (``RMSNorm.from_hf``); it can also be built directly."""

    def __init__(self, hidden_size: int, eps: float = 1e-6,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        super().__init__()
        if int(hidden_size) < 1:
            raise ValueError(f"qrecipe.nn.RMSNorm: hidden_size must be >= 1, got {hidden_size}")
        self.weight = torch.nn.Parameter(torch.ones(int(hidden_size), device=device, dtype=dtype))
        self.variance_epsilon = float(eps)

    @classmethod
    def from_hf(cls, module: torch.nn.Module) -> "RMSNorm":
        """The fused module over `module`'s own ``weight`` Parameter (the same object, so an
        optimizer or FSDP that holds it keeps working) and its ``variance_epsilon``."""
        weight = module.weight
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
            raise ValueError(f"qrecipe.nn.RMSNorm.from_hf: {type(module).__name__}.weight must "
                             f"be a 1-D Parameter, got {type(weight).__name__} of shape "
                             f"{tuple(getattr(weight, 'shape', ()))}")
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.weight = weight
        new.variance_epsilon = float(module.variance_epsilon)
        new.train(module.training)
        return new

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden = self.weight.shape[0]
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != hidden:
            raise ValueError(f"qrecipe.nn.RMSNorm: the input's last dimension must be the hidden "
                             f"size {hidden}, got an input of shape "
                             f"{tuple(hidden_states.shape)}")
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"
