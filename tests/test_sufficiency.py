"""Sample sufficiency: the order-statistic rule, its boundary, the report's word on it,
and a case run until its percentiles are supported."""

from __future__ import annotations

import functools
import json
import random

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run
from scipy.stats import binom

from strata_plugin import SampleTarget
from strata_plugin.analysis import sufficiency
from strata_plugin.analysis.sufficiency import (
    binom_cdf,
    lower_rank,
    min_count,
    support,
    upper_rank,
)
from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.report import summarize_case, write_report
from tests.sse_script_server import Reply, ScriptServer, Seen, sse


def test_counts_match_loadgen_at_99_percent():
    # MLPerf LoadGen's early stopping: p99 with no over-latency query needs 459 queries.
    assert [min_count(q) for q in (50, 90, 95, 99)] == [7, 44, 90, 459]
    assert min_count(99, 0.95) == 299


def test_p99_boundary_458_vs_459():
    below = support("x", [float(i) for i in range(458)], (99.0,))[0]
    at = support("x", [float(i) for i in range(459)], (99.0,))[0]
    assert not below.supported and below.upper is None and below.needed == 459
    assert at.supported and at.upper == 458.0  # the maximum is the bound at exactly 459


@pytest.mark.parametrize("n, q", [(50, 50.0), (200, 90.0), (1000, 99.0), (3000, 99.0)])
def test_ranks_are_the_tightest_with_their_confidence(n, q):
    p = q / 100
    j = upper_rank(n, q)
    assert binom.cdf(j - 1, n, p) >= 0.99 > binom.cdf(j - 2, n, p)
    k = lower_rank(n, q)
    assert binom.sf(k - 1, n, p) >= 0.99 > binom.sf(k, n, p)
    assert k <= q / 100 * n <= j


def test_binomial_cdf_agrees_with_scipy():
    for n, k, p in [(10, 3, 0.5), (459, 458, 0.99), (2000, 1985, 0.99), (7, 0, 0.5)]:
        assert binom_cdf(k, n, p) == pytest.approx(binom.cdf(k, n, p), rel=1e-9, abs=1e-12)


def test_upper_bound_covers_the_true_quantile_as_stated(monkeypatch):
    """Draws from a known distribution: the bound sits above the true p99 in ~99% of runs."""
    # The ranks depend on n alone (600 every trial): computed once, not 400 times (each
    # is a binary search of exact binomial sums, 4 s in all on 2 cores).
    for rank in ("upper_rank", "lower_rank"):
        monkeypatch.setattr(sufficiency, rank, functools.cache(getattr(sufficiency, rank)))
    rng = random.Random(5)
    true_p99 = -__import__("math").log(0.01)  # Exp(1)
    trials, missed = 400, 0
    for _ in range(trials):
        s = support("x", [rng.expovariate(1.0) for _ in range(600)], (99.0,))[0]
        missed += s.upper < true_p99
    # Exact coverage for n=600 is binom.cdf(j - 1) >= 0.99; allow sampling noise.
    assert missed / trials <= 0.03  # 1% expected; sd 0.5% at 400 trials


@pytest.mark.integration
def test_report_says_which_percentiles_are_supported(tmp_path):
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("few", n_requests=40, osl=4),
                                            CaseSpec("many", n_requests=460, osl=4,
                                                     duration_s=20.0)]))
    write_report(run)
    text = (run / "report.md").read_text()
    few = text[text.index("### few"):text.index("### many")]
    assert ("**too few requests** (\u2020 in the table) for p90 (n=40, needs 44), "
            "p95 (n=40, needs 90), p99 (n=40, needs 459)") in few
    assert "supported: p50;" in few
    many = text[text.index("### many"):]
    assert "supported: p50, p90, p95, p99." in many
    table = text[text.index("## Sample sufficiency"):]
    assert "| `few` | ttft_ms | 40 | yes, <= " in table
    assert "| **too few** | **too few** | **too few** |" in table
    row = next(x for x in table.splitlines() if x.startswith("| `many` | ttft_ms | 460 |"))
    assert "too few" not in row
    bmf = json.loads((run / "bencher.json").read_text())
    assert "upper_value" in bmf["strata::many"]["ttft-p99-ms"]
    assert "upper_value" not in bmf["strata::few"]["ttft-p99-ms"]  # no bound from 40
    assert "upper_value" in bmf["strata::few"]["ttft-p50-ms"]


# --- run until supported -------------------------------------------------------------


def llama_reply(seen: Seen) -> Reply:
    if seen.method == "GET":
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    body = seen.json
    n = body["n_predict"]
    items = [(0.002, sse({"content": "a", "tokens": [400 + i], "stop": False}))
             for i in range(n)]
    items.append((0.001, sse({"content": "", "stop": True, "stop_type": "limit",
                              "tokens_evaluated": len(body["prompt"]), "tokens_predicted": n,
                              "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0,
                                          "predicted_n": n, "predicted_ms": 2.0}})))
    return Reply(items)


