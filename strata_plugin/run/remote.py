"""Remote nodes over ssh: the sampling agent and server commands, torn down on every path.

Why it is shaped this way:

* The remote node needs nothing but ``python3`` and an sshd. The agent package is
  shipped over the ssh connection itself, as a zip behind a one-line JSON header on
  stdin; a small bootstrap (``python3 -c``) imports it from memory, so nothing is
  written on the remote disk and nothing is left there afterwards. The agent's stdin is
  its control channel: the header and zip go first, the control lines follow on the
  same stream.
* The header is written by a local helper process (``python -m strata_plugin.run.remote
  agent|run -- ssh ...``). It lets :class:`AgentHandle` and ``service.Server`` start a
  remote command from a plain argv, the way they start a local one.
* A remote server command runs under a guard (in this same file, shipped as
  ``strata_remote``) that starts it in its own process group and kills that group when
  its stdin reaches EOF, which is what the remote side sees when the ssh session ends
  for any reason: stopped, ssh killed, connection lost (ServerAlive* notices a dead
  link within 15 s). Env values travel in the header, never on a command line.
* Keys and users come from the user's ssh configuration and agent. Nothing here
  stores or logs them; ``STRATA_SSH_CONFIG`` may name an ssh config file (``-F``).

This module imports only the standard library at module level: it is also the remote
side (module ``strata_remote``), which may run on a Python as old as 3.8.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: Options every ssh call gets: no tty (binary-safe stdin), never prompt, notice a
#: dead link in 15 s, give up connecting after 10 s.
SSH_BASE_OPTIONS: tuple[str, ...] = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=10",
)
SSH_CONFIG_ENV = "STRATA_SSH_CONFIG"
REMOTE_MODULE = "strata_remote"
AGENT_MODULE = "strata_agent"
_ENV_RX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AGENT_DIR = Path(__file__).resolve().parents[1] / "agent"

#: Runs on the remote node as ``python3 -c BOOTSTRAP ARGS...``: reads the header line
#: and the zip from stdin, imports from memory, hands over to ``strata_remote``.
BOOTSTRAP = r"""
import hashlib, importlib.abc, importlib.util, io, json, sys, zipfile
inp = sys.stdin.buffer
head = json.loads(inp.readline())
data = inp.read(head["zip_bytes"])
if hashlib.sha256(data).hexdigest() != head["sha256"]:
    sys.stderr.write("strata bootstrap: the zip arrived damaged\n")
    sys.exit(97)
with zipfile.ZipFile(io.BytesIO(data)) as z:
    files = {n: z.read(n) for n in z.namelist()}
