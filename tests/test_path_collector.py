"""The agent's path collector (agent/collectors/path.py), for real: the proxies sampled
under source ``path`` apart from the server, the server's own tree kept out of them, a
``path`` control line that stops and starts it, and silence while it follows no one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from strata_plugin.agent.handle import AgentHandle, agent_argv
from tests.test_agent_process import rows, wait_for

#: A proxy that spins on the CPU and started its engine as a child (as llama-swap does);
#: prints the child's PID.
SPINNER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
end = time.monotonic() + 120
while time.monotonic() < end:
    pass
"""


@pytest.fixture
def proxy():
    p = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    child = int(p.stdout.readline())
    yield p, child
    p.kill()
    p.wait()
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)


def _devices(path, metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows(path) if path.exists() else []:
        if r["metric"] == metric:
            out.setdefault(r["device"], []).append(float(r["value"]))
    return out


def test_the_proxies_are_sampled_apart_from_the_server(tmp_path, proxy):
    spinner, engine = proxy
    h = AgentHandle.start("n1", tmp_path, agent_argv(
        "n1", 0.1, pids=[engine], path_pids=[spinner.pid], collectors=["proc", "path"]))
    try:
        assert h.hello["collectors"]["path"] == {"status": "ok"}
        assert h.hello["path_pids"] == [spinner.pid]
        path_csv, proc_csv = tmp_path / "samples" / "path.csv", tmp_path / "samples" / "proc.csv"
        assert wait_for(lambda: len(_devices(path_csv, "cpu_user_s").get("", [])) >= 6)
        path_cpu = _devices(path_csv, "cpu_user_s")
        # the spinner's tree less the engine (its child, the server's): only the spinner
        assert set(path_cpu) == {"", f"pid{spinner.pid}"}
        # the sum is the spinner's alone, and it grows (it spins)
        assert path_cpu[""] == path_cpu[f"pid{spinner.pid}"]
        assert path_cpu[""][-1] > path_cpu[""][0]
        assert _devices(path_csv, "run_delay_s")[""]  # its wait for a CPU, as proc's
        server = _devices(proc_csv, "cpu_user_s")
        assert set(server) == {"", f"pid{engine}"} and server[""][-1] < 0.1
        # ``path`` alone: it follows no one; its sum holds still from then on
        h.track_path([])
        # the request is fire-and-forget: wait until the agent has applied it, two sum
        # rows with no per-PID row beside them (the two counts were equal while it
        # followed the spinner), not a fixed time a late agent can outlast
        def applied() -> bool:
            d = _devices(path_csv, "cpu_user_s")
            return len(d[""]) >= len(d[f"pid{spinner.pid}"]) + 2

        assert wait_for(applied, 5.0), "the agent did not stop following the spinner"
        rows = _devices(path_csv, "cpu_user_s")
        n, kept = len(rows[""]), len(rows[f"pid{spinner.pid}"])
        time.sleep(0.5)
        after = _devices(path_csv, "cpu_user_s")
        assert len(after[f"pid{spinner.pid}"]) == kept  # no per-PID row since
        assert len(after[""]) > n and len(set(after[""][n - 1:])) == 1  # the sum stands still
        # and back: the spinner followed again
        h.track_path([spinner.pid])
        m = len(after[f"pid{spinner.pid}"])
        assert wait_for(lambda: len(_devices(path_csv, "cpu_user_s")[f"pid{spinner.pid}"])
                        > m + 2)
    finally:
        h.stop(2.0)


def test_without_a_proxy_the_path_collector_is_silent(tmp_path, proxy):
    _, engine = proxy
    h = AgentHandle.start("n1", tmp_path, agent_argv("n1", 0.1, pids=[engine],
                                                     collectors=["proc", "path"]))
    try:
        assert h.hello["collectors"]["path"] == {"status": "ok"}
        assert wait_for(lambda: h.samples_written.get("proc", 0) > 20)
        assert h.samples_written.get("path", 0) == 0 and "path" not in h.unavailable
    finally:
        h.stop(2.0)


def _row(source: str, device: str, metric: str, rate: float):
    from strata_plugin.analysis.timeline import HwStat

    return HwStat(window="w", node="n", source=source, device=device, metric=metric,
                  kind="counter", n=10, coverage=1.0, delta=rate * 10, rate=rate)


def test_the_window_signals_read_the_proxies_once_and_apart():
    """The analysis's shape of the path: ``path_cpu_cores`` from the tree sum (the per-PID
    rows not counted again) and ``path_runq_delay_per_cpu_s`` (run-queue wait per
    CPU-second, as the server's); None where no proxy was sampled."""
    from strata_plugin.analysis.signals import HwView, _host_signals

    rows = [_row("cpu", "", "busy_s", 2.0), _row("proc", "", "cpu_user_s", 1.0),
            _row("path", "", "cpu_user_s", 0.3), _row("path", "", "cpu_system_s", 0.1),
            _row("path", "pid7", "cpu_user_s", 0.3), _row("path", "pid7", "cpu_system_s", 0.1),
            _row("path", "", "runqueue_delay_ns", 0.2e9)]
    got = _host_signals(HwView(rows), "n")
    assert got["server_cpu_cores"] == 1.0
    assert got["path_cpu_cores"] == pytest.approx(0.4)
    assert got["path_runq_delay_per_cpu_s"] == pytest.approx(0.5)
    none = _host_signals(HwView(rows[:2]), "n")
    assert none["path_cpu_cores"] is None and none["path_runq_delay_per_cpu_s"] is None
