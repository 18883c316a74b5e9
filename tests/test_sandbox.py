"""Model-written code runs confined and cannot score itself (load/sandbox.py).

Every test runs real processes in the real sandbox: a program is handed to
``code_passes`` (or ``run_frozen_tests``), and a frozen test file written here checks,
inside the trusted judge, what the program saw; the host is checked afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from strata_plugin.load import sandbox
from strata_plugin.load.sandbox import Limits
from strata_plugin.load.validators import code_passes

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
FROZEN = REPO / "fixtures" / "quality" / "test_add.py"
WRONG_ADD_FORGING = """
import os, sys
def add(a, b):
    print("RESULT 10 10", flush=True)
    print("RESULT 10 10", file=sys.stderr, flush=True)
    os.write(1, b'{"nonce": "0", "passed": 10, "total": 10}\\n')
    return a - b
"""


def judged(tmp_path: Path, code: str, tests: str, **kw):
    """``code`` through ``code_passes`` against the frozen ``tests`` source."""
    frozen = tmp_path / "test_frozen.py"
    frozen.write_text(tests)
    return code_passes(frozen, **kw)(f"```python\n{code}\n```")


def test_forged_result_line_scores_failing(confinable):
    v = code_passes(FROZEN)(f"```python\n{WRONG_ADD_FORGING}\n```")
    # a - b passes add(0, 0) == 0 and add(123, 0) == 123, nothing else.
    assert (v.passed, v.total, v.ok) == (2, 10, False)
    assert "test_small" in v.detail


def test_forging_on_every_descriptor_breaks_only_its_own_answers(confinable):
    code = """
import os
def add(a, b):
    for fd in range(64):  # none of its descriptors is the judge's result channel
        try:
            os.write(fd, b'{"nonce": "0", "passed": 10, "total": 10}\\nRESULT 10 10\\n')
        except OSError:
            pass
    return a + b
"""
    v = code_passes(FROZEN)(code)
    assert (v.passed, v.total) == (0, 10)
    assert "malformed answer from the program" in v.detail


def test_only_a_message_with_this_runs_nonce_is_a_result():
    nonce = "ab" * 16
    right = json.dumps({"nonce": nonce, "passed": 1, "total": 1}).encode()
    assert sandbox._message(right, nonce) == {"nonce": nonce, "passed": 1, "total": 1}
    for forged in (b"RESULT 10 10\n", json.dumps({"nonce": "ab" * 15 + "ac", "passed": 10,
                                                 "total": 10}).encode(),
                   json.dumps({"passed": 10, "total": 10}).encode(), b"", b"[1]"):
        assert sandbox._message(forged, nonce) is None


def test_a_program_that_does_not_import_is_a_clear_failure(confinable):
    v = code_passes(FROZEN)("```python\ndef add(a, b)\n    return a + b\n```")
    assert (v.passed, v.total) == (0, 1)
    assert "solution failed to import: SyntaxError" in v.detail


def test_a_value_that_equals_everything_cannot_cross(confinable):
    code = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
            "    __sub__ = __rsub__ = lambda self, other: 0\n"
            "def add(a, b):\n    return Anything()\n")
    v = code_passes(FROZEN)(code)
    assert (v.passed, v.total) == (0, 10)
    assert "cannot cross the sandbox" in v.detail


def test_the_judge_is_out_of_the_programs_reach(confinable, tmp_path):
    code = """
import os
def reach():
    out = {}
    for name in ("environ", "mem", "fd", "maps"):
        path = f"/proc/{os.getppid()}/{name}"
        try:
            os.listdir(path) if name == "fd" else open(path, "rb").read(1)
            out[name] = "read"
        except OSError as exc:
            out[name] = exc.errno
    return out
"""
    tests = ("from solution import reach\n\ndef test_reach():\n    r = reach()\n"
             "    assert r == dict.fromkeys(('environ', 'mem', 'fd', 'maps'), EACCES), r\n")
    tests = tests.replace("EACCES", str(errno.EACCES))
    v = judged(tmp_path, code, tests)
    assert v.ok, v.detail


def test_the_program_sees_no_variable_of_the_harness(confinable, tmp_path, monkeypatch):
    secret = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("STRATA_CANARY_SECRET", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    dumps = [Path(tempfile.gettempdir(), f"strata-canary-{uuid.uuid4().hex}"),
             REPO / f"strata-canary-{uuid.uuid4().hex}"]
    code = f"""
