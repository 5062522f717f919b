"""qrecipe.nn.RMSNorm and qrecipe.convert's fusion of Hugging Face RMSNorms, on the CPU:
the module equals HF's LlamaRMSNorm bit for bit (forward, dx, dweight) in every dtype;
convert replaces exactly the known classes whose forward is HF's formula, keeps the Parameter
objects and the state_dict, and training (with HF's gradient checkpointing too) is bit-identical
to fuse_norms=False. The CUDA kernels: tests/python/test_rms_norm_cuda.py."""
import types

import pytest
import torch

import qrecipe
from qrecipe._engine import _C
from qrecipe.nn.rms_norm import hf_rms_norm

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def pair(hidden, dtype, eps=1e-6):
    hf = LlamaRMSNorm(hidden, eps=eps).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(hidden)))
    ours = qrecipe.nn.RMSNorm(hidden, eps=eps, dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(hf.weight)
    return hf, ours


def run(module, x, dy):
    x = x.detach().clone().requires_grad_()
    module.weight.grad = None
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad


def assert_equal_bits(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
                       b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32)), \
        what


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 64), (2, 3, 127), (4, 1)])
def test_module_equals_hf_bit_for_bit(dtype, shape):
    hf, ours = pair(shape[-1], dtype)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    for a, b, what in zip(run(hf, x, dy), run(ours, x, dy), ("y", "dx", "dweight")):
        assert_equal_bits(a, b, f"{what} of {dtype} {shape}")


def test_eps_is_respected():
    x = (torch.randn(3, 16) * 1e-3).to(torch.bfloat16)
    outs = []
    for eps in (1e-6, 1e-2):
        hf, ours = pair(16, torch.bfloat16, eps=eps)
        assert ours.variance_epsilon == eps
        assert_equal_bits(hf(x), ours(x), f"eps {eps}")
        outs.append(ours(x))
    assert not torch.equal(outs[0], outs[1])


def test_weight_of_another_dtype_follows_torch_promotion():
    # HF keeps an FP32 weight in FP32 models cast piecewise: weight * h.to(bf16) is FP32.
    hf, ours = pair(8, torch.float32)
    x = torch.randn(2, 8).to(torch.bfloat16)
    assert_equal_bits(hf(x), ours(x), "fp32 weight, bf16 input")
    assert ours(x).dtype == torch.float32


def test_bad_input_is_a_clear_error():
    norm = qrecipe.nn.RMSNorm(8)
    with pytest.raises(ValueError, match=r"last dimension must be the hidden size 8, got an "
                                         r"input of shape \(2, 7\)"):
        norm(torch.randn(2, 7))
    with pytest.raises(ValueError, match="hidden size 8"):
        norm(torch.tensor(1.0))
    with pytest.raises(ValueError, match="hidden_size must be >= 1"):
        qrecipe.nn.RMSNorm(0)


def test_engine_kernels_refuse_cpu_tensors_clearly():
    x, w = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(qrecipe.QrecipeError, match="runs on CUDA tensors only"):
        _C.rms_norm_forward(x, w, 1e-6, True)
    with pytest.raises(qrecipe.QrecipeError, match="runs on CUDA tensors only"):
        _C.rms_norm_backward(x, x, w, torch.ones(2))


def test_fake_implementations_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(2, 3, 8, dtype=torch.bfloat16)
        w = torch.empty(8, dtype=torch.bfloat16)
        y, rstd, amax = torch.ops.qrecipe.rms_norm_forward(x, w, 1e-6, True)
        _, _, no_amax = torch.ops.qrecipe.rms_norm_forward(x, w, 1e-6, False)
        dx, dw = torch.ops.qrecipe.rms_norm_backward(y, x, w, rstd)
    assert (y.shape, y.dtype, rstd.shape, rstd.dtype) == (x.shape, x.dtype, (6,), torch.float32)
    assert (amax.shape, amax.dtype, no_amax.shape) == ((2,), torch.float32, (0,))
    assert (dx.shape, dw.shape, dw.dtype) == (x.shape, w.shape, w.dtype)


# ---- convert ----

def tiny(kind, fuse_norms=True):
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=64)
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[kind]
    torch.manual_seed(0)
    model = cls[1](cls[0](**common)).to(torch.bfloat16)
    model.train()
    return model


def norms(model, cls_name):
    return [name for name, m in model.named_modules() if type(m).__name__ == cls_name]


