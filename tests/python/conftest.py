"""pytest configuration for the adapter suites (tests/python).

qrecipe is imported from wherever Python finds it: an installed package (pip install
--no-build-isolation .) or a build tree on PYTHONPATH (tools/test.sh uses <build>/python).
When neither is there, the default build tree <repo>/build/python is tried before giving up.
"""
import importlib.util
import pathlib
import sys

import pytest
import torch

if importlib.util.find_spec("qrecipe") is None:
    candidate = pathlib.Path(__file__).resolve().parents[2] / "build" / "python"
    if (candidate / "qrecipe").is_dir():
        sys.path.insert(0, str(candidate))

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
