"""The sampling agent's own cost: CPU time per second of sampling, per process, per core.

Not a pass/fail test by default: it prints figures (set STRATA_BENCH_ASSERT=1 to
fail when a target is missed). Run it with::

    pytest benchmarks/test_agent_cost.py --benchmark-only -s

* ``agent`` rows: a real agent process with every CPU-side collector on (proc,
  cpu, mem, disk, net, rdma on the saved fixture tree, log, numa) tracking a
  fake server of 4 processes x 5 threads, for DURATION_S of wall time. Its
  utime+stime (CLK_TCK resolution) and its threads' schedstat run time (ns)
  over that time, as a fraction of one core. Targets: < 1 % at 0.5 s, < 5 % at
  0.1 s. ``reader`` is the harness-side reader thread's share of a core, the
  part of the cost paid inside the load generator's process.
* ``per process``: CPU time of one agent tick (collector, row formatting and
  the write, to /dev/null) per tracked process of 5 threads, from 1 and 16
  tracked processes, measured in this process.
* ``per core``: the same for the cpu collector reading a 192-core
  ``/proc/stat`` (this host's rows repeated): per-core rows on minus off,
  divided by 192.

* ``runstate`` rows: the same agent tracking the real llama-server of the local
  profile (``-t 2 -c 16384 -np 5 -kvu``, idle: its threads as it has them), without the
  ``runstate`` collector and with it at 50, 20 and 10 ms (``--runstate-interval``),
  side by side; ``runstate`` adds one thread sampling every server thread's stat,
  schedstat and sched files on its own grid.

* ``at scale`` rows (issue 30): the same agent following a synthetic server of 15, 100
  and 500 threads (idle threads that wake once a second), without ``runstate``, with it
  on a fixed 20 ms grid (``--runstate-adapt-above 0``) and with its default grid, which
  stretches with the thread count; the three rows of a round measured in turn, medians
  and ratios to the agent without it. Target: the default adds under 1 % of a core at
  100 threads. ``pytest benchmarks/test_agent_cost.py -k scale --benchmark-only -s``.
  ``STRATA_BENCH_BASELINE=DIR`` adds hot mode run from another version of the package in
  DIR (``git archive <commit> strata_plugin | tar -x -C DIR``), in turn with the others.

Figures are medians over REPEATS runs.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from strata_plugin.agent.cli import Agent, LineWriter
from strata_plugin.agent.collectors.cpu import CpuCollector
from strata_plugin.agent.collectors.proc import ProcCollector
from strata_plugin.agent.collectors.registry import CPU_SIDE as CPU_SIDE_COLLECTORS
from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.procfs import CLK_TCK, process_tree
from strata_plugin.agent.targets import ProcessTargets

DURATION_S = float(os.environ.get("STRATA_BENCH_DURATION_S", "10"))
REPEATS = int(os.environ.get("STRATA_BENCH_REPEATS", "3"))
ASSERT = os.environ.get("STRATA_BENCH_ASSERT") == "1"
INTERVALS = (0.5, 0.1)
TARGETS = {0.5: 0.01, 0.1: 0.05}
IB = Path(__file__).resolve().parents[1] / "tests" / "data" / "sysfs_infiniband"
LOG = Path(__file__).resolve().parents[1] / "tests" / "data" / "logs" / "llamacpp_server.log"

#: A process with 4 idle threads; with children=N it first starts N more like itself.
SERVER = (
    "import subprocess, sys, threading, time\n"
    "n = int(sys.argv[1])\n"
    "kids = [subprocess.Popen([sys.executable, '-c', sys.argv[2], '0', sys.argv[2]])"
    " for _ in range(n)]\n"
    "for _ in range(4):\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "print('up', flush=True)\n"
    "time.sleep(3600)\n"
)


@dataclass(frozen=True)
class Figures:
    cpu_frac: float  # utime+stime / wall, fraction of one core
    cpu_frac_ns: float  # schedstat run time / wall (ns resolution)
    ticks_per_s: float
    samples_per_s: float
    reader_frac: float  # the harness reader thread, fraction of one core


_RESULTS: dict[str, list[Figures]] = {}
_PER_TICK: dict[int, float] = {}  # tracked processes -> CPU s per tick
_EXTRA: list[str] = []


def _start_server(children: int) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(children), SERVER], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    deadline = time.monotonic() + 10
    while len(process_tree(p.pid)) < children + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return p


def _kill_tree(p: subprocess.Popen[str]) -> None:
    for pid in reversed(process_tree(p.pid)):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.wait()


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    p = _start_server(3)  # 4 processes, 5 threads each
    yield p.pid
    _kill_tree(p)
    _print_table()


def _cpu(pid: int) -> tuple[float, int]:
    """(utime+stime seconds, sum of thread run time ns) of a process."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        f = fh.read().rsplit(b")", 1)[1].split()
    ticks = (int(f[11]) + int(f[12])) / CLK_TCK
    run_ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                run_ns += int(fh.read().split()[0])
        except OSError:
            pass
    return ticks, run_ns


