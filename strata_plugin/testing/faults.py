"""Fault injectors: one known bottleneck switched on for a window, cleaned up on every path.

Why: a classifier is only believable when it names faults that were put there on
purpose, and names nothing on the same load without them. Each injector here makes one
bottleneck real on this machine:

* :class:`CpuHogs` - busy processes pinned to the server's cores (``cpu_contention``);
* :class:`PageOut` - the server's memory-mapped weights paged out again and again with
  ``process_madvise(MADV_PAGEOUT)``, so decode reads them back from disk
  (``io_page_faults``). ``drop_caches`` and ``posix_fadvise(DONTNEED)`` cannot do this:
  the kernel never drops page-cache pages that a process has mapped;
* :class:`MemoryHog` - a process that allocates and touches memory until MemAvailable is
  under a floor, bounded, and holds it (``memory_pressure``);
* :class:`ServerCpuQuota` - the server process moved into a CPU cgroup of its own with a
  CFS quota, as a container or a systemd slice would limit it, on an otherwise idle
  host (``cpu_limited``);
* :class:`ClientThrottle` - the load generator's own threads put in a CPU cgroup with a
  small CFS quota (``client_bound``);
* :class:`LinkCap` - a token-bucket rate cap (tc tbf) on a veth link (``network``).

The server's CPU allowance (an affinity mask or a cpuset smaller than its busy threads, a
busy process on its only allowed CPU) is in :mod:`strata_plugin.testing.allowance`.

Contract: ``start()`` returns once the fault is active, so a window opened after it is
faulted from its first sample; ``stop()`` is idempotent, never raises, and returns the
ground truth it measured (:class:`FaultFacts`). Every helper process exits by itself
after ``max_s`` and when the harness dies (``PR_SET_PDEATHSIG`` plus a parent check),
so nothing outlives a crash. ``FaultUnavailable`` says why this machine cannot inject
one (no cgroup controller, no process_madvise, pages shared with another process).

Helpers run as ``python -m strata_plugin.testing.faults <mode> ...`` (argv lists, no shell).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from strata_plugin.errors import StrataError
from strata_plugin.process_globals import STATE, at_exit

#: No helper lives longer than this, whatever the caller asks.
MAX_HELPER_S = 600.0
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
#: The busy helpers' command name (comm), so a verdict that names the processes holding
#: the CPUs can be checked against them.
HOG_COMM = b"strata-hog"
_SYS_PIDFD_OPEN = 434  # x86-64 and aarch64 share these numbers (asm-generic)
_SYS_PROCESS_MADVISE = 440
_MADV_PAGEOUT = 21


class FaultUnavailable(StrataError, RuntimeError):
    """This machine cannot inject the fault; the message says what is missing."""


@dataclass(frozen=True)
class FaultFacts:
    """What an injector measured about its own fault (the ground truth of a run)."""

    name: str
    expected_class: str
    active_s: float
    facts: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "expected_class": self.expected_class,
                "active_s": round(self.active_s, 3), **dict(self.facts)}


# --- shared machinery ---------------------------------------------------------------------

def _stop_all() -> None:
    """Last line of defence at interpreter exit: no fault outlives the harness
    (registered by the first injector started; the live ones are
    ``process_globals.STATE.live_faults``)."""
    for inj in list(STATE.live_faults):
        inj.stop()


class Injector:
    """Base: start/stop bookkeeping, context manager, atexit registration."""

    name = "fault"
    expected_class = ""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._facts: FaultFacts | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._t0 is not None and self._facts is None

    def start(self) -> Injector:
        if self._t0 is not None:
            raise RuntimeError(f"{self.name}: an injector starts once")
        at_exit(_stop_all)
        STATE.live_faults.add(self)
        try:
            self._start()
        except BaseException:
            self._t0 = time.monotonic()
            self.stop()
            raise
        self._t0 = time.monotonic()
        return self

    def stop(self) -> FaultFacts:
        with self._lock:
            if self._facts is not None:
                return self._facts
            facts: dict[str, Any] = {}
            try:
                facts = self._stop()
            except Exception as exc:  # cleanup must not raise; say what went wrong
                facts = {"stop_error": f"{type(exc).__name__}: {exc}"}
            active = time.monotonic() - self._t0 if self._t0 is not None else 0.0
            self._facts = FaultFacts(self.name, self.expected_class, active,
                                     tuple(sorted(facts.items())))
            STATE.live_faults.discard(self)
            return self._facts

    def __enter__(self) -> Injector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # subclasses
    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> dict[str, Any]:
        raise NotImplementedError


def _helper_argv(mode: str, max_s: float, *args: str,
                 module: str = "strata_plugin.testing.faults") -> list[str]:
    return [sys.executable, "-m", module, mode,
            "--parent", str(os.getpid()),
            "--max-s", f"{min(max_s, MAX_HELPER_S):g}", *args]


def _spawn(argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # where strata_plugin is importable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)


def _await_line(proc: subprocess.Popen, word: str, timeout_s: float) -> dict[str, Any]:
    """Read the helper's ``<word> {json}`` line, or raise with its stderr."""
    stdout = proc.stdout
    assert stdout is not None
    box: dict[str, Any] = {}

    def read() -> None:
        line = stdout.readline().decode(errors="replace").strip()
        box["line"] = line

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    line = box.get("line", "")
    if not line.startswith(word + " "):
        _kill(proc)
        err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
        argv = cast(list[str], proc.args)  # the helpers are started from an argv list
        raise FaultUnavailable(f"helper {argv[3]} gave {line!r} instead of '{word}' "
                               f"within {timeout_s:g} s: {err.strip()}")
    return json.loads(line.split(" ", 1)[1])


