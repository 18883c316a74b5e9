"""report.md: the run, its limits, each case (workload, metrics, hardware, verdict,
plots), the A/B comparisons, and a link to the thresholds the verdicts used
(``thresholds.md``, rendered here too).

Pure text assembly from already-computed results; nothing here reads files or the
clock, so the same inputs always give the same document. The sections and their order
are ``report/sections.py``'s list; ``report/writer.py`` reads the run folder and builds
the :class:`ReportData` (``report/report_data.py``) they all render from.
"""

from __future__ import annotations

import html
import shlex
from typing import Any

from strata_plugin.analysis.ab_groups import ArmEffects
from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.analysis.metrics import (
    AB_HEADLINE,
    PERCENTILE_METHOD,
    metric_label,
)
from strata_plugin.analysis.rails import RailsReport
from strata_plugin.analysis.request_values import unit
from strata_plugin.analysis.rules import Verdict
from strata_plugin.analysis.thresholds import all_thresholds
from strata_plugin.formats.printable import printable
from strata_plugin.report import load_spread
from strata_plugin.report.fmt import md_num, signed_pct_of_points
from strata_plugin.report.report_data import AbGroup, ReportData
from strata_plugin.report.tables import (
    TOO_FEW,
    dist_rows,
    fmt_pair,
    key_hw_rows,
    md_table,
    pct_cell,
    short_percentiles,
)


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
    rows += path_rows(m)
    reason = _incomplete(d)
    if reason:
        rows.append(("incomplete", reason))
    return f"# Strata report: {d.bundle.run_id}\n" + first_lines(d) + md_table(("", ""), rows)


def path_rows(manifest: dict) -> list[tuple[str, str]]:
    """The request's way to an attached server, per block (run/listener.py): the URL's
    listener, each proxy and the engine, by address, PID and command; what cannot be
    observed (another host, another user's process) said in the same line."""
    from strata_plugin.formats.request_path import paths_in

    paths = paths_in(manifest)
    many = len(paths) > 1
    return [(f"request path ({block})" if many else "request path", p.line())
            for block, p in sorted(paths.items())]


def _incomplete(d: ReportData) -> str:
    """Why the run is incomplete ("" when it is not): the outcome the report was given
    (formats/outcome.py), else the manifest's words."""
    o = d.bundle.outcome
    if o is not None:
        return o.words
    return str(d.bundle.manifest.get("incomplete_reason") or "")


def first_lines(d: ReportData) -> str:
    """What went wrong, before anything else: the run's incomplete reason (a server that
    could not be reached, an interrupt) and each case whose requests mostly failed."""
    from strata_plugin.analysis.failures import VERDICT_CLASS

    reason = _incomplete(d)
    lines = [f"**Run incomplete:** {printable(reason)}"] if reason else []
    lines += [f"**{VERDICT_CLASS}** in `{a.case_id}`: {printable(a.verdict.notes[0])}"
              for a in d.analyses if a.verdict.classes == (VERDICT_CLASS,) and a.verdict.notes
              and a.case_id not in reason]
    lines += [f"**Engine died:** {printable(line)}" for line in _engine_deaths(d)]
    return "".join(f"\n{line}\n" for line in lines) + ("\n" if lines else "")


def _engine_deaths(d: ReportData) -> list[str]:
    """Each followed engine that died (markers.csv's engine events), when into which case,
    how, who took over its port, and the failed requests tied to it."""
    from strata_plugin.analysis.failures import engine_outages
    from strata_plugin.formats.engine_events import engine_events

    events = engine_events(d.bundle.markers)
    if not events:
        return []
    records = [r for recs in d.bundle.records.values() for r in recs]
    cases = sorted((m for m in d.bundle.markers if m.kind == "case"),
                   key=lambda m: m.start_wall_ns)
    out = []
    for o in engine_outages(events, records, d.bundle.anchor):
        t = o.died.wall_ns
        # the case it died in (warm-ups included), else the last one begun before it
        case = next((m for m in cases if m.start_wall_ns <= t <= m.end_wall_ns), None) or next(
            (m for m in reversed(cases) if m.start_wall_ns <= t), None)
        out.append(o.line(case.case_id or case.name, case.start_wall_ns) if case else o.line())
    return out


