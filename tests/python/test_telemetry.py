"""qrecipe.telemetry: the recipe's `telemetry:` key and its errors, enable / disable /
use_recipes, which quantizations are observed (every N-th per role, role globs), the
statistics against independent computations, the table and its CSV / JSONL files, and
nothing observed when it is off."""
import csv
import gc
import json
import math

import pytest
import torch

import qrecipe
from qrecipe import telemetry

FLOAT8 = {"version": 1, "name": "f8", "defaults": {"format": "float8"}}


@pytest.fixture(autouse=True)
def fresh_telemetry():
    # Recipes of earlier tests go: their pending scaling updates (which hold them) run at an
    # outermost autocast entry.
    with qrecipe.autocast(qrecipe.Recipe.from_dict(FLOAT8)):
        pass
    gc.collect()
    telemetry.use_recipes()
    telemetry.clear()
    yield
    telemetry.use_recipes()
    telemetry.clear()


def recipe_with(key, base=FLOAT8):
    return qrecipe.Recipe.from_dict({**base, "telemetry": key})


def step(module, recipe, x):
    with qrecipe.autocast(recipe):
        y = module(x)
    y.sum().backward()
    return y


def linear(name="fc", n=32):
    torch.manual_seed(0)
    return qrecipe.nn.Linear(n, n, name=name)


# ---------------------------------------------------------------- the recipe key

def test_recipe_key_is_parsed():
    r = recipe_with({"every": 3, "roles": ["linear:weight@*", "*@fc"]})
    assert r.telemetry == telemetry.Settings(3, ("linear:weight@*", "*@fc"))
    assert recipe_with({"every": 1}).telemetry == telemetry.Settings(1, None)
    assert qrecipe.Recipe.from_dict(FLOAT8).telemetry is None


@pytest.mark.parametrize("key, words", [
    ({"every": 0}, "telemetry.every: expected a positive integer"),
    ({"every": "often"}, "expected a positive integer (1 to 1000000000), got 'often'"),
    ({"every": 2000000000}, "expected a positive integer"),
    ({"every": [1]}, "expected a positive integer (1 to 1000000000), got a list"),
    ({"roles": ["*"]}, "missing key 'every'"),
    ({"every": 1, "roles": []}, "an empty list matches nothing"),
    ({"every": 1, "roles": ["[a"]}, "bad name glob '[a'"),
    ({"every": 1, "rolez": ["*"]}, "unknown telemetry key 'rolez'"),
    ([1, 2], "telemetry: expected a map {every: N, roles: [glob, ...]}, got a list"),
])
def test_bad_recipe_key_is_refused_with_its_location(key, words):
    with pytest.raises(qrecipe.RecipeError) as error:
        recipe_with(key)
    assert words in str(error.value)
    assert str(error.value).startswith("<dict>:")  # file:line:col of the key


