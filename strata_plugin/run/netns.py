"""This machine's network namespaces, NAT translations and containers, read for the path.

An engine in a container on a bridge network is a process of this machine in a network
namespace of its own: its listening socket is not in Strata's ``/proc/net/tcp`` but in
``/proc/<pid>/net/tcp`` of any process of that namespace. A port published with DNAT
(docker's and podman's default on a bridge network) has no listener on the host at all:
the connection's translation is in the connection-tracking table. This module reads both,
and the engine's cgroup to name its container; ``run/listener.py`` follows the path with
them. Everything is read from /proc and /sys; the only commands run are a container
runtime's ``ps`` and, where the connection-tracking table has no entry for a probe
connection (no ``nf_conntrack`` here to read, or the entry not shown), the NAT rules
themselves (``iptables -t nat -S``, else ``nft -j list ruleset``): argv lists, a few
seconds at most, where one is installed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.formats.request_path import Container

#: How long a container runtime's ``ps`` may take (seconds): it is asked once per path.
RUNTIME_TIMEOUT_S = 3.0
#: How long the translation of a probe connection is waited for (seconds): its entry is
#: made as the connection's first packet leaves, within the connect call.
NAT_WAIT_S = 0.15
#: The most of the connection-tracking table read at once (bytes): some 30,000 entries
#: of ~250 bytes; a table larger than that is read no further (its later entries unseen).
CONNTRACK_BYTES_MAX = 8 << 20
#: How long listing the NAT rules may take (seconds): a local netlink dump, milliseconds
#: even with thousands of rules.
NAT_RULES_TIMEOUT_S = 2.0
#: The most of a rule listing read (bytes): docker writes four rules a published port.
NAT_RULES_BYTES_MAX = 8 << 20


def ns_key(pid: int | str, proc: Path) -> str:
    """A process's network namespace as ``net:[<inode>]``; "" when it cannot be read
    (another user's process, without privileges, or gone)."""
    try:
        return os.readlink(proc / str(pid) / "ns" / "net")
    except OSError:
        return ""


def ns_inode(key: str) -> int | None:
    """The inode in ``net:[4026531840]``."""
    m = re.fullmatch(r"net:\[(\d+)\]", key)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Namespaces:
    """Every network namespace this user can see, one process to read each through."""

    through: dict[str, int]  # namespace key -> the lowest PID in it
    unreadable: int  # processes whose namespace this user may not read (another user's)


def namespaces(proc: Path) -> Namespaces:
    """One pass over /proc: each network namespace and the first PID in it."""
    through: dict[str, int] = {}
    unreadable = 0
    try:
        pids = sorted(int(e) for e in os.listdir(proc) if e.isdigit())
    except OSError:
        pids = []
    for pid in pids:
        try:
            key = os.readlink(proc / str(pid) / "ns" / "net")
        except PermissionError:  # another user's: a zombie or a gone one is ENOENT
            # root refused too (another user namespace's init, an LSM): no advice helps
            unreadable += os.geteuid() != 0
            continue
        except OSError:
            continue
        through.setdefault(key, pid)
    return Namespaces(through, unreadable)


# --- NAT: the connection-tracking table ------------------------------------------------------


def _norm(addr: str) -> str:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


def translation(net: Path, laddr: str, lport: int, raddr: str, rport: int
                ) -> tuple[str, int] | None:
    """Where a connection ``laddr:lport -> raddr:rport`` of one namespace really goes: the
    reply direction's source in its ``nf_conntrack`` entry (``raddr:rport`` itself when no
    NAT rule changed it); None when the entry is not there or the table cannot be read."""
    try:
        with open(net / "nf_conntrack", "rb") as fh:
            text = fh.read(CONNTRACK_BYTES_MAX).decode(errors="replace")
    except OSError:
        return None
    try:
        want = (_norm(laddr), str(lport), _norm(raddr), str(rport))
    except ValueError:
        return None
    keys = ("src", "dst", "sport", "dport")
    for line in text.splitlines():
        if " tcp " not in line or f"sport={lport} " not in line:
            continue
        tup = [v for k, v in (w.split("=", 1) for w in line.split() if "=" in w) if k in keys]
        if len(tup) < 8:
            continue
        src, dst, sport, dport, rsrc, _rdst, rsport, _rdport = tup[:8]
        try:
            if (_norm(src), sport, _norm(dst), dport) == want:
                return _norm(rsrc), int(rsport)
        except ValueError:
            continue
    return None


def probe_conntrack(addr: str, port: int, net: Path = Path("/proc/net"),
                    wait_s: float = NAT_WAIT_S) -> tuple[str, int] | None:
    """Where the connection-tracking entry of one probe connection to ``addr:port`` says
    it went (``addr:port`` itself when not translated); None when there is no entry to
    read (no table here, or the entry not shown): then only the rules can say."""
    if not (net / "nf_conntrack").exists():  # no connection tracking here
        return None
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
            s.connect((addr, port))
        laddr, lport = s.getsockname()[:2]
        # the entry is made as the first packet leaves (the connect call): a few reads
        for _ in range(3):
            far = translation(net, laddr, lport, addr, port)
            if far is not None:
                return far
            time.sleep(wait_s / 3)
        return None
    except OSError:
        return None
    finally:
        s.close()


# --- NAT: the rules themselves, where connection tracking has no entry -----------------------


@dataclass(frozen=True)
class DnatRule:
    """One TCP DNAT rule: connections to ``dport`` (and to ``dst``, where the rule names
    it; ``dst_negated``: to any address but those) go to ``to_addr:to_port`` (``to_port``
    None: the port unchanged). ``source``: the command it was read from."""

    dport: tuple[int, int]  # first, last (a single port: both the same)
    to_addr: str
    to_port: int | None
    dst: str | None = None  # an address or network, as the rule writes it
    dst_negated: bool = False
    source: str = ""

    def sends(self, addr: str, port: int) -> tuple[str, int] | None:
        """Where this rule sends a connection to ``addr:port``; None: not this rule's."""
        if not self.dport[0] <= port <= self.dport[1]:
            return None
        if self.dst is not None:
            try:
                inside = ipaddress.ip_address(_norm(addr)) in ipaddress.ip_network(
                    self.dst, strict=False)
            except ValueError:
                return None
            if inside == self.dst_negated:
                return None
        return self.to_addr, self.to_port if self.to_port is not None else port


def _ports(text: str) -> tuple[int, int] | None:
    try:
        first, _, last = text.partition(":")
        lo, hi = int(first), int(last or first)
    except ValueError:
        return None
    return (lo, hi) if 0 < lo <= hi <= 65535 else None


def _to_destination(text: str) -> tuple[str, int | None] | None:
    """``A``, ``A:P``, ``A:P1-P2`` (the first port), ``[v6]:P``, ``A-B:P`` (the first
    address): where a DNAT rule sends its connections."""
    if text.startswith("["):
        addr, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        addr, port_text = text.split(":")
    else:
        addr, port_text = text, ""
    addr = addr.split("-", 1)[0]
    try:
        addr = _norm(addr)
        port = int(port_text.split("-", 1)[0]) if port_text else None
    except ValueError:
        return None
    if port is not None and not 0 < port <= 65535:
        return None
    return addr, port


def parse_iptables_nat(text: str, source: str = "iptables -t nat -S") -> tuple[DnatRule, ...]:
    """The TCP DNAT rules of ``iptables -t nat -S`` (``-A CHAIN ... -p tcp ... --dport P
    -j DNAT --to-destination A:P2``), in order; other rules are passed over."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "-A" or "DNAT" not in words:
            continue
        opts: dict[str, str] = {}
        negated: set[str] = set()
        i = 2
        while i < len(words):
            w = words[i]
            if w == "!" and i + 1 < len(words):
                negated.add(words[i + 1])
                i += 1
                continue
            if w.startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
                opts.setdefault(w, words[i + 1])
                i += 2
                continue
            i += 1
        if opts.get("-j") != "DNAT" or opts.get("-p") != "tcp" or "--dport" in negated:
            continue
        ports = _ports(opts.get("--dport", "1:65535"))
        to = _to_destination(opts.get("--to-destination", ""))
        if ports is None or to is None:
            continue
        dst = opts.get("-d") or opts.get("--destination")
        out.append(DnatRule(ports, to[0], to[1], dst, "-d" in negated or "--destination"
                            in negated, source))
    return tuple(out)


def parse_nft_ruleset(ruleset: object, source: str = "nft -j list ruleset"
                      ) -> tuple[DnatRule, ...]:
    """The TCP DNAT rules of ``nft -j list ruleset`` written in nftables' own terms
    (``tcp dport P ... dnat to A:P2``); iptables' rules shown there as ``xt`` targets
    carry no destination (``iptables -t nat -S`` reads those)."""
    items = ruleset.get("nftables") if isinstance(ruleset, dict) else None
    out = []
    for item in items if isinstance(items, list) else ():
        rule = item.get("rule") if isinstance(item, dict) else None
        exprs = rule.get("expr") if isinstance(rule, dict) else None
        if not isinstance(exprs, list):
            continue
        ports: tuple[int, int] | None = None
        dst: str | None = None
        negated = False
        to: tuple[str, int | None] | None = None
        for e in exprs:
            if not isinstance(e, dict):
                continue
            m = e.get("match")
            if isinstance(m, dict):
                left = m.get("left")
                payload = left.get("payload") if isinstance(left, dict) else None
                field = payload.get("field") if isinstance(payload, dict) else None
                right, op = m.get("right"), m.get("op", "==")
                proto = payload.get("protocol") if isinstance(payload, dict) else None
                if field == "dport" and proto == "tcp" and op == "==":
                    if isinstance(right, int):
                        ports = (right, right)
                    elif isinstance(right, dict) and isinstance(right.get("range"), list):
                        lo, hi = (right["range"] + [0, 0])[:2]
                        ports = (lo, hi) if isinstance(lo, int) and isinstance(hi, int) \
                            else None
                elif field == "daddr" and isinstance(right, str):
                    dst, negated = right, op == "!="
                elif field == "daddr" and isinstance(right, dict) and \
                        isinstance(right.get("prefix"), dict):
                    pre = right["prefix"]
                    dst, negated = f"{pre.get('addr')}/{pre.get('len')}", op == "!="
            d = e.get("dnat")
            if isinstance(d, dict) and isinstance(d.get("addr"), str):
                port = d.get("port")
                to = (d["addr"], port if isinstance(port, int) else None)
        if ports is None or to is None:
            continue
        try:
            out.append(DnatRule(ports, _norm(to[0]), to[1], dst, negated, source))
        except ValueError:
            continue
    return tuple(out)


def _listing(argv: list[str], timeout_s: float) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # not allowed (no CAP_NET_ADMIN), or no such table
        return None
    return done.stdout[:NAT_RULES_BYTES_MAX].decode(errors="replace")


def nat_rules(timeout_s: float = NAT_RULES_TIMEOUT_S) -> tuple[DnatRule, ...]:
    """This namespace's TCP DNAT rules: iptables' (``iptables -t nat -S``), then
    nftables' own (``nft -j list ruleset``); none where neither is installed or this user
    may not list them."""
    rules: list[DnatRule] = []
    text = _listing(["iptables", "-t", "nat", "-S"], timeout_s)
    if text is not None:
        rules.extend(parse_iptables_nat(text))
    text = _listing(["nft", "-j", "list", "ruleset"], timeout_s)
    if text is not None:
        try:
            rules.extend(parse_nft_ruleset(json.loads(text)))
        except ValueError:
            pass
    return tuple(rules)


def nat_destination(addr: str, port: int, net: Path,
                    rules: Callable[[], tuple[DnatRule, ...]], wait_s: float = NAT_WAIT_S
                    ) -> tuple[tuple[str, int], str] | None:
    """Where a NAT rule sends a connection to ``addr:port``, and how that was read: a probe
    connection's connection-tracking entry, else (no entry to read) the rules themselves,
    listed by ``rules`` only then. None: not translated, or nothing says."""
    seen = probe_conntrack(addr, port, net, wait_s)
    if seen is not None:
        return None if seen == (_norm(addr), port) else (seen, "connection tracking")
    hit = rule_translation(rules(), addr, port)
    if hit is None:
        return None
    return hit[0], rule_read(hit[1])


def rule_read(rule: DnatRule) -> str:
    """How a translation found in the rules is said in the path's notes."""
    return f"the rule read from `{rule.source}`: connection tracking had no entry"


def rule_translation(rules: tuple[DnatRule, ...], addr: str, port: int
                     ) -> tuple[tuple[str, int], DnatRule] | None:
    """Where the first of ``rules`` that matches sends a connection to ``addr:port``, and
    that rule; None: no rule for it."""
    for rule in rules:
        far = rule.sends(addr, port)
        if far is not None:
            return far, rule
    return None


# --- cgroups and containers ------------------------------------------------------------------

_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")
#: The runtime by the cgroup path's words around the id: podman's ``libpod-<id>.scope``,
#: docker's ``docker-<id>.scope`` or ``/docker/<id>``, containerd's ``cri-containerd-``,
#: CRI-O's ``crio-``.
_RUNTIMES = (("libpod", "podman"), ("docker", "docker"), ("cri-containerd", "containerd"),
             ("crio", "cri-o"), ("containerd", "containerd"))


def cgroup_of(pid: int, proc: Path) -> str:
    """A process's cgroup, as ``/proc/<pid>/cgroup`` names it: the v2 (unified) path where
    it is not the root, else the v1 cpu controller's, else the memory controller's (a
    hybrid host puts its limits there), else the v2 path; "" when not readable."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return ""
    paths: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in (parts[1] or "v2").split(","):
                paths.setdefault(ctrl, parts[2])
    for ctrl in ("v2", "cpu", "memory"):
        if paths.get(ctrl, "/") != "/":
            return paths[ctrl]
    return paths.get("v2", "")


def _cgroup_text(pid: int, proc: Path) -> str:
    try:
        return (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return ""


def container_in(cgroup: str) -> tuple[str, str] | None:
    """(runtime, id) where the cgroup path holds a container's id; None elsewhere."""
    found = list(_ID.finditer(cgroup))
    if not found:
        return None
    m = found[-1]
    before = cgroup[:m.start()].lower()
    tail = before.rsplit("/", 2)[-2:] if "/" in before else [before]
    words = "/".join(tail)
    runtime = next((name for word, name in _RUNTIMES if word in words), "container")
    return runtime, m.group(1)


def _ps(runtime: str) -> list[list[str]]:
    if runtime == "podman":
        return [["podman", "ps", "--format", "json"]]
    if runtime == "docker":
        return [["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"]]
    return []


def container_name(runtime: str, cid: str, timeout_s: float = RUNTIME_TIMEOUT_S) -> str:
    """The container's name as its runtime here says; "" when no runtime answers."""
    for argv in _ps(runtime):
        if shutil.which(argv[0]) is None:
            continue
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                 stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if argv[0] == "podman":
            try:
                rows = json.loads(out or "[]")
            except ValueError:
                continue
            for row in rows if isinstance(rows, list) else ():
                if isinstance(row, dict) and str(row.get("Id", "")) == cid:
                    names = row.get("Names") or []
                    return str(names[0] if isinstance(names, list) and names else names)
        else:
            for line in out.splitlines():
                got = line.split(None, 1)
                if len(got) == 2 and got[0] == cid:
                    return got[1].strip()
    return ""


def _conmon_name(pid: int, cid: str, proc: Path) -> str:
    """The container's name as its ``conmon`` parent was given it (podman's and CRI-O's
    monitor: ``-c <id> ... -n <name>``): no runtime command, whatever storage it uses."""
    for _ in range(8):
        try:
            stat = (proc / str(pid) / "stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            argv = (proc / str(pid) / "cmdline").read_bytes().decode(
                errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            return ""
        if pid <= 1:
            return ""
        if os.path.basename(argv[0]) != "conmon":
            continue
        opts: dict[str, str] = {}
        for k, v in itertools.pairwise(argv):
            opts.setdefault(k, v)  # an option's first place: later ones are other options' values
        if (opts.get("-c") or opts.get("--cid")) == cid:
            return opts.get("-n") or opts.get("--name") or ""
        return ""
    return ""


def container_of(pid: int, proc: Path, names: dict[str, str] | None = None
                 ) -> tuple[str, Container | None]:
    """A process's cgroup and, where the cgroup names a container, that container.
    ``names``: the names already asked for, by id (one ``ps`` per container)."""
    cgroup = cgroup_of(pid, proc)
    found = container_in(cgroup) or next(  # a hybrid host: the id in a v1 line only
        (c for c in map(container_in, _cgroup_text(pid, proc).splitlines()) if c), None)
    if found is None:
        return cgroup, None
    runtime, cid = found
    cache = {} if names is None else names
    if cid not in cache:
        cache[cid] = _conmon_name(pid, cid, proc) or container_name(runtime, cid)
    return cgroup, Container(runtime, cid, cache[cid])
