"""Faults where the server does not run at all for part of the time (``server_stalled``).

Why: a server that is neither running nor able to run (stopped, frozen) spends its
requests' time where no resource is busy: no CPU, no disk, no queue. The rules were not
tuned on such faults (they belong to the fault suite's set-aside set); the run-state
sampler (agent/collectors/runstate.py) is what should see them.

* :class:`FreezerPause` - the server's process tree moved into a freezer cgroup of its
  own and frozen for ``pause_ms`` of every ``period_ms`` (v1 ``freezer.state`` FROZEN /
  THAWED, Linux admin-guide/cgroup-v1/freezer-subsystem.rst; v2 ``cgroup.freeze``,
  admin-guide/cgroup-v2.rst "Core Interface Files"), as a checkpointing or a
  container runtime's pause would;
* :class:`SigStopPause` - the same rhythm with SIGSTOP / SIGCONT (state T), as a
  debugger or a job-control stop would.

The helper process owns the fault: it moves the tree, freezes and thaws on its grid,
and on every exit (its ``max_s``, SIGTERM, the harness's death: its parent-death signal
is SIGTERM so that it thaws first) it thaws the server, moves it back and removes the
cgroup. The harness side does the same again after the helper has gone, in case the
helper itself was killed. Facts: the measured frozen (stopped) time and its share.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from strata_plugin.testing.faults import (
    FaultUnavailable,
    Injector,
    _await_line,
    _close_pipes,
    _guard,
    _helper_argv,
    _kill,
    _last_json,
    _rmdir_cgroup,
    _say,
    _spawn,
    sweep_cgroups,
)

_MODULE = "strata_plugin.testing.pauses"
_PR_SET_PDEATHSIG = 1
PREFIX = "strata-freeze-"


def _tree(pid: int) -> list[int]:
    from strata_plugin.agent.procfs import process_tree

    return process_tree(pid)


def freezer_root() -> tuple[Path, str]:
    """(the freezer's mount point, 'v1' or 'v2'); v1 where its hierarchy is mounted."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        _dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "freezer" in opts.split(","):
            return Path(mnt), "v1"
    for line in mounts:
        _dev, mnt, fstype, _ = line.split()[:4]
        if fstype == "cgroup2" and (Path(mnt) / "cgroup.controllers").exists():
            return Path(mnt), "v2"
    raise FaultUnavailable("no cgroup freezer: neither the v1 freezer hierarchy nor cgroup2 "
                           "is mounted")


def home_cgroup(pid: int, root: Path, version: str) -> Path:
    """The cgroup directory ``pid`` is in now, in the freezer's hierarchy."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (version == "v1" and "freezer" in ctrls.split(",")) or (
                version == "v2" and ctrls == ""):
            return root / path.lstrip("/")
    return root


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _move(pids: list[int], dest: Path) -> None:
    for p in pids:
        with contextlib.suppress(OSError):  # a process that just ended
            _write(dest / "cgroup.procs", str(p))


def _members(d: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    return []


def _set_frozen(d: Path, version: str, frozen: bool) -> None:
    if version == "v1":
        _write(d / "freezer.state", "FROZEN" if frozen else "THAWED")
    else:
        _write(d / "cgroup.freeze", "1" if frozen else "0")


def read_state(d: Path, version: str) -> str:
    """FROZEN, FREEZING or THAWED (v2's cgroup.events "frozen" and cgroup.freeze mapped)."""
    if version == "v1":
        return (d / "freezer.state").read_text().strip()
    events = dict(line.split() for line in (d / "cgroup.events").read_text().splitlines())
    if events.get("frozen") == "1":
        return "FROZEN"
    return "FREEZING" if (d / "cgroup.freeze").read_text().strip() == "1" else "THAWED"


def undo_freezer(d: Path, home: Path, version: str) -> None:
    """Thaw ``d``, move its processes to ``home`` and remove it (retried a few seconds)."""
    if not d.exists():
        return
    with contextlib.suppress(OSError):
        _set_frozen(d, version, False)
    _move(_members(d), home)
    _rmdir_cgroup(d, lambda: _move(_members(d), home))


class FreezerPause(Injector):
    """The server tree frozen for ``pause_ms`` of every ``period_ms`` (a cgroup freezer)."""

    name = "freezer_pause"
    expected_class = "server_stalled"

    def __init__(self, pid: int, pause_ms: float = 200.0, period_ms: float = 600.0,
                 max_s: float = 120.0) -> None:
        super().__init__()
        if not 0 < pause_ms < period_ms:
            raise ValueError("pause_ms must be in (0, period_ms)")
        self.pid, self.pause_ms, self.period_ms, self.max_s = pid, pause_ms, period_ms, max_s
        self.proc: Any = None
        self.dir: Path | None = None
        self.home: Path | None = None
        self.version = ""
        self.ready: dict[str, Any] = {}

    def _start(self) -> None:
        root, self.version = freezer_root()
        self.home = home_cgroup(self.pid, root, self.version)
        sweep_cgroups(self.home, PREFIX)
        self.dir = self.home / f"{PREFIX}{os.getpid()}"
        self.proc = _spawn(_helper_argv(
            "freeze", self.max_s, "--pid", str(self.pid), "--dir", str(self.dir),
            "--home", str(self.home), "--version", self.version,
            "--pause-ms", f"{self.pause_ms:g}", "--period-ms", f"{self.period_ms:g}",
            module=_MODULE))
        self.ready = _await_line(self.proc, "ready", 15.0)

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        if self.dir is not None and self.home is not None:
            undo_freezer(self.dir, self.home, self.version)  # the helper did it, normally
        return {"pause_ms": self.pause_ms, "period_ms": self.period_ms,
                "cgroup": str(self.dir), "version": self.version,
                "moved_pids": self.ready.get("pids", []), **done}


class SigStopPause(Injector):
    """The server tree stopped (SIGSTOP) for ``pause_ms`` of every ``period_ms``."""

    name = "sigstop_pause"
    expected_class = "server_stalled"

    def __init__(self, pid: int, pause_ms: float = 200.0, period_ms: float = 600.0,
                 max_s: float = 120.0) -> None:
        super().__init__()
        if not 0 < pause_ms < period_ms:
            raise ValueError("pause_ms must be in (0, period_ms)")
        self.pid, self.pause_ms, self.period_ms, self.max_s = pid, pause_ms, period_ms, max_s
        self.proc: Any = None
        self.ready: dict[str, Any] = {}

    def _start(self) -> None:
        self.proc = _spawn(_helper_argv(
            "sigstop", self.max_s, "--pid", str(self.pid), "--pause-ms", f"{self.pause_ms:g}",
            "--period-ms", f"{self.period_ms:g}", module=_MODULE))
        self.ready = _await_line(self.proc, "ready", 15.0)

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        for p in _tree(self.pid) or [self.pid]:  # never leave it stopped
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGCONT)
        return {"pause_ms": self.pause_ms, "period_ms": self.period_ms, **done}


# --- the helper process -------------------------------------------------------------------


def _thaw_on_parent_death() -> None:
    """The parent's death sends SIGTERM, not SIGKILL: the helper thaws before it goes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _rhythm(a: argparse.Namespace, deadline: float, pause: Any, resume: Any,
            confirm: Any, out: dict[str, Any]) -> None:
    """Pause / resume on the grid until the deadline (or SIGTERM); the measured figures
    go into ``out`` on every exit."""
    t_start = time.monotonic()
    paused_s = confirmed_s = 0.0
    cycles = 0
    pause_s, period_s = a.pause_ms / 1e3, a.period_ms / 1e3
    next_t = t_start
    t0: float | None = None
    t_conf: float | None = None
    try:
        while time.monotonic() < deadline and os.getppid() == a.parent:
            t0 = time.monotonic()
            pause()
            t_conf = confirm(t0 + pause_s)
            time.sleep(max(0.0, t0 + pause_s - time.monotonic()))
            resume()
            t1 = time.monotonic()
            paused_s += t1 - t0
            if t_conf is not None:
                confirmed_s += t1 - t_conf
            t0 = t_conf = None
            cycles += 1
            next_t += period_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        resume()
        t1 = time.monotonic()
        if t0 is not None:  # stopped mid-pause
            paused_s += t1 - t0
            if t_conf is not None:
                confirmed_s += t1 - t_conf
        wall = t1 - t_start
        out.update({"cycles": cycles, "paused_s": round(paused_s, 3),
                    "confirmed_paused_s": round(confirmed_s, 3),
                    "helper_wall_s": round(wall, 3),
                    "paused_share": round(paused_s / wall, 4) if wall > 0 else 0.0,
                    "confirmed_share": round(confirmed_s / wall, 4) if wall > 0 else 0.0})


def _main_freeze(a: argparse.Namespace, deadline: float) -> None:
    d, home = Path(a.dir), Path(a.home)
    pids = _tree(a.pid)
    if not pids:
        raise FaultUnavailable(f"no process {a.pid}")
    try:
        d.mkdir()
        if a.version == "v1":
            _set_frozen(d, a.version, False)
    except OSError as exc:
        raise FaultUnavailable(f"cannot create a freezer cgroup {d}: {exc}") from None
    figures: dict[str, Any] = {}
    try:
        _move(pids, d)
        inside = sorted(_members(d))
        if sorted(set(pids) & set(inside)) != sorted(pids):
            raise FaultUnavailable(f"could not move {pids} into {d} (it holds {inside})")
        _say("ready", {"pids": pids, "dir": str(d)})

        def confirm(until: float) -> float | None:
            while time.monotonic() < until:  # FREEZING until every task is frozen
                if read_state(d, a.version) == "FROZEN":
                    return time.monotonic()
                time.sleep(0.001)
            return None

        _rhythm(a, deadline, lambda: _set_frozen(d, a.version, True),
                lambda: _set_frozen(d, a.version, False), confirm, figures)
    finally:
        undo_freezer(d, home, a.version)
        _say("done", {**figures, "removed": not d.exists()})


def _main_sigstop(a: argparse.Namespace, deadline: float) -> None:
    pids = _tree(a.pid)
    if not pids:
        raise FaultUnavailable(f"no process {a.pid}")

    def signal_all(sig: int) -> None:
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, sig)

    def confirm(until: float) -> float | None:
        from strata_plugin.agent.procfs import parse_stat, read_bytes

        while time.monotonic() < until:
            data = read_bytes(f"/proc/{a.pid}/stat")
            if data and parse_stat(data).state in ("T", "t"):
                return time.monotonic()
            time.sleep(0.001)
        return None

    _say("ready", {"pids": pids})
    figures: dict[str, Any] = {}
    try:
        _rhythm(a, deadline, lambda: signal_all(signal.SIGSTOP),
                lambda: signal_all(signal.SIGCONT), confirm, figures)
    finally:
        signal_all(signal.SIGCONT)
        _say("done", figures)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    p.add_argument("mode", choices=("freeze", "sigstop"))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--dir", default="")
    p.add_argument("--home", default="")
    p.add_argument("--version", default="v1")
    p.add_argument("--pause-ms", type=float, default=200.0)
    p.add_argument("--period-ms", type=float, default=600.0)
    a = p.parse_args(argv)
    deadline = _guard(a.parent, a.max_s)
    _thaw_on_parent_death()
    try:
        {"freeze": _main_freeze, "sigstop": _main_sigstop}[a.mode](a, deadline)
    except FaultUnavailable as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