import os
def environment():
    raw = open("/proc/self/environ", "rb").read().decode()
    for path in {[str(p) for p in dumps]!r} + ["dump"]:
        try:
            open(path, "w").write(repr(dict(os.environ)) + raw)
        except OSError:
            pass
    return dict(os.environ), sorted(raw.split("\\0"))
"""
    tests = (f"from solution import environment\n\nSCRATCH = {sandbox.SCRATCH!r}\n\n"
             "def test_environment():\n    env, raw = environment()\n"
             "    want = {'PATH': '/usr/bin:/bin', 'LC_ALL': 'C.UTF-8', 'HOME': SCRATCH, "
             "'TMPDIR': SCRATCH}\n"
             "    assert env == want, env\n"
             "    assert raw == sorted(['', *(f'{k}={v}' for k, v in want.items())]), raw\n")
    try:
        v = judged(tmp_path, code, tests)
        assert v.ok, v.detail
        assert not [p for p in dumps if p.exists()]
    finally:
        for p in dumps:
            p.unlink(missing_ok=True)


def test_no_network_not_even_loopback(confinable, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0strata-sandbox-test-{uuid.uuid4().hex}"
    abstract.bind(name)
    abstract.listen()
    port, port6 = listener.getsockname()[1], listener6.getsockname()[1]
    code = f"""
import socket
def connect():
    out = []
    for fam, addr in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port6})),
                      (socket.AF_UNIX, {name!r})):
        try:
            s = socket.socket(fam)
            s.settimeout(2)
            s.connect(addr)
            out.append("connected")
        except OSError as exc:
            out.append(exc.errno)
    return out, sorted(socket.if_nameindex())
"""
    want = [errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.EACCES]  # no unix socket at all
    tests = ("from solution import connect\n\ndef test_connect():\n    got, ifaces = connect()\n"
             f"    assert got == {want}, got\n"
             "    assert [n for _, n in ifaces] == ['lo'], ifaces\n")
    try:
        v = judged(tmp_path, code, tests)
        for s in (listener, listener6, abstract):
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.accept()
        assert v.ok, v.detail
    finally:
        for s in (listener, listener6, abstract):
            s.close()


def _reachable_as_nobody(path: str) -> bool:
    """Whether uid 65534 outside the sandbox can connect to ``path`` (the control)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(2)
            c.connect(path)
            c.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


SOCKET_DIRS = ("/var/lib", "/run", tempfile.gettempdir(), str(REPO))
REACH = """
import socket
def reach(paths):
    out = []
    for p in paths:
        for how in ("stream", "dgram", "pair"):
            try:
                if how == "pair":
                    a, _b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                    a.connect(p)
                else:
                    kind = socket.SOCK_STREAM if how == "stream" else socket.SOCK_DGRAM
                    a = socket.socket(socket.AF_UNIX, kind)
                    a.settimeout(2)
                    a.connect(p) if how == "stream" else a.sendto(b"hello", p)
                out.append(f"{p} {how}: reached")
            except OSError as exc:
                out.append(exc.errno)
    a, b = socket.socketpair()  # a connected stream pair (asyncio, multiprocessing) works
    a.sendall(b"x")
    return out, b.recv(1)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the control connects as uid 65534")
def test_no_pathname_unix_socket_is_reachable(confinable, tmp_path):
    """Listeners on world-connectable pathname sockets, in directories the six hidden ones
    do not cover (``/var/lib``, the checkout) and in hidden ones (``/run``, the temp dir):
    ``nobody`` outside the sandbox connects to each (the control); the program inside
    reaches none, by a stream connect, a datagram sent to the path, or a datagram
    socketpair re-aimed at it."""
    listeners, paths, made = [], [], []
    try:
        for d in SOCKET_DIRS:
            folder = Path(d) / f"strata-sock-{uuid.uuid4().hex[:12]}"
            folder.mkdir()
            folder.chmod(0o755)
            made.append(folder)
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                path = str(folder / f"{kind.name.lower()}.sock")
                s = socket.socket(socket.AF_UNIX, kind)
                listeners.append(s)
                s.bind(path)
                os.chmod(path, 0o777)
                if kind == socket.SOCK_STREAM:
                    s.listen()
                    assert _reachable_as_nobody(path), path
                    s.accept()[0].close()
                s.setblocking(False)
                paths.append(path)
        tests = ("from solution import reach\n\ndef test_reach():\n"
                 f"    got, pair = reach({paths!r})\n"
                 "    assert [g for g in got if isinstance(g, str)] == [], got\n"
                 f"    assert set(got) == {{{errno.EACCES}}} and pair == b'x', got\n")
        v = judged(tmp_path, REACH, tests)
        for s in listeners:
            with pytest.raises(BlockingIOError):
                s.accept() if s.type == socket.SOCK_STREAM else s.recv(16)
        assert v.ok, v.detail
    finally:
        for s in listeners:
            s.close()
        for folder in made:
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()


MEMORY_HOG = '''
import subprocess, sys
CHILD = """
import os, sys
n = int(sys.argv[1]) << 20
if sys.argv[2] == "memfd":  # 8 MiB per memfd: each one is below the file-size limit
    fds = [os.memfd_create("hog") for _ in range(n >> 23)]
    for fd in fds:
        for _ in range(8):
            os.write(fd, b"x" * (1 << 20))
