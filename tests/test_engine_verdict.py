"""The verdict and the time ledger where the request's path ends at several engines
(replicas behind a router), from built rows and records: no timing, no server.

The server-wide cgroup rows are the first engine's cgroup alone, so they are not read as
the whole server's (its quota, or its absence); each engine's own cgroup is a row of
``cpu_limited``'s evidence, in words with its share of the requests and their pace; an
engine held by its own quota and slower than the others beyond ``engine_pace_ratio`` is
the verdict's first class, named. The ledger gives each engine's requests side by side,
and counts those whose engine is not known, with the reason.
"""

from __future__ import annotations

import dataclasses

import pytest

from strata_plugin.analysis import thresholds
from strata_plugin.analysis.engine_case import EngineCase, server_rows
from strata_plugin.analysis.engine_lines import engine_lines
from strata_plugin.analysis.engine_requests import Attribution, imbalance, paces
from strata_plugin.analysis.ledger import case_ledger
from strata_plugin.analysis.rules import WindowSignals, classify
from strata_plugin.analysis.signals import build_signals
from strata_plugin.analysis.timeline import HwStat
from strata_plugin.formats.request_path import Engine
from strata_plugin.report.ledger_md import engine_table
from tests.test_ledger import ANCHOR, record

FREE, HELD = 101, 202  # the two engines' root PIDs
ENGINES = (Engine(FREE, (FREE,), "127.0.0.1:8081", name="llama-server"),
           Engine(HELD, (HELD,), "127.0.0.1:8082", name="llama-server"))
#: a decode case whose whole-server ledger is the server's compute (run-state split)
LEDGER = dict(ledger_metric="itl", ledger_run_state=True, ledger_residual_frac=0.01,
              ledger_causes=(("decode:running", 0.95), ("outside:delivery", 0.05)))


def _row(source: str, device: str, metric: str, kind: str = "counter", **v: float) -> HwStat:
    return HwStat("w", "local", source, device, metric, kind, 40, 1.0, **v)


def _engine(pid: int, *, quota: float | None, throttled: float) -> list[HwStat]:
    """One engine's own rows: its root process's CPU and run-queue wait, its cgroup's
    100 periods of which ``throttled`` (a share) were throttled, and its quota."""
    out = [_row("proc", f"pid{pid}", "cpu_user_s", rate=0.25 if quota else 0.9),
           _row("proc", f"pid{pid}", "cpu_system_s", rate=0.0),
           _row("proc", f"pid{pid}", "runqueue_delay_ns", rate=7e8 if quota else 1e7),
           _row("allowance", f"pid{pid}", "engine_nr_periods", rate=10.0, delta=100.0),
           _row("allowance", f"pid{pid}", "engine_nr_throttled", rate=throttled * 10,
                delta=throttled * 100)]
    if quota is not None:
        out.append(_row("allowance", f"pid{pid}", "engine_quota_cores", "gauge", min=quota,
                        mean=quota))
    return out


def _first_engines_cgroup(*, quota: float | None, throttled: float) -> list[HwStat]:
    """The server-wide cgroup rows, which the agent reads from the first engine's cgroup:
    with no quota its periods do not elapse (none throttled); with one, ``throttled`` of
    them were, and the allowance is capped by it."""
    if quota is None:
        return [_row("cpu", "", "cgroup_nr_periods", rate=0.0, delta=0.0),
                _row("cpu", "", "cgroup_nr_throttled", rate=0.0, delta=0.0)]
    return [_row("cpu", "", "cgroup_nr_periods", rate=10.0, delta=100.0),
            _row("cpu", "", "cgroup_nr_throttled", rate=throttled * 10, delta=throttled * 100),
            _row("cpu", "", "cgroup_quota_cores", "gauge", mean=quota),
            _row("cpu", "", "cgroup_usage_s", rate=quota),
            _row("allowance", "", "quota_cores", "gauge", min=quota, mean=quota),
            _row("allowance", "", "allowed_cpus", "gauge", min=quota, mean=quota)]


def _host() -> list[HwStat]:
    """A 4-core host, the server's process tree (both engines) on 1.15 cores."""
    return [_row("cpu", "", "busy_s", rate=1.3),
            *(_row("cpu", f"cpu{i}", "busy_s", rate=0.3) for i in range(4)),
            _row("proc", "", "cpu_user_s", rate=1.15), _row("proc", "", "cpu_system_s", rate=0.0),
            _row("proc", "", "num_threads", "gauge", max=4.0),
            _row("proc", "", "runqueue_delay_ns", rate=7.1e8)]


