"""The report fits the target: only what it could have measured is "not measured", the
thresholds in a file of their own, GPU rules only where a GPU is said or seen."""

from __future__ import annotations

from types import SimpleNamespace

from bundle_factory import CaseSpec, RunSpec, make_run

from strata_plugin.analysis.rules import Verdict
from strata_plugin.analysis.thresholds import THRESHOLDS
from strata_plugin.formats.telemetry import engine_gpu_line, engine_reports_gpu
from strata_plugin.report import write_report
from strata_plugin.report.markdown import target_lacks, verdict_md

NET = "net_util <- net:rx_bytes/tx_bytes/link_speed_mbps (no samples in the window)"
KV = "kv_usage_max <- prom:kv_cache_usage (no samples in the window)"
WAIT = "waiting_mean <- prom:waiting_requests (no samples in the window)"
PROC = "major_faults_per_s <- proc:major_faults (unavailable: local/proc: no server process)"


def _data(urls, multi_node=False, prom=()):
    keys = [SimpleNamespace(source="prom", metric=m) for m in prom]
    keys.append(SimpleNamespace(source="cpu", metric="busy_s"))
    return SimpleNamespace(bundle=SimpleNamespace(manifest={"servers": {
        f"s{i}": {"base_url": u} for i, u in enumerate(urls)}}),
        ctx=SimpleNamespace(multi_node=multi_node), store=SimpleNamespace(keys=keys))


def _verdict(missing):
    return Verdict(classes=("headroom",), evidence=(), confidence=0.5, inconclusive=False,
                   finer_trace=(), missing_signals=tuple(missing))


def test_not_measured_lists_only_what_this_target_could_have_had():
    lacks = target_lacks(_data(["http://127.0.0.1:8000"], prom=("running_requests",
                                                                  "waiting_requests")))
    text = verdict_md(_verdict([KV, NET, PROC, WAIT]), lacks)
    listed = text.split("Not measured (rules that needed these did not decide):")[1]
    listed = listed.split("Not available from this target")[0]
    assert [line[2:] for line in listed.splitlines() if line.startswith("- ")] == [PROC, WAIT]
    assert ("Not available from this target: kv_usage_max (the engine's /metrics does not "
            "export it); net_util (one node, the server reached over loopback).") in text


def test_what_the_target_could_have_had_stays_listed():
    # A server on another host: the network carries the requests. Two nodes: too.
    for d in (_data(["http://10.0.0.5:8000"]), _data(["http://127.0.0.1:1"], multi_node=True)):
        assert "net" not in target_lacks(d)
    # /metrics never scraped (no prom samples at all): the engine metrics could be had.
    assert "prom" not in target_lacks(_data(["http://127.0.0.1:1"]))
    text = verdict_md(_verdict([NET, KV]), target_lacks(_data(["http://10.0.0.5:1"])))
    assert f"- {NET}" in text and f"- {KV}" in text and "Not available" not in text


def test_the_thresholds_have_a_file_of_their_own(tmp_path):
    # one case: the thresholds file and its link do not depend on the cases (cpu_run's
    # four cases drew 14 plots for it)
    run = make_run(tmp_path, RunSpec([CaseSpec("only")]))
    write_report(run, plots=False)
    report = (run / "report.md").read_text()
    table = (run / "thresholds.md").read_text()
    assert "[thresholds.md](thresholds.md)" in report
    assert "| name | value | unit | source |" not in report  # the table's header
    assert f"{len(THRESHOLDS)} thresholds</summary>" not in report
    assert table.count("| name | value | unit | source |") == 1
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == len(THRESHOLDS) + 2  # the header, its rule, then one row each
    assert all(f"| {t.name} |" in table for t in THRESHOLDS)


def test_the_engine_log_says_when_it_runs_on_a_gpu(tmp_path):
    llama = ("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100 80GB HBM3) "
             "- 80546 MiB free")
    vllm = "INFO 05-01 10:00:00 [__init__.py:244] Automatically detected platform cuda."
    for line in (llama, vllm):
        assert engine_gpu_line(f"starting\n{line}\nready\n") == line
    for cpu in ("INFO [__init__.py:244] Automatically detected platform cpu.",
                "load_tensors: CPU_Mapped model buffer size = 7.00 MiB",
                "main: server is listening on http://127.0.0.1:8080"):
        assert engine_gpu_line(cpu) is None
    log = tmp_path / "service" / "default" / "server.log"
    log.parent.mkdir(parents=True)
    log.write_text("build: 1 (x)\n")
    assert engine_reports_gpu(tmp_path) is None
    log.write_text(f"build: 1 (x)\n{llama}\n")
    assert engine_reports_gpu(tmp_path) == llama


def test_a_one_case_run_draws_its_timeline_once(tmp_path):
    """The run timeline of a one-case run is that case's timeline but for the baseline and
    cooldown seconds: one figure, not two (the bench of one request drew both)."""
    run = make_run(tmp_path, RunSpec([CaseSpec("only")]))
    write_report(run)
    timelines = sorted(p.name for p in (run / "plots").glob("*.png")
                       if not p.name.startswith("ledger-"))  # the ledger's own pictures
    assert timelines == ["case-only.png"]
    report = (run / "report.md").read_text()
    assert "![run timeline]" not in report
    assert "Not drawn: the run has one case" in report
    # (a run of two cases draws run.png: test_report.py's test_pngs_open_and_omit_empty_panels)


def test_gpu_rules_only_where_the_profile_or_the_server_says_a_gpu_is_there(tmp_path):
    """No GPU said (profile) or seen (NVML): the CPU rules judge, no "GPU expected" limit.
    The engine's log naming a GPU device: the GPU rules apply, and say what they lack."""
    import json

    said = make_run(tmp_path / "cpu", RunSpec([CaseSpec("c")]))
    write_report(said, plots=False)
    s = json.loads((said / "summary.json").read_text())
    assert s["run"]["gpu_expected"] is False
    assert not any(line.startswith("GPU expected") for line in s["limits"])
    assert "no GPU telemetry and none expected: GPU classes not assessed" in (
        s["cases"][0]["verdict"]["notes"])
    seen = make_run(tmp_path / "log", RunSpec([CaseSpec("c")]))
    log = seen / "service" / "default" / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA L4) - "
                   "22000 MiB free\n")
    write_report(seen, plots=False)
    s = json.loads((seen / "summary.json").read_text())
    assert s["run"]["gpu_expected"] is True
    assert any(line.startswith("GPU expected but no GPU telemetry") for line in s["limits"])
