"""docs/extending.md's plugin package, written from the page's own code blocks.

Each block whose first line is a comment naming a file of the package (``# pyproject.toml``,
``# strata_example/rules.py``) is that file. Two ways to install it:

* :func:`install_here` (fast, in this process): the package and a ``.dist-info`` folder
  whose ``entry_points.txt`` is the pyproject's entry-point tables, put on ``sys.path``:
  ``importlib.metadata`` finds it there as it finds any installed distribution, so
  Strata's discovery is the real one, without pip.
* ``tests/test_plugin_package.py``: ``pip install`` of the written package into a fresh
  virtualenv, beside Strata.
"""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from pathlib import Path

DOC = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
PACKAGE = "strata_example"
DIST = "strata-example"


def doc_block(first_line: str, lang: str | None = None) -> str:
    """The page's code block whose first line is ``first_line`` (a comment naming where
    it goes): the lines after it, dedented."""
    for found, body in re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.S):
        head, _, rest = textwrap.dedent(body).partition("\n")
        if head.strip() == first_line and (lang is None or found == lang):
            return textwrap.dedent(rest)
    raise AssertionError(f"docs/extending.md has no block starting {first_line!r}")


def package_files() -> dict[str, str]:
    """``{relative path: text}`` of every file the page gives the package."""
    out = {}
    for _lang, body in re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.S):
        head = textwrap.dedent(body).partition("\n")[0].strip()
        m = re.fullmatch(rf"# (pyproject\.toml|{PACKAGE}/\w+\.py)", head)
        if m:
            out[m.group(1)] = doc_block(head)
    out.setdefault(f"{PACKAGE}/__init__.py", '"""The page\'s example Strata plugin."""\n')
    return out


def write_package(dest: Path) -> Path:
    """The package as the page lays it out, in ``dest``."""
    for rel, text in package_files().items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dest


def entry_points() -> dict[str, dict[str, str]]:
    """The pyproject's entry-point tables: ``{group: {name: value}}``."""
    return tomllib.loads(package_files()["pyproject.toml"])["project"]["entry-points"]


def install_here(dest: Path, monkeypatch, *, extra_groups: dict | None = None,
                 drop: tuple[str, ...] = ()) -> Path:
    """The package on ``sys.path`` with its distribution's metadata, for this process:
    Strata's discovery finds it. ``extra_groups`` adds entry points (a broken plugin);
    ``drop`` leaves groups out. Undone by ``monkeypatch`` and :func:`forget`."""
    from strata_plugin import entry_points as ep

    write_package(dest)
    groups = {g: dict(v) for g, v in entry_points().items() if g not in drop}
    for g, more in (extra_groups or {}).items():
        groups.setdefault(g, {}).update(more)
    meta = dest / "strata_example-0.1.0.dist-info"  # uninstall() removes it
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text("".join(
        f"[{g}]\n" + "".join(f"{n} = {v}\n" for n, v in names.items()) + "\n"
        for g, names in groups.items()))
    forget()
    monkeypatch.syspath_prepend(str(dest))
    monkeypatch.setenv("PYTHONPATH", str(dest))  # the agent processes the harness starts
    ep.reset()
    return dest


def uninstall(dest: Path) -> None:
    """The distribution's metadata removed (the package's files stay): Strata no longer
    finds its entry points, as after ``pip uninstall``."""
    import shutil

    shutil.rmtree(dest / "strata_example-0.1.0.dist-info")
    forget()


def forget() -> None:
    """Strata's loaded plugins and the package's modules forgotten (a test's teardown)."""
    from strata_plugin import entry_points as ep

    ep.reset()
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
