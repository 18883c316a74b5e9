"""Reading a run folder's raw files: manifest, cases, markers, requests, samples.

Everything derived is rebuilt from what this module reads, so the live report and
``python -m strata_plugin report DIR`` see the same inputs. It reads a folder that
is still being written (a case teardown): a half-written last line of a JSON-lines
file is skipped, and every file but the manifest may be missing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_plugin.analysis.metrics import RequestMetrics, request_metrics
from strata_plugin.analysis.timeline import Window, case_windows, load_markers, run_windows
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.records import ClockAnchor, RequestRecord
from strata_plugin.formats.windows import Marker

#: Files the report writes; everything else in a run folder is raw.
DERIVED = (
    "case_summary.csv",
    "case_hw_summary.csv",
    "summary.json",
    "report.md",
    "thresholds.md",
    "benchmark.json",
    # report/ci_outputs.py CI_FILES (analysis may not import report/)
    "bencher.json",
    "metrics.txt",
    "github-benchmark-smaller.json",
    "github-benchmark-bigger.json",
)
DERIVED_DIRS = ("plots",)


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
    bad_lines: int = 0
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
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _jsonl(path: Path, must_contain: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """Parsed lines, and how many were unreadable (a torn last line of a live run).

    ``must_contain``: skip, unparsed, every line without this text (a cheap filter).
    """
    if not path.exists():
        return [], 0
    out, bad = [], 0
    with path.open() as fh:
        for line in fh:
            if must_contain is not None and must_contain not in line:
                continue
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(d, dict):
                out.append(d)
    return out, bad


def read_cases(path: Path) -> dict[str, CaseInfo]:
    """The last line of each case id. A torn last line (a live run) is skipped, as is a
    line without an id; a key of the wrong type raises ``CaseLineError`` naming
    ``path:line`` and the key (formats/cases.py)."""
    if not path.exists():
        return {}
    out: dict[str, CaseInfo] = {}
    with path.open() as fh:
        for n, text in enumerate(fh, 1):
            text = text.strip()
            if not text:
                continue
            try:
                d = json.loads(text)
            except json.JSONDecodeError:
                continue
            if not isinstance(d, dict):
                continue
            line = CaseLine.from_dict(d, f"{path}:{n}")
            if line.case_id:
                out[line.case_id] = CaseInfo.of(line)
    return out


def read_records(
    path: Path, case_id: str | None = None
) -> tuple[dict[str, list[RequestRecord]], int]:
    """Records grouped by case; with ``case_id``, only that case's (lines that do not
    mention the id are not even parsed: a case teardown reads 1/N of the file)."""
    must = json.dumps(case_id) if case_id is not None else None
    lines, bad = _jsonl(path, must)
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for d in lines:
        try:
            rec = RequestRecord.from_dict(d)
        except (TypeError, ValueError, KeyError):
            bad += 1
            continue
        if case_id is None or rec.case_id == case_id:
            out[rec.case_id].append(rec)
    return dict(out), bad


def load_bundle(run_dir: Path, case_id: str | None = None) -> RunBundle:
    """Every raw file except the samples (see ``timeline.load_samples``); with
    ``case_id``, the requests of that case only."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    records, bad = read_records(run_dir / "requests.jsonl", case_id)
    return RunBundle(
        run_dir=run_dir,
        manifest=read_json(run_dir / "manifest.json"),
        cases=read_cases(run_dir / "cases.jsonl"),
        markers=load_markers(run_dir),
        records=records,
        bad_lines=bad,
    )
