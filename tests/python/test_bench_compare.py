"""tools/bench_compare.py: per-record verdicts of two benchmark files of one machine."""
import json
import pathlib
import subprocess
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench_compare.py"


def write(path, device, records):
    path.write_text(json.dumps({"device": device, "commit": path.stem, "records": records}))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def test_verdicts_and_names_in_one_file_only(tmp_path):
    base = write(tmp_path / "base.json", "H100", [{"name": "a", "ms": 1.0}, {"name": "b", "ms": 1.0},
                                                  {"name": "c", "ms": 1.0}, {"name": "gone", "ms": 1.0}])
    cand = write(tmp_path / "cand.json", "H100", [{"name": "a", "ms": 1.2}, {"name": "b", "ms": 0.5},
                                                  {"name": "c", "ms": 1.01}, {"name": "new", "ms": 1.0}])
    out = tmp_path / "cmp.json"
    r = run(base, cand, "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["a"]["verdict"] == "regression" and rows["a"]["ratio"] == pytest.approx(1.2)
    assert rows["b"]["verdict"] == "faster"
    assert rows["c"]["verdict"] == "same"
    assert rows["gone"]["verdict"] == "only in base"
    assert rows["new"]["verdict"] == "only in candidate"
    assert "| a | 1.0000 | 1.2000 | 1.200 | regression |" in r.stdout


def test_refuses_runs_of_different_devices(tmp_path):
    base = write(tmp_path / "base.json", "H100", [{"name": "a", "ms": 1.0}])
    cand = write(tmp_path / "cand.json", "H200", [{"name": "a", "ms": 1.0}])
    r = run(base, cand)
    assert r.returncode != 0 and "devices differ" in r.stderr


def test_refuses_duplicate_names(tmp_path):
    base = write(tmp_path / "base.json", "H100", [{"name": "a", "ms": 1.0}, {"name": "a", "ms": 2.0}])
    cand = write(tmp_path / "cand.json", "H100", [{"name": "a", "ms": 1.0}])
    r = run(base, cand)
    assert r.returncode != 0 and "occurs twice" in r.stderr
