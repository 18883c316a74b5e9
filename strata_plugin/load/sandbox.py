"""Run model-written code against frozen tests, confined, and get a result it cannot forge.

Model output is hostile input: a harness run in CI as root, next to credentials, must not
let it read the environment, reach the network, write anywhere that outlives it, outlast
its timeout, or decide its own score. ``run_frozen_tests`` gives it none of those:

* **Environment:** the sandbox starts with ``PATH=/usr/bin:/bin``, ``LC_ALL``, and
  ``HOME``/``TMPDIR`` set to its scratch folder; nothing of the harness's is inherited.
* **User:** as root, the program runs as ``nobody`` (uid and gid 65534, no supplementary
  groups, no capabilities, no-new-privileges). Not root, it runs as the invoking user
  (already unprivileged) inside a user namespace, without capabilities.
* **Network:** a new network namespace holding only a loopback that is down; abstract
  unix sockets are per namespace too. **Unix sockets:** a seccomp filter (set in
  ``sandbox_child.py`` after the user change) denies ``socket(AF_UNIX)``, datagram
  ``socketpair``s and io_uring, and kills a call of another syscall ABI: a pathname
  socket anywhere (a read-only mount does not stop a connect) cannot be reached.
* **Filesystem:** a private mount namespace where every mount is read-only, ``/tmp``,
  ``/var/tmp``, ``/dev/shm``, ``/run``, ``/root`` and ``/home`` are empty read-only tmpfs
  (but for the Python installation, bound back read-only at its path when it lives
  there), ``/proc`` shows only the sandbox's processes (a new PID namespace), and the one
  writable path is the scratch folder, a tmpfs of ``Limits.scratch_bytes`` owned by the
  sandbox user, its working directory, gone when the sandbox ends. The rest of the
  filesystem stays readable where its permissions let the sandbox user read.
* **Memory, in total:** one memory cgroup, made below the harness's own, holds every
  process of the sandbox (boot joins it first): their pages, memfds, the scratch tmpfs
  and kernel memory share ``Limits.total_memory_bytes``; the kernel's OOM kills stay in
  it. It is emptied (SIGKILL) and removed after the run. Where none can be made (no
  memory controller; not root and none delegated) a confined run is refused, naming
  why, unless ``tree_memory=False`` accepts the per-process bound.
* **Limits:** CPU seconds, address space, file size, processes (RLIMIT_NPROC counts the
  sandbox user's processes system-wide), open files, no core files.
* **Lifetime:** its own session and process group, and its own PID namespace: at the
  timeout the namespace's first process is killed, which makes the kernel kill every
  process in it (even one that left the group with ``setsid``), then the whole group is
  killed. When ``run_frozen_tests`` returns, nothing of the run is left; if the harness
  dies first, a parent-death signal ends the sandbox with it.

**Why a forged result gains nothing.** The frozen tests and the program never share a
process. The *judge* (``sandbox_child.py``, trusted, unprivileged, non-dumpable so the
program cannot ptrace it or open its ``/proc/PID/mem`` or ``fd``) runs the test file; the
program runs in a second process, the *candidate*, and the test file's ``from solution
import add`` imports a proxy whose calls go over a pipe pair and come back decoded as
plain builtin data. Whatever the program prints, returns or patches, only values the
frozen tests themselves compare can make a test pass. The judge writes its count to its
stdout, a pipe the candidate never holds (it gets ``/dev/null``, the log pipe and its two
RPC pipes, nothing else); the message carries a per-run nonce (``secrets.token_hex``)
that reaches the judge in a memfd it reads and closes before the candidate exists, and
never appears in an argument, the environment or a file. The candidate's stdout and stderr
are a log, shown in failures and never parsed. A count without the right nonce is no
result. The price: frozen tests can exchange only plain data (None, bool, int, float,
complex, str, bytes, list, tuple, dict, set, frozenset) with the program, and a
non-builtin exception from it arrives as ``RemoteError``.

**Where a step is unavailable** (not root and no user namespaces, no mount or network
namespace, the sandbox user cannot run this Python), ``probe`` says which step and why,
and ``code_passes`` refuses (``SandboxUnavailable``) unless the case opts in by name with
``allow_unsandboxed=True`` or the profile with ``allow_unsandboxed_code = true``
(``allow_unconfined``); then the judge still scores through its own channel and the
environment is still empty, but nothing else above holds.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from strata_plugin.errors import StrataError

CHILD = Path(__file__).with_name("sandbox_child.py")
SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
SCRATCH = "/tmp/strata-scratch"  # inside the sandbox's own empty /tmp
LOG_KEEP = 64 * 1024  # bytes of the program's log kept (the tail)
KILL_GRACE_S = 5.0


class SandboxUnavailable(StrataError, RuntimeError):
    """This machine cannot confine model-written code; the message says which step failed."""


@dataclass(frozen=True)
class Limits:
    """Resource limits inside the sandbox: per process (``processes`` counts per user),
    but ``total_memory_bytes``, one limit for the whole tree."""
    cpu_s: int = 30
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 64
    open_files: int = 64
    scratch_bytes: int = 64 << 20
    #: every process of the sandbox together (a memory cgroup): their pages, memfds and
    #: shared memory, the scratch tmpfs's files, pipe buffers and kernel memory
    total_memory_bytes: int = 1 << 30


@dataclass(frozen=True)
class Outcome:
    """The judge's count, or why there is none."""
    passed: int
    total: int
    failures: tuple[str, ...] = ()
    error: str = ""  # setup failure, load failure or no result: nothing was scored
    timed_out: bool = False
    log: str = ""  # the program's stdout and stderr (tail): never trusted
    mode: str = ""  # root, userns or none (unconfined)
    pgid: int = 0
    memory_scope: str = ""  # "tree: <cgroup>" or "process: <why there is no cgroup>"
    oom_kills: int = 0  # processes the kernel killed at the tree's memory limit
    memory_peak_bytes: int = 0  # the tree's most memory at once (0: no cgroup)


