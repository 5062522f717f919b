"""The training demo (examples/char_lm_demo.py, the model in examples/char_lm.py): the model's
role names, which the shipped float8_bf16_ends recipe matches by name; the baseline equal to
recipe `none` bit for bit; the command line's outputs and exit codes, bad input included.
tools/test.sh runs the demo's short mode under every shipped recipe besides."""
import math
import subprocess
import sys

import pytest
import torch

import qrecipe

from conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import char_lm  # noqa: E402
import char_lm_demo  # noqa: E402

TINY = ["--width", "32", "--layers", "2", "--heads", "2", "--context", "16", "--batch", "2"]


def tiny_model(corpus, dtype=torch.float32):
    cfg = char_lm.ModelConfig(corpus.vocab_size, context=16, width=32, layers=2, heads=2)
    return char_lm.build_model(cfg, 0, torch.device("cpu"), dtype)


@pytest.fixture(scope="module")
def corpus():
    return char_lm.CharCorpus.load()


def role_names(model):
    names = []
    for module in model.modules():
        if isinstance(module, qrecipe.nn.QuantizedModule):
            names += [(module.MODULE_TYPE, module.role_name(k)) for k in module.gemms()]
    return names


def test_role_names_are_the_documented_ones(corpus):
    assert role_names(tiny_model(corpus)) == [
        ("layernorm_linear", "layers.0.attn.qkv"), ("linear", "layers.0.attn.proj"),
        ("layernorm_mlp", "layers.0.mlp.fc1"), ("layernorm_mlp", "layers.0.mlp.fc2"),
        ("layernorm_linear", "layers.1.attn.qkv"), ("linear", "layers.1.attn.proj"),
        ("layernorm_mlp", "layers.1.mlp.fc1"), ("layernorm_mlp", "layers.1.mlp.fc2"),
        ("linear", "lm_head")]


def test_bf16_ends_recipe_keeps_first_block_and_head_by_name(corpus):
    recipe = qrecipe.Recipe.load(REPO / "recipes" / "float8_bf16_ends.yaml")
    for module_type, name in role_names(tiny_model(corpus)):
        kept = name.startswith("layers.0.") or name == "lm_head"
        for tensor_type in ("input", "weight", "grad_output"):
            spec = recipe.resolve(module_type, tensor_type, name)
            assert (spec == "none") == kept, (module_type, tensor_type, name, spec)
            if not kept:
                dtype = "e5m2" if tensor_type == "grad_output" else "e4m3"
                assert spec.startswith("float8{") and f"dtype={dtype}" in spec, spec


def test_recipe_none_trains_exactly_as_the_baseline(corpus):
    tc = char_lm.TrainConfig(steps=3, batch=2, eval_batches=1)
    base = char_lm.train("baseline", tiny_model(corpus), corpus, tc, None)
    none = char_lm.train("none", tiny_model(corpus), corpus, tc,
                         qrecipe.Recipe.load(REPO / "recipes" / "none.yaml"))
    assert base.losses == none.losses and base.val_loss == none.val_loss
    for p, q in zip(base.model.parameters(), none.model.parameters()):
        assert torch.equal(p, q)


def test_default_recipe_quantizes_and_changes_the_numbers(corpus):
    tc = char_lm.TrainConfig(steps=2, batch=2, eval_batches=1)
    base = char_lm.train("baseline", tiny_model(corpus), corpus, tc, None)
    q = char_lm.train("default", tiny_model(corpus), corpus, tc, qrecipe.Recipe.default())
    assert base.losses[0] != q.losses[0]  # the quantized forward is not the FP32 one
    assert abs(base.losses[0] - q.losses[0]) < 0.05 * base.losses[0]


def test_needs_bf16_only_for_hadamard_recipes(corpus):
    model = tiny_model(corpus)
    assert char_lm.needs_bf16(qrecipe.Recipe.builtin("nvfp4"), model)
    assert not char_lm.needs_bf16(qrecipe.Recipe.default(), model)
    assert not char_lm.needs_bf16(qrecipe.Recipe.builtin("mxfp8"), model)


