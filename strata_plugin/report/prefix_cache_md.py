"""report.md's prefix-cache section: cached prompt tokens per case, from the engine.

The hit rate is the engine's own count of prompt tokens served from its cache
(``usage.prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``) over
all prompt tokens of the successful measured requests; shown only where the engine
reports cached tokens for every one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.report.fmt import md_num
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Prefix cache"


def section(analyses: Sequence[CaseAnalysis]) -> str:
    rows = []
    for a in analyses:
        cm = a.metrics
        if not cm.total_prompt_tokens or cm.total_cached_tokens is None:
            continue
        rows.append((f"`{a.case_id}`", a.params.get("prefix", a.params.get("arrival", "-")),
                     cm.n_ok, cm.total_prompt_tokens, cm.total_cached_tokens,
                     f"{md_num(100 * cm.total_cached_tokens / cm.total_prompt_tokens)}%"))
    if not rows:
        return ""
    return (f"\n## {TITLE}\n\nPrompt tokens the engine served from its prefix cache, "
            "as it reports them, over all prompt tokens of the successful measured "
            "requests. A cold case should show 0; shared-prefix cases and traces with "
            "shared blocks show what the cache saved.\n\n"
            + md_table(("case", "prefix / arrival", "requests", "prompt tokens",
                        "cached tokens", "hit rate"), rows))


def report_section(d: ReportData) -> str:
    return section(d.analyses)
