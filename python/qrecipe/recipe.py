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

Recipes in Python: :meth:`Recipe.from_factory` makes a recipe of a function of a
``QuantizerRole`` (factories.py), and a YAML rule may delegate its roles to one (``factory:
package.module:function``); the engine calls the factory once per role through the resolver
installed on the recipe's engine.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from . import factories as _factories
from . import telemetry as _telemetry
from ._engine import _C
from .quantization import QuantizedTensor, Quantizer, Usage, check_source
from .roles import TENSOR_TYPES, model_gemms, resolving
from .scaling_state import state_from_checkpoint, state_to_checkpoint


# Where Recipe.of_factory keeps a factory's recipe (on the function, or on a method's object).
_FACTORY_RECIPE = "__qrecipe_recipe__"
_seen_factory_code: Dict[Any, str] = {}


def _warn_if_remade(factory: Callable) -> None:
    """A second function made from the same code (a lambda written inside the training loop)
    would silently be a fresh recipe each step: say so, once per code object."""
    code = getattr(getattr(factory, "__func__", factory), "__code__", None)
    if code is None:
        return
    state = _seen_factory_code.get(code)
    if state is None:
        _seen_factory_code[code] = "seen"
    elif state == "seen":
        _seen_factory_code[code] = "warned"
        warnings.warn(
            f"qrecipe.autocast got a new factory function made from the same code as an earlier "
            f"one ({code.co_filename}:{code.co_firstlineno}); each new function is a new recipe, "
            "so the factory runs again for every role and delayed scaling starts over. Define "
            "the factory once, outside the training loop (or pass one Recipe.from_factory)",
            RecipeWarning, stacklevel=4)


class RecipeWarning(UserWarning):
    """What ``Recipe.check(model)`` finds about a valid recipe applied to a model: a rule that
    matches no module, a module a rule nearly covers but leaves in high precision."""


# Not resolve(): in the build tree the .py files are symlinks, the recipes sit beside them.
_RECIPES_DIR = Path(os.path.abspath(__file__)).parent / "recipes"

