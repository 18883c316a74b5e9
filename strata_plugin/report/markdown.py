"""report.md: the run, its limits, each case (workload, metrics, hardware, verdict,
plots), the A/B comparisons, and the thresholds the verdicts used.

Pure text assembly from already-computed results; nothing here reads files or the
clock, so the same inputs always give the same document.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from strata_plugin.analysis.ab_groups import ArmDelta, ShaPair
from strata_plugin.analysis.case_summary import CaseAnalysis, RunContext
from strata_plugin.analysis.metrics import PERCENTILE_METHOD
from strata_plugin.analysis.rails import RailsReport
from strata_plugin.analysis.rules import THRESHOLDS, Verdict
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.timeline import SampleStore
from strata_plugin.report.diagnostic import diagnostic_section
from strata_plugin.report.fmt import md_num
from strata_plugin.report.tables import dist_rows, fmt_pair, key_hw_rows, md_table


@dataclass
class AbGroup:
    group: str
    arms: list[tuple[str, tuple[str, ...]]]
    deltas: list[ArmDelta]
    pairs: list[ShaPair]


@dataclass
class ReportData:
    bundle: RunBundle
    store: SampleStore
    ctx: RunContext
    analyses: list[CaseAnalysis]
    limits: list[str]
    case_plots: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    run_plot: tuple[str, list[str]] | None = None
    ab: list[AbGroup] = field(default_factory=list)


def _cmd(argv: Any) -> str:
    if isinstance(argv, (list, tuple)):
        return shlex.join(str(a) for a in argv)
    return str(argv or "")


def _profile_name(profile: Any) -> str:
    if isinstance(profile, dict):
        name = profile.get("name") or profile.get("profile") or ""
        path = profile.get("_path") or ""
        return f"{name} ({path})" if name and path else str(name or path or "-")
    return str(profile or "-")


def header(d: ReportData) -> str:
    m = d.bundle.manifest
    host = m.get("host") or {}
    rows = [
        ("run id", d.bundle.run_id),
        ("profile", _profile_name(m.get("profile"))),
        ("started (UTC)", m.get("started_utc", "-")),
        ("strata", m.get("strata_version", "-")),
        ("git sha", m.get("git_sha", "-")),
        ("command", f"`{_cmd(m.get('argv'))}`" if m.get("argv") else "-"),
        (
            "host",
            ", ".join(
                str(x)
                for x in (
                    host.get("hostname"),
                    host.get("cpu_model"),
                    f"{host.get('cpus')} CPUs" if host.get("cpus") else None,
                    host.get("kernel"),
                )
                if x
            )
            or "-",
        ),
    ]
    if m.get("incomplete_reason"):
        rows.append(("incomplete", m["incomplete_reason"]))
    out = [f"# Strata report: {d.bundle.run_id}\n", md_table(("", ""), rows)]
    servers = m.get("servers") or (
        {"server": m["server"]} if isinstance(m.get("server"), dict) else {}
    )
    if servers:
        out.append("\n## Servers\n")
        out.append(
            md_table(
                ("config", "command", "url", "startup (s)"),
                [
                    (
                        cid,
                        f"`{_cmd(s.get('argv') or s.get('command'))}`"
                        if isinstance(s, dict)
                        else s,
                        s.get("base_url", "-") if isinstance(s, dict) else "-",
                        s.get("startup_s") if isinstance(s, dict) else None,
                    )
                    for cid, s in sorted(servers.items())
                ],
            )
        )
    out.append("\n## Nodes\n")
    nodes_m = m.get("nodes") or {}
    node_rows = []
    for node in sorted(set(nodes_m) | set(d.store.nodes())):
        n = nodes_m.get(node) or {}
        off0, off1 = n.get("offset_start_ns", n.get("clock_offset_ns")), n.get("offset_end_ns")
        srcs = sorted({s for nn, s in d.store.sources() if nn == node})
        node_rows.append(
            (
                node,
                None if off0 is None else off0 / 1e6,
                None if n.get("clock_uncertainty_ns") is None else n["clock_uncertainty_ns"] / 1e6,
                None if off0 is None or off1 is None else (off1 - off0) / 1e6,
                ", ".join(srcs) or "none",
                ", ".join(sorted(d.store.unavailable.get(node, {}))) or "none",
            )
        )
    out.append(
        md_table(
            (
                "node",
                "clock offset (ms)",
                "uncertainty (ms)",
                "drift (ms)",
                "collectors with samples",
                "unavailable",
            ),
            node_rows,
        )
    )
    versions = m.get("versions") or {}
    if versions:
        out.append("\n## Versions\n")
        out.append(md_table(("package", "version"), sorted(versions.items())))
    unavailable = [
        (node, col, why)
        for node in sorted(d.store.unavailable)
        for col, why in sorted(d.store.unavailable[node].items())
    ]
    out.append("\n## Unavailable collectors\n")
    out.append(
        md_table(("node", "collector", "reason"), unavailable)
        if unavailable
        else "Every collector ran.\n"
    )
    return "".join(out)


def limits(d: ReportData) -> str:
    body = "".join(f"- {line}\n" for line in d.limits) if d.limits else "- none recorded\n"
    return "\n## Limits of this run\n\n" + body


def summary_table(d: ReportData) -> str:
    rows = []
    for a in d.analyses:
        cm = a.metrics
        rows.append(
            (
                f"[{a.name}](#{_anchor(a)})",
                _workload_short(a.params),
                f"{cm.n_ok}/{cm.n_requests}",
                cm.ttft.p50,
                cm.ttft.p99,
                cm.tpot.p50,
                cm.output_tok_s,
                a.energy.j_per_output_token if a.energy else None,
                a.verdict.summary() or "-",
                a.verdict.confidence,
            )
        )
    return "\n## Cases at a glance\n\n" + md_table(
        (
            "case",
            "workload",
            "ok/total",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "TPOT p50 (ms)",
            "output tok/s",
            "J / output token",
            "verdict",
            "confidence",
        ),
        rows,
    )


def _anchor(a: CaseAnalysis) -> str:
    return "case-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in a.case_id).lower()


def _workload_short(p: dict[str, Any]) -> str:
    keys = ("isl", "osl", "concurrency", "rate", "requests")
    return " ".join(f"{k}={p[k]}" for k in keys if p.get(k) is not None) or "-"


def verdict_md(v: Verdict) -> str:
    lines = []
    head = " + ".join(v.classes) if v.classes else "no class"
    tag = "inconclusive: " if v.inconclusive else ""
    lines.append(f"**{tag}{head}** (confidence {md_num(v.confidence)}, {v.confidence_label})\n")
    if v.modifiers:
        lines.append(f"\nModifier: {', '.join(v.modifiers)}.\n")
    if v.also_flagged:
        lines.append(f"\nAlso past threshold: {', '.join(v.also_flagged)}.\n")
    for n in v.notes:
        lines.append(f"\n- {n}")
    if v.notes:
        lines.append("\n")
    if v.evidence:
        lines.append("\n")
        lines.append(
            md_table(
                (
                    "class",
                    "signal",
                    "value",
                    "test",
                    "threshold",
                    "unit",
                    "met",
                    "threshold source",
                ),
                [
                    (
                        e.cls,
                        e.metric,
                        e.value,
                        e.op,
                        f"{e.threshold} = {md_num(e.threshold_value)}",
                        e.unit,
                        "yes" if e.met else "no",
                        e.source,
                    )
                    for e in v.evidence
                ],
            )
        )
    if v.missing_signals:
        lines.append("\nNot measured (rules that needed these did not decide):\n\n")
        lines.extend(f"- {m}\n" for m in v.missing_signals)
    if v.finer_trace:
        lines.append("\nFiner trace that would settle it:\n\n")
        lines.extend(f"- {t}\n" for t in v.finer_trace)
    return "".join(lines)


def rails_md(rep: RailsReport) -> str:
    """Each rails finding (``strata_plugin.analysis.rails``) with the comparisons behind it."""
    lines = [
        "Findings of `strata_plugin/analysis/rails.py` (the class each one supports); the source "
        "column names the rows of `case_hw_summary.csv` (`node/source:device/metric`).\n"
    ]
    for f in rep.findings:
        lines.append(f"\n- **{f.kind}** ({f.cls}): {f.summary}\n")
    rows = [
        (
            f.kind,
            e.metric,
            e.value,
            e.op,
            f"{e.threshold_name} = {md_num(e.threshold)}",
            e.unit,
            "yes" if e.met else "no",
            f"`{e.source}`",
        )
        for f in rep.findings
        for e in f.evidence
    ]
    if rows:
        lines.append("\n")
        lines.append(
            md_table(
                ("finding", "signal", "value", "test", "threshold", "unit", "met", "source"),
                rows,
            )
        )
    return "".join(lines)


def case_section(d: ReportData, a: CaseAnalysis) -> str:
    out = [f'\n### {a.name} <a id="{_anchor(a)}"></a>\n\n']
    info = a.info
    facts = [("case id", f"`{a.case_id}`"), ("config", a.config_id or "-")]
    if info.get("outcome"):
        facts.append(("outcome", info["outcome"]))
    if info.get("ab_group"):
        facts.append(("A/B", f"{info['ab_group']} / {info.get('ab_arm', '')}"))
    if a.window is not None:
        facts.append(("measured window", f"{md_num(a.window.duration_s)} s"))
    else:
        facts.append(("measured window", "not marked: no hardware summary"))
    facts.extend((f"param `{k}`", v) for k, v in sorted(a.params.items()))
    if info.get("scaled_from"):
        scaled = ", ".join(f"{k}={v}" for k, v in sorted(info["scaled_from"].items()))
        facts.append(("scaled from", scaled))
    sc = info.get("self_check") or {}
    if sc:
        facts.append(
            (
                "client self-check",
                f"client_bound={sc.get('client_bound')}, lateness p99 "
                f"{md_num(sc.get('dispatch_lateness_p99_ms'))} ms"
                + (f" ({md_num(100 * sc['dispatch_delay_share'])}% of the requests' time)"
                   if sc.get("dispatch_delay_share") is not None else "")
                + f", client CPU {md_num(sc.get('client_cpu_cores'))} cores"
                + "".join(f"; {r}" for r in sc.get("reasons") or ()),
            )
        )
    for p in info.get("problems") or []:
        facts.append(("problem", p))
    out.append("#### Workload as run\n\n" + md_table(("", ""), facts))
    cm = a.metrics
    out.append("\n#### Request metrics\n\n")
    out.append(
        f"{cm.n_ok} of {cm.n_requests} measured requests succeeded"
        f"{f' ({cm.n_warmup} warm-ups excluded)' if cm.n_warmup else ''}; percentiles: "
        f"{PERCENTILE_METHOD}.\n\n"
    )
    rows = dist_rows(a)
    if rows:
        out.append(md_table(("metric", "n", "mean", "p50", "p90", "p95", "p99", "max"), rows))
    thr = [
        ("output tok/s", cm.output_tok_s),
        ("input tok/s", cm.input_tok_s),
        ("requests/s", cm.request_s),
        ("success fraction", cm.success_fraction),
        ("server prefill tok/s", cm.server_prefill_tok_s),
        ("server decode tok/s", cm.server_decode_tok_s),
        ("speculative acceptance", cm.spec_acceptance),
    ]
    thr = [(k, v) for k, v in thr if v is not None]
    if thr:
        out.append("\n" + md_table(("throughput", "value"), thr))
    out.append("\n#### Hardware\n\n")
    key = key_hw_rows(a.hw)
    out.append(
        md_table(("node", "device", "metric", "value", "unit"), key)
        if key
        else "No telemetry samples in this window.\n"
    )
    out.append("\nEvery series and statistic: `case_hw_summary.csv` (window = case id).\n")
    out.append("\n#### Energy\n\n")
    if a.energy is not None:
        e = a.energy
        out.append(
            md_table(
                ("", ""),
                [
                    ("GPU energy (J)", e.joules),
                    ("GPUs", e.n_gpus),
                    ("J per output token", e.j_per_output_token),
                    ("J per request", e.j_per_request),
                    ("least window coverage", e.min_coverage),
                ],
            )
        )
    else:
        out.append("Not measured (no NVML energy counter in this window).\n")
    out.append("\n#### Verdict\n\n" + verdict_md(a.verdict))
    if a.rails is not None and a.rails.findings:
        out.append("\n#### Rails, links and peers\n\n" + rails_md(a.rails))
    plot = d.case_plots.get(a.case_id)
    out.append("\n#### Timeline\n\n")
    if plot is not None:
        name, omitted = plot
        if name:
            out.append(f"![{a.case_id} timeline](plots/{name})\n")
        if omitted:
            out.append("\nPanels left out (no data): " + "; ".join(omitted) + ".\n")
    return "".join(out)


def ab_section(d: ReportData) -> str:
    if not d.ab:
        return "\n## A/B comparisons\n\nNo case of this run carries an `ab_group`.\n"
    out = [
        "\n## A/B comparisons\n\nMedians per arm; delta = treatment - control with a 95% "
        "bootstrap interval (2000 resamples, seed 0); p = two-sided Mann-Whitney.\n"
    ]
    for g in d.ab:
        arms = ", ".join(f"{arm} ({', '.join(f'`{c}`' for c in cases)})" for arm, cases in g.arms)
        out.append(f"\n### {g.group}: {arms}\n\n")
        if g.deltas:
            out.append(
                md_table(
                    (
                        "treatment",
                        "metric",
                        "n",
                        "control",
                        "treatment median",
                        "delta",
                        "95% interval",
                        "change",
                        "p",
                    ),
                    [
                        (
                            x.treatment_arm,
                            f"{x.metric} ({x.unit})",
                            f"{x.n_control}/{x.n_treatment}",
                            x.control_median,
                            x.treatment_median,
                            x.delta,
                            f"{md_num(x.lo)} .. {md_num(x.hi)}" if x.lo is not None else "-",
                            None if x.rel is None else f"{x.rel * 100:+.1f}%",
                            x.p_value,
                        )
                        for x in g.deltas
                    ],
                )
            )
        else:
            out.append("Only one arm ran.\n")
        if g.pairs:
            out.append(
                "\n#### Same output, request by request\n\n"
                "Server-process deltas around each request, for outputs both arms "
                "produced (median per arm, control -> treatment).\n\n"
            )
            out.append(
                md_table(
                    (
                        "treatment",
                        "output sha256",
                        "requests",
                        "CPU s",
                        "MB read",
                        "major faults",
                        "e2e ms",
                        "shared",
                    ),
                    [
                        (
                            p.treatment_arm,
                            f"`{p.sha}`",
                            f"{p.n_control}/{p.n_treatment}",
                            fmt_pair(p.control["proc_cpu_s"], p.treatment["proc_cpu_s"]),
                            fmt_pair(p.control["proc_read_mb"], p.treatment["proc_read_mb"]),
                            fmt_pair(
                                p.control["proc_major_faults"], p.treatment["proc_major_faults"]
                            ),
                            fmt_pair(p.control["e2e_ms"], p.treatment["e2e_ms"]),
                            "yes" if p.shared else "no",
                        )
                        for p in g.pairs
                    ],
                )
            )
            if any(p.shared for p in g.pairs):
                out.append(
                    "\nShared: other requests were in flight, so a request's process "
                    "deltas include their work too.\n"
                )
    return "".join(out)


def run_timeline(d: ReportData) -> str:
    out = ["\n## Run timeline\n\n"]
    if d.run_plot is None:
        return out[0] + "No run window was marked.\n"
    name, omitted = d.run_plot
    if name:
        out.append(f"![run timeline](plots/{name})\n")
    if omitted:
        out.append("\nPanels left out (no data): " + "; ".join(omitted) + ".\n")
    return "".join(out)


def thresholds_section() -> str:
    return (
        "\n## Thresholds\n\nEvery number the rules compare against "
        "(`strata_plugin/analysis/rules.py`, `THRESHOLDS`).\n\n"
        + md_table(
            ("name", "value", "unit", "source"),
            [(t.name, t.value, t.unit, t.source) for t in THRESHOLDS],
        )
    )


def render(d: ReportData) -> str:
    parts = [header(d), limits(d), summary_table(d), "\n## Cases\n"]
    parts.extend(case_section(d, a) for a in d.analyses)
    parts.extend([ab_section(d), diagnostic_section(d.bundle.run_dir, d.analyses),
                  run_timeline(d), thresholds_section()])
    return "".join(parts)
