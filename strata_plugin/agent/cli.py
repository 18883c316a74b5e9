"""The agent process: parse options, probe collectors, sample on a fixed grid, obey stdin.

Runs as ``python -m strata_plugin agent ...`` (or ``python -m strata_plugin.agent``).
Two threads: the main one samples every ``--interval`` seconds on a fixed grid
(no drift; a tick that overruns skips grid points and counts them), and a
control thread that answers ``ping`` at once, so clock-offset round trips are
not delayed by a tick in progress. See docs/agent.md for the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, cast

from . import protocol
from .collectors import registry
from .collectors.base import Collector, Emit, Unavailable
from .protocol import AGENT_VERSION
from .targets import ProcessTargets

if TYPE_CHECKING:
    from .collectors.path import PathCollector

#: Every collector name, in the default order: the registry's (collectors/registry.py).
ALL_COLLECTORS = registry.names()
MIN_INTERVAL_S = 0.1
_INF = (float("inf"), float("-inf"))
MAX_FAILURES = 5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata_plugin agent", description=__doc__.splitlines()[0])
    p.add_argument("--node", default=socket.gethostname(), help="node label in every sample")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples (>= 0.1)")
    p.add_argument(
        "--collectors",
        default=",".join(ALL_COLLECTORS),
        help=f"comma list out of {','.join(ALL_COLLECTORS)}",
    )
    p.add_argument(
        "--collector-module",
        action="append",
        default=[],
        metavar="NAME=MODULE",
        help="a plugin's collector: NAME in --collectors is built by MODULE's from_args "
        "(repeatable; the harness passes those of the strata.collectors entry points)",
    )
    p.add_argument(
        "--collector-unavailable",
        action="append",
        default=[],
        metavar="NAME=REASON",
        help="NAME in --collectors is UNAVAILABLE here with REASON (a plugin's collector "
        "the harness could not ship to this node)",
    )
    p.add_argument("--pid", type=int, action="append", default=[], help="server PID (repeatable)")
    p.add_argument("--pid-pattern", help="regex matched against /proc/*/cmdline")
    p.add_argument("--container", help="docker container whose processes are the server")
    p.add_argument(
        "--path-pid",
        type=int,
        action="append",
        default=[],
        help="a proxy on the request's way to the server (repeatable): sampled by the path "
        "collector, apart from the server",
    )
    p.add_argument("--rescan", type=float, default=2.0, help="seconds between process-tree scans")
    p.add_argument("--top-threads", type=int, default=8, help="busiest threads emitted per tick")
    p.add_argument("--no-threads", action="store_true", help="skip per-thread reads")
    p.add_argument(
        "--cgroup",
        default="self",
        help="whose cgroup the cpu and mem collectors read: server (the first tracked "
        "process) | pid:<N> | self | a cgroup directory | none",
    )
    p.add_argument(
        "--runstate-interval",
        type=float,
        default=0.02,
        help="seconds between the runstate collector's samples of the server's threads "
        "(its own grid, finer than --interval; >= 0.005)",
    )
    p.add_argument(
        "--runstate-adapt-above",
        type=int,
        help="above this many server threads the runstate grid stretches to 2 ms a thread, "
        "up to 0.5 s (its cost is per thread; default: the collector's "
        "ADAPT_ABOVE_THREADS, 16); 0 keeps it fixed",
    )
    p.add_argument(
        "--runstate-hot",
        action="store_true",
        help="the runstate grid stretches with the threads that ran or were runnable at "
        "the last read of every thread (which is on the grid the whole count gives), "
        "not with all of them: the busy threads keep --runstate-interval",
    )
    p.add_argument("--ib-root", default="/sys/class/infiniband", help="RDMA sysfs root")
    p.add_argument("--prom-url", help="the engine's Prometheus /metrics URL")
    p.add_argument(
        "--prom-interval", type=float, help="seconds between scrapes (default: --interval)"
    )
    p.add_argument("--log-file", help="server log file to follow")
    p.add_argument(
        "--log-pattern",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="named-group regex applied to each new log line (repeatable)",
    )
    p.add_argument(
        "--no-default-log-patterns",
        action="store_true",
        help="do not add the llama.cpp timing-line patterns",
    )
    p.add_argument("--log-from-start", action="store_true", help="read the log from its start")
    p.add_argument("--dcgm-fields", default="1001,1002,1003,1004,1005,1009,1010,1011,1012")
    p.add_argument("--perf-events", default="cycles,instructions,cache-misses")
    p.add_argument("--no-gpm", action="store_true", help="skip NVML GPM metrics")
    p.add_argument(
        "--nvml-stub",
        metavar="FILE",
        help="a Python file whose stub() returns a pynvml stand-in (the harness's own tests "
        "on machines without a GPU); its samples are labelled source nvml-stub",
    )
    p.add_argument("--duration", type=float, help="exit after this many seconds")
    p.add_argument("--no-stdin", action="store_true", help="ignore stdin (run detached)")
    p.add_argument("--snapshot", metavar="DIR", help="write a static snapshot into DIR and exit")
    return p


def make_collectors(args: argparse.Namespace, targets: ProcessTargets) -> list[Collector]:
    """One collector per requested name, in the order given, each built by its registry
    entry (ValueError naming the known ones for a name the registry lacks)."""
    names = [n.strip() for n in args.collectors.split(",") if n.strip()]
    return [registry.make(name, args, targets) for name in names]


class LineWriter:
    """Whole lines to a file descriptor under one lock; a closed pipe flips ``broken``."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.broken = False

    def write(self, text: str) -> bool:
        if not text or self.broken:
            return not self.broken
        data = text.encode("utf-8", errors="replace")
        with self.lock:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:  # EPIPE: the harness (or ssh) is gone
                self.broken = True
        return not self.broken


