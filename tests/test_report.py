"""The report of fabricated runs: sections, verdicts, A/B, CSV/JSON, PNGs, benchmark JSON."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from built_once import built_once
from bundle_factory import CaseSpec, RunSpec, cpu_run, gpu_run, make_run

from strata_plugin.formats.cases import CaseLine
from strata_plugin.report import summarize_case, write_report

SECTIONS = (
    "# Strata report:",
    "## Servers",
    "## Nodes",
    "## Versions",
    "## Unavailable collectors",
    "## Limits of this run",
    "## Cases at a glance",
    "## Cases",
    "#### Workload as run",
    "#### Request metrics",
    "#### Hardware",
    "#### Energy",
    "#### Verdict",
    "#### Timeline",
    "## A/B comparisons",
    "## Run timeline",
    "## Thresholds",
)


def _gpu_report(folder: Path) -> Path:
    run = gpu_run(folder)
    write_report(run)
    return run


@pytest.fixture(scope="session")
def gpu_report(tmp_path_factory) -> Path:
    """The GPU run's report, written once for the session's workers: its tests only read it."""
    return built_once(tmp_path_factory, "gpu_report", _gpu_report)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def verdicts(run: Path) -> dict[str, dict]:
    return {c["case_id"]: c["verdict"] for c in summary(run)["cases"]}


@pytest.mark.integration
def test_report_has_every_section(cpu_report, gpu_report):
    for run in (cpu_report, gpu_report):
        text = (run / "report.md").read_text()
        for section in SECTIONS:
            assert section in text, (run.name, section)
        assert "llama-server -m model.gguf --port 8080" in text
        assert "test-profile" in text
        # every source the report prints is one a reader can open
        for name in ("report.md", "summary.json"):
            assert "shared/" not in (run / name).read_text(), (run.name, name)


def test_cpu_run_states_its_limits(cpu_report):
    text = (cpu_report / "report.md").read_text()
    assert "no GPU telemetry: GPU classes not assessed" in text
    assert "node0: nvml unavailable: NVML library not found" in text
    assert "GPU utilization (NVML)" in text.split("Panels left out")[1]


def test_cpu_run_verdicts(cpu_report):
    got = verdicts(cpu_report)
    # nothing past threshold: the ledger's largest cause (the server's clocks, no run
    # state: its compute) is first, never "headroom" (issue 30); spare capacity beside it
    assert got["light"]["classes"] == ["cpu_compute"]
    assert "headroom" not in {c for v in got.values() for c in v["classes"]}
    assert got["light"]["lead"].startswith("decode compute, ")
    assert "spare" in got["light"]["spare"] and got["light"]["spare_cores"] > 0
    assert got["cpu_bound"]["classes"][0] == "cpu_compute"
    assert "queueing" in got["cpu_bound"]["classes"]
    # the server's clocks, no run state: the resource past threshold says what they held
    assert got["ab_control"]["classes"] == ["io_page_faults"]
    assert got["ab_treatment"]["classes"] == ["cpu_compute"]
    ev = [e for e in got["ab_control"]["evidence"] if e["met"]]
    assert {"major_faults_per_s", "read_bytes_s"} <= {e["metric"] for e in ev}
    assert all(e["source"] for e in got["ab_control"]["evidence"])


def test_gpu_run_verdicts_energy_and_multi_node(gpu_report):
    got = verdicts(gpu_report)
    assert got["decode"]["classes"] == ["gpu_memory_bandwidth"]
    assert got["prefill"]["classes"] == ["gpu_compute"]
    cases = {c["case_id"]: c for c in summary(gpu_report)["cases"]}
    e = cases["decode"]["energy"]
    assert e["n_gpus"] == 4  # 2 nodes x 2 GPUs
    # 450 W x 4 GPUs over the ~8 s window, per 16 x 64 output tokens
    assert e["joules"] == pytest.approx(450 * 4 * cases["decode"]["window"]["duration_s"], rel=0.05)
    assert e["j_per_output_token"] == pytest.approx(e["joules"] / (16 * 64))
    text = (gpu_report / "report.md").read_text()
    assert "J per output token" in text
    # The rails were sampled and carried nothing (the factory's default rate is 0): the
    # panel is left out, and the report says why, not "no samples".
    run_section = text.split("## Run timeline")[1]
    assert "RDMA per rail: zero throughout this window" in run_section
    assert "RDMA per rail: no samples" not in run_section


def test_ab_table_shows_request_level_deltas(cpu_report):
    text = (cpu_report / "report.md").read_text()
    ab = text.split("## A/B comparisons")[1].split("## Run timeline")[0]
    assert "control (`ab_control`)" in ab and "treatment (`ab_treatment`)" in ab
    same = ab.split("Same output, request by request")[1]
    row = next(line for line in same.splitlines() if line.startswith("| treatment | `"))
    assert "66.29 -> 2.75" in row
    assert "344.8 -> 1.96" in row
    assert "2800 -> 16" in row
    ab_json = summary(cpu_report)["ab"][0]
    deltas = {d["effect"]["metric"]: d["effect"] for d in ab_json["deltas"]}
    cpu = deltas["proc_cpu_s"]
    assert cpu["unit"] == "request" and cpu["level"] == 0.95
    assert cpu["change_pct"] == pytest.approx(100 * (2.75 / 66.29 - 1), rel=0.03)
    assert cpu["ci_lo_pct"] <= cpu["change_pct"] <= cpu["ci_hi_pct"] < 0
    assert cpu["p_value"] < 0.05


def test_csv_files(cpu_report):
    with (cpu_report / "case_summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["case_id"] for r in rows] == ["light", "cpu_bound", "ab_control", "ab_treatment"]
    assert rows[1]["verdict_classes"].startswith("cpu_compute")
    assert float(rows[0]["ttft_p50_ms"]) > 0
    assert rows[2]["ab_arm"] == "control" and rows[2]["concurrency"] == "1"
    with (cpu_report / "case_hw_summary.csv").open() as fh:
        hw = list(csv.DictReader(fh))
    windows = {r["window"] for r in hw}
    assert {"light", "cpu_bound", "baseline:default", "cooldown:default", "run"} <= windows
    faults = [r for r in hw if r["window"] == "ab_control" and r["metric"] == "major_faults"]
    assert float(faults[0]["rate"]) == pytest.approx(42.0, rel=0.05)


def test_summary_json_is_sorted_and_plain(cpu_report):
    text = (cpu_report / "summary.json").read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["run"]["gpu_present"] is False
    assert any("GPU classes not assessed" in line for line in data["limits"])


def test_pngs_open_and_omit_empty_panels(cpu_report, gpu_report):
    import matplotlib.image as mpimg

    for run, n in ((cpu_report, 6), (gpu_report, 3)):  # cpu: 4 cases, run, A/B group
        pngs = sorted(p for p in (run / "plots").glob("*.png")
                      if not p.name.startswith("ledger-"))
        assert len(pngs) == n
        for p in pngs:
            img = mpimg.imread(p)
            assert img.shape[0] > 300 and img.shape[1] > 500
        # the time ledger: a bar and a stall timeline per case with requests
        ledger = sorted((run / "plots").glob("ledger-*.png"))
        assert len(ledger) == 2 * (n - 2 if run == cpu_report else n - 1)
        for p in ledger:
            img = mpimg.imread(p)
            assert img.shape[0] > 150 and img.shape[1] > 500
    cpu_h = mpimg.imread(cpu_report / "plots" / "run.png").shape[0]
    gpu_h = mpimg.imread(gpu_report / "plots" / "run.png").shape[0]
    assert gpu_h > cpu_h  # the GPU panels exist only where there is GPU data


@pytest.mark.integration
def test_pytest_benchmark_compare_reads_the_json(cpu_report, tmp_path):
    other = cpu_run(tmp_path, run_id="20250102T000000Z-test01", seed=2)
    write_report(other)
    data = json.loads((cpu_report / "benchmark.json").read_text())
    names = {b["fullname"] for b in data["benchmarks"]}
    assert "strata::cpu_bound::ttft" in names
    assert "strata::ab_control::control::e2e" in names  # an A/B arm is named
    assert len({b["name"] for b in data["benchmarks"]}) == len(data["benchmarks"])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    shutil.copy(cpu_report / "benchmark.json", a)
    shutil.copy(other / "benchmark.json", b)
    exe = Path(sys.executable).with_name("pytest-benchmark")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pytest_benchmark.cli"]
    out = subprocess.run(
        [*cmd, "compare", str(a), str(b), "--group-by", "name"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "Failed to load" not in out.stdout + out.stderr
    assert "cpu_bound::ttft" in out.stdout and "ab_control::control::e2e" in out.stdout
    assert "(0001)" not in out.stdout  # our files, not a .benchmarks folder


def test_summarize_case_on_a_live_folder(tmp_path):
    """At teardown: the case's cases.jsonl line not written yet, a torn requests line."""
    run = make_run(
        tmp_path,
        RunSpec(
            cases=[
                CaseSpec(
                    "busy", behaviour=dict(server_cores=3.95, other_cores=0.02), proc=(3.0, 0, 0)
                ),
            ]
        ),
    )
    (run / "cases.jsonl").write_text("")
    with (run / "requests.jsonl").open("a") as fh:
        fh.write('{"request_id": "busy/measured/99", "case_')
    res = summarize_case(run, "busy")
    assert res.verdict.classes[0] == "cpu_compute"
    assert res.metrics.n_requests == 8
    assert res.window is not None
    assert res.line is None and res.info == CaseLine(case_id="busy")
    props = dict(res.user_properties())
    assert props["bottleneck_1"] == "cpu_compute"
    assert props["n_requests"] == 8
    assert all(isinstance(v, (int, float, str)) for v in props.values())
    # a client self-check was not available yet: named, not guessed
    assert any("client_bound" in m for m in res.verdict.missing_signals)