def _kill(proc: subprocess.Popen, grace_s: float = 3.0) -> int | None:
    """SIGTERM the helper's group, SIGKILL after the grace period; reap it."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(5)
    return None


def _last_json(proc: subprocess.Popen, word: str) -> dict[str, Any]:
    """The helper's final ``<word> {json}`` line, once it has exited."""
    if proc.stdout is None:
        return {}
    with contextlib.suppress(ValueError, OSError):
        for raw in proc.stdout.read().decode(errors="replace").splitlines():
            if raw.startswith(word + " "):
                return json.loads(raw.split(" ", 1)[1])
    return {}


def _close_pipes(proc: subprocess.Popen) -> None:
    for fh in (proc.stdin, proc.stdout, proc.stderr):
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()


def _cpu_s(pid: int) -> float:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0.0
    f = data[data.rindex(b")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
    return out


# --- CPU contention -----------------------------------------------------------------------


class CpuHogs(Injector):
    """``per_core`` busy-loop processes pinned to each of ``cores`` (the server's cores)."""

    name = "cpu_hogs"
    expected_class = "cpu_contention"

    def __init__(self, cores: tuple[int, ...], per_core: int = 2, max_s: float = 120.0,
                 shield: bool = True) -> None:
        super().__init__()
        if not cores or per_core < 1:
            raise ValueError("CpuHogs needs at least one core and one hog per core")
        self.cores, self.per_core, self.max_s = tuple(cores), per_core, max_s
        self.shield = shield
        self.procs: list[tuple[int, subprocess.Popen]] = []
        self._nice: dict[int, int] = {}

    def _start(self) -> None:
        if self.shield:
            # The hogs are for the server: keep the load generator's threads ahead of them,
            # so the window holds one fault (the server's), not a starved client as well.
            self._nice = renice_threads(SHIELD_NICE)
        for core in self.cores:
            for _ in range(self.per_core):
                p = _spawn(_helper_argv("hog", self.max_s))
                self.procs.append((core, p))
                os.sched_setaffinity(p.pid, {core})
        for _core, p in self.procs:
            _await_line(p, "ready", 15.0)

    def _stop(self) -> dict[str, Any]:
        cpu = sum(_cpu_s(p.pid) for _, p in self.procs)
        for _, p in self.procs:
            _kill(p, grace_s=0.5)
            _close_pipes(p)
        restore_nice(self._nice)
        return {"hogs": len(self.procs), "cores": list(self.cores),
                "hog_pids": [p.pid for _, p in self.procs], "hog_comm": HOG_COMM.decode(),
                "hog_cpu_s": round(cpu, 3), "client_nice": SHIELD_NICE if self._nice else 0}


#: Nice value of the harness's threads while CpuHogs run (root may lower it).
SHIELD_NICE = -5


def renice_threads(nice: int) -> dict[int, int]:
    """Set every thread of this process to ``nice``; returns {tid: previous nice}.

    Nice is per thread on Linux, and threads started later inherit their creator's.
    """
    before = {}
    for tid in _tids():
        with contextlib.suppress(OSError):
            before[tid] = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    return before


def restore_nice(before: dict[int, int]) -> None:
    """Undo :func:`renice_threads`; threads started since get the main thread's value."""
    main = before.get(threading.main_thread().native_id or os.getpid(), 0)
    for tid in _tids():
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, before.get(tid, main))


# --- page faults and disk reads -----------------------------------------------------------


def file_mappers(path: str, exclude: int | None = None) -> dict[int, str]:
    """PIDs (other than ``exclude``) that map ``path``: their pages cannot be paged out."""
    real = os.path.realpath(path)
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/maps") as fh:
                hit = any(line.rstrip("\n").endswith(" " + real) for line in fh)
            if hit:
                out[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
    return out


def mapped_files(pid: int, suffix: str = "") -> list[str]:
    """Files ``pid`` maps (optionally only those ending in ``suffix``), in map order."""
    seen: list[str] = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                p = parts[5].rstrip("\n")
                if p.endswith(suffix) and p not in seen:
                    seen.append(p)
    return seen


def mapping_rss_bytes(pid: int, path: str) -> int:
    """Resident bytes of ``pid``'s mappings of ``path`` (smaps Rss)."""
    real, total, inside = os.path.realpath(path), 0, False
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for line in fh:
                if "-" in line.split(" ", 1)[0] and not line[0].isupper():
                    inside = line.rstrip("\n").endswith(" " + real)
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class PageOut(Injector):
    """Page the server's mapping of ``path`` out every ``period_s`` (process_madvise)."""

    name = "pageout"
    expected_class = "io_page_faults"

    def __init__(self, pid: int, path: str, period_s: float = 0.25,
                 max_s: float = 120.0) -> None:
        super().__init__()
        self.pid, self.path = pid, os.path.realpath(path)
        self.period_s, self.max_s = period_s, max_s
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}

    def _start(self) -> None:
        others = file_mappers(self.path, exclude=self.pid)
        if others:
            raise FaultUnavailable(
                f"{self.path} is also mapped by {others}: the kernel does not page out "
                "pages another process maps (MADV_PAGEOUT skips shared pages)")
        self.proc = _spawn(_helper_argv("pageout", self.max_s, "--pid", str(self.pid),
                                        "--path", self.path, "--period", f"{self.period_s:g}"))
        self.ready = _await_line(self.proc, "ready", 15.0)

    def _stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        _kill(self.proc)
        done = _last_json(self.proc, "done")
        _close_pipes(self.proc)
        return {"path": self.path, "first_evicted_bytes": self.ready.get("evicted_bytes"),
                "reloaded_bytes": reload_file(self.path),
                **{k: v for k, v in done.items() if k != "ok"}}


def reload_file(path: str, limit_bytes: int = 8 * 2**30) -> int:
    """Read a file back into the page cache, so a window after the fault starts warm."""
    n = 0
    with contextlib.suppress(OSError), open(path, "rb", buffering=0) as fh:
        while n < limit_bytes:
            chunk = fh.read(4 * 2**20)
            if not chunk:
                break
            n += len(chunk)
    return n


def _pidfd_pageout(pidfd: int, ranges: list[tuple[int, int]]) -> int:
    """One process_madvise(MADV_PAGEOUT) over ``ranges``; bytes advised."""
    libc = ctypes.CDLL(None, use_errno=True)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    arr = (IoVec * len(ranges))(*[IoVec(a, n) for a, n in ranges])
    r = libc.syscall(_SYS_PROCESS_MADVISE, pidfd, arr, len(ranges), _MADV_PAGEOUT, 0)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"process_madvise(MADV_PAGEOUT): {os.strerror(err)}")
    return int(r)


