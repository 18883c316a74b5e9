"""strata_plugin/'s modules, each read and parsed once per test process.

Several static checks walk every module of the package (import cycles, process globals,
the run outcome's one writer, the head rule); parsing all of them takes about 1.3 s, so
each test that parsed them again cost that much. The trees are shared: a check reads
them and never changes them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "strata_plugin"


@functools.cache
def package_files() -> tuple[Path, ...]:
    """Every module of the package, sorted by path."""
    return tuple(sorted(PKG.rglob("*.py")))


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The module at ``path`` parsed (once per process; not to be modified)."""
    return ast.parse(path.read_text(), filename=str(path))