def run_details(d: ReportData) -> str:
    """Servers, nodes, versions and collectors: collapsed, for whoever needs them."""
    m = d.bundle.manifest
    out = ["\n<details><summary>Servers, nodes, versions, collectors</summary>\n"]
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
    out.append("\n</details>\n")
    return "".join(out)


def _deciding(v: Verdict) -> str:
    """The one piece of evidence that decided the verdict, in a few words."""
    if v.inconclusive:
        return printable((v.notes[-1] if v.notes else "inconclusive")[:160])
    if v.classes == ("requests_failed",) and v.notes:  # analysis/failures.py: its counts
        return printable(v.notes[0][:300])
    parts = [v.lead] if v.lead else []
    for cls in v.classes[len(parts):]:
        e = next((e for e in v.evidence if e.cls == cls and e.met), None)
        if e is not None:
            parts.append(f"{e.metric} {md_num(e.value)} {e.op} {md_num(e.threshold_value)} "
                         f"{e.unit}" + (f" ({e.detail})" if e.detail else ""))
    return "; ".join(parts) or "; ".join(
        x for x in ("no rule past its threshold", v.spare) if x)


def _geo(xs: list[float]) -> float | None:
    import math

    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _vs_control(d: ReportData) -> dict[str, str]:
    """case id -> its output tok/s and TPOT p95 change against its A/B control."""
    out = {}
    for g in d.ab:
        for ae in g.effects:
            ref = [v for arm, _, v in ae.per_repetition if arm == ae.control_arm]
            base = {m: _geo([v[m] for v in ref if m in v]) for m in ("output_tok_s", "tpot_p95_ms")}
            for arm, cid, v in ae.per_repetition:
                if arm == ae.control_arm:
                    out[cid] = f"{arm} (reference)"
                    continue
                parts = [
                    f"{label} {100 * (v[m] / b - 1):+.1f}%"
                    for m, label in (("output_tok_s", "tok/s"), ("tpot_p95_ms", "TPOT p95"))
                    if m in v and (b := base[m])
                ]
                out[cid] = f"vs {ae.control_arm}: " + ", ".join(parts) if parts else "-"
    return out


def summary_section(d: ReportData) -> str:
    """One line per case: verdict, what decided it, the headline and its change."""
    vs = _vs_control(d)
    rows = []
    for a in d.analyses:
        cm = a.metrics
        head = ", ".join(
            f"{label} {md_num(x)}"
            for label, x in (("output tok/s", cm.output_tok_s),
                             ("TPOT p95 ms", pct_cell(cm.tpot.p95, cm.tpot.n, "p95")),
                             ("TTFT p95 ms", pct_cell(cm.ttft.p95, cm.ttft.n, "p95")))
            if x is not None
        )
        if a.partial:  # labelled, never a headline
            rows.append((f"[`{a.case_id}`](#{_anchor(a)})", f"partial: {a.partial}", "-",
                         "- (partial case: no headline)", "-"))
            continue
        rows.append((f"[`{a.case_id}`](#{_anchor(a)})", a.verdict.summary() or "none",
                     _deciding(a.verdict), head or "-", vs.get(a.case_id, "-")))
    return "\n## Summary\n\n" + md_table(
        ("case", "verdict", "decided by", "headline", "change"), rows
    ) + _too_few_note(d.analyses)


def _too_few_note(analyses: list[CaseAnalysis]) -> str:
    if not any(isinstance(c, str) and TOO_FEW in c for a in analyses for c in
               (pct_cell(a.metrics.tpot.p95, a.metrics.tpot.n, "p95"),
                pct_cell(a.metrics.ttft.p95, a.metrics.ttft.n, "p95"),
                pct_cell(a.metrics.ttft.p99, a.metrics.ttft.n, "p99"))):
        return ""
    return (f"\n{TOO_FEW}: too few requests to support this percentile at 99% confidence "
            "([sample sufficiency](#sample-sufficiency)): the tail of what was seen, not the "
            "server's percentile.\n")


