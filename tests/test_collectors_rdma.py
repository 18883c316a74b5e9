"""RDMA counters from a saved sysfs tree (this machine has no RDMA devices)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.rdma import RdmaCollector, parse_rate_gbps

FIXTURE = Path(__file__).parent / "data" / "sysfs_infiniband"


@pytest.fixture
def ib_root(tmp_path) -> Path:
    root = tmp_path / "infiniband"
    shutil.copytree(FIXTURE, root)
    return root


def values(emits):
    return {(dev, metric): value for _, dev, metric, value, _ in emits}


def read_int(path: Path) -> int:
    return int(path.read_text())


def test_rails_and_word_counters_become_bytes(ib_root) -> None:
    c = RdmaCollector(root=str(ib_root))
    c.probe()
    v = values(c.sample(time.time_ns()))
    assert {dev for dev, _ in v} == {"mlx5_0/1", "mlx5_1/1"}
    counters = ib_root / "mlx5_0" / "ports" / "1" / "counters"
    assert v[("mlx5_0/1", "xmit_bytes")] == 4 * read_int(counters / "port_xmit_data")
    assert v[("mlx5_0/1", "rcv_bytes")] == 4 * read_int(counters / "port_rcv_data")
    assert ("mlx5_0/1", "port_xmit_data") not in v  # only the converted name is emitted
    assert v[("mlx5_0/1", "port_xmit_packets")] == read_int(counters / "port_xmit_packets")
    assert v[("mlx5_0/1", "port_xmit_wait")] == read_int(counters / "port_xmit_wait")
    assert v[("mlx5_0/1", "rate_gbps")] == 400.0
    assert v[("mlx5_1/1", "rate_gbps")] == 200.0
    assert v[("mlx5_0/1", "state")] == 4


def test_congestion_and_retransmit_hw_counters(ib_root) -> None:
    c = RdmaCollector(root=str(ib_root))
    c.probe()
    v = values(c.sample(time.time_ns()))
    hw = ib_root / "mlx5_1" / "ports" / "1" / "hw_counters"
    for name in (
        "np_cnp_sent",
        "rp_cnp_handled",
        "np_ecn_marked_roce_packets",
        "local_ack_timeout_err",
        "out_of_sequence",
        "packet_seq_err",
    ):
        assert v[("mlx5_1/1", name)] == read_int(hw / name), name
    assert ("mlx5_1/1", "lifespan") not in v  # a setting, not a counter


def test_deltas_track_growth_in_4_byte_words(ib_root) -> None:
    c = RdmaCollector(root=str(ib_root))
    c.probe()
    a = values(c.sample(time.time_ns()))
    f = ib_root / "mlx5_1" / "ports" / "1" / "counters" / "port_xmit_data"
    f.write_text(f"{read_int(f) + 250_000_000}\n")  # 1 GB more on the wire
    cnp = ib_root / "mlx5_1" / "ports" / "1" / "hw_counters" / "np_cnp_sent"
    cnp.write_text(f"{read_int(cnp) + 12}\n")
    b = values(c.sample(time.time_ns()))
    assert b[("mlx5_1/1", "xmit_bytes")] - a[("mlx5_1/1", "xmit_bytes")] == 1_000_000_000
    assert b[("mlx5_1/1", "np_cnp_sent")] - a[("mlx5_1/1", "np_cnp_sent")] == 12
    assert b[("mlx5_0/1", "xmit_bytes")] == a[("mlx5_0/1", "xmit_bytes")]


def test_unreadable_counter_is_reported_per_metric(ib_root) -> None:
    bad = ib_root / "mlx5_0" / "ports" / "1" / "hw_counters" / "out_of_buffer"
    bad.unlink()
    bad.mkdir()  # reading a directory fails like an unsupported counter does
    c = RdmaCollector(root=str(ib_root))
    c.probe()
    v = values(c.sample(time.time_ns()))
    unavailable, _, _, _ = c.drain()
    assert "mlx5_0/1/out_of_buffer" in unavailable
    assert ("mlx5_0/1", "out_of_sequence") in v


def test_no_rdma_devices_is_unavailable(tmp_path) -> None:
    with pytest.raises(Unavailable, match="no RDMA devices"):
        RdmaCollector(root=str(tmp_path / "absent")).probe()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Unavailable, match="no RDMA devices"):
        RdmaCollector(root=str(tmp_path / "empty")).probe()


def test_real_sysfs_here() -> None:
    c = RdmaCollector()
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        c.probe()
        assert c.sample(time.time_ns())
    else:
        with pytest.raises(Unavailable, match="no RDMA devices"):
            c.probe()


def test_rate_parsing() -> None:
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("25 Gb/sec (1X EDR)") == 25.0
    assert parse_rate_gbps("garbage") is None
