"""The process behind an attached server's port, when that server runs on this machine.

``--strata-server-url http://127.0.0.1:8000`` names a server Strata did not start, so
it has no PID for it; without one the agent cannot follow the server's CPU, faults,
threads and cgroup, and the CPU rules cannot decide. A server listening on a loopback
address is on this machine: the socket listening on its port (``/proc/net/tcp``,
``/proc/net/tcp6``, state 0A = LISTEN, proc(5)) belongs to the process that holds its
inode among its file descriptors (``/proc/<pid>/fd/* -> socket:[inode]``). Processes
of other users are not readable without privileges: then the answer is None, as before.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

_LISTEN = "0A"


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (any address, IPv4 or IPv6)."""
    out: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != _LISTEN:
                continue
            try:
                local_port = int(f[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if local_port == port and f[9] != "0":
                out.add(f[9])
    return out


def socket_owner(inodes: set[str], proc: Path = Path("/proc")) -> int | None:
    """The lowest PID holding one of these socket inodes (a forking server's parent)."""
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    owners = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(entry / "fd" / fd) in wanted:
                    owners.append(int(entry.name))
                    break
            except OSError:
                continue
    return min(owners) if owners else None


def attached_server_pid(base_url: str, proc: Path = Path("/proc")) -> int | None:
    """The PID of the process listening on a loopback URL's port, or None (another host,
    no such listener, or not allowed to see it)."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    if not _is_loopback(host):
        return None
    return socket_owner(listening_inodes(port, proc), proc)
