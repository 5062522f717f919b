"""qrecipe.quantize: bytes and scales per direction, layouts, dequantize."""
import pytest
import torch

import qrecipe


def test_float8_bytes_match_hand_computation():
    # amax = 4 -> scale = 448 / 4 = 112, scale_inv = fp32(1/112). E4M3 (bias 7):
    #    1 * 112 =  112 = 1.75 * 2^6 -> 0 1101 110 = 0x6E = 110
    #   -2 * 112 = -224 = -1.75 * 2^7 -> 1 1110 110 = 0xF6 = 246
    #  0.5 * 112 =   56 = 1.75 * 2^5 -> 0 1100 110 = 0x66 = 102
    #    4 * 112 =  448 = 1.75 * 2^8 -> 0 1111 110 = 0x7E = 126 (E4M3's max)
    x = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    q = qrecipe.quantize(x, "float8", dtype="e4m3")
    assert q.format == "float8" and q.usage == ("rowwise", "columnwise")
    assert q.rowwise_data.dtype == torch.uint8
    assert q.rowwise_data.tolist() == [[110, 246], [102, 126]]
    assert q.columnwise_data.tolist() == [[110, 102], [246, 126]]  # stored transposed
    assert q.rowwise_scale_inv.dtype == torch.float32
    assert q.rowwise_scale_inv.item() == torch.tensor(1.0 / 112.0, dtype=torch.float32).item()
    assert q.rowwise_amax.item() == 4.0
    assert torch.equal(q.dequantize(), x)  # every value is exactly representable
    assert "dtype=e4m3" in q.options and "scaling=current" in q.options


def test_float8_bytes_match_torch_cast_on_random_data():
    x = torch.randn(33, 70) * 3
    for dtype, torch_dtype, fmax in (("e4m3", torch.float8_e4m3fn, 448.0),
                                     ("e5m2", torch.float8_e5m2, 57344.0)):
        q = qrecipe.quantize(x, "float8", dtype=dtype, usage="rowwise")
        scale = torch.tensor(fmax, dtype=torch.float32) / x.abs().max()
        expected = (x * scale).to(torch_dtype).view(torch.uint8)
        assert torch.equal(q.rowwise_data, expected)
        assert q.columnwise_data is None


def test_mxfp8_layout_and_scales():
    x = torch.randn(40, 96)
    q = qrecipe.quantize(x, "mxfp8")
    # rowwise scales [roundup(M,128), roundup(ceil(K/32),4)] = [128, 4], E8M0 bytes
    assert q.rowwise_data.shape == (40, 96) and q.rowwise_data.dtype == torch.uint8
    assert q.rowwise_scale_inv.shape == (128, 4) and q.rowwise_scale_inv.dtype == torch.uint8
    # columnwise scales [roundup(ceil(M/32),4), roundup(K,128)] = [4, 128]
    assert q.columnwise_scale_inv.shape == (4, 128)
    assert q.rowwise_amax is None
    layout = q.layout("rowwise")
    assert layout["block"] == (1, 32) and layout["scale_dtype"] == "e8m0"
    # Block scale = 2^(e-127) with the block's elements within E4M3 range after scaling.
    e = q.rowwise_scale_inv[0, 0].item()
    block = x[0, :32]
    assert block.abs().max() / 2.0 ** (e - 127) <= 448.0
    assert (q.dequantize() - x).norm() / x.norm() < 0.05


def test_nvfp4_packs_two_values_per_byte():
    x = torch.randn(32, 64)
    q = qrecipe.quantize(x, "nvfp4", usage="rowwise")
    assert q.rowwise_data.shape == (32, 32) and q.rowwise_data.dtype == torch.uint8
    assert q.rowwise_scale_inv.dtype == torch.uint8  # E4M3 block scales
    assert q.rowwise_amax.item() == x.abs().max().item()
    assert q.usage == ("rowwise",)


def test_dequantize_restores_shape_and_dtype():
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    q = qrecipe.quantize(x, "blockwise", block="1x128")
    for direction in ("rowwise", "columnwise"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            d = q.dequantize(direction, dtype)
            assert d.shape == x.shape and d.dtype == dtype
    assert (q.dequantize().float() - x.float()).norm() / x.float().norm() < 0.05


def test_hybrid_directions_have_their_own_formats():
    x = torch.randn(32, 64)
    q = qrecipe.quantize(x, "hybrid", rowwise={"format": "float8"},
                         columnwise={"format": "mxfp8"})
    assert q.layout("rowwise")["format"] == "float8"
    assert q.layout("columnwise")["format"] == "mxfp8"


def test_buffers_alias_engine_memory_and_outlive_the_object():
    q = qrecipe.quantize(torch.randn(8, 16), "float8")
    data = q.rowwise_data
    assert data.data_ptr() == q.rowwise_data.data_ptr()  # a view, not a copy
    expected = data.clone()
    del q
    assert torch.equal(data, expected)  # the tensor keeps the engine buffer alive


def test_recipe_quantizer_resolves_roles():
    recipe = qrecipe.Recipe.default()
    q = recipe.quantizer("linear", "grad_output", "layers.0.fc1")
    assert q.format == "float8" and "e5m2" in q.describe()
    assert qrecipe.Recipe.builtin("none").quantizer("linear", "input") is None
