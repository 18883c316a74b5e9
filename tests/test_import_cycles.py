"""No import cycle inside strata_plugin: module level, lazy (function-level) and
``if TYPE_CHECKING:`` imports alike.

A cycle makes import order matter and hides which layer owns what; the folders are a
pipeline (configure -> load -> run -> analysis -> report -> plugin) and must stay one.
An import under ``if TYPE_CHECKING:`` never runs, but it still says that one module
knows the other's types: two modules that name each other are one module in two files
(the agents' functions took the whole session while the session imported them back),
so those imports count too. ``from pkg import mod`` names the submodule, not the
package's own code.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path

from package_source import package_files, parsed

PKG = Path(__file__).resolve().parents[1] / "strata_plugin"


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for p in package_files():
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports_of(name: str, tree: ast.Module, mods: Collection[str], *,
               package: bool = False) -> set[str]:
    """The modules of ``mods`` that module ``name`` imports anywhere in ``tree``: at
    module level, inside functions, and under ``if TYPE_CHECKING:`` (every import
    statement of the tree). ``package``: the tree is the package's ``__init__``."""
    pkg = name if package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods]
            targets = subs if len(subs) == len(node.names) else [mod, *subs]
        out.update(t for t in targets if t in mods and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        edges[name] = imports_of(name, parsed(path), mods, package=path.name == "__init__.py")
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges).union(*edges.values())):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_a_lazy_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_follows_type_checking_and_lazy_imports():
    """The shape of the circle that was left (run/nodes.py <-> run/session.py): one side
    imports at module level, the other only under ``if TYPE_CHECKING:``."""
    mods = {"p", "p.nodes", "p.session", "p.server"}
    nodes = ast.parse("from __future__ import annotations\n"
                      "from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n"
                      "    from p.session import StrataSession\n"
                      "def start(sess: StrataSession):\n"
                      "    from p.server import Server\n")
    session = ast.parse("from p.nodes import start\n")
    assert imports_of("p.nodes", nodes, mods) == {"p.session", "p.server"}
    graph = {"p.nodes": imports_of("p.nodes", nodes, mods),
             "p.session": imports_of("p.session", session, mods)}
    assert cycles(graph) == [["p.nodes", "p.session"]]
    # relative imports, and a package's own __init__
    rel = ast.parse("from . import server\nfrom .session import x\n")
    assert imports_of("p.nodes", rel, mods) == {"p.server", "p.session"}
    assert imports_of("p", ast.parse("from .nodes import start\n"), mods,
                      package=True) == {"p.nodes"}


def test_only_the_plugin_package_imports_pytest():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("strata_plugin.plugin"):
            continue
        tree = parsed(path)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "pytest" or n.startswith(("pytest.", "_pytest")) for n in names):
                offenders.append(name)
    assert offenders == []


def test_the_ray_engine_ships_the_package_folder_it_names():
    """It names the folder without importing the package (which would close a circle
    through the package's public names): the same folder an import finds."""
    import strata_plugin
    from strata_plugin.load.ray_engine import PACKAGE_DIR

    assert PACKAGE_DIR == Path(strata_plugin.__file__).parent
    assert (PACKAGE_DIR / "load" / "ray_engine.py").is_file()
