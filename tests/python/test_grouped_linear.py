"""qrecipe.nn.GroupedLinear: the same numbers as separate layers (torch.nn.Linear when nothing is
quantized, qrecipe.nn.Linear under every shipped recipe) bit for bit, including experts with
no rows; the single-parameter layout and its offsets; m_splits validation; the weight cache
across micro-batches in both layouts (per expert, stale when the grouped weight changes); the
single parameter quantized by one grouped engine call (``_C.quantize_grouped``: float8, mxfp8,
blockwise and nvfp4 through their plugins' grouped extra, hybrid through the engine's per-group
loop) with each expert's bytes equal to quantizing it alone."""
import gc

import pytest
import torch
import torch.nn.functional as F

import qrecipe
from test_offload import Recording  # saved-tensor hooks that copy and note what they see
from test_recipes import DTYPE, TOLERANCE, rel  # one tolerance table for every module

NONE = qrecipe.Recipe.builtin("none")
IN, OUT = 32, 32
# Rows per expert, zeros included. Multiples of 32: MXFP8's columnwise blocks run down 32
# rows and NVFP4's Hadamard needs multiples of 16.
SPLITS = [32, 0, 64]


def grouped(single=True, bias=True, dtype=torch.float32, n=3, name="moe.experts"):
    return qrecipe.nn.GroupedLinear(n, IN, OUT, bias=bias, single_grouped_parameter=single,
                                    dtype=dtype, name=name)


