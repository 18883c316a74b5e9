"""The harness side of one agent: start it, file its samples, measure its clock, stop it.

:class:`AgentHandle` launches the agent command (local, or prefixed by ssh),
reads its stdout in a thread and files every line under ``out_dir``:

* ``samples/<source>.csv`` — sample rows verbatim (columns of docs/formats.md);
* ``unavailable.json`` — ``{collector: reason}`` plus ``{collector/metric: reason}``;
* ``collector_commands/*.json`` — the agent's argv and every tool it ran;
* ``agent_log.jsonl`` — hello, info, error, unavailable and bye lines as received;
* ``events.jsonl`` — markers from the log collector and scrape errors;
* ``clock_offsets.jsonl`` — every clock-offset measurement;
* ``static/<label>/`` — snapshots requested with :meth:`AgentHandle.snapshot`;
* ``agent.stderr.log`` — the agent's stderr.

The reader does no parsing beyond finding the source of a row, so it costs the
harness process (and its load generator's timestamps) little. An agent that
dies is noticed when its stdout closes: files are flushed, the process group is
cleaned up, and :attr:`AgentHandle.exit_info` / :meth:`AgentHandle.check` say why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from . import protocol

_PKG_ROOT = Path(__file__).resolve().parents[2]  # the folder holding strata_plugin/
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class ClockOffset:
    """The agent's wall clock minus the harness's, from the ping with the smallest round trip.

    ``harness_wall_ns = agent_wall_ns - offset_ns``; the true offset lies within
    ``offset_ns ± uncertainty_ns`` (half that round trip).
    """

    offset_ns: int
    rtt_ns: int
    uncertainty_ns: int
    samples: int = 0
    measured_wall_ns: int = 0  # harness wall clock at the middle of the best round trip


@dataclass(frozen=True)
class AgentExit:
    """How an agent ended. ``expected`` is False for a crash, a kill or a lost connection."""

    returncode: int | None
    signal: str | None
    expected: bool
    reason: str
    bye: dict[str, Any] | None
    stderr_tail: str
    samples: int


class AgentDied(RuntimeError):
    """The agent ended without being asked to."""

    def __init__(self, node: str, info: AgentExit) -> None:
        super().__init__(f"agent on {node} died: {info.reason}")
        self.node = node
        self.exit = info


class AgentStartError(RuntimeError):
    """The agent did not come up (no hello line in time)."""


def agent_argv(
    node: str,
    interval_s: float = 0.5,
    pids: Iterable[int] = (),
    pid_pattern: str | None = None,
    prom_url: str | None = None,
    log_file: str | os.PathLike[str] | None = None,
    log_patterns: Mapping[str, str] | None = None,
    collectors: Iterable[str] | None = None,
    *,
    container: str | None = None,
    path_pids: Iterable[int] = (),
    ib_root: str | os.PathLike[str] | None = None,
    cgroup: str | None = None,
    prom_interval_s: float | None = None,
    top_threads: int | None = None,
    dcgm_fields: Iterable[int] | None = None,
    perf_events: Iterable[str] | None = None,
    default_log_patterns: bool = True,
    extra: Iterable[str] = (),
    python: str = sys.executable,
    module: str = "strata_plugin.agent",
    collector_modules: Mapping[str, str] | None = None,
) -> list[str]:
    """The local agent command line. ``module="strata_plugin"`` gives ``-m strata_plugin agent``.
    ``collector_modules``: plugin collectors' names -> their modules (``--collector-module``)."""
    if not protocol.valid_label(node):
        raise ValueError(f"node label must not contain commas, quotes or spaces: {node!r}")
    argv = [python, "-m", module]
    if module == "strata_plugin":
        argv.append("agent")
    argv += ["--node", node, "--interval", repr(float(interval_s))]
    if collectors is not None:
        argv += ["--collectors", ",".join(collectors)]
    for name, mod in (collector_modules or {}).items():
        argv += ["--collector-module", f"{name}={mod}"]
    for pid in pids:
        argv += ["--pid", str(int(pid))]
    if pid_pattern:
        argv += ["--pid-pattern", pid_pattern]
    if container:
        argv += ["--container", container]
    for pid in path_pids:
        argv += ["--path-pid", str(int(pid))]
    if prom_url:
        argv += ["--prom-url", prom_url]
    if prom_interval_s is not None:
        argv += ["--prom-interval", repr(float(prom_interval_s))]
    if log_file:
        argv += ["--log-file", os.fspath(log_file)]
    for name, rx in (log_patterns or {}).items():
        argv += ["--log-pattern", f"{name}={rx}"]
    if not default_log_patterns:
        argv.append("--no-default-log-patterns")
    if ib_root:
        argv += ["--ib-root", os.fspath(ib_root)]
    if cgroup:
        argv += ["--cgroup", cgroup]
    if top_threads is not None:
        argv += ["--top-threads", str(int(top_threads))]
    if dcgm_fields is not None:
        argv += ["--dcgm-fields", ",".join(map(str, dcgm_fields))]
    if perf_events is not None:
        argv += ["--perf-events", ",".join(perf_events)]
    argv += list(extra)
    return argv


