"""report.md's per-engine section: every engine the request's path ends at, case by case.

Shown only where a path ends at several engines (replicas behind a router): one row per
engine and case with its own quota, throttling, CPU and run-queue wait
(``analysis/engine_lines.py``), then the engines their own quota holds, and what is not
known yet (which requests each one served).
"""

from __future__ import annotations

from strata_plugin.analysis.engine_lines import NOT_ATTRIBUTED, engine_lines, held_by_quota
from strata_plugin.formats.request_path import Engine, paths_in
from strata_plugin.report.fmt import md_num
from strata_plugin.report.markdown import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Engines"


def _engines(d: ReportData) -> tuple[list[Engine], list[int]]:
    """Every engine of every recorded path, once each (by PID and address: the path is
    looked at on the head only), and the first engine the agent was given for each path
    of several (the one whose cgroup the server-wide rows read)."""
    seen: dict[tuple[int, str], Engine] = {}
    first: list[int] = []
    for path in paths_in(d.bundle.manifest).values():
        for e in path.engines:
            seen.setdefault((e.pid, e.address), e)
        if len(path.engines) > 1 and path.engine_from == "path" and path.engine_pids:
            first.append(path.engine_pids[0])
    return list(seen.values()), first


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def report_section(d: ReportData) -> str:
    engines, first = _engines(d)
    if len(engines) < 2:
        return ""
    rows, findings = [], []
    for a in d.analyses:
        lines = engine_lines(a.hw, engines)
        for x in lines:
            rows.append((a.case_id, f"PID {x.pid} `{x.name or '?'}`", x.address,
                         md_num(x.quota_cores), _pct(x.throttled_share),
                         md_num(x.cpu_cores), md_num(x.run_wait),
                         "yes" if x.held_by_quota else "no"))
        found = held_by_quota(lines)
        if found:
            findings.append(f"* `{a.case_id}`: {found}")
    if not rows:
        return (f"\n## {TITLE}\n\nThe path ends at {len(engines)} engines; none has samples "
                "of its own in any case's window.\n")
    table = md_table(("case", "engine", "address", "CFS quota (cores)", "throttled periods",
                      "CPU (cores)", "run-queue wait (s/s)", "held by its quota"), rows)
    return (f"\n## {TITLE}\n\nThe path ends at {len(engines)} engines, each followed with "
            "its own cgroup: its CFS quota and the share of its enforcement periods it was "
            "throttled in, its root process's CPU and its threads' run-queue wait per "
            "second, over each case's window.\n\n" + table
            + ("\n" + "\n".join(findings) + "\n" if findings else "")
            + f"\nNot known: {NOT_ATTRIBUTED}.\n"
            + (f"\nThe server-wide cgroup rows the verdict reads (its quota, throttling "
               f"and memory limit) are the first engine's cgroup alone: PID "
               f"{', '.join(map(str, first))}; each engine's own is in the table above.\n"
               if first else ""))