def _engine_case(hw: list[HwStat], engines: tuple[Engine, ...],
                 slow_tpot_ms: float) -> EngineCase:
    """12 requests, 6 on each engine: the free one's TPOT 10 ms, the held one's
    ``slow_tpot_ms``."""
    att = Attribution({f"r{i}": FREE if i % 2 else HELD for i in range(12)}, {})
    tpot = {f"r{i}": 10.0 if i % 2 else slow_tpot_ms for i in range(12)}
    paced = paces(att, [e.pid for e in engines], tpot, {k: v * 48 for k, v in tpot.items()})
    return EngineCase(engine_lines(hw, engines), att, paced, imbalance(paced))


def _signals(hw: list[HwStat], engines: tuple[Engine, ...],
             ec: EngineCase | None) -> WindowSignals:
    s = build_signals(window="w", duration_s=10.0, start_ns=0, end_ns=10_000_000_000,
                      hw=server_rows(hw, engines), requests=None, gpu_present=False,
                      gpu_expected=False, multi_node=False, unavailable=())
    return dataclasses.replace(s, engines=ec.facts() if ec is not None else (), **LEDGER)


def _case(*, first_held: bool = False, throttled: float = 0.92, slow_tpot_ms: float = 40.0):
    """The engine ``HELD`` is under a 0.25-core quota, second in the path's list (or,
    ``first_held``, first: its cgroup is then the one the server-wide rows read)."""
    engines = ENGINES[::-1] if first_held else ENGINES
    hw = [*_host(), *_engine(FREE, quota=None, throttled=0.0),
          *_engine(HELD, quota=0.25, throttled=throttled),
          *_first_engines_cgroup(quota=0.25 if first_held else None, throttled=throttled)]
    return hw, _signals(hw, engines, _engine_case(hw, engines, slow_tpot_ms))


def _engine_rows(v):
    return [(e.metric, e.met) for e in v.evidence if e.metric.startswith("engine_")]


def test_the_replica_held_by_its_own_quota_and_4x_slower_is_the_first_class_named() -> None:
    """Two replicas, the second under a 0.25-core quota, throttled in 92% of its periods
    and its TPOT 4x the other's: ``cpu_limited`` first (not the whole server's compute,
    which the ledger would name), naming its PID, quota, throttling and share of the
    requests; the compute second; one evidence row per engine, only the held one met."""
    _, s = _case()
    v = classify(s)
    assert v.classes == ("cpu_limited", "cpu_compute") and not v.inconclusive, v
    assert v.lead.startswith(
        f"PID {HELD} on local held by its own CPU quota and 4.00x slower than the fastest "
        f"engine: PID {HELD} `llama-server` at 127.0.0.1:8082: CFS quota 0.25 core, "
        "throttled in 92% of its periods, 0.25 core of CPU, 0.70 s/s waiting for a CPU; "
        f"served 6 of 12 requests (50%), median TPOT 40 ms, 4.00x the fastest engine's "
        f"(PID {FREE})"), v.lead
    assert _engine_rows(v) == [(f"engine_throttled_frac local/pid{FREE}", False),
                               (f"engine_throttled_frac local/pid{HELD}", True)]
    free_row = next(e for e in v.evidence if e.metric.endswith(f"pid{FREE}"))
    assert free_row.detail == (f"PID {FREE} `llama-server` at 127.0.0.1:8081: throttled in "
                               "0% of its periods, 0.90 core of CPU, 0.01 s/s waiting for a "
                               "CPU; served 6 of 12 requests (50%), median TPOT 10 ms")
    assert v.evidence[0].cls == "cpu_limited"
    assert any("whole server's largest cause: decode compute, 95% of TPOT/ITL" in n
               for n in v.notes), v.notes


@pytest.mark.parametrize(("ratio", "first"), [(1.99, "cpu_compute"), (2.01, "cpu_limited")])
def test_the_held_replica_is_first_only_past_engine_pace_ratio(ratio, first) -> None:
    """engine_pace_ratio (2x the fastest engine's median TPOT): held by its quota but
    1.99x slower, the whole server's ledger leads (its quota is evidence, past threshold);
    2.01x, the held engine is first."""
    assert thresholds.value("engine_pace_ratio") == 2.0
    v = classify(_case(slow_tpot_ms=10.0 * ratio)[1])
    assert v.classes[0] == first, v
    assert "cpu_limited" in v.past_threshold


