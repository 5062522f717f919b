"""qrecipe.quantized_model_init and QuantizedWeight: parameters stored quantized, GEMMs on
their bytes, dequantizing fallback for other ops, copies, pickling and clear errors."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F

import qrecipe
from qrecipe.nn import linear_function

DEFAULT = qrecipe.Recipe.default()


def plain_and_quantized(recipe=DEFAULT, dtype=torch.float32, seed=3, bias=True):
    """The same layer twice from the same seed: plain, and created under
    quantized_model_init (so its weight is the plain weight, quantized once)."""
    torch.manual_seed(seed)
    plain = qrecipe.nn.Linear(64, 32, bias=bias, dtype=dtype, name="fc")
    torch.manual_seed(seed)
    with qrecipe.quantized_model_init(recipe):
        quantized = qrecipe.nn.Linear(64, 32, bias=bias, dtype=dtype, name="fc")
    return plain, quantized


def same_bytes(a, b):
    for name in ("rowwise_data", "rowwise_scale_inv", "rowwise_amax", "columnwise_data",
                 "columnwise_scale_inv", "columnwise_amax"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        elif not torch.equal(x, y):
            return False
    return True


def test_creation():
    plain, layer = plain_and_quantized()
    w = layer.weight
    assert isinstance(w, qrecipe.QuantizedWeight) and qrecipe.QuantizedParameter is type(w)
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad
    assert w.shape == (32, 64) and w.dtype == torch.float32 and w.device.type == "cpu"
    assert w.format == "float8" and w.usage == ("rowwise", "columnwise")
    assert w.options == DEFAULT.quantizer("linear", "weight", "fc").describe()
    assert w.rowwise_data.dtype == torch.uint8 and w.rowwise_data.shape == (32, 64)
    assert w.columnwise_data.shape == (64, 32)  # float8 columnwise is stored transposed
    assert type(layer.bias) is torch.nn.Parameter  # biases stay high precision
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    assert type(plain.weight) is torch.nn.Parameter  # outside the block: plain
    with qrecipe.quantized_model_init(DEFAULT):
        with qrecipe.quantized_model_init(enabled=False):
            off = qrecipe.nn.Linear(8, 8)
        hp = qrecipe.nn.Linear(8, 8, name="x")
    assert type(off.weight) is torch.nn.Parameter
    assert isinstance(hp.weight, qrecipe.QuantizedWeight)
    # A recipe keeping the weight in high precision leaves it a plain parameter.
    with qrecipe.quantized_model_init(qrecipe.Recipe.builtin("none")):
        none = qrecipe.nn.Linear(8, 8)
    assert type(none.weight) is torch.nn.Parameter


@pytest.mark.parametrize("recipe_name,dtype", [("default", torch.float32),
                                               ("mxfp8", torch.bfloat16),
                                               ("blockwise", torch.float32)])
def test_gemms_use_the_stored_bytes(recipe_name, dtype, monkeypatch):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    plain, layer = plain_and_quantized(recipe, dtype)
    # The stored bytes are the plain weight quantized once by the role's quantizer.
    once = recipe.quantizer("linear", "weight", "fc").quantize(plain.weight.detach())
    assert same_bytes(layer.weight, once)

    weight_quantizations = []
    original = linear_function._quantize

    def counting(quantizer, tensor, usage):
        if ":weight@" in quantizer.role:
            weight_quantizations.append(usage)
        return original(quantizer, tensor, usage)

    monkeypatch.setattr(linear_function, "_quantize", counting)
    x = torch.randn(16, 64, dtype=dtype)
    dy = torch.randn(16, 32, dtype=dtype)
    results = []
    for module in (plain, layer):
        xi = x.clone().requires_grad_()
        with qrecipe.autocast(recipe):
            y = module(xi)
        y.backward(dy)
        results.append((y, xi.grad, module.weight.grad, module.bias.grad))
    assert len(weight_quantizations) == 1  # the plain layer's; none for the stored weight
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert type(layer.weight.grad) is torch.Tensor  # gradients are plain tensors


def test_dequantize():
    plain, layer = plain_and_quantized()
    expected = DEFAULT.quantizer("linear", "weight", "fc").quantize(
        plain.weight.detach()).dequantize("rowwise")
    d = layer.weight.dequantize()
    assert type(d) is torch.Tensor and d.dtype == torch.float32
    assert torch.equal(d, expected)
    assert not torch.equal(d, plain.weight)  # it is quantized
    assert layer.weight.dequantize(torch.bfloat16).dtype == torch.bfloat16
    # Differentiable, straight through.
    layer.weight.dequantize().sum().backward()
    assert torch.equal(layer.weight.grad, torch.ones(32, 64))


def test_unsupported_ops_fall_back_to_the_dequantized_tensor():
    _, layer = plain_and_quantized()
    w = layer.weight
    d = w.dequantize().detach()
    assert torch.equal(w * 2, d * 2) and type(w * 2) is torch.Tensor
    assert torch.equal(w.sum(0), d.sum(0))
    assert torch.equal(w.t(), d.t())
    assert torch.equal(w.float(), d)  # same dtype: still a plain copy of the decode
    x = torch.randn(4, 64)
    assert torch.equal(F.linear(x, w), F.linear(x, d))
    # Outside autocast the module is F.linear on the decoded weight; grads reach the parameter.
    y = layer(x)
    assert torch.equal(y, F.linear(x, d, layer.bias))
    y.sum().backward()
    assert torch.equal(layer.weight.grad, torch.ones(4, 32).t() @ x)


@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_update_of_a_quantized_weight_is_a_clear_error(foreach):
    _, layer = plain_and_quantized()
    before = layer.weight.rowwise_data.clone()
    with qrecipe.autocast(DEFAULT):
        layer(torch.randn(8, 64)).sum().backward()
    opt = torch.optim.SGD([layer.weight], lr=0.1, foreach=foreach)
    with pytest.raises(RuntimeError, match="Keep FP32 master weights"):
        opt.step()
    assert torch.equal(layer.weight.rowwise_data, before)
    with pytest.raises(RuntimeError, match="in place"):
        with torch.no_grad():
            layer.weight.mul_(2)


def test_copy_requantizes_and_master_weight_workflow():
    plain, layer = plain_and_quantized()
    quantizer = DEFAULT.quantizer("linear", "weight", "fc")
    aliased = layer.weight.rowwise_data  # the engine's bytes: copy_ writes them in place
    master = plain.weight.detach().clone()
    opt = torch.optim.SGD([master], lr=0.5)
    for _ in range(2):
        master.grad = torch.randn_like(master)
        opt.step()
        with torch.no_grad():
            layer.weight.copy_(master)  # re-quantize the updated master weight
        assert same_bytes(layer.weight, quantizer.quantize(master))
    assert torch.equal(aliased, layer.weight.rowwise_data)
    # From another QuantizedWeight of the same format: byte for byte.
    _, other = plain_and_quantized(seed=9)
    with torch.no_grad():
        layer.weight.copy_(other.weight)
    assert same_bytes(layer.weight, other.weight)


def test_load_state_dict_between_quantized_models_is_bit_exact():
    _, a = plain_and_quantized(seed=1)
    _, b = plain_and_quantized(seed=2)
    assert not same_bytes(a.weight, b.weight)
    b.load_state_dict(a.state_dict())
    assert same_bytes(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert isinstance(b.weight, qrecipe.QuantizedWeight)


def check_copy(original, copied):
    assert isinstance(copied.weight, qrecipe.QuantizedWeight)
    assert isinstance(copied.weight, torch.nn.Parameter)
    assert copied.weight.requires_grad
    assert copied.weight.options == original.weight.options
    assert same_bytes(copied.weight, original.weight)
    assert copied.weight.rowwise_data.data_ptr() != original.weight.rowwise_data.data_ptr()
    x = torch.randn(8, 64)
    with qrecipe.autocast(DEFAULT):
        assert torch.equal(copied(x), original(x))


def test_deepcopy_and_pickle():
    _, layer = plain_and_quantized(recipe=qrecipe.Recipe.builtin("mxfp8"))
    check_copy(layer, copy.deepcopy(layer))
    check_copy(layer, pickle.loads(pickle.dumps(layer)))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    # A QuantizedWeight is rebuilt by qrecipe code: not loadable with weights_only=True
    # unless qrecipe.quantized_param._rebuild is allow-listed (torch.serialization).
    check_copy(layer, torch.load(buffer, weights_only=False))
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buffer, weights_only=True)
    buffer.seek(0)
    with torch.serialization.safe_globals([qrecipe.quantized_param._rebuild]):
        state = torch.load(buffer, weights_only=True)
    assert same_bytes(state["weight"], layer.weight)
    w = pickle.loads(pickle.dumps(layer.weight.detach()))
    assert type(w) is qrecipe.QuantizedWeight and not isinstance(w, torch.nn.Parameter)


def test_tensor_flatten_round_trip():
    _, layer = plain_and_quantized()
    w = layer.weight.detach()
    names, ctx = w.__tensor_flatten__()
    assert names == ["_rowwise_data", "_rowwise_scale_inv", "_rowwise_amax",
                     "_columnwise_data", "_columnwise_scale_inv", "_columnwise_amax"]
    inner = {n: getattr(w, n) for n in names}
    assert all(type(t) is torch.Tensor for t in inner.values())
    rebuilt = qrecipe.QuantizedWeight.__tensor_unflatten__(inner, ctx, w.shape, w.stride())
    assert same_bytes(rebuilt, w) and rebuilt.options == w.options
    assert torch.equal(rebuilt.dequantize(), w.dequantize())


def test_device_moves_keep_the_bytes_and_dtype_changes_decode():
    _, layer = plain_and_quantized()
    w = layer.weight
    # What .to(device) / .cuda() dispatch to; on this CPU-only test the device stays cpu.
    moved = torch.ops.aten._to_copy.default(w, device=torch.device("cpu"), dtype=torch.float32)
    assert type(moved) is qrecipe.QuantizedWeight and same_bytes(moved, w)
    assert moved.rowwise_data.data_ptr() != w.rowwise_data.data_ptr()  # a copy
    decoded = w.to(torch.bfloat16)  # a dtype change: the decoded tensor, converted
    assert type(decoded) is torch.Tensor
    assert torch.equal(decoded, w.dequantize().detach().to(torch.bfloat16))