def separate_layers(module, cls=torch.nn.Linear, **kwargs):
    """One layer per expert holding a copy of that expert's weight and bias."""
    layers = []
    for w, b in zip(module.expert_weights(), module.expert_biases()):
        layer = cls(IN, OUT, bias=b is not None, dtype=w.dtype, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(w)
            if b is not None:
                layer.bias.copy_(b)
        layers.append(layer)
    return layers


def run_grouped(module, x, dy, splits, recipe=None, enabled=True):
    """Output, input gradient, then the per-expert weight and bias gradients."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    with qrecipe.autocast(recipe, enabled=enabled):
        y = module(x, splits)
    y.backward(dy)
    if module.single_grouped_parameter:
        wg = list(module.weight.grad.split(module.out_features))
        bg = list(module.bias.grad.split(module.out_features)) if module.use_bias else []
    else:
        wg = [getattr(module, f"weight{i}").grad for i in range(module.num_gemms)]
        bg = [getattr(module, f"bias{i}").grad for i in range(module.num_gemms)] \
            if module.use_bias else []
    return [y.detach(), x.grad] + wg + bg


def run_separate(layers, x, dy, splits, recipe=None, enabled=True):
    """The separate layers' forwards, then their backwards one by one in expert order: the
    order a grouped call quantizes the experts' gradients in (a stochastic-rounding role
    gives each call the next offset, so the order decides which expert gets which)."""
    x = x.detach().clone().requires_grad_()
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    with qrecipe.autocast(recipe, enabled=enabled):
        ys = [layer(xi) for layer, xi in zip(layers, x.split(splits))]
    for yi, dyi in zip(ys, dy.split(splits)):
        yi.backward(dyi)
    y = torch.cat([yi.detach() for yi in ys])
    return ([y, x.grad] + [layer.weight.grad for layer in layers]
            + [layer.bias.grad for layer in layers if layer.bias is not None])


def assert_all_equal(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, f"entry {i} is None"
        assert a.dtype == b.dtype and torch.equal(a, b), f"entry {i} differs"


# Recipes whose grouped kernel on CUDA accumulates in another order than the per-expert
# cuBLASLt GEMMs (the CUTLASS FP32 block-scaled kernel).
GROUPED_ORDER_DIFFERS = ("blockwise",)


def assert_all_within_frobenius(got, want, limit):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, f"entry {i} is None"
        assert a.dtype == b.dtype and a.shape == b.shape, f"entry {i}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        ref = b.double().norm()
        err = (a.double() - b.double()).norm()
        assert err <= limit * ref, f"entry {i}: relative Frobenius error {float(err / ref):.3g} > {limit:.3g}"


# ------------------------------------------------------------------ no quantization
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("mode", ["outside", "recipe-none", "disabled"])
def test_matches_separate_torch_linears_bit_for_bit(dtype, single, mode):
    module = grouped(single, dtype=dtype)
    layers = separate_layers(module)
    splits = [5, 0, 11]
    x = torch.randn(sum(splits), IN, dtype=dtype)
    dy = torch.randn(sum(splits), OUT, dtype=dtype)
    recipe = {"outside": None, "recipe-none": NONE, "disabled": qrecipe.Recipe.default()}[mode]
    enabled = mode == "recipe-none"
    got = run_grouped(module, x, dy, splits, recipe, enabled)
    assert_all_equal(got, run_separate(layers, x, dy, splits, enabled=False))
    assert torch.equal(got[3], torch.zeros(OUT, IN, dtype=dtype))  # expert 1 had no rows


def test_single_and_multi_parameter_layouts_agree():
    torch.manual_seed(5)
    single = grouped(single=True)
    torch.manual_seed(5)
    multi = grouped(single=False)
    assert [n for n, _ in single.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in multi.named_parameters()] == [
        "weight0", "bias0", "weight1", "bias1", "weight2", "bias2"]
    # The documented offsets: expert i is rows [i*out, (i+1)*out) of the one contiguous weight.
    assert single.weight.shape == (3 * OUT, IN) and single.weight.is_contiguous()
    for i in range(3):
        assert torch.equal(single.weight[i * OUT:(i + 1) * OUT], getattr(multi, f"weight{i}"))
        assert torch.equal(single.bias[i * OUT:(i + 1) * OUT], getattr(multi, f"bias{i}"))
        assert single.expert_weights()[i].data_ptr() == \
            single.weight.data_ptr() + i * OUT * IN * single.weight.element_size()
    x, dy = torch.randn(sum(SPLITS), IN), torch.randn(sum(SPLITS), OUT)
    for recipe in (None, qrecipe.Recipe.default()):
        a = run_grouped(single, x, dy, SPLITS, recipe, enabled=recipe is not None)
        b = run_grouped(multi, x, dy, SPLITS, recipe, enabled=recipe is not None)
        assert_all_equal(a, b)


def test_reset_parameters_match_torch_linears():
    torch.manual_seed(11)
    ref = [torch.nn.Linear(IN, OUT) for _ in range(3)]
    torch.manual_seed(11)
    module = grouped()
    for layer, w, b in zip(ref, module.expert_weights(), module.expert_biases()):
        assert torch.equal(w, layer.weight) and torch.equal(b, layer.bias)
    with torch.no_grad():
        module.weight.zero_()
    torch.manual_seed(11)
    module.reset_parameters()
    assert torch.equal(module.expert_weights()[2], ref[2].weight)


def test_nd_input_and_tensor_splits():
    module = grouped(bias=False)
    layers = separate_layers(module)
    x = torch.randn(4, 6, IN)
    splits = torch.tensor([10, 14, 0])
    y = module(x, splits)
    assert y.shape == (4, 6, OUT)
    want = torch.cat([layer(xi) for layer, xi in zip(layers, x.reshape(-1, IN).split([10, 14, 0]))])
    assert torch.equal(y, want.reshape(4, 6, OUT))


def test_all_experts_empty():
    module = grouped()
    x = torch.randn(0, IN, requires_grad=True)
    with qrecipe.autocast():
        y = module(x, [0, 0, 0])
    assert y.shape == (0, OUT)
    y.sum().backward()
    assert torch.equal(module.weight.grad, torch.zeros(3 * OUT, IN))
    assert torch.equal(module.bias.grad, torch.zeros(3 * OUT))


# ------------------------------------------------------------------ every shipped recipe
@pytest.mark.parametrize("name", sorted(n for n in TOLERANCE if n != "none"))
@pytest.mark.parametrize("single", [True, False])
def test_matches_separate_qrecipe_linears_bit_for_bit(name, single):
    # The separate layers all carry the module's name, so, like the experts, they share one
    # quantizer per role (one delayed-scaling history, one stochastic-rounding counter);
    # each side gets a fresh Recipe object so both start from the same scaling state. Two
    # steps: float8_delayed's second one runs on the scales the first one recorded.
    dtype = DTYPE.get(name, torch.float32)
    module = grouped(single, dtype=dtype)
    layers = separate_layers(module, qrecipe.nn.Linear, name=module.name)
    r_grouped, r_separate = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    for step in range(2):
        x = torch.randn(sum(SPLITS), IN, dtype=dtype)
        dy = torch.randn(sum(SPLITS), OUT, dtype=dtype)
        got = run_grouped(module, x, dy, SPLITS, r_grouped)
        want = run_separate(layers, x, dy, SPLITS, r_separate)
        assert_all_equal(got, want)
        assert not torch.equal(got[0], run_grouped(module, x, dy, SPLITS, enabled=False)[0])
    # Same amax histories and scales (the owners' names differ: grouped_linear vs linear).
    states = lambda r: [{k: v for k, v in s.items() if k != "owner"} for s in r.scaling_states()]
    assert states(r_grouped) == states(r_separate)
    if name == "float8_delayed":
        assert len(states(r_grouped)) == 3 and states(r_grouped)[0]["scale"] != 1.0


@pytest.mark.parametrize("name", sorted(n for n in TOLERANCE if n != "none"))
def test_every_shipped_recipe_within_tolerance(name):
    recipe = qrecipe.Recipe.builtin(name)
    dtype = DTYPE.get(name, torch.float32)
    module = grouped(dtype=dtype)
    reference = separate_layers(module)
    for layer in reference:
        layer.float()
    x = torch.randn(sum(SPLITS), IN, dtype=dtype)
    dy = torch.randn(sum(SPLITS), OUT, dtype=dtype)
    if name == "float8_delayed":
        run_grouped(module, x, dy, SPLITS, recipe)  # the first step runs at scale 1
    got = run_grouped(module, x, dy, SPLITS, recipe)
    want = run_separate(reference, x.float(), dy.float(), SPLITS, enabled=False)
    # Expert 1 has no rows: its gradients are exact zeros on both sides (rel() would be 0/0).
    assert torch.equal(got[3].float(), want[3]) and torch.equal(got[6].float(), want[6])
    errors = [rel(g, w) for i, (g, w) in enumerate(zip(got, want)) if i not in (3, 6)]
    # hybrid_seed's rules name module_type linear, which covers GroupedLinear's experts too.
    assert recipe.resolve("grouped_linear", "weight", module.name) != "none"
    assert max(errors) <= TOLERANCE[name], f"{name}: {errors}"
    assert errors[0] > 0.0


def test_roles_are_shared_by_experts_and_named_by_the_module():
    recipe = qrecipe.Recipe.default()
    module = grouped(name="layers.3.moe")
    roles = module.roles(recipe)
    assert roles.weight.role == "grouped_linear:weight@layers.3.moe"
    assert module.resolve_roles(recipe) == {"": roles}
    text = module.explain(recipe)
    assert text.startswith("grouped_linear layers.3.moe under recipe default:")
    assert "3 GEMMs share these roles" in text and "rows [i*out, (i+1)*out)" in text
    assert "num_gemms=3" in repr(module) and "single_grouped_parameter=True" in repr(module)


# ------------------------------------------------------------------ errors
def test_bad_m_splits_and_inputs_give_clear_errors():
    module = grouped(name="moe")
    x = torch.randn(16, IN)
    for enabled in (False, True):
        with qrecipe.autocast(enabled=enabled):
            with pytest.raises(ValueError, match="'moe'.*2 entries, expected num_gemms=3"):
                module(x, [8, 8])
            with pytest.raises(ValueError, match=r"m_splits\[1\] = -4 is negative"):
                module(x, [10, -4, 10])
            with pytest.raises(ValueError, match="sums to 15 but the input of shape \\(16, 32\\) "
                                                 "has 16 rows"):
                module(x, [5, 5, 5])
            with pytest.raises(TypeError, match="list of ints"):
                module(x, [8.0, 8.0, 0.0])
            with pytest.raises(TypeError, match="list of ints"):
                module(x, 16)
            with pytest.raises(TypeError, match="1-D integer tensor"):
                module(x, torch.tensor([8.0, 8.0, 0.0]))
            with pytest.raises(ValueError, match="'moe'.*in_features=32"):
                module(torch.randn(16, 30), [8, 8, 0])
    with pytest.raises(ValueError, match="num_gemms must be a positive int"):
        qrecipe.nn.GroupedLinear(0, IN, OUT)
    with qrecipe.autocast():
        with pytest.raises(TypeError, match="float64"):
            grouped().double()(x.double(), [16, 0, 0])


def test_scaling_state_round_trips_through_state_dict():
    recipe = qrecipe.Recipe.builtin("float8_delayed")
    module = grouped()
    x = torch.randn(sum(SPLITS), IN)
    with qrecipe.autocast(recipe):
        module(x, SPLITS).sum().backward()
    sd = module.state_dict()
    assert sorted(sd) == ["_extra_state", "bias", "weight"]
    owners = sorted(s["owner"] for s in sd["_extra_state"]["entries"][0]["scaling_states"])
    assert owners == [f"grouped_linear:{t}@moe.experts float8"
                      for t in ("grad_output", "input", "weight")]
    fresh_recipe = qrecipe.Recipe.builtin("float8_delayed")
    clone = grouped(single=True)
    clone.load_state_dict(sd)
    with qrecipe.autocast(recipe):
        y = module(x, SPLITS)
    with qrecipe.autocast(fresh_recipe):
        assert torch.equal(clone(x, SPLITS), y)


def test_no_grad_saves_nothing_and_matches():
    import gc
    from qrecipe import _C
    module = grouped()
    x = torch.randn(sum(SPLITS), IN)
    # A first call, then gc: buffers other tests left for lazy cleanup (weak caches) are
    # freed before counting.
    with torch.no_grad(), qrecipe.autocast():
        module(x, SPLITS)
    # Counted inside the block: entering an outermost block runs the pending scaling update
    # of recipes earlier tests used, which may free their buffers.
    with torch.no_grad(), qrecipe.autocast():
        gc.collect()
        before = _C.live_allocations()
        y_ng = module(x, SPLITS)
        after = _C.live_allocations()
    assert y_ng.grad_fn is None and after == before
    with qrecipe.autocast():
        y = module(x.clone().requires_grad_(), SPLITS)
    assert torch.equal(y_ng, y.detach())


@pytest.mark.parametrize("single", [True, False])
def test_fused_wgrad_accumulation_into_main_grad(single):
    plain = grouped(single)
    fused = grouped(single)
    fused.load_state_dict(plain.state_dict())
    fused.fuse_wgrad_accumulation = True
    weights = [fused.weight] if single else [getattr(fused, f"weight{i}") for i in range(3)]
    for w in weights:
        w.main_grad = torch.zeros_like(w, dtype=torch.float32)
    for _ in range(2):  # two micro-batches accumulate
        x, dy = torch.randn(sum(SPLITS), IN), torch.randn(sum(SPLITS), OUT)
        for module in (plain, fused):
            with qrecipe.autocast():
                module(x, SPLITS).backward(dy)
    plain_weights = [plain.weight] if single else [getattr(plain, f"weight{i}") for i in range(3)]
    for w, p in zip(weights, plain_weights):
        assert w.grad is None
        assert torch.equal(w.main_grad, p.grad)
    if single:
        assert torch.equal(fused.bias.grad, plain.bias.grad)
        del fused.weight.main_grad
        with pytest.raises(RuntimeError, match="weight has no .main_grad"):
            with qrecipe.autocast():
                fused(x, SPLITS)


# ------------------------------------------------------------------ weight cache
def microbatch_steps(module, recipe, data, flag):
    """Steps of micro-batches, each step in one outer autocast block, an SGD update after
    each step; returns every output, input gradient and the parameters' gradients."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    results = []
    for step_data in data:
        opt.zero_grad(set_to_none=True)
        with qrecipe.autocast(recipe):
            for i, (x, dy) in enumerate(step_data):
                x = x.clone().requires_grad_()
                with qrecipe.autocast(recipe):
                    y = module(x, SPLITS, is_first_microbatch=flag(i))
                y.backward(dy)
                results += [y.detach(), x.grad]
        results += [p.grad.clone() for p in module.parameters()]
        opt.step()
    return results


