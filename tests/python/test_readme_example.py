"""The README's "Ten lines" example runs as printed: it converts, trains under the default
recipe and explains the converted layer. `batches` is the one name the example leaves to the
reader; the test supplies it."""
import math
import re

import torch

from conftest import REPO


def readme_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, f"README.md holds {len(blocks)} python blocks; expected the one example"
    return blocks[0]


def test_readme_example_runs_as_printed(monkeypatch, capsys):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 13, "the example has grown past ten-odd lines"
    monkeypatch.chdir(REPO)  # it loads recipes/default.yaml relative to the repository
    torch.manual_seed(0)
    namespace = {"batches": [torch.randn(32, 256) for _ in range(3)]}
    exec(compile(code, "README.md (Ten lines)", "exec"), namespace)
    assert math.isfinite(namespace["loss"].item())
    # convert() swapped the torch Linear, and the recipe quantized its three GEMMs.
    assert type(namespace["model"][1]).__module__.startswith("qrecipe.")
    out = capsys.readouterr().out
    for gemm in ("fprop", "dgrad", "wgrad"):
        assert re.search(rf"{gemm}\s+e[45]m[23] tensor-scaled x e4m3 tensor-scaled", out), out
