"""The network fault, through whole plugin runs: a two-node llama.cpp (llama-server on
the head, ggml-rpc-server on a worker namespace over a veth, tests/netlab.py) decoding
with the link free, then with a tc tbf rate cap on it.

Each arm is its own ``pytest`` run of one case against a profile that says what the
link really is: the free run declares nothing (the veth reports 10 Gbit/s), the capped
run declares the cap in ``telemetry.link_caps`` (no counter shows a qdisc's rate). The
verdict the plugin wrote must name ``network`` in the capped run, with its evidence,
and must not in the free run. Nothing may be left in the worker namespace.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from netlab import lab_fixture

from strata_plugin.report import summarize_case
from strata_plugin.testing import faults
from tests.test_robustness_support import PytestRun, llama_paths, make_project

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.netlab, pytest.mark.root]
RPC_PORT = 50052
CAP_BITS = 8_000_000  # tbf rate 8mbit
CASES = """
from strata_plugin.load.workload import Workload

def test_decode_over_the_link(strata):
    r = strata.run(Workload("net", isl=16, osl=48, requests=4), scale=False)
    assert not r.problems, r.problems
"""
#: Waits for the worker's RPC port before exec'ing llama-server (it gives up at once
#: when its RPC backend is not listening yet).
WAIT_PORT = ("import os, socket, sys, time\n"
             "host, port = sys.argv[1].rsplit(':', 1)\n"
             "deadline = time.monotonic() + 30\n"
             "while time.monotonic() < deadline:\n"
             "    try:\n"
             "        socket.create_connection((host, int(port)), 0.5).close(); break\n"
             "    except OSError:\n"
             "        time.sleep(0.1)\n"
             "os.execv(sys.argv[2], sys.argv[2:])\n")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from lab_fixture(tmp_path_factory)


def two_node_profile(path, lab, caps: bool) -> None:
    """llama-server on the head with its --rpc backend, ggml-rpc-server on the worker
    namespace over ssh; with ``caps``, the tbf rate declared as the link capacity."""
    p = llama_paths()
    if not p.get("rpc_server") or not os.path.exists(p["rpc_server"]):
        pytest.fail("ggml-rpc-server missing: rebuild with python -m strata_plugin setup --rebuild")
    rpc = f"{lab.worker_addr}:{RPC_PORT}"
    argv = [sys.executable, "-c", WAIT_PORT, rpc, p["llama_server"], "-m", p["model"],
            "--host", "{host}", "--port", "{port}", "-t", "1", "-c", "2048", "-np", "1",
            "--rpc", rpc, "-ngl", "4", "--no-webui", "--metrics"]
    worker = [p["rpc_server"], "-H", lab.worker_addr, "-p", str(RPC_PORT), "-t", "1"]
    link_caps = (f'[telemetry.link_caps]\n"head/{lab.head_if}" = {CAP_BITS}\n'
                 f'"worker/{lab.worker_if}" = {CAP_BITS}\n') if caps else ""
    path.write_text(f"""
name = "two-node-rpc"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = {json.dumps(argv)}
worker_argv = {json.dumps(worker)}
health_timeout_s = 60
stop_timeout_s = 5
request_timeout_s = 120
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.25
baseline_s = 1
cooldown_s = 0
collectors = ["proc", "cpu", "mem", "net"]
{link_caps}
[[nodes]]
name = "head"
[[nodes]]
name = "worker"
role = "worker"
ssh_host = "{lab.sshd.alias}"
""")


def _arm(tmp_path, lab, arm: str):
    proj = tmp_path / arm
    proj.mkdir()
    make_project(proj, CASES)
    two_node_profile(proj / "profile.toml", lab, caps=arm == "capped")
    reports = tmp_path / "reports"
    run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                           f"--strata-reports-dir={reports}", f"--strata-run-id={arm}"],
                          tmp_path / f"{arm}.txt", reports / arm, cwd=proj,
                          env={"STRATA_SSH_CONFIG": str(lab.sshd.config)})
    rc = run.wait(240)
    assert rc == 0, run.text()[-4000:]
    v = summarize_case(run.run_dir, "test_cases.py::test_decode_over_the_link[default]").verdict
    met = [f"{e.metric} {e.value:g} {e.op} {e.threshold_value:g}" for e in v.evidence
           if e.cls == "network" and e.met]
    print(f"network/{arm}: verdict '{v.summary()}' also {list(v.also_flagged)}; "
          f"network evidence: {met or '-'}")
    return v, met


def test_capped_link_is_named_and_the_free_link_is_not(lab, tmp_path):
    free, _ = _arm(tmp_path, lab, "free")
    with faults.LinkCap(lab, rate="8mbit", burst="32kbit", latency="50ms"):
        capped, met = _arm(tmp_path, lab, "capped")
    assert not lab.wait_worker_clean(10), "processes left in the worker namespace"
    assert "network" not in free.past_threshold, free
    # Every class past threshold stays in the verdict with its evidence; the capped link
    # is one, and it came with the load (not in the idle baseline before the case).
    assert "network" in capped.past_threshold, capped
    assert met, capped.evidence
    assert "network" in capped.appeared_with_load, capped
