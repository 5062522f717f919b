"""``qrecipe.Recipe``: a validated recipe and the engine that resolves its roles; and
``qrecipe.quantize``, which quantizes one tensor under a one-rule recipe.

A recipe maps every quantizer role (module_type, tensor_type, module name) to a quantizer spec
(docs/recipes.md). Parsing and validation happen in the C++ engine, so errors carry the file,
line and column (``<dict>`` for recipes built from Python dictionaries).

Each Recipe object owns one engine, made on first use and kept for the recipe's lifetime: it
caches the resolved quantizers and holds the delayed-scaling state (amax histories, scales),
so reuse one Recipe object across training steps.

Whether a recipe's scaling update is due (its modules quantized since its last update) is kept
per thread, like the autocast state that runs the update (autocasting.py): a recipe marked in
one thread is updated by the next outermost ``autocast`` entry of that thread.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ._engine import _C
from .quantization import QuantizedTensor, Quantizer, Usage, check_source
from .scaling_state import state_from_checkpoint, state_to_checkpoint

# Not resolve(): in the build tree the .py files are symlinks, the recipes sit beside them.
_RECIPES_DIR = Path(os.path.abspath(__file__)).parent / "recipes"

RecipeLike = Union["Recipe", str, "os.PathLike[str]", dict, None]


class _PendingUpdates(threading.local):
    """The recipes whose modules quantized since their last scaling update, on this thread
    (strong references: a recipe stays alive until its update ran)."""

    def __init__(self) -> None:
        self.recipes: Dict[int, "Recipe"] = {}


class Recipe:
    """A parsed and validated recipe. Build one with :meth:`load`, :meth:`from_dict`,
    :meth:`from_yaml`, :meth:`builtin` or :meth:`default`."""

    _default: Optional["Recipe"] = None
    _pending = _PendingUpdates()

    def __init__(self, cpp: "_C.Recipe", *, validate: bool = True):
        if not isinstance(cpp, _C.Recipe):
            raise TypeError("use Recipe.load(path), Recipe.from_dict(d) or Recipe.default()")
        if validate:
            cpp.validate()  # raises RecipeError "file:line:col: ..." naming the first problem
        self._cpp = cpp
        self._engine: Optional[_C.Engine] = None
        # Counts the changes of the delayed scales (updates, loads): a weight quantized and
        # kept under one value is stale under the next (nn/weight_cache.py).
        self.scaling_generation = 0

    # ---------------------------------------------------------------- construction
    @classmethod
    def load(cls, path: "str | os.PathLike[str]", *, validate: bool = True) -> "Recipe":
        """Parses a YAML recipe file and validates it against the loaded plugins."""
        return cls(_C.Recipe.load(os.fspath(path)), validate=validate)

    @classmethod
    def from_yaml(cls, text: str, source_name: str = "<string>", *,
                  validate: bool = True) -> "Recipe":
        return cls(_C.Recipe.parse(text, source_name), validate=validate)

    @classmethod
    def from_dict(cls, recipe: Dict[str, Any], source_name: str = "<dict>", *,
                  validate: bool = True) -> "Recipe":
        """A recipe from a dictionary with the YAML file's structure, e.g.
        ``{"version": 1, "name": "fp8", "defaults": {"format": "float8"}}``.

        The dictionary is written out as indented JSON (which is YAML) and parsed by the
        engine, so errors are exactly the file errors, located in that text."""
        if not isinstance(recipe, dict):
            raise TypeError(f"Recipe.from_dict takes a dict, got {type(recipe).__name__}")
        try:
            text = json.dumps(recipe, indent=2)
        except TypeError as error:
            raise TypeError(f"Recipe.from_dict: the dictionary holds a value that is not a "
                            f"string, number, bool, list or dict ({error})") from None
        return cls.from_yaml(text, source_name, validate=validate)

    @classmethod
    def builtin(cls, name: str) -> "Recipe":
        """One of the recipes shipped with qrecipe, by file name: ``Recipe.builtin("mxfp8")``."""
        path = _RECIPES_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ValueError(f"no shipped recipe named '{name}'; available: "
                             f"{', '.join(cls.builtin_names())}")
        return cls.load(path)

    @staticmethod
    def builtin_names() -> List[str]:
        return sorted(p.stem for p in _RECIPES_DIR.glob("*.yaml"))

    @classmethod
    def default(cls) -> "Recipe":
        """The recipe used when none is given (recipes/default.yaml). One shared object, so
        its engine and scaling state persist across ``autocast`` blocks."""
        if cls._default is None:
            cls._default = cls.load(_RECIPES_DIR / "default.yaml")
        return cls._default

    # ---------------------------------------------------------------- inspection
    @property
    def name(self) -> str:
        return self._cpp.name

    @property
    def source(self) -> str:
        return self._cpp.source

    def check(self) -> List[str]:
        """Every validation problem against the loaded plugins (empty: valid)."""
        return list(self._cpp.check())

    def resolve(self, module_type: str, tensor_type: str, name: str = "") -> str:
        """The quantizer spec a role gets, as a string (``"none"`` keeps high precision)."""
        return self._cpp.resolve(module_type, tensor_type, name)

    def rules(self) -> List[Tuple[str, str]]:
        """(match, quantizer) pairs in order, then ("defaults", spec)."""
        return list(self._cpp.rules())

    # ---------------------------------------------------------------- engine
    @property
    def engine(self) -> "_C.Engine":
        if self._engine is None:
            self._engine = _C.Engine(self._cpp)
        return self._engine

    def quantizer(self, module_type: str, tensor_type: str, name: str = ""):
        """The quantizer this recipe gives a role (None for format none)."""
        q = self.engine.resolve(module_type, tensor_type, name)
        return None if q is None else Quantizer(q)

    def update_scaling(self) -> None:
        """Delayed scaling: fold this step's amaxes into the histories and recompute the
        scales. ``qrecipe.autocast`` calls it once per step; call it yourself only when you
        run modules without autocast blocks marking the steps."""
        if self._engine is not None:
            self._engine.update_scaling()
            self.scaling_generation += 1

    # ---------------------------------------------------------------- update timing
    def note_step_activity(self) -> None:
        """Called by modules that quantized under this recipe: its scaling update is due at
        the next outermost ``autocast`` entry of this thread."""
        Recipe._pending.recipes[id(self)] = self

    @property
    def update_pending(self) -> bool:
        """True when this recipe's modules ran on this thread since its last scaling update
        (the update is due at the next outermost autocast entry): checkpoints record it."""
        return id(self) in Recipe._pending.recipes

    @staticmethod
    def run_pending_updates() -> None:
        """The scaling update of every recipe marked on this thread, each once (what an
        outermost ``autocast`` entry runs)."""
        pending = list(Recipe._pending.recipes.values())
        Recipe._pending.recipes.clear()
        for recipe in pending:
            recipe.update_scaling()

    def scaling_states(self, roles: Optional[List[str]] = None) -> List[dict]:
        """The delayed-scaling states (owner role, amax history, scale), in creation order;
        with `roles` (e.g. ``["linear:input@fc"]``) only the states of those roles."""
        return [] if self._engine is None else list(self._engine.scaling_states(roles=roles))

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """Every delayed-scaling state of this recipe's engine (amax history as a float32
        tensor, scale, scale_inv, owner), plus whether the step's update is still due, for
        ``torch.save``. Modules also carry their own states in ``model.state_dict()``."""
        return {"recipe": self.name, "update_pending": self.update_pending,
                "scaling_states": [state_to_checkpoint(s) for s in self.scaling_states()]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Loads what :meth:`state_dict` returned, bit for bit. The roles named by the
        states are resolved first (creating their quantizers), so this works on a fresh
        Recipe. A state whose role has another format, no delayed scaling or another
        amax_history_len under this recipe is an error naming it; nothing is written then."""
        if not isinstance(state, dict) or "scaling_states" not in state:
            raise ValueError("Recipe.load_state_dict takes the dict Recipe.state_dict() "
                             "returned (with a 'scaling_states' list)")
        states = [state_from_checkpoint(s) for s in state["scaling_states"]]
        for s in states:
            self.engine.resolve(*_C.role_of_owner(s["owner"]))
        try:
            self.engine.load_scaling_states(states, update=bool(state.get("update_pending")))
            self.scaling_generation += 1
        except _C.QrecipeError as error:
            raise _C.QrecipeError(f"loading the scaling state saved under recipe "
                                  f"'{state.get('recipe')}' into recipe '{self.name}': "
                                  f"{error}") from None

    def __repr__(self) -> str:
        return f"Recipe(name={self.name!r}, source={self.source!r})"