@pytest.fixture
def grouped_quantizations(monkeypatch):
    """(number of groups, usage) of every grouped weight quantization GroupedLinear makes."""
    from qrecipe.nn import grouped_linear
    calls = []
    original = grouped_linear._quantize_grouped

    def counting(quantizer, weight, group_rows, usage):
        assert ":weight@" in quantizer.role
        calls.append((len(group_rows), usage))
        return original(quantizer, weight, group_rows, usage)

    monkeypatch.setattr(grouped_linear, "_quantize_grouped", counting)
    return calls


@pytest.mark.parametrize("name", ["default", "mxfp8", "float8_delayed"])
@pytest.mark.parametrize("single", [True, False])
def test_weight_cache_is_bit_identical_and_quantizes_once_per_expert_per_step(
        name, single, weight_quantizations, grouped_quantizations):
    from qrecipe.nn import weight_cache
    steps, micro = 2, 3
    g = torch.Generator().manual_seed(3)
    data = [[(torch.randn(sum(SPLITS), IN, generator=g),
              torch.randn(sum(SPLITS), OUT, generator=g)) for _ in range(micro)]
            for _ in range(steps)]
    cached_module = grouped(single)
    plain_module = grouped(single)
    plain_module.load_state_dict(cached_module.state_dict())
    # Fresh recipes per side: float8_delayed's scales then evolve identically.
    want = microbatch_steps(plain_module, qrecipe.Recipe.builtin(name), data, lambda i: None)
    assert len(weight_quantizations) == steps * micro * 3  # every expert, every micro-batch
    # ... by one grouped call for all experts in the single layout.
    assert grouped_quantizations == ([(3, 3)] * (steps * micro) if single else [])
    del weight_quantizations[:], grouped_quantizations[:]
    weight_cache.reset_stats()
    got = microbatch_steps(cached_module, qrecipe.Recipe.builtin(name), data,
                           lambda i: i == 0)
    assert_all_equal(got, want)
    # One quantization per expert per step (the empty expert included), both directions: in
    # the single layout one grouped call at each step's first micro-batch.
    assert weight_quantizations == [3] * (steps * 3)
    assert grouped_quantizations == ([(3, 3)] * steps if single else [])
    assert weight_cache.stats == {"quantized": steps * 3, "reused": steps * (micro - 1) * 3,
                                  "stale": 0}
    if single:  # kept under the grouped parameter, one entry per expert (and quantizer)
        entries = weight_cache._cache[cached_module.weight]
        assert sorted(index for _, index in entries) == [0, 1, 2]