def test_generate_pads_to_whole_token_groups_and_keeps_the_prompt(corpus):
    text = char_lm.generate(tiny_model(corpus), corpus, "HAMLET.\n", 5, seed=0,
                            recipe=qrecipe.Recipe.builtin("nvfp4"))
    assert text.startswith("HAMLET.\n") and len(text) == len("HAMLET.\n") + 5


def test_loss_fell_rule():
    def result(losses, val=1.0):
        return char_lm.RunResult("r", torch.float32, losses, val, 1.0, 1, None)
    assert result([4.0, 3.0]).fell
    assert not result([3.0, 3.0]).fell
    assert not result([3.0, 3.5]).fell
    assert not result([4.0, math.nan]).fell
    assert not result([4.0, 3.0], val=math.inf).fell
    assert result([5.0] * 10 + [2.0] * 10).final_loss == 2.0


def test_bad_model_config_is_refused_clearly(corpus):
    with pytest.raises(ValueError, match="context 40 is not a multiple of 16"):
        char_lm.ModelConfig(corpus.vocab_size, context=40).check()
    with pytest.raises(ValueError, match="not in the corpus vocabulary"):
        corpus.encode("caf\u00e9")


def run_demo(tmp_path, *args):
    return subprocess.run([sys.executable, str(REPO / "examples" / "char_lm_demo.py"),
                           "--device", "cpu", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600)


def test_short_mode_writes_table_plot_and_sample(tmp_path):
    r = run_demo(tmp_path, "--steps", "3", "--sample-chars", "10", *TINY, "--recipe",
                 str(REPO / "recipes" / "default.yaml"), str(REPO / "recipes" / "default.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    png = tmp_path / "char_lm_loss.png"
    assert f"loss curves: {png}" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line.split() for line in r.stdout.splitlines()
            if line.split()[:1] in (["baseline"], ["default"], ["default'"])]
    assert [row[0] for row in rows] == ["baseline", "default", "default'"]  # one row per run
    assert all(row[-1] == "yes" for row in rows)
    assert "sample from the 'default' model" in r.stdout


def test_telemetry_writes_the_table_and_the_saturation_plot(tmp_path):
    tel = tmp_path / "tel"
    r = run_demo(tmp_path, "--steps", "3", "--sample-chars", "0", *TINY, "--recipe",
                 str(REPO / "recipes" / "default.yaml"), "--telemetry", str(tel))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "telemetry of 'default':" in r.stdout
    csv = (tel / "telemetry-default.csv").read_text().splitlines()
    assert csv[0].startswith("role,") and len(csv) > 1  # a header and observations
    assert (tel / "telemetry-default.jsonl").read_text().strip()
    assert (tel / "saturation-default.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, code, message", [
    (["--recipe", "no/such.yaml"], 2, "recipe file(s) not found: no/such.yaml"),
    (["--steps", "0"], 2, "--steps must be positive, got 0"),
    (["--context", "40"], 2, "context 40 is not a multiple of 16"),
    (["--recipe", str(REPO / "tests" / "recipes" / "invalid_unknown_format.yaml")], 1,
     "unknown format"),
])
def test_bad_input_exits_with_a_clear_message(tmp_path, capsys, args, code, message):
    try:
        got = char_lm_demo.main(["--device", "cpu", "--steps", "2", "--out", str(tmp_path),
                                 *TINY, *args])
    except SystemExit as exit_:  # argparse's usage errors
        got = exit_.code
    assert got == code
    assert message in capsys.readouterr().err


def test_exit_code_is_1_when_a_loss_does_not_fall(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(char_lm.RunResult, "fell", property(lambda self: False))
    code = char_lm_demo.main(["--device", "cpu", "--steps", "2", "--sample-chars", "0",
                              "--out", str(tmp_path), *TINY,
                              "--recipe", str(REPO / "recipes" / "none.yaml")])
    assert code == 1
    assert "loss did not fall: baseline, none" in capsys.readouterr().err
