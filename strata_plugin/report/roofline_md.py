"""report.md's roofline section: each case's headline phase against its device's limit
(achieved, limit, share, which roof), then the model's facts and the device's peaks with
where each came from. Left out for a run that recorded no facts (made before Strata read
them): there is nothing to hold the cases against.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from strata_plugin.analysis.case_summary import CaseAnalysis, RunContext
from strata_plugin.analysis.device_limits import DeviceLimits, Peak
from strata_plugin.analysis.roofline import PhaseRoof, RooflineInputs
from strata_plugin.configure.model_facts import FACTS
from strata_plugin.formats.printable import printable
from strata_plugin.report.fmt import md_num, share_pct_sig
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Roofline"


def rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "B/s":
        return f"{md_num(x / 1e9)} GB/s"
    if unit == "FLOP/s":
        return f"{md_num(x / 1e9)} GFLOP/s"
    return f"{md_num(x)} {unit}"


def phase_row(case: str, p: PhaseRoof) -> tuple[str, ...]:
    roof = f"{p.roof} ({p.memory_level})" if p.roof == "memory" else p.roof or "-"
    other = p.bytes_share if p.roof == "compute" else p.flops_share
    return (case, p.phase, rate(p.achieved, p.unit) if p.roof else "-",
            rate(p.limit, p.unit) if p.roof else "-", share_pct_sig(p.share), roof,
            share_pct_sig(other),
            md_num(p.intensity), md_num(p.balance),
            md_num(p.batch_mean) if p.batch_mean is not None else "-", p.clock)


def cases_table(analyses: Sequence[CaseAnalysis]) -> str:
    rows, missing = [], []
    notes: dict[str, list[str]] = {}
    for a in analyses:
        r = a.roofline
        if r is None:  # the run recorded facts, but none under this case's configuration
            missing.append(f"- `{a.case_id}`: no model facts or device limits were recorded "
                           f"for its configuration `{printable(a.config_id)}`")
            continue
        h = r.headline
        if h is None or h.roof == "":
            missing.append(f"- `{a.case_id}`: "
                           f"{printable(r.unavailable or 'no peak of this device known')}")
            continue
        rows.append(phase_row(f"`{a.case_id}`", h))
        for n in (*r.notes, *h.notes):
            notes.setdefault(n, []).append(a.case_id)
    out = ""
    if rows:
        out += md_table(("case", "phase", "achieved", "limit", "share", "roof",
                         "share of the other roof", "FLOPs/byte", "balance",
                         "batch (decode)", "clock"), rows)
    if notes:
        out += "\n" + "".join(
            f"- {printable(n)} "
            f"({'every case' if len(cs) == len(rows) else ', '.join(f'`{c}`' for c in cs)})\n"
            for n, cs in notes.items())
    if missing:
        out += "\nNo row:\n\n" + "\n".join(missing) + "\n"
    return out


def _peak_row(p: Peak) -> tuple[str, ...]:
    if p.value is None:
        return (p.what or "-", "UNAVAILABLE", "-", p.unavailable)
    return (p.what, rate(p.value, p.unit), p.basis, p.source)


def limits_table(lim: DeviceLimits) -> str:
    peaks = [lim.bandwidth, *([lim.cache_bandwidth] if lim.cache_bandwidth else []),
             lim.flops, *lim.links]
    extra = (f"Last-level cache: {md_num(lim.cache_bytes / 2**20)} MiB.\n\n"
             if lim.cache_bytes else "")
    notes = "".join(f"\n- {printable(n)}" for n in lim.notes) + ("\n" if lim.notes else "")
    return (f"Device: {printable(lim.device)}.\n\n{extra}"
            + md_table(("peak", "value", "basis", "source"), [_peak_row(p) for p in peaks])
            + notes)


def facts_table(ctx: RunContext) -> str:
    """Each distinct (model, device) once, with the configurations that share it."""
    groups: dict[str, list[str]] = {}
    first: dict[str, RooflineInputs] = {}
    for cid, inp in sorted(ctx.roofline.items()):
        key = json.dumps([inp.model.to_json(), inp.limits.to_json() if inp.limits else
                          inp.why_no_limits], sort_keys=True)
        groups.setdefault(key, []).append(cid)
        first.setdefault(key, inp)
    out = []
    for key, cids in groups.items():
        inp = first[key]
        m = inp.model
        where = printable(f"`{m.path}` ({m.format}, located by {m.located_by or '-'})"
                          if m.path else f"not found ({m.located_by or '-'})")
        rows = []
        for name, meaning in FACTS:
            f = m.fact(name)
            rows.append((name, md_num(f.value) if isinstance(f.value, (int, float))
                         and not isinstance(f.value, bool) else str(f.value)
                         if f.value is not None else "UNAVAILABLE",
                         f.source if f.value is not None else f.unavailable, meaning))
        names = ", ".join(f"`{c}`" for c in cids)
        out.append(f"\n### Configuration{'s' if len(cids) > 1 else ''} {names}\n\n"
                   f"Model: {where}.\n\n"
                   + md_table(("fact", "value", "read from", "meaning"), rows))
        if inp.limits is not None:
            out.append("\n" + limits_table(inp.limits))
        else:
            out.append(f"\nDevice limits: UNAVAILABLE ({printable(inp.why_no_limits)}).\n")
    return "".join(out)


def report_section(d: ReportData) -> str:
    if not d.ctx.roofline:
        return ""
    return (f"\n## {TITLE}\n\nEach case's headline phase (prefill for TTFT cases, decode for "
            "TPOT cases, else the phase that took longer) against the device it ran on: "
            "the achieved rate, the peak of the roof that applies (the compute roof when "
            "the phase's FLOPs per byte exceed the machine balance, else the memory "
            "roof: DRAM or HBM, or on a CPU the last-level cache when the phase's bytes a "
            "step fit in it), and the share. Formulas, assumptions and sources: "
            "docs/roofline.md.\n\n"
            + cases_table(d.analyses)
            + "\n<details><summary>The model's facts and the device's peaks</summary>\n"
            + facts_table(d.ctx) + "\n</details>\n")
