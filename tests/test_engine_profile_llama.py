"""The engine's profile of a real llama-server, taken by the diagnostic round: perf's CPU
samples of the server's threads over exactly the traced case's measured window."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_integration_llama import llama  # noqa: F401  (the module's server fixture)

from strata_plugin.analysis import case_summary
from strata_plugin.analysis.rules import Verdict
from strata_plugin.analysis.traces import engine_profile as ep
from strata_plugin.configure.profile import load_profile, packaged_profiles
from strata_plugin.load.case_runner import CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.run import engine_profile as cap
from strata_plugin.run.diagnostic_round import DiagnosticRunner

pytestmark = pytest.mark.integration


def test_an_inconclusive_engine_verdict_gets_the_servers_cpu_samples_in_its_window(
        llama, tmp_path, monkeypatch):  # noqa: F811
    why = cap.perf_unavailable()
    if why:
        pytest.fail(f"this test needs perf: {why}")
    # the verdict under test: two causes inside the engine the counters cannot separate
    v = Verdict(classes=("cpu_compute", "host_cpu_launch"), evidence=(), confidence=0.4,
                inconclusive=True, finer_trace=(), missing_signals=())
    monkeypatch.setattr(case_summary, "summarize_case", lambda d, c: SimpleNamespace(verdict=v))
    lo, hi = load_profile(packaged_profiles()["local"]).server.token_id_range
    setup = CaseSetup(llama.base_url, "llamacpp", "it", TokenSpace(lo, hi), Timeouts(read_s=60),
                      salt="ep")
    runner = DiagnosticRunner(setup, record=lambda r: None, mark=lambda *a: None,
                              add_case=lambda c: None, escalate=("auto",), run_dir=tmp_path,
                              server_pid=llama.pid, settle_s=0.0)
    runner.run(Workload("ep", isl=300, osl=8, concurrency=2, requests=4, seed=3),
               case_id="c1", scale=False)
    [traced] = runner.diagnostics
    assert traced.case_id == "c1~traced"
    got = ep.read_capture(tmp_path / "traces" / "engine" / "c1~traced")
    assert got.problem == "" and got.kind == cap.KIND
    # the capture holds the measured window; every sample lies inside the capture
    assert got.start_mono_ns is not None and got.end_mono_ns is not None
    assert got.start_mono_ns <= traced.window_ns[0] <= traced.window_ns[1] <= got.end_mono_ns
    assert got.outside == 0 and got.samples > 0
    xs = [e for e in got.events if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {llama.pid}
    names = {e["args"]["name"] for e in got.events if e["ph"] == "M"}
    assert any(n.startswith("llama-server") for n in names), names
    assert all(got.start_mono_ns <= e["ts"] * 1000 <= got.end_mono_ns for e in xs)
    meta = json.loads((tmp_path / "traces" / "c1~traced" / "meta.json").read_text())
    assert meta["engine_profile"] == "traces/engine/c1~traced"
    assert "engine" not in meta["unavailable"]