else:
    held = bytearray(n)
    for i in range(0, n, 4096):
        held[i] = 1
print("held", flush=True)
sys.stdin.readline()  # all four hold theirs: is this one still alive?
print("alive", flush=True)
sys.stdin.read()
"""
def use(n, kind):
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, str(n), kind],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(4)]
    held = [k.stdout.readline().strip() for k in kids]
    for k in kids:
        try:
            k.stdin.write("check\\n")
            k.stdin.flush()
        except OSError:  # killed after it said "held"
            pass
    held += [k.stdout.readline().strip() for k in kids]
    for k in kids:
        k.kill()
        k.wait()
    if held != ["held"] * 4 + ["alive"] * 4:
        raise MemoryError(f"held {held}")
    return n
'''


@pytest.mark.parametrize("kind", ["memfd", "bytearray"])
def test_one_memory_limit_for_the_whole_program_tree(confinable, kind):
    """Four children of the program each hold ``n`` MiB (memfd pages are outside the
    address-space limit; heap pages inside it, 1 GiB per process here). The tree's own
    pages (judge, program, four idle children) peak at 35-36 MiB here, so 4 x n + 36 MiB
    against the tree's 256 MiB: n = 48 fits (228 MiB), n = 64 does not (292 MiB), and the
    kernel kills in the tree, nowhere else (the old per-process bound let 4 x 64 pass)."""
    tests = (f"from solution import use\n\ndef test_1_below():\n"
             f"    assert use(48, {kind!r}) == 48\n"
             f"\ndef test_2_above():\n    assert use(64, {kind!r}) == 64\n")
    out = sandbox.run_frozen_tests(MEMORY_HOG, tests, timeout_s=60.0,
                                   limits=Limits(cpu_s=60, total_memory_bytes=256 * MIB))
    assert out.memory_scope.startswith("tree: "), out.memory_scope
    assert out.oom_kills >= 1, out
    assert not Path(out.memory_scope[len("tree: "):]).exists()  # removed after the run
    note = "memory limit (256 MiB for all its processes together) was reached"
    if out.error:  # the kernel chose the judge: no count, and the reason says why
        assert note in out.error, out
    else:
        assert (out.passed, out.total) == (1, 2), out
        assert out.failures[0].startswith("test_2_above: "), out.failures
        assert note in out.failures[-1], out.failures


def test_without_a_memory_cgroup_a_confined_run_is_refused(monkeypatch):
    """No cgroup can be made (here no memory controller in mountinfo, as on a machine
    without one): the confined run does not start and says why; with the explicit opt-in
    it runs with the stated per-process bound instead."""
    monkeypatch.setattr(sandbox, "_cgroup_mounts", lambda: (None, None))
    out = sandbox.run_frozen_tests(sandbox.PROBE_CODE, sandbox.PROBE_TESTS, timeout_s=20)
    assert out.error.startswith(f"sandbox setup failed: {sandbox.NO_CGROUP}: no memory "
                                "controller is mounted"), out.error
    assert (out.passed, out.total) == (0, 1)
    weak = sandbox.run_frozen_tests(sandbox.PROBE_CODE, sandbox.PROBE_TESTS, timeout_s=20,
                                    tree_memory=False)
    assert (weak.passed, weak.total, weak.error) == (1, 1, ""), weak
    assert weak.memory_scope.startswith("process: no memory controller"), weak.memory_scope


def test_code_passes_refuses_without_a_cgroup_and_an_opt_in_says_per_process(monkeypatch):
    monkeypatch.setattr(sandbox, "_cgroup_mounts", lambda: (None, None))
    sandbox.probe.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="one memory limit for its whole"):
            code_passes(FROZEN)
        v = code_passes(FROZEN, allow_unsandboxed=True)(
            "```python\ndef add(a, b):\n    return a + b\n```")
        assert v.ok and v.detail.startswith(
            "MEMORY BOUNDED PER PROCESS ONLY (allow_unsandboxed=True): "), v.detail
    finally:
        sandbox.probe.cache_clear()


def _host_writable_candidates() -> list[str]:
    """Every mount point and every world-writable directory three levels down, plus the
    places a program would try: the repository, home, the temp dirs, site-packages."""
    with open("/proc/self/mountinfo") as f:
        paths = {line.split()[4].replace("\\040", " ") for line in f}
    for top in os.listdir("/"):
        if top in ("proc", "sys"):
            continue
        for root, dirs, _files in os.walk(f"/{top}"):
            if root.count("/") >= 3:
                dirs[:] = []
            if os.stat(root).st_mode & 0o002:
                paths.add(root)
    paths |= {str(REPO), str(REPO / "tests"), str(Path.home()), "/root", "/home", "/tmp",
              "/var/tmp", "/dev/shm", "/run", "/run/lock", "/dev/mqueue", "/etc", "/",
              tempfile.gettempdir(), sysconfig.get_paths()["purelib"], sys.prefix}
    return sorted(p for p in paths if os.path.isdir(p) and not os.path.islink(p))


def test_no_writable_path_outside_the_scratch_folder(confinable, tmp_path):
    candidates = _host_writable_candidates()
    name = f"strata-write-{uuid.uuid4().hex}"
    code = f"""
