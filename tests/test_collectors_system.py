"""Host collectors (cpu, mem, disk, net, numa) parse this machine's real /proc and /sys."""

from __future__ import annotations

import os
import socket
import time

import pytest

from strata_plugin.agent.collectors.cpu import CpuCollector, cgroup_cpu_stat_files
from strata_plugin.agent.collectors.disk import DiskCollector
from strata_plugin.agent.collectors.mem import MemCollector
from strata_plugin.agent.collectors.net import NetCollector
from strata_plugin.agent.collectors.numa import NumaCollector, cpulist
from strata_plugin.agent.targets import ProcessTargets


def values(emits):
    return {(dev, metric): value for _, dev, metric, value, _ in emits}


def kinds(emits):
    return {metric: kind for _, _, metric, _, kind in emits}


def probed(c):
    c.probe()
    return c


def test_cpu_per_core_counters_and_busy_time_grows() -> None:
    c = probed(CpuCollector())
    a = values(c.sample(time.time_ns()))
    ncpu = os.cpu_count()
    cores = {dev for dev, _ in a if dev.startswith("cpu")}
    assert cores == {f"cpu{i}" for i in range(ncpu)}
    t = time.process_time()
    while time.process_time() - t < 0.3:  # burn CPU in this process
        pass
    b = values(c.sample(time.time_ns()))
    assert b[("", "busy_s")] - a[("", "busy_s")] >= 0.25
    total = sum(b[(f"cpu{i}", "busy_s")] for i in range(ncpu))
    assert abs(total - b[("", "busy_s")]) < 0.05 * b[("", "busy_s")] + 1
    for key in ("iowait_s", "steal_s", "idle_s"):
        assert ("cpu0", key) in b
    assert b[("", "ctxt")] > a[("", "ctxt")]
    assert b[("", "load1")] >= 0 and b[("", "runnable")] >= 1
    k = kinds(c.sample(time.time_ns()))
    assert k["busy_s"] == "counter" and k["load1"] == "gauge"
    c.close()


def test_cpu_pressure_when_the_kernel_has_psi() -> None:
    c = probed(CpuCollector())
    v = values(c.sample(time.time_ns()))
    unavailable, _, _, _ = c.drain()
    for res in ("cpu", "io", "memory"):
        if os.path.exists(f"/proc/pressure/{res}"):
            assert ("", f"psi_{res}_some_s") in v
            expected = int(open(f"/proc/pressure/{res}").read().split("total=")[1].split()[0])
            assert abs(v[("", f"psi_{res}_some_s")] - expected / 1e6) < 5
        else:
            assert f"psi_{res}" in unavailable
    c.close()


def test_cgroup_cpu_throttling_counters_or_a_reason() -> None:
    c = probed(CpuCollector())
    v = values(c.sample(time.time_ns()))
    unavailable, _, _, _ = c.drain()
    files = cgroup_cpu_stat_files("self")
    if not files:
        assert "cgroup" in unavailable
        return
    text = "".join(open(f).read() for f in files)
    if "nr_throttled" in text:
        assert ("", "cgroup_nr_throttled") in v and ("", "cgroup_throttled_s") in v
    else:
        assert "cgroup_nr_throttled" in unavailable
    if "usage_usec" in text:
        assert v[("", "cgroup_usage_s")] > 0


def test_cgroup_from_a_directory(tmp_path) -> None:
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\n"
        "nr_periods 100\nnr_throttled 7\nthrottled_usec 250000\n"
    )
    c = probed(CpuCollector(cgroup=str(tmp_path)))
    v = values(c.sample(time.time_ns()))
    assert v[("", "cgroup_nr_throttled")] == 7
    assert v[("", "cgroup_throttled_s")] == pytest.approx(0.25)
    assert v[("", "cgroup_usage_s")] == pytest.approx(5.0)


def test_memory_matches_proc_meminfo() -> None:
    c = probed(MemCollector())
    v = values(c.sample(time.time_ns()))
    meminfo = {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in open("/proc/meminfo")
        if line.split()[-1] == "kB"
    }
    assert v[("", "mem_total_bytes")] == meminfo["MemTotal"]
    assert 0 < v[("", "mem_available_bytes")] <= v[("", "mem_total_bytes")]
    for key in ("cached_bytes", "mlocked_bytes", "dirty_bytes", "swap_total_bytes"):
        assert ("", key) in v
    assert v[("", "pgfault")] > 0
    assert kinds(c.sample(time.time_ns()))["pgmajfault"] == "counter"


def test_disk_whole_devices_and_written_bytes(tmp_path) -> None:
    c = probed(DiskCollector())
    a = values(c.sample(time.time_ns()))
    devs = {dev for dev, _ in a}
    assert devs and all(os.path.exists(f"/sys/block/{d}") for d in devs)
    assert not any(d.startswith("loop") for d in devs)
    path = tmp_path / "w"
    with open(path, "wb") as fh:
        fh.write(os.urandom(4 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    b = values(c.sample(time.time_ns()))
    written = sum(b[(d, "write_bytes")] - a[(d, "write_bytes")] for d in devs)
    assert written >= 4 << 20
    for d in devs:
        assert b[(d, "busy_s")] >= a[(d, "busy_s")]


def test_network_loopback_bytes_grow() -> None:
    c = probed(NetCollector())
    a = values(c.sample(time.time_ns()))
    assert ("lo", "rx_bytes") in a
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(64):
        cli.sendto(b"x" * 16000, srv.getsockname())
    srv.close()
    cli.close()
    b = values(c.sample(time.time_ns()))
    assert b[("lo", "tx_bytes")] - a[("lo", "tx_bytes")] >= 64 * 16000


def test_numa_nodes_and_server_affinity() -> None:
    t = ProcessTargets(pids=[os.getpid()])
    c = NumaCollector(t)
    c.probe()
    v = values(c.sample(time.time_ns()))
    assert v[("node0", "mem_total_bytes")] > 0
    assert v[("node0", "mem_free_bytes")] <= v[("node0", "mem_total_bytes")]
    assert ("node0", "numa_hit") in v
    assert v[(f"pid{os.getpid()}", "affinity_ncpus")] == len(os.sched_getaffinity(0))
    _, info, _, _ = c.drain()
    assert any(i["kind"] == "affinity" for i in info)
    assert any(i["kind"] == "numa" and "node0" in i["nodes"] for i in info)


def test_cpulist_compacts_ranges() -> None:
    assert cpulist({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert cpulist(set()) == ""


def test_net_link_speed_from_sysfs(tmp_path):
    from strata_plugin.agent.collectors.net import NetCollector

    (tmp_path / "lo").mkdir()
    (tmp_path / "lo" / "speed").write_text("-1\n")  # what virtual devices report
    c = NetCollector(sys_class_net=str(tmp_path))
    c.probe()
    rows = c.sample(1)
    speeds = {dev: v for _, dev, metric, v, kind in rows if metric == "link_speed_mbps"}
    assert "lo" not in speeds
    iface = next(dev for _, dev, metric, _, _ in rows if dev != "lo" and metric == "rx_bytes")
    (tmp_path / iface).mkdir()
    (tmp_path / iface / "speed").write_text("25000\n")
    c2 = NetCollector(sys_class_net=str(tmp_path))
    rows = c2.sample(2)
    assert (2, iface, "link_speed_mbps", 25000, "gauge") in rows
