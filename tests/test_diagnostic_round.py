"""The diagnostic round on the embedded target: real llama-server, real tracefs, real faults.

One inner pytest run (``--strata-escalate``) with three cases on a private copy of the
model (the kernel pages out only pages no other process maps; other llama-servers on a
shared machine map the cached model): a clean decode, the same decode with CpuHogs pinned
to the server's cores, and the same decode with PageOut evicting the model every 0.25 s.
Each case is re-run with the trace over its measured window; the report is read back:

* the hogs' window is settled as ``cpu_contention`` by the scheduling trace, which names
  the hog processes among those that held the server's CPUs while it waited;
* the clean window is settled the other way (``cpu_compute`` or no CPU class) unless an
  independent watch of the host (``faults.GroundTruth``: other users' CPU load over the
  traced window) says other processes really held a quarter of the cores - a shared
  machine is not quiet on demand, and then contention is the truth;
* the page-out window's block/fault trace names the model copy, with a latency
  distribution, and the verdict after it names ``io_page_faults``;
* the traces agree with the server's /proc counters (CPU time, bytes read);
* report.md shows the before/after verdicts, the key tables and the trace's overhead;
* no tracefs instance of Strata is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.run import tracing

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or tracing.tracefs_root() is None,
                       reason="needs root and tracefs"),
]
ROOT = Path(__file__).resolve().parents[1]
#: Other users' load over a window that makes contention the truth (test_faults' TRUTH).
FOREIGN_CORES_FRAC = 0.25
#: The inner run took 10.5 min at load average 14 on 2 cores (3 cases, each twice).
INNER_TIMEOUT_S = float(os.environ.get("STRATA_DIAG_TIMEOUT_S", "1800"))

CASES = '''
import json, os
from pathlib import Path
from strata_plugin.load.workload import Workload
from strata_plugin.testing import faults

W = Workload("diag", isl=64, osl=24, concurrency=2, requests=6, warmups=1, seed=51)
OUT = Path(os.environ["DIAG_OUT"])


def _run(strata, server, case_id, injector):
    watch = faults.GroundTruth(server.pid).start()
    try:
        with injector as inj:
            strata.run(W, case_id=case_id, scale=False)
    finally:
        watch.stop()
    traced = strata.diagnostics[-1]
    facts = {"truth": watch.window(*traced.window_ns), "decision": strata.decisions,
             "pids": [p.pid for _, p in getattr(inj, "procs", [])]}
    (OUT / (case_id.replace("/", "_") + ".json")).write_text(json.dumps(facts, default=str))


def test_clean(strata, strata_server):
    _run(strata, strata_server, "diag/clean", faults.NoFault())


def test_hogs(strata, strata_server):
    cores = tuple(sorted(os.sched_getaffinity(strata_server.pid)))
    _run(strata, strata_server, "diag/hogs", faults.CpuHogs(cores, per_core=1, max_s=600))


def test_pageout(strata, strata_server):
    _run(strata, strata_server, "diag/pageout",
         faults.PageOut(strata_server.pid, os.environ["DIAG_MODEL"], period_s=0.25,
                       max_s=600))
'''


def _paths() -> dict:
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail("llama-server is not built: run `bash scripts/setup.sh` first\n" + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """The inner run, once for the module's checks: its folder, facts, and stdout."""
    paths = _paths()
    tmp = tmp_path_factory.mktemp("diag")
    model = tmp / "private-model.gguf"
    shutil.copyfile(paths["model"], model)
    with model.open("rb+") as fh:  # dirty pages cannot be paged out: write them back
        os.fsync(fh.fileno())
    profile = (ROOT / "strata_plugin/profiles/local.toml").read_text()
    profile = profile.replace('model = "{strata_cache}/models/tiny-llama.gguf"',
                              f'model = "{model}"')
    profile = profile.replace('name = "local"', 'name = "local-private-model"')
    assert str(model) in profile
    (tmp / "profile.toml").write_text(profile)
    (tmp / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = {tmp / 'profile.toml'}\n"
        f"strata_reports_dir = {tmp / 'reports'}\nstrata_escalate = auto\n")
    (tmp / "test_diag.py").write_text(CASES)
    out = tmp / "facts"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), DIAG_OUT=str(out), DIAG_MODEL=str(model))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strata-run-id=diag",
         "--strata-escalate=auto,diag/clean,diag/hogs,diag/pageout", "test_diag.py"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=INNER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the inner run stops its server and removes its trace
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"the inner run took over {INNER_TIMEOUT_S} s (a crowded machine?)\n"
                    + stdout[-3000:] + stderr[-3000:])
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    facts = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return {"dir": tmp / "reports" / "diag", "facts": facts, "model": str(model),
            "stdout": stdout}


