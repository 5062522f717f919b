"""qrecipe.nn.LayerNormLinear and LayerNormMLP: bit-identity with their torch composition when
nothing is quantized, the roles their GEMMs get (module types and per-GEMM names), every
shipped recipe within the per-format tolerance of test_recipes.py, convert() naming qrecipe
modules by path, and clear errors."""
import pytest
import torch
import torch.nn.functional as F

import qrecipe
from conftest import forward_backward
from test_recipes import DTYPE, TOLERANCE, rel  # one tolerance table for every module

NONE = qrecipe.Recipe.builtin("none")
TOKENS = 32  # NVFP4's Hadamard needs a multiple of 16 rows

# Reference activations written independently of qrecipe (TransformerEngine's definitions).
REF_ACT = {
    "gelu": torch.nn.GELU(approximate="tanh"), "relu": torch.nn.ReLU(),
    "silu": torch.nn.SiLU(), "qgelu": lambda a: a * torch.sigmoid(1.702 * a),
    "srelu": lambda a: F.relu(a) ** 2,
}
GATED = {"geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu",
         "sreglu": "srelu"}


def ref_activation(name, h):
    if name in GATED:
        a, b = h.chunk(2, dim=-1)
        return REF_ACT[GATED[name]](a) * b
    return REF_ACT[name](h)


def torch_norm(normalization, size, dtype):
    if normalization == "LayerNorm":
        return torch.nn.LayerNorm(size, eps=1e-5, dtype=dtype)
    return torch.nn.RMSNorm(size, eps=1e-5, dtype=dtype)


