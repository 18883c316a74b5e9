"""Inside the sandbox: confine the process tree, then judge frozen tests over untrusted code.

Never imported by the harness: ``load/sandbox.py`` runs this file's source with
``python -I -B -c SOURCE ROLE`` in three roles, one process each. It is standard library
only and passed as ``-c`` text because the sandbox user may not be able to read the
repository; ``boot`` and ``judge`` also take ``-S`` (no site-packages: faster, and nothing
but the standard library in the trusted processes), the candidate does not, so the program
can import what this Python has installed, as before:

``boot`` (started by the harness, as root or as the invoking user)
    Reads its configuration (JSON) from stdin, dies with the harness (a parent-death
    signal), joins the memory cgroup the harness made for the run (every process below
    shares its one limit), enters new mount, network, PID and IPC
    namespaces (plus a user namespace when not root), forks the namespace's first process
    and waits for it. On SIGTERM it kills that process, which makes the kernel kill every
    process of the namespace, and exits once the namespace is empty.
``boot``'s child, PID 1 of the new PID namespace
    Makes the mount tree private, remounts every mount read-only, lays an empty read-only
    tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run`` (hiding their files and
    unix sockets), mounts a size-capped tmpfs owned by the sandbox user as the scratch
    folder (the only writable path), mounts a fresh read-only ``/proc``, writes the
    program there, sets the resource limits, drops to the sandbox user (root: setgid and
    setuid to 65534 ``nobody``, no supplementary groups; otherwise the invoking user, with
    every capability gone at the next exec), sets no-new-privileges, installs the seccomp
    filter that leaves it no unix socket (``unix_socket_filter``) and execs the judge.
``judge`` (still PID 1; trusted code, unprivileged)
    Makes itself non-dumpable (no ptrace, no ``/proc/PID/mem`` or ``fd`` for the
    program, though it runs as the same user), reads the nonce from a memfd and closes it,
    starts the ``candidate`` and runs the frozen tests with the candidate's module replaced
    by a proxy: every attribute read and every call is a request over a pipe, and every
    answer is decoded into plain builtin data (None, bool, int, float, complex, str,
    bytes, list, tuple, dict, set, frozenset) or a builtin exception. It writes
    ``{"nonce", "passed", "total", "failures"}`` to its stdout, a pipe only it holds.
``candidate`` (untrusted from the moment it imports the program)
    Imports the program from the scratch folder and answers the judge's requests. Its
    stdout and stderr are the log, never read for a result.

Setup failures are reported on the result channel as ``{"nonce", "setup_error"}`` before
any program code exists, so they are trusted.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import traceback
import types

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
HIDDEN = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # world-writable or socket-holding dirs
HOMES = ("/root", "/home")  # hidden too, but for the Python installation in them
MAX_LINE = 16 << 20  # one request or answer
MAX_DEPTH = 64  # nesting of one decoded value
SETUP_EXIT = 3
UNSHARE_HINTS = {
    errno.EPERM: " (unprivileged user namespaces are disabled here: kernel.unprivileged_userns_"
                 "clone = 0, or an AppArmor or seccomp policy; or a container without "
                 "CAP_SYS_ADMIN)",
    errno.ENOSPC: " (the user-namespace limit, user.max_user_namespaces, is 0 or reached)",
    errno.EINVAL: " (this kernel lacks one of these namespaces)",
}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A confinement step failed: the program must not run."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


def _call(what: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}", err)


def _mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(s):
        return (None if s is None else os.fsencode(s))
    _call(f"mount {fstype or ''} {target}".replace("  ", " "),
          _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def _prctl(option: int, arg: int) -> None:
    _call(f"prctl({option})", _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0))


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [_unescape(line.split()[4]) for line in f]


def _kept_flags(path: str) -> int:
    """The per-mount flags a read-only remount must keep (a user namespace locks them)."""
    f = os.statvfs(path).f_flag
    flags = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    if f & os.ST_RELATIME:
        flags |= MS_RELATIME
    return flags


def _confine_mounts(cfg: dict) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    for point in _mount_points():
        try:
            flags = _kept_flags(point)
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except (SetupError, OSError) as exc:
            # A mount point this process cannot reach is one the program cannot reach.
            if exc.errno in (errno.EACCES, errno.ENOENT):
                continue
            raise SetupError(f"read-only remount of {point}: {exc}") from None
    hidden = [p for p in HIDDEN + HOMES if os.path.isdir(p) and not os.path.islink(p)]
    homes = [p for p in hidden if p in HOMES]
    # the Python installation and the package, where they live under a hidden directory
    # (a home, or a checkout in /tmp such as mktemp -d), bound back read-only
    exposed = sorted({p for p in cfg["expose"]
                      if any(p.startswith(h + "/") for h in hidden) and os.path.isdir(p)})
    handles = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in exposed}
    for p in hidden:
        _mount("strata-empty", p, "tmpfs",
               MS_NOSUID | MS_NODEV | (0 if p in homes else MS_NOEXEC), "size=1m,mode=0755")
    for p in exposed:  # the Python installation, read-only, at the same path
        os.makedirs(p, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{handles[p]}", p, None, MS_BIND | MS_REC)
        _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(p))
        os.close(handles[p])
    scratch = cfg["scratch"]
    os.makedirs(scratch, exist_ok=True)
    uid, gid = cfg["uid"], cfg["gid"]
    _mount("strata-scratch", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['limits']['scratch_bytes']},nr_inodes=4096,mode=0700,uid={uid},gid={gid}")
    for p in hidden:
        _mount(None, p, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _set_limits(limits: dict) -> None:
    for res, value in ((resource.RLIMIT_CPU, limits["cpu_s"]),
                       (resource.RLIMIT_AS, limits["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                       (resource.RLIMIT_NPROC, limits["processes"]),
                       (resource.RLIMIT_NOFILE, limits["open_files"]),
                       (resource.RLIMIT_CORE, 0)):
        hard = value + 1 if res == resource.RLIMIT_CPU else value  # SIGXCPU first, then KILL
        resource.setrlimit(res, (value, hard))


def _drop_privileges(cfg: dict) -> None:
    if cfg["mode"] == "root":
        uid, gid = cfg["uid"], cfg["gid"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getgroups():
            raise SetupError("the sandbox user was not taken")
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise SetupError("root could be regained after dropping it")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


# --- no unix socket of the host: a seccomp filter -------------------------------------
#
# A pathname unix socket anywhere the sandbox user can resolve (a daemon's socket in
# /var/lib, in the checkout, created after the sandbox started) is reachable through a
# read-only mount, and abstract ones are per network namespace already. So the sandbox
# gets no unix socket that could connect anywhere: socket(AF_UNIX, ...) fails with
# EACCES, socketpair(AF_UNIX) only makes connected stream or seqpacket pairs (a datagram
# one could be re-connected to a path), io_uring (which can make sockets without the
# socket syscall) is refused, and a system call of another ABI (x32, i386 int 0x80,
# arm32) kills the process, so no other syscall table goes round the filter.

AF_UNIX, SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 1, 5, 0xF
SECCOMP_ARCH = {  # machine: (AUDIT_ARCH_*, socket, socketpair)
    "x86_64": (0xC000003E, 41, 53),
    "aarch64": (0xC00000B7, 198, 199),
}
IO_URING_SYSCALLS = (425, 426, 427)  # io_uring_setup, _enter, _register: same on both
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, AND_K, RET_K = 0x20, 0x15, 0x35, 0x54, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def unix_socket_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) for ``machine`` (``os.uname().machine``)."""
    if machine not in SECCOMP_ARCH:
        raise SetupError(f"no seccomp table for {machine} (unix sockets could not be denied)")
    arch, sys_socket, sys_socketpair = SECCOMP_ARCH[machine]
    deny = RET_ERRNO | errno.EACCES
    allow, socket_, pair = 19, 11, 13  # the program's labels, by index
    deny_at = 20

    def to(here: int, there: int) -> int:  # a jump's offset: relative to the next one
        return there - here - 1

    return [
        (LD_W_ABS, 0, 0, 4),                                    # 0: arch
        (JEQ_K, 1, 0, arch),                                    # 1: native? -> 3
        (RET_K, 0, 0, RET_KILL_PROCESS),                        # 2: another ABI: killed
        (LD_W_ABS, 0, 0, 0),                                    # 3: nr
        (JGE_K, to(4, deny_at), 0, 0x40000000),                 # 4: x32
        (JEQ_K, to(5, socket_), 0, sys_socket),                 # 5
        (JEQ_K, to(6, pair), 0, sys_socketpair),                # 6
        (JEQ_K, to(7, deny_at), 0, IO_URING_SYSCALLS[0]),       # 7
        (JEQ_K, to(8, deny_at), 0, IO_URING_SYSCALLS[1]),       # 8
        (JEQ_K, to(9, deny_at), 0, IO_URING_SYSCALLS[2]),       # 9
        (RET_K, 0, 0, RET_ALLOW),                               # 10
        (LD_W_ABS, 0, 0, 16),                                   # 11: socket(domain, ...)
        (JEQ_K, to(12, deny_at), to(12, allow), AF_UNIX),       # 12
        (LD_W_ABS, 0, 0, 16),                                   # 13: socketpair(domain,
        (JEQ_K, 0, to(14, allow), AF_UNIX),                     # 14
        (LD_W_ABS, 0, 0, 24),                                   # 15:   type, ...)
        (AND_K, 0, 0, SOCK_TYPE_MASK),                          # 16: less the flags
        (JEQ_K, to(17, allow), 0, SOCK_STREAM),                 # 17
        (JEQ_K, to(18, allow), to(18, deny_at), SOCK_SEQPACKET),  # 18
        (RET_K, 0, 0, RET_ALLOW),                               # 19: allow
        (RET_K, 0, 0, deny),                                    # 20: deny
    ]


