"""procfs readers against the real /proc of this machine: trees, per-request counters."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from strata_plugin.agent import procfs
from strata_plugin.agent.procfs import (
    ProcessCounters,
    ProcessTreeCounters,
    parse_ctx_switches,
    parse_stat,
    process_tree,
    read_process_counters,
)
from tests.own_cpu import own_cpu

# A child that waits for a line on stdin, does one thing, reports "done", then sleeps.
CHILD = r"""
import os, sys, time
job = sys.argv[1]
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
if job == "burn":
    t = time.process_time()
    while time.process_time() - t < 0.6:
        pass
elif job == "read":
    path = sys.argv[2]
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # not from the page cache
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
elif job == "alloc":
    buf = bytearray(200 << 20)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
sys.stdout.write("done\n"); sys.stdout.flush()
time.sleep(30)
"""


class Child:
    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout.readline() == "ready\n"

    def go(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == "done\n"

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


@pytest.fixture
def child_factory():
    made: list[Child] = []

    def make(*args: str) -> Child:
        c = Child(*args)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_parse_stat_survives_spaces_and_parens_in_comm() -> None:
    fields = " ".join(
        ["S", "42"]
        + ["0"] * 5
        + ["7", "0", "3", "0", "250", "50"]
        + ["0"] * 4
        + ["5", "0", "0", "0", "1000"]
        + ["0"] * 12
        + ["1"]
    )
    st = parse_stat(f"123 (a (b) c) {fields}".encode())
    assert (st.pid, st.comm, st.state, st.ppid) == (123, "a (b) c", "S", 42)
    assert st.minflt == 7 and st.majflt == 3
    assert st.utime_s == 250 / procfs.CLK_TCK and st.stime_s == 50 / procfs.CLK_TCK
    assert st.num_threads == 5
    assert st.rss_bytes == 1000 * procfs.PAGE_SIZE


def test_parse_ctx_switches() -> None:
    text = b"Name:\tx\nvoluntary_ctxt_switches:\t25\nnonvoluntary_ctxt_switches:\t6\n"
    assert parse_ctx_switches(text) == (25, 6)


def test_process_tree_finds_grandchildren() -> None:
    code = "import subprocess,time; subprocess.Popen(['sleep','30']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 5
        tree: list[int] = []
        while time.monotonic() < deadline:
            tree = process_tree(parent.pid)
            # the grandchild is in the tree from its fork; its cmdline is sleep's only
            # once it has exec'd (CI saw '' in between)
            if len(tree) >= 2 and procfs.cmdline(tree[1]) == "sleep 30":
                break
            time.sleep(0.02)
        assert tree[0] == parent.pid
        assert len(tree) == 2
        assert procfs.cmdline(tree[1]) == "sleep 30"
        # the scan-based path gives the same tree
        assert process_tree(parent.pid, procfs.ppid_map()) == tree
    finally:
        for pid in process_tree(parent.pid)[1:]:
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
    assert process_tree(parent.pid) == []


def test_cpu_seconds_of_a_busy_process_grow(child_factory) -> None:
    c = child_factory("burn")
    before = read_process_counters([c.p.pid])
    c.go()
    delta = read_process_counters([c.p.pid]) - before
    assert 0.5 <= delta.cpu_s <= 2.0
    assert delta.n_pids == 1 and delta.n_missing == 0


def test_file_read_shows_in_rchar_and_read_bytes(child_factory, tmp_path) -> None:
    size = 8 << 20
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    c = child_factory("read", str(path))
    before = read_process_counters([c.p.pid])
    c.go()
    delta = read_process_counters([c.p.pid]) - before
    assert size <= delta.rchar < size + (1 << 20)
    # read_bytes counts the storage layer; page cache was dropped for the file
    if delta.read_bytes == 0:
        pytest.skip("this filesystem did not account block reads (tmpfs/overlay?)")
    assert delta.read_bytes >= size * 0.9


def test_missing_pid_is_counted_not_fatal() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    c = read_process_counters([os.getpid(), dead.pid])
    assert c.n_pids == 2 and c.n_missing == 1 and c.cpu_s > 0


def test_counters_subtract() -> None:
    a = ProcessCounters(1.0, 2, 300, 4, 500, 1)
    b = ProcessCounters(1.5, 5, 800, 10, 900, 1)
    d = b - a
    assert (d.cpu_s, d.major_faults, d.read_bytes, d.minor_faults, d.rchar) == (0.5, 3, 500, 6, 400)


def test_tree_counter_reader_matches_plain_reads(child_factory) -> None:
    c = child_factory("burn")
    reader = ProcessTreeCounters(c.p.pid)
    try:
        before = reader.read()
        c.go()
        after = reader.read()
        plain = read_process_counters([c.p.pid])
        assert after.cpu_s - before.cpu_s >= 0.5
        assert abs(after.cpu_s - plain.cpu_s) < 0.05
        assert after.n_pids == 1
    finally:
        reader.close()


def test_per_request_read_is_cheap() -> None:
    tree = process_tree(os.getpid())
    # the reads' own CPU time (their system calls included): a loaded host's pause, or the
    # garbage collector's pass over the session's heap, is not their cost (tests/own_cpu.py)
    with own_cpu() as spent:
        for _ in range(50):
            read_process_counters(tree)
    per_call = spent() / 50
    assert per_call < 0.005, f"{per_call * 1e3:.2f} ms per read"


def test_match_pids_skips_the_caller() -> None:
    marker = "strata_match_marker_7f3a"
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    try:
        # Popen returns while execve may still be filling in the new command line
        deadline = time.monotonic() + 10
        while marker not in (procfs.cmdline(p.pid) or "") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.match_pids(marker) == [p.pid]
    finally:
        p.kill()
        p.wait()