class TorchLayerNormLinear(torch.nn.Module):
    def __init__(self, d_in, d_out, normalization, bias=True, dtype=torch.float32):
        super().__init__()
        self.norm = torch_norm(normalization, d_in, dtype)
        self.linear = torch.nn.Linear(d_in, d_out, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.linear(self.norm(x))


class TorchLayerNormMLP(torch.nn.Module):
    def __init__(self, hidden, ffn, normalization, activation, bias=True, dtype=torch.float32):
        super().__init__()
        self.activation = activation
        self.norm = torch_norm(normalization, hidden, dtype)
        self.fc1 = torch.nn.Linear(hidden, 2 * ffn if activation in GATED else ffn, bias=bias,
                                   dtype=dtype)
        self.fc2 = torch.nn.Linear(ffn, hidden, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.fc2(ref_activation(self.activation, self.fc1(self.norm(x))))


def lnlinear_pair(normalization="LayerNorm", bias=True, dtype=torch.float32, d_in=32, d_out=48):
    ref = TorchLayerNormLinear(d_in, d_out, normalization, bias, dtype)
    ours = qrecipe.nn.LayerNormLinear(d_in, d_out, bias=bias, normalization=normalization,
                                      dtype=dtype, name="attn.qkv")
    return share_parameters(ref, ours, normalization)


def share_parameters(ref, ours, normalization):
    """Non-trivial norm parameters in `ref` (so they matter in the comparison), copied into
    `ours` parameter by parameter in registration order."""
    with torch.no_grad():
        ref.norm.weight.uniform_(0.5, 1.5)
        if normalization == "LayerNorm":
            ref.norm.bias.uniform_(-0.5, 0.5)
    ours.load_state_dict(dict(zip([n for n, _ in ours.named_parameters()],
                                  [p.detach() for p in ref.parameters()])))
    return ref, ours


def mlp_pair(normalization="LayerNorm", activation="gelu", bias=True, dtype=torch.float32,
             hidden=32, ffn=64, name="layers.0.mlp"):
    ref = TorchLayerNormMLP(hidden, ffn, normalization, activation, bias, dtype)
    ours = qrecipe.nn.LayerNormMLP(hidden, ffn, bias=bias, normalization=normalization,
                                   activation=activation, dtype=dtype, name=name)
    return share_parameters(ref, ours, normalization)


run = forward_backward  # [output, input grad, parameter grads...]


def assert_all_equal(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, i
        assert a.dtype == b.dtype and torch.equal(a, b), f"entry {i} differs"


MODES = ["outside", "recipe-none", "disabled"]


def run_mode(module, x, dy, mode):
    if mode == "outside":
        return run(module, x, dy, enabled=False)
    if mode == "recipe-none":
        return run(module, x, dy, recipe=NONE)
    return run(module, x, dy, recipe=qrecipe.Recipe.default(), enabled=False)


# ------------------------------------------------------------------ bit-identity (no quantization)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("mode", MODES)
def test_layernorm_linear_matches_torch_composition_bit_for_bit(dtype, normalization, mode):
    ref, ours = lnlinear_pair(normalization, bias=(normalization == "LayerNorm"), dtype=dtype)
    x = torch.randn(2, 5, 32, dtype=dtype)  # N-D input: leading dims are tokens
    dy = torch.randn(2, 5, 48, dtype=dtype)
    assert_all_equal(run_mode(ours, x, dy, mode), run(ref, x, dy, enabled=False))


@pytest.mark.parametrize("activation", sorted(["gelu", "relu", "silu", "qgelu", "srelu"]
                                              + sorted(GATED)))
def test_layernorm_mlp_matches_torch_composition_bit_for_bit(activation):
    ref, ours = mlp_pair("LayerNorm", activation)
    x = torch.randn(TOKENS, 32)
    dy = torch.randn(TOKENS, 32)
    want = run(ref, x, dy, enabled=False)
    assert_all_equal(run_mode(ours, x, dy, "outside"), want)
    assert_all_equal(run_mode(ours, x, dy, "recipe-none"), want)


@pytest.mark.parametrize("mode", MODES)
def test_layernorm_mlp_rmsnorm_bf16_no_bias_bit_for_bit(mode):
    ref, ours = mlp_pair("RMSNorm", "swiglu", bias=False, dtype=torch.bfloat16)
    assert ours.fc1_weight.shape == (128, 32) and ours.fc2_weight.shape == (32, 64)
    x = torch.randn(3, 4, 32, dtype=torch.bfloat16)
    dy = torch.randn(3, 4, 32, dtype=torch.bfloat16)
    assert_all_equal(run_mode(ours, x, dy, mode), run(ref, x, dy, enabled=False))


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_centered_gamma_uses_one_plus_weight_in_fp32(normalization, dtype):
    ours = qrecipe.nn.LayerNormLinear(32, 16, normalization=normalization,
                                      zero_centered_gamma=True, dtype=dtype)
    assert torch.equal(ours.layer_norm_weight, torch.zeros(32, dtype=dtype))  # gamma = 1
    with torch.no_grad():
        ours.layer_norm_weight.uniform_(-0.01, 0.01)  # small: lost in a bf16 1 + w
    x = torch.randn(8, 32, dtype=dtype)
    gamma = ours.layer_norm_weight.detach().float() + 1.0
    if normalization == "LayerNorm":
        ln = F.layer_norm(x.float(), (32,), gamma, ours.layer_norm_bias.detach().float(), 1e-5)
    else:
        ln = F.rms_norm(x.float(), (32,), gamma, 1e-5)
    ln = ln.to(dtype)
    y = ours(x)
    ours.return_layernorm_output = True
    y2, ln_out = ours(x)
    assert torch.equal(ln_out, ln)
    assert torch.equal(y, F.linear(ln, ours.weight, ours.bias)) and torch.equal(y, y2)


def test_return_layernorm_output_for_both_modules():
    ref, ours = lnlinear_pair()
    ours.return_layernorm_output = True
    x = torch.randn(TOKENS, 32)
    y, ln = ours(x)
    assert torch.equal(ln, ref.norm(x)) and torch.equal(y, ref(x))
    mref, mlp = mlp_pair()
    mlp.return_layernorm_output = True
    y, ln = mlp(x)
    assert torch.equal(ln, mref.norm(x)) and torch.equal(y, mref(x))


def test_reset_parameters_match_torch_init():
    torch.manual_seed(7)
    lin = torch.nn.Linear(32, 16)
    torch.manual_seed(7)
    ours = qrecipe.nn.LayerNormLinear(32, 16)
    assert torch.equal(ours.weight, lin.weight) and torch.equal(ours.bias, lin.bias)
    assert torch.equal(ours.layer_norm_weight, torch.ones(32))
    assert torch.equal(ours.layer_norm_bias, torch.zeros(32))
    torch.manual_seed(7)
    fc1, fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(64, 32)
    torch.manual_seed(7)
    mlp = qrecipe.nn.LayerNormMLP(32, 64, activation="swiglu", normalization="RMSNorm")
    assert mlp.layer_norm_bias is None
    assert [n for n, _ in mlp.named_parameters()] == [
        "layer_norm_weight", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
    assert torch.equal(mlp.fc1_weight, fc1.weight) and torch.equal(mlp.fc1_bias, fc1.bias)
    assert torch.equal(mlp.fc2_weight, fc2.weight) and torch.equal(mlp.fc2_bias, fc2.bias)
    with torch.no_grad():
        mlp.fc1_weight.zero_()
    mlp.reset_parameters()
    assert torch.equal(mlp.layer_norm_weight, torch.ones(32)) and mlp.fc1_weight.abs().sum() > 0


def test_meta_device_and_dtype_arguments():
    m = qrecipe.nn.LayerNormMLP(32, 64, device="meta", dtype=torch.bfloat16)
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in m.parameters())
    ln = qrecipe.nn.LayerNormLinear(32, 16, device="cpu", dtype=torch.float16)
    assert all(p.dtype == torch.float16 for p in ln.parameters())


# ------------------------------------------------------------------ roles
def test_module_types_belong_to_the_linear_family():
    # A rule on module_type linear reaches every linear-like module (TransformerEngine's
    # naming), a rule on one specific type reaches only that type.
    only_linear = qrecipe.Recipe.from_dict({
        "version": 1, "name": "linear-only", "defaults": {"format": "none"},
        "rules": [{"match": {"module_type": "linear"}, "quantizer": {"format": "float8"}}]})
    _, ours = lnlinear_pair()
    assert ours.roles(only_linear).weight.format == "float8"
    mlp = qrecipe.nn.LayerNormMLP(32, 64, name="m")
    assert all(r.weight.format == "float8" for r in mlp.resolve_roles(only_linear).values())
    g = qrecipe.nn.GroupedLinear(2, 32, 16, name="g")
    assert g.roles(only_linear).weight.format == "float8"
    only_mlp = qrecipe.Recipe.from_dict({
        "version": 1, "name": "mlp-only", "defaults": {"format": "none"},
        "rules": [{"match": {"module_type": "layernorm_mlp"}, "quantizer": {"format": "float8"}}]})
    ref, ours = lnlinear_pair()
    x, dy = torch.randn(TOKENS, 32), torch.randn(TOKENS, 48)
    assert_all_equal(run(ours, x, dy, recipe=only_mlp), run(ref, x, dy, enabled=False))
    assert ours.roles(only_mlp).all_none
    assert g.roles(only_mlp).all_none
    assert all(r.weight.format == "float8" for r in mlp.resolve_roles(only_mlp).values())


def test_layernorm_linear_quantizes_the_norm_output_with_its_input_role():
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "lnl", "defaults": {"format": "none"},
        "rules": [{"match": {"module_type": "layernorm_linear"},
                   "quantizer": {"format": "float8"}}]})
    _, ours = lnlinear_pair()
    x = torch.randn(TOKENS, 32)
    with qrecipe.autocast(recipe):
        y = ours(x)
    ln = F.layer_norm(x, (32,), ours.layer_norm_weight, ours.layer_norm_bias, 1e-5).detach()
    qx = recipe.quantizer("layernorm_linear", "input", "attn.qkv").quantize(ln, "rowwise")
    qw = recipe.quantizer("layernorm_linear", "weight", "attn.qkv").quantize(
        ours.weight.detach(), "rowwise")
    expected = qx.dequantize() @ qw.dequantize().t() + ours.bias.detach()
    # The engine sums in its own blocked order: compare at FP32 rounding level.
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(y, F.linear(ln, ours.weight, ours.bias))


def test_layernorm_mlp_gemms_are_named_fc1_and_fc2():
    # Only fc2 is quantized: fc1's output is exactly torch's, fc2 reads the activation
    # quantized by the role layernorm_mlp:input@layers.0.mlp.fc2.
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "fc2-only", "defaults": {"format": "none"},
        "rules": [{"match": {"module_type": "layernorm_mlp", "name": "*.fc2"},
                   "quantizer": {"format": "float8"}}]})
    _, mlp = mlp_pair(activation="swiglu")
    roles = mlp.resolve_roles(recipe)
    assert list(roles) == ["fc1", "fc2"] and roles["fc1"].all_none
    assert roles["fc2"].weight.role == "layernorm_mlp:weight@layers.0.mlp.fc2"
    x = torch.randn(TOKENS, 32)
    with qrecipe.autocast(recipe):
        y = mlp(x)
    w = {n: p.detach() for n, p in mlp.named_parameters()}
    h = F.linear(F.layer_norm(x, (32,), w["layer_norm_weight"], w["layer_norm_bias"], 1e-5),
                 w["fc1_weight"], w["fc1_bias"])
    a = ref_activation("swiglu", h)
    qa = recipe.quantizer("layernorm_mlp", "input", "layers.0.mlp.fc2").quantize(a, "rowwise")
    qw = recipe.quantizer("layernorm_mlp", "weight", "layers.0.mlp.fc2").quantize(
        w["fc2_weight"], "rowwise")
    torch.testing.assert_close(y, qa.dequantize() @ qw.dequantize().t() + w["fc2_bias"],
                               rtol=1e-5, atol=1e-5)