def _deny_unix_sockets() -> None:
    prog = unix_socket_filter(os.uname().machine)
    arr = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), arr)
    _call("seccomp filter (no unix sockets)",
          _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER),
                      ctypes.byref(fprog), 0, 0))


def _report(nonce: str, **fields) -> None:
    os.write(1, (json.dumps({"nonce": nonce, **fields}) + "\n").encode())


def _write_userns_maps() -> None:
    uid, gid = os.getuid(), os.getgid()
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def boot() -> int:
    cfg = json.loads(sys.stdin.buffer.read())
    nonce = cfg["nonce"]
    confine = cfg["mode"] != "none"
    # The harness thread that started boot waits for it; if the harness dies, so does the
    # sandbox (boot's death kills PID 1 by its own death signal, and PID 1 the rest).
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:
        return SETUP_EXIT
    try:
        if cfg.get("cgroup_procs"):  # one memory limit for every process started below
            with open(cfg["cgroup_procs"], "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        _report(nonce, setup_error=f"joining the sandbox's memory cgroup "
                                   f"({cfg['cgroup_procs']}): {exc}")
        return SETUP_EXIT
    try:
        if confine:
            flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
            if cfg["mode"] == "userns":
                flags |= CLONE_NEWUSER
            _call("unshare(" + ("user, " if flags & CLONE_NEWUSER else "")
                  + "mount, net, pid, ipc namespaces)", _libc.unshare(flags))
            if cfg["mode"] == "userns":
                _write_userns_maps()
    except (SetupError, OSError) as exc:
        _report(nonce, setup_error=str(exc) + UNSHARE_HINTS.get(exc.errno, ""))
        return SETUP_EXIT
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(_first(cfg))
        except BaseException as exc:
            try:
                _report(nonce, setup_error=f"{type(exc).__name__}: {exc}")
            finally:
                os._exit(SETUP_EXIT)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


