"""The fast lane stays fast: a test that starts a whole pytest run of the plugin or the
real llama-server carries the ``integration`` mark (pytest.ini), so
``pytest tests/ -m "not integration"`` never waits for one (README, Development).

Static: each test function's body, and the module-level helpers and fixtures it uses,
are searched for the calls that start such a run.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: calls that start a real server or a whole pytest run of the plugin
STARTERS = ("runpytest_subprocess", "runpytest", "PytestRun.start", "llama_paths", "run_case")


def _marks(decorators: list[ast.expr]) -> set[str]:
    return {ast.unparse(d).removeprefix("pytest.mark.").split("(")[0] for d in decorators}


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return {m.removeprefix("pytest.mark.").split("(")[0]
                    for m in ast.unparse(node.value).strip("[]").split(", ")}
    return set()


def unmarked_starters(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    if "integration" in _module_marks(tree):
        return []
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    starts = {name for name, fn in funcs.items() if any(s in ast.unparse(fn) for s in STARTERS)}
    changed = True
    while changed:  # a fixture or helper that uses one starts one too
        changed = False
        for name, fn in funcs.items():
            used = {a.arg for a in fn.args.args} | {
                c.func.id for c in ast.walk(fn)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            if name not in starts and used & starts:
                starts.add(name)
                changed = True
    return [f"{path.name}::{name}" for name in sorted(starts)
            if name.startswith("test_") and "integration" not in _marks(funcs[name].decorator_list)]


def test_every_test_that_starts_a_run_or_a_server_is_marked_integration():
    found = [t for p in sorted(TESTS.glob("test_*.py")) if p.name != Path(__file__).name
             for t in unmarked_starters(p)]
    assert found == []


def test_the_check_sees_an_unmarked_starter(tmp_path):
    p = tmp_path / "test_x.py"
    p.write_text("import pytest\n\n@pytest.fixture\ndef project(pytester):\n    return pytester\n\n"
                 "def test_a(project):\n    project.runpytest_subprocess()\n\n"
                 "@pytest.mark.integration\ndef test_b(project):\n"
                 "    project.runpytest_subprocess()\n\n"
                 "def test_c():\n    assert 1\n")
    assert unmarked_starters(p) == ["test_x.py::test_a"]