def _ranges(pid: int, path: str) -> list[tuple[int, int]]:
    out = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].rstrip("\n") == path:
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b - a))
    return out[:512]  # IOV_MAX is 1024; a model is a handful of mappings


# --- memory pressure ----------------------------------------------------------------------


#: The memory helper maps and touches memory this much at a time, and stops before a chunk
#: would take MemAvailable under its floor: a hog that did its job ends within one chunk.
MEM_HOG_CHUNK = 512 * 2**20
#: How far above its floor MemAvailable may stay while the hog holds its memory, as a share
#: of MemTotal (and never less than one chunk): past it the pressure was not injected.
MEM_FLOOR_TOLERANCE_FRAC = 0.05


def mem_floor_tolerance(total: int) -> int:
    """Bytes MemAvailable may stay above the hog's floor: 5% of MemTotal, at least a chunk."""
    return max(int(total * MEM_FLOOR_TOLERANCE_FRAC), MEM_HOG_CHUNK)


def mem_floor_missed(*, before: int, available: int, held: int, floor: int,
                     total: int) -> str:
    """Why the memory pressure was not injected, in words; '' when it was.

    ``available`` is MemAvailable while the hog holds ``held`` bytes, ``floor`` the level it
    aimed for. A hog stopped early (the alloc deadline, a cgroup's memory limit reclaiming
    or swapping its pages) or a host that freed cache as the hog grew leaves MemAvailable
    high: the run would then be scored as a classifier miss of a fault that was never there.
    """
    tol = mem_floor_tolerance(total)
    if available <= floor + tol:
        return ""
    return (f"MemAvailable stayed at {_gib(available)} while the hog held {_gib(held)} "
            f"(before the hog: {_gib(before)}; target: {_gib(floor)} + a tolerance of "
            f"{_gib(tol)}; MemTotal {_gib(total)}): the memory pressure was not injected")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class MemoryHog(Injector):
    """Allocate and touch memory until MemAvailable is ``leave_frac`` of MemTotal; hold it.

    Bounded: never more than ``max_frac`` of MemTotal, never below ``min_left_bytes``
    available, and the helper asks the OOM killer to pick it first (oom_score_adj 1000).
    Once the helper is ready, MemAvailable must be near that floor (``mem_floor_missed``),
    else the fault is unavailable rather than injected.
    """

    name = "memory_hog"
    expected_class = "memory_pressure"

    def __init__(self, leave_frac: float = 0.06, max_frac: float = 0.92,
                 min_left_bytes: int = 768 * 2**20, alloc_s: float = 90.0,
                 max_s: float = 120.0) -> None:
        super().__init__()
        self.leave_frac, self.max_frac = leave_frac, max_frac
        self.min_left_bytes, self.alloc_s, self.max_s = min_left_bytes, alloc_s, max_s
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}

    def _start(self) -> None:
        mi = meminfo()
        total, avail = mi["MemTotal"], mi["MemAvailable"]
        target_left = max(int(total * self.leave_frac), self.min_left_bytes)
        want = min(avail - target_left, int(total * self.max_frac))
        if want <= 0:
            raise FaultUnavailable(f"MemAvailable {avail} B is already under the target "
                                   f"{target_left} B")
        self.proc = _spawn(_helper_argv("mem", self.alloc_s + self.max_s, "--bytes", str(want),
                                        "--floor", str(target_left),
                                        "--alloc-s", f"{self.alloc_s:g}"))
        t0 = time.monotonic()
        self.ready = _await_line(self.proc, "ready", self.alloc_s + 15.0)
        self.ready["alloc_s"] = round(time.monotonic() - t0, 2)
        self.ready["mem_available_before"] = avail
        self.ready["mem_total"] = total
        self.ready["mem_floor"] = floor = avail - want
        now = meminfo()["MemAvailable"]
        if self.proc.poll() is not None:  # the OOM killer or a cgroup limit took it
            raise FaultUnavailable(f"the memory hog exited (code {self.proc.returncode}) "
                                   f"right after it was ready, holding "
                                   f"{_gib(self.ready.get('allocated_bytes', 0))}")
        why = mem_floor_missed(before=avail, available=now,
                               held=int(self.ready.get("allocated_bytes", 0)), floor=floor,
                               total=total)
        if why:
            raise FaultUnavailable(why)

    def _stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        after = meminfo()["MemAvailable"]
        _kill(self.proc)
        _close_pipes(self.proc)
        freed = meminfo()["MemAvailable"]
        return {**self.ready, "mem_available_held": after, "mem_available_after_stop": freed}