@pytest.mark.parametrize(("throttled", "first"), [(0.04, "cpu_compute"), (0.06, "cpu_limited")])
def test_the_slow_replica_is_named_for_its_quota_only_past_cgroup_throttled_frac(
        throttled, first) -> None:
    """cgroup_throttled_frac (5% of its periods), on the engine's own cgroup: 4x slower
    but throttled in 4% of its periods, its quota is not the cause and the engine row is
    not met; in 6%, it is, and the engine is first."""
    assert thresholds.value("cgroup_throttled_frac") == 0.05
    v = classify(_case(throttled=throttled)[1])
    assert v.classes[0] == first, v
    assert _engine_rows(v)[1] == (f"engine_throttled_frac local/pid{HELD}", first == "cpu_limited")
    # not held, still slow: named in a note, its evidence given, no cause claimed
    named = [n for n in v.notes if n.startswith(f"PID {HELD} on local is 4.00x slower")]
    assert len(named) == (first == "cpu_compute"), v.notes


def test_the_first_engines_free_cgroup_is_not_said_of_the_server() -> None:
    """The first engine has no quota (its periods never elapse: throttled 0), the second
    is held. The server-wide rows (the first engine's) are not read as the server's: no
    ``cgroup_throttled_frac`` row saying the server was never throttled, no quota use;
    each engine's own row instead."""
    hw, s = _case()
    assert s.cgroup_throttled_frac is None and s.cgroup_quota_used is None
    v = classify(s)
    assert not [e for e in v.evidence if e.metric in ("cgroup_throttled_frac",
                                                      "cgroup_quota_used")], v.evidence
    # the same rows read as one engine's server: its cgroup is then the server's (0)
    one = _signals(hw, ENGINES[:1], None)
    assert one.cgroup_throttled_frac == 0.0


def test_the_first_engines_quota_is_not_said_of_the_server() -> None:
    """The first engine is the held one: its quota (0.25 core) and throttling are in the
    server-wide rows. With two engines they are neither the server's allowance (no "CFS
    quota" in it, no 0.25 allowed CPU) nor its quota use; its own row names it."""
    _, s = _case(first_held=True)
    assert (s.cgroup_throttled_frac, s.cgroup_quota_used, s.server_allowed_cpus,
            s.server_allowance_by) == (None, None, None, "")
    v = classify(s)
    assert v.classes[0] == "cpu_limited" and v.lead.startswith(f"PID {HELD} on local"), v
    assert "CFS quota 0.25 CPU" not in v.spare and "allowed" not in v.spare, v.spare
    assert _engine_rows(v) == [(f"engine_throttled_frac local/pid{HELD}", True),
                               (f"engine_throttled_frac local/pid{FREE}", False)]


def test_one_engine_keeps_the_verdict_it_had() -> None:
    """One engine: its cgroup is the server's. The same rows give the verdict the
    server-wide rows always gave: its quota read as the server's, no engine row, no
    engine named first (regression guard)."""
    hw = [*_host(), *_engine(HELD, quota=0.25, throttled=0.92),
          *_first_engines_cgroup(quota=0.25, throttled=0.92)]
    assert server_rows(hw, ENGINES[:1]) == hw
    s = _signals(hw, ENGINES[:1], None)
    plain = dataclasses.replace(build_signals(
        window="w", duration_s=10.0, start_ns=0, end_ns=10_000_000_000, hw=hw,
        requests=None, gpu_present=False, gpu_expected=False, multi_node=False,
        unavailable=()), **LEDGER)
    assert s == plain
    v = classify(s)
    assert v == classify(plain)
    assert (round(s.cgroup_throttled_frac, 6), s.server_allowed_cpus) == (0.92, 0.25)
    assert v.classes[0] == "cpu_compute" and not _engine_rows(v), v
    assert any(e.metric == "cgroup_throttled_frac" and e.met for e in v.evidence)