def test_summarize_case_without_a_window_is_inconclusive(tmp_path):
    run = cpu_run(tmp_path)
    (run / "markers.csv").write_text("kind,name,case_id,start_wall_ns,end_wall_ns\n")
    res = summarize_case(run, "cpu_bound")
    assert res.window is None and res.hw == ()
    assert res.verdict.inconclusive or res.verdict.classes == ()
    assert res.metrics.n_requests == 8


def test_missing_collector_is_named_in_report(tmp_path):
    run = make_run(
        tmp_path,
        RunSpec(
            cases=[CaseSpec("c", behaviour=dict(server_cores=1.0))],
            unavailable={"proc": "permission denied reading /proc/1234/io"},
        ),
    )
    write_report(run)
    text = (run / "report.md").read_text()
    assert "node0: proc unavailable: permission denied" in text
    v = verdicts(run)["c"]
    assert v["inconclusive"] is True
    assert any("permission denied" in m for m in v["missing_signals"])
    assert v["finer_trace"]


def test_report_without_samples_or_markers(tmp_path):
    run = cpu_run(tmp_path)
    shutil.rmtree(run / "nodes")
    write_report(run, plots=False)
    text = (run / "report.md").read_text()
    assert "no proc samples" not in text  # no node folders: nothing claimed per node
    assert all(c["verdict"]["inconclusive"] for c in summary(run)["cases"])


