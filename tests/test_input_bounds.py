"""Inputs bounded where they enter, before anything is built (issue 32, item 9).

On 449ac52: ``bench URL --workload ""`` ran the whole cases/ matrix; ``requests=1e11`` and
``isl=1e8`` built every request in memory first (0.9-2.3 GB in 20 s, nothing sent); a URL
with a path got 404 on its health URL and waited out the whole health timeout;
``rate=inf`` wrote ``"rate": Infinity`` (not JSON) into cases.jsonl; a counter that only
decreased became a negative rate in case_hw_summary.csv. Each limit here is tested just
below and just above its value (strata_plugin/limits.py), and hypothesis draws the rest
with a fixed seed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.analysis.timeline import (
    SampleStore,
    SeriesKey,
    Window,
    _running_totals,
    summarize_series,
)
from strata_plugin.formats.cases import CaseLine
from strata_plugin.limits import (
    MAX_ISL,
    MAX_OSL,
    MAX_REQUESTS,
    PREPARED_BYTES_MAX,
    PREPARED_BYTES_PER_REQUEST,
    PREPARED_BYTES_PER_TOKEN,
    max_phase_requests,
    prepared_bytes,
)
from strata_plugin.load.workload_spec import WorkloadSpecError, parse_workload
from strata_plugin.run.server import Server, ServerStartError
from tests.own_cpu import own_cpu
from tests.sse_script_server import Reply, ScriptServer, Seen

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=200)


# --- workload ceilings: each key just below and just above -----------------------------

#: The largest isl whose 1,000 requests fit PREPARED_BYTES_MAX.
ISL_AT_1000 = (PREPARED_BYTES_MAX // 1000 - PREPARED_BYTES_PER_REQUEST) // PREPARED_BYTES_PER_TOKEN


@pytest.mark.parametrize("text, says", [
    (f"isl={MAX_ISL + 1},osl=1", f"isl={MAX_ISL + 1} is more than {MAX_ISL} (limits.MAX_ISL)"),
    (f"isl=1,osl={MAX_OSL + 1}", f"osl={MAX_OSL + 1} is more than {MAX_OSL} (limits.MAX_OSL)"),
    (f"isl=1,osl=1,requests={MAX_REQUESTS + 1}",
     f"requests={MAX_REQUESTS + 1} is more than {MAX_REQUESTS} (limits.MAX_REQUESTS)"),
    (f"isl=1,osl=1,warmups={MAX_REQUESTS + 1}",
     f"warmups={MAX_REQUESTS + 1} is more than {MAX_REQUESTS} (limits.MAX_REQUESTS)"),
    (f"isl={ISL_AT_1000 + 1},osl=1,requests=1000",
     f"1000 requests of isl={ISL_AT_1000 + 1} would take about 2.0 GiB prepared, more than "
     "2 GiB (limits.PREPARED_BYTES_MAX"),
    ("isl=100000000,osl=64,requests=100000000000", "isl=100000000 is more than"),
])
def test_a_key_past_its_ceiling_is_a_usage_error_at_once(text, says):
    # the parser's own CPU time: a loaded host's pause, or the garbage collector's pass
    # over the session's heap, is not its cost (tests/own_cpu.py)
    with own_cpu() as spent, pytest.raises(WorkloadSpecError, match=None) as err:
        parse_workload(text)
    assert says in str(err.value)
    assert spent() < 0.1  # arithmetic: nothing is built


@pytest.mark.parametrize("text", [
    f"isl={MAX_ISL},osl={MAX_OSL}",
    f"isl=1,osl=1,requests={MAX_REQUESTS},warmups={MAX_REQUESTS}",
    f"isl={ISL_AT_1000},osl=1,requests=1000",
])
def test_a_key_at_its_ceiling_is_accepted(text):
    w = parse_workload(text)
    assert prepared_bytes(max(w.requests, w.warmups), w.isl) <= PREPARED_BYTES_MAX


@pytest.mark.parametrize("text, says", [
    ("isl=8,osl=8,arrival=poisson,rate=inf", "rate=inf is not a finite number of requests"),
    ("isl=8,osl=8,arrival=poisson,rate=-inf", "an open-loop arrival needs rate > 0"),
    ("isl=8,osl=8,rate=inf", "rate=inf is not a finite number"),  # closed: still written
    ("isl=8,osl=8,rate=nan", "rate=nan is not a finite number"),
    ("isl=8,osl=8,arrival=gamma,rate=2,burstiness=0", "burstiness must be a finite number > 0"),
    ("isl=8,osl=8,arrival=gamma,rate=2,burstiness=inf", "burstiness must be a finite"),
])
def test_a_rate_that_is_not_finite_is_refused(text, says):
    """Decided: refused, not written as a string: a case line holds numbers, and "every
    request at once" is a closed loop with concurrency = requests."""
    with pytest.raises(WorkloadSpecError) as err:
        parse_workload(text)
    assert says in str(err.value)


def test_the_largest_finite_rate_is_written_as_json():
    w = parse_workload(f"isl=8,osl=8,arrival=poisson,rate={sys.float_info.max!r}")
    line = CaseLine.written(case_id="c", params=w.params()).to_json()
    assert json.loads(line, parse_constant=_no_constant)["params"]["rate"] == sys.float_info.max


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} in a case line: not JSON")