def _thread_ns(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/schedstat", "rb") as fh:
        return int(fh.read().split()[0])


def _measure(interval: float, server_pid: int, out: Path,
             collectors: tuple[str, ...] = CPU_SIDE_COLLECTORS,
             extra: tuple[str, ...] = (), cwd: str | None = None) -> Figures:
    argv = agent_argv(
        "bench",
        interval,
        pids=[server_pid],
        collectors=collectors,
        ib_root=IB,
        log_file=LOG,
        extra=extra,
    )
    h = AgentHandle.start("bench", out, argv, cwd=cwd)
    try:
        time.sleep(1.0)  # imports, probes and the first tree scan are start-up, not steady state
        reader = next(t for t in threading.enumerate() if t.name == "agent-bench")
        c0, n0 = _cpu(h.proc.pid)
        r0 = _thread_ns(reader.native_id)
        s0 = sum(h.samples_written.values())
        t0 = time.monotonic()
        time.sleep(DURATION_S)
        c1, n1 = _cpu(h.proc.pid)
        r1 = _thread_ns(reader.native_id)
        s1 = sum(h.samples_written.values())
        wall = time.monotonic() - t0
    finally:
        info = h.stop()
    assert info.expected, info
    return Figures(
        cpu_frac=(c1 - c0) / wall,
        cpu_frac_ns=(n1 - n0) / 1e9 / wall,
        ticks_per_s=1 / interval,
        samples_per_s=(s1 - s0) / wall,
        reader_frac=(r1 - r0) / 1e9 / wall,
    )


@pytest.mark.parametrize("interval", INTERVALS)
def test_agent_cpu_cost(benchmark, server: int, interval: float, tmp_path: Path) -> None:
    runs: list[Figures] = []
    counter = iter(range(1000))
    benchmark.pedantic(
        lambda: runs.append(_measure(interval, server, tmp_path / f"r{next(counter)}")),
        rounds=REPEATS,
        iterations=1,
    )
    med = _median(runs)
    _RESULTS[f"agent @ {interval:g} s"] = runs
    benchmark.extra_info.update(med.__dict__)
    benchmark.extra_info["target_frac"] = TARGETS[interval]
    print(f"\nagent @ {interval:g} s  {_row(med)}  target < {TARGETS[interval]:.0%}")
    if ASSERT:
        assert med.cpu_frac_ns < TARGETS[interval], med


#: The runstate rows: (label, --runstate-interval or None for the agent without it).
RUNSTATE_ROWS = (("without runstate", None), ("runstate @ 50 ms", 0.05),
                 ("runstate @ 20 ms", 0.02), ("runstate @ 10 ms", 0.01))


@pytest.fixture(scope="module")
def llama_server() -> Iterator[int]:
    """The real llama-server as the local profile starts it, idle; its PID."""
    import urllib.request

    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip("llama-server is not built: run `bash scripts/setup.sh` first")
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([paths["llama_server"], "-m", paths["model"], "--host", "127.0.0.1",
                          "--port", str(port), "-t", "2", "-c", "16384", "-np", "5", "-kvu",
                          "--metrics", "--no-webui"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError("llama-server did not become healthy")
            time.sleep(0.2)
        yield p.pid
    finally:
        _print_runstate()
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize(("label", "fine"), RUNSTATE_ROWS, ids=[r[0] for r in RUNSTATE_ROWS])
def test_runstate_cost(benchmark, llama_server: int, label: str, fine: float | None,
                       tmp_path: Path) -> None:
    collectors = CPU_SIDE_COLLECTORS + (("runstate",) if fine else ())
    extra = ("--runstate-interval", repr(fine)) if fine else ()
    runs: list[Figures] = []
    counter = iter(range(1000))
    benchmark.pedantic(
        lambda: runs.append(_measure(0.5, llama_server, tmp_path / f"r{next(counter)}",
                                     collectors, extra)),
        rounds=REPEATS,
        iterations=1,
    )
    med = _median(runs)
    threads = len(os.listdir(f"/proc/{llama_server}/task"))
    _RUNSTATE[label] = (med, threads)
    benchmark.extra_info.update(med.__dict__)
    benchmark.extra_info["server_threads"] = threads
    print(f"\n{label} (llama-server, {threads} threads; main grid 0.5 s)  {_row(med)}")


_RUNSTATE: dict[str, tuple[Figures, int]] = {}


def _ticker(collector) -> Agent:
    """An agent loop around one collector, writing its lines to /dev/null: the whole tick cost."""
    targets = ProcessTargets()
    agent = Agent("bench", 0.1, [collector], targets, LineWriter(os.open(os.devnull, os.O_WRONLY)))
    agent.probe_all()
    assert agent.active == [collector], agent.status
    return agent


def _cpu_per_call(fn, calls: int) -> float:
    fn()
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls


@pytest.mark.parametrize("nprocs", (1, 16))
def test_cost_per_tracked_process(benchmark, nprocs: int) -> None:
    roots = [_start_server(0) for _ in range(nprocs)]
    try:
        c = ProcCollector(ProcessTargets(pids=[p.pid for p in roots], rescan_s=3600))
        agent = _ticker(c)
        per_tick = _cpu_per_call(agent.tick, 300)
        benchmark.pedantic(agent.tick, rounds=50, iterations=1)
        c.close()
    finally:
        for p in roots:
            _kill_tree(p)
    _PER_TICK[nprocs] = per_tick
    per_proc_us = per_tick / nprocs * 1e6
    benchmark.extra_info.update(per_tick_us=per_tick * 1e6, per_process_us=per_proc_us)
    line = (
        f"per process (n={nprocs:>2}, 5 threads each): {per_tick * 1e6:7.1f} us/tick, "
        f"{per_proc_us:6.1f} us/tick/process = {per_proc_us * 10 / 1e4:.3f} % core "
        f"per process at 0.1 s"
    )
    _EXTRA.append(line)
    print("\n" + line)


def _big_proc(root: Path, ncpu: int) -> Path:
    """A /proc with a ``stat`` of ``ncpu`` cores (this host's numbers repeated) and its loadavg."""
    root.mkdir(parents=True, exist_ok=True)
    lines = Path("/proc/stat").read_text().splitlines()
    core = next(line for line in lines if line.startswith("cpu0 "))
    rest = [line for line in lines if not line.startswith("cpu")]
    cores = [f"cpu{i} " + core.split(" ", 1)[1] for i in range(ncpu)]
    head = next(line for line in lines if line.startswith("cpu "))
    (root / "stat").write_text("\n".join([head, *cores, *rest]) + "\n")
    (root / "loadavg").write_text(Path("/proc/loadavg").read_text())
    return root


def test_cost_per_core(benchmark, tmp_path: Path) -> None:
    ncpu = 192  # an 8-GPU node's worth; this VM has too few cores to see the slope
    big = _big_proc(tmp_path / "proc", ncpu)
    on = _ticker(CpuCollector(per_core=True, proc_root=str(big), cgroup="none"))
    off = _ticker(CpuCollector(per_core=False, proc_root=str(big), cgroup="none"))
    t_on = _cpu_per_call(on.tick, 500)
    t_off = _cpu_per_call(off.tick, 500)
    benchmark.pedantic(on.tick, rounds=100, iterations=1)
    per_core_us = max(0.0, t_on - t_off) / ncpu * 1e6
    benchmark.extra_info.update(tick_us=t_on * 1e6, per_core_us=per_core_us, cores=ncpu)
    line = (
        f"per core (a {ncpu}-core /proc/stat): cpu collector {t_on * 1e6:7.1f} us/tick, "
        f"{per_core_us:5.2f} us/tick/core = {per_core_us * 10 / 1e4:.4f} % core per core "
        f"at 0.1 s"
    )
    _EXTRA.append(line)
    print("\n" + line)


def _median(runs: list[Figures]) -> Figures:
    return Figures(
        **{k: statistics.median(getattr(r, k) for r in runs) for k in Figures.__dataclass_fields__}
    )


def _row(f: Figures) -> str:
    return (
        f"cpu {f.cpu_frac:7.3%} (utime+stime)  {f.cpu_frac_ns:7.3%} (schedstat)  "
        f"{f.samples_per_s:7.0f} samples/s  reader {f.reader_frac:6.3%}"
    )


def _print_table() -> None:
    if not _RESULTS:
        return
    print(
        f"\nagent cost, medians of {REPEATS} runs of {DURATION_S:g} s "
        f"({os.cpu_count()} cores, collectors {','.join(CPU_SIDE_COLLECTORS)})"
    )
    for name, runs in _RESULTS.items():
        print(f"{name:>14} | {_row(_median(runs))}")
    for line in _EXTRA:
        print(line)


def _print_runstate() -> None:
    if not _RUNSTATE:
        return
    print(f"\nagent cost with runstate, medians of {REPEATS} runs of {DURATION_S:g} s "
          f"(collectors {','.join(CPU_SIDE_COLLECTORS)} at 0.5 s, tracking llama-server)")
    base = _RUNSTATE.get("without runstate")
    for name, (f, threads) in _RUNSTATE.items():
        more = (f"  +{f.cpu_frac_ns - base[0].cpu_frac_ns:6.3%} of a core for runstate"
                if base and name != "without runstate" else "")
        print(f"{name:>17} | {threads} server threads | {_row(f)}{more}")
    if 1 in _PER_TICK and 16 in _PER_TICK:
        slope_us = (_PER_TICK[16] - _PER_TICK[1]) / 15 * 1e6
        print(
            f"marginal cost per tracked process (5 threads): {slope_us:.1f} us/tick = "
            f"{slope_us * 10 / 1e4:.3f} % core at 0.1 s, {slope_us * 2 / 1e4:.3f} % at 0.5 s"
        )


# --- the run-state grid at scale (issue 30, item 5) -----------------------------------------

#: Threads of the synthetic server: the local llama-server's count, a GPU server's, and a
#: big multi-GPU engine's (vLLM or SGLang with its NCCL, tokenizer and RPC pools).
SCALE_THREADS = (15, 100, 500)
#: Each of its threads but the main one sleeps in a loop of this period, as the idle pools
#: of a real engine do (heartbeats, pollers): about 2% of them ran between two 20 ms samples.
SCALE_WAKE_S = 1.0
#: The rows of each thread count, measured round-robin in the same run: (label, the agent's
#: extra arguments, or None for the agent without runstate).
SCALE_ROWS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("without runstate", None),
    ("runstate @ 20 ms, fixed", ("--runstate-interval", "0.02", "--runstate-adapt-above", "0")),
    ("runstate @ 20 ms, adapted (default)", ("--runstate-interval", "0.02")),
    ("runstate @ 20 ms, hot threads", ("--runstate-interval", "0.02", "--runstate-hot")),
)
#: A directory holding another version of the package (``git archive <commit>
#: strata_plugin | tar -x -C DIR``): adds a row of hot mode run from it, measured in turn
#: with the others, so a change's figures and the old ones come from the same run. The
#: agent runs with that directory as its working directory, which ``python -m`` puts
#: first on its path.
SCALE_BASELINE = os.environ.get("STRATA_BENCH_BASELINE", "")
SCALE_BASELINE_ROW = "hot threads, baseline tree"
#: Issue 30: runstate adds under 1% of a core to the agent at 100 threads (its default,
#: adapted grid).
SCALE_TARGET = {100: 0.01}

MANY_THREADS = (
    "import sys, threading, time\n"
    "n, wake = int(sys.argv[1]), float(sys.argv[2])\n"
    "def idle():\n"
    "    while True:\n"
    "        time.sleep(wake)\n"
    "for _ in range(n - 1):\n"
    "    threading.Thread(target=idle, daemon=True).start()\n"
    "print('up', flush=True)\n"
    "time.sleep(3600)\n"
)

_SCALE: dict[int, dict[str, list[Figures]]] = {}


@pytest.fixture(scope="module")
def scale_table() -> Iterator[dict[int, dict[str, list[Figures]]]]:
    yield _SCALE
    _print_scale()


def _many_threads(n: int) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", MANY_THREADS, str(n), repr(SCALE_WAKE_S)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    got = len(os.listdir(f"/proc/{p.pid}/task"))
    assert got == n, f"the synthetic server has {got} threads, not {n}"
    return p


def _scale_rows() -> list[tuple[str, tuple[str, ...] | None, str | None]]:
    """SCALE_ROWS with the agent's working directory (None: this checkout's), and the
    baseline tree's hot-mode row when STRATA_BENCH_BASELINE names one."""
    rows: list[tuple[str, tuple[str, ...] | None, str | None]] = [
        (label, extra, None) for label, extra in SCALE_ROWS]
    if SCALE_BASELINE:
        rows.append((SCALE_BASELINE_ROW, SCALE_ROWS[3][1], SCALE_BASELINE))
    return rows


@pytest.mark.parametrize("threads", SCALE_THREADS)
def test_runstate_cost_at_scale(benchmark, scale_table, threads: int, tmp_path: Path) -> None:
    """The agent following a process of ``threads`` threads, with and without runstate,
    the rows measured in turn in each round (a shared host's load drifts between rounds,
    and lands on every row of a round alike)."""
    p = _many_threads(threads)
    rows = scale_table.setdefault(threads, {})
    counter = iter(range(1000))

    def one_round() -> None:
        for label, extra, cwd in _scale_rows():
            collectors = CPU_SIDE_COLLECTORS + (("runstate",) if extra is not None else ())
            rows.setdefault(label, []).append(
                _measure(0.5, p.pid, tmp_path / f"r{next(counter)}", collectors, extra or (),
                         cwd=cwd))

    try:
        benchmark.pedantic(one_round, rounds=REPEATS, iterations=1)
    finally:
        p.kill()
        p.wait()
    base = _median(rows["without runstate"])
    for label, _, _ in _scale_rows():
        med = _median(rows[label])
        benchmark.extra_info[label] = med.__dict__
        print(f"\n{threads:>4} threads | {label:<36} | {_row(med)}  "
              f"x{med.cpu_frac_ns / max(base.cpu_frac_ns, 1e-9):.2f} of without")
    if ASSERT and threads in SCALE_TARGET:
        added = _median(rows[SCALE_ROWS[2][0]]).cpu_frac_ns - base.cpu_frac_ns  # default
        assert added < SCALE_TARGET[threads], (threads, added)


def _print_scale() -> None:
    if not _SCALE:
        return
    print(f"\nthe agent following a synthetic server, CPU as a share of one core (schedstat), "
          f"medians of {REPEATS} rounds of {DURATION_S:g} s per row, the rows of a round in "
          f"turn (collectors {','.join(CPU_SIDE_COLLECTORS)} at 0.5 s; {os.cpu_count()} cores)")
    labels = [label for label, _, _ in _scale_rows()]
    print(f"{'threads':>7} | " + " | ".join(f"{x:>36}" for x in labels))
    for n, rows in sorted(_SCALE.items()):
        base = _median(rows[labels[0]]).cpu_frac_ns
        cells = []
        for label in labels:
            f = _median(rows[label])
            more = f" (+{f.cpu_frac_ns - base:.2%}, x{f.cpu_frac_ns / max(base, 1e-9):.1f})" \
                if label != labels[0] else ""
            cells.append(f"{f.cpu_frac_ns:7.2%}{more}")
        print(f"{n:>7} | " + " | ".join(f"{c:>36}" for c in cells))
