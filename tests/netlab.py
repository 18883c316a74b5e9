"""A two-host lab on one machine: a worker network namespace joined by a veth pair.

Why: remote-node code (ssh, shipped agents, remote server teardown, network
bottlenecks) must be tested against a real sshd, real TCP and a real link, not mocks.
The head is the root namespace (the harness, llama-server and the local agent run
there as usual); the worker is a namespace of its own with one end of the veth, a
private sshd and whatever the test starts there.

Addresses: only ``10.231.<n>.0/24`` on the lab's own veth pair (the first free ``n``)
and loopback. Nothing else is touched: no route, no firewall rule, no other interface.

Cleanup runs on every path: ``close()`` (context manager, fixture finalizer, atexit)
kills every process left in the namespace, deletes the veth and the namespace, and
removes ``/run/sshd`` if the lab created it. A lab left behind by a killed test run is
swept by the next one (names carry the owner's PID).
"""

from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "strata-lab-"
SSHD = "/usr/sbin/sshd"
SSH_ALIAS = "strata-worker"
_NS_RX = re.compile(rf"^{PREFIX}(\d+)-(\d+)$")


class LabUnavailable(RuntimeError):
    """The kernel refuses what the lab needs (namespaces, veth): tests skip with the reason."""


class MissingTool(RuntimeError):
    """A package the lab needs is not installed: tests fail, naming the setup script."""


def _run(argv: list[str], check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(ns: str) -> list[int]:
    """Every process whose network namespace is ``ns`` (``ip netns pids``)."""
    out = _run(["ip", "netns", "pids", ns], check=False)
    return sorted(int(p) for p in out.stdout.split() if p.isdigit())


def _kill_ns_processes(ns: str, grace_s: float = 3.0) -> None:
    pids = netns_pids(ns)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in netns_pids(ns) if _pid_alive(p)]
            if not pids:
                return
            time.sleep(0.05)