def static_section(d: ReportData) -> str:
    """Each node's static snapshots (before and after the run, ``nodes/<node>/static``)
    and the error counters that moved between them."""
    out = ["\n## Environment (static snapshots)\n\n"]
    if not d.static:
        return out[0] + "\nNo static snapshot in this run folder.\n"
    rows = []
    for n in d.static:
        f = n.facts
        rows.append((
            n.node, "yes" if n.before else "MISSING", "yes" if n.after else "MISSING",
            f.get("kernel") or "-", f.get("cpu") or "-",
            f"{f.get('gpus')} (driver {f.get('driver')})" if f.get("gpus") else "none",
            ", ".join(f.get("nics") or []) or "-", ", ".join(f.get("rdma_ports") or []) or "-",
            "; ".join(f"{k}: {v}" for k, v in sorted(n.errors.items())) or "none"))
    out.append(md_table(("node", "before", "after", "kernel", "CPU", "GPUs", "NICs",
                         "RDMA ports", "not captured"), rows))
    for n in d.static:
        if n.facts.get("container"):
            out.append(f"\nThe server on {n.node} ran in a {n.facts['container']}.\n")
    moved = [m for n in d.static for m in n.moved]
    out.append("\nCounters that should not move (NIC and RDMA errors and drops, link state, "
               "GPU ECC errors, retired pages, remapped rows), after minus before: ")
    compared = [n.node for n in d.static if n.before and n.after]
    if moved:
        out.append("**moved**:\n\n" + "".join(f"- {m.line()}\n" for m in moved))
    elif compared:
        out.append(f"none moved on {', '.join(compared)}.\n")
    else:
        out.append("not compared (a snapshot is missing).\n")
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
                pct_cell(cm.ttft.p99, cm.ttft.n, "p99"),
                cm.tpot.p50,
                cm.output_tok_s,
                a.energy.j_per_output_token if a.energy else None,
                f"partial: {a.verdict.summary() or '-'}" if a.partial
                else a.verdict.summary() or "-",
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


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        host = urlsplit(str(url)).hostname or ""
    except ValueError:
        return False
    return host in ("localhost", "0.0.0.0", "::") or host.startswith("127.") or host == "::1"


def target_lacks(d: ReportData) -> dict[str, str]:
    """Collectors (and engine metrics) this target could not have had, with why: network
    signals where one node serves the client over loopback, an engine metric its
    /metrics does not export (it was scraped, the metric was not in it). Their signals are
    not listed as "not measured": nothing here could have measured them."""
    out: dict[str, str] = {}
    servers = d.bundle.manifest.get("servers") or {}
    urls = [s.get("base_url", "") for s in servers.values() if isinstance(s, dict)]
    if not d.ctx.multi_node and urls and all(_loopback(u) for u in urls):
        out["net"] = "one node, the server reached over loopback"
    prom = {k.metric for k in d.store.keys if k.source == "prom"}
    if prom:
        out["prom"] = "the engine's /metrics does not export it"
        out["prom_metrics"] = " ".join(sorted(prom))
    return out


def _could_have(line: str, lacks: dict[str, str]) -> str | None:
    """None where this target could have had the signal of a "not measured" line, else why
    not (``line``: ``signal <- collector:metric/metric (reason)``)."""
    src = line.split(" <- ", 1)[1] if " <- " in line else ""
    collector, _, metrics = src.partition(":")
    if collector == "net" and "net" in lacks:
        return lacks["net"]
    if collector == "prom" and "prom" in lacks:
        names = metrics.split(" ", 1)[0].split("/")
        if not set(names) & set(lacks["prom_metrics"].split()):
            return lacks["prom"]
    return None