# --- the client itself --------------------------------------------------------------------


def _cpu_cgroup_root() -> tuple[Path, str]:
    """(mount point of the cpu controller, 'v1' or 'v2'), or FaultUnavailable."""
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "cpu" in opts.split(","):
            return Path(mnt), "v1"
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, _ = line.split()[:4]
        ctl = Path(mnt) / "cgroup.controllers"
        if fstype == "cgroup2" and ctl.exists() and "cpu" in ctl.read_text().split():
            return Path(mnt), "v2"
    raise FaultUnavailable("no cgroup cpu controller mounted")


def _own_cgroup(tid: int, version: str, pid: int | str = "self") -> str:
    for line in Path(f"/proc/{pid}/task/{tid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (version == "v1" and "cpu" in ctrls.split(",")) or (version == "v2" and ctrls == ""):
            return path
    return "/"


def _tids() -> list[int]:
    return sorted(int(t) for t in os.listdir("/proc/self/task"))


def _quota_cgroup(home: Path, name: str, version: str, quota_cores: float, period_us: int,
                  threaded: bool) -> Path:
    """A new cgroup ``home/name`` with a CFS quota of ``quota_cores`` (FaultUnavailable
    when the kernel refuses)."""
    d = home / name
    try:
        d.mkdir(exist_ok=True)
        quota_us = max(1000, int(quota_cores * period_us))
        if version == "v1":
            (d / "cpu.cfs_period_us").write_text(str(period_us))
            (d / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            if threaded:
                (d / "cgroup.type").write_text("threaded")
            (d / "cpu.max").write_text(f"{quota_us} {period_us}")
    except OSError as exc:
        with contextlib.suppress(OSError):
            d.rmdir()
        raise FaultUnavailable(f"cannot create a CPU-limited cgroup under {home}: "
                               f"{exc}") from None
    return d


def _rmdir_cgroup(d: Path, move_back: Any) -> None:
    """Remove an emptied cgroup; its tasks leave a moment after they are moved."""
    deadline = time.monotonic() + 5
    while True:
        try:
            d.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            move_back()
            time.sleep(0.05)


class ServerCpuQuota(Injector):
    """The server process (every thread) moved into a cgroup of its own whose CFS quota is
    ``quota_cores`` cores, and back on ``stop()``.

    This is how a container runtime or a systemd slice limits a server: the host stays
    idle, the server is throttled in each enforcement period it used its quota. The
    sampling agent follows the server's cgroup (``--cgroup server``), so it reads this
    group's throttling while the fault is on.
    """

    name = "server_cpu_quota"
    expected_class = "cpu_limited"

    def __init__(self, pid: int, quota_cores: float = 0.5, period_us: int = 100_000) -> None:
        super().__init__()
        if not 0.01 <= quota_cores <= 64:
            raise ValueError("quota_cores is a number of cores in [0.01, 64]")
        self.pid, self.quota, self.period_us = pid, quota_cores, period_us
        self.dir: Path | None = None
        self.home: Path | None = None
        self.version = ""

    def _start(self) -> None:
        root, self.version = _cpu_cgroup_root()
        home = root / _own_cgroup(self.pid, self.version, self.pid).lstrip("/")
        self.home = home
        sweep_cgroups(home, "strata-server-")
        self.dir = _quota_cgroup(home, f"strata-server-{self.pid}", self.version,
                                 self.quota, self.period_us, threaded=False)
        try:
            (self.dir / "cgroup.procs").write_text(str(self.pid))
        except OSError as exc:
            raise FaultUnavailable(f"cannot move the server into {self.dir}: {exc}") from None

    def _move_back(self) -> None:
        assert self.home is not None
        with contextlib.suppress(OSError):  # the server may have ended
            (self.home / "cgroup.procs").write_text(str(self.pid))

    def _stop(self) -> dict[str, Any]:
        if self.dir is None or self.home is None:
            return {}
        stat = _cpu_stat(self.dir)
        self._move_back()
        _rmdir_cgroup(self.dir, self._move_back)
        return {"quota_cores": self.quota, "cgroup": str(self.dir), **stat}


class ClientThrottle(Injector):
    """This process's threads (the load generator) capped to ``quota`` of one core (CFS).

    Only the harness's own threads move: the server and the sampling agent are other
    processes and keep their CPU. Threads started later inherit the cgroup. ``stop()``
    moves every thread back and removes the cgroup.
    """

    name = "client_throttle"
    expected_class = "client_bound"

    def __init__(self, quota: float = 0.1, period_us: int = 100_000) -> None:
        super().__init__()
        if not 0.01 <= quota <= 1.0:
            raise ValueError("quota is a share of one core in [0.01, 1]")
        self.quota, self.period_us = quota, period_us
        self.dir: Path | None = None
        self.home: Path | None = None
        self.version = ""

    def _start(self) -> None:
        root, self.version = _cpu_cgroup_root()
        home = root / _own_cgroup(threading.get_native_id(), self.version).lstrip("/")
        self.home = home
        sweep_cgroups(home)
        self.dir = _quota_cgroup(home, f"strata-client-{os.getpid()}", self.version,
                                 self.quota, self.period_us, threaded=True)
        self._move(self.dir)

    def _move(self, dest: Path) -> None:
        target = dest / ("tasks" if self.version == "v1" else "cgroup.threads")
        for tid in _tids():
            with contextlib.suppress(OSError):  # a thread that just ended
                target.write_text(str(tid))

    def _stop(self) -> dict[str, Any]:
        if self.dir is None or self.home is None:
            return {}
        stat = _cpu_stat(self.dir)
        home = self.home
        self._move(home)
        _rmdir_cgroup(self.dir, lambda: self._move(home))
        return {"quota_cores": self.quota, "cgroup": str(self.dir), **stat}


def _cpu_stat(d: Path) -> dict[str, Any]:
    from strata_plugin.agent.procfs import parse_kv

    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        out = dict(parse_kv((d / "cpu.stat").read_bytes()))
    if "throttled_time" in out:  # v1: ns
        out["throttled_s"] = round(out.pop("throttled_time") / 1e9, 3)
    if "throttled_usec" in out:
        out["throttled_s"] = round(out.pop("throttled_usec") / 1e6, 3)
    return {k: v for k, v in out.items() if k in ("nr_periods", "nr_throttled", "throttled_s")}


def sweep_cgroups(home: Path, prefix: str = "strata-client-") -> list[str]:
    """Remove ``<prefix><pid>`` cgroups whose process is gone (a killed run)."""
    removed = []
    for d in home.glob(prefix + "*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                d.rmdir()
                removed.append(str(d))
    return removed


# --- the network --------------------------------------------------------------------------


class LinkCap(Injector):
    """A tc tbf rate cap on both ends of a veth (``lab`` is a tests.netlab.NetLab)."""

    name = "link_cap"
    expected_class = "network"

    def __init__(self, lab: Any, rate: str = "8mbit", burst: str = "32kbit",
                 latency: str = "50ms") -> None:
        super().__init__()
        self.lab, self.rate, self.burst, self.latency = lab, rate, burst, latency

    def _start(self) -> None:
        self.lab.cap(self.rate, self.burst, self.latency)

    def _stop(self) -> dict[str, Any]:
        self.lab.uncap()
        return {"rate": self.rate, "device": self.lab.head_if}


# --- the "no injection" arm -----------------------------------------------------------------


class NoFault(Injector):
    """The clean arm: nothing injected (keeps the scenario code one path)."""

    name = "none"

    def _start(self) -> None:
        pass

    def _stop(self) -> dict[str, Any]:
        return {}


# --- ground truth for a window -------------------------------------------------------------


def _host_busy_steal_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole host; busy = user+nice+system+irq+softirq,
    as the agent counts it."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    tck = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in (f[1], f[2], f[3], f[6], f[7])) / tck, int(f[8]) / tck


def _trees_cpu_faults(server: int | None) -> tuple[float, float, int, int]:
    """(server tree CPU s, CPU s of this process's other descendants and itself, server
    major faults, server storage read bytes). The server is our child, so it is taken
    out of our own tree."""
    from strata_plugin.agent.procfs import process_tree, read_process_counters

    srv = set(process_tree(server)) if server is not None else set()
    own = [p for p in process_tree(os.getpid()) if p not in srv]
    s = read_process_counters(sorted(srv))
    o = read_process_counters(own)
    return s.cpu_s, o.cpu_s, s.major_faults, s.read_bytes


def tree_threads(pid: int) -> dict[int, list[int]]:
    """{process: its thread ids} for ``pid``'s process tree (empty when it is gone)."""
    from strata_plugin.agent.procfs import process_tree

    out: dict[int, list[int]] = {}
    for p in process_tree(pid):
        with contextlib.suppress(OSError):  # a process that just ended
            out[p] = sorted(int(t) for t in os.listdir(f"/proc/{p}/task"))
    return out


def sched_s(pid: int) -> tuple[float, float]:
    """(on-CPU s, run-queue wait s) summed over the live threads of ``pid``'s tree, from
    each thread's schedstat (the kernel's own clocks, apart from the agent)."""
    from strata_plugin.agent.procfs import parse_schedstat

    run = wait = 0
    for p, tids in tree_threads(pid).items():
        for tid in tids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                a, b, _ = parse_schedstat(Path(f"/proc/{p}/task/{tid}/schedstat").read_bytes())
                run += a
                wait += b
    return run / 1e9, wait / 1e9


def allowed_cpus(pid: int) -> int:
    """How many CPUs the threads of ``pid``'s tree may run on (the union of their
    affinity masks, which a cpuset also sets); the host's count when it is gone."""
    cpus: set[int] = set()
    for tids in tree_threads(pid).values():
        for tid in tids:
            with contextlib.suppress(OSError):
                cpus |= os.sched_getaffinity(tid)
    return len(cpus) or (os.cpu_count() or 1)


def _own_threads_wait_s() -> float:
    """Run-queue wait of this process's threads (the load generator among them), in s:
    time they were ready to run and did not get a CPU, from each thread's schedstat."""
    from strata_plugin.agent.procfs import parse_schedstat

    total = 0
    for tid in _tids():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended
            total += parse_schedstat(Path(f"/proc/self/task/{tid}/schedstat").read_bytes())[1]
    return total / 1e9


class GroundTruth(Injector):
    """What really happened on the host during a window, measured apart from the agent.

    The clean arm of a scenario may still meet a real bottleneck on a shared machine
    (another user's build holding the cores, hypervisor steal); this says so
    independently, so a verdict that names it is not counted as a false alarm. A thread
    samples every ``period_s``; :meth:`window` cuts the series to a case's measured
    window (monotonic ns) like the report does, counters interpolated at the edges.

    Facts: ``other_cores_frac``: host busy CPU not used by the server's tree, over all
    cores (what the attribution calls other processes); ``foreign_cores``: the same minus
    this process's tree too (agent, injectors: someone else's load); ``steal_frac``;
    ``min_mem_available_frac``; ``server_major_faults_per_s``, ``server_read_bytes_s``;
    ``harness_wait_per_s``: seconds per second this process's threads (the load
    generator) sat ready to run without a CPU (a client starved of CPU, measured by the
    kernel, apart from the load generator's own self-check); ``server_runnable_threads``:
    the mean number of the server's threads running or waiting for a CPU (schedstat run
    time plus run-queue wait, per second), against ``server_allowed_cpus``, the mean
    number of CPUs its threads' masks allowed (an allowance smaller than its busy threads).
    """

    name = "ground_truth"
    #: (mono ns, busy s, steal s, server cpu s, own cpu s, server majflt, server read B,
    #: own threads' run-queue wait s, server threads' run + wait s, server allowed CPUs)
    FIELDS = 10

    def __init__(self, server_pid: int | None, period_s: float = 0.25) -> None:
        super().__init__()
        self.server_pid, self.period_s = server_pid, period_s
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.series: list[tuple[float, ...]] = []
        self.avail: list[tuple[int, float]] = []

    def _sample(self) -> None:
        server_cpu, own_cpu, faults, reads = _trees_cpu_faults(self.server_pid)
        run, wait = sched_s(self.server_pid) if self.server_pid else (0.0, 0.0)
        cpus = allowed_cpus(self.server_pid) if self.server_pid else (os.cpu_count() or 1)
        t = time.monotonic_ns()
        self.series.append((t, *_host_busy_steal_s(), server_cpu, own_cpu, faults, reads,
                            _own_threads_wait_s(), run + wait, cpus))
        mi = meminfo()
        self.avail.append((t, mi["MemAvailable"] / mi["MemTotal"]))

    def _watch(self) -> None:
        while not self._halt.wait(self.period_s):
            self._sample()

    def _start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._watch, name="strata-truth", daemon=True)
        self._thread.start()

    def _stop(self) -> dict[str, Any]:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(5)
        self._sample()
        return self.window(int(self.series[0][0]), int(self.series[-1][0]))  # monotonic_ns

    def _at(self, t_ns: int) -> tuple[float, ...]:
        """Every counter linearly interpolated at ``t_ns`` (held outside the series)."""
        s = self.series
        if t_ns <= s[0][0]:
            return s[0]
        for a, b in itertools.pairwise(s):
            if a[0] <= t_ns <= b[0]:
                f = (t_ns - a[0]) / max(1, b[0] - a[0])
                return tuple(x + f * (y - x) for x, y in zip(a, b))
        return s[-1]

    def window(self, start_ns: int, end_ns: int) -> dict[str, Any]:
        """The facts over ``[start_ns, end_ns]`` (monotonic ns)."""
        a, b = self._at(start_ns), self._at(end_ns)
        dt = max((end_ns - start_ns) / 1e9, 1e-9)
        ncpu = os.cpu_count() or 1
        busy, steal, srv, own = (b[i] - a[i] for i in (1, 2, 3, 4))
        avail = [v for t, v in self.avail if start_ns - self.period_s * 1e9 <= t <= end_ns]
        cpus = [s[9] for s in self.series if start_ns <= s[0] <= end_ns] or [a[9], b[9]]
        return {"window_s": round(dt, 3), "host_busy_cores": round(busy / dt, 3),
                "server_cores": round(srv / dt, 3), "harness_cores": round(own / dt, 3),
                "foreign_cores": round(max(0.0, busy - srv - own) / dt, 3),
                "other_cores_frac": round(max(0.0, busy - srv) / dt / ncpu, 3),
                "steal_frac": round(steal / dt / ncpu, 3),
                "min_mem_available_frac": round(min(avail, default=1.0), 4),
                "server_major_faults_per_s": round((b[5] - a[5]) / dt, 2),
                "server_read_bytes_s": round((b[6] - a[6]) / dt),
                "harness_wait_per_s": round((b[7] - a[7]) / dt, 3),
                "server_runnable_threads": round((b[8] - a[8]) / dt, 3),
                "server_allowed_cpus": round(sum(cpus) / len(cpus), 3)}


def wait_quiet(server_pid: int | None, max_frac: float = 0.15, settle_s: float = 1.0,
               max_wait_s: float = 30.0) -> float:
    """Wait (bounded) until other processes hold under ``max_frac`` of the cores.

    On a shared machine another user's job can be the real bottleneck of a clean arm;
    starting when the host is quiet keeps the arms about the injected fault. Returns the
    last measured share; the caller records it either way (it never decides a verdict).
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        g = GroundTruth(server_pid).start()
        time.sleep(settle_s)
        frac = float(g.stop().as_dict().get("foreign_cores", 0.0)) / (os.cpu_count() or 1)
        if frac < max_frac or time.monotonic() >= deadline:
            return frac


# --- helper processes -----------------------------------------------------------------------


def _guard(parent: int, max_s: float) -> float:
    """Die with the parent; return the deadline."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(0)

    def term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, term)
    return time.monotonic() + min(max_s, MAX_HELPER_S)


def _say(word: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(f"{word} {json.dumps(payload, sort_keys=True)}\n")
    sys.stdout.flush()


def _main_hog(a: argparse.Namespace, deadline: float) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(HOG_COMM), 0, 0, 0)
    _say("ready", {"pid": os.getpid()})
    n = 0
    while True:
        n += 1
        if not n & 0xFFFF and (time.monotonic() > deadline or os.getppid() != a.parent):
            return


def _main_pageout(a: argparse.Namespace, deadline: float) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, a.pid, 0)
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    calls = advised = 0
    rss_before = mapping_rss_bytes(a.pid, a.path)
    try:
        ranges = _ranges(a.pid, a.path)
        if not ranges:
            raise FaultUnavailable(f"pid {a.pid} does not map {a.path}")
        advised += _pidfd_pageout(pidfd, ranges)
        calls += 1
        first = rss_before - mapping_rss_bytes(a.pid, a.path)
        if first <= 0 and rss_before > 0:
            raise FaultUnavailable(f"MADV_PAGEOUT left {rss_before} B of {a.path} resident")
        _say("ready", {"evicted_bytes": first, "rss_before": rss_before})
        while time.monotonic() < deadline and os.getppid() == a.parent:
            time.sleep(a.period)
            ranges = _ranges(a.pid, a.path)
            if not ranges:
                break
            advised += _pidfd_pageout(pidfd, ranges)
            calls += 1
    finally:
        _say("done", {"calls": calls, "advised_bytes": advised})
        os.close(pidfd)


