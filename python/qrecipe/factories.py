"""Recipe factories: Python functions that decide roles (docs/recipes.md, "Recipes in
Python"). ``fn(role: QuantizerRole) -> Spec | dict | None``.

The engine calls a factory through the resolver this module builds (``resolver_for``), once
per role, when the role is first resolved (a module's first forward, or ``convert(model,
recipe)``), never per step; the answer is cached by the engine. What it answers is turned
into a spec dictionary here and validated by the engine's recipe validator, so a bad option
gets the words a YAML recipe gets, located at ``factory 'module.function' (file.py:LINE),
role linear:weight@...``. A factory that raises, returns something that is not a spec, or
cannot be imported (a YAML rule's ``factory: package.module:function``) is a RecipeError
naming the factory and the role.

Ground floor: imports the extension, roles and formats.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import weakref
from typing import Any, Callable, Dict, Tuple

from ._engine import RecipeError
from .formats import Spec
from .roles import QuantizerRole, role_in_context

Factory = Callable[[QuantizerRole], Any]
_SCALARS = (bool, int, float, str)


def display_name(fn: Callable) -> str:
    """``module.qualname`` of a factory (a function, a bound method, a functools.partial or a
    callable object)."""
    target = _code_owner(fn)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def _code_owner(fn: Callable) -> Any:
    """The function whose code runs when `fn` is called (for names and file:line)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn):
        return fn
    call = getattr(type(fn), "__call__", None)
    return call if call is not None else fn


def origin_of(fn: Callable) -> str:
    """``factory 'module.qualname' (file.py:LINE)``: how errors and explain name a factory."""
    where = ""
    try:
        target = inspect.unwrap(_code_owner(fn))
        code = getattr(getattr(target, "__func__", target), "__code__", None)
        if code is not None:
            path = code.co_filename
            relative = os.path.relpath(path) if os.path.isabs(path) else path
            where = f" ({relative if not relative.startswith('..') else path}:{code.co_firstlineno})"
    except (TypeError, ValueError):
        pass
    return f"factory '{display_name(fn)}'{where}"


def _describe(value: Any) -> str:
    """``"list [1, 2]"``, ``"mymod.MyQuantizer <...>"``: a value's type and (short) repr."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    text = repr(value)
    return f"{name} {text[:77] + '...' if len(text) > 80 else text}"


_EXPECTED = ("a factory returns a quantizer spec from qrecipe.formats (formats.float8(), "
             "formats.mxfp8(), formats.nvfp4(), formats.delayed(), ...), a dict such as "
             "{'format': 'float8', 'scaling': 'current'}, or None for high precision")


def spec_dict(result: Any, where: str) -> Dict[str, Any]:
    """A factory's answer as a spec dictionary for the engine; `where` ("<origin>, role R")
    prefixes every error."""
    if result is None:
        return {"format": "none"}
    if isinstance(result, Spec):
        return result.to_dict()
    if isinstance(result, dict):
        return _checked_dict(result, where, "quantizer")
    raise RecipeError(f"{where}: the factory returned {_describe(result)}; {_EXPECTED}")


def _checked_dict(d: Dict[Any, Any], where: str, path: str) -> Dict[str, Any]:
    if "format" not in d:
        raise RecipeError(f"{where}: {path}: the dict has no 'format' key; a quantizer spec "
                          f"names its format, e.g. {{'format': 'float8'}} or {{'format': 'none'}}")
    out: Dict[str, Any] = {}
    for key, value in d.items():
        if not isinstance(key, str):
            raise RecipeError(f"{where}: {path}: option names are strings, got {_describe(key)}")
        if key == "format" and not (isinstance(value, str) and value):
            raise RecipeError(f"{where}: {path}.format: expected a format name (float8, ..., or "
                              f"none), got {_describe(value)}")
        if isinstance(value, Spec):
            value = value.to_dict()
        if isinstance(value, dict):
            out[key] = _checked_dict(value, where, f"{path}.{key}")
        elif isinstance(value, _SCALARS):
            out[key] = value
        else:
            raise RecipeError(f"{where}: {path}.{key}: an option value is a bool, int, float, "
                              f"str or a nested spec, got {_describe(value)}")
    return out


def import_factory(reference: str, rule: str) -> Factory:
    """The function a YAML rule's ``factory: package.module:function`` names."""
    module_name, _, path = reference.partition(":")
    what = f"{rule}: factory '{reference}'"
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is the same problem for the user
        raise RecipeError(f"{what}: cannot import module '{module_name}' "
                          f"({type(error).__name__}: {error}); the module must be importable "
                          "where the recipe runs (on sys.path or PYTHONPATH)") from error
    obj: Any = module
    for part in path.split("."):
        if not hasattr(obj, part):
            raise RecipeError(f"{what}: module '{module_name}' "
                              f"({getattr(module, '__file__', None) or 'built in'}) has no "
                              f"'{path}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RecipeError(f"{what}: '{path}' is {_describe(obj)}, not a function of a role")
    return obj


def call(fn: Factory, role: QuantizerRole, origin: str) -> Dict[str, Any]:
    """``fn(role)`` as a spec dictionary; errors name the factory and the role."""
    where = f"{origin}, role {role}"
    try:
        result = fn(role)
    except RecipeError:
        raise
    except Exception as error:
        raise RecipeError(f"{where}: the factory raised {type(error).__name__}: {error}") \
            from error
    return spec_dict(result, where)


class FactoryTable:
    """A recipe's factories: the callables given in Python (``Recipe.from_factory``) by their
    reference, and those YAML rules name, imported on first use."""

    def __init__(self, given: Dict[str, Factory]):
        self._given = dict(given)
        self._imported: Dict[str, Factory] = {}

    def lookup(self, reference: str, rule: str) -> Tuple[Factory, str]:
        fn = self._given.get(reference) or self._imported.get(reference)
        if fn is None:
            fn = import_factory(reference, rule)
            self._imported[reference] = fn
        return fn, origin_of(fn)


def resolver_for(recipe: Any) -> Callable[..., Tuple[Dict[str, Any], str]]:
    """The engine's factory resolver for `recipe` (a qrecipe.Recipe): called by the engine as
    ``resolver(factory, rule, module_type, tensor_type, name)`` and answering ``(spec dict,
    origin)``. Holds the recipe weakly: the engine it is installed on belongs to the recipe."""
    ref = weakref.ref(recipe)

    def resolve(factory: str, rule: str, module_type: str, tensor_type: str,
                name: str) -> Tuple[Dict[str, Any], str]:
        owner = ref()
        if owner is None:
            raise RecipeError(f"{rule}: the recipe of this engine is gone; keep the "
                              "qrecipe.Recipe alive while its modules run")
        fn, origin = owner._factory_table.lookup(factory, rule)
        role = role_in_context(module_type, tensor_type, name)
        return call(fn, role, origin), origin

    return resolve
