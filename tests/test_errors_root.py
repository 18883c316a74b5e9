"""Every exception class Strata defines has ``StrataError`` as a base (issue 26, item 5).

A user's ``except StrataError`` must catch whatever Strata raises on purpose, and code that
caught the builtin (``except ValueError`` around ``load_profile``) must see no change, so
each class keeps its builtin base beside the root.

Exempt, with the reason: the sampling agent (``strata_plugin/agent/``) ships to other
nodes as a zip of its own folder and runs there on the standard library alone
(``run/remote.agent_zip``, docs/agent.md), so it cannot import ``strata_plugin.errors``;
``load/sandbox_child.py`` is never imported by the harness (``load/sandbox.py`` runs its
source with ``python -I -S -c``), so its errors never reach a user's code.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import strata_plugin
from strata_plugin.errors import StrataError

EXEMPT_PREFIXES = ("strata_plugin.agent", "strata_plugin.load.sandbox_child")


def _strata_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(strata_plugin.__path__, "strata_plugin.")]


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found = {}
    for name in _strata_modules():
        if name.startswith(EXEMPT_PREFIXES) or name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == name):
                found[f"{name}.{attr}"] = obj
    return found


def test_every_exception_strata_defines_derives_from_strata_error():
    found = _defined_exceptions()
    # the walk sees the classes (a walk that found none would pass vacuously)
    assert {"strata_plugin.configure.profile.ProfileError",
            "strata_plugin.run.deployment.ServerDown",
            "strata_plugin.run.preflight.PreflightError", "strata_plugin.load.trace.TraceError",
            "strata_plugin.load.sandbox.SandboxUnavailable",
            "strata_plugin.testing.faults.FaultUnavailable",
            "strata_plugin.load.client.errors.StreamError",
            "strata_plugin.run.server.ServerStartError"} <= set(found)
    assert len(found) >= 25
    outside = sorted(k for k, cls in found.items() if not issubclass(cls, StrataError))
    assert outside == []


def test_each_keeps_its_builtin_base():
    from strata_plugin.configure.profile import ProfileError
    from strata_plugin.run.deployment import ServerDown
    from strata_plugin.run.session import RunFolderError

    assert issubclass(ProfileError, ValueError) and issubclass(ServerDown, RuntimeError)
    assert issubclass(RunFolderError, OSError)
    for cls in _defined_exceptions().values():
        builtin = [b for b in cls.__mro__ if b.__module__ == "builtins"]
        # something more specific than Exception stays where it was, e.g. ValueError
        assert builtin[0] in (Exception, ValueError, RuntimeError, OSError), cls


def test_the_root_is_public_and_catches_a_profile_error(tmp_path):
    from strata_plugin import StrataError as public
    from strata_plugin.configure.profile import load_profile

    assert public is StrataError and "StrataError" in strata_plugin.__all__
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nengine = 'nope'\n")
    try:
        load_profile(bad)
    except StrataError as e:
        assert "name" in str(e) and isinstance(e, ValueError)
    else:
        raise AssertionError("a bad profile loaded")


def test_the_agent_is_exempt_because_it_imports_nothing_of_the_package():
    """The reason for the exemption holds: no agent module imports strata_plugin."""
    import ast
    from pathlib import Path

    agent = Path(strata_plugin.__file__).parent / "agent"
    for path in agent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("strata_plugin"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("strata_plugin") for a in node.names), path
