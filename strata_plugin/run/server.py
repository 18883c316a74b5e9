"""Server lifetimes: launch in its own process group, wait for health, tear down.

A launched server gets its own session (process group), a log file in the run
folder, and a health poll that also watches the process, so a server that dies
during start-up fails fast with its log tail instead of waiting out the timeout.
Teardown sends SIGTERM to the whole group, then SIGKILL after a grace period.
An attached server (``--strata-server-url``) offers the same interface and is
never stopped by us. A server in a container (``[server.container]``, argv built by
``run/container.py``) is the runtime client's foreground run: its PID is the
container's main process from ``inspect``, and a stop removes the container too.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import requests

from strata_plugin.configure.credentials import UrlAuth, redact_json
from strata_plugin.errors import StrataError
from strata_plugin.formats.printable import printable
from strata_plugin.run.reaper import die_with_parent

if TYPE_CHECKING:
    from strata_plugin.run.container import ContainerLaunch, Removal, Watchdog


class ServerStartError(StrataError, RuntimeError):
    """The server exited or never became healthy; carries its log tail."""


class ServerUnreachable(ServerStartError):
    """An attached server (``--strata-server-url``) refused the connection, or its host
    does not resolve: nothing is starting there, so there is nothing to wait for. The
    message is one paragraph for the user: what was tried, what answered, what to check."""


def check_server_url(url: str) -> str:
    """``url`` as a server's base URL, or ValueError saying what is wrong with it, in the
    terms of the option that gave it (scheme, host, port). Credentials in it
    (``http://user:pw@host``) are kept, and never shown in an error."""
    from urllib.parse import urlsplit

    from strata_plugin.configure.credentials import redact

    text = url.strip()
    shown = repr(redact(url))
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{shown} is not an http:// or https:// URL (expected e.g. "
                         "http://127.0.0.1:8000)")
    if not parts.hostname:
        raise ValueError(f"{shown} has no host (expected e.g. http://127.0.0.1:8000)")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{shown}: the port is not a number from 1 to 65535 "
                         f"({redact(str(exc))})") from None
    if parts.netloc.endswith(":") or port == 0:
        raise ValueError(f"{shown} has no port after ':' (expected e.g. "
                         f"{parts.scheme}://{parts.hostname}:8000)")
    if parts.path.rstrip("/").endswith("/v1"):
        raise ValueError(f"{shown} ends in /v1: give the server's root URL "
                         f"({redact(text[: text.rstrip('/').rfind('/v1')])}); Strata adds the "
                         "API's path (/v1/completions, /v1/chat/completions, ...) itself")
    if parts.query or parts.fragment:
        raise ValueError(f"{shown} has a query or fragment; give the server's root URL")
    return text.rstrip("/")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path | None, n_lines: int = 40) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64 * 1024))
        lines = fh.read().decode("utf-8", "replace").splitlines()
    # the engine's own words, quoted to the terminal: its escapes shown, not obeyed
    return printable("\n".join(lines[-n_lines:]), keep_lines=True)


@dataclass(frozen=True)
class LaunchSpec:
    """A fully expanded server command: argv list, env overrides, where to log."""

    config_id: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    base_url: str
    health_path: str
    health_timeout_s: float
    stop_timeout_s: float
    log_path: Path
    #: ``[server.container]``: ``argv`` is then the runtime's ``run`` command
    container: ContainerLaunch | None = None

    def to_json(self) -> dict:
        # Env values may be secrets: record names only; a URL's credentials are hidden.
        out = {"config_id": self.config_id, "argv": redact_json(list(self.argv)),
               "env_names": sorted(k for k, _ in self.env), "base_url": self.base_url,
               "log": str(self.log_path)}
        if self.container is not None:
            out["container"] = self.container.to_json(self.stop_timeout_s)
            out["env_names"] = list(self.container.env_names)
        return out


