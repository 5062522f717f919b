"""Loads the compiled extension ``qrecipe._C`` (the engine bindings) with a clear error.

torch is imported first: ``_C`` links against libtorch, whose libraries torch's import loads.
"""
import torch  # noqa: F401  (loads libtorch / libc10 before _C needs them)

try:
    from . import _C
except ImportError as error:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "qrecipe's compiled extension (qrecipe._C) could not be loaded: "
        f"{error}.\nInstall the package with `pip install --no-build-isolation .` from the "
        "repository root, or build it with `cmake -DQRECIPE_PYTHON=ON` and put "
        "<build>/python on PYTHONPATH (docs/adapter.md)."
    ) from error

QrecipeError = _C.QrecipeError
RecipeError = _C.RecipeError

__all__ = ["_C", "QrecipeError", "RecipeError"]
