"""A plugin's collector on another node: whether its module can travel in the agent's
zip, and the files it travels as.

The agent runs on other nodes from a zip sent over ssh, on the node's own ``python3``
(3.8 or later) and its standard library alone (``run/remote.py``, docs/agent.md). A
collector of another package (the ``strata.collectors`` entry points) goes with it when
its module is one Python file that imports only the standard library and the agent
(``strata_plugin.agent...``, which is ``strata_agent`` in the zip: the remote side maps
the one name to the other). Then it is in the zip as itself, its parent packages as
empty ones (so that the package's ``__init__``, which may import anything, does not
run there). Any other collector module runs on the head node only: on the other nodes
the agent reports it UNAVAILABLE with the reason :func:`ship_problem` gives
(``--collector-unavailable``), and the run goes on.

Local side only (the harness); never shipped itself.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

#: What a shipped collector module may import besides the standard library.
AGENT_PACKAGE = "strata_plugin.agent"


def _source(module: str) -> tuple[Path | None, str]:
    """The module's file, or None with the reason it has none that can travel."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:
        return None, f"{module} cannot be found here ({type(e).__name__}: {e})"
    if spec is None:
        return None, f"{module} cannot be found here"
    origin = spec.origin or ""
    if spec.submodule_search_locations is not None or not origin.endswith(".py"):
        return None, f"{module} is not a single Python file ({origin or 'no file'})"
    return Path(origin), ""


def ship_problem(module: str) -> str | None:
    """Why ``module`` cannot run in the agent's zip on another node, or None when it can:
    one Python file importing only the standard library and ``strata_plugin.agent``."""
    path, why = _source(module)
    if path is None:
        return why
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except SyntaxError as e:
        return f"{module} does not parse: {e}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            return (f"{module} imports from its own package ({'.' * node.level}"
                    f"{node.module or ''}): only its own file travels")
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            if name == "__future__" or name.split(".")[0] in sys.stdlib_module_names:
                continue
            if name == AGENT_PACKAGE or name.startswith(AGENT_PACKAGE + "."):
                continue
            return (f"{module} imports {name}, which is neither the standard library nor "
                    f"the agent ({AGENT_PACKAGE})")
    return None


def zip_files(modules: list[str] | tuple[str, ...]) -> dict[str, bytes]:
    """``{zip name: bytes}`` for each shippable module: its file, and an empty
    ``__init__.py`` for each parent package. ValueError for one that cannot travel."""
    out: dict[str, bytes] = {}
    for module in modules:
        problem = ship_problem(module)
        if problem:
            raise ValueError(problem)
        path, _ = _source(module)
        assert path is not None
        parts = module.split(".")
        for i in range(1, len(parts)):
            out.setdefault("/".join(parts[:i]) + "/__init__.py", b"")
        out["/".join(parts) + ".py"] = path.read_bytes()
    return out