def sweep_stale() -> list[str]:
    """Remove labs whose owner process is gone (a test run killed with SIGKILL)."""
    removed = []
    out = _run(["ip", "netns", "list"], check=False)
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_RX.match(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        _kill_ns_processes(name, 1.0)
        _run(["ip", "link", "del", _veth_names(int(m.group(1)), int(m.group(2)))[0]], check=False)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def _veth_names(pid: int, n: int) -> tuple[str, str]:
    base = f"sl{pid % 10**7}{n}"[:13]
    return f"{base}h", f"{base}w"


def _used_subnets() -> set[int]:
    out = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    out += _run(["ip", "-4", "route", "show"], check=False).stdout
    return {int(m.group(1)) for m in re.finditer(r"\b10\.231\.(\d+)\.", out)}


@dataclass
class Sshd:
    proc: subprocess.Popen
    port: int
    config: Path  # the client's ssh config (-F)
    alias: str


@dataclass
class NetLab:
    """The head (root namespace) and one worker namespace, joined by a veth pair."""

    tmp: Path
    n: int = 0
    ns: str = ""
    head_if: str = ""
    worker_if: str = ""
    head_addr: str = ""
    worker_addr: str = ""
    sshd: Sshd | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _made_privsep: bool = False
    _closed: bool = False
    _relays: list[DelayRelay] = field(default_factory=list)

    # -- setup -------------------------------------------------------------------------
    @classmethod
    def create(cls, tmp: Path) -> NetLab:
        """Build the lab; LabUnavailable when the kernel refuses namespaces or veth."""
        if os.geteuid() != 0:
            raise LabUnavailable("needs root (network namespaces)")
        if shutil.which("ip") is None:
            raise MissingTool("iproute2 'ip' not installed: run scripts/install_system_deps.sh")
        sweep_stale()
        used = _used_subnets()
        n = next((i for i in range(1, 250) if i not in used), None)
        if n is None:
            raise LabUnavailable("no free 10.231.<n>.0/24 subnet")
        lab = cls(tmp=tmp, n=n)
        lab.ns = f"{PREFIX}{os.getpid()}-{n}"
        lab.head_if, lab.worker_if = _veth_names(os.getpid(), n)
        lab.head_addr, lab.worker_addr = f"10.231.{n}.1", f"10.231.{n}.2"
        atexit.register(lab.close)
        try:
            lab._build()
        except subprocess.CalledProcessError as e:  # pragma: no cover - defensive
            lab.close()
            raise LabUnavailable(str(e)) from None
        except RuntimeError as e:
            lab.close()
            if "Operation not permitted" in str(e) or "not supported" in str(e).lower():
                raise LabUnavailable(f"the kernel refuses: {e}") from None
            raise
        return lab

    def _build(self) -> None:
        _run(["ip", "netns", "add", self.ns])
        _run(["ip", "link", "add", self.head_if, "type", "veth", "peer", "name", self.worker_if])
        _run(["ip", "link", "set", self.worker_if, "netns", self.ns])
        for dev in (self.head_if,):
            _run(["sysctl", "-q", "-w", f"net.ipv6.conf.{dev}.disable_ipv6=1"], check=False)
        _run(["ip", "addr", "add", f"{self.head_addr}/24", "dev", self.head_if])
        _run(["ip", "link", "set", self.head_if, "up"])
        self.ns_run(
            ["sysctl", "-q", "-w", f"net.ipv6.conf.{self.worker_if}.disable_ipv6=1"], check=False
        )
        self.ns_run(["ip", "addr", "add", f"{self.worker_addr}/24", "dev", self.worker_if])
        self.ns_run(["ip", "link", "set", self.worker_if, "up"])
        self.ns_run(["ip", "link", "set", "lo", "up"])

    def ns_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def ns_run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return _run(self.ns_argv(argv), check=check)

    def ns_popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start a process in the worker namespace (cleaned up by close())."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.ns_argv(argv), **kw)
        self._procs.append(p)
        return p

    # -- the link ----------------------------------------------------------------------
    def cap(self, rate: str = "8mbit", burst: str = "32kbit", latency: str = "50ms") -> None:
        """A token-bucket rate cap on both ends' egress (both directions of the link)."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _run(["tc", "qdisc", "replace", "dev", self.head_if, *tbf])
        self.ns_run(["tc", "qdisc", "replace", "dev", self.worker_if, *tbf])

    def uncap(self) -> None:
        _run(["tc", "qdisc", "del", "dev", self.head_if, "root"], check=False)
        self.ns_run(["tc", "qdisc", "del", "dev", self.worker_if, "root"], check=False)

    def veth_bytes(self) -> dict[str, tuple[int, int]]:
        """(rx, tx) bytes of each end, from the kernel's counters."""
        out = {}
        for name, prefix in ((self.head_if, []), (self.worker_if, self.ns_argv([]))):
            text = _run(
                [
                    *prefix,
                    "cat",
                    f"/sys/class/net/{name}/statistics/rx_bytes",
                    f"/sys/class/net/{name}/statistics/tx_bytes",
                ]
            ).stdout.split()
            out[name] = (int(text[0]), int(text[1]))
        return out

    # -- sshd --------------------------------------------------------------------------
    def start_sshd(self, port: int = 2222) -> Sshd:
        """A private sshd in the worker namespace, listening only on the worker's address.

        Host key, client key, authorized_keys, its config and the client's config (with
        the host key pinned) are generated in the lab's temp dir.
        """
        if not os.path.exists(SSHD) or shutil.which("ssh") is None:
            raise MissingTool(
                "openssh-server/client not installed: run scripts/install_system_deps.sh"
            )
        d = self.tmp / "ssh"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        for name in ("host_key", "id_ed25519"):
            if not (d / name).exists():
                _run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        "strata-lab",
                        "-f",
                        str(d / name),
                    ]
                )
        (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        host_pub = (d / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"{SSH_ALIAS} {host_pub[0]} {host_pub[1]}\n")
        (d / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {port}",
                    f"ListenAddress {self.worker_addr}",
                    f"HostKey {d / 'host_key'}",
                    f"PidFile {d / 'sshd.pid'}",
                    f"AuthorizedKeysFile {d / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "AllowTcpForwarding no",
                    "X11Forwarding no",
                    "PermitTTY no",
                    "PrintMotd no",
                    "UseDNS no",
                    "MaxStartups 50",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        self.write_ssh_config(self.worker_addr, port)
        if not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755)
            self._made_privsep = True
        log = open(self.tmp / "sshd.log", "ab")
        proc = self.ns_popen(
            [SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.tmp / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((self.worker_addr, port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("sshd did not listen within 10 s")
        self.sshd = Sshd(proc, port, d / "config", SSH_ALIAS)
        return self.sshd

    def write_ssh_config(self, host: str, port: int, name: str = "config") -> Path:
        """A client config for alias ``strata-worker`` -> ``host:port`` (host key pinned)."""
        d = self.tmp / "ssh"
        path = d / name
        path.write_text(
            "\n".join(
                [
                    f"Host {SSH_ALIAS}",
                    f"  HostName {host}",
                    f"  Port {port}",
                    "  User root",
                    f"  IdentityFile {d / 'id_ed25519'}",
                    "  IdentitiesOnly yes",
                    f"  HostKeyAlias {SSH_ALIAS}",
                    f"  UserKnownHostsFile {d / 'known_hosts'}",
                    "  GlobalKnownHostsFile /dev/null",
                    "  StrictHostKeyChecking yes",
                    "  BatchMode yes",
                    "  ControlMaster no",
                    "  ControlPath none",
                    "  LogLevel ERROR",
                    "",
                ]
            )
        )
        os.chmod(path, 0o600)
        return path

    def worker_processes(self) -> dict[int, str]:
        """Processes in the worker namespace other than the lab's sshd listener: pid -> cmd."""
        keep = {self.sshd.proc.pid} if self.sshd else set()
        out = {}
        for pid in netns_pids(self.ns):
            if pid in keep:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            # `ip netns exec` of the listener execs sshd itself: same pid, already skipped
            out[pid] = cmd.strip()
        return out

    def wait_worker_clean(self, timeout_s: float = 10.0) -> dict[int, str]:
        """Wait until nothing but the sshd listener runs in the worker; return what is left."""
        deadline = time.monotonic() + timeout_s
        left = self.worker_processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.worker_processes()
        return left

    # -- relay -------------------------------------------------------------------------
    def relay(self, delay_s: float, target_port: int) -> DelayRelay:
        r = DelayRelay(("127.0.0.1", 0), (self.worker_addr, target_port), delay_s)
        self._relays.append(r)
        return r

    # -- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for r in self._relays:
            r.close()
        if self.ns:
            _kill_ns_processes(self.ns)
        for p in self._procs:
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                pass
        if self.head_if:
            _run(["ip", "link", "del", self.head_if], check=False)
        if self.ns:
            _run(["ip", "netns", "del", self.ns], check=False)
        if self._made_privsep:
            try:
                os.rmdir("/run/sshd")
            except OSError:
                pass

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DelayRelay:
    """A TCP relay that holds every chunk ``delay_s`` before passing it on, both ways.

    The kernel here has no netem, so a delay on the path is made in user space: each
    direction queues (due time, bytes) and sends in order when due.
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], delay_s: float) -> None:
        self.target = target
        self.delay_s = delay_s
        self.sock = socket.create_server(listen)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self.sock], [], [], 0.2)
                if not r:
                    continue
                a, _ = self.sock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.target, timeout=5)
            except OSError:
                a.close()
                continue
            self._conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                q: deque[tuple[float, bytes]] = deque()
                cv = threading.Condition()
                threading.Thread(target=self._read, args=(src, q, cv), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, q, cv), daemon=True).start()

    def _read(self, src: socket.socket, q: deque, cv: threading.Condition) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cv:
                q.append((time.monotonic() + self.delay_s, data))
                cv.notify()
            if not data:
                return

    def _write(self, dst: socket.socket, q: deque, cv: threading.Condition) -> None:
        while True:
            with cv:
                while not q:
                    cv.wait()
                due, data = q.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        for s in [self.sock, *self._conns]:
            try:
                s.close()
            except OSError:
                pass


class NsPair:
    """Two network namespaces of their own joined by one veth pair, neither of them the
    host's: a client namespace (``a``, where Strata runs) and a server namespace (``b``),
    for what must not touch the host's own tables (a NAT rule in ``a``). Addresses
    ``10.231.<n>.1`` (a) and ``.2`` (b) exist only inside them. Named like the lab's, so a
    pair left by a killed run is swept with it; ``close()`` kills what runs in them and
    deletes both (the veth goes with them)."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise LabUnavailable("needs root (network namespaces)")
        if shutil.which("ip") is None:
            raise MissingTool("iproute2 'ip' not installed: run scripts/install_system_deps.sh")
        sweep_stale()
        have = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        n = next((i for i in range(200, 250, 2) if f"{PREFIX}{os.getpid()}-{i}" not in have
                  and f"{PREFIX}{os.getpid()}-{i + 1}" not in have), None)
        if n is None:
            raise LabUnavailable("no free namespace pair name")
        self.a, self.b = (f"{PREFIX}{os.getpid()}-{i}" for i in (n, n + 1))
        self.a_if, self.b_if = _veth_names(os.getpid(), n)
        self.a_addr, self.b_addr = f"10.231.{n}.1", f"10.231.{n}.2"
        self._procs: list[subprocess.Popen] = []
        atexit.register(self.close)
        try:
            _run(["ip", "netns", "add", self.a])
            _run(["ip", "netns", "add", self.b])
            _run(["ip", "link", "add", self.a_if, "netns", self.a, "type", "veth", "peer",
                  "name", self.b_if, "netns", self.b])
            for ns, dev, addr in ((self.a, self.a_if, self.a_addr),
                                  (self.b, self.b_if, self.b_addr)):
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except RuntimeError as e:
            self.close()
            if "Operation not permitted" in str(e) or "not supported" in str(e).lower():
                raise LabUnavailable(f"the kernel refuses: {e}") from None
            raise

    def argv(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def run(self, ns: str, argv: list[str], check: bool = True, timeout: float = 60.0
            ) -> subprocess.CompletedProcess:
        return _run(self.argv(ns, argv), check=check, timeout=timeout)

    def popen(self, ns: str, argv: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.argv(ns, argv), **kw)
        self._procs.append(p)
        return p

    def close(self) -> None:
        for ns in (getattr(self, "a", ""), getattr(self, "b", "")):
            if ns:
                _kill_ns_processes(ns)
                _run(["ip", "netns", "del", ns], check=False)
        for p in getattr(self, "_procs", []):
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> NsPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lab_fixture(tmp_path_factory, sshd: bool = True):
    """A generator for pytest fixtures: the lab (with sshd). Missing packages are installed
    on demand (tests/system_packages.py); skipped, with the reason, where this process is not
    root or the kernel refuses namespaces."""
    import pytest
    from system_packages import require

    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    require("iproute2", *(("openssh-server", "openssh-client") if sshd else ()))
    tmp = tmp_path_factory.mktemp("netlab")
    try:
        lab = NetLab.create(tmp)
    except LabUnavailable as e:
        pytest.skip(f"network namespaces unavailable: {e}")
    except MissingTool as e:
        pytest.fail(str(e))
    try:
        if sshd:
            try:
                lab.start_sshd()
            except MissingTool as e:
                pytest.fail(str(e))
        yield lab
    finally:
        lab.close()


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the kernel's children lists, every thread)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


if __name__ == "__main__":  # python3 tests/netlab.py: remove labs left by killed runs
    print("removed:", ", ".join(sweep_stale()) or "nothing")
