"""report.md's "Diagnostic round" section: before/after verdicts, overhead, key tables.

The traces are read by :func:`prepare`, which the writer calls before rendering
(``report/sections.py``); :func:`report_section` renders what it read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from strata_plugin.analysis.traces.diagnostics import COMPARED, Diagnostic, diagnose
from strata_plugin.report.fmt import md_num, share_pct, signed_pct_of_fraction
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Diagnostic round"


def _verdict_cell(v) -> str:
    return f"{v.summary() or 'none'} ({v.confidence_label}, {v.confidence:.2f})"


def diagnostic_md(d: Diagnostic) -> str:
    st = d.settlement
    out = [f"\n### {d.case_id} (traced repetition: {d.traced_case_id})\n\n"]
    out.append(md_table(
        ("", "verdict", "settled by"),
        [("before (counters)", _verdict_cell(st.before), "-"),
         ("after (with the trace)", _verdict_cell(st.after),
          ", ".join(f"{t} trace" for t in st.settled_by) or "not settled")]))
    rows = []
    for k in COMPARED:
        a, b = d.timed.get(k), d.traced.get(k)
        change = signed_pct_of_fraction((b - a) / a) if a and b is not None else "-"
        rows.append((k, md_num(a) if a is not None else "-",
                     md_num(b) if b is not None else "-", change))
    ov = d.overhead
    out.append("\nTimed vs traced repetition (the timed case's figures never include the "
               "traced one). Trace overhead: "
               + (f"**{ov:.1%}** of output throughput" if ov is not None else "not measured")
               + (f"; {d.capture.get('overruns')} events lost to a full buffer"
                  if d.capture.get("overruns") else "") + ".\n\n")
    out.append(md_table(("figure", "timed", "traced", "change"), rows))
    for dec in st.decisions:
        met = "; ".join(f"{e.metric} {md_num(e.value)} {e.op} {md_num(e.threshold_value)} "
                        f"({e.threshold}: {'met' if e.met else 'not met'})"
                        for e in dec.evidence)
        out.append(f"\n* **{dec.trace} trace** -> {dec.decided or 'neither class it covers'}: "
                   f"{dec.why}. Evidence: {met}.\n")
    for t, why in st.unavailable:
        out.append(f"\n* **{t} trace UNAVAILABLE**: {why}\n")
    if d.sched is not None:
        s = d.sched
        out.append(f"\nScheduling, server threads (CPUs {', '.join(map(str, s.cpus))}; "
                   f"{s.run_s:.3g} s on CPU, {s.wait_s:.3g} s runnable but waiting, "
                   f"{s.blocked_s:.3g} s blocked):\n\n")
        out.append(md_table(("tid", "comm", "run s", "runnable wait s", "blocked (D) s",
                             "sleep s", "preempted"),
                            [tuple(r.values()) for r in s.table()]))
        out.append("\nWho held the server's CPUs while its threads waited:\n\n")
        total = sum(v for _, v in s.displaced_by) or 1.0
        out.append(md_table(("who", "s", "share"),
                            [(k, f"{v:.4g}", f"{v / total:.0%}") for k, v in s.displaced_top]))
    if d.block is not None:
        blk = d.block
        out.append(f"\nBlock I/O and faults by file ({blk.reads} read requests, "
                   f"{blk.read_bytes / 1e6:.3g} MB):\n\n")
        rows = [tuple(r.values()) for r in blk.table()]
        out.append(md_table(("file", "server faults", "read MB", "requests", "p50 ms",
                             "p90 ms", "p99 ms", "max ms", "offset ranges"), rows)
                   if rows else "(no reads in the window)\n")
        out.extend(f"\n* {n}\n" for n in blk.notes)
    if d.net is not None:
        out.append("\nThe benchmark's TCP connections (`ss -ti` samples):\n\n")
        rows = [tuple(r.values()) for r in d.net.table()]
        out.append(md_table(tuple(d.net.table()[0].keys()), rows))
    return "".join(out)


def prepare(d: ReportData, plot_dir: Path) -> list[Diagnostic] | str:
    """The run's diagnostic rounds, read from their trace folders; or why they could not
    be read (the rest of the report stands without this section)."""
    try:
        return diagnose(d.bundle.run_dir, d.analyses)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def section(diags: Sequence[Diagnostic] | str) -> str:
    """Empty when the run had no diagnostic round; ``diags`` a string: why it is not
    rendered."""
    if isinstance(diags, str):
        return f"\n## {TITLE}\n\nnot rendered: {diags}\n"
    if not diags:
        return ""
    head = (f"\n## {TITLE}\n\nCases re-run with a kernel trace over the measured "
            "window (`--strata-escalate`), and the verdict decided again with the trace's "
            "evidence.\n\n")
    summary = md_table(
        ("case", "before", "after", "settled by", "trace overhead"),
        [(d.case_id, d.settlement.before.summary() or "none",
          d.settlement.after.summary() or "none",
          ", ".join(d.settlement.settled_by) or "-",
          share_pct(d.overhead, 1)) for d in diags])
    return head + summary + "".join(diagnostic_md(d) for d in diags)


def report_section(d: ReportData) -> str:
    return section(d.prepared.get(TITLE, ()))