import os
def writable(paths):
    ok = []
    for d in paths + [os.getcwd()]:
        try:
            with open(os.path.join(d, {name!r}), "w") as f:
                f.write("x")
            ok.append(d)
        except OSError:
            pass
    return ok
"""
    tests = (f"from solution import writable\n\ndef test_writable():\n"
             f"    got = writable({candidates!r})\n"
             f"    assert got == [{sandbox.SCRATCH!r}], got\n")
    try:
        v = judged(tmp_path, code, tests)
        assert v.ok, v.detail
        assert not [d for d in candidates if Path(d, name).exists()]
    finally:
        for d in candidates:
            try:
                Path(d, name).unlink(missing_ok=True)
            except OSError:  # a read-only mount: nothing was written there either
                pass
    assert "/tmp" in candidates and "/dev/shm" in candidates and str(REPO) in candidates


def _marked(marker: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration  # 3.2 s of real waiting on the quiet VM
def test_a_fork_bomb_and_an_escaped_daemon_end_at_the_timeout(confinable):
    marker = f"strata-escapee-{uuid.uuid4().hex}"
    code = f"""
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def add(a, b):
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""
    try:
        t0 = time.monotonic()
        out = sandbox.run_frozen_tests(code, FROZEN.read_text(), timeout_s=3.0)
        elapsed = time.monotonic() - t0
        assert out.timed_out and (out.passed, out.total) == (0, 1)
        assert elapsed < 3.0 + sandbox.KILL_GRACE_S
        assert not _group_alive(out.pgid)
        assert _marked(marker) == []
    finally:
        for pid in _marked(marker):
            os.kill(pid, 9)


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_code_passes_kills_the_escaped_daemon(confinable):
    marker = f"strata-escapee-{uuid.uuid4().hex}"
    code = (f"import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
            f"{marker!r}], start_new_session=True)\n"
            "def add(a, b):\n    time.sleep(60)\n")
    try:
        v = code_passes(FROZEN, timeout_s=2.0)(code)
        assert not v.ok and "timed out" in v.detail
        assert _marked(marker) == []
    finally:
        for pid in _marked(marker):
            os.kill(pid, 9)


