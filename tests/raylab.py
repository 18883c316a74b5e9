"""A real Ray cluster on one machine: a head and worker nodes, each in a network namespace.

Why: the Ray engine (strata_plugin/load/ray_engine.py) must be tested against real
``ray start`` nodes that reach each other, and the servers under test, over real TCP
at their own addresses, not against ``ray.init()``'s local mode.

Layout: a bridge in the root namespace holds ``10.231.<n>.1`` (the first free ``n``,
as tests/netlab.py picks it): the harness, the test emitter and llama-server listen
there. Node ``k`` (0 = the head) is a namespace of its own, joined to the bridge by a
veth pair, at ``10.231.<n>.<k+2>``. Only those addresses and loopback are used: no
route, no firewall rule, no other interface.

Each node is ``ray start`` with small figures (1 CPU, an 80 MB object store, no
dashboard) and a temp dir of its own; the head also serves Ray Client on port 10001,
which is how the driver (the test, in the root namespace) connects:
``ray://10.231.<n>.2:10001``. ``kill_node(k)`` kills every process in node ``k``'s
namespace (a host lost mid-case). ``close()`` kills every process left in every
namespace (by namespace: ``ray stop`` would stop every Ray process on the machine),
deletes the links, the bridge and the namespaces, and the temp dirs; it runs on every
path (context manager, atexit). A lab left by a killed run is swept by the next one.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from netlab import LabUnavailable, _kill_ns_processes, _pid_alive, _run, _used_subnets, netns_pids

PREFIX = "strata-ray-"
_NS_RX = re.compile(rf"^{PREFIX}(\d+)-(\d+)-(\d+)$")
RAY_BIN = str(Path(sys.executable).with_name("ray"))
CLIENT_PORT = 10001
GCS_PORT = 6379
#: How long the lab waits for a driver to connect through Ray Client once every node is
#: alive, and between attempts (each a fresh driver process).
CLIENT_TIMEOUT_S = 120.0
CLIENT_RETRY_S = 2.0
#: The driver of ``wait_client``: connects, waits (bounded) until the cluster has the
#: CPUs of every node, disconnects; exit 0 only then.
_CLIENT_PROBE = """
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
try:
    deadline = time.monotonic() + 30
    while ray.cluster_resources().get("CPU", 0) < float(sys.argv[2]):
        if time.monotonic() > deadline:
            sys.exit(f"connected, but the cluster has {ray.cluster_resources()}")
        time.sleep(0.5)
finally:
    ray.shutdown()
"""


def _names(pid: int, n: int) -> tuple[str, str]:
    """The bridge's name and the stem of the veth names (IFNAMSIZ: 15)."""
    stem = f"sr{pid % 10**5}{n}"
    return f"{stem}b", stem


