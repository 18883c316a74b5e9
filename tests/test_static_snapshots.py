"""Static snapshots before and after a run, and the counters that should not move."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.agent.snapshot import nic_facts, parse_ethtool_stats, rdma_facts
from strata_plugin.analysis.static_diff import moved_counters, node_static

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, **files: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / f"{name}.json").write_text(json.dumps(data))


def _snapshots(tmp_path: Path, after_crc: int, after_sym: int, after_ecc: int,
               after_state: str = "4: ACTIVE") -> Path:
    node = tmp_path / "nodes" / "n1"
    for label, crc, sym, ecc, state in (("before", 2, 0, 5, "4: ACTIVE"),
                                        ("after", after_crc, after_sym, after_ecc, after_state)):
        _write(node / "static" / label,
               nics={"eth0": {"operstate": "up", "speed": "100000",
                              "statistics": {"rx_bytes": 10 if label == "before" else 99999,
                                             "rx_crc_errors": crc},
                              "ethtool_stats": {"rx_discards_phy": 0, "rx_packets_phy": 1}}},
               rdma={"mlx5_0/1": {"state": state, "phys_state": "5: LinkUp", "rate": "400",
                                  "counters": {"symbol_error": sym, "port_rcv_data": 7},
                                  "hw_counters": {"out_of_buffer": 0}}},
               gpus={"driver_version": "570.1",
                     "gpus": [{"index": 0, "ecc_corrected_volatile": ecc,
                               "retired_pages_dbe": 0,
                               "remapped_rows_pending": "UNAVAILABLE: not supported"}]},
               errors={})
    return node


def test_only_error_counters_that_grew_are_named(tmp_path):
    quiet = _snapshots(tmp_path / "a", after_crc=2, after_sym=0, after_ecc=5)
    assert moved_counters("n1", quiet / "static" / "before", quiet / "static" / "after") == []
    moved = _snapshots(tmp_path / "b", after_crc=3, after_sym=1, after_ecc=6,
                       after_state="1: DOWN")
    lines = [m.line() for m in moved_counters("n1", moved / "static" / "before",
                                              moved / "static" / "after")]
    assert lines == ["n1 nic eth0: rx_crc_errors 2 -> 3 (+1)",
                     "n1 rdma mlx5_0/1: state 4: ACTIVE -> 1: DOWN",
                     "n1 rdma mlx5_0/1: symbol_error 0 -> 1 (+1)",
                     "n1 gpu0: ecc_corrected_volatile 5 -> 6 (+1)"]
    st = node_static(moved)
    assert st.before and st.after and st.facts["rdma_ports"] == ["mlx5_0/1"]


def test_missing_after_is_not_compared(tmp_path):
    node = _snapshots(tmp_path, 9, 9, 9)
    import shutil

    shutil.rmtree(node / "static" / "after")
    st = node_static(node)
    assert st.before and not st.after and st.moved == ()


def test_sysfs_readers(tmp_path):
    net = tmp_path / "net" / "ib0" / "statistics"
    net.mkdir(parents=True)
    (net / "rx_errors").write_text("3\n")
    (net / "rx_bytes").write_text("100\n")
    (tmp_path / "net" / "ib0" / "operstate").write_text("up\n")
    port = tmp_path / "ib" / "mlx5_3" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "gids").mkdir()
    (port / "counters" / "link_downed").write_text("0\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "gids" / "0").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    nics = nic_facts(str(tmp_path / "net"))
    assert nics["ib0"]["statistics"] == {"rx_bytes": 100, "rx_errors": 3}
    assert nics["ib0"]["operstate"] == "up" and "ethtool_stats" not in nics["ib0"]
    rdma = rdma_facts(str(tmp_path / "ib"))
    assert rdma["mlx5_3/1"]["state"] == "4: ACTIVE"
    assert rdma["mlx5_3/1"]["counters"] == {"link_downed": 0}
    assert rdma["mlx5_3/1"]["gid0"].startswith("fe80:")
    assert parse_ethtool_stats("NIC statistics:\n     rx_crc_errors: 4\n     tx_bytes: 9\n") == {
        "rx_crc_errors": 4, "tx_bytes": 9}


CASE = """
from strata_plugin.load.workload import Workload

def test_tiny(strata):
    r = strata.run(Workload("tiny", isl=16, osl=4, requests=2), scale=False)
    assert not r.problems, r.problems
"""


@pytest.mark.integration
def test_embedded_target_run_has_snapshots_before_and_after(tmp_path):
    """A real run on the embedded llama.cpp target: both snapshots on the node, the
    server's CPU affinity in them, and the report's environment section."""
    paths = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                           capture_output=True, text=True, check=False)
    if paths.returncode != 0:
        pytest.fail("llama-server is not built: run `bash scripts/setup.sh` first\n"
                    + paths.stderr)
    (tmp_path / "test_tiny.py").write_text(CASE)
    (tmp_path / "conftest.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "test_tiny.py", "--strata-profile=local",
         f"--strata-reports-dir={tmp_path / 'reports'}", "--strata-run-id=emb",
         "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    run = tmp_path / "reports" / "emb"
    static = run / "nodes" / "local" / "static"
    for label in ("before", "after"):
        files = {p.name for p in (static / label).iterdir()}
        assert {"host.json", "cpu.json", "nics.json", "server.json", "errors.json"} <= files
    server = json.loads((static / "before" / "server.json").read_text())[0]
    assert "llama-server" in server["exe"] and server["affinity"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["static_snapshots"] == {"local": {"before": "ok", "after": "ok"}}
    report = (run / "report.md").read_text()
    section = report.split("## Environment (static snapshots)", 1)[1].split("\n## ", 1)[0]
    assert "| local | yes | yes |" in section
    assert "after minus before" in section