def test_grouped_weight_cache_goes_stale_when_the_parameter_changes(weight_quantizations):
    from qrecipe.nn import weight_cache
    module = grouped(single=True)
    recipe = qrecipe.Recipe.default()
    x = torch.randn(sum(SPLITS), IN)
    with qrecipe.autocast(recipe):  # one step: the recipe's scales do not change inside
        module(x, SPLITS, is_first_microbatch=True)
        with torch.no_grad():
            module.weight.add_(0.25)  # in place: an optimizer step (the views' version too)
        y_stale = module(x, SPLITS, is_first_microbatch=False)
        y_fresh = module(x, SPLITS)
        assert torch.equal(y_stale, y_fresh)  # re-quantized from the updated weight
        assert weight_cache.stats == {"quantized": 6, "reused": 0, "stale": 3}
        assert torch.equal(module(x, SPLITS, is_first_microbatch=False), y_fresh)
        assert weight_cache.stats["reused"] == 3
        module.weight.data = module.weight.data * 2  # new storage: stale as well
        y_new = module(x, SPLITS, is_first_microbatch=False)
        assert torch.equal(y_new, module(x, SPLITS))
    assert weight_cache.stats == {"quantized": 9, "reused": 3, "stale": 6}
    weight_cache.clear(module.weight)  # drops every expert's entry
    with qrecipe.autocast(recipe):
        with pytest.raises(RuntimeError, match="group 0 of this weight.*is_first_microbatch"
                                               "=True on the first"):
            module(x, SPLITS, is_first_microbatch=False)


# ------------------------------------------------------------------ grouped quantization
def expert_buffers(q):
    """Every buffer of a quantized tensor, as bytes on the CPU, by direction and kind."""
    out = {}
    for direction in ("rowwise", "columnwise"):
        if q.has(direction):
            for what in ("data", "scale_inv", "amax"):
                b = getattr(q, what)(direction)
                if b is not None:
                    out[f"{direction} {what}"] = b.cpu().view(torch.uint8)
    return out


def assert_same_buffers(got, want, what):
    a, b = expert_buffers(got), expert_buffers(want)
    assert a.keys() == b.keys(), what
    for key in a:
        assert torch.equal(a[key], b[key]), f"{what}: {key} differs"


GROUPED_RECIPES = sorted(n for n in qrecipe.Recipe.builtin_names() if n != "none")


@pytest.mark.parametrize("name", GROUPED_RECIPES)
def test_quantize_grouped_equals_each_expert_quantized_alone(name):
    from qrecipe import _C
    # Two identical recipes: delayed states and stochastic-rounding counters advance alike.
    plan = qrecipe.Recipe.builtin(name).engine.plan_linear("grouped_linear", "e", IN, OUT, 64)
    ref = qrecipe.Recipe.builtin(name).engine.plan_linear("grouped_linear", "e", IN, OUT, 64)
    q, rq = plan["weight"], ref["weight"]
    rows = [32, 0, 48, 16]
    w = torch.randn(sum(rows), IN, dtype=torch.bfloat16)
    w[40, 3] = 500.0  # expert 2 alone has a large amax: per-tensor scales must be per expert
    got = _C.quantize_grouped(q, w, rows, 3)
    assert len(got) == len(rows)
    assert _C.has_grouped_quantize(q) == (q.format in ("float8", "mxfp8", "blockwise", "nvfp4"))
    for i, part in enumerate(w.split(rows)):
        assert (got[i].rows, got[i].cols) == (rows[i], IN)
        assert_same_buffers(got[i], rq.quantize(part.contiguous(), 3), f"{name} expert {i}")


def test_quantize_grouped_rejects_bad_group_rows():
    from qrecipe import _C
    q = qrecipe.Recipe.default().engine.plan_linear("grouped_linear", "e", IN, OUT, 8)["weight"]
    w = torch.randn(64, IN)
    with pytest.raises(qrecipe.QrecipeError,
                       match="group row counts sum to 60 but the source f32\\[64, 32\\]"):
        _C.quantize_grouped(q, w, [30, 30], 3)
    with pytest.raises(qrecipe.QrecipeError, match="no groups given"):
        _C.quantize_grouped(q, w, [], 3)
    with pytest.raises(qrecipe.QrecipeError, match="group 1 has -4 rows"):
        _C.quantize_grouped(q, w, [68, -4], 3)


@pytest.mark.parametrize("name", GROUPED_RECIPES)
def test_single_parameter_uses_one_grouped_call_and_matches_multi(
        name, weight_quantizations, grouped_quantizations):
    """The single layout quantizes its weight with one grouped call per forward (no
    per-expert weight quantization), and its numbers equal the multi-parameter layout's,
    whose experts are quantized one by one (fresh recipes per side, two steps)."""
    dtype = DTYPE.get(name, torch.float32)
    torch.manual_seed(8)
    single = grouped(True, dtype=dtype)
    torch.manual_seed(8)
    multi = grouped(False, dtype=dtype)
    r_single, r_multi = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    for step in range(2):
        x = torch.randn(sum(SPLITS), IN, dtype=dtype)
        dy = torch.randn(sum(SPLITS), OUT, dtype=dtype)
        del weight_quantizations[:], grouped_quantizations[:]
        a = run_grouped(single, x, dy, SPLITS, r_single)
        # One grouped call, and no per-expert quantization of the weight besides it.
        assert grouped_quantizations == [(3, 3)] and weight_quantizations == [3, 3, 3]
        b = run_grouped(multi, x, dy, SPLITS, r_multi)
        assert grouped_quantizations == [(3, 3)] and weight_quantizations == [3] * 6
        assert_all_equal(a, b)
    # Under no_grad only the rowwise copies fprop needs.
    del grouped_quantizations[:]
    with torch.no_grad(), qrecipe.autocast(r_single):
        single(torch.randn(sum(SPLITS), IN, dtype=dtype), SPLITS)
    assert grouped_quantizations == [(3, 1)]