def _runner(url: str, lines: list[CaseLine]) -> CaseRunner:
    setup = CaseSetup(url, "llamacpp", "c", TokenSpace(300, 1000), Timeouts(read_s=10))
    return CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                      add_case=lines.append)


def _row(section: str, metric: str) -> list[str]:
    line = next(x for x in section.splitlines() if x.startswith(f"| {metric} (ms) |"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.integration
def test_each_percentile_cell_says_whether_its_count_supports_it_89_vs_90(tmp_path):
    # p95 needs 90 requests at 99%: 89 is one short, 90 is enough; p99 needs 459.
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("short", n_requests=89, osl=4),
                                            CaseSpec("enough", n_requests=90, osl=4)]))
    write_report(run)
    text = (run / "report.md").read_text()
    short = _row(text[text.index("### short"):text.index("### enough")], "tpot")
    enough = _row(text[text.index("### enough"):], "tpot")
    # metric, n, mean, p50, p90, p95, p99, max
    assert short[1] == "89" and enough[1] == "90"
    assert short[5].endswith("\u2020") and not enough[5].endswith("\u2020")  # p95
    assert short[6].endswith("\u2020") and enough[6].endswith("\u2020")  # p99 both short
    assert not short[3].endswith("\u2020") and not short[4].endswith("\u2020")  # p50, p90
    chunk = _row(text[text.index("### short"):text.index("### enough")], "chunk_gap")
    assert not any(c.endswith("\u2020") for c in chunk)  # not independent draws: unmarked
    summary = json.loads((run / "summary.json").read_text())
    by_case = {c["case_id"]: c for c in summary["cases"]}
    p95 = {c: next(s for s in by_case[c]["sufficiency"]
                   if s["metric"] == "tpot_ms" and s["percentile"] == 95.0)
           for c in ("short", "enough")}
    assert (p95["short"]["supported"], p95["enough"]["supported"]) == (False, True)
    assert (p95["short"]["n"], p95["short"]["needed"]) == (89, 90)
    props = {c: dict(summarize_case(run, c).user_properties()) for c in ("short", "enough")}
    assert props["short"]["tpot_p95_ms_supported"] == 0
    assert props["enough"]["tpot_p95_ms_supported"] == 1
    assert props["enough"]["tpot_p99_ms_supported"] == 0
    assert props["enough"]["ttft_p90_ms_supported"] == 1
    assert not any(k.startswith("chunk_gap") and k.endswith("_supported") for k in props["short"])


def test_until_runs_exactly_to_the_count_that_supports_p90():
    lines: list[CaseLine] = []
    with ScriptServer(llama_reply) as srv:
        r = _runner(srv.url, lines).run(
            Workload("u", isl=4, osl=2, concurrency=2, requests=5), scale=False,
            until=SampleTarget(percentiles=(90.0,), max_requests=200, max_s=60))
    assert len(r.records) == 44 and r.metrics.n_ok == 44
    assert len({x.request_id for x in r.records}) == 44
    assert lines[-1].sample_target["met"] is True
    assert lines[-1].sample_target["stopped_by"] == "supported"
    assert support("ttft_ms", [1.0] * r.metrics.n_ok, (90.0,))[0].supported


def test_until_stops_at_max_requests():
    lines: list[CaseLine] = []
    with ScriptServer(llama_reply) as srv:
        r = _runner(srv.url, lines).run(
            Workload("u", isl=4, osl=2, requests=3), scale=False,
            until=SampleTarget(percentiles=(99.0,), max_requests=20, max_s=60))
    assert len(r.records) == 20
    t = lines[-1].sample_target
    assert (t["met"], t["stopped_by"], t["needed"]) == (False, "max_requests", 459)


def test_until_stops_near_max_s():
    lines: list[CaseLine] = []
    slow = lambda seen: Reply(  # noqa: E731
        [(0.05, x) for _, x in llama_reply(seen).items]) if seen.method == "POST" \
        else llama_reply(seen)
    with ScriptServer(slow) as srv:
        r = _runner(srv.url, lines).run(
            Workload("u", isl=4, osl=2, requests=2), scale=False,
            until=SampleTarget(percentiles=(99.0,), max_requests=10_000, max_s=1.5))
    t = lines[-1].sample_target
    assert t["stopped_by"] == "max_s" and not t["met"]
    window_s = (r.window_ns[1] - r.window_ns[0]) / 1e9
    assert 1.5 <= window_s < 4.0, window_s  # ~0.15 s a request: ends near the limit
    assert 5 < len(r.records) < 40


def test_bad_targets_are_refused():
    with pytest.raises(ValueError, match="percentiles must be in"):
        SampleTarget(percentiles=(100.0,))
    with pytest.raises(ValueError, match="max_requests >= 1"):
        SampleTarget(max_requests=0)

