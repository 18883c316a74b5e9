"""Watch the followed engine for its end, and follow the engine that takes its port.

Engines crash and their supervisor (systemd, a container runtime's restart policy, a
Kubernetes kubelet) starts another on the same port. Without a watch the run sees only
failed requests and then an agent following a PID that is no more. :class:`EngineWatch`
checks every ``poll_s`` whether each followed engine still lives (``agent/lifetime.py``:
its PID and start time), records each that ended (``formats/engine_events.py``: how, in
the parent's words where Strata is its parent, ``gone`` where not), then looks up the
listener of the URL's port until a process listens there again, records it, and points
the agent at it (``retarget``).

A thread of its own: the load's threads never wait on it, every look is a few /proc
reads, and it stops within one poll interval of being asked (``stop``), whatever the
engine does. A record or a retarget that fails is kept in ``errors`` and the watch goes
on: the data so far is the run's, not the watch's.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from strata_plugin.agent import lifetime
from strata_plugin.formats.engine_events import ENGINE_EXIT, ENGINE_NEW, EngineEvent
from strata_plugin.run.listener import listening_inodes, socket_owner

#: How often the watch looks (s): the events' times are within this of the change.
POLL_S = 0.2


class EngineWatch:
    """The followed engines of one server block, and those that take over their port.

    ``pids``: the engines followed now. ``child``: the process Strata started, where one
    of ``pids`` is it (its exit code or signal is then known). ``find_listener``: the PID
    listening on the URL's port now, or None. ``record`` files an event; ``retarget``
    points the agents at the engines followed from then on.
    """

    def __init__(self, pids: Sequence[int], port: int, *,
                 record: Callable[[EngineEvent], None],
                 retarget: Callable[[list[int]], None],
                 find_listener: Callable[[], int | None],
                 child: subprocess.Popen | None = None,
                 poll_s: float = POLL_S,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.port = port
        self.record = record
        self.retarget = retarget
        self.find_listener = find_listener
        self.child = child
        self.poll_s = poll_s
        self.clock_ns = clock_ns
        self.lives: dict[int, lifetime.Life] = {}
        for pid in pids:
            life = lifetime.Life.observe(pid)
            if life is not None:
                self.lives[pid] = life
        #: every event recorded, in order
        self.events: list[EngineEvent] = []
        #: what went wrong in a record, a retarget or a look (the watch went on)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_look_ns: int | None = None  # the previous look's time

    @property
    def following(self) -> list[int]:
        return sorted(self.lives)

    def _how(self, life: lifetime.Life) -> str | None:
        if self.child is not None and self.child.pid == life.pid:
            rc = self.child.poll()
            return None if rc is None else lifetime.describe_returncode(rc)
        return life.ended()

    def _emit(self, kind: str, pid: int, how: str) -> EngineEvent:
        ev = EngineEvent(kind, pid, self.port, how, self.clock_ns(), self._last_look_ns)
        self.events.append(ev)
        try:
            self.record(ev)
        except Exception as exc:  # the watch goes on; the report lacks this event
            self.errors.append(f"record {kind} pid {pid}: {type(exc).__name__}: {exc}")
        return ev

    def poll_once(self) -> list[EngineEvent]:
        """One look: the engines that ended, then (with none left) the port's new
        listener. Returns the events it recorded."""
        out = []
        look_ns = self.clock_ns()
        for pid, life in sorted(self.lives.items()):
            how = self._how(life)
            if how is not None:
                del self.lives[pid]
                out.append(self._emit(ENGINE_EXIT, pid, how))
        if not self.lives and self.events:  # every engine ended: who listens now?
            try:
                listener = self.find_listener()
            except Exception as exc:
                self.errors.append(f"listener lookup: {type(exc).__name__}: {exc}")
                listener = None
            new = lifetime.Life.observe(listener) if listener else None
            if new is not None:
                self.lives[new.pid] = new
                out.append(self._emit(ENGINE_NEW, new.pid, "listens"))
                try:
                    self.retarget([new.pid])
                except Exception as exc:
                    self.errors.append(f"retarget to {new.pid}: {type(exc).__name__}: {exc}")
        self._last_look_ns = look_ns
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # never let the watch die silently
                self.errors.append(f"watch: {type(exc).__name__}: {exc}")

    def start(self) -> EngineWatch:
        self._thread = threading.Thread(target=self._loop, name="engine-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop looking (idempotent); returns within ``timeout_s``, a look in progress
        being a few /proc reads."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


class PortListener:
    """The PID listening on ``port`` in this network namespace, or None; cheap while
    nothing listens (one read of ``/proc/net/tcp{,6}``): the owner is looked for among
    every process's sockets only when a listening socket is there, and not again for the
    same sockets once their owner could not be read (another user's process)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._unowned: set[str] = set()

    def __call__(self) -> int | None:
        inodes = listening_inodes(self.port)
        if not inodes or inodes == self._unowned:
            return None
        pid = socket_owner(inodes)
        self._unowned = set() if pid else inodes
        return pid


def url_port(base_url: str) -> int:
    """The URL's port (its scheme's default where it names none); 0 when it has none."""
    try:
        parts = urlsplit(base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return 0