class Server:
    """A running server, launched by us or attached to."""

    def __init__(self, spec: LaunchSpec | None, base_url: str,
                 auth: UrlAuth | None = None) -> None:
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        #: credentials to send (an attached server's URL had them): the health poll,
        #: the load's requests and the agent's /metrics scrape send them; never written
        self.auth = auth
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self.restarts = 0
        self.block_id = ""
        self._log_fh: IO[bytes] | None = None
        #: a container's inspect facts (run/container.facts) once it is healthy
        self.container_facts: dict | None = None
        self.container_inspect: dict | None = None
        self.container_removal: Removal | None = None  # of the last stop
        self._watchdog: Watchdog | None = None  # of the running container
        self.containers_swept: list[str] = []  # left by killed harnesses, removed at start

    @property
    def container(self) -> ContainerLaunch | None:
        return self.spec.container if self.spec else None

    @property
    def config_id(self) -> str:
        return self.spec.config_id if self.spec else "attached"

    @property
    def block_key(self) -> str:
        """The block this server serves (its configuration's id until a block is set):
        the key of the session's blocks, workers and restart records."""
        return self.block_id or self.config_id

    @property
    def pid(self) -> int | None:
        """The server's own PID: a container's main process (from ``inspect``), else the
        process we launched."""
        if self.container_facts and self.container_facts.get("main_pid"):
            return int(self.container_facts["main_pid"])
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path | None:
        return self.spec.log_path if self.spec else None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    # --- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        assert self.spec is not None
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = spec.log_path.open("ab")
        env = dict(os.environ)
        env.update(dict(spec.env))
        t0 = time.monotonic()
        self.container_facts = self.container_inspect = self.container_removal = None
        if spec.container is not None:
            self._guard_container(spec.container)
        try:
            self.proc = subprocess.Popen(
                list(spec.argv), stdout=self._log_fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM, main_thread_only=True),
            )
            self.wait_healthy(spec.health_timeout_s)
            if spec.container is not None:
                self._inspect_container(spec.container)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0

    def _guard_container(self, launch: ContainerLaunch) -> None:
        """Before the container exists: remove those killed harnesses left on this host
        (``sweep_orphans``), and start the watchdog that removes this one if the harness
        dies without stopping it (run/container.py)."""
        import sys

        from strata_plugin.run.container import start_watchdog, sweep_orphans

        self.containers_swept = sweep_orphans(launch.runtime, launch.runtime_args)
        for name in self.containers_swept:
            print(f"strata: removed container {name}, left running by a harness that was "
                  "killed", file=sys.stderr)
        if self._watchdog is not None:
            self._watchdog.close()
        self._watchdog = start_watchdog(launch)

    def _inspect_container(self, launch: ContainerLaunch) -> None:
        from strata_plugin.run.container import ContainerError, facts, inspect

        try:
            info = inspect(launch)
        except ContainerError as exc:
            raise ServerStartError(f"the server answers but its container cannot be "
                                   f"inspected: {exc}") from None
        self.container_inspect, self.container_facts = info, facts(info)
        if not self.container_facts["main_pid"]:
            raise ServerStartError(f"container {launch.name} has no main PID "
                                   f"(state {self.container_facts['status']!r})")

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll the health URL, failing fast when the process exits.

        The timeout is for a server that is starting: one we launched, or an attached one
        that answers but is not ready yet (HTTP 503 while it loads). An attached server
        that refuses the connection, or whose host does not resolve, fails at once
        (:class:`ServerUnreachable`): nothing there is starting. So does one that answers
        the health URL with a client error (a 4xx but 408, 425 and 429): a 404 is the
        server's final word on that path (a URL with a path the server does not serve,
        a wrong ``server.health_path``), not a server still loading (RFC 9110, 15.5:
        "the client seems to have erred").
        """
        path = self.spec.health_path if self.spec else "/health"
        url = self.base_url + path
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        last = "no answer yet"
        while True:
            if not self.alive():
                raise ServerStartError(
                    f"server exited with code {self.exit_code()} before becoming healthy\n"
                    f"--- log tail ({self.log_path}) ---\n{log_tail(self.log_path)}")
            try:
                r = requests.get(url, timeout=2,
                                 headers=self.auth.headers() if self.auth else None)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}" + (
                    " (the server wants credentials: http://user:password@host:port, or "
                    "the profile's server.api_key_env)" if r.status_code == 401 else "")
                if self.spec is None and _not_starting(r.status_code):
                    raise ServerStartError(not_starting_text(
                        self.base_url, url, r.status_code, time.monotonic() - t0))
            except requests.RequestException as exc:
                last = type(exc).__name__
                why = _nothing_there(exc) if self.spec is None else None
                if why is not None:
                    raise ServerUnreachable(unreachable_text(
                        self.base_url, url, why, time.monotonic() - t0)) from None
            if time.monotonic() > deadline:
                if self.spec is None:  # attached: no log of ours to show
                    raise ServerStartError(
                        f"the server at {self.base_url} answered GET {url} but was not "
                        f"healthy within {timeout_s:.0f} s (server.health_timeout_s; last "
                        f"answer: {last}). Check that it has finished loading, and the "
                        "profile's server.health_path.")
                raise ServerStartError(
                    f"server not healthy at {url} after {timeout_s:.0f} s (last: {last})\n"
                    f"--- log tail ({self.log_path}) ---\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period. Idempotent."""
        if self.proc is None:
            return None
        grace = self.spec.stop_timeout_s if self.spec else 10.0
        launch = self.container
        if launch is None:
            code = terminate_group(self.proc, grace)
        else:
            code = self._stop_container(self.proc, launch, grace)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        return code

    def kill_group(self) -> None:
        """The reaper's last resort on a second signal: SIGKILL the group now and wait for
        nothing (it may have interrupted ``stop()`` itself). A container's removal is
        started detached, since killing its runtime client would leave it running."""
        if self.proc is None:
            return
        _signal_group(self.proc.pid, signal.SIGKILL)
        if self.container is not None:
            try:
                subprocess.Popen(self.container.rm_argv(), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            except OSError:
                pass

    def _stop_container(self, proc: subprocess.Popen, launch: ContainerLaunch,
                        grace: float) -> int | None:
        """The container first (killing its client would leave it running), then the
        client's group, then ``rm -f`` and a check that it is gone; whatever raises in
        between, the removal is attempted (Ctrl-C during a stop included)."""
        from strata_plugin.run.container import remove_container, stop_container

        code = None
        try:
            if self.container_removal is None or not self.container_removal.removed:
                stop_container(launch, grace)
            code = terminate_group(proc, 5.0)
        finally:
            if self.container_removal is None or not self.container_removal.removed:
                self.container_removal = remove_container(launch)
            if self._watchdog is not None:  # removed: it has nothing to do; else one more try
                if self.container_removal.removed:
                    self._watchdog.done()
                else:
                    self._watchdog.close()
                self._watchdog = None
        return code


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what it wraps (requests -> urllib3 -> the socket's OSError)."""
    out: list[BaseException] = []
    stack: list[object] = [exc]
    while stack:
        x = stack.pop()
        if not isinstance(x, BaseException) or any(x is y for y in out):
            continue
        out.append(x)
        stack += [getattr(x, "reason", None), x.__cause__, x.__context__, *x.args]
    return out


_NOTHING_THERE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


def _nothing_there(exc: requests.RequestException) -> str | None:
    """Why nothing is starting at that address (refused, a host that does not resolve,
    no answer to the connect), or None: a reset after connecting is something that
    answers, and may be a server still starting."""
    if isinstance(exc, requests.ConnectTimeout):
        return "timeout"
    for x in _causes(exc):
        if isinstance(x, socket.gaierror):
            return "dns"
        if isinstance(x, OSError) and x.errno in _NOTHING_THERE:
            return "refused" if x.errno == errno.ECONNREFUSED else "route"
    return None


def _not_starting(status: int) -> bool:
    """A client error: the server answered and will answer the same (RFC 9110, 15.5),
    unlike 408 Request Timeout, 425 Too Early and 429 Too Many Requests, which a
    server that is busy or starting may send."""
    return 400 <= status < 500 and status not in (408, 425, 429)


def not_starting_text(base_url: str, url: str, status: int, waited_s: float) -> str:
    """One paragraph: what was tried, what the server answered, what to check."""
    from urllib.parse import urlsplit

    path = urlsplit(base_url).path.rstrip("/")
    check = {
        404: (f"the URL's path ({path}): Strata adds /health and the API's paths "
              "(/v1/completions, /v1/chat/completions, ...) to the URL given, so give the "
              "server's root URL" if path else
              "the profile's server.health_path (the path this server answers health on)"),
        401: ("the credentials: the health check sends those of the URL "
              "(http://user:password@host:port) and no others, so give them there, or "
              "set the profile's server.health_path to a path the server answers "
              "without them"),
        403: ("the credentials: the health check sends those of the URL "
              "(http://user:password@host:port) and no others, so give them there, or "
              "set the profile's server.health_path to a path the server answers "
              "without them"),
    }.get(status, "the URL and the profile's server.health_path")
    return (f"The server at {base_url} answered GET {url} with HTTP {status} (after "
            f"{waited_s:.1f} s): a client error is its answer to that URL, not a server "
            f"still starting, so Strata did not wait. Check {check}. No case ran against it; "
            "the run folder's report.md and manifest.json say so.")


def unreachable_text(base_url: str, url: str, why: str, waited_s: float) -> str:
    """One paragraph: what was tried, what answered, what to check."""
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    answer, check = {
        "dns": (f"the host name {host!r} does not resolve",
                "the host name in --strata-server-url (or pytest.ini's strata_server_url)"),
        "refused": (f"the connection to {host}:{port} was refused: nothing listens on that "
                    "port",
                    f"that the server is running and listening on {host}:{port} (its --host "
                    "and --port options), or drop --strata-server-url to let Strata launch "
                    "the profile's server"),
        "timeout": (f"{host}:{port} did not answer the connection (connect timed out)",
                    "that the host is up and that no firewall drops the connection"),
    }.get(why, (f"there is no route to {host}", "the address and this machine's network"))
    return (f"Strata could not reach the server at {base_url}: it tried GET {url} and "
            f"{answer} (after {waited_s:.1f} s). Check {check}. No case ran against it; "
            "the run folder's report.md and manifest.json say so.")


def terminate_group(proc: subprocess.Popen, grace_s: float) -> int | None:
    """Stop a process started with start_new_session=True, and its whole group."""
    pgid = proc.pid  # a session leader's pgid is its pid
    if proc.poll() is None:
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Children may outlive the leader: the group gets SIGKILL either way.
    _signal_group(pgid, signal.SIGKILL)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def write_command(commands_dir: Path, name: str, payload: dict) -> Path:
    """Record a command as run (argv list, env names only) for the run folder; the
    credentials of any URL in it are hidden (configure/credentials.redact)."""
    commands_dir.mkdir(parents=True, exist_ok=True)
    path = commands_dir / f"{name}.json"
    path.write_text(json.dumps(redact_json(payload), indent=2, sort_keys=True) + "\n")
    return path


def process_counters(server: Server) -> Callable[[], tuple[float, int, int]] | None:
    """Per-request counters of the server's process tree (launched servers only)."""
    if server.pid is None:
        return None
    from strata_plugin.agent.procfs import TreeCounters

    return TreeCounters(server.pid)  # pickles: the pool's workers read it per request