@pytest.mark.integration
def test_ab_repetitions_of_an_arm_are_pooled(tmp_path):
    cases = [
        CaseSpec(
            f"mixed/{arm}/{i}",
            ab_group="mixed",
            ab_arm=arm,
            n_requests=6,
            duration_s=3.0 if arm == "control" else 6.0,
        )
        for i, arm in enumerate(("control", "treatment", "treatment", "control"))
    ]
    run = make_run(tmp_path, RunSpec(cases=cases))
    write_report(run)
    ab = summary(run)["ab"]
    assert [a["arms"] for a in ab] == [
        [
            {"arm": "control", "cases": ["mixed/control/0", "mixed/control/3"]},
            {"arm": "treatment", "cases": ["mixed/treatment/1", "mixed/treatment/2"]},
        ]
    ]
    ttft = next(d["effect"] for d in ab[0]["deltas"] if d["effect"]["metric"] == "ttft_ms")
    assert (ttft["n_control"], ttft["n_treatment"]) == (12, 12)
    assert ttft["unit"] == "request"
    assert ttft["change_pct"] == pytest.approx(100.0, rel=0.05)  # 6 s vs 3 s, same requests
    # the first table: one value per repetition, 2 + 2, a t-interval that says so
    (arm,) = ab[0]["effects"]
    e2e = next(e for e in arm["effects"] if e["metric"] == "e2e_p95_ms")
    assert (e2e["n_control"], e2e["n_treatment"], e2e["unit"]) == (2, 2, "repetition")
    assert e2e["method"] == "t-interval" and e2e["change_pct"] == pytest.approx(100.0, rel=0.05)
    assert [r[1] for r in arm["per_repetition"]] == [
        "mixed/control/0", "mixed/control/3", "mixed/treatment/1", "mixed/treatment/2"]
    text = (run / "report.md").read_text().split("## A/B comparisons")[1]
    assert "95% t-interval, 2/2 repetitions" in text
    assert text.index("e2e p95 (ms)") < text.index("Request by request")
    # 6 requests a repetition: under the 7 even p50 needs, so every percentile row is marked
    assert "| e2e p95 (ms)\u2020 |" in text and "e2e p95 (ms) n=6, needs 90" in text
    assert "| output tok/s |" in text  # not a percentile: never marked
    assert (run / "plots" / "case-mixed_control_0.png").exists()
    assert (run / "plots" / "ab-mixed.png").exists() and "(plots/ab-mixed.png)" in text