def _first(cfg: dict) -> int:
    """PID 1 of the sandbox (or the only child, unconfined): confine, then exec the judge."""
    nonce = cfg["nonce"]
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if cfg["mode"] != "none":
            _confine_mounts(cfg)
        scratch = cfg["scratch"]
        path = os.path.join(scratch, cfg["module"] + ".py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(cfg["code"])
        if cfg["mode"] == "root":
            os.chown(path, cfg["uid"], cfg["gid"])
        os.chdir(scratch)
        # The judge's configuration, nonce included, in a memfd it reads and closes first.
        fd = os.memfd_create("strata-judge", 0)
        os.write(fd, json.dumps({k: cfg[k] for k in ("nonce", "module", "tests", "tests_name",
                                                   "scratch", "python", "source")}).encode())
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
        _set_limits(cfg["limits"])
        _drop_privileges(cfg)
        if cfg["mode"] != "none":
            _deny_unix_sockets()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a credential change clears it
    except (SetupError, OSError, ValueError) as exc:
        _report(nonce, setup_error=str(exc))
        return SETUP_EXIT
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": cfg["scratch"],
           "TMPDIR": cfg["scratch"]}
    try:
        os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-B", "-c", cfg["source"], "judge",
                                  str(fd)], env)
    except OSError as exc:
        _report(nonce, setup_error=f"the sandbox user cannot run {cfg['python']}: {exc}")
    return SETUP_EXIT