def test_engines_sharing_one_cgroup_keep_the_servers_rows() -> None:
    """Several engines in one cgroup (one port with SO_REUSEPORT in one container): the
    server-wide rows are all of theirs, so they are read; in cgroups of their own (or
    not readable), they are not."""
    hw = [*_host(), *_first_engines_cgroup(quota=0.25, throttled=0.92)]
    shared = tuple(dataclasses.replace(e, cgroup="/pod/a") for e in ENGINES)
    assert server_rows(hw, shared) == hw
    apart = (shared[0], dataclasses.replace(shared[1], cgroup="/pod/b"))
    assert len(server_rows(hw, apart)) == len(_host())
    assert len(server_rows(hw, ENGINES)) == len(_host())  # cgroups not readable


# --- the ledger, engine by engine -----------------------------------------------------------


def test_the_ledger_gives_each_engines_requests_side_by_side_and_counts_the_rest() -> None:
    """12 decode requests: 5 on the free engine at 10 ms a token, 5 on the held one at
    40 ms, 2 whose engine is not known (no connection opened and closed with them): each
    engine's ms per token and its parts' shares in its own column, the 2 counted with
    their reason; an engine that served none has no shares ("-")."""
    recs = [record(rid=f"r{i}", pace_ms=10.0 if i % 2 else 40.0, n=20) for i in range(12)]
    led = case_ledger("c", "decode_x", {"osl": 20}, recs, anchor=ANCHOR)
    assert led.metric == "itl" and led.n == 12
    att = Attribution({f"r{i}": FREE if i % 2 else HELD for i in range(10)},
                      {"r10": "no_connection", "r11": "no_connection"})
    hw = [*_engine(FREE, quota=None, throttled=0.0), *_engine(HELD, quota=0.25, throttled=0.9)]
    paced = paces(att, [FREE, HELD], {}, {})
    text = engine_table(led, EngineCase(engine_lines(hw, ENGINES), att, paced, None))
    lines = text.splitlines()
    head = next(x for x in lines if x.startswith("| part"))
    assert [c.strip() for c in head.split("|")[1:-1]] == [
        "part", f"PID {FREE} `llama-server` (5 requests)",
        f"PID {HELD} `llama-server` (5 requests)"]
    pace = next(x for x in lines if x.startswith("| TPOT/ITL (ms/token)"))
    assert [c.strip() for c in pace.split("|")[2:-1]] == ["10", "40"], text
    compute = next(x for x in lines if x.startswith("| decode_compute"))
    assert [c.strip() for c in compute.split("|")[2:-1]] == ["100.0%", "100.0%"], text
    assert text.rstrip().endswith(
        "Not attributed to an engine: 2 of 12 requests (2 no engine had a connection that "
        "opened and closed with it (a router that keeps its connections to the engines "
        "open, or a connection that came and went between two of the agent's steps: 20 ms "
        "apart, more while the agent is kept from a CPU))."), text
    none = Attribution({f"r{i}": FREE for i in range(12)}, {})
    text = engine_table(led, EngineCase(engine_lines(hw, ENGINES), none,
                                        paces(none, [FREE, HELD], {}, {}), None))
    row = next(x for x in text.splitlines() if x.startswith("| decode_compute"))
    assert [c.strip() for c in row.split("|")[2:-1]] == ["100.0%", "-"], text
    assert "Not attributed to an engine: 0 of 12 requests." in text


def test_one_engine_has_no_engine_lines_in_the_ledger() -> None:
    led = case_ledger("c", "decode_x", {"osl": 20}, [record(rid="r0", n=20)], anchor=ANCHOR)
    assert engine_table(led, None) == ""


def test_a_failure_in_the_engines_evidence_costs_that_part_only(tmp_path, monkeypatch):
    """The engines' analysis raising (a bug, a sample it cannot read) leaves the case's
    analysis, its verdict and the report standing: the verdict says what was not
    analysed, and why."""
    from bundle_factory import cpu_run

    from strata_plugin.analysis import case_summary

    def broken(*_a, **_k):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(case_summary, "case_engines", lambda *_a: ENGINES)
    monkeypatch.setattr(case_summary, "engine_case", broken)
    ra = case_summary.analyze_run(cpu_run(tmp_path), parallel=False)
    assert ra.analyses and all(a.engines is None for a in ra.analyses)
    said = [n for a in ra.analyses if a.window is not None for n in a.verdict.notes
            if n.startswith("engines: ")]
    assert said and said[0] == ("engines: each engine's own evidence not analysed "
                                "(OverflowError: cannot convert float infinity to integer)")
