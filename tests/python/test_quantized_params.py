"""qrecipe.quantized_model_init and QuantizedWeight: parameters stored quantized, GEMMs on
their bytes, dequantizing fallback for other ops, copies, pickling and clear errors; every
module's weights (GroupedLinear's single parameter as a grouped weight, one quantized
tensor per expert)."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F

import qrecipe

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
def test_gemms_use_the_stored_bytes(recipe_name, dtype, weight_quantizations):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    plain, layer = plain_and_quantized(recipe, dtype)
    # The stored bytes are the plain weight quantized once by the role's quantizer.
    once = recipe.quantizer("linear", "weight", "fc").quantize(plain.weight.detach())
    assert same_bytes(layer.weight, once)

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
    with pytest.raises(RuntimeError, match="FusedAdam, which keeps an FP32 master"):
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
    check_copy(layer, torch.load(buffer, weights_only=False))
    # A state dict holding QuantizedWeights loads with weights_only=True (torch's default) as
    # it is: import qrecipe allow-lists the one rebuild function.
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
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


# ------------------------------------------------------------------ every module
# name -> (constructor, the GEMM weights: parameter -> (role name, row groups), forward)
SPLITS = [32, 0, 64]  # rows per expert, an empty one included (multiples of 32 for mxfp8)
MODULES = {
    "layernorm_linear": (lambda dtype: qrecipe.nn.LayerNormLinear(64, 32, dtype=dtype,
                                                                  name="blk.qkv"),
                         {"weight": ("blk.qkv", 1)}, lambda m, x: m(x)),
    "layernorm_mlp": (lambda dtype: qrecipe.nn.LayerNormMLP(64, 32, activation="swiglu",
                                                            dtype=dtype, name="blk.mlp"),
                      {"fc1_weight": ("blk.mlp.fc1", 1), "fc2_weight": ("blk.mlp.fc2", 1)},
                      lambda m, x: m(x)),
    "grouped_single": (lambda dtype: qrecipe.nn.GroupedLinear(3, 64, 32, dtype=dtype,
                                                              name="moe"),
                       {"weight": ("moe", 3)}, lambda m, x: m(x, SPLITS)),
    "grouped_multi": (lambda dtype: qrecipe.nn.GroupedLinear(
        3, 64, 32, single_grouped_parameter=False, dtype=dtype, name="moe"),
        {f"weight{i}": ("moe", 1) for i in range(3)}, lambda m, x: m(x, SPLITS)),
}


def plain_and_quantized_module(kind, recipe=DEFAULT, dtype=torch.float32, seed=3):
    make = MODULES[kind][0]
    torch.manual_seed(seed)
    plain = make(dtype)
    torch.manual_seed(seed)
    with qrecipe.quantized_model_init(recipe):
        quantized = make(dtype)
    return plain, quantized


def weights_of(kind):
    return MODULES[kind][1]


def same_grouped_bytes(a, b):
    assert a.num_groups == b.num_groups
    return all(same_bytes(a.group(i), b.group(i)) for i in range(a.num_groups))


@pytest.mark.parametrize("kind", sorted(MODULES))
@pytest.mark.parametrize("recipe_name,dtype", [("default", torch.float32),
                                               ("mxfp8", torch.bfloat16),
                                               ("blockwise", torch.float32)])
def test_every_module_is_created_quantized_and_its_gemms_use_the_stored_bytes(
        kind, recipe_name, dtype, weight_quantizations):
    recipe = qrecipe.Recipe.builtin(recipe_name)
    plain, module = plain_and_quantized_module(kind, recipe, dtype)
    weights = weights_of(kind)
    for param, (role_name, groups) in weights.items():
        w = getattr(module, param)
        assert isinstance(w, qrecipe.QuantizedWeight) and isinstance(w, torch.nn.Parameter)
        assert w.num_groups == groups and w.shape == getattr(plain, param).shape
        quantizer = recipe.quantizer(module.MODULE_TYPE, "weight", role_name)
        assert w.options == quantizer.describe()
        # Each group is exactly that group's rows quantized alone (an expert's own scales).
        for i, rows in enumerate(getattr(plain, param).detach().chunk(groups)):
            assert same_bytes(w.group(i), quantizer.quantize(rows)), (param, i)
    for name, p in module.named_parameters():  # norms and biases stay high precision
        assert isinstance(p, qrecipe.QuantizedWeight) == (name in weights), name

    forward = MODULES[kind][2]
    x = torch.randn(sum(SPLITS), 64, dtype=dtype)
    dy = torch.randn(sum(SPLITS), 64 if kind == "layernorm_mlp" else 32, dtype=dtype)
    results = []
    for m in (plain, module):
        xi = x.clone().requires_grad_()
        with qrecipe.autocast(recipe):
            y = forward(m, xi)
        y.backward(dy)
        results.append([y, xi.grad] + [p.grad for p in m.parameters()])
    assert len(weight_quantizations) == (3 if kind.startswith("grouped") else len(weights))
    for i, (a, b) in enumerate(zip(*results)):  # the plain module's only
        assert type(b) is torch.Tensor and torch.equal(a, b), i


def test_grouped_quantized_weight_holds_one_quantized_tensor_per_expert():
    w = torch.randn(96, 64)
    w[64:] *= 100  # expert 2's values are much larger: a shared scale would crush the others
    quantizer = DEFAULT.quantizer("grouped_linear", "weight", "moe")
    grouped_w = qrecipe.QuantizedWeight.from_tensor(w, quantizer, groups=3)
    assert grouped_w.num_groups == 3 and grouped_w.shape == (96, 64)
    assert "groups=3" in repr(grouped_w)
    scales = [float(grouped_w.group(i).rowwise_scale_inv) for i in range(3)]
    assert scales[0] != scales[2] and scales[2] > 50 * scales[0]  # per-expert scales
    expected = torch.cat([quantizer.quantize(rows).dequantize() for rows in w.chunk(3)])
    assert torch.equal(grouped_w.dequantize(), expected)
    assert torch.equal(grouped_w * 1, expected)  # the fallback decodes every group
    assert not torch.equal(expected, quantizer.quantize(w).dequantize())
    with pytest.raises(ValueError, match="3 row groups.*group\\(i\\)"):
        grouped_w.rowwise_data
    with pytest.raises(ValueError, match="groups=5 must be a positive int dividing"):
        qrecipe.QuantizedWeight.from_tensor(w, quantizer, groups=5)
    # Flattening names every group's tensors; unflattening and pickling rebuild the groups.
    names, ctx = grouped_w.__tensor_flatten__()
    assert names[:3] == ["_g0_rowwise_data", "_g0_rowwise_scale_inv", "_g0_rowwise_amax"]
    assert len(names) == 18 and ctx["group_rows"] == (32, 32, 32)
    rebuilt = qrecipe.QuantizedWeight.__tensor_unflatten__(
        {n: getattr(grouped_w, n) for n in names}, ctx, grouped_w.shape, grouped_w.stride())
    assert same_grouped_bytes(rebuilt, grouped_w)
    assert same_grouped_bytes(pickle.loads(pickle.dumps(grouped_w)), grouped_w)
    assert same_grouped_bytes(grouped_w.clone(), grouped_w)
    # copy_ from a plain tensor re-quantizes each group on its own rows, in place.
    aliased = grouped_w.group(1).rowwise_data
    with torch.no_grad():
        grouped_w.copy_(w.flip(0))
    assert same_grouped_bytes(grouped_w, qrecipe.QuantizedWeight.from_tensor(
        w.flip(0), quantizer, groups=3))
    assert torch.equal(aliased, grouped_w.group(1).rowwise_data)


def test_quantized_grouped_module_state_dict_copies_and_training_errors():
    plain, module = plain_and_quantized_module("grouped_single")
    other_plain, other = plain_and_quantized_module("grouped_single", seed=9)
    x = torch.randn(sum(SPLITS), 64)
    # A plain checkpoint loads by re-quantizing each expert; a quantized one byte for byte.
    other.load_state_dict(plain.state_dict())
    assert same_grouped_bytes(other.weight, module.weight)
    other_plain2, other2 = plain_and_quantized_module("grouped_single", seed=9)
    other2.load_state_dict(module.state_dict())
    assert same_grouped_bytes(other2.weight, module.weight)
    for copied in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert isinstance(copied.weight, torch.nn.Parameter)
        assert copied.weight.num_groups == 3 and same_grouped_bytes(copied.weight, module.weight)
        with qrecipe.autocast(DEFAULT):
            assert torch.equal(copied(x, SPLITS), module(x, SPLITS))
    # Outside autocast: F.linear per expert on its decoded weight; gradients reach `weight`.
    xg = x.clone().requires_grad_()
    y = module(xg, SPLITS)
    decoded = module.weight.dequantize().detach()
    want = torch.cat([F.linear(xi, wi, bi) for xi, wi, bi in zip(
        x.split(SPLITS), decoded.split(32), module.bias.detach().split(32))])
    assert torch.equal(y, want)
    y.sum().backward()
    assert type(module.weight.grad) is torch.Tensor and module.weight.grad.shape == (96, 64)
    assert torch.equal(module.weight.grad[32:64], torch.zeros(32, 64))  # the empty expert
    # Main-grad accumulation reaches the grouped weight's rows; .grad stays None.
    module.zero_grad(set_to_none=True)
    plain.zero_grad(set_to_none=True)
    module.fuse_wgrad_accumulation = True
    module.weight.main_grad = torch.zeros(96, 64)
    with qrecipe.autocast(DEFAULT):
        module(x, SPLITS).sum().backward()
        plain(x, SPLITS).sum().backward()
    assert module.weight.grad is None and torch.equal(module.weight.main_grad, plain.weight.grad)
    module.weight.grad = torch.ones(96, 64)
    with pytest.raises(RuntimeError, match="FusedAdam, which keeps an FP32 master"):
        torch.optim.SGD([module.weight], lr=0.1).step()
    # reset_parameters() re-initialises the quantized weight: the values a plain module draws
    # from the same seed, each expert quantized on its own.
    torch.manual_seed(5)
    module.reset_parameters()
    torch.manual_seed(5)
    plain.reset_parameters()
    redrawn = qrecipe.QuantizedWeight.from_tensor(
        plain.weight.detach(), module.weight._qstorage.quantizer, groups=3)
    assert all(same_bytes(module.weight.group(i), redrawn.group(i)) for i in range(3))
    # A weight of the wrong number of groups is refused with what to do.
    module.weight = torch.nn.Parameter(qrecipe.QuantizedWeight.from_tensor(
        plain.weight, DEFAULT.quantizer("grouped_linear", "weight", "moe")))
    with pytest.raises(RuntimeError, match="1 row group.*num_gemms=3"):
        module(x, SPLITS)