RecipeLike = Union["Recipe", str, "os.PathLike[str]", dict, Callable, None]


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

    def __init__(self, cpp: "_C.Recipe", *, validate: bool = True,
                 factories: Optional[Dict[str, Callable]] = None):
        if not isinstance(cpp, _C.Recipe):
            raise TypeError("use Recipe.load(path), Recipe.from_dict(d), "
                            "Recipe.from_factory(fn) or Recipe.default()")
        if validate:
            cpp.validate()  # raises RecipeError "file:line:col: ..." naming the first problem
        self._cpp = cpp
        self._engine: Optional[_C.Engine] = None
        # The factories its rules delegate to: given ones by reference, YAML ones imported.
        self._factory_table = _factories.FactoryTable(factories or {})
        self._delegates = bool(_C.recipe_factories(cpp))
        # Counts the changes of the delayed scales (updates, loads): a weight quantized and
        # kept under one value is stale under the next (nn/weight_cache.py).
        self.scaling_generation = 0
        # Where the delayed-scaling amaxes are max-reduced before each update: "world" (the
        # default process group when torch.distributed runs with several ranks), a process
        # group, or None (each process on its own). See amax_reduction_group.
        self._amax_group: Any = "world"
        # The `telemetry:` key (telemetry.py): None, or what to gather under this recipe.
        self.telemetry: Optional[_telemetry.Settings] = \
            _telemetry.settings_of_recipe(cpp.telemetry())
        _telemetry.note_recipe(self, self.telemetry)

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
        engine, so errors are exactly the file errors, located in that text. Any Unicode
        text is taken: characters outside the BMP are written as themselves (JSON's
        surrogate-pair escapes are not YAML), control characters as JSON escapes."""
        if not isinstance(recipe, dict):
            raise TypeError(f"Recipe.from_dict takes a dict, got {type(recipe).__name__}")
        try:
            text = json.dumps(recipe, indent=2, ensure_ascii=False)
        except TypeError as error:
            raise TypeError(f"Recipe.from_dict: the dictionary holds a value that is not a "
                            f"string, number, bool, list or dict ({error})") from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            bad = text[error.start:error.end].encode("unicode_escape").decode("ascii")
            raise ValueError(f"Recipe.from_dict: the dictionary holds text that is not valid "
                             f"Unicode (a lone surrogate {bad}, e.g. from a badly decoded "
                             f"file name); fix the string") from None
        return cls.from_yaml(text, source_name, validate=validate)

    @classmethod
    def from_factory(cls, factory: Callable, name: Optional[str] = None) -> "Recipe":
        """A recipe decided by a Python function, as TransformerEngine's
        ``CustomRecipe(qfactory=...)``: ``factory(role)`` gets a :class:`qrecipe.QuantizerRole`
        and returns a spec from ``qrecipe.formats``, a spec dict, or None (high precision).
        It runs once per role, when the role is first resolved, and its answer is validated
        like a YAML recipe's (errors name the factory, its file:line, and the role)."""
        if not callable(factory):
            raise TypeError(f"Recipe.from_factory takes a function of a QuantizerRole, got "
                            f"{type(factory).__name__}")
        reference = _factories.display_name(factory)
        cpp = _C.recipe_from_factory(reference, name or reference, f"<factory {reference}>")
        return cls(cpp, factories={reference: factory})

    @classmethod
    def of_factory(cls, factory: Callable) -> "Recipe":
        """The one Recipe ``qrecipe.autocast(factory)`` uses for `factory`: made on first use
        and kept on the function (or, for a bound method, on its object), so the factory runs
        once per role and delayed scaling persists across steps, and both go away together.
        Define the factory once, outside the training loop: a new function is a new recipe."""
        owner, slot = factory, _FACTORY_RECIPE
        if hasattr(factory, "__self__") and hasattr(factory, "__func__"):
            # A bound method is a new object at each attribute access: keep it on the object.
            owner, slot = factory.__self__, f"{_FACTORY_RECIPE}{factory.__func__.__name__}"
        cached = getattr(owner, "__dict__", {}).get(slot)
        if cached is not None:
            return cached
        if not hasattr(owner, "__dict__"):
            raise TypeError(f"qrecipe.autocast({type(factory).__name__} object): cannot keep "
                            "its recipe on it; make the recipe once, recipe = "
                            "qrecipe.Recipe.from_factory(factory), and pass that")
        _warn_if_remade(factory)
        recipe = cls.from_factory(factory)
        owner.__dict__[slot] = recipe
        return recipe

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

    @property
    def delegates(self) -> bool:
        """Whether some of its roles are decided by a Python factory."""
        return self._delegates

    def check(self, model: Optional[torch.nn.Module] = None) -> List[str]:
        """Every validation problem against the loaded plugins (empty: valid). With `model`,
        also what the recipe does to the model's modules that its author may not mean, each
        issued as a :class:`RecipeWarning` too: a rule that matches none of the model's roles
        (or never decides one), and a module left in high precision while a quantizing rule
        would cover it but for its module_type or its name."""
        problems = list(self._cpp.check())
        if model is None:
            return problems
        roles = [(g.module_type, t, g.name) for g in model_gemms(model) for t in TENSOR_TYPES]
        findings = list(_C.recipe_coverage(self._cpp, roles))
        for finding in findings:
            warnings.warn(f"recipe '{self.name}': {finding}", RecipeWarning, stacklevel=2)
        return problems + findings

    def resolve(self, module_type: str, tensor_type: str, name: str = "") -> str:
        """The quantizer spec a role gets, as a string (``"none"`` keeps high precision). A
        role a factory decides is resolved through the engine (running the factory)."""
        if self._delegates:
            q = self.engine.resolve(module_type, tensor_type, name)
            return "none" if q is None else q.spec
        return self._cpp.resolve(module_type, tensor_type, name)

    def origin(self, module_type: str, tensor_type: str, name: str = "") -> str:
        """Where the role's spec comes from: ``rules[2] (file:7:5)``, ``defaults (...)``, or a
        factory (``factory 'mod.fn' (mod.py:12)``, after the rule that delegates to it)."""
        return _C.engine_origin(self.engine, module_type, tensor_type, name)

    def rules(self) -> List[Tuple[str, str]]:
        """(match, quantizer) pairs in order (``factory package.module:function`` for a rule
        that delegates), then ("defaults", spec)."""
        return list(self._cpp.rules())

    def explain(self, model: torch.nn.Module) -> str:
        """For every GEMM of `model` (qrecipe modules, and plain torch.nn.Linear layers as
        ``qrecipe.convert`` would make them): what each of its three roles gets and where from
        (a rule, the defaults, or a factory), then how each GEMM runs on the CPU."""
        lines = [f"recipe '{self.name}' ({self.source})"]
        for g in model_gemms(model):
            plan = self.plan_linear(g.module_type, g.name, g.in_features, g.out_features, 1,
                                    dtype=g.dtype)
            lines.append(f"{g.module_type} {g.name or '<unnamed>'} "
                         f"[{g.in_features} -> {g.out_features}]:")
            for tensor_type in TENSOR_TYPES:
                q = plan[tensor_type]
                what = "none (high precision)" if q is None else q.describe()
                lines.append(f"  {tensor_type}: {what}  <- "
                             f"{self.origin(g.module_type, tensor_type, g.name)}")
            for kind in ("fprop", "dgrad", "wgrad"):
                lines.append(f"  {kind}: {plan[kind]}")
        return "\n".join(lines)

    # ---------------------------------------------------------------- engine
    @property
    def engine(self) -> "_C.Engine":
        if self._engine is None:
            engine = _C.Engine(self._cpp)
            if self._delegates:
                _C.set_factory_resolver(engine, _factories.resolver_for(self))
            self._engine = engine
        return self._engine

    def plan_linear(self, module_type: str, name: str, in_features: int, out_features: int,
                    tokens: int, target: str = "cpu", dtype: Optional[torch.dtype] = None):
        """``engine.plan_linear`` (the quantizers of a linear layer's three roles and how its
        GEMMs run), with the layer's features and dtype passed on to any factory that decides
        one of the roles (``QuantizerRole.shape`` / ``dtype``)."""
        with resolving(in_features, out_features, dtype):
            return self.engine.plan_linear(module_type, name, in_features, out_features, tokens,
                                           target)

    def quantizer(self, module_type: str, tensor_type: str, name: str = ""):
        """The quantizer this recipe gives a role (None for format none)."""
        q = self.engine.resolve(module_type, tensor_type, name)
        return None if q is None else Quantizer(q)

    @property
    def amax_reduction_group(self):
        """The process group whose ranks share this recipe's delayed scales: before each
        scaling update the step's amaxes of ALL its states are max-reduced over it in one
        collective, so every rank (data parallel: FSDP2, DDP) keeps the same histories and
        scales. Default: the whole world when torch.distributed is initialized with more
        than one rank, else none; set a group, or None to keep each process on its own.
        Every rank of the group must run the update at the same point (it does: at its next
        outermost autocast entry after a step) with the same states (the same model)."""
        if self._amax_group != "world":
            return self._amax_group
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.group.WORLD
        return None

    @amax_reduction_group.setter
    def amax_reduction_group(self, group) -> None:
        self._amax_group = group

    def update_scaling(self) -> None:
        """Delayed scaling: fold this step's amaxes into the histories and recompute the
        scales, the amaxes first max-reduced over ``amax_reduction_group``.
        ``qrecipe.autocast`` calls it once per step; call it yourself only when you run
        modules without autocast blocks marking the steps."""
        if self._engine is None:
            return
        group = self.amax_reduction_group
        amaxes = self._engine.current_amaxes() if group is not None else []
        if not amaxes:
            self._engine.update_scaling()
        else:
            self._engine.update_scaling_with(_max_reduced(amaxes, group))
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
        if not Recipe._pending.recipes:
            return
        # An update launches work and reads through the host, which a CUDA graph capture can
        # neither hold nor replay: refuse before anything runs, with the updates still due.
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "qrecipe.autocast: entered during CUDA graph capture (torch.cuda.graph, "
                "torch.cuda.make_graphed_callables or torch.compile's mode='reduce-overhead') "
                "with a delayed-scaling update due; qrecipe cannot be captured yet: its "
                "scaling updates and amaxes go through the host, which a replayed graph would "
                "not redo. Run the qrecipe modules eagerly: capture only the parts of the "
                "model outside them. The update stays due for the next eager autocast block")
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
        if not isinstance(state["scaling_states"], list):
            raise ValueError(f"Recipe.load_state_dict: scaling_states has type "
                             f"{type(state['scaling_states']).__name__}; expected a list")
        states = [state_from_checkpoint(s, f"scaling_states[{i}]")
                  for i, s in enumerate(state["scaling_states"])]
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


def _max_reduced(values: List[float], group) -> List[float]:
    """`values` max-reduced over the ranks of `group` in one collective (on the current CUDA
    device under NCCL)."""
    import torch.distributed as dist
    work = torch.tensor(values, dtype=torch.float32)
    if dist.get_backend(group) == "nccl":
        work = work.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(work, op=dist.ReduceOp.MAX, group=group)
    return work.cpu().tolist()


def as_recipe(recipe: RecipeLike) -> Recipe:
    """A Recipe from a Recipe, a YAML path, a dict, a factory (a function of a
    QuantizerRole: the one Recipe.of_factory keeps for it), or None (the default recipe)."""
    if recipe is None:
        return Recipe.default()
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.from_dict(recipe)
    if isinstance(recipe, (str, os.PathLike)):
        return Recipe.load(recipe)
    if callable(recipe):
        return Recipe.of_factory(recipe)
    raise TypeError(f"recipe must be a qrecipe.Recipe, a path to a YAML file, a dict, a factory "
                    f"function of a QuantizerRole or None, got {type(recipe).__name__}")


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