# --- plain data across the boundary -------------------------------------------------------

def encode(v, depth: int = 0):
    """Plain builtin data as JSON; anything else is refused (no object crosses)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str:
        return ["v", v]
    if t is int:
        return ["i", str(v)]
    if t is float:
        return ["f", repr(v)]
    if t is complex:
        return ["c", repr(v.real), repr(v.imag)]
    if t is bytes:
        return ["y", v.hex()]
    if t in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "s", frozenset: "F"}[t],
                [encode(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]]
    raise TypeError(f"a {t.__name__} cannot cross the sandbox (plain data only)")


def decode(e, depth: int = 0):
    """The inverse of ``encode``, strict: malformed input raises ValueError."""
    if depth > MAX_DEPTH or not isinstance(e, list) or not e or not isinstance(e[0], str):
        raise ValueError("malformed value")
    tag = e[0]
    if tag == "v" and len(e) == 2 and (e[1] is None or type(e[1]) in (bool, str)):
        return e[1]
    if tag in ("i", "f", "y") and len(e) == 2 and type(e[1]) is str and len(e[1]) <= 10_000:
        return {"i": int, "f": float, "y": bytes.fromhex}[tag](e[1])
    if tag == "c" and len(e) == 3 and all(type(x) is str and len(x) < 64 for x in e[1:]):
        return complex(float(e[1]), float(e[2]))
    if tag in ("l", "t", "s", "F") and len(e) == 2 and type(e[1]) is list:
        items = [decode(x, depth + 1) for x in e[1]]
        return {"l": list, "t": tuple, "s": set, "F": frozenset}[tag](items)
    if tag == "d" and len(e) == 2 and type(e[1]) is list:
        pairs = []
        for p in e[1]:
            if type(p) is not list or len(p) != 2:
                raise ValueError("malformed dict item")
            pairs.append((decode(p[0], depth + 1), decode(p[1], depth + 1)))
        return dict(pairs)
    raise ValueError("malformed value")


def _send(f, obj) -> None:
    f.write(json.dumps(obj).encode() + b"\n")
    f.flush()


def _recv(f):
    line = f.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        raise ValueError(f"answer longer than {MAX_LINE} bytes")
    return json.loads(line)


# --- the judge ----------------------------------------------------------------------------

class RemoteError(Exception):
    """The program raised an exception that is not a builtin one, or broke the protocol."""


class _Remote:
    """The judge's end of the pipe pair to the candidate process."""

    def __init__(self, proc: subprocess.Popen, rx, tx) -> None:
        self.proc, self.rx, self.tx, self.dead = proc, rx, tx, ""

    def ask(self, request: dict):
        if self.dead:
            raise RemoteError(self.dead)
        try:
            _send(self.tx, request)
            reply = _recv(self.rx)
        except (OSError, ValueError) as exc:
            reply, why = None, f"broken pipe to the program: {exc}"
        else:
            why = ""
        if not isinstance(reply, dict):
            if reply is not None:
                raise RemoteError("malformed answer from the program")
            status = self.proc.poll()
            if status is None:
                try:
                    status = self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    status = "still running"
            self.dead = why or _death(status)
            raise RemoteError(self.dead)
        kind = reply.get("kind")
        if kind == "value":
            try:
                return "value", decode(reply.get("value"))
            except (ValueError, TypeError, RecursionError, OverflowError) as exc:
                raise RemoteError(f"undecodable value from the program: {exc}") from None
        if kind == "raise":
            name, message = str(reply.get("type"))[:100], str(reply.get("message"))[:1000]
            cls = getattr(builtins, name, None)
            if (isinstance(cls, type) and issubclass(cls, Exception)
                    and not issubclass(cls, RemoteError)):
                raise cls(message)
            raise RemoteError(f"{name}: {message}")
        if kind in ("callable", "missing"):
            return kind, None
        raise RemoteError("malformed answer from the program")