def mode() -> str:
    """How this process can confine: as root directly, otherwise in a user namespace."""
    return "root" if os.geteuid() == 0 else "userns"


def run_frozen_tests(code: str, tests: str, *, tests_name: str = "frozen_tests.py",
                     module: str = "solution", timeout_s: float = 30.0,
                     limits: Limits | None = None, confine: bool = True,
                     tree_memory: bool = True) -> Outcome:
    """Save ``code`` as ``module.py`` and run the frozen test source ``tests`` over it.

    ``confine=False`` (an explicit opt-in) skips namespaces and the user change; the
    channel, the empty environment and the limits stay. A confined run needs a memory
    cgroup for the whole program tree (``Limits.total_memory_bytes``) and fails its setup
    naming why there is none, unless ``tree_memory=False`` (an explicit opt-in) accepts
    the weaker per-process bound (``Limits.memory_bytes`` of address space per process).
    """
    limits = limits or Limits(cpu_s=max(1, math.ceil(timeout_s)))
    how = mode() if confine else "none"
    if how == "none" and os.geteuid() != 0:
        # Outside a user namespace RLIMIT_NPROC counts every process of this user.
        limits = replace(limits, processes=limits.processes + _processes_of(os.getuid()))
    nonce = secrets.token_hex(16)
    host_scratch = None if confine else tempfile.mkdtemp(prefix="strata-code-")
    uid, gid = (SANDBOX_UID, SANDBOX_GID) if how == "root" else (os.getuid(), os.getgid())
    cfg = {"nonce": nonce, "mode": how, "parent": os.getpid(), "uid": uid, "gid": gid,
           "python": sys.executable, "scratch": host_scratch or SCRATCH, "module": module,
           "code": code, "tests": tests, "tests_name": tests_name, "limits": asdict(limits),
           "source": CHILD.read_text(encoding="utf-8"), "expose": _python_dirs()}
    group, why = make_memory_cgroup(limits.total_memory_bytes) if confine else (None, "")
    if group is None and confine and tree_memory:
        return Outcome(0, 1, error=f"sandbox setup failed: {NO_CGROUP}: {why}", mode=how,
                       memory_scope=f"none: {why}")
    if group is not None:
        cfg["cgroup_procs"] = str(group.procs)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", cfg["source"], "boot"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd="/",
                                start_new_session=True, close_fds=True)
        out = _collect(proc, cfg, timeout_s, how)
    finally:
        oom = group.close() if group is not None else 0
        if host_scratch:
            _remove(host_scratch)
    scope = (f"tree: {group.path}" if group is not None
             else f"process: {why}" if confine else "process: unconfined")
    if oom:
        note = (f"the sandbox's memory limit ({limits.total_memory_bytes >> 20} MiB for "
                f"all its processes together) was reached: the kernel killed {oom} "
                f"process(es)")
        out = replace(out, error=f"{out.error}; {note}" if out.error else "",
                      failures=out.failures + (() if out.error else (note,)))
    return replace(out, memory_scope=scope, oom_kills=oom,
                   memory_peak_bytes=group.peak_bytes if group is not None else 0)


