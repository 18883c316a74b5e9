"""The regression gate, run-to-run compare, and the two offline commands."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from bundle_factory import CaseSpec, RunSpec, cpu_run, make_run

from strata_plugin.analysis.run_compare import compare_runs
from strata_plugin.analysis.run_folder import read_records
from strata_plugin.formats.records import RequestRecord, TokenEvent
from strata_plugin.report import regression_check
from strata_plugin.report.cli import compare_main, report_main


def baseline_run(root):
    return make_run(
        root,
        RunSpec(
            cases=[
                CaseSpec("decode", n_requests=40, concurrency=4, duration_s=10.0, osl=16),
                CaseSpec("prefill", n_requests=30, osl=2, duration_s=6.0),
            ]
        ),
    )


def slowed(rec: RequestRecord, ms: float) -> RequestRecord:
    """The same request with its first token ``ms`` later (TTFT and e2e grow)."""
    d = int(ms * 1e6)
    events = tuple(dataclasses.replace(e, t_ns=e.t_ns + d) for e in rec.events)
    return dataclasses.replace(rec, events=events, done_ns=(rec.done_ns or 0) + d)


def current(base, ms_by_case: dict[str, float], seed: int = 0):
    rng = random.Random(seed)
    out = {}
    for cid, recs in base.items():
        ms = ms_by_case.get(cid, 0.0)
        out[cid] = [slowed(r, ms * (1 + rng.uniform(-0.05, 0.05))) for r in recs]
    return out


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return baseline_run(tmp_path_factory.mktemp("base"))


def test_clear_regression_is_flagged_with_support(base_dir):
    base, _ = read_records(base_dir / "requests.jsonl")
    ttft = 0.25 * 10.0 / 10 * 1000  # decode: 10 slots of 1 s, TTFT a quarter of each
    regs = regression_check(current(base, {"decode": ttft * 0.5}), base_dir, "ttft_ms", 10.0, 0.05)
    assert [r.case_id for r in regs] == ["decode"]
    r = regs[0]
    assert r.delta_pct == pytest.approx(50, abs=5)
    assert r.ci_lo_pct > 10.0
    assert r.p_value < 0.05
    assert "decode: ttft_ms" in r.message()


def test_change_within_the_margin_is_not_flagged(base_dir):
    base, _ = read_records(base_dir / "requests.jsonl")
    ttft = 250.0
    assert regression_check(current(base, {"decode": ttft * 0.03}), base_dir, "ttft_ms", 10.0) == []


def test_one_noisy_request_is_not_a_regression(base_dir):
    base, _ = read_records(base_dir / "requests.jsonl")
    cur = {cid: list(recs) for cid, recs in base.items()}
    cur["decode"][0] = slowed(cur["decode"][0], 5000.0)  # one 5 s stall
    assert regression_check(cur, base_dir, "ttft_ms", 5.0) == []
    assert regression_check(cur, base_dir, "e2e_ms", 5.0) == []


def test_higher_is_better_metrics_regress_downwards(base_dir):
    base, _ = read_records(base_dir / "requests.jsonl")
    faster = current(base, {"decode": -100.0})  # TTFT shorter: decode rate unchanged
    assert regression_check(faster, base_dir, "ttft_ms", 5.0) == []
    slow_decode = {}
    for cid, recs in base.items():
        slow_decode[cid] = []
        for r in recs:
            t0 = r.events[0].t_ns
            ev = tuple(
                TokenEvent(t_ns=t0 + 2 * (e.t_ns - t0), n_tokens=e.n_tokens) for e in r.events
            )
            slow_decode[cid].append(dataclasses.replace(r, events=ev))
    regs = regression_check(slow_decode, base_dir, "tpot_ms", 5.0)
    assert {r.case_id for r in regs} == {"decode", "prefill"}


def test_gate_input_errors(base_dir, tmp_path):
    base, _ = read_records(base_dir / "requests.jsonl")
    with pytest.raises(ValueError, match="unknown request metric"):
        regression_check(base, base_dir, "ttft", 5.0)
    with pytest.raises(FileNotFoundError):
        regression_check(base, tmp_path, "ttft_ms", 5.0)
    few = {"decode": base["decode"][:2]}
    assert regression_check(current(few, {"decode": 500.0}), base_dir, "ttft_ms", 5.0) == []


def test_compare_runs_and_cli(base_dir, tmp_path, capsys):
    other = make_run(
        tmp_path,
        RunSpec(
            cases=[
                CaseSpec("decode", n_requests=40, concurrency=4, duration_s=20.0, osl=16),
                CaseSpec("prefill", n_requests=30, osl=2, duration_s=6.0),
                CaseSpec("new_case"),
            ],
            run_id="other",
        ),
    )
    rows = {(r.case_id, r.metric): r for r in compare_runs(base_dir, other)}
    assert rows[("decode", "ttft_ms")].call == "worse"
    assert rows[("decode", "ttft_ms")].delta_rel == pytest.approx(1.0, rel=0.05)
    assert rows[("prefill", "ttft_ms")].call == "same"
    assert rows[("new_case", "ttft_ms")].call == "only in B"
    assert compare_main([str(base_dir), str(other)]) == 0
    out = capsys.readouterr().out
    assert "decode" in out and "worse" in out and "95% interval (requests resampled)" in out
    assert compare_main([str(base_dir), str(other), "--json", "--metric", "e2e_ms"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {x["metric"] for x in lines} == {"e2e_ms"}
    assert compare_main([str(base_dir), str(tmp_path / "nope")]) == 2
    assert compare_main([str(base_dir), str(other), "--metric", "bogus"]) == 2


@pytest.mark.integration
def test_report_main(tmp_path, capsys):
    run = cpu_run(tmp_path)
    assert report_main([str(run)]) == 0
    assert capsys.readouterr().out.strip().endswith("report.md")
    assert (run / "report.md").exists() and (run / "benchmark.json").exists()
    assert report_main([str(tmp_path / "missing")]) == 2
