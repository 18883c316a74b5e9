"""Checks before any server starts: a run on a busy port or a busy GPU measures the wrong thing.

:func:`preflight` returns one :class:`PreflightCheck` per fact checked; the
harness stops the run on the first failure with its detail
(:func:`require_preflight` raises :class:`PreflightError`). A check that cannot
be made here (no NVML on a CPU-only host) passes as ``skipped`` with the reason,
so the record shows it was not silently left out.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from strata_plugin.agent import nvml_lib
from strata_plugin.errors import StrataError

#: A node check returns True/None when reachable, or False / a reason string when not.
NodeCheck = Callable[[], "bool | str | None"]


@dataclass(frozen=True)
class PreflightCheck:
    name: str
    ok: bool
    detail: str
    skipped: bool = False


class PreflightError(StrataError, RuntimeError):
    """At least one preflight check failed; ``checks`` holds all of them."""

    def __init__(self, checks: list[PreflightCheck]) -> None:
        failed = [c for c in checks if not c.ok]
        super().__init__("preflight failed: " + "; ".join(f"{c.name}: {c.detail}" for c in failed))
        self.checks = checks
        self.failed = failed


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f[9])
        except OSError:
            continue
    return inodes


def port_holders(port: int) -> list[tuple[int, str]]:
    """(pid, command name) of processes listening on TCP ``port`` (best effort, Linux)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    targets = {f"socket:[{i}]" for i in inodes}
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in targets:
                    with open(f"/proc/{name}/comm") as fh:
                        out.append((int(name), fh.read().strip()))
                    break
            except OSError:
                continue
    return out


def check_port_free(port: int, host: str = "0.0.0.0") -> PreflightCheck:
    """Free when we can bind it (SO_REUSEADDR, as servers do) on ``host``."""
    name = f"port {port} free"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        holders = port_holders(port)
        who = ", ".join(f"pid {p} ({c})" for p, c in holders) or "unknown process"
        why = "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        return PreflightCheck(name, False, f"{host}:{port} {why} by {who}")
    finally:
        sock.close()
    return PreflightCheck(name, True, f"{host}:{port} bindable")


def check_tools(
    tools: Iterable[str], which: Callable[[str], str | None] = shutil.which
) -> list[PreflightCheck]:
    out = []
    for tool in tools:
        path = which(tool)
        out.append(
            PreflightCheck(
                f"tool {tool}", path is not None, path if path else f"{tool} not found on PATH"
            )
        )
    return out


def check_nodes(nodes: Mapping[str, NodeCheck]) -> list[PreflightCheck]:
    out = []
    for node, probe in nodes.items():
        name = f"node {node} reachable"
        try:
            res = probe()
        except Exception as e:
            out.append(PreflightCheck(name, False, f"{type(e).__name__}: {e}"))
            continue
        if res is None or res is True:
            out.append(PreflightCheck(name, True, "reachable"))
        else:
            out.append(PreflightCheck(name, False, res if isinstance(res, str) else "unreachable"))
    return out


def check_gpus_idle(
    nvml: Any | None = None,
    max_used_mib: float = 1024.0,
    allow_pids: Iterable[int] = (),
) -> list[PreflightCheck]:
    """One check per GPU: no compute/graphics process and at most ``max_used_mib`` in use."""
    nv, reason = nvml_lib.load_nvml(nvml)
    if nv is None:
        return [PreflightCheck("gpus idle", True, f"skipped: {reason}", skipped=True)]
    allowed = set(allow_pids)
    out = []
    try:
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            return [PreflightCheck("gpus idle", True, "skipped: NVML found no GPUs", skipped=True)]
        for i in range(count):
            name = f"gpu{i} idle"
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                procs = []
                for fn in (
                    "nvmlDeviceGetComputeRunningProcesses",
                    "nvmlDeviceGetGraphicsRunningProcesses",
                ):
                    if hasattr(nv, fn):
                        procs += [p for p in getattr(nv, fn)(h) if p.pid not in allowed]
                used_mib = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
            except Exception as e:
                out.append(PreflightCheck(name, False, nvml_lib.error_text(nv, e)))
                continue
            if procs:
                held = ", ".join(
                    f"pid {p.pid} ({_comm(p.pid)}) {_mib(getattr(p, 'usedGpuMemory', None))}"
                    for p in procs
                )
                out.append(PreflightCheck(name, False, f"held by {held}"))
            elif used_mib > max_used_mib:
                out.append(
                    PreflightCheck(
                        name,
                        False,
                        f"{used_mib:.0f} MiB in use with no visible process (another container?)",
                    )
                )
            else:
                out.append(PreflightCheck(name, True, f"{used_mib:.0f} MiB used, no processes"))
    finally:
        nvml_lib.shutdown(nv)
    return out


def _mib(used: int | None) -> str:
    return "?" if used is None else f"{used / 2**20:.0f} MiB"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "not visible here"


def preflight(
    ports: Iterable[int] = (),
    tools: Iterable[str] = (),
    nodes: Mapping[str, NodeCheck] | None = None,
    gpus: bool = True,
    nvml: Any | None = None,
    host: str = "0.0.0.0",
    max_gpu_used_mib: float = 1024.0,
) -> list[PreflightCheck]:
    """Run every check; the harness stops the run if any has ``ok=False``."""
    checks = [check_port_free(p, host) for p in ports]
    checks += check_tools(tools)
    checks += check_nodes(nodes or {})
    if gpus:
        checks += check_gpus_idle(nvml, max_used_mib=max_gpu_used_mib)
    return checks


def require_preflight(checks: list[PreflightCheck]) -> list[PreflightCheck]:
    """Return ``checks`` when all passed; raise PreflightError naming the failures otherwise."""
    if any(not c.ok for c in checks):
        raise PreflightError(checks)
    return checks
