"""The session keeps blocks, the case runner factory and finish(); the servers and
workers are its Deployment (run/deployment.py). run/session.py was ~635 lines with 27
methods; it stays under 300 (issue 34)."""

from __future__ import annotations

from pathlib import Path

SESSION = Path(__file__).resolve().parents[1] / "strata_plugin" / "run" / "session.py"
LIMIT = 300


def test_the_session_module_stays_under_its_limit() -> None:
    n = len(SESSION.read_text().splitlines())
    assert n < LIMIT, f"run/session.py has {n} lines (limit {LIMIT})"


def test_the_deployment_is_not_the_sessions_to_do() -> None:
    from strata_plugin.run.deployment import Deployment
    from strata_plugin.run.session import StrataSession

    moved = ("start_server", "stop_server", "ensure_alive", "dead_workers", "preflight",
             "launch_spec", "placeholder_values", "start_workers", "stop_workers")
    assert [m for m in moved if hasattr(StrataSession, m)] == []
    assert all(callable(getattr(Deployment, m)) for m in moved)
    for kept in ("begin_block", "end_block", "case_runner", "finish", "add_reason"):
        assert callable(getattr(StrataSession, kept)), kept
