"""The fused RMSNorm kernels on CUDA (run by tools/gpu_check.sh; skipped without a GPU): against
Hugging Face's formula run by torch on the same device, within the bound docs/adapter.md
("Fused RMSNorm") states, forward and both gradients; deterministic; unaligned rows; the
output amax exact; a converted HF Llama runs the kernels, hands the norms' amaxes to its
Linears with bit-identical results, trains like the unfused model and compiles without a
graph break."""
import pytest
import torch

import qrecipe
from qrecipe.nn import norm_amax
from qrecipe.nn import rms_norm as rms_norm_module
from qrecipe.nn.rms_norm import hf_rms_norm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The documented bounds (docs/adapter.md, "Fused RMSNorm"). Forward, per element:
# |y - ref| <= FWD_REL * |ref| + finfo.tiny, and for 16-bit dtypes at least 99.9 % of the
# elements bit-identical. Gradients, normwise: max |g - ref| <= GRAD_REL * max |ref|.
FWD_REL = {torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9, torch.float32: 2.0 ** -18}
GRAD_REL = {torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9, torch.float32: 2.0 ** -16}
SHAPES = [(4096, 4096), (3, 5, 1000), (7, 127), (1, 1), (513, 64), (2, 8192)]


def inputs(shape, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(shape, generator=g, device="cuda") * 2).to(dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g, device="cuda")).to(dtype)
    dy = torch.randn(shape, generator=g, device="cuda").to(dtype)
    return x, w, dy


def forward_backward(fn, x, w, dy, eps=1e-6):
    # detach, not clone: a leaf over the same memory (misaligned() keeps its offset)
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = fn(x, w, eps)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def fused(x, w, eps):
    assert rms_norm_module.fused_applies(x, w)
    return rms_norm_module.rms_norm(x, w, eps)


def check_forward(y, ref, dtype, what):
    err = (y.float() - ref.float()).abs()
    bound = FWD_REL[dtype] * ref.float().abs() + torch.finfo(dtype).tiny
    assert bool((err <= bound).all()), f"{what}: forward beyond the bound, max error " \
        f"{err.max().item()}"
    if dtype != torch.float32:
        same = (y.view(torch.int16) == ref.view(torch.int16)).float().mean().item()
        assert same >= 0.999, f"{what}: only {same:.5f} of the outputs are bit-identical"


def check_all(ours, ref, dtype, what):
    """(y, dx, dweight) of the kernels against the HF formula's, within the bounds."""
    check_forward(ours[0], ref[0], dtype, f"y, {what}")
    check_grad(ours[1], ref[1], dtype, f"dx, {what}")
    check_grad(ours[2], ref[2], dtype, f"dweight, {what}")