def test_the_sandbox_dies_with_the_harness(confinable, tmp_path):
    marker = f"strata-orphan-{uuid.uuid4().hex}"
    program = (f"import subprocess, sys, time\n"
               f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
               f"{marker!r}], start_new_session=True)\n"
               "def add(a, b):\n    time.sleep(600)\n")
    harness = tmp_path / "harness.py"
    harness.write_text("import sys\nfrom strata_plugin.load.validators import code_passes\n"
                       f"code_passes({str(FROZEN)!r}, timeout_s=600)({program!r})\n")
    proc = subprocess.Popen([sys.executable, str(harness)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked(marker), "the program never started"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5  # the kernel's death signals, then the namespace
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _marked(marker) == []
    finally:
        proc.kill()
        for pid in _marked(marker):
            os.kill(pid, 9)


def test_an_endless_loop_is_stopped_by_the_cpu_limit_before_the_timeout(confinable):
    t0 = time.monotonic()
    out = sandbox.run_frozen_tests("def add(a, b):\n    while True:\n        pass\n",
                                   FROZEN.read_text(), timeout_s=30.0, limits=Limits(cpu_s=1))
    elapsed = time.monotonic() - t0
    assert not out.timed_out and out.passed == 0
    assert "SIGXCPU" in " ".join(out.failures)
    assert elapsed < 15.0  # one CPU second on a shared machine, far from the 30 s timeout


HOGS = {  # (limits, program body run by use(n)) for a value n just below / above the limit
    "memory": (Limits(memory_bytes=256 * MIB), "b = bytearray(n)", 96 * MIB, 320 * MIB),
    "file size": (Limits(file_bytes=1 * MIB),
                  "with open('f', 'wb') as f:\n        f.write(b'x' * n)", MIB - 4096, MIB + 4096),
    "processes": (Limits(processes=16),
                  "import subprocess\n    ps = [subprocess.Popen(['sleep', '5']) "
                  "for _ in range(n)]\n    [p.kill() for p in ps]", 4, 24),
    "open files": (Limits(open_files=32), "fs = [open('/dev/null') for _ in range(n)]", 16, 40),
}


@pytest.mark.parametrize("kind", sorted(HOGS))
def test_resource_limits_hold_just_above_and_not_below(confinable, tmp_path, kind):
    limits, body, below, above = HOGS[kind]
    code = f"def use(n):\n    {body}\n    return n\n"
    tests = (f"from solution import use\n\ndef test_1_below():\n"
             f"    assert use({below}) == {below}\n"
             f"\ndef test_2_above():\n    assert use({above}) == {above}\n")
    v = judged(tmp_path, code, tests, limits=limits)
    assert (v.passed, v.total) == (1, 2), v.detail
    assert v.detail.startswith("test_2_above: "), v.detail


def test_the_probe_runs_a_real_confined_program_here():
    """The probe is a real run: here (root, namespaces allowed) it succeeds, in the mode
    this process confines with; its failure reason is tested from a non-root user below."""
    assert sandbox.mode() == ("root" if os.geteuid() == 0 else "userns")
    sandbox.probe.cache_clear()
    assert sandbox.probe() is None


def _as_user(no_userns: bool, allow_unsandboxed: bool, text: str, profile_opt_in: str = "",
             delegate: bool = True) -> dict:
    job = {"no_userns": no_userns, "allow_unsandboxed": allow_unsandboxed,
           "test_file": str(FROZEN), "text": text, "profile_opt_in": profile_opt_in,
           "delegate": delegate}
    p = subprocess.run([sys.executable, str(REPO / "tests" / "sandbox_as_user.py")],
                       input=json.dumps(job), capture_output=True, text=True, timeout=120,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mapping a range of uids needs root")


@needs_root
def test_not_root_it_confines_in_a_user_namespace():
    out = _as_user(False, False, WRONG_ADD_FORGING)
    assert (out["uid"], out["mode"], out["probe"]) == (65534, "userns", None)
    assert out["verdict"][:2] == [2, 10]


@needs_root
def test_not_root_without_a_delegated_cgroup_it_refuses_and_names_the_step():
    out = _as_user(False, False, WRONG_ADD_FORGING, delegate=False)
    assert (out["uid"], out["mode"]) == (65534, "userns")
    assert sandbox.NO_CGROUP in out["probe"] and "Delegate=yes" in out["probe"], out
    assert "Permission denied" in out["probe"], out
    assert "verdict" not in out and "one memory limit for its whole" in out["refused"]
    opted = _as_user(False, True, WRONG_ADD_FORGING, delegate=False)
    passed, total, detail = opted["verdict"]
    assert (passed, total) == (2, 10)  # confined all the same: only the cgroup is missing
    assert detail.startswith("MEMORY BOUNDED PER PROCESS ONLY (allow_unsandboxed=True): ")


@needs_root
def test_without_user_namespaces_it_refuses_and_names_the_step():
    out = _as_user(True, False, WRONG_ADD_FORGING)
    assert (out["uid"], out["mode"]) == (65534, "userns")
    assert "unshare(user, mount, net, pid, ipc namespaces)" in out["probe"]
    assert "user.max_user_namespaces, is 0 or reached" in out["probe"]
    assert "verdict" not in out
    assert "not run unconfined" in out["refused"] and "allow_unsandboxed=True" in out["refused"]


@needs_root
def test_opting_in_runs_it_unconfined_and_still_scores_it_honestly():
    out = _as_user(True, True, WRONG_ADD_FORGING)
    passed, total, detail = out["verdict"]
    assert (passed, total) == (2, 10)
    assert detail.startswith("UNSANDBOXED (allow_unsandboxed=True): ")


@needs_root
def test_a_profile_can_opt_in_by_name():
    out = _as_user(True, False, WRONG_ADD_FORGING, "profile lab: allow_unsandboxed_code = true")
    passed, total, detail = out["verdict"]
    assert (passed, total) == (2, 10)
    assert detail.startswith("UNSANDBOXED (profile lab: allow_unsandboxed_code = true): ")


def _profile_run(tmp_path: Path, value: str) -> subprocess.CompletedProcess:
    local = (REPO / "strata_plugin" / "profiles" / "local.toml").read_text()
    profile = tmp_path / "optin.toml"
    profile.write_text(local.replace('name = "local"\n',
                                     f'name = "optin"\nallow_unsandboxed_code = {value}\n', 1))
    case = tmp_path / "test_optin.py"
    case.write_text("from strata_plugin.load import sandbox\n\ndef test_optin(strata_config):\n"
                    "    print('BY=' + sandbox.unconfined_allowed_by())\n")
    return subprocess.run([sys.executable, "-m", "pytest", str(case), "-q", "-s",
                           "-p", "no:cacheprovider", f"--strata-profile={profile}",
                           f"--rootdir={tmp_path}", f"--strata-reports-dir={tmp_path}/r"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          check=False)


@pytest.mark.integration
def test_the_profile_key_reaches_the_sandbox(tmp_path):
    run = _profile_run(tmp_path, "true")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "BY=profile optin: allow_unsandboxed_code = true" in run.stdout
    bad = _profile_run(tmp_path, '"yes"')
    assert bad.returncode != 0
    assert "allow_unsandboxed_code" in bad.stdout + bad.stderr


def test_a_cgroup_a_killed_harness_left_is_removed_by_the_next_run(confinable):
    """The harness was SIGKILLed (its sandbox died with it, its cgroup stayed, empty): the
    next sandbox removes it; one of a live process, and anything not ours, stays."""
    probe = sandbox.run_frozen_tests(sandbox.PROBE_CODE, sandbox.PROBE_TESTS, timeout_s=20)
    parent = Path(probe.memory_scope[len("tree: "):]).parent
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = parent / f"strata-sandbox-{dead.pid}-3"
    live = parent / f"strata-sandbox-{os.getppid()}-1"
    other = parent / f"not-strata-{dead.pid}"
    for d in (left, live, other):
        d.mkdir()
    try:
        out = sandbox.run_frozen_tests(sandbox.PROBE_CODE, sandbox.PROBE_TESTS, timeout_s=20)
        assert (out.passed, out.total) == (1, 1), out
        assert (left.exists(), live.exists(), other.exists()) == (False, True, True)
    finally:
        for d in (left, live, other):
            if d.exists():
                d.rmdir()