def verdict_md(v: Verdict, lacks: dict[str, str] | None = None) -> str:
    lines = []
    head = " + ".join(v.classes) if v.classes else "no class"
    tag = "inconclusive: " if v.inconclusive else ""
    lines.append(f"**{tag}{head}** (confidence {md_num(v.confidence)}, {v.confidence_label})\n")
    if v.lead:
        lines.append(f"\nWhere the time went: {v.lead}.\n")
    elif v.spare:
        lines.append(f"\nSpare capacity: {v.spare}.\n")
    if v.modifiers:
        lines.append(f"\nModifier: {', '.join(v.modifiers)}.\n")
    if v.also_flagged:
        lines.append(f"\nAlso past threshold: {', '.join(v.also_flagged)}.\n")
    if v.background:  # a fact about the host beside the classes, never a lower rank
        lines.append(
            f"\nPresent before the run (past threshold in the idle baseline too; ranked "
            f"by this case's own figures): {', '.join(v.background)}; appeared with the "
            f"load: {', '.join(v.appeared_with_load) or 'none'}.\n"
        )
    if v.baseline_unfelt:
        lines.append(
            f"\nIn the idle baseline, not felt by this case (past threshold before the "
            f"run; here not past threshold, or under ledger_second_min_share of its "
            f"metric): {', '.join(v.baseline_unfelt)}.\n"
        )
    for n in v.notes:
        lines.append(f"\n- {printable(n)}")
    if v.notes:
        lines.append("\n")
    named = [e for e in v.evidence if e.detail and e.met]
    if named:  # the actors behind the numbers: the allowance, the other processes
        lines.append("\n")
        lines.extend(f"- `{e.cls}`: {printable(e.detail)}\n" for e in named)
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
    could = [m for m in v.missing_signals if _could_have(m, lacks or {}) is None]
    beyond = [(m.split(" <- ", 1)[0], _could_have(m, lacks or {})) for m in v.missing_signals
              if m not in could]
    if could:
        lines.append("\nNot measured (rules that needed these did not decide):\n\n")
        lines.extend(f"- {m}\n" for m in could)
    if beyond:
        lines.append("\nNot available from this target: " + "; ".join(
            f"{name} ({why})" for name, why in beyond) + ".\n")
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
    if a.partial:
        facts.append(("PARTIAL", f"{a.partial}; its numbers describe the part that ran"))
    if info.outcome:
        facts.append(("outcome", info.outcome))
    if info.ab_group:
        facts.append(("A/B", f"{info.ab_group} / {info.ab_arm or ''}"))
    if a.window is not None:
        facts.append(("measured window", f"{md_num(a.window.duration_s)} s"))
    else:
        facts.append(("measured window", "not marked: no hardware summary"))
    facts.extend((f"param `{k}`", v) for k, v in sorted(a.params.items()))
    if info.scaled_from:
        scaled = ", ".join(f"{k}={v}" for k, v in sorted(info.scaled_from.items()))
        facts.append(("scaled from", scaled))
    sc = info.self_check or {}
    if sc:
        facts.append(
            (
                "client self-check",
                f"client_bound={sc.get('client_bound')}, lateness p99 "
                f"{md_num(sc.get('dispatch_lateness_p99_ms'))} ms"
                + (f" ({md_num(100 * sc['dispatch_delay_share'])}% of the requests' time)"
                   if sc.get("dispatch_delay_share") is not None else "")
                + f", client CPU {md_num(sc.get('client_cpu_cores'))} cores"
                + (f", timing error bound (loop lag p99) {md_num(sc['timing_error_bound_ms'])} ms"
                   f", read backlog p99 {sc.get('read_backlog_p99_bytes')} B"
                   if sc.get("timing_error_bound_ms") is not None else "")
                + "".join(f"; {r}" for r in sc.get("reasons") or ()),
            )
        )
        facts.extend(load_spread.rows(sc))  # processes, hosts, each one's self-check
    if info.isl_note:  # chat prompts or the user's texts (load/chat_prompts.py)
        facts.append(("input lengths", info.isl_note))
    for p in info.problems or ():
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
    out.extend("\n" + note for note in d.case_notes.get(a.case_id, ()))
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
    out.append("\n#### Verdict\n\n" + verdict_md(a.verdict, target_lacks(d)))
    if a.rails is not None and a.rails.findings:
        out.append("\n#### Rails, links and peers\n\n" + rails_md(a.rails))
    plot = d.case_plots.get(a.case_id)
    out.append("\n#### Timeline\n\n")
    if not d.plots:
        out.append(f"Timeline plot: {NO_PLOTS}.\n")
    if (failed := d.plot_failures.get(f"case:{a.case_id}")) is not None:
        out.append(f"Timeline plot: unavailable ({printable(failed)}).\n")
    if plot is not None:
        name, omitted = plot
        if name:
            out.append(f"![{a.case_id} timeline](plots/{name})\n")
        if omitted:
            out.append("\nPanels left out (no data): " + "; ".join(omitted) + ".\n")
    if a.case_id in d.case_traces:
        out.append(f"\n{d.case_traces[a.case_id]}\n")
    return "".join(out)