def check_grad(g, ref, dtype, what):
    err = (g.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert err <= GRAD_REL[dtype] * scale, f"{what}: max error {err} for max |ref| {scale}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernels_match_hf_formula_within_the_bound(dtype, shape):
    x, w, dy = inputs(shape, dtype)
    check_all(forward_backward(fused, x, w, dy), forward_backward(hf_rms_norm, x, w, dy), dtype,
              f"{dtype} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_saved_rstd_is_torchs_within_the_bound(dtype):
    x, w, _ = inputs((257, 4096), dtype)
    _, rstd, _ = torch.ops.qrecipe.rms_norm_forward(x, w, 1e-5, False)
    h = x.float()
    ref = torch.rsqrt(h.pow(2).mean(-1) + 1e-5)
    assert float(((rstd - ref).abs() / ref).max()) <= 2.0 ** -18


def misaligned(t):
    """A contiguous copy of t whose data starts one element past a 16-byte boundary: the
    kernels then take their scalar path instead of 16-byte loads."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [128, 130])
def test_kernels_are_deterministic_and_serve_unaligned_rows(dtype, cols):
    x, w, dy = inputs((65, cols), dtype)
    for xs, dys in ((x, dy), (misaligned(x), misaligned(dy))):
        a = forward_backward(fused, xs, w, dys)
        b = forward_backward(fused, xs, w, dys)
        for u, v in zip(a, b):
            assert torch.equal(u, v)
        check_all(a, forward_backward(hf_rms_norm, xs, w, dys), dtype, f"{cols} columns")


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_amax_is_exact(dtype):
    x, w, _ = inputs((1031, 1000), dtype)
    x[5, 7] = float("nan")  # a NaN row: ignored by the amax, as the quantizers ignore it
    x[9, 3] = float("inf")
    for xs in (x, x[1:]):
        y, _, amax = torch.ops.qrecipe.rms_norm_forward(xs.contiguous(), w, 1e-6, True)
        finite = y.float().abs().nan_to_num(nan=0.0)
        assert amax.shape == (2,) and amax.dtype == torch.float32
        assert torch.equal(amax, finite.max().repeat(2)), (amax, finite.max())
    _, _, none = torch.ops.qrecipe.rms_norm_forward(x, w, 1e-6, False)
    assert none.numel() == 0


def test_eps_and_zero_rows():
    x = torch.zeros(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    for eps in (1e-6, 1.0):
        assert torch.equal(fused(x, w, eps), hf_rms_norm(x, w, eps))
    x = torch.randn(4, 64, device="cuda").to(torch.bfloat16) * 1e-3
    assert not torch.equal(fused(x, w, 1e-6), fused(x, w, 1e-2))
    empty = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg = w.clone().requires_grad_()
    y = fused(empty, wg, 1e-6)
    y.sum().backward()
    assert y.shape == (0, 64) and torch.equal(wg.grad, torch.zeros_like(w))


def test_bad_tensors_are_clear_errors_and_wide_rows_take_the_torch_formula():
    from qrecipe._engine import _C
    x = torch.randn(3, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(qrecipe.QrecipeError, match=r"weight is \w+ \[63\].*expected a "
                                                   r"contiguous \w+ \[64\]"):
        _C.rms_norm_forward(x, torch.ones(63, device="cuda", dtype=torch.bfloat16), 1e-6)
    with pytest.raises(qrecipe.QrecipeError, match="has dtype Double"):
        _C.rms_norm_forward(x.double(), torch.ones(64, device="cuda", dtype=torch.float64), 1e-6)
    wide = _C.RMS_NORM_MAX_HIDDEN + 1
    x = torch.randn(2, wide, device="cuda").to(torch.bfloat16)
    w = torch.ones(wide, device="cuda", dtype=torch.bfloat16)
    assert not rms_norm_module.fused_applies(x, w)
    with pytest.raises(qrecipe.QrecipeError, match="serves at most"):
        _C.rms_norm_forward(x, w, 1e-6)
    assert torch.equal(rms_norm_module.rms_norm(x, w, 1e-6), hf_rms_norm(x, w, 1e-6))


def test_weight_of_another_dtype_takes_the_torch_formula():
    x = torch.randn(3, 64, device="cuda").to(torch.bfloat16)
    w = torch.randn(64, device="cuda")
    assert not rms_norm_module.fused_applies(x, w)
    norm = qrecipe.nn.RMSNorm(64, device="cuda")
    assert torch.equal(norm(x), hf_rms_norm(x, norm.weight, norm.variance_epsilon))


def tiny_llama(fuse_norms):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=256, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).cuda()
    model.config.use_cache = False
    return qrecipe.convert(model, fuse_norms=fuse_norms)


class Counting:
    """Stands in for qrecipe._C in nn/rms_norm.py, counting the fused forward calls."""

    def __init__(self, inner):
        self.inner, self.forwards = inner, 0

    def rms_norm_forward(self, *args):
        self.forwards += 1
        return self.inner.rms_norm_forward(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_converted_llama_runs_the_kernels_and_trains_like_unfused(monkeypatch):
    counting = Counting(rms_norm_module._C)
    monkeypatch.setattr(rms_norm_module, "_C", counting)
    recipe = qrecipe.Recipe.default()
    ids = torch.randint(0, 256, (2, 64), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    losses = []
    for fuse in (True, False):
        model = tiny_llama(fuse)
        with qrecipe.autocast(recipe):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is not None and bool(torch.isfinite(p.grad).all())
                   for p in model.parameters())
        if fuse:
            assert counting.forwards == 5  # 2 per layer and the final norm
    assert abs(losses[0] - losses[1]) <= 1e-2 * abs(losses[1]), losses


def train_steps(model, recipe, steps=2):
    out = []
    for step in range(steps):
        ids = torch.randint(0, 256, (2, 64), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(step))
        model.zero_grad()
        with qrecipe.autocast(recipe):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    return out


@pytest.mark.parametrize("recipe_name", ["default", "float8_delayed", "mxfp8"])
def test_amax_handoff_is_bit_identical(recipe_name, monkeypatch):
    norm_amax.reset_stats()
    handed = train_steps(tiny_llama(True), qrecipe.Recipe.builtin(recipe_name))
    used = norm_amax.stats["used"]
    # per step: q/k/v and gate/up of each layer's two norms, lm_head of the final norm
    assert used == (10 if recipe_name == "default" else 0), norm_amax.stats
    monkeypatch.setattr(norm_amax, "enabled", False)
    own = train_steps(tiny_llama(True), qrecipe.Recipe.builtin(recipe_name))
    for step, (a, b) in enumerate(zip(handed, own)):
        for i, (u, v) in enumerate(zip(a, b)):
            assert torch.equal(u, v), f"{recipe_name}: step {step}, tensor {i} differs"


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gradient_checkpointing_is_bit_identical(reentrant):
    # The recomputed norms run outside autocast (no amax handoff then): same bits anyway.
    recipe = qrecipe.Recipe.default()
    plain = train_steps(tiny_llama(True), recipe)
    model = tiny_llama(True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    checkpointed = train_steps(model, recipe)
    for step, (a, b) in enumerate(zip(plain, checkpointed)):
        for i, (u, v) in enumerate(zip(a, b)):
            assert torch.equal(u, v), f"use_reentrant={reentrant}: step {step}, tensor {i}"


def test_converted_llama_compiles_without_graph_breaks_and_matches_eager():
    from test_hf_integration import check_compiles_like_eager
    ids = torch.randint(0, 256, (2, 64), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    check_compiles_like_eager(tiny_llama(True), ids)