_KEYS = st.sampled_from(["isl", "osl", "concurrency", "requests", "warmups", "seed", "rate",
                         "burstiness", "shared_prefix_tokens", "arrival", "prefix"])
_VALUES = st.one_of(
    st.integers(-5, 3 * MAX_ISL).map(str),
    st.integers(0, 10**12).map(str),
    st.sampled_from(["inf", "-inf", "nan", "1e308", "1e-300", "0", "poisson", "gamma",
                     "closed", "shared", "cold", "", "1.5"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@SETTINGS
@given(pairs=st.lists(st.tuples(_KEYS, _VALUES), max_size=8),
       isl=st.integers(1, 2 * MAX_ISL), osl=st.integers(1, 2 * MAX_OSL))
def test_any_workload_text_is_refused_or_within_every_limit_and_json(pairs, isl, osl):
    """Whatever the text: a WorkloadSpecError, or a workload within every limit whose
    case line is JSON (no Infinity, no NaN)."""
    text = ",".join([f"isl={isl}", f"osl={osl}", *(f"{k}={v}" for k, v in pairs)])
    try:
        w = parse_workload(text)
    except WorkloadSpecError:
        return
    assert 1 <= w.isl <= MAX_ISL and 1 <= w.osl <= MAX_OSL
    assert 1 <= w.requests <= MAX_REQUESTS and 0 <= w.warmups <= MAX_REQUESTS
    assert prepared_bytes(max(w.requests, w.warmups), w.isl) <= PREPARED_BYTES_MAX
    line = CaseLine.written(case_id="c", params=w.params()).to_json()
    json.loads(line, parse_constant=_no_constant)


# --- an empty --workload is a usage error -----------------------------------------------

@pytest.mark.parametrize("text", ["", " ", ","])
def test_an_empty_workload_text_is_refused_by_the_parser(text):
    with pytest.raises(WorkloadSpecError, match="missing isl and osl"):
        parse_workload(text)


@pytest.mark.integration
@pytest.mark.parametrize("workload", ["", " , "])
def test_bench_with_an_empty_workload_is_a_usage_error_not_the_matrix(tmp_path, workload):
    """``python -m strata_plugin bench URL --workload ""``: on 449ac52 it collected and ran
    every case in cases/. Now pytest's usage error (exit 4), in seconds, nothing started."""
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "strata_plugin", "bench", "http://127.0.0.1:9", "--workload",
         workload, "--reports-dir", str(tmp_path / "reports"), "--", "-p", "no:hypothesispytest",
         "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - t0
    assert out.returncode == 4, out.stdout + out.stderr
    assert f"--strata-workload {workload!r} is empty: give the workload as key=value pairs" \
        in out.stderr
    assert "collected" not in out.stdout and not (tmp_path / "reports").exists()
    assert took < 30, took


# --- a client error on the health URL is not a server starting --------------------------

def _health(status: int, seen_paths: list[str]):
    def reply(seen: Seen) -> Reply:
        seen_paths.append(seen.path)
        return Reply([(0.0, b'{"detail":"Not Found"}')], status=status, framing="length",
                     content_type="application/json")
    return reply


@pytest.mark.parametrize("status", [404, 401, 403, 405, 410])
def test_an_attached_server_answering_4xx_on_health_fails_at_once(status):
    paths: list[str] = []
    with ScriptServer(_health(status, paths)) as srv:
        base = f"{srv.url}/some/path"
        t0 = time.monotonic()
        with pytest.raises(ServerStartError) as err:
            Server(None, base).wait_healthy(30.0)
        took = time.monotonic() - t0
    msg = str(err.value)
    assert took < 5.0, took  # on 449ac52: the whole health timeout (30 s here)
    assert paths == ["/some/path/health"]  # asked once
    assert (f"The server at {base} answered GET {base}/health with HTTP {status}") in msg
    assert "not a server still starting, so Strata did not wait" in msg
    if status == 404:
        assert "the URL's path (/some/path): Strata adds /health" in msg


PROFILE = """
name = "health-test"
[server]
engine = "other"
api = "completions"
health_timeout_s = 30
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.5
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""


@pytest.mark.integration
def test_bench_at_a_url_with_a_path_that_404s_fails_in_seconds_with_its_report(tmp_path):
    """The whole run: the health timeout is 30 s; on 449ac52 the run waited it out."""
    (tmp_path / "profile.toml").write_text(PROFILE)
    paths: list[str] = []
    with ScriptServer(_health(404, paths)) as srv:
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "strata_plugin", "bench", f"{srv.url}/some/path",
             "--workload", "isl=8,osl=2", "--profile", str(tmp_path / "profile.toml"),
             "--reports-dir", str(tmp_path / "reports"), "--run-id", "p", "--", "-p",
             "no:hypothesispytest", "-p", "no:cacheprovider"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT), "CI_NO_PROGRESS": "1"})
        took = time.monotonic() - t0
    assert out.returncode != 0 and took < 20, (took, out.stdout[-2000:])
    says = (f"answered GET {srv.url}/some/path/health with HTTP 404 (after 0.")
    assert says in out.stdout
    report = (tmp_path / "reports" / "p" / "report.md").read_text().splitlines()
    assert report[2].startswith("**Run incomplete:**") and says in report[2]


@pytest.mark.parametrize("status", [503, 429, 408, 500])
def test_an_attached_server_answering_503_or_429_is_waited_for(status):
    """Just the other side: a server loading (503), busy (429, 408) or failing (500) may
    still come up, so the health timeout is waited out, asking again every 0.2 s."""
    paths: list[str] = []
    with ScriptServer(_health(status, paths)) as srv:
        t0 = time.monotonic()
        with pytest.raises(ServerStartError, match=f"last answer: HTTP {status}"):
            Server(None, srv.url).wait_healthy(1.0)
        took = time.monotonic() - t0
    assert 1.0 <= took < 3.0, took
    assert len(paths) >= 3


# --- a counter that only decreases is resets, never a negative rate ----------------------

S = 1_000_000_000


def _store(values: list[float], kind: str = "counter") -> SampleStore:
    v = np.asarray(values, dtype=np.float64)
    t = np.arange(len(v), dtype=np.int64) * S
    bounds = np.array([0, len(v)], dtype=np.int64)
    acc = _running_totals(v, bounds, np.array([kind == "counter"]))
    return SampleStore([SeriesKey("n", "prom", "", "x_total", kind)], bounds, t, v, acc, {})


@pytest.mark.parametrize("values, delta", [
    ([100, 90, 80, 70], 90 + 80 + 70),  # each drop a restart: the new value is the increase
    ([0, -1, -2, -3], 0.0),  # below zero: a counter counts up from zero, so nothing
    ([3, 2, 1, 0], 2 + 1 + 0),  # just above and at zero
    ([5, -1, 4], 0 + 5),  # a restart to -1 adds nothing, the climb back to 4 adds 5
])
def test_a_counter_that_only_decreases_never_has_a_negative_rate(values, delta):
    st_ = summarize_series(_store(values), 0, Window("case", "w", "w", 0, (len(values) - 1) * S))
    assert st_ is not None
    assert st_.delta == pytest.approx(delta) and st_.rate >= 0 and st_.min >= 0


@SETTINGS
@given(values=st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=2, max_size=60),
       a=st.integers(0, 60), b=st.integers(0, 60))
def test_any_counter_series_has_no_negative_delta_or_rate(values, a, b):
    s = _store(values)
    assert (np.diff(s.acc) >= 0).all()
    lo, hi = sorted((a, b))
    w = Window("case", "w", "w", lo * S, max(hi, lo + 1) * S)
    got = summarize_series(s, 0, w)
    if got is not None:
        assert got.delta >= 0 and got.rate >= 0 and (got.min is None or got.min >= 0)
        assert math.isfinite(got.rate)


# --- a sample target past one phase's bound is built batch by batch ---------------------

def test_max_phase_requests_is_the_largest_phase_within_both_limits():
    assert max_phase_requests(1) == MAX_REQUESTS
    assert max_phase_requests(ISL_AT_1000) >= 1000 > max_phase_requests(ISL_AT_1000 + 1)
    assert prepared_bytes(max_phase_requests(MAX_ISL), MAX_ISL) <= PREPARED_BYTES_MAX
    assert prepared_bytes(max_phase_requests(MAX_ISL) + 1, MAX_ISL) > PREPARED_BYTES_MAX


def test_until_builds_a_large_target_in_batches_within_the_phase_bound(monkeypatch):
    """until= is where a workload is legitimately larger than one phase may prepare: each
    batch is built when it runs, at most max_phase_requests (here made 7) at once."""
    from strata_plugin.analysis.sufficiency import SampleTarget
    from strata_plugin.load import case_runner
    from strata_plugin.load.case_runner import CaseRunner, CaseSetup
    from strata_plugin.load.client import Timeouts
    from strata_plugin.load.workload import TokenSpace, Workload
    from tests.test_sufficiency import llama_reply

    built: list[int] = []
    real = case_runner.build_specs

    def counting(w, setup, case_id, phase, count, *a, **kw):
        built.append(count)
        return real(w, setup, case_id, phase, count, *a, **kw)

    monkeypatch.setattr(case_runner, "max_phase_requests", lambda isl: 7)
    monkeypatch.setattr(case_runner, "build_specs", counting)
    lines: list = []
    with ScriptServer(llama_reply) as srv:
        setup = CaseSetup(srv.url, "llamacpp", "c", TokenSpace(300, 1000), Timeouts(read_s=10))
        r = CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                       add_case=lines.append).run(
            Workload("u", isl=4, osl=2, concurrency=2, requests=5), scale=False,
            until=SampleTarget(percentiles=(90.0,), max_requests=200, max_s=60))
    assert len(r.records) == 44  # p90 at 99% needs 44
    assert built == [0, 5, 7, 7, 7, 7, 7, 4]  # warm-ups (none), the stated 5, then batches
    assert lines[-1].sample_target["batches"] == 7
