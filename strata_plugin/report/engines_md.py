"""report.md's per-engine section: every engine the request's path ends at, case by case.

Shown only where a path ends at several engines (replicas behind a router): one row per
engine and case with its own quota, throttling, CPU and run-queue wait
(``analysis/engine_lines.py``), its share of the case's requests and their pace
(``analysis/engine_requests.py``), then the engines their own quota holds, the engine
slower than the others (its median TPOT beyond ``engine_pace_ratio`` times the fastest's)
with its cause from its own evidence, and how many requests' engine is not known, and why.
"""

from __future__ import annotations

from strata_plugin.analysis import thresholds
from strata_plugin.analysis.engine_lines import held_by_quota
from strata_plugin.analysis.engine_requests import EnginePace, imbalance_finding
from strata_plugin.formats.request_path import Engine, paths_in
from strata_plugin.report.fmt import md_num, share_pct
from strata_plugin.report.report_data import ReportData
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


def _share(p: EnginePace | None) -> str:
    if p is None or p.share is None:
        return "-"
    return f"{p.served} of {p.of} ({share_pct(p.share)})"


def report_section(d: ReportData) -> str:
    engines, first = _engines(d)
    if len(engines) < 2:
        return ""
    rows, findings, unknown = [], [], []
    for a in d.analyses:
        ec = a.engines  # analysis/engine_case.py: the case's lines, attribution and pace
        if ec is None:
            continue
        lines, att = ec.lines, ec.attribution
        for x in lines:
            p = ec.pace(x.pid)
            rows.append((a.case_id, f"PID {x.pid} `{x.name or '?'}`", x.address,
                         _share(p), md_num(p.tpot_ms if p else None),
                         md_num(p.e2e_ms if p else None),
                         md_num(x.quota_cores), share_pct(x.throttled_share),
                         md_num(x.cpu_cores), md_num(x.run_wait),
                         "yes" if x.held_by_quota else "no"))
        found = held_by_quota(lines)
        if found:
            findings.append(f"* `{a.case_id}`: {found}")
        slower = imbalance_finding(ec.slow, lines)
        if slower:
            findings.append(f"* `{a.case_id}`: {slower}")
        if att.not_known:
            unknown.append(f"* `{a.case_id}`: {len(att.not_known)} of "
                           f"{len(att.not_known) + len(att.engine_of)} requests: "
                           f"{att.reasons()}.")
    if not rows:
        return (f"\n## {TITLE}\n\nThe path ends at {len(engines)} engines; none has samples "
                "of its own in any case's window.\n")
    table = md_table(("case", "engine", "address", "requests served", "median TPOT (ms)",
                      "median e2e (ms)", "CFS quota (cores)", "throttled periods",
                      "CPU (cores)", "run-queue wait (s/s)", "held by its quota"), rows)
    return (f"\n## {TITLE}\n\nThe path ends at {len(engines)} engines, each followed with "
            "its own cgroup: the case's measured requests it served (each request goes to "
            "the one engine whose connection opened and closed with it, within "
            f"{thresholds.value('engine_conn_match_s') * 1000:g} ms at both ends) and their "
            "median TPOT and end-to-end latency, its CFS quota and the share of its "
            "enforcement periods it was throttled in, its root process's CPU and its "
            "threads' run-queue wait per second, over each case's window.\n\n" + table
            + ("\n" + "\n".join(findings) + "\n" if findings else "")
            + ("\nWhich engine served the request is not known for:\n\n"
               + "\n".join(unknown) + "\n" if unknown else "")
            + (f"\nThe server-wide cgroup rows (its quota, throttling and memory limit) "
               f"are the first engine's cgroup alone: PID {', '.join(map(str, first))}; "
               "where the engines' cgroups differ, the verdict does not read them as the "
               "server's, but each engine's own, in the table above.\n" if first else ""))