def ab_effects_md(ae: ArmEffects, case_metrics: dict[str, Any] | None = None) -> str:
    """The seed's metrics per arm: change and interval over repetitions, then each repetition.

    A percentile whose repetitions rest on too few requests each is marked :data:`TOO_FEW`
    (``case_metrics``: case id -> CaseMetrics)."""
    cms = [(case_metrics or {}).get(cid) for cid in (*ae.control_cases, *ae.treatment_cases)]
    short = short_percentiles([cm for cm in cms if cm is not None],
                              [e.metric for e in ae.effects])
    if not ae.effects:
        return f"No repetition of `{ae.treatment_arm}` or `{ae.control_arm}` has metrics.\n"
    e0 = ae.effects[0]
    out = [
        f"**{ae.treatment_arm}** against **{ae.control_arm}**: one value per repetition "
        f"({e0.n_control} {ae.control_arm}, {e0.n_treatment} {ae.treatment_arm}); the arm's "
        "value is the geometric mean of its repetitions; the interval resamples repetitions "
        "(t-interval under 8 a side, else bootstrap).\n\n",
        md_table(
            ("metric", ae.control_arm, ae.treatment_arm, "change", "interval", "interval is"),
            [
                (metric_label(e.metric) + (TOO_FEW if e.metric in short else ""), e.control,
                 e.treatment, signed_pct_of_points(e.change_pct), e.interval, e.interval_label)
                for e in ae.effects
            ],
        ),
    ]
    if short:
        out.append(f"\n{TOO_FEW} each repetition's percentile rests on too few requests to be "
                   "supported at 99% confidence: "
                   + ", ".join(f"{metric_label(k)} n={n}, needs {need}"
                               for k, (n, need) in short.items())
                   + " ([sample sufficiency](#sample-sufficiency)); the change compares the "
                   "tails that were seen.\n")
    metrics = [m for m in AB_HEADLINE if any(m in v for _, _, v in ae.per_repetition)]
    out.append("\n<details><summary>Per repetition</summary>\n\n")
    out.append(
        md_table(
            ("arm", "case", *(metric_label(m) for m in metrics)),
            [(arm, f"`{cid}`", *(v.get(m) for m in metrics)) for arm, cid, v in ae.per_repetition],
        )
    )
    out.append("\n</details>\n")
    return "".join(out)


def interference_md(d: ReportData, g: AbGroup) -> str:
    """Per repetition: the injected prefill, who overlapped it, and what it cost them."""
    by_id = {a.case_id: a for a in d.analyses}
    rows = []
    for arm, cases in g.arms:
        for cid in cases:
            a = by_id.get(cid)
            i = a.interference if a is not None else None
            if i is None or not i.n_decode:
                continue
            rows.append((
                arm,
                f"`{cid}`",
                i.injected_ms,
                i.injected_server_prompt_ms,
                f"{i.n_overlapping}/{i.n_decode}" if i.injected_id else "-",
                i.interference_factor,
                fmt_pair(i.ms_per_token_outside, i.ms_per_token_inside) if i.injected_id else "-",
                i.stall_injected_ms_per_request,
                i.stall_prefill_ms_per_request,
                i.stall_no_prefill_ms_per_request,
                f"{md_num(i.longest_stall_ms)} ({i.longest_stall_during})",
                i.tokens_lost,
            ))
    if not rows:
        return ""
    return (
        "\n#### Interference\n\nThe injected prefill is in flight from its dispatch to "
        "its first token (server prompt ms: llama.cpp `timings.prompt_ms`). A stall is a gap "
        "past 3x the case's median time per token, counted beyond that median, and is "
        "charged to what was in flight: the injected prefill, another request's prefill, "
        "or none (not interference). Interference factor: ms per token in gaps overlapping "
        "the injected prefill over ms per token outside it, minus 1. Tokens lost: what the "
        "load would have produced during the injected prefill at its pace outside it, "
        "minus what it produced.\n\n"
        + md_table(
            ("arm", "case", "injected prefill (ms)", "server prompt (ms)",
             "decode requests overlapping", "interference factor",
             "ms/token outside -> inside", "stall/request: injected (ms)",
             "stall/request: other prefill (ms)", "stall/request: no prefill (ms)",
             "longest stall (ms, during)", "tokens lost"),
            rows,
        )
    )


