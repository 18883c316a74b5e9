"""The fast lane stays fast: a test carries the marks of what it needs (pytest.ini), so
``pytest tests/ -m "not integration"`` never waits for a server (CONTRIBUTING.md).

* ``integration``: a test that starts a whole pytest run of the plugin (``pytester``'s
  runs, ``tests/test_robustness_support.PytestRun``, or ``python -m pytest`` in a
  subprocess, as the Ctrl-C tests do against a scripted server) or the real llama-server
  (``llama_paths``, ``run_case``, ``strata_plugin setup --print-paths``), or a packaged
  engine target's (``tests/engine_target.py``: ``engine_paths``, ``packaged_server``;
  ``tests/engine_profile_run.py``: ``profiled_run``).
* ``netlab`` and ``integration``: a test that builds the namespace lab
  (``tests/netlab.py``: ``lab_fixture``, ``NetLab.create``).
* ``vllm`` and ``integration``: a test that runs the vLLM virtualenv's own code
  (``tests/vllm_env.py``: ``vllm_python``).

Static: each test function's body, and the module-level helpers and fixtures it uses
(by name or as an argument), are searched for the calls that start such a thing.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: calls that start a real server or a whole pytest run of the plugin
STARTERS = ("runpytest_subprocess", "runpytest", "PytestRun.start", "llama_paths", "run_case",
            "--print-paths", "engine_paths", "packaged_server", "profiled_run")
#: calls that build network namespaces and veth pairs
LAB = ("lab_fixture", "NetLab.create")
#: calls that run the project's vLLM virtualenv's own code (tests/vllm_env.py): seconds of
#: imports, and a skip where setup --vllm has not run
VLLM = ("vllm_python",)
#: marks each kind of starter requires
NEEDS = {STARTERS: {"integration"}, LAB: {"integration", "netlab"}, VLLM: {"integration", "vllm"}}


def _marks(decorators: list[ast.expr]) -> set[str]:
    return {ast.unparse(d).removeprefix("pytest.mark.").split("(")[0] for d in decorators}


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return {ast.unparse(m).removeprefix("pytest.mark.").split("(")[0] for m in items}
    return set()


def _runs_pytest(fn: ast.FunctionDef) -> bool:
    """``"-m", "pytest"`` side by side in a list, a tuple or a call's arguments: a
    subprocess running pytest (``sys.executable, "-m", "pytest", ...``)."""
    for node in ast.walk(fn):
        seq = (node.elts if isinstance(node, (ast.List, ast.Tuple))
               else node.args if isinstance(node, ast.Call) else None)
        if seq:
            words = [e.value if isinstance(e, ast.Constant) else None for e in seq]
            if any(a == "-m" and b == "pytest" for a, b in itertools.pairwise(words)):
                return True
    return False


def _starting(funcs: dict[str, ast.FunctionDef], texts: dict[str, str],
              uses: dict[str, set[str]], starters: tuple[str, ...]) -> set[str]:
    starts = {name for name, text in texts.items() if any(s in text for s in starters)}
    if starters is STARTERS:
        starts |= {name for name, fn in funcs.items()
                   if "pytest" in texts[name] and _runs_pytest(fn)}
    changed = True
    while changed:  # a fixture or helper that uses one starts one too
        changed = False
        for name in funcs:
            if name not in starts and uses[name] & starts:
                starts.add(name)
                changed = True
    return starts


def unmarked_starters(path: Path) -> list[str]:
    """``file::test (missing marks)`` for each test that lacks a mark its starters need."""
    source = path.read_text()
    if not any(s in source for s in (*STARTERS, *LAB, *VLLM, "pytest'", 'pytest"')):
        return []  # nothing here could start one (each rule needs one of these words)
    tree = ast.parse(source)
    module = _module_marks(tree)
    lines = source.splitlines()
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    texts = {name: "\n".join(lines[fn.lineno - 1:fn.end_lineno]) for name, fn in funcs.items()}
    uses = {name: {a.arg for a in fn.args.args} | {
        c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        for name, fn in funcs.items()}
    missing: dict[str, set[str]] = {}
    for starters, needs in NEEDS.items():
        for name in _starting(funcs, texts, uses, starters):
            if name.startswith("test_"):
                lacks = needs - module - _marks(funcs[name].decorator_list)
                if lacks:
                    missing.setdefault(name, set()).update(lacks)
    return [f"{path.name}::{name} ({', '.join(sorted(missing[name]))})" for name in sorted(missing)]


def test_every_test_that_starts_a_run_a_server_or_a_lab_is_marked_so():
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
    assert unmarked_starters(p) == ["test_x.py::test_a (integration)"]


def test_a_pytest_subprocess_needs_the_mark_and_a_lab_needs_netlab_too(tmp_path):
    p = tmp_path / "test_y.py"
    p.write_text("import subprocess, sys\nimport pytest\nfrom netlab import lab_fixture\n\n"
                 "def _go(args):\n"
                 "    return subprocess.run([sys.executable, '-m', 'pytest', *args])\n\n"
                 "def test_sub():\n    _go(['-q'])\n\n"
                 "def test_other_module():\n"
                 "    subprocess.run([sys.executable, '-m', 'strata_plugin', 'profile-doc'])\n\n"
                 "@pytest.fixture\ndef lab(tmp_path_factory):\n"
                 "    yield from lab_fixture(tmp_path_factory)\n\n"
                 "@pytest.mark.integration\ndef test_lab(lab):\n    assert lab\n\n"
                 "@pytest.mark.integration\n@pytest.mark.netlab\ndef test_lab_marked(lab):\n"
                 "    assert lab\n")
    assert unmarked_starters(p) == ["test_y.py::test_lab (netlab)",
                                    "test_y.py::test_sub (integration)"]
    marked = tmp_path / "test_z.py"
    marked.write_text("import pytest\npytestmark = [pytest.mark.integration, pytest.mark.netlab]\n"
                      + p.read_text().split("\n", 2)[2])
    assert unmarked_starters(marked) == []


def test_vllms_own_code_needs_both_marks(tmp_path):
    p = tmp_path / "test_v.py"
    p.write_text("import pytest\nfrom vllm_env import vllm_python\n\n"
                 "def test_bare():\n    vllm_python()\n\n"
                 "@pytest.mark.vllm\ndef test_half():\n    vllm_python()\n\n"
                 "@pytest.mark.vllm\n@pytest.mark.integration\ndef test_both():\n"
                 "    vllm_python()\n")
    assert unmarked_starters(p) == ["test_v.py::test_bare (integration, vllm)",
                                    "test_v.py::test_half (integration)"]
