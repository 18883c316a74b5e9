"""The engine's own profile read back (``run/engine_profile.py``): each case's capture in
``traces/engine/<case>/`` as trace events on ``CLOCK_MONOTONIC`` microseconds, with the
relation to the harness's wall clock the capture measured.

perf's samples become one "X" slice per sample on its thread (``pid`` the process,
``tid`` the thread, named by perf's ``comm``), named by the function the sample landed
in, lasting one sample period: a thread's busy stretches then read as runs of slices,
its idle ones as gaps. Samples outside the capture's window are dropped and counted
(perf enables and disables between the bounds, so none is expected).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_plugin.analysis.traces.torch_trace import TorchTrace, read_torch
from strata_plugin.errors import StrataError
from strata_plugin.limits import ENGINE_SAMPLES_MAX
from strata_plugin.run.engine_http_profile import SERVER_FOLDER

FOLDER = ("traces", "engine")
# perf script -F comm,pid,tid,time,ip,sym,dso --ns:
#   "  llama-server 4021/4025  4085.381088772:   7f41f6d58ba3 ggml_vec_dot (/x/libggml.so)"
# comm may hold spaces and sym parentheses: the dso is the last parenthesised group.
_LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+"
                   r"(?P<s>\d+)\.(?P<ns>\d{9}):\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.*?)"
                   r"\s*\((?P<dso>[^()]*)\)\s*$")


class EngineProfileError(StrataError, ValueError):
    """A capture's files that cannot be read as one; the message names the file and line."""


@dataclass(frozen=True)
class EngineCapture:
    """One case's engine profile: what it is, its window (monotonic ns), its events
    (``ts`` in monotonic microseconds), the clock relation, and any problem in words."""

    case_id: str
    kind: str
    folder: Path
    start_mono_ns: int | None
    end_mono_ns: int | None
    wall_minus_mono_ns: int | None
    error_ns: int | None
    method: str
    events: tuple[dict[str, Any], ...] = ()
    samples: int = 0
    outside: int = 0
    problem: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    #: the server's own torch profiler traces of the window (analysis/traces/torch_trace.py),
    #: read whether or not perf's samples were taken
    torch: tuple[TorchTrace, ...] = ()

    def line(self, run_dir: Path) -> str:
        """The report's line for this capture (and the server's own profiler's, if asked)."""
        own = self.meta.get("engine_profiler") or {}
        said = ""
        if own:
            said = (f" The server's own profiler ({own.get('engine', '')}): "
                    + (f"not taken: {own['problem']}." if own.get("problem") else
                       f"started and stopped over the window; {own.get('started', '')}."))
        if self.torch:
            where = self.folder.relative_to(run_dir) if self.folder.is_relative_to(run_dir) \
                else self.folder
            said += (f" Its torch trace in `{where}/`, on the timeline by the trace's "
                     "baseTimeNanoseconds (the host's wall clock), checked against Strata's "
                     "stamps of /start_profile and /stop_profile: "
                     + "; ".join(t.said() for t in self.torch)
                     + ". Its cost is the repetition's overhead (the diagnostic round's table).")
        return self._perf_line(run_dir) + said

    def _perf_line(self, run_dir: Path) -> str:
        where = self.folder.relative_to(run_dir) if self.folder.is_relative_to(run_dir) \
            else self.folder
        if self.problem:
            return f"Engine profile ({self.kind}) not taken: {self.problem}. `{where}/`"
        err = "" if self.error_ns is None else f", clock error ±{self.error_ns / 1e3:.0f} µs"
        early = self.meta.get("ended_early")
        top = ", ".join(f"`{name}` {share:.0%}" for name, share in self.top(3))
        return (f"Engine profile: {self.kind}, {self.samples} samples of "
                f"{len({e['tid'] for e in self.events if e.get('ph') == 'X'})} threads in "
                f"`{where}/` (on the timeline{err}; taken in a repetition: its cost is "
                f"that repetition's overhead beside the timed case)"
                + (f"; {early}" if early else "") + (f". Most samples in: {top}." if top
                                                     else "."))

    def top(self, n: int) -> list[tuple[str, float]]:
        """The ``n`` functions most samples landed in, with their share of all samples."""
        counts: dict[str, int] = {}
        for e in self.events:
            if e.get("ph") == "X":
                counts[e["name"]] = counts.get(e["name"], 0) + 1
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [(name, c / total) for name, c in ranked]