@pytest.mark.parametrize("kind,cls_name", [("llama", "LlamaRMSNorm"), ("qwen2", "Qwen2RMSNorm"),
                                           ("qwen3", "Qwen3RMSNorm")])
def test_convert_replaces_known_norms_keeping_parameters_and_state(kind, cls_name):
    model = tiny(kind)
    before = norms(model, cls_name)
    # 2 per layer and the final one; Qwen3 also normalizes q and k per head (2 more a layer).
    assert len(before) == (9 if kind == "qwen3" else 5)
    weights = {n: model.get_submodule(n).weight for n in before}
    params = list(model.parameters())
    qrecipe.convert(model)
    for n in before:
        m = model.get_submodule(n)
        assert type(m) is qrecipe.nn.RMSNorm, n
        assert m.weight is weights[n], n
    assert norms(model, cls_name) == []
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    # the state_dict of the Linears-only conversion, key for key and bit for bit; checkpoints
    # load both ways
    unfused = qrecipe.convert(tiny(kind), fuse_norms=False)
    after, plain = model.state_dict(), unfused.state_dict()
    assert list(after) == list(plain)
    assert all(f"{n}.weight" in after for n in before)
    for k, v in plain.items():
        assert (torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v), k
    unfused.load_state_dict(after)
    model.load_state_dict(plain)


def test_fuse_norms_false_leaves_norms_alone():
    model = qrecipe.convert(tiny("llama"), fuse_norms=False)
    assert len(norms(model, "LlamaRMSNorm")) == 5
    assert not any(isinstance(m, qrecipe.nn.RMSNorm) for m in model.modules())


def test_unknown_patched_or_hooked_norms_are_left_alone():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    class LlamaRMSNorm(torch.nn.Module):  # a user's class of the same name: not transformers'
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return x * self.weight

    hf = __import__("transformers.models.llama.modeling_llama", fromlist=["x"]).LlamaRMSNorm
    patched, hooked, plain = hf(8), hf(8), hf(8)
    patched.forward = types.MethodType(lambda self, x: x, patched)
    hooked.register_forward_hook(lambda m, i, o: o)
    model = torch.nn.ModuleDict({"gemma": GemmaRMSNorm(8), "mine": LlamaRMSNorm(),
                                 "patched": patched, "hooked": hooked, "plain": plain})
    qrecipe.convert(model)
    assert type(model["gemma"]) is GemmaRMSNorm
    assert type(model["mine"]) is LlamaRMSNorm
    assert model["patched"] is patched and model["hooked"] is hooked
    assert type(model["plain"]) is qrecipe.nn.RMSNorm


def test_shared_norm_stays_shared_and_a_norm_alone_is_converted():
    norm = LlamaRMSNorm(8)
    model = torch.nn.ModuleDict({"a": norm, "b": norm})
    qrecipe.convert(model)
    assert type(model["a"]) is qrecipe.nn.RMSNorm and model["a"] is model["b"]
    alone = qrecipe.convert(LlamaRMSNorm(8))
    assert type(alone) is qrecipe.nn.RMSNorm


def train(model, recipe_name, steps=2, checkpointing=None):
    if checkpointing is not None:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
    model.config.use_cache = False
    recipe = qrecipe.Recipe.builtin(recipe_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        with qrecipe.autocast(recipe):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
        opt.step()
    return out


@pytest.mark.parametrize("recipe_name", ["default", "mxfp8"])
@pytest.mark.parametrize("checkpointing", [None, False])
def test_training_is_bit_identical_to_unfused(recipe_name, checkpointing):
    fused = train(qrecipe.convert(tiny("llama")), recipe_name, checkpointing=checkpointing)
    plain = train(qrecipe.convert(tiny("llama"), fuse_norms=False), recipe_name,
                  checkpointing=checkpointing)
    for step, (a, b) in enumerate(zip(fused, plain)):
        for i, (u, v) in enumerate(zip(a, b)):
            assert torch.equal(u, v), f"step {step}, tensor {i} differs"


def test_hf_rms_norm_is_hfs_forward():
    hf, _ = pair(16, torch.bfloat16)
    x = torch.randn(3, 16).to(torch.bfloat16)
    assert_equal_bits(hf(x), hf_rms_norm(x, hf.weight, hf.variance_epsilon), "hf_rms_norm")
