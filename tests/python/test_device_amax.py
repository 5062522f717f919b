"""The amax on the device: Quantizer.compute_amax_device and quantize / requantize with
amax=<float32 tensor of shape (2,)> give exactly the host-amax path's bytes, scales and amaxes
(plugin_abi.h, QR_EXTRA_COMPUTE_AMAX_DEVICE / QR_EXTRA_QUANTIZE_DEVICE_AMAX), for every format
with a per-tensor scale or amax; bad amax tensors get a clear error. The CUDA tests (skipped
without a GPU) check the same equality there, and that the device path runs with no host
synchronization (CUDA-graph capture refuses any)."""
import re

import pytest
import torch

from qrecipe.quantized_param import _quantizer_from_spec
from qrecipe.quantized_rows import parts_of

ROLE = ("linear", "weight", "layer")
USAGES = {"rowwise": 1, "columnwise": 2, "both": 3}

# Formats with a per-tensor scale or amax, each served by its plugin's device-amax extras
# (hybrid takes the engine's host-copy fallback; same results).
PER_TENSOR = {
    "float8_e4m3": {"format": "float8", "dtype": "e4m3"},
    "float8_e5m2_pow2": {"format": "float8", "dtype": "e5m2", "pow2_scales": True},
    "float8_eps": {"format": "float8", "amax_epsilon": 1e-3},
    "float8_delayed": {"format": "float8", "scaling": "delayed", "amax_history_len": 4},
    "nvfp4": {"format": "nvfp4"},
    "nvfp4_2d": {"format": "nvfp4", "2d": True},
    "nvfp4_hadamard": {"format": "nvfp4", "hadamard": True},
    "hybrid": {"format": "hybrid", "rowwise": {"format": "float8"},
               "columnwise": {"format": "nvfp4"}},
}
# Formats whose scales are per block only: the amax is unused, the results still equal.
PER_BLOCK = {
    "mxfp8": {"format": "mxfp8"},
    "blockwise": {"format": "blockwise"},
}


def quantizer(spec):
    return _quantizer_from_spec(spec, ROLE)


