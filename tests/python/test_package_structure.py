"""The layers of the qrecipe package (its docstring has the map), checked on the source.

Every ``.py`` file under python/qrecipe is parsed with ``ast`` (nothing is imported), and every
import of a qrecipe module is an edge of the import graph, including imports written inside
functions, which run later but still tie the two modules together. The package must have:

- no import cycle;
- a ground floor (the top-level modules below) that imports only the ground floor;
- ``nn/`` importing only the ground floor and ``nn/``;
- ``optim/`` and ``distributed/`` importing the ground floor, ``nn/``, ``optim/`` and
  ``distributed/``, never the top (the package's ``__init__`` and ``convert``);
- no private name (``_name``) imported from another qrecipe module (the extension ``_C``
  excepted): what a module shares with others is public there.

A new top-level module must be placed in GROUND_FLOOR or TOP below (and in the package
docstring's layer map).
"""
import ast
import pathlib
from typing import Dict, List, NamedTuple, Optional, Set

from conftest import REPO

PACKAGE_DIR = REPO / "python" / "qrecipe"

# Top-level modules, by layer. The ground floor talks to the extension; the top re-exports
# and converts models, so it may import every layer.
GROUND_FLOOR = {"qrecipe._engine", "qrecipe.quantization", "qrecipe.scaling_state",
                "qrecipe.roles", "qrecipe.formats", "qrecipe.factories",
                "qrecipe.recipe", "qrecipe.autocasting", "qrecipe.quantized_param",
                "qrecipe.quantized_rows", "qrecipe.quantized_shards", "qrecipe.quantized_storage",
                "qrecipe.checkpointing", "qrecipe.recomputation", "qrecipe.telemetry"}
TOP = {"qrecipe", "qrecipe.convert", "qrecipe.parallel"}
SUBPACKAGES = ("nn", "optim", "distributed")
EXTENSIONS = {"qrecipe._C"}  # compiled, imports nothing of the package
# What each layer may import.
ALLOWED = {
    "ground": {"ground"},
    "nn": {"ground", "nn"},
    "optim": {"ground", "nn", "optim", "distributed"},
    "distributed": {"ground", "nn", "optim", "distributed"},
    "top": {"ground", "nn", "optim", "distributed", "top"},
}


class Edge(NamedTuple):
    source: str
    target: str
    where: str  # "nn/base.py:24" (", in function f" for an import inside a function)


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> Optional[str]:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in SUBPACKAGES):
        return parts[1] if parts[1] in SUBPACKAGES else None
    if module in GROUND_FLOOR:
        return "ground"
    if module in TOP:
        return "top"
    return None


class _Imports(ast.NodeVisitor):
    """Every import statement of a file with the function it sits in (None: module level)."""

    def __init__(self) -> None:
        self.found: List[tuple] = []
        self._functions: List[str] = []

    def _function(self, node) -> None:
        self._functions.append(node.name)
        self.generic_visit(node)
        self._functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._functions[-1] if self._functions else None))

    visit_ImportFrom = visit_Import