@pytest.fixture(scope="module")
def diags(run) -> dict:
    from strata_plugin.analysis.case_summary import analyze_run
    from strata_plugin.analysis.traces.diagnostics import diagnose

    ra = analyze_run(run["dir"])
    out = {d.case_id: d for d in diagnose(run["dir"], ra.analyses)}
    for d in out.values():  # the figures the notes quote
        print(f"{d.case_id}: before '{d.settlement.before.summary()}' -> after "
              f"'{d.settlement.after.summary()}' (settled by {d.settlement.settled_by}); "
              f"overhead {d.overhead:.1%}; timed {d.timed}; traced {d.traced}")
    return out


def test_every_case_was_traced_and_kept_apart_from_the_timed_case(run, diags):
    assert set(diags) == {"diag/clean", "diag/hogs", "diag/pageout"}
    lines = [json.loads(x) for x in (run["dir"] / "cases.jsonl").read_text().splitlines()]
    traced = {x["case_id"] for x in lines if x.get("diagnostic_of")}
    assert traced == {f"{c}~traced" for c in diags}
    for d in diags.values():
        assert not d.settlement.unavailable, d.settlement.unavailable
        assert d.capture["overruns"] == 0
        assert d.timed["output_tok_s"] > 0 and d.traced["output_tok_s"] > 0
    assert tracing.strata_instances() == []


def test_the_traces_agree_with_an_independent_watch_of_proc(run, diags):
    """The sched trace's server CPU time and the block trace's model bytes, against the
    server's /proc counters over the same window (faults.GroundTruth)."""
    for cid, d in diags.items():
        truth = run["facts"][cid.replace("/", "_")]["truth"]
        # The watch reads /proc every period_s (0.25 s): each end of the window is known
        # to one period, so its CPU figure can be off by the server's CPU over two periods
        # spread over the window. The trace is exact at both ends.
        edge = 2 * 0.25 * max(truth["server_cores"], d.sched.server_cores) / truth["window_s"]
        assert d.sched.server_cores == pytest.approx(truth["server_cores"], rel=0.1,
                                                     abs=max(0.02, edge)), (cid, truth)
    d = diags["diag/pageout"]
    truth = run["facts"]["diag_pageout"]["truth"]
    top = d.block.top
    rate = max(top.read_in_bytes, top.request_bytes) / d.block.window_s
    # As above: the watch's window ends are known to one 0.25 s period each.
    assert rate == pytest.approx(truth["server_read_bytes_s"],
                                 rel=0.15 + 2 * 0.25 / truth["window_s"]), truth


def test_hogs_are_settled_as_contention_by_the_scheduling_trace(run, diags):
    d = diags["diag/hogs"]
    assert d.settlement.after.classes[0] == "cpu_contention", d.settlement.after
    assert not d.settlement.after.inconclusive and "sched" in d.settlement.settled_by
    hogs = {str(p) for p in run["facts"]["diag_hogs"]["pids"]}
    named = [k for k, _ in d.sched.displaced_top if k.split("(")[-1].rstrip(")") in hogs]
    assert named, (hogs, d.sched.displaced_top)


def test_clean_is_settled_the_other_way_unless_the_host_was_really_crowded(run, diags):
    d = diags["diag/clean"]
    truth = run["facts"]["diag_clean"]["truth"]
    crowded = truth.get("foreign_cores", 0) / (os.cpu_count() or 1) >= FOREIGN_CORES_FRAC
    sched_decision = next(x for x in d.settlement.decisions if x.trace == "sched")
    print(f"clean: foreign load {truth.get('foreign_cores')} cores; sched trace: "
          f"{sched_decision.decided}: {sched_decision.why}")
    if crowded:
        assert sched_decision.decided == "cpu_contention"
    else:
        assert sched_decision.decided != "cpu_contention", sched_decision.why
        assert "cpu_contention" not in d.settlement.after.classes


def test_pageout_is_attributed_to_the_model_file_with_a_latency_distribution(run, diags):
    d = diags["diag/pageout"]
    top = d.block.top
    assert top is not None and top.path == run["model"], d.block.table()
    assert top.latency is not None and top.latency.n >= 5
    assert top.latency.p50_ms <= top.latency.p99_ms
    block = next(x for x in d.settlement.decisions if x.trace == "block")
    assert block.decided == "io_page_faults" and run["model"] in block.why
    after = d.settlement.after
    assert "io_page_faults" in after.classes + after.also_flagged, after
    assert "block" in d.settlement.settled_by


def test_report_shows_before_after_tables_and_overhead(run, diags):
    md = (run["dir"] / "report.md").read_text()
    assert "## Diagnostic round" in md
    for cid, d in diags.items():
        assert f"### {cid} (traced repetition: {cid}~traced)" in md
        assert f"{d.overhead:.1%}" in md
    assert "Who held the server's CPUs while its threads waited" in md
    assert "Block I/O and faults by file" in md and run["model"] in md
