"""The CPU-allowance injectors (testing/allowance.py): each cuts the server's CPUs for
real, says what it measured, and gives every thread its own mask back.

A stand-in server (a process with two spinning threads, one idle thread pinned to a
CPU of its own, and a child process) is enough: what matters is that the kernel saw
the allowance (every thread's mask, the cpuset the processes sat in) and that the
threads queued for the CPU it left them (schedstat). Needs two CPUs; the cpuset needs
root and the cgroup v1 cpuset hierarchy, and skips with the reason elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.testing import allowance, faults
from tests.test_robustness_support import alive

#: Two spinning threads (the main one and one more), one idle thread pinned to the first
#: CPU, a child process with an idle thread; a line on stdin starts one more spinner. They
#: spin in sha256 over 1 MiB, which releases the interpreter lock (hashlib does for data
#: over 2 KiB), so they run in parallel as an engine's compute threads do.
SERVER = (
    "import hashlib, os, sys, threading, time\n"
    "cpus = sorted(os.sched_getaffinity(0))\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "    os.write(w, b'x')\n"
    "    time.sleep(3600)\n"
    "buf = bytes(2**20)\n"
    "def spin():\n"
    "    while True:\n"
    "        hashlib.sha256(buf).digest()\n"
    "is_pinned = threading.Event()\n"
    "def pinned():\n"
    "    os.sched_setaffinity(0, {cpus[0]})\n"
    "    is_pinned.set()\n"
    "    time.sleep(3600)\n"
    "threading.Thread(target=pinned, daemon=True).start()\n"
    "threading.Thread(target=spin, daemon=True).start()\n"
    "def more():\n"
    "    for _ in sys.stdin:\n"
    "        threading.Thread(target=spin, daemon=True).start()\n"
    "threading.Thread(target=more, daemon=True).start()\n"
    "is_pinned.wait()\n"
    "os.read(r, 1)\n"  # the child's thread is up too
    "print('up', flush=True)\n"
    "spin()\n"
)

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2,
                                reason="an allowance smaller than the server's needs 2 CPUs")


@pytest.fixture
def server():
    p = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    yield p
    for pid in reversed(faults.tree_threads(p.pid)):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.wait(10)


def _last_cpu() -> int:
    return max(os.sched_getaffinity(0))


def _all_masks(pid: int) -> dict[int, frozenset[int]]:
    return allowance.masks(pid)


def _check_cut_and_restored(inj: allowance._Allowance, server: subprocess.Popen,
                            before: dict[int, frozenset[int]]) -> dict:
    cpu = _last_cpu()
    during = _all_masks(server.pid)
    assert during and set(during.values()) == {frozenset({cpu})}, during
    # a thread born under the allowance inherits it
    assert server.stdin is not None
    server.stdin.write("more\n")
    server.stdin.flush()
    deadline = time.monotonic() + 10
    while not (born := {t: m for t, m in _all_masks(server.pid).items() if t not in before}):
        assert time.monotonic() < deadline, "the new thread never came"
        time.sleep(0.01)
    assert len(born) == 1 and set(born.values()) == {frozenset({cpu})}, born
    time.sleep(1.0)
    facts = inj.stop().as_dict()
    after = _all_masks(server.pid)
    # every thread has its own mask back: the pinned one its single CPU, not all of them
    assert {t: after[t] for t in before} == before, (before, after)
    assert after[next(iter(born))] == before[server.pid]  # born since: its main thread's
    assert facts["restored"] is True, facts
    assert facts["masks_seen"] == [str(cpu)] and facts["allowed_cpus"] == 1, facts
    assert facts["threads"] == len(before), facts
    # three spinning threads (then two) on one CPU: more runnable threads than CPUs, and
    # the wait the kernel counted is the time they queued for it
    assert facts["runnable_threads"] >= 1.8 and facts["run_cores"] <= 1.1, facts
    assert facts["wait_per_s"] >= 0.7, facts
    return facts


def test_affinity_before_the_case_cuts_every_thread_and_gives_each_its_own_back(server):
    before = _all_masks(server.pid)
    assert len(set(before.values())) == 2  # the pinned idle thread differs
    inj = allowance.ServerAffinity(server.pid, (_last_cpu(),))
    inj.start()
    facts = _check_cut_and_restored(inj, server, before)
    assert facts["mechanism"] == "affinity" and facts["at_s"] == 0, facts
    assert inj.stop() is inj.stop()  # idempotent


def test_affinity_switched_during_the_case_at_its_offset(server):
    before = _all_masks(server.pid)
    for _ in range(5):
        inj = allowance.ServerAffinity(server.pid, (_last_cpu(),), at_s=0.6)
        t0 = time.monotonic_ns()
        inj.start()
        early = _all_masks(server.pid)
        read_ns = time.monotonic_ns()  # the read was over by then
        if read_ns < t0 + 0.6e9:
            break
        inj.stop()  # a host paused past the offset: this read tells nothing; again
    else:
        pytest.fail("no read of the masks came before the offset in 5 tries")
    assert early == before  # not yet: start() only armed it
    deadline = time.monotonic() + 10
    while _all_masks(server.pid) == before:
        assert time.monotonic() < deadline, "the allowance never came"
        time.sleep(0.005)
    with inj._switch_lock:  # held while it switches: its stamp is taken once we get it
        seen = time.monotonic_ns()
    facts = _check_cut_and_restored(inj, server, before)
    switched = facts["switched_at_ns"]
    assert 0.6e9 <= switched - t0, (switched - t0) / 1e9  # never before its offset
    assert switched <= seen, (switched - seen) / 1e9  # when the masks changed


def test_a_stop_before_the_offset_changes_nothing(server):
    before = _all_masks(server.pid)
    inj = allowance.ServerAffinity(server.pid, (_last_cpu(),), at_s=0.5)
    inj.start()
    facts = inj.stop().as_dict()
    time.sleep(0.8)  # past the offset: the cancelled switch never comes
    assert _all_masks(server.pid) == before
    assert facts["switched_at_ns"] is None and "restored" not in facts, facts


def test_an_allowance_that_is_not_smaller_is_refused(server):
    allowed = tuple(sorted(os.sched_getaffinity(server.pid)))
    with pytest.raises(faults.FaultUnavailable, match="not a strict subset"):
        allowance.ServerAffinity(server.pid, allowed).start()
    with pytest.raises(ValueError):
        allowance.ServerAffinity(server.pid, ())


def _cpuset_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            return path
    return ""


def _need_cpuset() -> None:
    if os.geteuid() != 0:
        pytest.skip("a cpuset cgroup of its own needs root")
    try:
        allowance.cpuset_root()
    except faults.FaultUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.root
@pytest.mark.parametrize("at_s", [0.0, 0.4], ids=["before", "during"])
def test_a_cpuset_of_its_own_holds_the_tree_and_is_removed(server, at_s):
    _need_cpuset()
    before = _all_masks(server.pid)
    home = {p: _cpuset_of(p) for p in faults.tree_threads(server.pid)}
    inj = allowance.ServerCpuset(server.pid, (_last_cpu(),), at_s=at_s)
    inj.start()
    if at_s:
        assert {p: _cpuset_of(p) for p in home} == home
        time.sleep(at_s + 0.3)
    assert inj.dir is not None and inj.dir.is_dir()
    want = "/" + str(inj.dir.relative_to(allowance.cpuset_root()))
    assert {_cpuset_of(p) for p in home} == {want}  # parent and child moved in
    assert (inj.dir / "cpuset.effective_cpus").read_text().strip() == str(_last_cpu())
    facts = _check_cut_and_restored(inj, server, before)
    assert {p: _cpuset_of(p) for p in home} == home  # back where they were
    assert not inj.dir.exists(), inj.dir
    assert facts["mechanism"] == "cpuset" and facts["members_at_stop"] == 2, facts
    assert facts["effective_cpus"] == str(_last_cpu()), facts


@pytest.mark.root
def test_a_failed_cpuset_start_leaves_no_cgroup(server, monkeypatch):
    _need_cpuset()

    def refuse(self):
        raise faults.FaultUnavailable("refused on purpose")

    monkeypatch.setattr(allowance.ServerCpuset, "_apply", refuse)
    before = _all_masks(server.pid)
    inj = allowance.ServerCpuset(server.pid, (_last_cpu(),))
    with pytest.raises(faults.FaultUnavailable, match="refused on purpose"):
        inj.start()
    assert inj.dir is not None and not inj.dir.exists()
    assert _all_masks(server.pid) == before


def test_pinned_hog_shares_the_servers_only_cpu_with_a_named_hog(server):
    cpu = _last_cpu()
    before = _all_masks(server.pid)
    inj = allowance.PinnedHog(server.pid, cpu, hogs=1)
    inj.start()
    try:
        pids = inj.hog.procs and [p.pid for _, p in inj.hog.procs]
        assert pids and all(os.sched_getaffinity(p) == {cpu} for p in pids)
        assert set(_all_masks(server.pid).values()) == {frozenset({cpu})}
        time.sleep(1.0)
        assert all(Path(f"/proc/{p}/comm").read_text().strip() == "strata-hog" for p in pids)
    finally:
        facts = inj.stop().as_dict()
    assert facts["hog_pids"] == pids and facts["hog_comm"] == "strata-hog", facts
    assert facts["hog_cpu_s"] > 0.1 and facts["pin_masks_seen"] == [str(cpu)], facts
    assert facts["pin_restored"] is True, facts
    assert not any(alive(p) for p in pids)
    assert _all_masks(server.pid) == before


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_ground_truth_measures_runnable_threads_against_the_allowance(server):
    g = faults.GroundTruth(server.pid, period_s=0.1).start()
    time.sleep(1.0)
    t_mid = time.monotonic_ns()
    with allowance.ServerAffinity(server.pid, (_last_cpu(),)):
        time.sleep(1.0)
        t_end = time.monotonic_ns()
    g.stop()
    wide = g.window(t_mid - int(0.9e9), t_mid)
    narrow = g.window(t_mid + int(0.1e9), t_end)
    cpus = len(os.sched_getaffinity(0))
    # two spinning threads: about two runnable either way; the allowance is what changes
    assert wide["server_allowed_cpus"] == cpus and narrow["server_allowed_cpus"] == 1, (
        wide, narrow)
    assert 1.6 <= wide["server_runnable_threads"] <= 2.6, wide
    assert 1.6 <= narrow["server_runnable_threads"] <= 2.6, narrow
