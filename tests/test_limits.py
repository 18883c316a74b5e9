"""The input limits are stated once (strata_plugin/limits.py) and the docs print them: the
table in docs/writing-cases.md ("Input limits") has one row per limit with its value, the
pages of the parts that enforce one name it, and the prepared-memory estimate that
PREPARED_BYTES_MAX is checked against still matches what building a phase takes."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import pytest
import requests

from strata_plugin import limits
from strata_plugin.limits import LIMITS, limit, prepared_bytes

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _rows(page: str) -> dict[str, str]:
    text = (DOCS / page).read_text()
    section = text[text.index("## Input limits"):]
    section = section[: section.index("\n## ", 5)]
    out = {}
    for line in section.splitlines():
        m = re.match(r"\| `([A-Z_]+)` \| ([^|]+) \|", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def test_the_docs_table_has_every_limit_with_its_value_and_no_other():
    rows = _rows("writing-cases.md")
    assert list(rows) == [lim.name for lim in LIMITS]
    for lim in LIMITS:
        assert rows[lim.name].startswith(lim.shown()), (lim.name, rows[lim.name])


def test_every_limit_is_a_module_constant_of_that_value():
    for lim in LIMITS:
        assert getattr(limits, lim.name) == lim.value, lim.name
        assert lim.reason and lim.where and lim.unit
    with pytest.raises(KeyError, match="no limit 'MAX_NOTHING'; the limits are MAX_ISL"):
        limit("MAX_NOTHING")


@pytest.mark.parametrize("page, names", [
    ("client.md", ("EVENTS_PER_TOKEN", "too_many_events")),
    ("agent.md", ("PROM_BODY_BYTES_MAX", "no samples: /metrics body exceeded")),
    ("formats.md", ("strata_plugin/limits.py",)),
])
def test_the_pages_of_the_parts_that_enforce_a_limit_name_it(page, names):
    text = (DOCS / page).read_text()
    for name in names:
        assert name in text, (page, name)


@pytest.mark.parametrize("isl, n", [(16, 400), (1024, 60), (16384, 6)])
def test_the_prepared_estimate_is_within_a_quarter_of_what_a_phase_takes(isl, n):
    """build_specs + Attempt for ``n`` requests, counted by tracemalloc as when the
    coefficients were fitted: the estimate stays within 25% (a phase past
    PREPARED_BYTES_MAX is refused on the estimate, so it must hold)."""
    from strata_plugin.load.case_runner import CaseSetup, build_specs
    from strata_plugin.load.client import Timeouts
    from strata_plugin.load.client.attempt import Attempt
    from strata_plugin.load.workload import TokenSpace, Workload

    setup = CaseSetup("http://127.0.0.1:9", "completions", "c", TokenSpace(300, 1000),
                      Timeouts())
    w = Workload("m", isl=isl, osl=16, requests=n)
    with requests.Session() as session:
        tracemalloc.start()
        try:
            specs = build_specs(w, setup, "c", "measured", n, 0)
            attempts = [Attempt(session, setup.base_url, "completions", s, 0, setup.timeouts,
                                {}) for s in specs]
            used = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert len(attempts) == n
    estimate = prepared_bytes(n, isl)
    assert 0.75 * used <= estimate <= 1.25 * used, (used / n, estimate / n)