def test_grouped_call_not_used_outside_autocast_or_for_unquantized_weights(
        grouped_quantizations):
    module = grouped()
    x = torch.randn(sum(SPLITS), IN)
    module(x, SPLITS)
    with qrecipe.autocast(NONE):
        module(x, SPLITS)
    weights_none = qrecipe.Recipe.from_dict({
        "version": 1, "name": "weights-none", "defaults": {"format": "none"},
        "rules": [{"match": {"tensor_type": "input"}, "quantizer": {"format": "float8"}}]})
    with qrecipe.autocast(weights_none):
        module(x, SPLITS)
    assert grouped_quantizations == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["default", "float8_delayed", "mxfp8", "blockwise", "nvfp4"])
def test_grouped_on_cuda_matches_cpu_and_multi_layout(name, grouped_quantizations):
    from qrecipe import _C
    # _C.quantize_grouped on CUDA (the formats' grouped kernels) == CPU bytes per expert.
    q_gpu = qrecipe.Recipe.builtin(name).engine.plan_linear("grouped_linear", "e", IN, OUT,
                                                            64)["weight"]
    q_cpu = qrecipe.Recipe.builtin(name).engine.plan_linear("grouped_linear", "e", IN, OUT,
                                                            64)["weight"]
    rows = [33, 0, 64, 7, 128]
    w = torch.randn(sum(rows), IN, dtype=torch.bfloat16)
    w[50, 1] = 900.0
    got = _C.quantize_grouped(q_gpu, w.cuda(), rows, 3)
    want = _C.quantize_grouped(q_cpu, w, rows, 3)
    for i in range(len(rows)):
        assert got[i].data("rowwise").is_cuda
        assert_same_buffers(got[i], want[i], f"{name} expert {i}")
    # The module on CUDA: single layout (grouped) == multi layout (per expert), bit for bit.
    # (In the recipe's dtype: NVFP4's Hadamard transform takes BF16 inputs.)
    dtype = DTYPE.get(name, torch.float32)
    torch.manual_seed(2)
    single = grouped(True, dtype=dtype).cuda()
    torch.manual_seed(2)
    multi = grouped(False, dtype=dtype).cuda()
    r_single, r_multi = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    for _ in range(2):
        x = torch.randn(sum(SPLITS), IN, device="cuda", dtype=dtype)
        dy = torch.randn(sum(SPLITS), OUT, device="cuda", dtype=dtype)
        del grouped_quantizations[:]
        a = run_grouped(single, x, dy, SPLITS, r_single)
        assert grouped_quantizations == [(3, 3)]
        assert_all_equal(a, run_grouped(multi, x, dy, SPLITS, r_multi))
    # ... and equals separate qrecipe.nn.Linear layers on CUDA (their inputs and gradients
    # quantized one by one, the module's by one grouped call each): bit for bit where the
    # grouped kernel and cuBLASLt share an accumulation order; blockwise's CUTLASS
    # block-scaled kernel promotes in another order than cuBLASLt's, so there within the
    # native split-accumulation bound (docs/gemm.md; test_gpu_gemm's relative Frobenius 2^-7).
    layers = [layer.cuda() for layer in separate_layers(single, qrecipe.nn.Linear,
                                                        name=single.name)]
    x = torch.randn(sum(SPLITS), IN, device="cuda", dtype=dtype)
    dy = torch.randn(sum(SPLITS), OUT, device="cuda", dtype=dtype)
    got = run_grouped(single, x, dy, SPLITS, qrecipe.Recipe.builtin(name))
    want = run_separate(layers, x, dy, SPLITS, qrecipe.Recipe.builtin(name))
    if name in GROUPED_ORDER_DIFFERS and qrecipe.grouped_kernels_built():
        assert_all_within_frobenius(got, want, 2.0 ** -7)
    else:
        assert_all_equal(got, want)


# ------------------------------------------------------------------ grouped inputs and gradients
@pytest.fixture
def row_quantizations(monkeypatch):
    """(role type, number of groups, usage) of every grouped quantization of the experts'
    inputs and output gradients, and the role type of every per-tensor quantization of an
    input or gradient made by qrecipe.nn.linear_gemms (there should be none)."""
    from qrecipe.nn import grouped_linear_function, linear_gemms
    grouped_calls, single_calls = [], []
    original_rows = grouped_linear_function._quantize_rows
    original_one = linear_gemms._quantize

    def kind(quantizer):
        return next(t for t in ("input", "grad_output", "weight") if f":{t}@" in quantizer.role)

    def counting_rows(quantizer, tensor, group_rows, usage):
        grouped_calls.append((kind(quantizer), len(group_rows), usage))
        return original_rows(quantizer, tensor, group_rows, usage)

    def counting_one(quantizer, tensor, usage, *amax, **kw):
        if kind(quantizer) != "weight":
            single_calls.append(kind(quantizer))
        return original_one(quantizer, tensor, usage, *amax, **kw)

    monkeypatch.setattr(grouped_linear_function, "_quantize_rows", counting_rows)
    monkeypatch.setattr(linear_gemms, "_quantize", counting_one)
    return grouped_calls, single_calls