def _free_name(folder: Path, stem: str) -> Path:
    """``stem.json``, else the first free ``stem.<n>.json`` (a restarted tool keeps both)."""
    path = folder / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stem}.{n}.json"
    return path


def _signal_name(returncode: int | None) -> str | None:
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return None


class AgentHandle:
    """One running agent and the files it feeds. Create with :meth:`start`."""

    def __init__(
        self,
        node: str,
        out_dir: Path,
        argv: list[str],
        proc: subprocess.Popen[bytes],
        on_exit: Callable[[AgentExit], None] | None = None,
    ) -> None:
        self.node = node
        self.out_dir = out_dir
        self.argv = argv
        self.proc = proc
        self.on_exit = on_exit
        self.hello: dict[str, Any] | None = None
        self.bye: dict[str, Any] | None = None
        self.unavailable: dict[str, str] = {}
        self.errors: list[dict[str, Any]] = []
        self.offsets: list[ClockOffset] = []
        self.samples_written: dict[str, int] = {}
        self.last_line_mono = time.monotonic()
        self._exit: AgentExit | None = None
        self._stopping = False
        self._lock = threading.Lock()  # files and state shared by reader and caller
        self._cond = threading.Condition()
        self._pongs: dict[str, tuple[int, int]] = {}
        self._snapshots: dict[str, Path] = {}
        self._releases: dict[str, dict] = {}
        self._release_seq = 0
        self._ping_seq = 0
        self._sinks: dict[bytes, IO[bytes]] = {}
        self._hello_event = threading.Event()
        self._done = threading.Event()
        # Agents may follow one another in one folder (one per server configuration):
        # files append, and the newest agent's word on each collector wins.
        try:
            self.unavailable.update(json.loads((out_dir / "unavailable.json").read_text()))
        except (OSError, ValueError):
            pass
        self._log = open(out_dir / "agent_log.jsonl", "a")
        self._events = open(out_dir / "events.jsonl", "a")
        self._reader = threading.Thread(target=self._read_loop, name=f"agent-{node}", daemon=True)

    # -- lifecycle -------------------------------------------------------------
    @classmethod
    def start(
        cls,
        node: str,
        out_dir: Path | str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        hello_timeout_s: float = 30.0,
        on_exit: Callable[[AgentExit], None] | None = None,
    ) -> AgentHandle:
        """Launch ``argv`` in its own process group and wait for its hello line.

        Raises AgentStartError (with the agent's stderr) when no hello arrives.
        """
        out = Path(out_dir)
        (out / "samples").mkdir(parents=True, exist_ok=True)
        (out / "collector_commands").mkdir(exist_ok=True)
        _free_name(out / "collector_commands", "agent").write_text(json.dumps(list(argv)) + "\n")
        run_env = dict(os.environ if env is None else env)
        run_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PKG_ROOT), run_env.get("PYTHONPATH", "")) if p
        )
        stderr = open(out / "agent.stderr.log", "ab")
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=run_env,
                cwd=cwd,
                start_new_session=True,
                bufsize=0,
            )
        except OSError as e:
            raise AgentStartError(f"cannot start agent for {node}: {e}") from None
        finally:
            stderr.close()
        handle = cls(node, out, list(argv), proc, on_exit)
        handle._reader.start()
        deadline = time.monotonic() + hello_timeout_s
        try:
            while not handle._hello_event.wait(0.05):
                if handle._done.is_set() or time.monotonic() > deadline:
                    handle.stop(2.0)
                    info = handle._exit
                    why = info.reason if info else "no hello"
                    raise AgentStartError(
                        f"agent for {node} did not start ({why}); stderr: {handle._stderr_tail()}"
                    )
        except KeyboardInterrupt:  # Ctrl-C while waiting: nobody else holds this agent
            handle.stop(2.0)
            raise
        return handle

    @property
    def alive(self) -> bool:
        return not self._done.is_set() and self.proc.poll() is None

    @property
    def exit_info(self) -> AgentExit | None:
        """None while the agent runs; how it ended afterwards."""
        return self._exit

    @property
    def died(self) -> bool:
        return self._exit is not None and not self._exit.expected

    def check(self) -> None:
        """Raise AgentDied if the agent ended without being asked to."""
        if self._done.is_set() and self._exit is not None and not self._exit.expected:
            raise AgentDied(self.node, self._exit)

    def stop(self, timeout_s: float = 5.0) -> AgentExit:
        """Ask the agent to stop; SIGTERM then SIGKILL its process group if it lingers.

        Always returns with every file flushed and closed.
        """
        if not self._done.is_set():
            # An agent that is already dead when we ask is not "stopped by us".
            self._stopping = self.proc.poll() is None
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._killpg(signal.SIGTERM)
                try:
                    self.proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    self._killpg(signal.SIGKILL)
                    self.proc.wait(5.0)
            if not self._done.wait(5.0):  # a grandchild still holds the pipe
                self._killpg(signal.SIGKILL)
                self._done.wait(2.0)
        if self._exit is None:
            self._finish()
        assert self._exit is not None
        return self._exit

    def __enter__(self) -> AgentHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _killpg(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- control ---------------------------------------------------------------
    def send(self, line: str) -> None:
        """Write one control line; raises AgentDied when the agent is gone."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.rstrip("\n").encode() + b"\n")
        except (OSError, ValueError):
            self._raise_dead()

    def _raise_dead(self) -> None:
        self._done.wait(2.0)
        info = self._exit or AgentExit(
            self.proc.poll(),
            _signal_name(self.proc.poll()),
            False,
            "agent stdin closed",
            None,
            self._stderr_tail(),
            0,
        )
        raise AgentDied(self.node, info)

    def track_pids(self, pids: Iterable[int]) -> None:
        """Point the process collectors at new server PIDs (e.g. once the server started)."""
        self.send("pids " + " ".join(str(int(p)) for p in pids))

    def track_path(self, pids: Iterable[int]) -> None:
        """Point the path collector at the proxies on the request's way (none: stop)."""
        self.send("path " + " ".join(str(int(p)) for p in pids))

    def measure_clock_offset(self, n: int = 8, timeout_s: float = 5.0) -> ClockOffset:
        """NTP-style offset from ``n`` ping/pong round trips; the smallest round trip wins."""
        best: tuple[int, int, int] | None = None  # rtt, offset, midpoint
        for _ in range(n):
            if not self.alive:
                self._raise_dead()
            self._ping_seq += 1
            pid = f"p{self._ping_seq}"
            t0 = time.time_ns()
            self.send(f"ping {pid}")
            deadline = time.monotonic() + timeout_s
            with self._cond:
                while pid not in self._pongs:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._done.is_set():
                        break
                    self._cond.wait(min(left, 0.1))
                got = self._pongs.pop(pid, None)
            if got is None:
                if self._done.is_set():
                    self._raise_dead()
                raise TimeoutError(f"agent on {self.node} did not answer ping in {timeout_s}s")
            remote, t3 = got
            rtt = t3 - t0
            mid = (t0 + t3) // 2
            if best is None or rtt < best[0]:
                best = (rtt, remote - mid, mid)
        assert best is not None
        result = ClockOffset(
            offset_ns=best[1],
            rtt_ns=best[0],
            uncertainty_ns=best[0] // 2,
            samples=n,
            measured_wall_ns=best[2],
        )
        self.offsets.append(result)
        with self._lock, open(self.out_dir / "clock_offsets.jsonl", "a") as fh:
            fh.write(json.dumps({"node": self.node, **asdict(result)}) + "\n")
        return result

    def snapshot(self, label: str, timeout_s: float = 120.0) -> Path:
        """Have the agent take a static snapshot; files land in ``out_dir/static/<label>/``."""
        if not _SAFE.match(label):
            raise ValueError(f"snapshot label must match {_SAFE.pattern}: {label!r}")
        self.send(f"snapshot {label}")
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while label not in self._snapshots:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no snapshot from {self.node} in {timeout_s}s")
                if self._done.is_set():
                    self._raise_dead()
                self._cond.wait(min(left, 0.1))
            return self._snapshots.pop(label)

    def ask_gpu_release(self, timeout_s: float = 30.0) -> str:
        """Ask the agent to wait until the server it followed holds no GPU memory on this
        node; returns the label :meth:`wait_gpu_release` waits for."""
        with self._cond:
            self._release_seq += 1
            label = f"r{self._release_seq}"
        self.send(f"gpu_release {label} {float(timeout_s)!r}")
        return label

    def wait_gpu_release(self, label: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while label not in self._releases:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no GPU release answer from {self.node} in {timeout_s}s")
                if self._done.is_set():
                    self._raise_dead()
                self._cond.wait(min(left, 0.1))
            return self._releases.pop(label)

    # -- reading ---------------------------------------------------------------
    def _read_loop(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = b""
        try:
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                t_recv = time.time_ns()
                if not chunk:
                    break
                self.last_line_mono = time.monotonic()
                buf += chunk
                if b"\n" not in chunk:
                    continue
                lines = buf.split(b"\n")
                buf = lines.pop()
                self._handle_lines(lines, t_recv)
        except Exception as e:  # never let the reader die silently
            self.errors.append({"where": "reader", "error": f"{type(e).__name__}: {e}"})
        finally:
            self._finish()

    def _handle_lines(self, lines: list[bytes], t_recv: int) -> None:
        batches: dict[bytes, list[bytes]] = {}
        for line in lines:
            if not line:
                continue
            if 48 <= line[0] <= 57:
                i1 = line.find(b",")
                i2 = line.find(b",", i1 + 1)
                i3 = line.find(b",", i2 + 1)
                if i1 < 0 or i2 < 0 or i3 < 0:
                    self.errors.append({"where": "reader", "error": f"bad row {line[:200]!r}"})
                    continue
                batches.setdefault(line[i2 + 1 : i3], []).append(line)
            else:
                self._control(line.decode("utf-8", errors="replace"), t_recv)
        if batches:
            with self._lock:
                for src, rows in batches.items():
                    sink = self._sink(src)
                    if sink is None:
                        continue
                    sink.write(b"\n".join(rows) + b"\n")
                    sink.flush()
                    key = src.decode()
                    self.samples_written[key] = self.samples_written.get(key, 0) + len(rows)

    def _sink(self, src: bytes) -> IO[bytes] | None:
        sink = self._sinks.get(src)
        if sink is None:
            if self._done.is_set():
                return None
            name = src.decode(errors="replace")
            if not _SAFE.match(name):
                name = "other"
            path = self.out_dir / "samples" / f"{name}.csv"
            new = not path.exists() or path.stat().st_size == 0
            sink = open(path, "ab")
            if new:
                sink.write(protocol.CSV_HEADER.encode() + b"\n")
            self._sinks[src] = sink
        return sink

    def _control(self, line: str, t_recv: int) -> None:
        keyword, rest = protocol.split_control(line)
        if keyword == "pong":
            parts = rest.split()
            if len(parts) == 2:
                with self._cond:
                    self._pongs[parts[0]] = (int(parts[1]), t_recv)
                    self._cond.notify_all()
            return
        if keyword == "snapshot":
            label, _, text = rest.partition(" ")
            self._write_snapshot(label, text)
            return
        if keyword == "gpu_release":
            label, _, text = rest.partition(" ")
            try:
                answer = json.loads(text)
            except json.JSONDecodeError as e:
                answer = {"ok": False, "skipped": False, "detail": f"undecodable answer: {e}",
                          "waited_s": 0.0, "holders": []}
            self._log_line(keyword, {"label": label, **answer}, t_recv)
            with self._cond:
                self._releases[label] = answer
                self._cond.notify_all()
            return
        try:
            payload = json.loads(rest) if rest else {}
        except json.JSONDecodeError:
            payload = {"text": rest}
        if keyword == "event":
            with self._lock:
                if not self._events.closed:
                    self._events.write(json.dumps({"node": self.node, **payload}) + "\n")
                    self._events.flush()
            return
        self._log_line(keyword, payload, t_recv)
        if keyword == "hello":
            self.hello = payload
            for name, st in payload.get("collectors", {}).items():
                if st.get("status") != "ok":
                    self.unavailable[name] = st.get("reason", "")
                else:
                    self.unavailable.pop(name, None)
            self._write_unavailable()
            self._hello_event.set()
        elif keyword == "unavailable":
            key = payload.get("collector", "?")
            if payload.get("metric"):
                key = f"{key}/{payload['metric']}"
            self.unavailable[key] = payload.get("reason", "")
            self._write_unavailable()
        elif keyword == "info" and payload.get("kind") == "collector_started":
            self.unavailable.pop(payload.get("collector", ""), None)
            self._write_unavailable()
        elif keyword == "command":
            self._write_command(payload)
        elif keyword == "error":
            self.errors.append(payload)
        elif keyword == "bye":
            self.bye = payload

    def _log_line(self, keyword: str, payload: Any, t_recv: int) -> None:
        with self._lock:
            if not self._log.closed:
                self._log.write(
                    json.dumps(
                        {"recv_wall_ns": t_recv, "kind": keyword, "payload": payload}, default=str
                    )
                    + "\n"
                )
                self._log.flush()

    def _write_unavailable(self) -> None:
        path = self.out_dir / "unavailable.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.unavailable, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def _write_command(self, payload: dict[str, Any]) -> None:
        name = str(payload.get("name", "command"))
        if not _SAFE.match(name):
            name = "command"
        path = _free_name(self.out_dir / "collector_commands", name)
        path.write_text(json.dumps(payload.get("argv", [])) + "\n")

    def _write_snapshot(self, label: str, payload: str) -> None:
        if not _SAFE.match(label):
            label = "snapshot"
        dest = self.out_dir / "static" / label
        dest.mkdir(parents=True, exist_ok=True)
        try:
            files = json.loads(payload)
        except json.JSONDecodeError as e:
            files = {"errors.json": json.dumps({"snapshot": f"undecodable reply: {e}"})}
        for name, text in files.items():
            safe = os.path.basename(str(name))
            if safe and not safe.startswith("."):
                (dest / safe).write_text(str(text))
        with self._cond:
            self._snapshots[label] = dest
            self._cond.notify_all()

    # -- the end -----------------------------------------------------------------
    def _stderr_tail(self, n: int = 2000) -> str:
        try:
            with open(self.out_dir / "agent.stderr.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - n))
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _finish(self) -> None:
        """Close every file and record how the agent ended (runs once)."""
        with self._lock:
            if self._exit is not None:
                return
            try:
                rc = self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                rc = None  # stdout closed but the process lingers: the caller's stop() kills it
            for sink in self._sinks.values():
                try:
                    sink.close()
                except OSError:
                    pass
            self._log.close()
            self._events.close()
            bye = self.bye
            said = None if bye is None else bye.get("reason")
            clean = bye is not None and rc == 0
            expected = self._stopping or (clean and said in ("stop", "duration"))
            if expected and clean:
                reason = f"stopped ({said})"
            elif expected:
                reason = f"stopped by the harness (exit {rc}, signal {_signal_name(rc)})"
            elif bye is not None:
                reason = f"agent ended by itself: {said} (exit {rc})"
            elif _signal_name(rc):
                reason = f"killed by {_signal_name(rc)} without a bye line"
            else:
                reason = f"exited with status {rc} without a bye line"
            self._exit = AgentExit(
                returncode=rc,
                signal=_signal_name(rc),
                expected=expected,
                reason=reason,
                bye=bye,
                stderr_tail=self._stderr_tail(),
                samples=sum(self.samples_written.values()),
            )
        if not expected:
            self._killpg(signal.SIGTERM)  # tools the agent started (perf, dcgmi) go with it
        self._done.set()
        with self._cond:
            self._cond.notify_all()
        if self.on_exit is not None:
            try:
                self.on_exit(self._exit)
            except Exception:
                pass
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