def test_explain_lists_every_gemm():
    mlp = qrecipe.nn.LayerNormMLP(32, 64, name="blk.mlp")
    text = mlp.explain(qrecipe.Recipe.builtin("mxfp8"))
    assert "layernorm_mlp blk.mlp.fc1 under recipe" in text
    assert "layernorm_mlp blk.mlp.fc2 under recipe" in text
    assert text.count("fprop") == 2 and "mxfp8" in text
    unnamed = qrecipe.nn.LayerNormLinear(32, 16).explain()
    assert unnamed.startswith("layernorm_linear <unnamed> under recipe default:")
    assert "LayerNormMLP(hidden_size=32, ffn_hidden_size=64" in repr(mlp)
    assert "name='blk.mlp'" in repr(mlp)


# ------------------------------------------------------------------ every shipped recipe
def quantized_under(recipe, module_type, names):
    return any(recipe.resolve(module_type, t, n) != "none"
               for n in names for t in ("input", "weight", "grad_output"))


@pytest.mark.parametrize("name", sorted(n for n in TOLERANCE if n != "none"))
@pytest.mark.parametrize("module", ["layernorm_linear", "layernorm_mlp"])
def test_every_shipped_recipe_within_tolerance(name, module):
    recipe = qrecipe.Recipe.builtin(name)
    dtype = DTYPE.get(name, torch.float32)
    if module == "layernorm_linear":
        ref, ours = lnlinear_pair(dtype=dtype)
        reference = TorchLayerNormLinear(32, 48, "LayerNorm")
        names, d_out = ["attn.qkv"], 48
    else:
        # A middle block: float8_bf16_ends keeps layers.0.* (and lm_head) unquantized by name.
        ref, ours = mlp_pair(activation="swiglu", dtype=dtype, name="layers.1.mlp")
        reference = TorchLayerNormMLP(32, 64, "LayerNorm", "swiglu")
        names, d_out = ["layers.1.mlp.fc1", "layers.1.mlp.fc2"], 32
    reference.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(TOKENS, 32, dtype=dtype)
    dy = torch.randn(TOKENS, d_out, dtype=dtype)
    if name == "float8_delayed":
        run(ours, x, dy, recipe)  # first step records amaxes; the next one uses their scales
    got = run(ours, x, dy, recipe)
    want = run(reference, x.float(), dy.float(), enabled=False)
    errors = [rel(g, w) for g, w in zip(got, want)]
    # Every shipped recipe quantizes these modules (hybrid_seed's `module_type: linear` rules
    # cover every linear-like module type).
    assert quantized_under(recipe, module, names)
    assert max(errors) <= TOLERANCE[name], f"{name}: {errors}"
    assert errors[0] > 0.0  # quantization happened


