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
  unix sockets are per namespace too, and ``/run``, ``/tmp``... are hidden (below), so
  no socket file of the host's daemons is reachable through them.
* **Filesystem:** a private mount namespace where every mount is read-only, ``/tmp``,
  ``/var/tmp``, ``/dev/shm``, ``/run``, ``/root`` and ``/home`` are empty read-only tmpfs
  (but for the Python installation, bound back read-only at its path when it lives
  there), ``/proc`` shows only the sandbox's processes (a new PID namespace), and the one
  writable path is the scratch folder, a tmpfs of ``Limits.scratch_bytes`` owned by the
  sandbox user, its working directory, gone when the sandbox ends. The rest of the
  filesystem stays readable where its permissions let the sandbox user read.
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

import functools
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
    """Per-process resource limits inside the sandbox (``processes`` counts per user)."""
    cpu_s: int = 30
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 64
    open_files: int = 64
    scratch_bytes: int = 64 << 20


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


def mode() -> str:
    """How this process can confine: as root directly, otherwise in a user namespace."""
    return "root" if os.geteuid() == 0 else "userns"


def run_frozen_tests(code: str, tests: str, *, tests_name: str = "frozen_tests.py",
                     module: str = "solution", timeout_s: float = 30.0,
                     limits: Limits | None = None, confine: bool = True) -> Outcome:
    """Save ``code`` as ``module.py`` and run the frozen test source ``tests`` over it.

    ``confine=False`` (an explicit opt-in) skips namespaces and the user change; the
    channel, the empty environment and the limits stay.
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
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", cfg["source"], "boot"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd="/",
                                start_new_session=True, close_fds=True)
        return _collect(proc, cfg, timeout_s, how)
    finally:
        if host_scratch:
            _remove(host_scratch)


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
