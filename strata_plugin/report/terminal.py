"""The results table the terminal shows at the end of a run (pytest's summary, ``bench``).

A pure function of the analysed cases as ``summary.json`` records them (written by
``report/writer.py`` before the terminal summary runs), so what pytest prints, what
``python -m strata_plugin bench`` prints and what the run folder holds agree. Plain
text, fixed-width columns: it is read in a terminal and in CI logs, not rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strata_plugin.formats.printable import printable
from strata_plugin.report.fmt import md_num, signed_pct_of_points

#: The A/B metrics shown beside the table's own columns (the rest are in report.md).
AB_SHOWN = ("output_tok_s", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")
AB_LABELS = {"output_tok_s": "output tok/s", "ttft_p50_ms": "TTFT p50", "ttft_p95_ms": "TTFT p95",
             "tpot_p50_ms": "TPOT p50", "tpot_p95_ms": "TPOT p95"}
#: A case column wider than this is cut in the middle ("...").
CASE_WIDTH = 60
VERDICT_WIDTH = 50


def _num(x: Any) -> str:
    return md_num(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def _pair(m: Mapping[str, Any], dist: str) -> str:
    a, b = m.get(f"{dist}_p50_ms"), m.get(f"{dist}_p95_ms")
    if a is None and b is None:
        return "-"
    return f"{_num(a)} / {_num(b)}"


def _cut(text: str, width: int) -> str:
    """``text`` within ``width`` (cut in the middle), its controls shown, not obeyed: a
    case id, a verdict and a group name hold a server's or a file's words."""
    text = printable(text)
    if len(text) <= width:
        return text
    keep = width - 3
    return text[: keep // 2] + "..." + text[len(text) - (keep - keep // 2):]


def short_case_ids(case_ids: Sequence[str]) -> dict[str, str]:
    """Case ids without their file path (``cases/test_x.py::test_a[p]`` -> ``test_a[p]``)
    where that stays unique in this run; the full id otherwise."""
    short = {c: c.rsplit("::", 1)[-1] for c in case_ids}
    counts: dict[str, int] = {}
    for s in short.values():
        counts[s] = counts.get(s, 0) + 1
    return {c: (s if counts[s] == 1 else c) for c, s in short.items()}


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _verdict(case: Mapping[str, Any]) -> str:
    v = case.get("verdict") or {}
    text = str(v.get("summary") or "") or "none"
    return _cut(text, VERDICT_WIDTH)


def case_rows(cases: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    names = short_case_ids([str(c.get("case_id", "")) for c in cases])
    rows = []
    for c in cases:
        m = c.get("metrics") or {}
        ok, total = m.get("n_ok"), m.get("n_requests")
        done = f"{_num(ok)}/{_num(total)}" if total is not None else "-"
        if c.get("partial"):  # labelled, its numbers never shown as the case's
            rows.append([_cut(names[str(c.get("case_id", ""))], CASE_WIDTH),
                         _cut("partial: the case did not finish", VERDICT_WIDTH), done,
                         "-", "-", "-"])
            continue
        rows.append([
            _cut(names[str(c.get("case_id", ""))], CASE_WIDTH), _verdict(c), done,
            _num(m.get("output_tok_s")), _pair(m, "ttft"), _pair(m, "tpot")])
    return rows


def _interval(e: Mapping[str, Any]) -> str:
    lo, hi = e.get("ci_lo_pct"), e.get("ci_hi_pct")
    if lo is None or hi is None:
        return f"no interval ({e.get('n_control')}/{e.get('n_treatment')} {e.get('unit')}s)"
    level = e.get("level")
    lvl = f"{float(level) * 100:g}% " if isinstance(level, (int, float)) else ""
    return (f"[{lo:+.1f}%, {hi:+.1f}%] {lvl}{e.get('method') or 'interval'}, "
            f"{e.get('n_control')}/{e.get('n_treatment')} {e.get('unit')}s")


def ab_rows(ab: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per A/B group, treatment arm and shown metric: change and interval."""
    rows = []
    for g in ab:
        for ae in g.get("effects") or ():
            arms = f"{ae.get('treatment_arm')} vs {ae.get('control_arm')}"
            by_metric = {e.get("metric"): e for e in ae.get("effects") or ()}
            for metric in AB_SHOWN:
                e = by_metric.get(metric)
                if e is None:
                    continue
                change = e.get("change_pct")
                rows.append([printable(g.get("group", "")), printable(arms), AB_LABELS[metric],
                             signed_pct_of_points(change), _interval(e)])
    return rows


def results_table(summary: Mapping[str, Any], report_path: str) -> str:
    """The run's results as terminal text: one row per case, then the A/B effects,
    then where the report is. ``summary``: the content of ``summary.json``."""
    cases = list(summary.get("cases") or ())
    out: list[str] = []
    if cases:
        out += _grid(("case", "verdict", "ok/total", "output tok/s", "TTFT p50/p95 ms",
                      "TPOT p50/p95 ms"), case_rows(cases), right={2, 3, 4, 5})
    else:
        out.append("no case was measured")
    ab = ab_rows(summary.get("ab") or ())
    if ab:
        out += ["", "A/B effects (treatment against control; change of the arm's value, "
                "interval over repetitions):"]
        out += _grid(("group", "arms", "metric", "change", "interval"), ab, right={3})
    out += ["", f"report: {report_path}"]
    return "\n".join(out) + "\n"


def run_results(run_dir: Path) -> str | None:
    """:func:`results_table` of a run folder whose report was written, else None."""
    import json

    summary, report = run_dir / "summary.json", run_dir / "report.md"
    if not (summary.is_file() and report.is_file()):
        return None
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return None
    return results_table(data, str(report)) if isinstance(data, dict) else None