# ------------------------------------------------------------------ convert
class Block(torch.nn.Module):
    """Attention projections and an MLP from nn.Linear, next to qrecipe modules built directly
    (an attention input projection with its norm, a LayerNormMLP and MoE experts)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = qrecipe.nn.LayerNormLinear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = qrecipe.nn.LayerNormMLP(d, 2 * d, activation="swiglu")
        self.norm = torch.nn.LayerNorm(d)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(),
                                       torch.nn.Linear(2 * d, d))
        self.experts = qrecipe.nn.GroupedLinear(2, d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(x) + self.ffn(self.norm(x))
        rows = b * t
        return x + self.experts(x, [rows // 2, rows - rows // 2])


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.extra = qrecipe.nn.LayerNormMLP(32, 64, name="keep.me")

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x + self.extra(x)


def test_convert_names_every_qrecipe_module_by_its_path():
    model = Model()
    named = model.extra
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "by-name", "defaults": {"format": "none"},
        "rules": [
            {"match": {"name": "layers.0.*"}, "quantizer": {"format": "none"}},
            {"match": {"name": "*.fc2"}, "quantizer": {"format": "mxfp8"}},
            {"match": {"module_type": "grouped_linear", "tensor_type": "weight"},
             "quantizer": {"format": "blockwise"}},
            {"match": {}, "quantizer": {"format": "float8", "scaling": "current"}}]})
    assert qrecipe.convert(model, recipe=recipe) is model
    gemms = {}
    for path, module in model.named_modules():
        if not isinstance(module, (qrecipe.nn.QuantizedModule, qrecipe.nn.Linear)):
            continue
        if module is not named:
            assert module.name == path
        if isinstance(module, qrecipe.nn.QuantizedModule):
            roles = {module.role_name(g): r for g, r in module.resolve_roles(recipe).items()}
        else:
            roles = {module.name: module.roles(recipe)}
        for role_name, r in roles.items():
            gemms[role_name] = module.MODULE_TYPE
            for tensor_type in ("input", "weight", "grad_output"):
                q = getattr(r, tensor_type)
                want = recipe.resolve(module.MODULE_TYPE, tensor_type, role_name)
                assert (q.spec if q is not None else "none") == want, (role_name, tensor_type)
    assert named.name == "keep.me"  # an existing name is kept
    expected = {}
    for i in range(2):
        p = f"layers.{i}"
        expected.update({f"{p}.qkv": "layernorm_linear", f"{p}.proj": "linear",
                         f"{p}.mlp.fc1": "layernorm_mlp", f"{p}.mlp.fc2": "layernorm_mlp",
                         f"{p}.ffn.0": "linear", f"{p}.ffn.2": "linear",
                         f"{p}.experts": "grouped_linear"})
    expected.update({"keep.me.fc1": "layernorm_mlp", "keep.me.fc2": "layernorm_mlp"})
    assert gemms == expected
    # The rules really differ per path: layer 0 none, fc2 mxfp8, experts' weight blockwise.
    assert recipe.resolve("layernorm_mlp", "weight", "layers.0.mlp.fc2") == "none"
    assert recipe.resolve("layernorm_mlp", "weight", "layers.1.mlp.fc2").startswith("mxfp8")
    assert recipe.resolve("grouped_linear", "weight", "layers.1.experts").startswith("blockwise")
    x = torch.randn(2, 16, 32)
    y_ref = model(x)
    with qrecipe.autocast(recipe):
        y = model(x)
    y.square().mean().backward()
    assert 0 < rel(y.detach(), y_ref.detach()) < 0.1


# ------------------------------------------------------------------ errors
def test_bad_arguments_and_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="normalization 'BatchNorm'.*'LayerNorm' or 'RMSNorm'"):
        qrecipe.nn.LayerNormLinear(32, 16, normalization="BatchNorm")
    with pytest.raises(ValueError, match="normalization 'layernorm'"):
        qrecipe.nn.LayerNormMLP(32, 64, normalization="layernorm")
    with pytest.raises(ValueError, match="activation 'tanh'.*swiglu"):
        qrecipe.nn.LayerNormMLP(32, 64, activation="tanh")
    lnl = qrecipe.nn.LayerNormLinear(32, 16, name="attn.qkv")
    mlp = qrecipe.nn.LayerNormMLP(32, 64, name="mlp")
    for enabled in (False, True):
        with qrecipe.autocast(enabled=enabled):
            with pytest.raises(ValueError, match="LayerNormLinear 'attn.qkv'.*in_features=32"):
                lnl(torch.randn(4, 30))
            with pytest.raises(ValueError, match="LayerNormMLP 'mlp'.*hidden_size=32"):
                mlp(torch.randn(4, 64))
            with pytest.raises(TypeError, match="torch.Tensor"):
                mlp([1.0] * 32)
    with qrecipe.autocast():
        with pytest.raises(TypeError, match="float64"):
            lnl.double()(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(KeyError, match="no GEMM 'fc3'"):
        mlp.roles(qrecipe.Recipe.default(), gemm="fc3")


def test_copy_and_pickle_drop_the_role_cache(tmp_path):
    import copy
    _, mlp = mlp_pair()
    x = torch.randn(TOKENS, 32)
    with qrecipe.autocast():
        y = mlp(x)
    clone = copy.deepcopy(mlp)
    torch.save(mlp, tmp_path / "mlp.pt")
    loaded = torch.load(tmp_path / "mlp.pt", weights_only=False)
    with qrecipe.autocast():
        assert torch.equal(clone(x), y) and torch.equal(loaded(x), y)


# ------------------------------------------------------------------ training-loop options
def test_weight_cache_across_microbatches_for_both_gemms():
    from qrecipe.nn import weight_cache
    _, mlp = mlp_pair()
    recipe = qrecipe.Recipe.default()
    xs = [torch.randn(TOKENS, 32) for _ in range(3)]
    with qrecipe.autocast(recipe):
        want = [mlp(x) for x in xs]
    weight_cache.reset_stats()
    with qrecipe.autocast(recipe):
        got = [mlp(x, is_first_microbatch=(i == 0)) for i, x in enumerate(xs)]
    assert weight_cache.stats["quantized"] == 2  # fc1 and fc2, once
    assert weight_cache.stats["reused"] == 4
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_fused_wgrad_accumulation_into_main_grad():
    import copy
    _, plain = lnlinear_pair()
    fused = copy.deepcopy(plain)
    fused.fuse_wgrad_accumulation = True
    fused.weight.main_grad = torch.zeros_like(fused.weight, dtype=torch.float32)
    for _ in range(2):  # two micro-batches accumulate
        x, dy = torch.randn(TOKENS, 32), torch.randn(TOKENS, 48)
        for module in (plain, fused):
            with qrecipe.autocast():
                module(x).backward(dy)
    assert fused.weight.grad is None
    assert torch.equal(fused.weight.main_grad, plain.weight.grad)
    for name in ("layer_norm_weight", "layer_norm_bias", "bias"):
        assert torch.equal(getattr(fused, name).grad, getattr(plain, name).grad)


def test_scaling_state_of_both_gemms_round_trips_through_state_dict():
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    _, mlp = mlp_pair()
    x = torch.randn(TOKENS, 32)
    for _ in range(2):
        with qrecipe.autocast(recipe):
            mlp(x).sum().backward()
    sd = mlp.state_dict()
    owners = sorted(s["owner"] for s in sd["_extra_state"]["entries"][0]["scaling_states"])
    assert owners == sorted(f"layernorm_mlp:{t}@layers.0.mlp.{g} float8"
                            for g in ("fc1", "fc2") for t in ("input", "weight", "grad_output"))
    fresh_recipe = qrecipe.Recipe.builtin("float8_delayed")
    clone = qrecipe.nn.LayerNormMLP(32, 64, name="layers.0.mlp")
    clone.load_state_dict(sd)
    # States read inside each block: entering the next outermost block advances the
    # scaling of every recipe that ran.
    with qrecipe.autocast(recipe):
        y = mlp(x)
        states = recipe.scaling_states()
    with qrecipe.autocast(fresh_recipe):
        y_clone = clone(x)
        states_clone = fresh_recipe.scaling_states()
    assert torch.equal(y, y_clone)
    assert states == states_clone and len(states) == 6


def test_quantized_model_init_quantizes_both_gemm_weights_by_their_roles():
    recipe = qrecipe.Recipe.from_dict({
        "version": 1, "name": "fc1-weight", "defaults": {"format": "none"},
        "rules": [{"match": {"tensor_type": "weight", "name": "*.fc1"},
                   "quantizer": {"format": "float8"}},
                  {"match": {"module_type": "layernorm_linear"},
                   "quantizer": {"format": "float8"}}]})
    with qrecipe.quantized_model_init(recipe):
        mlp = qrecipe.nn.LayerNormMLP(32, 64, name="blk.mlp")
        lnl = qrecipe.nn.LayerNormLinear(32, 16, name="blk.qkv")
    assert isinstance(mlp.fc1_weight, qrecipe.QuantizedWeight)
    assert mlp.fc1_weight.engine_tensor.quantizer.role == "layernorm_mlp:weight@blk.mlp.fc1"
    assert not isinstance(mlp.fc2_weight, qrecipe.QuantizedWeight)  # its role is none
    assert not isinstance(mlp.layer_norm_weight, qrecipe.QuantizedWeight)
    assert isinstance(lnl.weight, qrecipe.QuantizedWeight)
    assert [n for n, _ in mlp.named_parameters()] == [
        "layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight",
        "fc2_bias"]
    # fc1 reads the stored bytes: its output equals the GEMM of the recipe's quantized input
    # and the weight's own quantized data.
    x = torch.randn(TOKENS, 32)
    w = {n: p.detach() for n, p in mlp.named_parameters()}
    ln = F.layer_norm(x, (32,), w["layer_norm_weight"], w["layer_norm_bias"], 1e-5)
    mlp.return_layernorm_output = True
    with qrecipe.autocast(recipe):
        y, ln_out = mlp(x.requires_grad_())
    y.sum().backward()
    assert torch.equal(ln_out, ln) and x.grad is not None
    qx = recipe.quantizer("layernorm_mlp", "input", "blk.mlp.fc1")
    h = ln @ mlp.fc1_weight.dequantize().t() + w["fc1_bias"]  # input role none: dense x
    assert qx is None
    y_want = F.linear(ref_activation("gelu", h), w["fc2_weight"], w["fc2_bias"])
    torch.testing.assert_close(y, y_want, rtol=1e-5, atol=1e-5)
