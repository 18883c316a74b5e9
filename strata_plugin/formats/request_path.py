"""The request's path to an attached server, as ``manifest.json`` records it.

A client rarely talks to the engine directly: a router, a gateway, a TLS terminator or
a container runtime's port forwarder listens on the URL's port and connects on to the
engine. ``run/listener.py`` follows those connections from the URL's port to the
process that serves (:func:`~strata_plugin.run.listener.discover`); this is what it
found, one :class:`Hop` per address and process, written under ``request_path`` (one
entry per server block) and shown in report.md's header as one line:

    127.0.0.1:8000 -> PID 1234 `nginx` -> 127.0.0.1:9000 -> PID 5678 `vllm serve`

A path that leaves this machine ends in a hop whose kind is ``remote``: the engine
there cannot be observed (no process, no CPU, no run state), and the line says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The key of the paths in manifest.json: ``{block key: RequestPath.to_json()}``.
MANIFEST_KEY = "request_path"

#: Hop kinds. ``proxy``: a process on this machine that connects on to the next hop;
#: ``engine``: the last process on this machine, the one that serves; ``remote``: an
#: address no network namespace of this machine holds (another host); ``unreadable``: a
#: listener whose process this user may not read (another user's, without privileges).
KINDS = ("proxy", "engine", "remote", "unreadable")
#: Where the engine's PIDs came from: the profile's ``telemetry.pid_pattern`` (it wins
#: where given), the path's last process, or nowhere (another host, unreadable).
ENGINE_FROM = ("pid_pattern", "path", "none")


@dataclass(frozen=True)
class Hop:
    """One address on the path and the process that holds it (where it can be known)."""

    address: str  # "127.0.0.1:8000", "[::1]:8000"
    kind: str  # one of KINDS
    pid: int | None = None  # the lowest PID holding the listening socket
    name: str = ""  # a short name of its command: `nginx`, `vllm serve`, `python -m x`
    pids: tuple[int, ...] = ()  # every PID holding the listener or the path's connections
    netns: str = ""  # "net:[4026532...]" when not the harness's own network namespace
    note: str = ""  # why a hop cannot be observed (another host, another user)
    container: str = ""  # "podman strata-engine (3f2a1b9c0d1e)" where a runtime names it

    def text(self) -> str:
        """``127.0.0.1:9000 -> PID 5678 `vllm serve```; a remote or unreadable hop with
        its reason."""
        where = self.address + (f" (network namespace {self.netns})" if self.netns else "")
        if self.kind in ("proxy", "engine") and self.pid is not None:
            inside = f" in container {self.container}" if self.container else ""
            return f"{where} -> PID {self.pid} `{self.name or '?'}`{inside}"
        return f"{where} ({self.note or self.kind})"

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "kind": self.kind, "pid": self.pid,
                "name": self.name, "pids": list(self.pids), "netns": self.netns,
                "note": self.note, "container": self.container}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Hop:
        pid = d.get("pid")
        return cls(address=str(d.get("address", "")), kind=str(d.get("kind", "")),
                   pid=int(pid) if isinstance(pid, int) else None,
                   name=str(d.get("name", "")),
                   pids=tuple(int(p) for p in d.get("pids") or () if isinstance(p, int)),
                   netns=str(d.get("netns", "")), note=str(d.get("note", "")),
                   container=str(d.get("container", "")))


@dataclass(frozen=True)
class Container:
    """The container an engine runs in, as far as this machine's runtime says."""

    runtime: str  # "podman", "docker", "containerd", "cri-o"
    id: str  # the full id, from the engine's cgroup path
    name: str = ""  # "" where no runtime here answered for it

    def text(self) -> str:
        return f"{self.runtime} {self.name or '(name unknown)'} ({self.id[:12]})"

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "id": self.id, "name": self.name}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Container:
        return cls(str(d.get("runtime", "")), str(d.get("id", "")), str(d.get("name", "")))