def test_recipe_file_key_located(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\ndefaults: {format: float8}\ntelemetry: {every: -1}\n")
    with pytest.raises(qrecipe.RecipeError, match=r"r\.yaml:3:\d+: telemetry\.every"):
        qrecipe.Recipe.load(path)


def test_python_settings_are_checked():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            telemetry.enable(every=bad)
    with pytest.raises(TypeError, match="list of globs"):
        telemetry.enable(roles="linear:weight@*")


# ---------------------------------------------------------------- what is observed

def roles_and_calls(table):
    return sorted((r["role"], r["call"]) for r in table)


def test_recipe_key_observes_every_role_of_a_step():
    module = linear()
    step(module, recipe_with({"every": 1}), torch.randn(8, 32))
    table = telemetry.table()
    assert roles_and_calls(table) == [("linear:grad_output@fc", 1), ("linear:input@fc", 1),
                                      ("linear:weight@fc", 1)]
    assert all(r["format"].startswith("float8{") for r in table)


def test_every_nth_call_per_role_and_role_globs():
    module = linear()
    recipe = recipe_with({"every": 2, "roles": ["linear:weight@*", "linear:input@fc"]})
    for _ in range(5):
        step(module, recipe, torch.randn(4, 32))
    assert roles_and_calls(telemetry.table()) == [
        ("linear:input@fc", 1), ("linear:input@fc", 3), ("linear:input@fc", 5),
        ("linear:weight@fc", 1), ("linear:weight@fc", 3), ("linear:weight@fc", 5)]


def test_enable_overrides_recipes_and_disable_stops_everything():
    module = linear()
    plain = qrecipe.Recipe.from_dict(FLOAT8)
    keyed = recipe_with({"every": 1, "roles": ["linear:input@*"]})
    step(module, plain, torch.randn(4, 32))
    assert len(telemetry.table()) == 0  # no key, not enabled
    telemetry.enable(every=1, roles=["linear:weight@fc"])
    step(module, plain, torch.randn(4, 32))
    step(module, keyed, torch.randn(4, 32))  # enable()'s roles, not the key's
    assert {r["role"] for r in telemetry.table()} == {"linear:weight@fc"}
    telemetry.clear()
    telemetry.disable()
    step(module, keyed, torch.randn(4, 32))
    assert len(telemetry.table()) == 0
    telemetry.use_recipes()
    step(module, keyed, torch.randn(4, 32))
    assert {r["role"] for r in telemetry.table()} == {"linear:input@fc"}


def test_off_never_calls_observe(monkeypatch):
    def fail(*args):
        raise AssertionError("telemetry observed a quantization while off")
    monkeypatch.setattr(telemetry, "observe", fail)
    assert not telemetry.state.on
    step(linear(), qrecipe.Recipe.from_dict(FLOAT8), torch.randn(4, 32))
    telemetry.disable()
    step(linear(), recipe_with({"every": 1}), torch.randn(4, 32))


def test_grouped_linear_observes_each_expert():
    torch.manual_seed(0)
    module = qrecipe.nn.GroupedLinear(3, 16, 16, name="experts")
    telemetry.enable(every=1, roles=["*:input@*"])
    with qrecipe.autocast(qrecipe.Recipe.from_dict(FLOAT8)):
        y = module(torch.randn(10, 16), [4, 0, 6])
    y.sum().backward()
    rows = [r["rows"] for r in telemetry.table()]
    assert sorted(rows) == [4, 6]  # the empty expert is not a quantized tensor to observe


def test_grouped_linear_with_tensor_splits_observes_each_expert():
    # Tensor m_splits would take the device-split path; with telemetry on, GroupedLinear reads
    # them on the host so every expert is still observed.
    torch.manual_seed(0)
    module = qrecipe.nn.GroupedLinear(3, 16, 16, name="experts")
    telemetry.enable(every=1, roles=["*:input@*"])
    with qrecipe.autocast(qrecipe.Recipe.from_dict(FLOAT8)):
        y = module(torch.randn(10, 16), torch.tensor([4, 0, 6]))
    y.sum().backward()
    rows = [r["rows"] for r in telemetry.table()]
    assert sorted(rows) == [4, 6]


# ---------------------------------------------------------------- the statistics

def stats(tensor, format, **options):
    q = qrecipe.quantize(tensor, format, **options)
    return telemetry._statistics(tensor, q._cpp)


def value(row, column):
    return row["_stats"][telemetry._STAT_COLUMNS.index(column)].item()


def test_current_scaling_statistics():
    torch.manual_seed(1)
    x = torch.randn(64, 48)
    x[3, 5] = -7.25
    x[10, :4] = 1e-12  # below e4m3's smallest subnormal at this scale: flushed
    row = stats(x, "float8")
    q = qrecipe.quantize(x, "float8")
    assert value(row, "amax") == 7.25
    scale = 1 / q.rowwise_scale_inv.item()
    assert value(row, "scale_min") == pytest.approx(scale, rel=1e-6)
    assert value(row, "scale_max") == pytest.approx(scale, rel=1e-6)
    assert scale == pytest.approx(448 / 7.25, rel=1e-6)
    assert value(row, "saturated") == 0  # the amax maps to 448 (up to the scale's rounding)
    deq = q.dequantize()
    flushed = ((x != 0) & (deq == 0)).sum().item()
    assert flushed >= 4  # the four tiny ones, and any random value as small
    assert value(row, "flushed") == pytest.approx(flushed / x.numel())
    deq = q.dequantize()
    assert value(row, "error") == pytest.approx(((deq - x).norm() / x.norm()).item(), rel=1e-5)
    assert value(row, "sampled") == x.numel()
    assert row["direction"] == "rowwise" and (row["rows"], row["cols"]) == (64, 48)


def test_saturation_counts_clipped_elements():
    # Delayed scaling starts at scale 1: 1000 and 465 are beyond e4m3's 448 by more than
    # rounding and are clipped; 448 is stored exactly and 460 rounds to 448 (below the
    # midpoint 464 to the 480 a wider format would have): neither is.
    x = torch.ones(16, 32)
    x[0, :8] = 1000.0
    x[1, :3] = -2000.0
    x[2, :5] = 448.0
    x[3, :2] = 460.0
    x[4, :1] = 465.0
    row = stats(x, "float8", scaling="delayed")
    assert value(row, "saturated") == pytest.approx(12 / x.numel())
    assert value(row, "scale_min") == value(row, "scale_max") == 1.0


@pytest.mark.parametrize("format, options", [("mxfp8", {}), ("nvfp4", {}),
                                             ("blockwise", {}), ("float8", {"dtype": "e5m2"})])
def test_block_formats(format, options):
    torch.manual_seed(2)
    x = torch.randn(128, 64) * torch.logspace(-3, 3, 64)
    row = stats(x, format, **options)
    q = qrecipe.quantize(x, format, **options)
    deq = q.dequantize()
    assert value(row, "amax") == x.abs().max().item()
    assert value(row, "error") == pytest.approx(((deq - x).norm() / x.norm()).item(), rel=1e-5)
    assert value(row, "flushed") == pytest.approx(((x != 0) & (deq == 0)).float().mean().item())
    assert 0 < value(row, "scale_min") <= value(row, "scale_max") < math.inf
    assert 0 <= value(row, "saturated") < 1
    if format == "mxfp8":  # E8M0 scales: powers of two
        for c in ("scale_min", "scale_max"):
            assert math.log2(value(row, c)).is_integer()


def test_large_tensor_is_sampled():
    x = torch.randn(4096, 64)
    row = stats(x, "mxfp8")
    assert value(row, "sampled") == telemetry.SAMPLE_ELEMENTS
    assert value(row, "amax") == x.abs().max().item()  # amax over the whole tensor


def test_all_zero_tensor_has_no_scale():
    row = stats(torch.zeros(4, 32), "mxfp8")
    assert math.isnan(value(row, "scale_min")) and math.isnan(value(row, "scale_max"))
    assert value(row, "error") == 0 and value(row, "flushed") == 0


# ---------------------------------------------------------------- the table and its files

def test_table_csv_jsonl_and_worst(tmp_path):
    module = linear()
    telemetry.enable(every=1)
    for _ in range(2):
        step(module, qrecipe.Recipe.from_dict(FLOAT8), torch.randn(8, 32))
    table = telemetry.table()
    assert len(table) == 6 and table.columns == telemetry.COLUMNS
    assert "linear:weight@fc" in str(table)
    table.to_csv(tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["role"] for r in read] == [r["role"] for r in table]
    assert float(read[0]["amax"]) == table.rows[0]["amax"]
    table.to_jsonl(tmp_path / "t.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert lines == [dict(r) for r in table.rows]
    worst = table.worst("error", 2)
    assert len(worst) == 2 and worst.rows[0]["error"] >= worst.rows[1]["error"]
    assert len({r["role"] for r in worst}) == 2  # one row per role
    with pytest.raises(ValueError, match="expected one of"):
        table.worst("role")


def test_jsonl_writes_nan_as_null(tmp_path):
    telemetry.enable(every=1)
    with qrecipe.autocast(qrecipe.Recipe.from_dict({**FLOAT8, "defaults": {"format": "mxfp8"}})):
        linear()(torch.zeros(4, 32))
    telemetry.table().to_jsonl(tmp_path / "t.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    zero_input = [r for r in rows if r["role"] == "linear:input@fc"]
    assert zero_input and zero_input[0]["scale_min"] is None