def _death(status) -> str:
    if isinstance(status, int) and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = str(-status)
        why = {"SIGXCPU": " (CPU limit)", "SIGXFSZ": " (file size limit)",
               "SIGKILL": " (the hard CPU limit, or the sandbox's memory limit)"}.get(name, "")
        return f"the program was killed by {name}{why}"
    return f"the program exited (status {status})"


class _ProxyModule(types.ModuleType):
    """The candidate's module as the frozen tests see it: every name read goes over the pipe."""

    def __init__(self, name: str, remote: _Remote) -> None:
        super().__init__(name)
        object.__setattr__(self, "_remote", remote)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        kind, value = self._remote.ask({"op": "get", "name": name})
        if kind == "missing":
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        if kind == "callable":
            remote = self._remote

            def call(*args, **kwargs):
                return remote.ask({"op": "call", "name": name,
                                   "args": [encode(a) for a in args],
                                   "kwargs": [[k, encode(v)] for k, v in kwargs.items()]})[1]
            call.__name__ = call.__qualname__ = name
            return call
        return value


def judge(fd: int) -> int:
    _prctl(PR_SET_DUMPABLE, 0)
    with os.fdopen(fd, "rb") as f:
        cfg = json.loads(f.read())
    nonce = cfg.pop("nonce")
    rx_c, tx_j = os.pipe()  # judge -> candidate
    rx_j, tx_c = os.pipe()  # candidate -> judge
    proc = subprocess.Popen([cfg["python"], "-I", "-B", "-c", cfg["source"], "candidate",
                             cfg["scratch"], cfg["module"], str(rx_c), str(tx_c)],
                            stdin=subprocess.DEVNULL, stdout=2, stderr=2,
                            pass_fds=(rx_c, tx_c), close_fds=True, cwd=cfg["scratch"])
    os.close(rx_c)
    os.close(tx_c)
    remote = _Remote(proc, os.fdopen(rx_j, "rb"), os.fdopen(tx_j, "wb"))
    sys.modules[cfg["module"]] = _ProxyModule(cfg["module"], remote)
    tests_mod = types.ModuleType("frozen_tests")
    tests_mod.__file__ = cfg["tests_name"]
    try:
        exec(compile(cfg["tests"], cfg["tests_name"], "exec"), tests_mod.__dict__)
    except Exception as exc:
        _report(nonce, error=f"frozen tests failed to load: {type(exc).__name__}: {exc}")
        return 0
    tests = [getattr(tests_mod, n) for n in sorted(vars(tests_mod)) if n.startswith("test_")
             and callable(getattr(tests_mod, n))]
    passed, failures = 0, []
    for t in tests:
        try:
            t()
            passed += 1
        except Exception as exc:
            failures.append(f"{t.__name__}: {type(exc).__name__}: {str(exc)[:200]}")
            traceback.print_exc(limit=-1)
    _report(nonce, passed=passed, total=len(tests), failures=failures)
    return 0


# --- the candidate ------------------------------------------------------------------------

def candidate(scratch: str, module: str, rx_fd: int, tx_fd: int) -> int:
    rx, tx = os.fdopen(rx_fd, "rb"), os.fdopen(tx_fd, "wb")
    sys.path.insert(0, scratch)
    try:
        mod = __import__(module)
        load_error = None
    except BaseException as exc:
        mod, load_error = None, exc
        traceback.print_exc()
    while True:
        req = _recv(rx)
        if req is None:
            return 0
        try:
            if load_error is not None:
                raise ImportError(f"{module} failed to import: "
                                  f"{type(load_error).__name__}: {load_error}")
            obj = getattr(mod, req["name"], _MISSING)
            if req["op"] == "get":
                reply = ({"kind": "missing"} if obj is _MISSING else
                         {"kind": "callable"} if callable(obj) else
                         {"kind": "value", "value": encode(obj)})
            else:
                args = [decode(a) for a in req["args"]]
                kwargs = {k: decode(v) for k, v in req["kwargs"]}
                reply = {"kind": "value", "value": encode(obj(*args, **kwargs))}
        except BaseException as exc:
            reply = {"kind": "raise", "type": type(exc).__name__, "message": str(exc)[:1000]}
        _send(tx, reply)


_MISSING = object()


def main(argv: list[str]) -> int:
    role = argv[1]
    if role == "boot":
        return boot()
    if role == "judge":
        return judge(int(argv[2]))
    if role == "candidate":
        return candidate(argv[2], argv[3], int(argv[4]), int(argv[5]))
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