def ab_section(d: ReportData) -> str:
    if not d.ab:
        return "\n## A/B comparisons\n\nNo case of this run carries an `ab_group`.\n"
    out = ["\n## A/B comparisons\n"]
    for g in d.ab:
        arms = ", ".join(f"{arm} ({', '.join(f'`{c}`' for c in cases)})" for arm, cases in g.arms)
        out.append(f"\n### {g.group}: {arms}\n\n")
        for x in g.expectations:
            out.append(f"**Expectation: {x.outcome}.** {x.line()}\n\n")
        if g.expectations:
            out.append("(An expectation is established when its whole interval lies on the "
                       "expected side of zero, contradicted (the test fails) when on the "
                       "other; in between, repetitions are added up to the bound, then it is "
                       "*not established*: not a failure.)\n\n")
        if not g.effects:
            out.append("Only one arm ran.\n")
        for ae in g.effects:
            out.append(ab_effects_md(ae, {a.case_id: a.metrics for a in d.analyses}))
        if g.plot:
            out.append(
                f"\n![A/B group {g.group}: request timeline, inter-token time, per repetition]"
                f"(plots/{g.plot})\n"
            )
        elif (failed := d.plot_failures.get(f"ab:{g.group}")) is not None:
            out.append(f"\nA/B plot: unavailable ({printable(failed)}).\n")
        elif not d.plots:
            out.append(f"\nA/B plot: {NO_PLOTS}.\n")
        out.append(interference_md(d, g))
        if g.deltas:
            out.append(
                "\n<details><summary>Request by request (requests pooled over repetitions)"
                "</summary>\n\nMedian per arm; change with a 95% bootstrap interval that "
                "resamples requests (2000 resamples, seed 0), which understates the "
                "uncertainty when repetitions differ; p = two-sided Mann-Whitney.\n\n"
            )
            out.append(
                md_table(
                    ("treatment", "metric", "requests", "control median", "treatment median",
                     "change", "95% interval (requests)", "p"),
                    [
                        (
                            x.treatment_arm,
                            f"{x.effect.metric} ({unit(x.effect.metric)})",
                            f"{x.effect.n_control}/{x.effect.n_treatment}",
                            x.effect.control,
                            x.effect.treatment,
                            signed_pct_of_points(x.effect.change_pct),
                            x.effect.interval,
                            x.effect.p_value,
                        )
                        for x in g.deltas
                    ],
                )
            )
            out.append("\n</details>\n")
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


#: ``run_plot``'s note where the run has one case: no second figure of the same seconds.
RUN_PLOT_ONE_CASE = "one case"


#: What stands where a plot would be, in a report written without them.
NO_PLOTS = "not drawn (the report was written with --no-plots)"


def run_timeline(d: ReportData) -> str:
    out = ["\n## Run timeline\n\n"]
    if not d.plots:
        return out[0] + f"Run timeline plot: {NO_PLOTS}.\n"
    if "run" in d.plot_failures:
        return out[0] + f"Run timeline plot: unavailable ({printable(d.plot_failures['run'])}).\n"
    if d.run_plot is None:
        return out[0] + "No run window was marked.\n"
    name, omitted = d.run_plot
    if not name and omitted == [RUN_PLOT_ONE_CASE]:
        return out[0] + ("Not drawn: the run has one case, and its timeline above shows the "
                         "run (all but the idle baseline and cooldown).\n")
    if name:
        out.append(f"![run timeline](plots/{name})\n")
    if omitted:
        out.append("\nPanels left out (no data): " + "; ".join(omitted) + ".\n")
    return "".join(out)


#: The thresholds' own file in the run folder, next to report.md (``report/writer.py``).
THRESHOLDS_FILE = "thresholds.md"


def thresholds_section(d: ReportData) -> str:
    """A link: the table has a file of its own, the same in every run (76 rows that the
    report's reader rarely needs beside each case); the same whatever the run."""
    return (f"\n## Thresholds\n\nThe {len(all_thresholds())} numbers the rules compare against, "
            f"each with its source: [{THRESHOLDS_FILE}]({THRESHOLDS_FILE}).\n")


def thresholds_md() -> str:
    """``thresholds.md``: every number the rules compare against, with its source (the
    rule plugins' after the table's)."""
    return (
        "# Thresholds\n\nEvery number the rules compare against "
        "(`strata_plugin/analysis/thresholds.py`, `THRESHOLDS`), with its source.\n\n"
        + md_table(
            ("name", "value", "unit", "source"),
            [(t.name, t.value, t.unit, t.source) for t in all_thresholds()],
        )
    )


def cases_section(d: ReportData) -> str:
    """Each case in full, collapsed under its verdict."""
    return "\n## Cases\n" + "".join(
        f"\n<details><summary>{html.escape(a.case_id)}: "
        f"{html.escape(a.verdict.summary() or 'none')}</summary>\n"
        + case_section(d, a) + "\n</details>\n"
        for a in d.analyses
    )