def import_graph(root: pathlib.Path = PACKAGE_DIR):
    """(modules, edges, private imports) of the package at `root`."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    edges: List[Edge] = []
    private: List[str] = []
    for source, path in files.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        package = source if source in packages else source.rpartition(".")[0]
        for node, function in visitor.found:
            where = f"{path.relative_to(root)}:{node.lineno}" + \
                (f", in function {function}" if function else "")
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    if sub in EXTENSIONS:
                        continue
                    if sub in files:  # `from . import nn`, `from .nn import base`
                        targets.append(sub)
                    else:
                        targets.append(module)
                        if alias.name.startswith("_") and alias.name != "_C" and \
                                module in files and module != source:
                            private.append(f"{where}: {source} imports {alias.name} from "
                                           f"{module}")
            for target in targets:
                edge = Edge(source, target, where)
                if target in files and target != source and edge not in edges:
                    edges.append(edge)
    return set(files), edges, private


def cycles(modules: Set[str], edges: List[Edge]) -> List[List[Edge]]:
    """The shortest cycle (as its edges) through each module that lies on one: every module of
    every strongly connected component of more than one module (Tarjan's algorithm), so a
    component tangling several loops shows each of them."""
    out: Dict[str, List[Edge]] = {m: [] for m in modules}
    for e in edges:
        out[e.source].append(e)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in out[v]:
            if e.target not in index:
                visit(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for m in sorted(modules):
        if m not in index:
            visit(m)

    def shortest_cycle(start: str, component: Set[str]) -> List[Edge]:
        previous: Dict[str, Edge] = {}  # breadth-first from `start` back to itself
        frontier = [start]
        while frontier and start not in previous:
            following = []
            for v in frontier:
                for e in out[v]:
                    if e.target in component and e.target not in previous:
                        previous[e.target] = e
                        following.append(e.target)
            frontier = following
        path, v = [], start
        while True:
            e = previous[v]
            path.append(e)
            v = e.source
            if v == start:
                return list(reversed(path))

    found, seen = [], set()
    for component in components:
        for start in sorted(component):
            cycle = shortest_cycle(start, component)
            key = frozenset(cycle)
            if key not in seen:
                seen.add(key)
                found.append(cycle)
    return found


def layer_violations(modules: Set[str], edges: List[Edge]) -> List[str]:
    problems = [f"{m}: not placed in a layer (add it to GROUND_FLOOR or TOP in this test and "
                "to the package docstring's layer map)" for m in sorted(modules)
                if layer_of(m) is None]
    for e in edges:
        source, target = layer_of(e.source), layer_of(e.target)
        if source and target and target not in ALLOWED[source]:
            problems.append(f"{e.where}: {e.source} ({source}) imports {e.target} ({target})")
    return problems


def describe(cycle: List[Edge]) -> str:
    return " -> ".join(f"{e.source} [{e.where}]" for e in cycle) + f" -> {cycle[0].source}"


def test_the_graph_sees_every_kind_of_import(tmp_path):
    # A package with a cycle through an import inside a function, a relative import of a
    # parent's module, an absolute import and a private name: all must be found.
    pkg = tmp_path / "qrecipe"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import recipe\n")
    (pkg / "recipe.py").write_text("def f():\n    from .nn import base\n")
    (pkg / "nn" / "__init__.py").write_text("")
    (pkg / "nn" / "base.py").write_text("from .. import recipe\nimport qrecipe.nn.other\n"
                                        "from ..recipe import _hidden\n")
    (pkg / "nn" / "other.py").write_text("")
    modules, edges, private = import_graph(pkg)
    assert modules == {"qrecipe", "qrecipe.recipe", "qrecipe.nn", "qrecipe.nn.base",
                       "qrecipe.nn.other"}
    assert {(e.source, e.target) for e in edges} == {
        ("qrecipe", "qrecipe.recipe"), ("qrecipe.recipe", "qrecipe.nn.base"),
        ("qrecipe.nn.base", "qrecipe.recipe"), ("qrecipe.nn.base", "qrecipe.nn.other")}
    assert [e.where for e in edges if e.source == "qrecipe.recipe"] == \
        ["recipe.py:2, in function f"]
    [cycle] = cycles(modules, edges)
    assert {e.source for e in cycle} == {"qrecipe.recipe", "qrecipe.nn.base"}
    assert describe(cycle) == ("qrecipe.nn.base [nn/base.py:1] -> qrecipe.recipe [recipe.py:2, "
                               "in function f] -> qrecipe.nn.base")
    assert layer_violations(modules, edges) == [
        "recipe.py:2, in function f: qrecipe.recipe (ground) imports qrecipe.nn.base (nn)"]
    assert private == ["nn/base.py:3: qrecipe.nn.base imports _hidden from qrecipe.recipe"]


def test_no_import_cycles():
    modules, edges, _ = import_graph()
    found = cycles(modules, edges)
    assert not found, "import cycles in python/qrecipe:\n" + "\n".join(map(describe, found))


def test_layers_import_only_downwards():
    modules, edges, _ = import_graph()
    problems = layer_violations(modules, edges)
    assert not problems, "imports against the layers of python/qrecipe (see its " \
        "__init__.py):\n" + "\n".join(problems)


def test_no_private_names_across_modules():
    _, _, private = import_graph()
    assert not private, "private names imported from another module (make them public " \
        "there):\n" + "\n".join(private)