def _main_mem(a: argparse.Namespace, deadline: float) -> None:
    import mmap

    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")
    chunk = MEM_HOG_CHUNK
    maps = []
    total = 0
    alloc_deadline = time.monotonic() + a.alloc_s
    while total < a.bytes and time.monotonic() < min(deadline, alloc_deadline):
        if meminfo()["MemAvailable"] - chunk < a.floor:
            break
        n = min(chunk, a.bytes - total)
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        maps.append(m)
        total += n
    _say("ready", {"allocated_bytes": total, "mem_available_held": meminfo()["MemAvailable"]})
    while time.monotonic() < deadline and os.getppid() == a.parent:
        time.sleep(0.1)
    for m in maps:
        m.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata_plugin.testing.faults")
    p.add_argument("mode", choices=("hog", "pageout", "mem"))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--pid", type=int, default=0)
    p.add_argument("--path", default="")
    p.add_argument("--period", type=float, default=0.25)
    p.add_argument("--bytes", type=int, default=0)
    p.add_argument("--floor", type=int, default=0)
    p.add_argument("--alloc-s", type=float, default=60.0)
    a = p.parse_args(argv)
    deadline = _guard(a.parent, a.max_s)
    try:
        {"hog": _main_hog, "pageout": _main_pageout, "mem": _main_mem}[a.mode](a, deadline)
    except FaultUnavailable as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