class Zip(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def where(self, name):
        base = name.replace(".", "/")
        for p in (base + "/__init__.py", base + ".py"):
            if p in files:
                return p
    def find_spec(self, name, path=None, target=None):
        p = self.where(name)
        if p:
            return importlib.util.spec_from_loader(
                name, self, origin="strata-zip:" + p, is_package=p.endswith("__init__.py"))
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        p = self.where(module.__name__)
        module.__file__ = "strata-zip:" + p
        exec(compile(files[p], module.__file__, "exec"), module.__dict__)
class Fallback(Zip):
    def find_spec(self, name, path=None, target=None):
        if name in head.get("fallback", ()):
            return Zip.find_spec(self, name, path, target)
class Own(Zip):
    def find_spec(self, name, path=None, target=None):
        if name not in head.get("fallback", ()):
            return Zip.find_spec(self, name, path, target)
sys.meta_path.insert(0, Own())
sys.meta_path.append(Fallback())
import strata_remote
sys.exit(strata_remote.remote_main(head, sys.argv[1:]))
"""


# --- building commands (local side) -------------------------------------------------------


def ssh_options_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``-F <file>`` when ``STRATA_SSH_CONFIG`` names an ssh config file, else nothing."""
    path = (os.environ if env is None else env).get(SSH_CONFIG_ENV, "")
    return ("-F", path) if path else ()


def ssh_argv(
    ssh_host: str,
    remote_argv: Sequence[str],
    ssh_options: Sequence[str] = (),
    ssh: str = "ssh",
) -> list[str]:
    """``ssh <options> -- HOST '<quoted remote argv>'``.

    ``--`` ends ssh's options right before the host: OpenSSH parses options again after
    the host unless ``--`` came first (``ssh HOST -p 99`` sets the port). ssh joins its
    trailing arguments into one line for the remote shell, so the remote argv is quoted
    here, element by element (regexes and code contain shell characters).
    """
    from strata_plugin.configure.names import valid_ssh_host  # the local side only

    if not valid_ssh_host(ssh_host):
        raise ValueError(f"not an ssh host (a host name, an address or user@host): "
                         f"{ssh_host!r}")
    return [ssh, *SSH_BASE_OPTIONS, *ssh_options, "--", ssh_host, shlex.join(remote_argv)]


def probe_argv(
    ssh_host: str, ssh_options: Sequence[str] | None = None, ssh: str = "ssh"
) -> list[str]:
    """The preflight's reachability probe, ``ssh ... -- HOST true``: the same options and
    ssh config (``STRATA_SSH_CONFIG``) the agents and workers will use."""
    opts = ssh_options_from_env() if ssh_options is None else tuple(ssh_options)
    return ssh_argv(ssh_host, ["true"], opts, ssh)


def _agent_args(local_agent_argv: Sequence[str]) -> list[str]:
    """The agent's own options out of ``[python, -m, module, (agent), options...]``."""
    argv = list(local_agent_argv)
    try:
        i = argv.index("-m")
    except ValueError:
        raise ValueError(f"not an agent command (no -m): {argv!r}") from None
    module, rest = argv[i + 1], argv[i + 2 :]
    if module == "strata_plugin":
        if not rest or rest[0] != "agent":
            raise ValueError(f"not an agent command: {argv!r}")
        rest = rest[1:]
    return rest


def remote_agent_argv(
    ssh_host: str,
    local_agent_argv: Sequence[str],
    *,
    ssh_options: Sequence[str] | None = None,
    ship: bool = True,
    remote_python: str = "python3",
    remote_module: str = AGENT_MODULE,
    python: str = sys.executable,
    ssh: str = "ssh",
    env_names: Iterable[str] = (),
) -> list[str]:
    """The command that runs the same agent on ``ssh_host`` (for ``AgentHandle.start``).

    ``env_names``: variables of the helper's environment the agent gets too (a secret,
    such as the scrape's credentials): they travel in the header on ssh's stdin, never
    in an argv (``ship=True`` only).

    ``ship=True``: the agent package travels over the connection (the remote node needs
    only ``remote_python``). ``ship=False``: an installed copy, ``python3 -m
    strata_agent`` (see docs/agent.md, "Running on a remote node"). ``ssh_options``
    defaults to :func:`ssh_options_from_env`.
    """
    opts = ssh_options_from_env() if ssh_options is None else tuple(ssh_options)
    args = _agent_args(local_agent_argv)
    if not ship:
        return ssh_argv(ssh_host, [remote_python, "-m", remote_module, *args], opts, ssh)
    args, modules = _plugin_collectors(args)
    remote = [remote_python, "-c", BOOTSTRAP, *args]
    names = [x for n in env_names if _ENV_RX.match(n) for x in ("--env", n)]
    return [
        python,
        "-m",
        "strata_plugin.run.remote",
        "agent",
        *[w for m in modules for w in ("--ship", m)],
        *names,
        "--",
        *ssh_argv(ssh_host, remote, opts, ssh),
    ]


def _plugin_collectors(args: list[str]) -> tuple[list[str], list[str]]:
    """The agent's options with each plugin collector (``--collector-module NAME=MODULE``)
    either kept, its module to travel in the zip, or turned into
    ``--collector-unavailable NAME=REASON`` when it cannot (``run/agent_plugins.py``)."""
    from strata_plugin.run.agent_plugins import ship_problem  # the local side only

    out, modules = [], []
    i = 0
    while i < len(args):
        if args[i] == "--collector-module" and i + 1 < len(args):
            name, _, module = args[i + 1].partition("=")
            problem = ship_problem(module)
            if problem is None:
                out += args[i : i + 2]
                modules.append(module)
            else:
                out += ["--collector-unavailable",
                        f"{name}=not shipped to this node, it runs on the head node only: "
                        f"{problem} (docs/extending.md, \"A collector\")"]
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out, modules


def remote_command_argv(
    ssh_host: str,
    argv: Sequence[str],
    *,
    env_names: Iterable[str] = (),
    grace_s: float = 10.0,
    ssh_options: Sequence[str] | None = None,
    remote_python: str = "python3",
    python: str = sys.executable,
    ssh: str = "ssh",
) -> list[str]:
    """The command that runs ``argv`` on ``ssh_host`` under the guard.

    Works as a ``LaunchSpec.argv`` for ``service.Server``: the env variables *named* in
    ``env_names`` are read from the helper's environment (``LaunchSpec.env``) and sent
    to the remote side in the header. SIGTERM to the helper ends the ssh session
    cleanly; the guard then stops the remote process group (SIGTERM, ``grace_s``,
    SIGKILL).
    """
    opts = ssh_options_from_env() if ssh_options is None else tuple(ssh_options)
    names = list(env_names)
    for n in names:
        if not _ENV_RX.match(n):
            raise ValueError(f"not an environment variable name: {n!r}")
    helper = [python, "-m", "strata_plugin.run.remote", "run", "--grace", repr(float(grace_s))]
    for n in names:
        helper += ["--env", n]
    remote = [remote_python, "-c", BOOTSTRAP, *argv]
    return [*helper, "--", *ssh_argv(ssh_host, remote, opts, ssh)]


_ZIP_CACHE: dict[str, bytes] = {}


#: Modules the zip carries only as a fallback: the remote node's own copy wins, and a
#: node without one still gets GPU data (``nvidia-ml-py``'s single-file ``pynvml``).
FALLBACK_MODULES = ("pynvml",)


def _fallback_sources() -> dict[str, bytes]:
    """``{zip name: source}`` of each fallback module installed here as one .py file."""
    import importlib.util

    out = {}
    for name in FALLBACK_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec else None
        if origin and origin.endswith(".py") and spec and not spec.submodule_search_locations:
            out[f"{name}.py"] = Path(origin).read_bytes()
    return out


def agent_zip(plugin_modules: Sequence[str] = ()) -> bytes:
    """The agent package as ``strata_agent/``, this file as ``strata_remote.py``, the
    fallback modules (``pynvml``) installed here, and the plugin collector modules
    named (each one file; ``run/agent_plugins.py`` says which can travel).

    Deterministic (fixed dates, sorted names), so its sha256 identifies the code shipped.
    """
    key = "zip:" + ",".join(sorted(plugin_modules))
    if key in _ZIP_CACHE:
        return _ZIP_CACHE[key]
    plugins: dict[str, bytes] = {}
    if plugin_modules:
        from strata_plugin.run.agent_plugins import zip_files  # the local side only

        plugins = zip_files(tuple(plugin_modules))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(_AGENT_DIR.rglob("*.py")):
            rel = path.relative_to(_AGENT_DIR).as_posix()
            _zip_add(z, f"{AGENT_MODULE}/{rel}", path.read_bytes())
        _zip_add(z, f"{REMOTE_MODULE}.py", Path(__file__).read_bytes())
        for name, data in sorted({**_fallback_sources(), **plugins}.items()):
            _zip_add(z, name, data)
    _ZIP_CACHE[key] = buf.getvalue()
    return _ZIP_CACHE[key]


def _zip_add(z: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, data)


def header(mode: str, data: bytes, **extra: Any) -> bytes:
    """The first line on the remote stdin, then the zip itself."""
    head = {"mode": mode, "zip_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "fallback": list(FALLBACK_MODULES)}
    head.update(extra)
    return json.dumps(head, separators=(",", ":")).encode() + b"\n"


# --- the local helper: python -m strata_plugin.run.remote agent|run -- ssh ... -----------------


def _write_all(f: IO[bytes], data: bytes) -> None:
    """A raw pipe may take part of a write (a signal arrived): loop until all is written."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise BrokenPipeError("short write")
        view = view[n:]


def _pdeathsig(sig: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get ``sig`` when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def set_it() -> None:
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG

    return set_it


class _Helper:
    """Writes the header and zip into ssh's stdin, then relays (agent) or holds (run) it.

    ssh runs in its own session so a signal to the caller's process group reaches only
    this helper, which then ends the session gracefully (EOF), and forcefully on a
    second signal or after ``grace_s`` + 10 s. If the helper itself is killed, ssh gets
    SIGTERM (parent-death signal) and the remote side sees the connection close.
    """

    def __init__(self, mode: str, ssh_cmd: list[str], env_names: list[str], grace_s: float,
                 ship: Sequence[str] = ()):
        self.mode = mode
        self.ssh_cmd = ssh_cmd
        self.env_names = env_names
        self.grace_s = grace_s
        self.ship = tuple(ship)  # plugin collector modules that travel in the zip
        self.proc: subprocess.Popen[bytes] | None = None
        self.closing = threading.Event()
        self.signals = 0

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        if self.signals == 1:
            self.closing.set()
            self._close_stdin()
            threading.Timer(self.grace_s + 10.0, self._kill, (signal.SIGTERM,)).start()
        else:
            self._kill(signal.SIGTERM)

    def _kill(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass

    def _relay(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            while True:
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                _write_all(self.proc.stdin, chunk)
        except (OSError, ValueError):
            pass
        self._close_stdin()

    def run(self) -> int:
        data = agent_zip(self.ship)
        extra: dict[str, Any] = {}
        extra["env"] = {n: os.environ[n] for n in self.env_names if n in os.environ}
        if self.mode == "run":
            extra["grace_s"] = self.grace_s
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        self.proc = subprocess.Popen(
            self.ssh_cmd,
            stdin=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            preexec_fn=_pdeathsig(signal.SIGTERM),
        )
        # ssh now owns our stdout: drop our copy so its end closes the reader's pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        try:
            assert self.proc.stdin is not None
            _write_all(self.proc.stdin, header(self.mode, data, **extra) + data)
        except (OSError, ValueError):
            pass  # ssh already gone: its exit status says why
        if self.closing.is_set():  # a signal came before ssh existed: end the session now
            self._close_stdin()
        if self.mode == "agent" and not self.closing.is_set():
            threading.Thread(target=self._relay, name="relay", daemon=True).start()
        while True:
            try:
                rc = self.proc.wait()
                break
            except InterruptedError:
                continue
        return rc


def _exit_like(rc: int) -> None:
    """Leave with ssh's status; a signal that killed ssh kills us too, so callers see it."""
    sys.stdout.flush()
    if rc < 0:
        sig = -rc
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        os.kill(os.getpid(), sig)
        time.sleep(1.0)
        os._exit(128 + sig)
    os._exit(rc)


def helper_main(argv: list[str]) -> int:
    """``agent [--ship MODULE]... -- SSH...`` or ``run [--grace S] [--env NAME]... --
    SSH...``."""
    if not argv or argv[0] not in ("agent", "run") or "--" not in argv:
        sys.stderr.write(
            "usage: python -m strata_plugin.run.remote agent|run [--grace S] [--env NAME]... "
            "[--ship MODULE]... -- ssh ...\n"
        )
        return 2
    mode = argv[0]
    split = argv.index("--")
    opts, ssh_cmd = argv[1:split], argv[split + 1 :]
    grace, names, ship = 10.0, [], []
    i = 0
    while i < len(opts):
        if opts[i] == "--grace" and i + 1 < len(opts):
            grace = float(opts[i + 1])
        elif opts[i] == "--env" and i + 1 < len(opts):
            names.append(opts[i + 1])
        elif opts[i] == "--ship" and i + 1 < len(opts):
            ship.append(opts[i + 1])
        else:
            sys.stderr.write(f"strata remote: unknown option {opts[i]!r}\n")
            return 2
        i += 2
    if not ssh_cmd:
        sys.stderr.write("strata remote: no ssh command after --\n")
        return 2
    try:
        rc = _Helper(mode, ssh_cmd, names, grace, ship).run()
    except OSError as e:
        sys.stderr.write(f"strata remote: cannot start {ssh_cmd[0]}: {e}\n")
        return 255
    _exit_like(rc)
    return rc  # not reached


# --- a remote command handle (local side) -------------------------------------------------


class RemoteProcess:
    """A command running on a remote node under the guard (e.g. an engine's worker).

    Same shape as ``service.Server`` where it matters (``pid``, ``alive()``,
    ``exit_code()``, ``stop()``, ``log_path``), without a health URL: workers of a
    multi-node engine have none.
    """

    def __init__(
        self,
        node: str,
        argv: list[str],
        proc: subprocess.Popen[bytes],
        log_path: Path,
        grace_s: float,
    ) -> None:
        self.node = node
        self.argv = argv
        self.proc = proc
        self.log_path = log_path
        self.grace_s = grace_s

    @classmethod
    def start(
        cls,
        node: str,
        ssh_host: str,
        argv: Sequence[str],
        log_path: Path | str,
        *,
        env: Mapping[str, str] | None = None,
        grace_s: float = 10.0,
        ssh_options: Sequence[str] | None = None,
        remote_python: str = "python3",
        ssh: str = "ssh",
    ) -> RemoteProcess:
        """Start ``argv`` on ``ssh_host``; its stdout and stderr go to ``log_path``."""
        env = dict(env or {})
        cmd = remote_command_argv(
            ssh_host,
            argv,
            env_names=sorted(env),
            grace_s=grace_s,
            ssh_options=ssh_options,
            remote_python=remote_python,
            ssh=ssh,
        )
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        run_env = dict(os.environ)
        run_env.update(env)
        root = str(Path(__file__).resolve().parents[2])  # where strata_plugin is importable
        run_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, run_env.get("PYTHONPATH", "")) if p
        )
        with path.open("ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=run_env,
                start_new_session=True,
            )
        return cls(node, cmd, proc, path, grace_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> int | None:
        """End the session (the guard stops the remote group), then make sure locally."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)  # the helper ends the ssh session
            except ProcessLookupError:
                pass
            try:
                return self.proc.wait(self.grace_s + 15.0)
            except subprocess.TimeoutExpired:
                pass
        from strata_plugin.run.server import terminate_group

        return terminate_group(self.proc, 2.0)

    def kill_group(self) -> None:
        """The reaper's last resort on a second signal: SIGKILL the local ssh helper's group
        at once; the remote guard sees the session end and stops the remote group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def on_agent_exit(out_dir: Path | str) -> Callable[[Any], None]:
    """An ``AgentHandle`` ``on_exit`` callback: note an unexpected end in unavailable.json.

    The run goes on without the node; its samples stop where the agent stopped, and
    the report's missing-signal notes then name the reason.
    """
    path = Path(out_dir) / "unavailable.json"

    def note(info: Any) -> None:
        if getattr(info, "expected", True):
            return
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data["agent"] = f"agent lost mid-run: {info.reason}"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    return note


# --- the remote side (runs as strata_remote on the node) ----------------------------------


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"[strata-remote] {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """SIGTERM the group, SIGKILL it after ``grace_s``; children that outlive the leader too."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def guard(argv: Sequence[str], env: Mapping[str, str], grace_s: float, stdin: IO[bytes]) -> int:
    """Run ``argv`` in its own process group until it exits or ``stdin`` reaches EOF.

    EOF is what the remote side sees when the ssh session ends for any reason, so the
    group never outlives the connection. SIGTERM, SIGHUP and SIGINT count as EOF.
    """
    run_env = dict(os.environ)
    run_env.update(env)
    try:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            env=run_env,
            start_new_session=True,
            preexec_fn=_pdeathsig(signal.SIGTERM),
        )
    except OSError as e:
        _say(f"cannot start {argv[0] if argv else '?'}: {e}")
        return 127
    _say(f"started pid {child.pid} (process group {child.pid})")
    done = threading.Event()

    def watch() -> None:
        try:
            while stdin.read1(65536) if hasattr(stdin, "read1") else stdin.read(65536):
                pass
        except (OSError, ValueError):
            pass
        done.set()

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    threading.Thread(target=watch, name="eof-watch", daemon=True).start()
    while not done.wait(0.2):
        if child.poll() is not None:
            break
    why = "exited" if child.poll() is not None else "session ended"
    rc = _stop_group(child, grace_s)
    _say(f"{why}; exit status {rc}")
    return 0 if rc is None else (rc if rc >= 0 else 128 - rc)