def raw(t):
    """The bytes of a buffer (bit equality: NaN amaxes compare equal to themselves)."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def assert_same(a, b):
    pa, pb = parts_of(a), parts_of(b)
    assert pa.keys() == pb.keys()
    for d in pa:
        for k in pa[d]:
            if pa[d][k] is None:
                assert pb[d][k] is None, (d, k)
            else:
                assert torch.equal(raw(pa[d][k]), raw(pb[d][k])), (d, k)


def reduced_amax(q, x):
    """A pair as a rank would get it from a max all-reduce: at least the local amax (2d
    nvfp4 shares one value between the directions)."""
    a = q.compute_amax(x)
    if q.spec_dict().get("2d"):
        return [max(a) * 1.5] * 2
    return [a[0] * 1.5, a[1] * 1.5]


def source(spec, device="cpu"):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if spec.get("hadamard") else torch.float32
    return (torch.randn(64, 96) * 3).to(device=device, dtype=dtype)


@pytest.mark.parametrize("usage", USAGES)
@pytest.mark.parametrize("name", {**PER_TENSOR, **PER_BLOCK})
def test_device_amax_quantize_equals_host_amax(name, usage):
    spec = {**PER_TENSOR, **PER_BLOCK}[name]
    q = quantizer(spec)
    x = source(spec)
    host = reduced_amax(q, x)
    a = q.quantize(x, USAGES[usage], amax=host)
    b = q.quantize(x, USAGES[usage], amax=torch.tensor(host, dtype=torch.float32))
    assert_same(a, b)
    # In place into existing buffers, too.
    c = q.quantize(torch.zeros_like(x), USAGES[usage])
    c.requantize(x, amax=torch.tensor(host, dtype=torch.float32))
    assert_same(a, c)


@pytest.mark.parametrize("name", {**PER_TENSOR, **PER_BLOCK})
def test_compute_amax_device_equals_host(name):
    spec = {**PER_TENSOR, **PER_BLOCK}[name]
    q = quantizer(spec)
    x = source(spec)
    got = q.compute_amax_device(x)
    assert got.dtype == torch.float32 and got.shape == (2,) and got.device == x.device
    assert got.tolist() == list(q.compute_amax(x))
    # Into a row of a table (requantize_'s concatenated amaxes).
    table = torch.full((3, 2), -1.0)
    out = q.compute_amax_device(x, out=table[1])
    assert out.data_ptr() == table[1].data_ptr()
    assert table[1].tolist() == list(q.compute_amax(x))
    assert table[0].tolist() == [-1.0, -1.0] and table[2].tolist() == [-1.0, -1.0]


def test_device_amax_extras_are_reported():
    assert quantizer(PER_TENSOR["float8_e4m3"]).has_device_amax
    assert quantizer(PER_TENSOR["nvfp4"]).has_device_amax
    # No extras: the engine's documented host-copy fallback (same results, tested above).
    assert not quantizer(PER_TENSOR["hybrid"]).has_device_amax


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([1.0, 2.0], dtype=torch.float64), "torch.float32"),
    (torch.tensor([1.0, 2.0, 3.0]), "shape (2,)"),
    (torch.tensor([[1.0, 2.0]]), "shape (2,)"),
    (torch.tensor([1.0, 0.0, 2.0, 0.0])[::2], "contiguous"),
    (torch.empty(2, device="meta"), "device"),
])
def test_bad_amax_tensor_is_refused(bad, message):
    q = quantizer(PER_TENSOR["float8_e4m3"])
    x = source({})
    with pytest.raises(Exception, match=re.escape(message)):
        q.quantize(x, 3, amax=bad)
    t = q.quantize(x, 3)
    with pytest.raises(Exception, match=re.escape(message)):
        t.requantize(x, amax=bad)
    with pytest.raises(Exception, match=re.escape(message)):
        q.compute_amax_device(x, out=bad)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0])
@pytest.mark.parametrize("name", ["float8_e4m3", "nvfp4"])
def test_odd_amax_values_behave_as_on_the_host(name, value):
    """NaN, inf, negative or zero amaxes: on the CPU the device path is the host path (the
    same error, or the same bytes by the scaling rules of qrecipe/scaling.hpp)."""
    q = quantizer(PER_TENSOR[name])
    x = source({})
    host_error = device_error = None
    try:
        a = q.quantize(x, 3, amax=[value, value])
    except Exception as e:  # noqa: BLE001 - compared below
        host_error = e
    try:
        b = q.quantize(x, 3, amax=torch.tensor([value, value]))
    except Exception as e:  # noqa: BLE001 - compared below
        device_error = e
    assert type(host_error) is type(device_error)
    if host_error is None:
        assert_same(a, b)
    else:
        assert str(host_error) in str(device_error)


# ---------------------------------------------------------------------------------- CUDA

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("usage", USAGES)
@pytest.mark.parametrize("name", {**PER_TENSOR, **PER_BLOCK})
def test_cuda_device_amax_equals_host_amax(name, usage):
    spec = {**PER_TENSOR, **PER_BLOCK}[name]
    q = quantizer(spec)
    x = source(spec, "cuda")
    assert q.compute_amax_device(x).tolist() == list(q.compute_amax(x))
    host = reduced_amax(q, x)
    a = q.quantize(x, USAGES[usage], amax=host)
    b = q.quantize(x, USAGES[usage], amax=torch.tensor(host, device="cuda"))
    assert_same(a, b)
    c = q.quantize(torch.zeros_like(x), USAGES[usage])
    c.requantize(x, amax=torch.tensor(host, device="cuda"))
    assert_same(a, c)


SYNC_FREE = ["float8_e4m3", "float8_e5m2_pow2", "float8_eps", "float8_delayed", "nvfp4",
             "nvfp4_2d", "nvfp4_hadamard"]


@cuda
@pytest.mark.parametrize("name", SYNC_FREE)
def test_cuda_device_amax_path_has_no_host_sync(name):
    """compute_amax_device -> (the all-reduce's place) -> quantize(amax=tensor): no sync. torch's
    sync debug mode catches torch-side syncs; a CUDA-graph capture refuses any sync of the
    plugin's own (cudaStreamSynchronize, a device-to-host copy) and the replay must give the
    eager bytes."""
    spec = PER_TENSOR[name]
    q = quantizer(spec)
    x = source(spec, "cuda")
    assert q.has_device_amax
    eager_amax = q.compute_amax_device(x)
    eager = q.quantize(x, 3, amax=eager_amax)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        amax = q.compute_amax_device(x)
        amax.mul_(1.0)  # stands for dist.all_reduce(amax, MAX) on one rank
        q.quantize(x, 3, amax=amax)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = q.quantize(torch.zeros_like(x), 3)  # buffers allocated before capture
        table = torch.zeros(2, device="cuda")
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        q.compute_amax_device(x, out=table)
        out.requantize(x, amax=table)
    graph.replay()
    torch.cuda.synchronize()
    assert table.tolist() == eager_amax.tolist()
    assert_same(eager, out)