def parse_perf_script(lines: Iterator[str] | list[str], period_us: float,
                      window: tuple[int, int] | None = None, name: str = "samples.txt"
                      ) -> tuple[list[dict[str, Any]], int, int]:
    """perf script text -> (trace events, samples kept, samples outside ``window``).
    Raises EngineProfileError past ENGINE_SAMPLES_MAX or on a line that is not a sample."""
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], str] = {}
    kept = outside = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            raise EngineProfileError(f"{name} line {n}: not a perf sample "
                                     f"(comm pid/tid time: ip sym (dso)): {line[:120]!r}")
        t_ns = int(m["s"]) * 1_000_000_000 + int(m["ns"])
        if window is not None and not window[0] <= t_ns <= window[1]:
            outside += 1
            continue
        kept += 1
        if kept > ENGINE_SAMPLES_MAX:
            raise EngineProfileError(f"{name}: more than ENGINE_SAMPLES_MAX = "
                                     f"{ENGINE_SAMPLES_MAX} samples; lower the rate or the "
                                     "window")
        pid, tid = int(m["pid"]), int(m["tid"])
        threads.setdefault((pid, tid), m["comm"])
        sym = m["sym"] or "[unknown]"
        events.append({"ph": "X", "name": sym, "cat": "perf", "pid": pid, "tid": tid,
                       "ts": t_ns / 1000.0, "dur": period_us,
                       "args": {"dso": m["dso"], "ip": m["ip"]}})
    # a sample lasts one period or until its thread's next sample, whichever is first:
    # the timer's jitter would otherwise overlap two slices, which no viewer draws right
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for e in sorted(events, key=lambda x: x["ts"]):
        prev = last.get((e["pid"], e["tid"]))
        if prev is not None and prev["ts"] + prev["dur"] > e["ts"]:
            prev["dur"] = round(e["ts"] - prev["ts"], 3)
        last[(e["pid"], e["tid"])] = e
    for (pid, tid), comm in sorted(threads.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"{comm} {tid}"}})
    return events, kept, outside


def read_capture(folder: Path) -> EngineCapture:
    """One capture folder read; a capture that failed comes back with its problem."""
    meta_p = folder / "meta.json"
    try:
        meta = json.loads(meta_p.read_text())
    except (OSError, ValueError) as exc:
        return EngineCapture(folder.name, "engine profile", folder, None, None, None, None,
                             "", problem=f"meta.json unreadable: {exc}")
    rel = meta.get("clock_relation") or {}
    own = meta.get("engine_profiler")
    cap = EngineCapture(
        str(meta.get("case_id") or folder.name), str(meta.get("kind", "engine profile")),
        folder, meta.get("start_mono_ns"), meta.get("end_mono_ns"),
        rel.get("wall_minus_mono_ns"), rel.get("error_ns"), str(rel.get("method", "")),
        problem=str(meta.get("problem") or ""), meta=meta,
        torch=read_torch(folder, own) if isinstance(own, dict) else ())
    if cap.problem:
        return cap
    if "samples.txt" not in meta.get("files", ()) or cap.wall_minus_mono_ns is None:
        return _with(cap, problem="the capture left no samples.txt or no clock relation")
    window = None
    if cap.start_mono_ns is not None and cap.end_mono_ns is not None:
        window = (int(cap.start_mono_ns), int(cap.end_mono_ns))
    period_us = 1e6 / float(meta.get("freq_hz") or 1000)
    try:
        with (folder / "samples.txt").open(errors="replace") as f:
            events, kept, outside = parse_perf_script(f, round(period_us, 3), window)
    except (OSError, EngineProfileError) as exc:
        return _with(cap, problem=str(exc))
    return _with(cap, events=tuple(events), samples=kept, outside=outside)


def _with(cap: EngineCapture, **kw: Any) -> EngineCapture:
    import dataclasses

    return dataclasses.replace(cap, **kw)


def read_all(run_dir: Path) -> list[EngineCapture]:
    """Every case's capture in ``run_dir/traces/engine``, by folder name."""
    root = Path(run_dir).joinpath(*FOLDER)
    if not root.is_dir():
        return []
    # the launched server's own profiler folder holds no capture: its files are moved out
    return [read_capture(d) for d in sorted(root.iterdir())
            if d.is_dir() and d.name != SERVER_FOLDER[-1]]
