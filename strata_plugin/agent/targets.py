"""Which processes are "the server": explicit PIDs, a command-line pattern, or a container.

Shared by the process, perf and NUMA collectors and the static snapshot. The
tree (roots plus descendants) is re-resolved every ``rescan_s`` seconds, not
every tick: a /proc scan costs a few milliseconds on a busy host, and a server
that forks workers does so at start, not per request.

An explicit PID is followed only while it names the process first seen under it (its
start time, ``agent/lifetime.py``): an engine that died and whose number the kernel
gave to a newer process is not followed as the server any more; it is in ``ended``
with how it went until the harness names the engine that took over (``set_pids``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Callable, List, Tuple

from . import lifetime, procfs

Runner = Callable[[List[str], float], Tuple[int, str, str]]


def run_tool(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run a tool to completion: (returncode, stdout, stderr); never raises for tool failures."""
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout_s}s"
    return p.returncode, p.stdout, p.stderr


class ProcessTargets:
    """Resolves the server's process tree, cheaply and repeatedly."""

    def __init__(
        self,
        pids: list[int] | tuple[int, ...] = (),
        pattern: str | None = None,
        container: str | None = None,
        rescan_s: float = 2.0,
        runner: Runner = run_tool,
        docker_rescan_s: float = 30.0,
    ) -> None:
        self.pids = tuple(pids)
        #: each explicit PID's process as first seen (PID + start time)
        self.lives: dict[int, lifetime.Life] = {}
        #: explicit PIDs whose process ended, and how (``lifetime.GONE`` / ``REUSED``)
        self.ended: dict[int, str] = {}
        self.pattern = pattern
        self.container = container
        self.rescan_s = rescan_s
        self.runner = runner
        self.roots: tuple[int, ...] = ()
        self.tree: tuple[int, ...] = ()
        #: Every PID followed as the server at any time (the GPU release check watches them).
        self.ever: set = set()
        self.generation = 0  # bumped whenever the tree changes
        self.last_error: str | None = None
        self.commands: list[tuple[str, list[str]]] = []
        self._next_scan = 0.0
        self.docker_rescan_s = docker_rescan_s
        self._docker_roots: list[int] | None = None
        self._next_docker = 0.0

    @property
    def configured(self) -> bool:
        return bool(self.pids or self.pattern or self.container)

    def describe(self) -> str:
        if self.pids:
            return "pids " + ",".join(map(str, self.pids))
        if self.pattern:
            return f"pattern {self.pattern!r}"
        if self.container:
            return f"container {self.container!r}"
        return "none"

    def docker_argv(self) -> list[str]:
        return ["docker", "top", str(self.container), "-eo", "pid"]

    def probe(self) -> None:
        """Raise ValueError with a reason when the configured target cannot be found at all."""
        if not self.configured:
            raise ValueError("no server process given (--pid, --pid-pattern or --container)")
        if self.container:
            if shutil.which("docker") is None:
                raise ValueError("docker not found on PATH (needed for --container)")
            rc, _out, err = self.runner(self.docker_argv(), 10.0)
            self.commands.append(("docker_top", self.docker_argv()))
            if rc != 0:
                raise ValueError(f"`docker top {self.container}` failed: {err.strip()[:300]}")
        if self.pids:
            gone = [p for p in self.pids if procfs.read_bytes(f"{procfs.PROC}/{p}/stat") is None]
            if len(gone) == len(self.pids):
                raise ValueError(f"no such process: {','.join(map(str, gone))}")
        self.refresh(force=True)

    def set_pids(self, pids: list[int]) -> None:
        self.pids = tuple(pids)
        self.lives, self.ended = {}, {}
        self.pattern = None
        self.container = None
        self.refresh(force=True)

    def _resolve_roots(self) -> list[int]:
        if self.pids:
            return self._live_pids()
        if self.pattern:
            return procfs.match_pids(self.pattern)
        if self.container:
            # The docker client costs tens of ms of CPU per call: ask it every
            # docker_rescan_s; descendants of known PIDs are still found every rescan.
            now = time.monotonic()
            if self._docker_roots is not None and now < self._next_docker:
                return list(self._docker_roots)
            self._next_docker = now + self.docker_rescan_s
            rc, out, err = self.runner(self.docker_argv(), 10.0)
            if rc != 0:
                self.last_error = f"docker top failed: {err.strip()[:300]}"
                return list(self.roots)
            self._docker_roots = [int(w) for w in out.split() if w.isdigit()]
            return list(self._docker_roots)
        return []

    def _live_pids(self) -> list[int]:
        """The explicit PIDs whose first-seen process still runs."""
        out = []
        for pid in self.pids:
            if pid in self.ended:
                continue
            life = self.lives.get(pid)
            if life is None:
                life = lifetime.Life.observe(pid)
                if life is None:  # not running (yet): looked for again next time
                    continue
                self.lives[pid] = life
            how = life.ended()
            if how is None:
                out.append(pid)
            else:
                self.ended[pid] = how
        return out

    def refresh(self, now: float | None = None, force: bool = False) -> bool:
        """Re-resolve the tree if ``rescan_s`` has passed (or ``force``); True when it changed."""
        now = time.monotonic() if now is None else now
        if not force and now < self._next_scan:
            return False
        self._next_scan = now + self.rescan_s
        if not self.configured:
            return False
        roots = self._resolve_roots()
        ppids = procfs.ppid_map()
        tree: list[int] = []
        seen: set[int] = set()
        for r in roots:
            for pid in procfs.process_tree(r, ppids):
                if pid not in seen:
                    seen.add(pid)
                    tree.append(pid)
        live_roots = tuple(r for r in roots if r in ppids)
        new_tree = tuple(tree)
        self.ever.update(new_tree)
        if new_tree != self.tree or live_roots != self.roots:
            self.roots, self.tree = live_roots, new_tree
            self.generation += 1
            return True
        return False
