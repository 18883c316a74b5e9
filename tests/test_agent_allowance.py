"""The allowance collector (agent/collectors/allowance.py): the CPUs the server may use,
sampled every tick so a change mid-run is seen, and the busiest other processes, named.

Real processes throughout: a stand-in server with two spinning threads (the one of
tests/test_allowance_faults.py), its affinity cut mid-run by ``os.sched_setaffinity``
under a running agent process, and a v1 cpuset of its own (root and the cgroup v1 cpuset
hierarchy; skipped with the reason elsewhere). The cgroup readers on fabricated
hierarchies (v1 and v2), and the window's signals from the agent's own recorded samples.
"""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent import cgroups
from strata_plugin.agent.collectors.allowance import AllowanceCollector
from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.analysis import signals
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window
from strata_plugin.testing import allowance, faults
from tests.test_allowance_faults import SERVER

TWO_CPUS = (os.cpu_count() or 1) >= 2 and len(os.sched_getaffinity(0)) >= 2


@pytest.fixture
def server():
    p = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    yield p
    for pid in reversed(faults.tree_threads(p.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    p.wait(10)


@pytest.fixture
def procs():
    out: list[subprocess.Popen] = []
    yield out
    for p in out:
        p.kill()
        p.wait(10)


def _pin_tree(pid: int, cpus: set[int]) -> None:
    """What ``taskset -a -p`` does: every thread of the tree."""
    for tids in faults.tree_threads(pid).values():
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)


def _rows(emits, metric: str) -> list[tuple[str, float]]:
    return [(dev, v) for _w, dev, m, v, _k in emits if m == metric]


# --- the kernel's CPU lists and the cgroup files ----------------------------------------


def test_cpu_lists_read_and_write_as_the_kernel_does():
    assert cgroups.parse_cpulist("0-3,6,8-9\n") == frozenset({0, 1, 2, 3, 6, 8, 9})
    assert cgroups.parse_cpulist(b"1") == frozenset({1})
    assert cgroups.parse_cpulist("\n") == frozenset()
    assert cgroups.parse_cpulist("3-1") is None and cgroups.parse_cpulist("a-b") is None
    assert cgroups.parse_cpulist(None) is None
    assert cgroups.format_cpulist({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert cgroups.format_cpulist({4}) == "4" and cgroups.format_cpulist(()) == ""
    mine = os.sched_getaffinity(0)
    status = Path("/proc/self/status").read_text()
    listed = next(ln.split(":", 1)[1] for ln in status.splitlines()
                  if ln.startswith("Cpus_allowed_list"))
    assert cgroups.parse_cpulist(listed) == mine
    assert cgroups.parse_cpulist(cgroups.format_cpulist(mine)) == mine


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_cpuset_file_v1_and_v2_and_the_nearest_v2_ancestor(tmp_path):
    v1 = tmp_path / "v1"
    _write(v1 / "cpuset" / "pod" / "cpuset.effective_cpus", "2-3\n")
    assert cgroups.cpuset_file(b"3:cpuset:/pod\n0::/\n", str(v1)) == str(
        v1 / "cpuset" / "pod" / "cpuset.effective_cpus")
    # v2: the group has no cpuset controller of its own: its nearest ancestor's CPUs
    v2 = tmp_path / "v2"
    _write(v2 / "cgroup.controllers", "cpuset cpu\n")
    _write(v2 / "kube" / "cpuset.cpus.effective", "0-1\n")
    (v2 / "kube" / "pod" / "ctr").mkdir(parents=True)
    assert cgroups.cpuset_file(b"0::/kube/pod/ctr\n", str(v2)) == str(
        v2 / "kube" / "cpuset.cpus.effective")
    _write(v2 / "kube" / "pod" / "ctr" / "cpuset.cpus.effective", "1\n")
    assert cgroups.cpuset_file(b"0::/kube/pod/ctr\n", str(v2)) == str(
        v2 / "kube" / "pod" / "ctr" / "cpuset.cpus.effective")
    # no cpuset controller anywhere: none
    bare = tmp_path / "bare"
    _write(bare / "cgroup.controllers", "cpu\n")
    assert cgroups.cpuset_file(b"0::/x\n", str(bare)) == ""


def test_the_tightest_quota_up_the_hierarchy(tmp_path):
    root = tmp_path / "cg"
    slice_, ctr = root / "cpu" / "slice", root / "cpu" / "slice" / "ctr"
    for d, q in ((root / "cpu", "-1"), (slice_, "50000"), (ctr, "-1")):
        _write(d / "cpu.cfs_quota_us", q + "\n")
        _write(d / "cpu.cfs_period_us", "100000\n")
    dirs = cgroups.CgroupDirs(v1_cpu=str(ctr))
    assert cgroups.cpu_quota_cores(dirs) is None  # its own group sets none
    assert cgroups.cpu_quota_limit(dirs, str(root)) == 0.5  # its parent slice does
    _write(ctr / "cpu.cfs_quota_us", "150000\n")
    assert cgroups.cpu_quota_limit(dirs, str(root)) == 0.5  # the tighter one binds
    _write(ctr / "cpu.cfs_quota_us", "20000\n")
    assert cgroups.cpu_quota_limit(dirs, str(root)) == 0.2
    v2 = tmp_path / "v2"
    _write(v2 / "cgroup.controllers", "cpu\n")
    _write(v2 / "a" / "cpu.max", "max 100000\n")
    _write(v2 / "a" / "b" / "cpu.max", "250000 100000\n")
    assert cgroups.cpu_quota_limit(cgroups.CgroupDirs(v2=str(v2 / "a" / "b")),
                                   str(v2)) == 2.5
    _write(v2 / "a" / "b" / "cpu.max", "max 100000\n")
    assert cgroups.cpu_quota_limit(cgroups.CgroupDirs(v2=str(v2 / "a" / "b")),
                                   str(v2)) is None


# --- the allowance of a real process ------------------------------------------------------


@pytest.mark.integration  # 3.5 s of real waiting on the quiet VM
@pytest.mark.skipif(not TWO_CPUS, reason="an allowance smaller than the host's needs 2 CPUs")
def test_the_agent_sees_an_affinity_cut_mid_run(tmp_path, server):
    """A running agent process at 0.25 s; the stand-in server's every thread is pinned to
    one CPU (os.sched_setaffinity) half-way. Its samples show the two CPUs before, the one
    after, each mask in its device name; the window after the cut reads 1 allowed CPU by
    affinity, and more runnable threads than that (its two spinners)."""
    cpus = sorted(os.sched_getaffinity(server.pid))
    last = cpus[-1]
    out = tmp_path / "nodes" / "n1"
    argv = agent_argv("n1", 0.25, pids=[server.pid], collectors=["allowance", "runstate"],
                      extra=["--runstate-interval", "0.02"])
    with AgentHandle.start("n1", out, argv) as h:
        assert h.hello["collectors"]["allowance"] == {"status": "ok"}, h.hello
        time.sleep(1.2)
        cut = time.time_ns()
        _pin_tree(server.pid, {last})
        time.sleep(1.5)
    with open(out / "samples" / "allowance.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    before = [r for r in rows if int(r["wall_ns"]) < cut]
    after = [r for r in rows if int(r["wall_ns"]) > cut + 300_000_000]
    allowed_before = {float(r["value"]) for r in before if r["metric"] == "allowed_cpus"}
    allowed_after = {float(r["value"]) for r in after if r["metric"] == "allowed_cpus"}
    assert allowed_before == {float(len(cpus))}, allowed_before
    assert allowed_after == {1.0}, allowed_after
    assert {r["device"] for r in after if r["metric"] == "affinity_cpus"} == {
        f"affinity {last}"}
    assert {r["device"] for r in before if r["metric"] == "affinity_cpus"} == {
        f"affinity {cgroups.format_cpulist(cpus)}"}
    # the server is not among the other processes
    assert not [r for r in rows if r["device"].startswith(f"pid{server.pid} ")]

    # the window after the cut, from these samples, as the analysis reads them
    store = load_samples(tmp_path)
    w = Window("case", "after", "after", cut + 300_000_000, int(after[-1]["wall_ns"]))
    view = signals.HwView(summarize_window(store, w))
    n, by, which = signals.allowance(view, "n1")
    assert (n, by, which) == (1.0, f"affinity {last} (1 CPU)", frozenset({last}))
    sig = signals._allowance_signals(view, "n1", w.duration_s, None, None)
    assert sig["server_allowed_cpus"] == 1.0
    # two spinning threads on one CPU: about two want it (schedstat run + wait)
    assert sig["server_runnable_cores"] >= 1.6, sig
    assert sig["server_run_cores"] <= 1.1, sig
    # the window across the cut: the least allowance of the window, and the mask that set it
    whole = signals.HwView(summarize_window(store, Window(
        "case", "all", "all", int(rows[0]["wall_ns"]), int(rows[-1]["wall_ns"]))))
    assert signals.allowance(whole, "n1")[:2] == (1.0, f"affinity {last} (1 CPU)")


@pytest.mark.skipif(not TWO_CPUS, reason="an allowance smaller than the host's needs 2 CPUs")
def test_a_cpuset_of_its_own_switched_mid_run_is_seen_and_named(server):
    """The server's processes moved into a v1 cpuset of one CPU 0.5 s into the sampling
    (testing/allowance.ServerCpuset): the collector reads the cpuset's effective CPUs and
    the masks the kernel set, and the cpuset, not the affinity, is what set it."""
    last = max(os.sched_getaffinity(server.pid))
    inj = allowance.ServerCpuset(server.pid, (last,), at_s=0.5)
    try:
        inj.start()
    except faults.FaultUnavailable as e:
        pytest.skip(f"no cpuset of its own here: {e}")
    c = AllowanceCollector(ProcessTargets(pids=[server.pid]))
    c.probe()
    seen = []
    try:
        for _ in range(8):
            seen.append(c.sample(time.time_ns()))
            time.sleep(0.2)
    finally:
        facts = inj.stop().as_dict()
        c.close()
    assert facts.get("switched_at_ns"), facts
    first, late = seen[0], seen[-1]
    assert _rows(first, "allowed_cpus") == [("", float(len(os.sched_getaffinity(0))))]
    assert _rows(late, "allowed_cpus") == [("", 1.0)]
    assert _rows(late, "cpuset_cpus") == [(f"cpuset {last}", 1)]
    assert _rows(late, "affinity_cpus") == [(f"affinity {last}", 1)]
    # the analysis names the cpuset (it also set the masks)
    from strata_plugin.analysis.timeline import HwStat

    rows = [HwStat("w", "n1", "allowance", dev, m, "gauge", 1, 1.0, mean=v, min=v, max=v)
            for emits in (first, late) for _w, dev, m, v, k in emits if k == "gauge"]
    assert signals.allowance(signals.HwView(rows), "n1")[:2] == (1.0, f"cpuset {last} (1 CPU)")


# --- the other processes ------------------------------------------------------------------


HOG = "import sys\nprint('up', flush=True)\nwhile True: pass\n"


def _hog(procs: list, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOG, *extra], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    return p


def test_the_busiest_other_processes_are_named_with_their_cpu_and_owner(server, procs):
    """A busy process with a password in its command line, one that looks like a load
    worker of Strata's, and the server itself: the first two are named with their CPU
    (a busy loop holds most of a core) and their command, redacted, the worker marked
    Strata's own; the server's tree is never among them."""
    foreign = _hog(procs, "http://alice:s3cret@example.org/x")
    worker = _hog(procs, "-m", "strata_plugin.load.pool_worker")
    c = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=20, own=(os.getpid(),))
    c.probe()
    c.sample(time.time_ns())
    time.sleep(0.6)
    emits = c.sample(time.time_ns())
    time.sleep(0.6)
    emits2 = c.sample(time.time_ns())
    c.close()
    devices = {dev for _w, dev, m, _v, _k in emits + emits2 if m == "cpu_s"}
    mine = {d for d in devices if d.startswith(f"pid{foreign.pid} ")}
    assert mine and all("***@example.org" in d and "s3cret" not in d for d in mine), devices
    assert not [d for d in devices if d.startswith(f"pid{server.pid} ")]
    own = {dev: v for _w, dev, m, v, _k in emits2 if m == "strata_own"}
    assert own[next(d for d in own if d.startswith(f"pid{worker.pid} "))] == 1
    assert own[next(iter(mine))] == 0
    # its first reading as a named process comes with the tick before it: its CPU in
    # every window is the counter's growth, from two readings at least
    readings = sorted((w, v) for w, dev, m, v, _k in emits + emits2
                      if m == "cpu_s" and dev in mine)
    assert len(readings) >= 3, readings
    (_w0, c0), (w1, c1) = readings[0], readings[-1]
    # its utime + stime as the kernel counts them: the reading is what /proc says, no
    # more, and it grew (a shared 2-CPU host gives a busy loop what it can)
    now = faults._cpu_s(foreign.pid)
    late = (time.time_ns() - w1) / 1e9
    assert c1 > c0 and c1 <= now + 0.011 and now - c1 <= late + 0.05, (readings, now)


def test_another_processs_secrets_are_hidden_in_its_command():
    from strata_plugin.agent.redact import HIDDEN, redact_argv

    argv = ["--uid", "0", "--env", '{"AWS_SECRET_ACCESS_KEY": "x"}', "--token=abc",
            "--api-key", "k", "HF_TOKEN=hh", "--password", "--next", "http://u:p@h/x",
            "-m", "strata_plugin.load.pool_worker", "MODEL=m", "--max-s", "300"]
    assert redact_argv(argv) == [
        "--uid", "0", "--env", HIDDEN, f"--token={HIDDEN}", "--api-key", HIDDEN,
        f"HF_TOKEN={HIDDEN}", "--password", "--next", f"http://{HIDDEN}@h/x", "-m",
        "strata_plugin.load.pool_worker", "MODEL=m", "--max-s", "300"]


def test_a_busy_process_with_a_token_in_its_options_is_named_without_it(procs):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(sleeper)
    p = _hog(procs, "--api-token", "tok-123", "--port", "9")
    c = AllowanceCollector(ProcessTargets(pids=[sleeper.pid]), top=50)
    c.probe()
    c.sample(time.time_ns())
    time.sleep(0.5)
    emits = c.sample(time.time_ns())
    c.close()
    (dev,) = {d for _w, d, m, _v, _k in emits if m == "cpu_s" and d.startswith(f"pid{p.pid} ")}
    assert "--api-token *** --port 9" in dev and "tok-123" not in dev, dev


def test_a_quiet_process_is_not_named_and_the_list_is_bounded(procs):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(sleeper)
    hogs = [_hog(procs) for _ in range(3)]
    c = AllowanceCollector(ProcessTargets(pids=[sleeper.pid]), top=2)
    c.probe()
    c.sample(time.time_ns())
    time.sleep(0.5)
    emits = c.sample(time.time_ns())
    c.close()
    named = {dev for _w, dev, m, _v, _k in emits if m == "strata_own"}
    assert len(named) <= 2, named
    assert not [d for d in named if d.startswith(f"pid{sleeper.pid} ")]
    assert hogs  # three busy loops competed for the two places


@pytest.mark.skipif(not TWO_CPUS, reason="two CPUs: the server's and another")
def test_a_process_on_the_servers_only_cpu_is_named_before_a_busier_one_elsewhere(server,
                                                                                   procs):
    """The server cut to its last CPU; one busy loop pinned there, one on another CPU
    (alone there, it gets more CPU). With one place in the list, the one on the server's
    CPU is named: it is the one that took CPU from the server (allowed_share 1 and 0)."""
    cpus = sorted(os.sched_getaffinity(server.pid))
    _pin_tree(server.pid, {cpus[-1]})
    there, elsewhere = _hog(procs), _hog(procs)
    os.sched_setaffinity(there.pid, {cpus[-1]})
    os.sched_setaffinity(elsewhere.pid, {cpus[0]})
    # the rest of this shared host left out: the two loops compete for the one place
    rest = tuple(int(n) for n in os.listdir("/proc")
                 if n.isdigit() and int(n) not in (there.pid, elsewhere.pid))
    c = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=1, own=(os.getpid(),),
                           exclude=rest)
    c.probe()
    c.sample(time.time_ns())
    time.sleep(0.6)
    emits = c.sample(time.time_ns())
    c.close()
    share = {dev.split(" ", 1)[0]: v for _w, dev, m, v, _k in emits if m == "allowed_share"}
    assert share == {f"pid{there.pid}": 1.0}, share
    cores = {dev.split(" ", 1)[0]: v for _w, dev, m, v, _k in emits if m == "cpu_s"}
    assert f"pid{elsewhere.pid}" not in cores


# --- the weights: the server's cgroup weight and nice beside its competitors' (issue 42) --


@contextlib.contextmanager
def _cpu_group(name: str, shares: int, pids: list[int]):
    """A v1 cpu cgroup of our own with ``cpu.shares`` set, ``pids`` (every thread of
    each) moved in; moved back to the root and removed on the way out."""
    mount = Path(cgroups.CGROUP_ROOT) / "cpu"
    d = mount / name
    try:
        d.mkdir()
    except OSError as e:
        pytest.skip(f"no v1 cpu cgroup of our own here (root and the cpu hierarchy): {e}")
    try:
        (d / "cpu.shares").write_text(f"{shares}\n")
        for pid in pids:
            (d / "cgroup.procs").write_text(f"{pid}\n")
        yield f"/{name}"
    finally:
        for tid in (d / "tasks").read_text().split():
            with contextlib.suppress(OSError):
                (mount / "tasks").write_text(f"{tid}\n")
        d.rmdir()


def test_the_servers_cgroup_weight_and_nice_and_a_neighbours_are_sampled(server, procs):
    """The server's processes in a cpu cgroup with cpu.shares 256, one of its threads at
    nice 5 (os.setpriority on its thread ID); a busy neighbour at nice 3 in the root
    group: the collector reads the server's weight and group, its threads' nice range,
    and the neighbour's nice and group weight; the window's signals carry both."""
    tree = faults.tree_threads(server.pid)
    hog = _hog(procs)
    os.setpriority(os.PRIO_PROCESS, hog.pid, 3)
    tid = max(tree[server.pid])  # a thread that is not the main one
    os.setpriority(os.PRIO_PROCESS, tid, 5)
    with _cpu_group(f"strata-weight-{os.getpid()}", 256, list(tree)) as group:
        c = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=20, own=(os.getpid(),))
        c.probe()
        try:
            c.sample(time.time_ns())
            time.sleep(0.5)
            emits = c.sample(time.time_ns())
        finally:
            c.close()
    assert _rows(emits, "cpu_weight")[0] == (f"cpu.shares {group}", 256)
    assert _rows(emits, "nice_min") == [("", 0)] and _rows(emits, "nice_max") == [("", 5)]
    hog_dev = next(d for d, _ in _rows(emits, "nice") if d.startswith(f"pid{hog.pid} "))
    assert dict(_rows(emits, "nice"))[hog_dev] == 3
    root_shares = int((Path(cgroups.CGROUP_ROOT) / "cpu" / "cpu.shares").read_text())
    assert (f"pid{hog.pid} cpu.shares /", root_shares) in _rows(emits, "cpu_weight")
    from strata_plugin.analysis.timeline import HwStat

    rows = [HwStat("w", "n1", "allowance", dev, m, "gauge", 1, 1.0, mean=v, min=v, max=v)
            for _w, dev, m, v, k in emits if k == "gauge"]
    w = signals.cpu_weights(signals.HwView(rows), "n1")
    assert w["server_cpu_weight"] == ("cpu.shares", 256, group)
    assert w["server_nice"] == (0, 5)
    assert (hog.pid, 3, ("cpu.shares", root_shares, "/")) in w["other_weights"]


def test_the_weight_files_v1_and_v2(tmp_path):
    """cpu.shares where the cpu controller lives on v1, cpu.weight on v2; the v2 root has
    none; the group's path is under its controller's mount."""
    _write(tmp_path / "cpu" / "batch" / "cpu.shares", "256\n")
    _write(tmp_path / "unified" / "svc" / "cpu.weight", "25\n")
    v1 = cgroups.cpu_weight(cgroups.CgroupDirs(v1_cpu=str(tmp_path / "cpu" / "batch")),
                            str(tmp_path))
    assert v1 == cgroups.CpuWeight("cpu.shares", 256, "/batch")
    v2 = cgroups.cpu_weight(cgroups.CgroupDirs(v2=str(tmp_path / "unified" / "svc")),
                            str(tmp_path))
    assert v2 == cgroups.CpuWeight("cpu.weight", 25, "/svc")
    assert cgroups.cpu_weight(cgroups.CgroupDirs(v2=str(tmp_path / "unified")),
                              str(tmp_path)) is None