@pytest.mark.parametrize("name", GROUPED_RECIPES)
@pytest.mark.parametrize("single", [True, False])
def test_inputs_and_gradients_are_quantized_by_one_grouped_call_each(name, single,
                                                                     row_quantizations):
    grouped_calls, single_calls = row_quantizations
    dtype = DTYPE.get(name, torch.float32)
    module = grouped(single, dtype=dtype)
    recipe = qrecipe.Recipe.builtin(name)
    plan = recipe.engine.plan_linear("grouped_linear", module.name, IN, OUT, 64)
    x = torch.randn(sum(SPLITS), IN, dtype=dtype)
    run_grouped(module, x, torch.randn(sum(SPLITS), OUT, dtype=dtype), SPLITS, recipe)
    # Forward: every expert's input, both directions (fprop and wgrad); backward: every
    # expert's output gradient, both directions (dgrad and wgrad). Roles of format none
    # stay in high precision.
    want = [(role, 3, 3) for role in ("input", "grad_output") if plan[role] is not None]
    assert grouped_calls == want and single_calls == []
    del grouped_calls[:]
    with torch.no_grad(), qrecipe.autocast(recipe):
        module(x, SPLITS)
    assert grouped_calls == [want[0][:2] + (1,)] if plan["input"] is not None else []
    # Under torch.no_grad only rowwise copies of the inputs, and nothing for gradients.


@pytest.mark.parametrize("name", ["default", "float8_delayed", "nvfp4"])
def test_frozen_expert_quantizes_per_expert_and_still_matches_separate_layers(
        name, row_quantizations):
    """Experts that disagree on needing a weight gradient need different directions of their
    inputs and gradients: those are quantized expert by expert, with the same numbers."""
    grouped_calls, single_calls = row_quantizations
    dtype = DTYPE.get(name, torch.float32)
    module = grouped(False, dtype=dtype)
    module.weight1.requires_grad_(False)
    module.bias1.requires_grad_(False)
    layers = separate_layers(module, qrecipe.nn.Linear, name=module.name)
    layers[1].weight.requires_grad_(False)
    layers[1].bias.requires_grad_(False)
    splits = [32, 16, 64]
    x = torch.randn(sum(splits), IN, dtype=dtype)
    dy = torch.randn(sum(splits), OUT, dtype=dtype)
    got = run_grouped(module, x, dy, splits, qrecipe.Recipe.builtin(name))
    assert grouped_calls == [] and sorted(set(single_calls)) == ["grad_output", "input"]
    want = run_separate(layers, x, dy, splits, qrecipe.Recipe.builtin(name))
    # weight1 and bias1 get no gradient on either side.
    assert got[3] is None and want[3] is None and got[6] is None and want[6] is None
    got, want = got[:3] + got[4:6] + got[7:], want[:3] + want[4:6] + want[7:]
    assert_all_equal(got, want)


def test_backward_keeps_only_the_columnwise_copies_and_frees_them():
    """What the one autograd node keeps per expert: the columnwise copies of its input (for
    wgrad) and of its weight (for dgrad), as a Linear keeps; all freed by backward."""
    import gc
    from qrecipe import _C
    module = grouped()
    x = torch.randn(sum(SPLITS), IN, requires_grad=True)
    with qrecipe.autocast():
        gc.collect()
        before = _C.live_allocations()
        y = module(x, SPLITS)
        # (how to rebuild, tensor count) of each saved operand: every expert's x,
        # then every expert's W.
        packed = [p for p, _ in y.grad_fn.packed]
        assert len(packed) == 2 * 3
        for p in packed:
            assert p.usage == qrecipe.quantization.COLUMNWISE
            assert {d for d, _ in p.parts} == {"columnwise"}
        del packed, p
        y.backward(torch.randn_like(y))
        del y
        gc.collect()
        after = _C.live_allocations()
    assert after == before


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["default", "blockwise", "mxfp8"])
def test_odd_widths_match_separate_layers(name, device):
    """Widths whose experts' output rows do not start on 16-byte boundaries (13 FP32 columns):
    those GEMMs write through a fresh tensor and a copy, with the same numbers."""
    n_in, n_out, splits = 19, 13, [3, 0, 5, 8]
    module = qrecipe.nn.GroupedLinear(len(splits), n_in, n_out, name="moe.odd").to(device)
    layers = [qrecipe.nn.Linear(n_in, n_out, name="moe.odd").to(device)
              for _ in splits]
    for layer, w, b in zip(layers, module.expert_weights(), module.expert_biases()):
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.bias.copy_(b)
    x = torch.randn(sum(splits), n_in, device=device)
    dy = torch.randn(sum(splits), n_out, device=device)
    got = run_grouped(module, x, dy, splits, qrecipe.Recipe.builtin(name))
    want = run_separate(layers, x, dy, splits, qrecipe.Recipe.builtin(name))
    assert_all_equal(got, want)



@pytest.mark.parametrize("name", ["default", "nvfp4"])
def test_large_expert_backward_path_matches_separate_layers(name, monkeypatch):
    """Large native experts take the per-expert backward (each expert's dgrad beside its
    wgrad on two CUDA streams) instead of the batched one: forced here on the CPU, where the
    streams do not apply, the numbers are the same."""
    from qrecipe.nn import grouped_linear_function
    monkeypatch.setattr(grouped_linear_function, "overlap_backward", lambda *args: True)
    dtype = DTYPE.get(name, torch.float32)
    module = grouped(False, dtype=dtype)
    layers = separate_layers(module, qrecipe.nn.Linear, name=module.name)
    x = torch.randn(sum(SPLITS), IN, dtype=dtype)
    dy = torch.randn(sum(SPLITS), OUT, dtype=dtype)
    assert_all_equal(run_grouped(module, x, dy, SPLITS, qrecipe.Recipe.builtin(name)),
                     run_separate(layers, x, dy, SPLITS, qrecipe.Recipe.builtin(name)))


