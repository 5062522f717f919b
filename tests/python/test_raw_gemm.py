"""qrecipe._C.raw_cublaslt_gemm, the raw cuBLASLt GEMM bench/bench_linear.py floors a Linear
step with (CUDA builds only; skipped elsewhere).

It must be the GEMM the engine runs for a native pair, minus everything around it: on the
buffers of real quantized tensors it gives the engine's native GEMM output bit for bit (the
same cuBLASLt call through the same prepared descriptor), for each scale mode and GEMM kind
a shipped recipe uses."""
import pytest
import torch

import qrecipe
from qrecipe._engine import _C

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not hasattr(_C, "raw_cublaslt_gemm"),
    reason="needs a CUDA device and a CUDA build of qrecipe")

BOTH = 3
E4M3 = {"format": "float8", "scaling": "current", "dtype": "e4m3"}
E5M2 = {"format": "float8", "scaling": "current", "dtype": "e5m2"}
BLOCK_1x128 = {"format": "blockwise", "block": "1x128"}
BLOCK_128x128 = {"format": "blockwise", "block": "128x128"}


def quantized(spec, rows, cols, seed):
    recipe = qrecipe.Recipe.from_dict({"version": 1, "name": "t", "defaults": spec})
    quantizer = recipe.engine.resolve("linear", "input", "t")
    generator = torch.Generator().manual_seed(seed)
    source = torch.randn(rows, cols, generator=generator).to(torch.bfloat16).cuda()
    return recipe, quantizer.quantize(source, BOTH)


def raw_args(q, direction):
    layout = q.layout(direction)
    if layout["scale_mode"] == "tensor":
        mode = "tensor"
    else:
        outer = layout["block"][0] if direction == "rowwise" else layout["block"][1]
        mode = "1x128" if outer == 1 else "128x128"
    return q.data(direction), layout["data_dtype"], q.scale_inv(direction), mode


# (kind, spec A, direction A, spec B, direction B): the native GEMMs of the shipped recipes.
CASES = [
    ("fprop", E4M3, "rowwise", E4M3, "rowwise"),
    ("dgrad", E5M2, "rowwise", E4M3, "columnwise"),
    ("wgrad", E5M2, "columnwise", E4M3, "columnwise"),
    ("fprop", BLOCK_1x128, "rowwise", BLOCK_128x128, "rowwise"),
    ("dgrad", BLOCK_1x128, "rowwise", BLOCK_128x128, "columnwise"),
    ("wgrad", BLOCK_1x128, "columnwise", BLOCK_1x128, "columnwise"),
]


@pytest.mark.parametrize("kind,spec_a,dir_a,spec_b,dir_b", CASES)
def test_raw_gemm_is_the_engines_native_gemm(kind, spec_a, dir_a, spec_b, dir_b):
    m, n, k = 256, 384, 512
    # Stored [rows, cols] so that the direction used yields [outer, K].
    rec_a, a = quantized(spec_a, *((m, k) if dir_a == "rowwise" else (k, m)), seed=1)
    rec_b, b = quantized(spec_b, *((n, k) if dir_b == "rowwise" else (k, n)), seed=2)
    engine_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _C.gemm(a, dir_a, b, dir_b, engine_out, kind=kind)
    da, ta, sa, ma = raw_args(a, dir_a)
    db, tb, sb, mb = raw_args(b, dir_b)
    assert tuple(da.shape) == (m, k) and tuple(db.shape) == (n, k)
    raw_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    # Fast accumulation: per-tensor FP8 fprop only (blockwise always accumulates split).
    fast = kind == "fprop" and ma == "tensor"
    _C.raw_cublaslt_gemm(da, ta, db, tb, raw_out, a_scale=sa, a_scale_mode=ma, b_scale=sb,
                         b_scale_mode=mb, fast_accumulation=fast)
    torch.cuda.synchronize()
    assert not torch.isnan(raw_out).any()
    assert torch.equal(raw_out, engine_out)


def test_raw_bf16_gemm_matches_torch():
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(256, 512, generator=generator).to(torch.bfloat16).cuda()
    b = torch.randn(384, 512, generator=generator).to(torch.bfloat16).cuda()
    out = torch.empty(256, 384, dtype=torch.bfloat16, device="cuda")
    _C.raw_cublaslt_gemm(a, "bf16", b, "bf16", out)
    expected = (a.double() @ b.double().t())
    assert torch.allclose(out.double(), expected, rtol=1e-2, atol=1e-1)


def test_raw_gemm_rejects_mismatched_shapes():
    a = torch.zeros(64, 128, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(32, 256, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(64, 32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(qrecipe.QrecipeError, match=r"A \[64, 128\], B \[32, 256\]"):
        _C.raw_cublaslt_gemm(a, "bf16", b, "bf16", out)


def test_raw_gemm_needs_the_scale_of_fp8_operands():
    a = torch.zeros(64, 128, dtype=torch.uint8, device="cuda")
    out = torch.empty(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(qrecipe.QrecipeError, match="needs its scale_inv"):
        _C.raw_cublaslt_gemm(a, "e4m3", a, "e4m3", out)
