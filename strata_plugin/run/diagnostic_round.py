"""The diagnostic round: a case run again with a kernel trace over its measured window.

Why a separate repetition: tracing costs the server CPU time (every context switch is
an event), so a traced window is not the timed window. The timed case runs first, as
always; when its verdict is inconclusive, or names two classes the counters cannot
separate, or the case was named in ``--strata-escalate``, the same workload runs again as
``<case>~traced`` (its own case in ``cases.jsonl``, with ``diagnostic_of``), warm-ups
untraced and the trace started just before its first measured request and stopped after
its last. The timed case's metrics never include it; the report shows both, the trace's
overhead, and the verdict before and after (``analysis/traces/diagnostics.py``).

``--strata-escalate`` / ``strata_escalate``: ``auto`` (verdicts that need it), case ids
or workload names (always), or both, comma-separated. Empty: off.

``--strata-engine-profile`` / ``strata_engine_profile``: case ids or workload names whose
repetition takes the engine's own profile (``run/engine_profile.py``), alone or beside
the traces their verdict asks for. The round takes it by itself (trace ``engine``) for a
named case and where a verdict names two causes inside the engine
(``analysis/traces/settle.py``: ``traces_for``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from strata_plugin.analysis.traces.diagnostics import TRACED_SUFFIX, trace_dir
from strata_plugin.load.case_runner import CaseResult, CaseRunner
from strata_plugin.load.workload import Workload
from strata_plugin.run import engine_profile, socket_sampler, trace_targets, tracing
from strata_plugin.run.engine_http_profile import server_trace_dir


def parse_escalate(value: str, option: str = "--strata-escalate") -> tuple[str, ...]:
    """``"auto, decode/1"`` -> ("auto", "decode/1"); raises ValueError on an empty name."""
    parts = [p.strip() for p in value.split(",")]
    if any(not p for p in parts) and value.strip():
        expected = ("'auto' or case ids / workload names" if option == "--strata-escalate"
                    else "case ids / workload names")
        raise ValueError(f"{option}: empty name in {value!r} (expected {expected}, "
                         "comma-separated)")
    return tuple(p for p in parts if p)


class DiagnosticRunner(CaseRunner):
    """A case runner that adds the diagnostic round after each case that needs it."""

    def __init__(self, *args: Any, escalate: tuple[str, ...], run_dir: Path,
                 server_pid: int | None, settle_s: float,
                 engine_profile: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.escalate = tuple(escalate)
        # cases whose repetition takes the engine's own profile (--strata-engine-profile)
        self.engine_profile = tuple(engine_profile)
        self.run_dir = Path(run_dir)
        self.server_pid = server_pid
        self.settle_s = settle_s  # the agent's interval: the timed window's samples land
        self.diagnostics: list[CaseResult] = []
        self.decisions: dict[str, str] = {}  # case id -> why it was (not) traced
        self._plan: tuple[str, tuple[str, ...]] | None = None  # (traced case id, traces)

    def run(self, w: Workload, *, case_id: str | None = None, **kw: Any) -> CaseResult:
        result = super().run(w, case_id=case_id, **kw)
        if self._plan is None:
            self._maybe_diagnose(w, result, kw)
        return result

    def _named(self, result: CaseResult, names: tuple[str, ...] | None = None) -> bool:
        """Named by case id (a pytest node id, with or without its file and its ``[config]``
        suffix: ``test_decode`` names ``cases/x.py::test_decode[default]``) or workload name."""
        bare = result.case_id.split("[", 1)[0]
        ids = (result.case_id, bare, bare.rsplit("::", 1)[-1],
               result.case_id.rsplit("::", 1)[-1], result.workload.name)
        return any(i in (self.escalate if names is None else names) for i in ids)

    def _maybe_diagnose(self, w: Workload, result: CaseResult, kw: dict[str, Any]) -> None:
        from strata_plugin.analysis.case_summary import summarize_case
        from strata_plugin.analysis.traces import settle

        engine = self._named(result, self.engine_profile)  # --strata-engine-profile
        asked: tuple[tuple[str, ...], str] | None = (
            (("engine",), "engine profile asked") if engine else None)
        if self._named(result):  # named: traced whatever the verdict, with every trace
            traces, why = settle.ALL_TRACES, "named"
        elif "auto" in self.escalate:
            time.sleep(self.settle_s)  # the agent's next tick closes the timed window
            try:
                verdict = summarize_case(self.run_dir, result.case_id).verdict
            except Exception as exc:  # the timed case stands; the round is skipped, with why
                if asked is None:
                    self.decisions[result.case_id] = f"not traced: analysis failed ({exc})"
                    return
                verdict = None
            if verdict is not None and settle.needs_diagnosis(verdict):
                traces = settle.traces_for(verdict)
                traces += ("engine",) if engine and "engine" not in traces else ()
                why = f"verdict '{verdict.summary()}'"
            elif asked is not None:
                traces, why = asked
            else:
                assert verdict is not None
                self.decisions[result.case_id] = f"not traced: verdict '{verdict.summary()}'"
                return
        elif asked is not None:
            traces, why = asked
        else:
            return
        traced_id = result.case_id + TRACED_SUFFIX
        extra = dict(kw.pop("extra", None) or {})
        kw.pop("ab", None)  # the traced repetition is no arm of an A/B comparison
        extra.update(diagnostic_of=result.case_id, traces=list(traces), escalated=why)
        self._plan = (traced_id, traces)
        try:
            traced = super().run(w, case_id=traced_id, extra=extra, **kw)
        finally:
            self._plan = None
        # Not a timed result: out of the test's properties, gates and A/B history.
        self.results.remove(traced)
        self.diagnostics.append(traced)
        self.decisions[result.case_id] = f"traced as {traced_id} ({', '.join(traces)})"

    def _torch_dir(self) -> Path | None:
        """Where the server Strata launched writes its torch traces (made at its launch,
        run/deployment.py); None for a server it did not launch with one."""
        d = server_trace_dir(self.run_dir, self.setup.block_id or self.setup.config_id)
        return d if d.is_dir() else None

    @contextlib.contextmanager
    def _measured_window(self, case_id: str) -> Iterator[None]:
        if self._plan is None or case_id != self._plan[0]:
            yield
            return
        traces = self._plan[1]
        d = trace_dir(self.run_dir, case_id)
        d.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"traces": list(traces), "captured": [], "unavailable": {}}
        if self.server_pid is not None:
            meta.update(trace_targets.snapshot(self.server_pid, os.getpid()))
        for t in traces:
            if t == "engine":  # the engine's own profile (run/engine_profile.py): below
                continue
            if t == "net":  # the connections are the harness's too: no PID needed
                why = socket_sampler.unavailable()
            elif self.server_pid is None:
                why = ("the server's PID is not known here (attached to a server by URL or "
                       "on another node)")
            else:
                why = tracing.availability(tracing.TRACE_SETS[t]).reason
            if why:
                meta["unavailable"][t] = why
            else:
                meta["captured"].append(t)
        events = tuple(e for t in meta["captured"] if t != "net" for e in tracing.TRACE_SETS[t])
        ss = None
        if "net" in meta["captured"]:
            port = urlsplit(self.setup.base_url).port or 80
            ss = socket_sampler.SocketSampler(port, d / "ss.txt").start()
        cap = tracing.TraceCapture(events, d / "trace.txt") if events else None
        if cap is not None:
            try:
                cap.start()
            except (tracing.TraceUnavailable, OSError) as exc:
                meta["unavailable"].update(dict.fromkeys(meta["captured"], str(exc)))
                meta["captured"], cap = [], None
        try:
            window: contextlib.AbstractContextManager[dict[str, Any]] = (
                engine_profile.profile_window(self.run_dir, case_id, self.server_pid,
                                              engine=self.setup.engine,
                                              base_url=self.setup.base_url,
                                              headers=dict(self.setup.headers),
                                              torch_dir=self._torch_dir())
                if "engine" in traces else contextlib.nullcontext({}))
            with window as eng:
                yield
            if eng.get("problem"):  # said beside the other traces; its files are its own
                meta["unavailable"]["engine"] = eng["problem"]
            elif "engine" in traces:
                meta["engine_profile"] = str(engine_profile.engine_dir(
                    self.run_dir, case_id).relative_to(self.run_dir))
            if ss is not None:
                ss.stop()
                meta.update(ss_samples=ss.samples, ss_errors=ss.errors)
            if cap is not None:
                res = cap.stop()
                if res is not None:
                    meta.update(start_mono_ns=res.start_mono_ns, end_mono_ns=res.end_mono_ns,
                                overruns=res.overruns, entries=res.entries, events=list(events))
        finally:
            if ss is not None:
                ss.stop()
            if cap is not None:
                cap.abort()  # no-op after a stop; the instance goes on any other way out
            (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