class _AgentAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On the remote node the agent is ``strata_agent``; a plugin's collector shipped
    beside it imports it as it does at home, ``strata_plugin.agent...``. This finder
    hands it the same modules under that name (one ``Collector`` class, one
    ``Unavailable``), and an empty ``strata_plugin`` package above them."""

    HOME = "strata_plugin.agent"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.util

        if name == "strata_plugin":
            return importlib.util.spec_from_loader(name, self, is_package=True)
        if name == self.HOME or name.startswith(self.HOME + "."):
            target_name = AGENT_MODULE + name[len(self.HOME):]
            found = importlib.util.find_spec(target_name)
            if found is None:
                return None
            return importlib.util.spec_from_loader(
                name, self, is_package=found.submodule_search_locations is not None)
        return None

    def __init__(self) -> None:
        self.specs: dict[str, Any] = {}

    def create_module(self, spec: Any) -> Any:
        import importlib

        if spec.name == "strata_plugin":
            return None  # a plain empty package
        module = importlib.import_module(AGENT_MODULE + spec.name[len(self.HOME):])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # already executed under its own name; the import system has just given it the
        # alias's spec: give it back its own (its relative imports follow it)
        own = self.specs.pop(getattr(module.__spec__, "name", ""), None)
        if own is not None:
            module.__spec__ = own


def remote_main(head: Mapping[str, Any], argv: list[str]) -> int:
    """Entry point of the shipped code on the remote node."""
    mode = head.get("mode")
    if mode == "agent":
        os.environ.update(head.get("env") or {})  # sent on stdin, not in any argv
        sys.argv = [AGENT_MODULE, *argv]
        sys.meta_path.insert(0, _AgentAlias())
        from strata_agent import main  # type: ignore[import-not-found]  # the shipped agent

        return main(argv)
    if mode == "run":
        if not argv:
            _say("no command given")
            return 2
        return guard(
            argv, head.get("env") or {}, float(head.get("grace_s", 10.0)), sys.stdin.buffer
        )
    _say(f"unknown mode {mode!r}")
    return 2


if __name__ == "__main__":
    sys.exit(helper_main(sys.argv[1:]))
