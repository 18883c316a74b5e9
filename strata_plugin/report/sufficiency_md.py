"""report.md's word on sample sufficiency: under each case's percentiles, and a table.

Which percentile rests on enough requests to mean what it says (analysis/sufficiency.py),
so a p99 from 40 requests reads as "too few", not as a tail latency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from strata_plugin.analysis.sufficiency import (
    REPORTED_PERCENTILES,
    SUPPORT_CONFIDENCE,
    PercentileSupport,
    min_count,
)
from strata_plugin.report.fmt import md_num
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import TOO_FEW, md_table

TITLE = "Sample sufficiency"
ANCHOR = "sample-sufficiency"


def _conf(c: float) -> str:
    return f"{100 * c:g}%"


def case_line(supports: Sequence[PercentileSupport]) -> str:
    """One line under a case's percentile table: which percentiles its counts support."""
    if not supports:
        return ""
    c = supports[0].confidence
    by_q: dict[float, list[PercentileSupport]] = {}
    for s in supports:
        by_q.setdefault(s.percentile, []).append(s)
    ok, short = [], []
    for _q, ss in sorted(by_q.items()):
        worst = min(ss, key=lambda s: s.n)  # support grows with the count
        if worst.supported:
            ok.append(worst.label())
        else:
            short.append(f"{worst.label()} (n={worst.n}, needs {worst.needed})")
    text = f"Sample sufficiency at {_conf(c)} confidence ([how](#{ANCHOR})): "
    text += ("supported: " + ", ".join(ok)) if ok else "no percentile supported"
    if short:
        text += (f"; **too few requests** ({TOO_FEW} in the table) for " + ", ".join(short)
                 + ": read them as a bound on what was seen, not as the server's percentile")
    return text + ".\n"


def section(by_case: Mapping[str, Sequence[PercentileSupport]]) -> str:
    """One row per case and metric: its count, and each percentile supported or not."""
    qs: list[float] = []
    groups: dict[tuple[str, str], list[PercentileSupport]] = {}
    conf = SUPPORT_CONFIDENCE
    for cid, supports in by_case.items():
        for s in supports:
            conf = s.confidence
            groups.setdefault((cid, s.metric), []).append(s)
            if s.percentile not in qs:
                qs.append(s.percentile)
    rows = []
    for (cid, metric), ss in groups.items():
        cells = {s.percentile: (f"yes, <= {md_num(s.upper)}" if s.supported else "**too few**")
                 for s in ss}
        rows.append((f"`{cid}`", metric, ss[0].n, *(cells.get(q, "-") for q in qs)))
    needs = ", ".join(f"p{q:g} {min_count(q, conf)}" for q in REPORTED_PERCENTILES)
    out = [f'\n## {TITLE} <a id="{ANCHOR}"></a>\n\n',
           f"A percentile is supported when the requests it rests on (successful, measured) "
           f"are enough for one of them to bound it from above at {_conf(conf)} confidence, "
           f"whatever the distribution (order statistics: the number of requests below the "
           f"true q-quantile is Binomial(n, q)), as MLPerf LoadGen's early stopping reasons. "
           f"That takes {needs} requests. A supported cell gives that upper bound (ms, an "
           f"order statistic of the sample); a p99 marked too few is the tail of what was "
           f"seen, not the server's p99 (`strata.run(..., until=SampleTarget(...))` runs a "
           f"case until its percentiles are supported). Chunk gaps are left out: the gaps "
           f"of one stream are not independent draws.\n\n"]
    if rows:
        out.append(md_table(("case", "metric", "n", *(f"p{q:g}" for q in qs)), rows))
    else:
        out.append("No measured requests.\n")
    return "".join(out)


def report_section(d: ReportData) -> str:
    return section(d.sufficiency)