def test_gemm_many_equals_gemm_per_item_and_names_a_bad_item():
    from qrecipe import _C
    recipe = qrecipe.Recipe.default()
    q = recipe.quantizer("linear", "input", "fc")._cpp
    a = [q.quantize(torch.randn(m, 32), 1) for m in (8, 0, 24)]
    b = [torch.randn(16, 32) for _ in range(3)]
    bias = [torch.randn(16), None, torch.randn(16).bfloat16()]
    many = [torch.empty(m, 16) for m in (8, 0, 24)]
    _C.gemm_many(a, "rowwise", b, "rowwise", many, kind="fprop", bias=bias)
    for i in range(3):
        one = torch.empty_like(many[i])
        _C.gemm(a[i], "rowwise", b[i], "rowwise", one, kind="fprop", bias=bias[i])
        assert torch.equal(one, many[i])
    with pytest.raises(qrecipe.QrecipeError, match="equally long; got 3 A operands, 2 B"):
        _C.gemm_many(a, "rowwise", b[:2], "rowwise", many)
    bad = [torch.empty(8, 16), torch.empty(0, 16), torch.empty(24, 15)]
    with pytest.raises(qrecipe.QrecipeError, match="gemm_many item 2: .*GEMM output is 24x15"):
        _C.gemm_many(a, "rowwise", b, "rowwise", bad)


# ------------------------------------------------------------------ grouped GEMMs, tensor splits
@pytest.fixture
def grouped_engine_calls(monkeypatch):
    """Every grouped GEMM and device-split quantization GroupedLinear makes, in order."""
    from qrecipe.nn import grouped_linear_function
    calls = []
    gemm, split = grouped_linear_function._gemm_grouped, grouped_linear_function._quantize_split

    def counting_gemm(a, da, b, db, out, kind, offsets=None, accumulate=False, bias=None):
        calls.append(("gemm", kind, offsets is not None))
        return gemm(a, da, b, db, out, kind, offsets=offsets, accumulate=accumulate, bias=bias)

    def counting_split(quantizer, tensor, splits, usage):
        calls.append(("quantize_split", quantizer.role.split(":")[1].split("@")[0], usage))
        return split(quantizer, tensor, splits, usage)

    monkeypatch.setattr(grouped_linear_function, "_gemm_grouped", counting_gemm)
    monkeypatch.setattr(grouped_linear_function, "_quantize_split", counting_split)
    return calls


# NVFP4's Hadamard (wgrad operands) needs experts of whole 16-row runs: no single-token one.
TENSOR_SPLIT_CASES = [(name, splits)
                      for name in ["default", "float8_delayed", "blockwise", "mxfp8", "nvfp4",
                                   "hybrid_fp8_mx"]
                      for splits in [[32, 0, 64], [16, 1, 47], [0, 0, 0], [96, 0, 0]]
                      if name != "nvfp4" or not any(s % 16 for s in splits)]


@pytest.mark.parametrize("name,splits", TENSOR_SPLIT_CASES)
def test_tensor_splits_equal_list_splits_bit_for_bit(name, splits, grouped_engine_calls):
    """m_splits as a (CPU) tensor: the device-split path (the offsets read by the engine,
    one split quantization of x and of dy, one grouped GEMM per kind) gives the numbers of
    the list path bit for bit, empty and single-token experts included."""
    # Two recipe objects: two engines whose delayed-scaling states and stochastic-rounding
    # counters advance alike.
    recipe_a, recipe_b = qrecipe.Recipe.builtin(name), qrecipe.Recipe.builtin(name)
    torch.manual_seed(3)
    dtype = DTYPE.get(name, torch.float32)
    a, b = grouped(bias=False, dtype=dtype), grouped(bias=False, dtype=dtype)
    with torch.no_grad():
        b.weight.copy_(a.weight)
    x = torch.randn(sum(splits), IN, dtype=dtype)
    dy = torch.randn(sum(splits), OUT, dtype=dtype)
    want = run_grouped(a, x, dy, splits, recipe_a)
    grouped_engine_calls.clear()
    got = run_grouped(b, x, dy, torch.tensor(splits), recipe_b)
    assert_all_equal(got, want)
    kinds = [c for c in grouped_engine_calls if c[0] == "gemm"]
    assert kinds == [("gemm", "fprop", True), ("gemm", "dgrad", True), ("gemm", "wgrad", True)]
    assert [c[1] for c in grouped_engine_calls if c[0] == "quantize_split"] == \
        ["input", "grad_output"]


def test_tensor_splits_fall_back_to_the_list_path_where_the_split_path_cannot_serve():
    """A frozen expert (wgrad for some experts only) reads CPU tensor splits as a list: the
    same numbers, and the module says why a GPU call would read them on the host."""
    recipe = qrecipe.Recipe.builtin("default")
    module = grouped(bias=True)
    plan = module.device_splits_plan(recipe, torch.float32)
    assert set(plan) >= {"served", "why", "fprop", "dgrad", "wgrad"}
    assert not plan["served"]  # a bias: the grouped kernels add none
    assert "bias" in plan["why"] or "no grouped GEMM kernels" in plan["why"]
    nobias = grouped(bias=False)
    plan = nobias.device_splits_plan(recipe, torch.bfloat16)
    assert plan["served"] == qrecipe.grouped_kernels_built(), plan
    frozen = grouped(bias=False, single=False)
    frozen.weight1.requires_grad_(False)
    x, dy = torch.randn(96, IN), torch.randn(96, OUT)
    got = run_grouped(frozen, x, dy, torch.tensor(SPLITS), recipe)
    frozen2 = grouped(bias=False, single=False)
    frozen2.load_state_dict(frozen.state_dict())
    frozen2.weight1.requires_grad_(False)
    want = run_grouped(frozen2, x, dy, SPLITS, recipe)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None and w is None) or torch.equal(g, w), i


def _step_with_hooks(splits, hooks):
    """One forward (under `hooks`) and backward of a bias-free module: the gradients, and
    what the autograd node kept (its split operand's type and directions, the packed
    layout); everything it kept is freed by backward."""
    from qrecipe import _C
    recipe = qrecipe.Recipe.builtin("default")
    torch.manual_seed(5)
    module = grouped(bias=False)
    x = torch.randn(sum(SPLITS), IN, requires_grad=True)
    dy = torch.randn(sum(SPLITS), OUT)
    gc.collect()
    before = _C.live_allocations()
    with qrecipe.autocast(recipe), hooks:
        y = module(x, splits)
    node = y.grad_fn
    split_x = node.split_x  # described, not kept: backward must free it
    kept = (None if split_x is None else (type(split_x), split_x.has("columnwise"),
                                           split_x.has("rowwise")),
            [p for p, _ in node.packed])
    del split_x
    y.backward(dy)
    assert node.split_x is None  # backward lets go of the split operand
    del node, y
    gc.collect()
    assert _C.live_allocations() == before
    return [x.grad, module.weight.grad], kept