@dataclass(frozen=True)
class Engine:
    """One engine the path ends at: what the agent follows for it. Several of them (the
    replicas behind a router, processes sharing a port with SO_REUSEPORT) are a list,
    each with its own process, network namespace, cgroup and container."""

    pid: int  # the lowest PID holding its listening socket: the process followed
    pids: tuple[int, ...]  # every PID holding that socket (a forking server's workers)
    address: str  # where it listens, as the path reached it: "10.88.0.5:8000"
    netns_inode: int | None = None  # its network namespace's inode (None: not readable)
    cgroup: str = ""  # its cgroup (v2 path, "/system.slice/..."); "" when not readable
    container: Container | None = None  # where a runtime on this machine knows it
    name: str = ""  # a short name of its command

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "pids": list(self.pids), "address": self.address,
                "netns_inode": self.netns_inode, "cgroup": self.cgroup, "name": self.name,
                "container": self.container.to_json() if self.container else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Engine:
        pid, ino, c = d.get("pid"), d.get("netns_inode"), d.get("container")
        return cls(pid=pid if isinstance(pid, int) else 0,
                   pids=tuple(int(p) for p in d.get("pids") or () if isinstance(p, int)),
                   address=str(d.get("address", "")),
                   netns_inode=ino if isinstance(ino, int) else None,
                   cgroup=str(d.get("cgroup", "")), name=str(d.get("name", "")),
                   container=Container.from_json(c) if isinstance(c, Mapping) else None)


@dataclass(frozen=True)
class RequestPath:
    """Every chain from the URL's address to where it ends (one chain, unless a router
    spreads requests over several engines), and which processes the agent follows."""

    url: str
    chains: tuple[tuple[Hop, ...], ...] = ()
    engine_from: str = "path"  # one of ENGINE_FROM
    #: the processes the head agent follows as the server (``--pid``), unless
    #: ``engine_from`` is ``pid_pattern`` (then the agent matches the pattern itself and
    #: these are the matches when the path was looked at)
    engine_pids: tuple[int, ...] = ()
    #: the processes on the way (``--path-pid``): sampled as the path, not as the server
    #: and not as "other processes"
    proxy_pids: tuple[int, ...] = ()
    #: why the engine could not be found or observed ("" when it was)
    reason: str = ""
    #: how it was looked at: "probe" (while a request was held in flight), "static"
    how: str = "probe"
    notes: tuple[str, ...] = field(default=())
    #: every engine the path ends at, one entry each (empty where the engine came from
    #: ``telemetry.pid_pattern`` or none was found)
    engines: tuple[Engine, ...] = field(default=())

    @property
    def observable(self) -> bool:
        """The engine is a process on this machine that the agent can follow."""
        return bool(self.engine_pids) and not self.reason

    @property
    def proxies(self) -> tuple[Hop, ...]:
        return tuple(h for c in self.chains for h in c if h.kind == "proxy")

    def line(self) -> str:
        """The path in one line (chains joined by ``; ``), its notes (a cycle, the depth
        bound), then what cannot be observed."""
        text = "; ".join(" -> ".join(h.text() for h in chain) for chain in self.chains)
        if self.engine_from == "pid_pattern":
            pids = ", ".join(map(str, self.engine_pids)) or "none yet"
            text += f"; the engine by telemetry.pid_pattern: PID {pids}"
        text = text or self.url
        text += "".join(f" ({n})" for n in self.notes)
        if self.reason:
            text += f". {self.reason}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "line": self.line(), "observable": self.observable,
                "engine_from": self.engine_from, "engine_pids": list(self.engine_pids),
                "proxy_pids": list(self.proxy_pids), "reason": self.reason, "how": self.how,
                "notes": list(self.notes),
                "engines": [e.to_json() for e in self.engines],
                "chains": [[h.to_json() for h in c] for c in self.chains]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RequestPath:
        return cls(url=str(d.get("url", "")),
                   chains=tuple(tuple(Hop.from_json(h) for h in c if isinstance(h, Mapping))
                                for c in d.get("chains") or () if isinstance(c, Sequence)),
                   engine_from=str(d.get("engine_from", "path")),
                   engine_pids=tuple(int(p) for p in d.get("engine_pids") or ()
                                     if isinstance(p, int)),
                   proxy_pids=tuple(int(p) for p in d.get("proxy_pids") or ()
                                    if isinstance(p, int)),
                   reason=str(d.get("reason", "")), how=str(d.get("how", "probe")),
                   notes=tuple(str(n) for n in d.get("notes") or ()),
                   engines=tuple(Engine.from_json(e) for e in d.get("engines") or ()
                                 if isinstance(e, Mapping)))


def paths_in(manifest: Mapping[str, Any]) -> dict[str, RequestPath]:
    """The recorded paths by server block (none for a run that launched its server)."""
    raw = manifest.get(MANIFEST_KEY)
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): RequestPath.from_json(v) for k, v in raw.items() if isinstance(v, Mapping)}