NO_CGROUP = "no memory cgroup for the program tree"
_groups = itertools.count(1)


@dataclass
class MemoryCgroup:
    """A memory cgroup of this process's own (a child of the one it runs in), holding the
    sandbox's every process: one limit for all of them, memfds included."""

    path: Path
    version: int  # 1 or 2
    peak_bytes: int = 0  # read by close()

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """Processes the kernel killed here at the limit (v1 ``memory.oom_control``, v2
        ``memory.events``)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, val = line.partition(" ")
                if key == "oom_kill":
                    return int(val)
        except (OSError, ValueError):
            pass
        return 0

    def peak(self) -> int:
        """The most memory the tree held at once (v1 ``max_usage_in_bytes``, v2
        ``memory.peak``; 0 where the kernel does not say)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def close(self) -> int:
        """SIGKILL whatever is still in it, remove it; returns the OOM kills it saw."""
        oom = self.oom_kills()
        self.peak_bytes = self.peak()
        deadline = time.monotonic() + KILL_GRACE_S
        while True:
            try:
                pids = [int(x) for x in self.procs.read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                self.path.rmdir()
                return oom
            except FileNotFoundError:
                return oom
            except OSError:  # EBUSY: a process is still exiting
                if time.monotonic() > deadline:
                    return oom
                time.sleep(0.02)


def _cgroup_mounts() -> tuple[Path | None, Path | None]:
    """(the v1 memory hierarchy's mount, the v2 unified mount), from mountinfo."""
    v1 = v2 = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup" and "memory" in tail[2].split(",") and v1 is None:
            v1 = Path(fields[4].replace("\\040", " "))
        elif tail[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4].replace("\\040", " "))
    return v1, v2


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` ("" for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if (controller and controller in ctrls.split(",")) or (not controller and not ctrls):
            return path
    return None


def _sweep(parent: Path) -> None:
    """Remove the cgroups a killed harness left (its processes are gone with it: the
    sandbox dies with the harness, so they are empty)."""
    try:
        names = [p.name for p in parent.iterdir() if p.name.startswith("strata-sandbox-")]
    except OSError:
        return
    for n in names:
        pid = n.split("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            try:
                (parent / n).rmdir()
            except OSError:
                pass


def make_memory_cgroup(limit: int) -> tuple[MemoryCgroup | None, str]:
    """A fresh memory cgroup below this process's own, limited to ``limit`` bytes (swap
    included, where the kernel accounts it); or None and why there is none (no memory
    controller, no permission: not root and no delegated cgroup)."""
    name = f"strata-sandbox-{os.getpid()}-{next(_groups)}"
    v1, v2 = _cgroup_mounts()
    tried = []
    own = _own_cgroup("memory")
    if v1 is not None and own is not None:
        _sweep(v1 / own.lstrip("/"))
        group = v1 / own.lstrip("/") / name
        try:
            group.mkdir()
        except OSError as exc:
            tried.append(f"cgroup v1: mkdir {group}: {exc.strerror}")
        else:
            try:
                (group / "memory.limit_in_bytes").write_text(str(limit))
                if (group / "memory.memsw.limit_in_bytes").exists():
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
                return MemoryCgroup(group, 1), ""
            except OSError as exc:
                tried.append(f"cgroup v1: setting the limit in {group}: {exc.strerror}")
                group.rmdir()
    own2 = _own_cgroup("")
    if v2 is not None and own2 is not None:
        parent = v2 / own2.lstrip("/")
        controllers = ""
        try:
            controllers = (parent / "cgroup.subtree_control").read_text()
            if "memory" not in controllers.split():
                (parent / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            why = (" (this cgroup has processes and is not the root: only a delegated, "
                   "empty parent can hand the memory controller down)"
                   if exc.errno == errno.EBUSY else "")
            tried.append(f"cgroup v2: enabling memory in {parent}/cgroup.subtree_control: "
                         f"{exc.strerror}{why}")
        else:
            group = parent / name
            _sweep(parent)
            try:
                group.mkdir()
                (group / "memory.max").write_text(str(limit))
                for key, val in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (group / key).exists():
                        (group / key).write_text(val)
                return MemoryCgroup(group, 2), ""
            except OSError as exc:
                tried.append(f"cgroup v2: {group}: {exc.strerror}")
                try:
                    group.rmdir()
                except OSError:
                    pass
    if not tried:
        tried.append("no memory controller is mounted (neither a cgroup v1 memory "
                     "hierarchy nor cgroup v2) in /proc/self/mountinfo")
    return None, "; ".join(tried) + (
        "; as root it is made below this process's cgroup; not root, it needs a delegated "
        "cgroup (e.g. `systemd-run --user --scope -p Delegate=yes ...`)"
        if os.geteuid() != 0 else "")


def _processes_of(uid: int) -> int:
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            n += os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            pass
    return n


def _python_dirs() -> list[str]:
    """Where this Python lives: kept visible when the home directories are hidden."""
    exe = os.path.abspath(sys.executable)
    return sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                   os.path.dirname(exe), os.path.dirname(os.path.realpath(exe))})


def _collect(proc: subprocess.Popen, cfg: dict, timeout_s: float, how: str) -> Outcome:
    result, log = bytearray(), bytearray()

    def read(stream, into: bytearray, keep: int, tail: bool) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            into += chunk
            if len(into) > keep and tail:
                del into[:len(into) - keep]
            elif len(into) > keep:
                del into[keep:]

    readers = [threading.Thread(target=read, args=(proc.stdout, result, 1 << 20, False),
                                daemon=True),
               threading.Thread(target=read, args=(proc.stderr, log, LOG_KEEP, True),
                                daemon=True)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.stdin.write(json.dumps(cfg).encode())
        proc.stdin.close()
    except OSError:
        pass  # it died at once: the result channel says why, or nothing does
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    _kill_group(proc.pid)
    for t in readers:
        t.join(KILL_GRACE_S)
    text = log.decode("utf-8", "replace")
    base = {"log": text, "mode": how, "pgid": proc.pid, "timed_out": timed_out}
    if timed_out:
        return Outcome(0, 1, error=f"timed out after {timeout_s:g} s", **base)
    msg = _message(bytes(result), cfg["nonce"])
    if msg is None:
        return Outcome(0, 1, error=f"no result from the sandbox (exit status "
                                   f"{proc.returncode}): {text.strip()[-300:]}", **base)
    if "setup_error" in msg:
        return Outcome(0, 1, error=f"sandbox setup failed: {msg['setup_error']}", **base)
    if "error" in msg:
        return Outcome(0, 1, error=str(msg["error"]), **base)
    return Outcome(int(msg["passed"]), int(msg["total"]),
                   tuple(str(f) for f in msg.get("failures", ())), **base)


def _message(raw: bytes, nonce: str) -> dict | None:
    """The judge's one message, only if it carries this run's nonce."""
    try:
        msg = json.loads(raw.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not isinstance(msg, dict) or not secrets.compare_digest(str(msg.get("nonce")), nonce):
        return None
    return msg


def _stop(proc: subprocess.Popen) -> None:
    """Ask boot to kill the namespace (it returns once the namespace is empty), then force."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    _kill_group(proc.pid)
    proc.wait()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


_unconfined_by = ""


def allow_unconfined(by: str) -> None:
    """Opt this process in to running model-written code unconfined where confinement is
    unavailable; ``by`` names who opted in (a profile), and every such verdict says it."""
    global _unconfined_by
    _unconfined_by = by


def unconfined_allowed_by() -> str:
    """Who opted in to unconfined runs (``allow_unconfined``), or ``""``."""
    return _unconfined_by


PROBE_CODE = "def one():\n    return 1\n"
PROBE_TESTS = "from solution import one\n\n\ndef test_one():\n    assert one() == 1\n"


@functools.cache
def probe() -> str | None:
    """``None`` when a confined run works here, else the failing step (a real run, cached)."""
    out = run_frozen_tests(PROBE_CODE, PROBE_TESTS, tests_name="probe.py", timeout_s=20.0)
    if out.error:
        return f"{out.mode} sandbox: {out.error}"
    if (out.passed, out.total) != (1, 1):
        return f"{out.mode} sandbox: the probe passed {out.passed}/{out.total}: {out.failures}"
    return None