def test_tensor_splits_keep_the_split_input_outside_the_saved_tensor_hooks():
    """Tensor splits: the inputs' split operand (one _C.QuantizedGroups of all experts) has no
    plain-tensor form saved_operands.pack_all could give the hooks, so the node keeps it on
    ctx (docs/adapter.md, "CPU offload"): save_on_cpu moves the experts' weight operands but
    not that one, which stays where it was made. The results are those of the list path
    with every operand offloaded, bit for bit."""
    from qrecipe import _C
    listed = Recording()
    want, (split_x, listed_packed) = _step_with_hooks(SPLITS, listed)
    assert split_x is None and len(listed_packed) == 2 * 3  # x and W of each expert
    split = Recording()
    got, (split_x, packed) = _step_with_hooks(torch.tensor(SPLITS), split)
    # One QuantizedGroups holding the columnwise copy only (what wgrad reads).
    assert split_x == (_C.QuantizedGroups, True, False)
    assert len(packed) == 1 + 3  # no x operand (on ctx), then each expert's W
    assert not packed[0].parts and all(p.parts for p in packed[1:])
    # The hooks saw only the weight operands' tensors: the list path's, less its x parts.
    x_parts = sum(len(p.parts) for p in listed_packed[:3])
    assert len(split.packed) == len(listed.packed) - x_parts
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    offloaded, _ = _step_with_hooks(torch.tensor(SPLITS),
                                    torch.autograd.graph.save_on_cpu(pin_memory=False))
    for a, b in zip(offloaded, want):
        assert torch.equal(a, b)


def test_gemm_grouped_binding_equals_gemm_per_item_and_names_what_is_wrong():
    from qrecipe import _C
    recipe = qrecipe.Recipe.builtin("default")
    plan = recipe.engine.plan_linear("grouped_linear", "moe", 32, 24, 16)
    qx, qw = plan["input"], plan["weight"]
    splits = [5, 0, 9]
    x = torch.randn(sum(splits), 32)
    w = torch.randn(3 * 24, 32)
    xs = _C.quantize_grouped(qx, x, splits, 3)
    ws = _C.quantize_grouped(qw, w, [24] * 3, 3)
    want = [torch.zeros(r, 24) for r in splits]
    for a, b, o in zip(xs, ws, want):
        _C.gemm(a, "rowwise", b, "rowwise", o, kind="fprop")
    outs = [torch.zeros(r, 24) for r in splits]
    plan_str = _C.gemm_grouped(xs, "rowwise", ws, "rowwise", outs, kind="fprop")
    assert "CPU" in plan_str
    assert all(torch.equal(a, b) for a, b in zip(outs, want))
    # Split: x quantized by offsets (a CPU tensor), one [rows, 24] output.
    offsets = torch.tensor([0, 5, 5, 14])
    xg = _C.quantize_grouped_split(qx, x, offsets, 3)
    assert (xg.num_groups, xg.rows, xg.cols, xg.device_split) == (3, 14, 32, False)
    y = torch.zeros(14, 24)
    _C.gemm_grouped(xg, "rowwise", ws, "rowwise", y, kind="fprop")
    assert torch.equal(y, torch.cat(want))
    # wgrad along the split rows, accumulating.
    dy = torch.randn(14, 24)
    qg = plan["grad_output"]
    dyg = _C.quantize_grouped_split(qg, dy, offsets, 3)
    dws = [torch.ones(24, 32) for _ in splits]
    _C.gemm_grouped(dyg, "columnwise", xg, "columnwise", dws, kind="wgrad", accumulate=True)
    for i, (d, q_dy, q_x) in enumerate(zip(dws, dyg.groups(), xg.groups())):
        ref = torch.ones(24, 32)
        _C.gemm(q_dy, "columnwise", q_x, "columnwise", ref, kind="wgrad", accumulate=True)
        assert torch.equal(d, ref), i
    # What is wrong is said.
    with pytest.raises(qrecipe.QrecipeError, match="operand A has 3 groups but operand B has 2"):
        _C.gemm_grouped(xs, "rowwise", ws[:2], "rowwise", outs, kind="fprop")
    with pytest.raises(qrecipe.QrecipeError, match="kind 'forward' is not known"):
        _C.gemm_grouped(xs, "rowwise", ws, "rowwise", outs, kind="forward")
    with pytest.raises(qrecipe.QrecipeError, match="no GroupSplits were given"):
        _C.gemm_grouped(x, "rowwise", ws, "rowwise", y, kind="fprop")
    with pytest.raises(qrecipe.QrecipeError, match="offsets must be a contiguous 1-D torch.int64"):
        _C.quantize_grouped_split(qx, x, offsets.float(), 3)
    with pytest.raises(qrecipe.QrecipeError, match="offsets decrease at group 1"):
        _C.quantize_grouped_split(qx, x, torch.tensor([0, 9, 5, 14]), 3)
    with pytest.raises(qrecipe.QrecipeError, match="the offsets end at 13 but the split tensor has 14 rows"):
        _C.quantize_grouped_split(qx, x, torch.tensor([0, 5, 5, 13]), 3)


def test_bad_tensor_splits_give_clear_errors():
    module = grouped(bias=False)
    x = torch.randn(96, IN)
    with qrecipe.autocast():
        with pytest.raises(ValueError, match=r"m_splits has 2 entries, expected num_gemms=3"):
            module(x, torch.tensor([48, 48]))
        with pytest.raises(ValueError, match=r"m_splits\[1\] = -4 is negative"):
            module(x, torch.tensor([50, -4, 50]))
        with pytest.raises(ValueError, match="m_splits sums to 95"):
            module(x, torch.tensor([32, 0, 63]))
        with pytest.raises(TypeError, match="1-D integer tensor"):
            module(x, torch.tensor([32.0, 0.0, 64.0]))