@pytest.mark.integration
def test_rails_findings_link_caps_and_clock_warnings_in_the_report(tmp_path):
    """A two-node CPU run whose head link is capped (profile telemetry.link_caps) and
    carries request/response traffic; one node's clock is uncertain past the interval."""
    cases = [CaseSpec("rpc", behaviour=dict(server_cores=0.8, net_bytes_s=0.6e6))]
    run = make_run(tmp_path, RunSpec(cases=cases, nodes=2, interval_s=0.25))
    mpath = run / "manifest.json"
    m = json.loads(mpath.read_text())
    m["telemetry"] = {"interval_s": 0.25, "link_caps_bits_s": {"node0/eth0": 8e6}}
    m["nodes"]["node1"]["clock_uncertainty_ns"] = 400_000_000
    mpath.write_text(json.dumps(m, indent=2, sort_keys=True))
    write_report(run)
    first = (run / "report.md").read_bytes()
    text = first.decode()
    limits = text.split("## Limits of this run")[1].split("## Cases at a glance")[0]
    assert "node node1: clock offset uncertain by ±400.0 ms" in limits
    assert "node node0: clock offset uncertain" not in limits
    case = text.split('<a id="case-rpc">')[1]
    assert "#### Rails, links and peers" in case
    assert "**net_round_trip_bound** (network)" in case
    assert "net_wire_busy = 1" in case and "`node0/net:eth0/tx_bytes,rx_bytes" in case
    (c,) = summary(run)["cases"]
    assert c["signals"]["net_wire_busy"] == pytest.approx(1.2, rel=0.05)
    assert "network" in c["verdict"]["classes"] + c["verdict"]["also_flagged"]
    assert [f["kind"] for f in c["rails_findings"]] == ["net_round_trip_bound"]
    write_report(run)
    assert (run / "report.md").read_bytes() == first
    # no link_caps: the 10 Gbit/s link speed hides the cap, and nothing is listed
    m["telemetry"] = {"interval_s": 0.25}
    mpath.write_text(json.dumps(m, indent=2, sort_keys=True))
    write_report(run)
    assert "#### Rails, links and peers" not in (run / "report.md").read_text()


def test_telemetry_facts_resolved_from_the_profile_and_read_from_the_manifest(tmp_path):
    """The profile is read once: its telemetry facts go into manifest.json, and analysis
    reads them from there (a raw profile table in the manifest is not consulted)."""
    from strata_plugin.configure.profile import load_profile
    from strata_plugin.formats.telemetry import TelemetryFacts

    path = tmp_path / "p.toml"
    path.write_text("""
name = "p"
[vars]
hcas = "mlx5_0,mlx5_3"
[server]
engine = "sglang"
api = "sglang"
argv = ["x"]
[server.configs.tp.env]
NCCL_IB_HCA = "{hcas}"
[telemetry]
interval_s = 1.0
collectors = ["proc", "net"]
gpu_expected = true
[telemetry.link_caps]
"head/veth0" = 8e6
"w/eth2" = 1e9
[[nodes]]
name = "head"
[[nodes]]
name = "w"
role = "worker"
ssh_host = "w.example"
""")
    facts = load_profile(path).telemetry_facts()
    assert facts.expected_rails == ("mlx5_0", "mlx5_3") and facts.expects_rdma
    assert facts.gpu_expected and facts.interval_s == 1.0
    m = {"telemetry": facts.to_json(),
         "profile": {"telemetry": {"interval_s": 9.0, "link_caps": {"x/y": 1}}}}
    read = TelemetryFacts.from_manifest(json.loads(json.dumps(m)))
    assert read == facts
    assert read.link_caps() == {("head", "veth0"): 1e6, ("w", "eth2"): 1.25e8}
    bad = TelemetryFacts.from_manifest({"telemetry": {
        "interval_s": -1, "link_caps_bits_s": {"bad": 1, "w/eth1": "x", "w/eth3": 8}}})
    assert bad.interval_s == 0.5 and bad.link_caps() == {("w", "eth3"): 1.0}
    for bare in ({}, {"telemetry": "x"}, {"telemetry": None}):
        facts = TelemetryFacts.from_manifest(bare)
        assert facts.link_caps() == {} and not facts.expects_rdma and facts.interval_s == 0.5
    assert TelemetryFacts.from_manifest({"gpu_expected": True}).gpu_expected  # older folders
    plain = TelemetryFacts.from_manifest({"telemetry": {"collectors": ["rdma"]}})
    assert not plain.expects_rdma  # recorded, not re-derived


def test_a_late_client_is_beside_the_first_class_and_the_report_says_why(tmp_path):
    """A client that fell behind is first only where its own time is the ledger's largest
    cause (issue 30); here the server's decode is, and the client is a modifier."""
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec(
        "starved", concurrency=2, client_bound=True,
        behaviour=dict(server_cores=0.4, running=1))]))
    write_report(run)
    got = verdicts(run)["starved"]
    assert got["classes"][0] == "cpu_compute" and not got["inconclusive"]
    assert "client_bound" in got["modifiers"] and "client_bound" not in got["classes"]
    assert any(n.startswith("client_bound beside it") for n in got["notes"])
    assert any("not trusted" in m for m in got["missing_signals"])
    text = (run / "report.md").read_text()
    assert "(18% of the requests' time)" in text
    assert "9 of 24 requests late" in text
