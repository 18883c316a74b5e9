"""The process-wide state is declared in one place (strata_plugin/process_globals.py),
and importing Strata registers nothing: the atexit hooks that stop servers, faults and
traces are registered by the first one started (``testing/faults.py`` used to register
its hook at import, in every process that imported it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from package_source import package_files, parsed

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "strata_plugin"


#: Prints, one line each, the module of every atexit hook registered after it runs.
SPY = ("import atexit\n_register = atexit.register\n"
       "def _spy(f, *a, **k):\n"
       "    print(getattr(f, '__module__', '?'))\n"
       "    return _register(f, *a, **k)\n"
       "atexit.register = _spy\n")


def _hooks(code: str) -> list[str]:
    """The modules of the atexit hooks ``code`` registers, in a fresh interpreter, and
    the lines it prints itself."""
    out = subprocess.run([sys.executable, "-c", SPY + code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return out.stdout.split()


def test_importing_strata_registers_no_atexit_hook() -> None:
    """(Libraries Strata imports register their own: logging, multiprocessing.)"""
    hooks = _hooks("import strata_plugin.testing.faults, strata_plugin.run.tracing\n"
                   "import strata_plugin.run.reaper, strata_plugin.run.session\n"
                   "import strata_plugin.plugin, strata_plugin.load.sandbox\n")
    assert [h for h in hooks if h.startswith("strata_plugin")] == []


def test_the_first_fault_started_registers_its_hook_once() -> None:
    """Two injectors started: one hook, the faults' own, at the first start."""
    hooks = _hooks("from strata_plugin.testing.faults import NoFault\n"
                   "print('imported')\n"
                   "NoFault().start().stop(); print('first')\n"
                   "NoFault().start().stop(); print('second')\n")
    ours = [h for h in hooks if h.startswith("strata_plugin") or h in ("imported", "first",
                                                                       "second")]
    assert ours == ["imported", "strata_plugin.testing.faults", "first", "second"]


def test_register_puts_the_process_in_the_one_declared_place() -> None:
    from strata_plugin.process_globals import STATE
    from strata_plugin.run import reaper

    class Proc:
        def stop(self) -> None: ...

    p = Proc()
    reaper.register(p)
    try:
        assert STATE.live_processes[id(p)] is p and reaper.INTERRUPTED is STATE.interrupted
    finally:
        reaper.unregister(p)
    assert id(p) not in STATE.live_processes


def test_no_module_keeps_a_global_of_its_own() -> None:
    """No ``global`` statement and no ``atexit.register`` at import anywhere in the
    package but process_globals.py (agent/ runs as its own process on every node)."""
    offenders = []
    for path in package_files():
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "agent" or path.name == "process_globals.py":
            continue
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                offenders.append(f"{rel}:{node.lineno}: global {', '.join(node.names)}")
        for node in tree.body:  # module level: runs at import
            call = node.value if isinstance(node, ast.Expr) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "register"
                    and getattr(call.func.value, "id", "") == "atexit"):
                offenders.append(f"{rel}:{node.lineno}: atexit.register at import")
    assert offenders == []