def as_recipe(recipe: RecipeLike) -> Recipe:
    """A Recipe from a Recipe, a YAML path, a dict, or None (the default recipe)."""
    if recipe is None:
        return Recipe.default()
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.from_dict(recipe)
    if isinstance(recipe, (str, os.PathLike)):
        return Recipe.load(recipe)
    raise TypeError(f"recipe must be a qrecipe.Recipe, a path to a YAML file, a dict or None, "
                    f"got {type(recipe).__name__}")


def quantize(tensor: torch.Tensor, format: str, *, usage: Usage = ("rowwise", "columnwise"),
             **options) -> QuantizedTensor:
    """Quantizes ``tensor`` with ``format`` and its options, as a recipe rule would:
    ``qrecipe.quantize(w, "float8", dtype="e5m2")``, ``qrecipe.quantize(x, "mxfp8")``,
    ``qrecipe.quantize(x, "hybrid", rowwise={"format": "float8"}, columnwise={"format": "mxfp8"})``.

    Options are validated against the plugin's schema (unknown keys and bad values are
    errors naming what is allowed). Each call uses a fresh engine, so a delayed-scaling format
    starts from its initial state (scale 1)."""
    if not isinstance(format, str):
        raise TypeError(f"format must be a string such as 'float8', got {type(format).__name__}")
    check_source(tensor, "tensor to quantize")
    spec = {"format": format, **options}
    recipe = Recipe.from_dict({"version": 1, "name": f"quantize-{format}", "defaults": spec},
                              source_name=f"<qrecipe.quantize({format!r})>")
    quantizer = recipe.quantizer("", "", "")
    if quantizer is None:
        raise ValueError("format 'none' keeps the tensor in high precision; there is nothing to "
                         "quantize")
    return quantizer.quantize(tensor, usage)  # the quantizer keeps its engine alive
