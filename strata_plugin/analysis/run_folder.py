"""Reading a run folder's raw files: manifest, cases, markers, requests, samples.

Everything derived is rebuilt from what this module reads, so the live report and
``python -m strata_plugin report DIR`` see the same inputs. It reads a folder that
is still being written (a case teardown, ``live``): a half-written last line of a
JSON-lines file is skipped, and every file but the manifest may be missing. After the
run, a last line cut mid-write is named (``RunBundle.torn``: the report says the run is
incomplete) and any other damage is an error naming the file, line and key.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_plugin.analysis.engine_clocks import within_request
from strata_plugin.analysis.metrics import RequestMetrics, request_metrics
from strata_plugin.analysis.rules.window import Verdict
from strata_plugin.analysis.timeline import Window, case_windows, load_markers, run_windows
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.manifest import read_manifest
from strata_plugin.formats.outcome import RunOutcome
from strata_plugin.formats.records import ClockAnchor, RequestRecord
from strata_plugin.formats.typed import (
    BOOL,
    INT,
    NUM,
    STR,
    JsonLines,
    check_present,
    check_shape,
    opt,
)
from strata_plugin.formats.windows import Marker

#: Files the report writes (report/writer.py OUTPUTS); everything else in a run folder is
#: raw.
DERIVED = (
    "case_summary.csv",
    "case_hw_summary.csv",
    "summary.json",
    "report.md",
    "thresholds.md",
    "benchmark.json",
    "ledger.jsonl",
    # report/ci_outputs.py CI_FILES (analysis may not import report/)
    "bencher.json",
    "metrics.txt",
    "github-benchmark-smaller.json",
    "github-benchmark-bigger.json",
)
DERIVED_DIRS = ("plots", "timeline")  # timeline: report/trace_events.py FOLDER


def drop_derived(run_dir: Path, since: float) -> None:
    """Remove derived files a failed report attempt left behind (they may be half-written):
    those modified since ``since`` (``time.time()``), less a second."""
    paths = [run_dir / n for n in DERIVED]
    for d in DERIVED_DIRS:
        paths += sorted((run_dir / d).glob("*"))
    for p in paths:
        with contextlib.suppress(OSError):
            if p.is_file() and p.stat().st_mtime >= since - 1:
                p.unlink()


@dataclass(frozen=True)
class CaseInfo:
    """One case as run: the last ``cases.jsonl`` line for its id (may be absent: then
    ``line`` holds the id alone and ``recorded`` is False)."""

    case_id: str
    name: str
    params: dict[str, Any]
    config_id: str
    outcome: str
    line: CaseLine
    recorded: bool = True

    @classmethod
    def of(cls, line: CaseLine) -> CaseInfo:
        return cls(line.case_id, line.name or line.case_id, dict(line.params or {}),
                   line.config_id or "", line.outcome or "", line)

    @property
    def ab_group(self) -> str:
        return self.line.ab_group or ""

    @property
    def ab_arm(self) -> str:
        return self.line.ab_arm or ""

    @property
    def client_bound(self) -> bool | None:
        """The line's ``client_bound``, else its self-check's (lines before the copy)."""
        v = self.line.client_bound
        if v is None and "client_bound" not in self.line.nulls:
            v = (self.line.self_check or {}).get("client_bound")
        return None if v is None else bool(v)

    def self_check(self, key: str) -> float | None:
        v = (self.line.self_check or {}).get(key)
        return None if v is None else float(v)

    def as_dict(self) -> dict[str, Any]:
        """The line as read ({} where the case has none)."""
        return self.line.to_dict() if self.recorded else {}


@dataclass
class RunBundle:
    run_dir: Path
    manifest: dict[str, Any]
    cases: dict[str, CaseInfo]
    markers: list[Marker]
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    bad_lines: int = 0  # torn lines skipped (a run cut mid-write), named in ``torn``
    #: ``requests.jsonl:N: torn line (...)`` per raw file whose last line was cut
    torn: tuple[str, ...] = ()
    #: the run's outcome, as the report states it (set by report/writer.py)
    outcome: RunOutcome | None = None
    metrics_cache: dict[str, RequestMetrics] = field(default_factory=dict, repr=False)

    def metrics_of(self, rec: RequestRecord) -> RequestMetrics:
        """``metrics.request_metrics``, computed once per request of the run."""
        m = self.metrics_cache.get(rec.request_id)
        if m is None:
            m = self.metrics_cache[rec.request_id] = request_metrics(rec)
        return m

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)

    @property
    def anchor(self) -> ClockAnchor | None:
        a = self.manifest.get("clock_anchor")
        if isinstance(a, dict) and "mono_ns" in a and "wall_ns" in a:
            return ClockAnchor(int(a["mono_ns"]), int(a["wall_ns"]))
        return None

    def case_windows(self) -> dict[str, Window]:
        return case_windows(self.markers)

    def windows(self) -> list[Window]:
        return run_windows(self.markers)

    def case_ids(self) -> list[str]:
        """Every case the run knows of, in the order it ran."""
        wins = self.case_windows()
        ids = (
            set(self.cases)
            | set(wins)
            | {
                cid
                for cid, recs in self.records.items()
                if any(r.phase == "measured" for r in recs)
            }
        )
        return sorted(ids, key=lambda c: (wins[c].start_ns if c in wins else 2**63, c))

    def case_info(self, case_id: str) -> CaseInfo:
        return self.cases.get(case_id) or CaseInfo(case_id, case_id, {}, "", "",
                                                   CaseLine(case_id), recorded=False)

    def request_wall(self, mono_ns: int) -> int | None:
        a = self.anchor
        return a.to_wall_ns(mono_ns) if a else None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, leniently: {} where it is missing, not JSON or not an object."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def read_cases(path: Path, *, live: bool = False,
               lines: JsonLines | None = None) -> dict[str, CaseInfo]:
    """The last line of each case id; a line without an id is skipped. A torn last line
    is skipped (``lines.torn`` names it); any other line that is not a JSON object, or a
    key of the wrong type, raises ``FormatError`` naming ``path:line`` and the key
    (formats/cases.py). ``live``: the run is still writing (an unreadable last line is
    skipped, whatever it is)."""
    lines = lines or JsonLines(path)
    out: dict[str, CaseInfo] = {}
    for n, d in lines.read(live=live):
        line = CaseLine.from_dict(d, f"{path}:{n}")
        check_read_parts(line, f"{path}:{n}")
        if line.case_id:
            out[line.case_id] = CaseInfo.of(line)
    return out


#: The parts of a case line's objects that the analysis and the report read, with their
#: types (formats/typed.py shapes); other keys in them are free.
_PARAMS = {"isl": opt(INT), "osl": opt(INT), "concurrency": opt(INT), "requests": opt(INT),
           "rate": opt(NUM), "arrival": opt(STR), "prefix": opt(STR)}
_SELF_CHECK = {"client_bound": opt(BOOL), "dispatch_lateness_p99_ms": opt(NUM),
               "client_cpu_cores": opt(NUM), "timing_error_bound_ms": opt(NUM),
               "dispatch_delay_share": opt(NUM), "read_backlog_p99_bytes": opt(NUM)}


def check_read_parts(line: CaseLine, where: str) -> None:
    """The case line's nested values that are read (the workload's parameters, the
    client's self-check, the recorded verdict) hold their types: FormatError naming
    ``where`` and the key otherwise. A recorded verdict may lack fields (another
    version's): the analysis then decides it again; a field it has must be typed."""
    if line.params is not None:
        check_shape(line.params, _PARAMS, where, "params")
    if line.self_check is not None:
        check_shape(line.self_check, _SELF_CHECK, where, "self_check")
    if line.verdict is not None:
        check_present(Verdict, line.verdict, where, "verdict")


def read_records(
    path: Path, case_id: str | None = None, *, live: bool = False,
    lines: JsonLines | None = None,
) -> tuple[dict[str, list[RequestRecord]], int]:
    """Records grouped by case; with ``case_id``, only that case's (lines that do not
    mention the id are not even parsed: a case teardown reads 1/N of the file). Returns
    the records and the number of torn lines skipped (0 or 1, the last; ``lines.torn``
    names it). A line that is not a record of this format raises ``FormatError`` naming
    ``path:line`` and the key (formats/records.py); ``live`` as for ``read_cases``."""
    lines = lines or JsonLines(path)
    must = json.dumps(case_id).encode() if case_id is not None else None
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for n, d in lines.read(must, live=live):
        # the engine's clocks the analysis may use: within the request (engine_clocks.py)
        rec = within_request(RequestRecord.from_dict(d, f"{path}:{n}"))
        if case_id is None or rec.case_id == case_id:
            out[rec.case_id].append(rec)
    return dict(out), int(lines.torn is not None)


def load_bundle(run_dir: Path, case_id: str | None = None, *, live: bool = False) -> RunBundle:
    """Every raw file except the samples (see ``timeline.load_samples``); with
    ``case_id``, the requests of that case only. Read through the typed formats: a file
    that does not hold its format raises ``FormatError`` naming the file, line and key.
    ``live``: the run is still writing these files (a case's teardown)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    req = JsonLines(run_dir / "requests.jsonl")
    cases = JsonLines(run_dir / "cases.jsonl")
    records, bad = read_records(req.path, case_id, live=live, lines=req)
    return RunBundle(
        run_dir=run_dir,
        manifest=read_manifest(run_dir / "manifest.json"),
        cases=read_cases(cases.path, live=live, lines=cases),
        markers=load_markers(run_dir),
        records=records,
        bad_lines=bad,
        torn=tuple(x.torn for x in (req, cases) if x.torn),
    )