class Agent:
    """The sampling loop and the control channel of one agent process."""

    def __init__(
        self,
        node: str,
        interval_s: float,
        collectors: list[Collector],
        targets: ProcessTargets,
        writer: LineWriter,
        snapshot_fn: Callable[[list[int], str], dict[str, str]] | None = None,
        nvml_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self.collectors = collectors
        self.targets = targets
        self.out = writer
        self.snapshot_fn = snapshot_fn
        self.nvml_fn = nvml_fn  # the NVML module the GPU release check uses (a stub in tests)
        self.active: list[Collector] = []
        self.status: dict[str, dict[str, str]] = {}
        self.failures: dict[str, int] = {}
        self.stop_event = threading.Event()
        self.stop_reason = ""
        self.ticks = 0
        self.overruns = 0
        self.tick_s = 0.0
        self._pending_pids: list[int] | None = None
        self._pending_path: list[int] | None = None
        self._pending_lock = threading.Lock()
        self._last_errors: dict[str, str] = {}
        self._names: dict[tuple[str, str], str] = {}

    # -- start ---------------------------------------------------------------
    def probe_all(self) -> None:
        for c in self.collectors:
            self._probe(c)

    def _probe(self, c: Collector) -> bool:
        try:
            c.probe()
        except Unavailable as e:
            self.status[c.source] = {"status": "UNAVAILABLE", "reason": str(e)}
            c.close()
            return False
        except Exception as e:  # a collector bug must not stop the others
            self.status[c.source] = {
                "status": "UNAVAILABLE",
                "reason": f"probe crashed: {type(e).__name__}: {e}",
            }
            c.close()
            return False
        self.status[c.source] = {"status": "ok"}
        self.active.append(c)
        return True

    def hello(self) -> dict[str, Any]:
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "version": AGENT_VERSION,
            "pid": os.getpid(),
            "node": self.node,
            "hostname": socket.gethostname(),
            "interval_s": self.interval_s,
            "wall_ns": time.time_ns(),
            "python": sys.version.split()[0],
            "argv": sys.argv,
            "targets": self.targets.describe(),
            "path_pids": [p for c in self.collectors if getattr(c, "follows_path", False)
                          for p in cast("PathCollector", c).targets.pids],  # only it follows
            "collectors": self.status,
        }

    # -- control -------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if not self.stop_event.is_set():
            self.stop_reason = reason
            self.stop_event.set()

    def control_loop(self, stdin: IO[bytes]) -> None:
        try:
            for raw in stdin:
                t_ns = time.time_ns()
                line = raw.decode("utf-8", errors="replace").strip()
                if not line:
                    continue
                cmd, _, arg = line.partition(" ")
                if cmd == "ping":
                    self.out.write(f"pong {arg.strip()} {t_ns}\n")
                elif cmd == "stop":
                    self.stop("stop")
                    return
                elif cmd == "pids":
                    try:
                        pids = [int(w) for w in arg.replace(",", " ").split()]
                    except ValueError:
                        self._error("control", f"bad pids line: {line!r}")
                        continue
                    with self._pending_lock:
                        self._pending_pids = pids
                elif cmd == "path":
                    try:
                        path = [int(w) for w in arg.replace(",", " ").split()]
                    except ValueError:
                        self._error("control", f"bad path line: {line!r}")
                        continue
                    with self._pending_lock:
                        self._pending_path = path
                elif cmd == "snapshot":
                    threading.Thread(
                        target=self._snapshot,
                        args=(arg.strip() or "snapshot",),
                        name="snapshot",
                        daemon=True,
                    ).start()
                elif cmd == "gpu_release":
                    label, _, timeout = arg.strip().partition(" ")
                    try:
                        timeout_s = float(timeout or "30")
                    except ValueError:
                        self._error("control", f"bad gpu_release line: {line!r}")
                        continue
                    threading.Thread(
                        target=self._gpu_release,
                        args=(label or "release", timeout_s),
                        name="gpu-release",
                        daemon=True,
                    ).start()
                else:
                    self._error("control", f"unknown control line: {line[:200]!r}")
        except (OSError, ValueError):
            pass
        self.stop("eof")

    def _snapshot(self, label: str) -> None:
        if self.snapshot_fn is None:
            return
        try:
            files = self.snapshot_fn(self._server_pids(), label)
        except Exception as e:
            files = {"errors.json": json.dumps({"snapshot": f"{type(e).__name__}: {e}"}) + "\n"}
        self.out.write(protocol.control_line("snapshot", label, files))

    def _gpu_release(self, label: str, timeout_s: float) -> None:
        """Wait until no process this agent followed as the server holds GPU memory (no
        process at all when it followed none), and answer ``gpu_release <label> {...}``."""
        from .gpu_release import result_json, wait_gpu_release

        pids = sorted(set(self.targets.ever) | set(self.targets.tree) | set(self.targets.pids))
        try:
            nv = self.nvml_fn() if self.nvml_fn is not None else None
            r = result_json(wait_gpu_release(pids, timeout_s=timeout_s, require_idle=not pids,
                                             nvml=nv))
        except Exception as e:
            r = {"ok": False, "skipped": False, "detail": f"{type(e).__name__}: {e}",
                 "waited_s": 0.0, "holders": []}
        r["pids"] = pids
        self.out.write(protocol.control_line("gpu_release", label, r))

    def _server_pids(self) -> list[int]:
        """The server tree as last resolved, else resolved now (without touching shared state)."""
        if self.targets.tree:
            return list(self.targets.tree)
        if self.targets.pids:
            return list(self.targets.pids)
        if self.targets.pattern:
            from .procfs import match_pids

            return match_pids(self.targets.pattern)
        return []

    def _apply_pending_pids(self) -> None:
        with self._pending_lock:
            pids, self._pending_pids = self._pending_pids, None
            path, self._pending_path = self._pending_path, None
        if path is not None:  # the proxies: the path collector only
            for c in self.collectors:
                if getattr(c, "follows_path", False):
                    c.set_pids(path)
        if pids is None:
            return
        self.targets.set_pids(pids)
        for c in self.collectors:
            if not c.follows_targets:
                continue
            if c in self.active:
                c.set_pids(pids)
            elif self._probe(c):  # was waiting for a target: start it now
                self.out.write(
                    protocol.control_line(
                        "info", {"kind": "collector_started", "collector": c.source}
                    )
                )

    def _error(self, where: str, message: str) -> None:
        if self._last_errors.get(where) != message:
            self._last_errors[where] = message
            self.out.write(protocol.control_line("error", {"where": where, "error": message}))

    # -- sampling ------------------------------------------------------------
    @staticmethod
    def drain_lines(c: Collector) -> list[str]:
        """The collector's queued reasons, info, commands and events as protocol lines."""
        parts = []
        unavailable, info, commands, events = c.drain()
        for key, reason in unavailable.items():
            payload = {"collector": c.source, "reason": reason}
            if key:
                payload["metric"] = key
            parts.append(protocol.control_line("unavailable", payload))
        for payload in info:
            parts.append(protocol.control_line("info", payload))
        for name, argv in commands:
            parts.append(protocol.control_line("command", {"name": name, "argv": argv}))
        for payload in events:
            parts.append(protocol.control_line("event", payload))
        return parts

    def tick(self) -> None:
        node = self.node
        parts: list[str] = []
        for c in list(self.active):
            src = c.source
            wall = time.time_ns()
            try:
                emits: list[Emit] = c.sample(wall)
            except Exception as e:
                n = self.failures[src] = self.failures.get(src, 0) + 1
                self._error(src, f"{type(e).__name__}: {e}")
                if n >= MAX_FAILURES:
                    c.failed = f"failed {n} times in a row: {type(e).__name__}: {e}"
                    c.mark_unavailable("", c.failed)
                emits = []
            else:
                self.failures[src] = 0
            prefix = f",{node},{src},"
            names = self._names
            # The hot loop of the agent (a 192-core host emits ~800 rows a tick): ints and
            # floats are formatted inline, and the quoted "device,metric" pair is cached.
            for w, dev, metric, value, kind in emits:
                t = type(value)
                if t is int:
                    text = str(value)
                elif t is float:
                    if value != value or value in _INF:
                        continue  # NaN and infinities are never emitted
                    text = repr(value)
                else:
                    formatted = protocol.format_value(value)
                    if formatted is None:
                        continue
                    text = formatted
                key = (dev, metric)
                name = names.get(key)
                if name is None:
                    name = f"{protocol.csv_field(dev)},{protocol.csv_field(metric)}"
                    if len(names) < 200_000:
                        names[key] = name
                parts.append(f"{w}{prefix}{name},{text},{kind}\n")
            parts.extend(self.drain_lines(c))
            if c.failed:
                self.active.remove(c)
                self.status[src] = {"status": "UNAVAILABLE", "reason": c.failed}
                c.close()
        wall = time.time_ns()
        cpu = os.times()
        parts.append(f"{wall},{node},agent,,cpu_s,{cpu.user + cpu.system!r},counter\n")
        parts.append(f"{wall},{node},agent,,tick_s,{self.tick_s!r},gauge\n")
        parts.append(f"{wall},{node},agent,,overruns,{self.overruns},counter\n")
        self.out.write("".join(parts))
        self.ticks += 1

    def run(self, duration_s: float | None = None) -> int:
        interval = self.interval_s
        start = time.monotonic()
        next_t = start
        while not self.stop_event.is_set() and not self.out.broken:
            self._apply_pending_pids()
            t0 = time.monotonic()
            self.tick()
            now = time.monotonic()
            self.tick_s = now - t0
            if duration_s is not None and now - start >= duration_s:
                self.stop("duration")
                break
            next_t += interval
            if next_t <= now:
                skipped = int((now - next_t) // interval) + 1
                self.overruns += skipped
                next_t += skipped * interval
            self.stop_event.wait(next_t - now)
        if not self.out.broken:
            self.tick()  # the final values, so a window ending now has a closing sample
        for c in self.active:
            try:
                c.close()
            except Exception:
                pass
        self.out.write(
            protocol.control_line(
                "bye",
                {
                    "reason": self.stop_reason or "broken_pipe",
                    "ticks": self.ticks,
                    "overruns": self.overruns,
                    "wall_ns": time.time_ns(),
                },
            )
        )
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not protocol.valid_label(args.node):
        print(
            f"agent: --node must not contain commas, quotes or spaces: {args.node!r}",
            file=sys.stderr,
        )
        return 2
    if args.interval < MIN_INTERVAL_S:
        print(f"agent: --interval must be >= {MIN_INTERVAL_S}", file=sys.stderr)
        return 2
    targets = ProcessTargets(
        pids=args.pid, pattern=args.pid_pattern, container=args.container, rescan_s=args.rescan
    )
    if args.snapshot:
        from .snapshot import static_snapshot

        if targets.configured:
            try:
                targets.probe()
            except ValueError:
                pass
        written = static_snapshot(args.snapshot, server_pids=targets.tree or targets.pids)
        print(
            protocol.control_line(
                "snapshot_written", {"dir": args.snapshot, "files": sorted(written)}
            ),
            end="",
        )
        return 0
    try:
        collectors = make_collectors(args, targets)
    except ValueError as e:
        print(f"agent: {e}", file=sys.stderr)
        return 2
    sys.setswitchinterval(0.001)  # let the control thread answer pings promptly
    writer = LineWriter(sys.stdout.fileno())

    def snapshot_fn(pids: list[int], label: str) -> dict[str, str]:
        from .snapshot import collect_snapshot

        # Installed packages do not change during a run: listed once, before (a second
        # listing costs a Python start-up per server on a loaded node).
        return collect_snapshot(pids, python_packages=label != "after")

    stub = [None]

    def nvml_fn() -> object:
        if args.nvml_stub and stub[0] is None:
            from .nvml_lib import load_stub

            stub[0] = load_stub(args.nvml_stub)
        return stub[0]

    agent = Agent(args.node, args.interval, collectors, targets, writer, snapshot_fn, nvml_fn)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop("sigterm"))
    agent.probe_all()
    writer.write(protocol.control_line("hello", agent.hello()))
    for c in agent.collectors:  # what unavailable collectors tried (active ones: first tick)
        if c not in agent.active:
            writer.write("".join(agent.drain_lines(c)))
    if not args.no_stdin:
        threading.Thread(
            target=agent.control_loop, args=(sys.stdin.buffer,), name="control", daemon=True
        ).start()
    return agent.run(duration_s=args.duration)