def sweep_stale() -> list[str]:
    """Remove Ray labs whose owner process is gone."""
    removed = []
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_RX.match(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        _kill_ns_processes(name, 1.0)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
        bridge, stem = _names(int(m.group(1)), int(m.group(2)))
        _run(["ip", "link", "del", f"{stem}{m.group(3)}h"], check=False)
        _run(["ip", "link", "del", bridge], check=False)
    return removed


@dataclass
class RayNode:
    k: int
    ns: str
    addr: str
    temp: Path
    host_if: str


@dataclass
class RayLab:
    tmp: Path
    n: int = 0
    bridge: str = ""
    head_addr: str = ""  # the root namespace's address on the bridge
    nodes: list[RayNode] = field(default_factory=list)
    _closed: bool = False
    #: RAY_AUTH_MODE as start_ray found it (a 1-tuple once it ran), given back by close
    _auth_mode: tuple[str | None] | None = None

    @classmethod
    def create(cls, tmp: Path, nodes: int = 3) -> RayLab:
        if os.geteuid() != 0:
            raise LabUnavailable("needs root (network namespaces)")
        if shutil.which("ip") is None:
            raise LabUnavailable("iproute2 'ip' not installed")
        if not Path(RAY_BIN).exists():
            raise LabUnavailable(f"no {RAY_BIN}: pip install 'strata[ray]'")
        sweep_stale()
        used = _used_subnets()
        n = next((i for i in range(100, 250) if i not in used), None)
        if n is None:
            raise LabUnavailable("no free 10.231.<n>.0/24 subnet")
        lab = cls(tmp=tmp, n=n)
        atexit.register(lab.close)
        lab.bridge, stem = _names(os.getpid(), n)
        lab.head_addr = f"10.231.{n}.1"
        try:
            _run(["ip", "link", "add", lab.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{lab.head_addr}/24", "dev", lab.bridge])
            _run(["ip", "link", "set", lab.bridge, "up"])
            for k in range(nodes):
                ns = f"{PREFIX}{os.getpid()}-{n}-{k}"
                host_if, node_if = f"{stem}{k}h", f"{stem}{k}w"
                node = RayNode(k, ns, f"10.231.{n}.{k + 2}", Path(f"/tmp/sray{n}{k}"), host_if)
                lab.nodes.append(node)
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", node_if])
                _run(["ip", "link", "set", node_if, "netns", ns])
                _run(["ip", "link", "set", host_if, "master", lab.bridge])
                _run(["ip", "link", "set", host_if, "up"])
                lab.ns_run(k, ["ip", "addr", "add", f"{node.addr}/24", "dev", node_if])
                lab.ns_run(k, ["ip", "link", "set", node_if, "up"])
                lab.ns_run(k, ["ip", "link", "set", "lo", "up"])
        except RuntimeError as e:
            lab.close()
            raise LabUnavailable(f"the kernel refuses: {e}") from None
        return lab

    @property
    def address(self) -> str:
        """What ``ray.init`` takes from the root namespace: the head's Ray Client."""
        return f"ray://{self.nodes[0].addr}:{CLIENT_PORT}"

    def ns_run(self, k: int, argv: list[str], check: bool = True,
               timeout: float = 20.0) -> subprocess.CompletedProcess:
        return _run(["ip", "netns", "exec", self.nodes[k].ns, *argv], check=check,
                    timeout=timeout)

    def start_ray(self, cpus: int = 1) -> None:
        """``ray start`` on every node: the head first, then each worker joins it.

        Without token authentication, said explicitly for the nodes and the driver alike
        (``RAY_AUTH_MODE``, given back by ``close``): Ray 2.60 turns it on for a process
        that finds ``~/.ray/auth_token``, which any local ``ray.init()`` writes, and one
        such file left on this machine made every worker's ``ray start`` fail, ten runs
        in ten ("Authentication token is missing or incorrect")."""
        if self._auth_mode is None:
            self._auth_mode = (os.environ.get("RAY_AUTH_MODE"),)
        os.environ["RAY_AUTH_MODE"] = "disabled"
        head = self.nodes[0]
        common = [f"--num-cpus={cpus}", "--num-gpus=0", "--object-store-memory=80000000",
                  "--disable-usage-stats"]
        for node in self.nodes:
            if node.temp.exists():
                shutil.rmtree(node.temp, ignore_errors=True)
            node.temp.mkdir(parents=True)
            argv = [RAY_BIN, "start", f"--node-ip-address={node.addr}",
                    f"--temp-dir={node.temp}", *common]
            if node.k == 0:
                argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false",
                         f"--ray-client-server-port={CLIENT_PORT}"]
            else:
                argv += [f"--address={head.addr}:{GCS_PORT}"]
            out = self.ns_run(node.k, argv, check=False, timeout=180)
            if out.returncode != 0:
                raise RuntimeError(f"ray start on node {node.k} failed: {out.stderr[-2000:]}"
                                   + self.logs(node.k))
        self.wait_nodes(len(self.nodes))
        self.wait_client()

    def wait_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Until the head's GCS lists ``count`` alive nodes (``ray status`` on the head)."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            out = self.ns_run(0, [RAY_BIN, "status", f"--address={self.nodes[0].addr}:{GCS_PORT}"],
                              check=False, timeout=60)
            last = out.stdout + out.stderr
            alive = len(re.findall(r"^\s*1 node_", last, re.M))
            if alive >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the Ray cluster has not {count} alive nodes after {timeout_s:.0f} s: "
                           f"{last[-1500:]}" + "".join(self.logs(n.k) for n in self.nodes))

    def wait_client(self, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        """Until a driver in the root namespace connects through Ray Client and sees every
        node's CPU: what the tests need, and the step that failed one CI run in two on a
        busy host ("Starting Ray client server failed": the head's proxy starts a server
        process per driver). Each attempt is a fresh driver process, bounded; the error
        names the step that did not come up and the head's Ray Client logs."""
        deadline = time.monotonic() + timeout_s
        attempts, last = 0, ""
        while True:
            attempts += 1
            left = max(5.0, deadline - time.monotonic())
            try:
                out = subprocess.run([sys.executable, "-c", _CLIENT_PROBE, self.address,
                                      str(len(self.nodes))], capture_output=True, text=True,
                                     timeout=left)
                if out.returncode == 0:
                    return
                last = (out.stdout + out.stderr).strip()[-1500:]
            except subprocess.TimeoutExpired:
                last = f"the driver did not connect in {left:.0f} s"
            if time.monotonic() + CLIENT_RETRY_S >= deadline:
                break
            time.sleep(CLIENT_RETRY_S)
        raise RuntimeError(f"Ray Client at {self.address} did not take a driver that sees "
                           f"{len(self.nodes)} CPUs within {timeout_s:.0f} s ({attempts} "
                           f"attempts); the last: {last}" + self.logs(0, "ray_client_server"))

    def logs(self, k: int, stem: str = "", tail: int = 1500) -> str:
        """The tails of node ``k``'s Ray error logs (``stem*.err``), for a failure message."""
        files = sorted(self.nodes[k].temp.glob(f"session_latest/logs/{stem}*.err"))
        out = ""
        for f in files:
            try:
                text = f.read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                out += f"\n--- node {k}: {f.name} ---\n{text[-tail:]}"
        return out

    def kill_node(self, k: int) -> list[int]:
        """Every process in node ``k``'s namespace, SIGKILL: a host lost."""
        pids = netns_pids(self.nodes[k].ns)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return pids

    def processes(self) -> dict[str, list[int]]:
        return {node.ns: netns_pids(node.ns) for node in self.nodes}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for node in self.nodes:
            _kill_ns_processes(node.ns)
        for node in self.nodes:
            _run(["ip", "link", "del", node.host_if], check=False)
            _run(["ip", "netns", "del", node.ns], check=False)
            shutil.rmtree(node.temp, ignore_errors=True)
        if self.bridge:
            _run(["ip", "link", "del", self.bridge], check=False)
        if self._auth_mode is not None:
            (before,) = self._auth_mode
            if before is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = before

    def __enter__(self) -> RayLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
