"""Counters that should not move during a run, compared between a node's static
snapshots (``nodes/<node>/static/before`` and ``after``).

A NIC error or drop, an RDMA link error or a GPU ECC error, retired page or remapped
row that appears between the two snapshots is a fault of the platform under the
measurement: the report names it next to the environment, whatever the verdicts say.
One owner for which counters those are: the name patterns below.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: NIC counters (kernel statistics and ``ethtool -S``) whose growth is an error.
NIC_ERROR = re.compile(r"(err|drop|crc|fifo|miss|discard|collision|carrier|abort|timeout|"
                       r"no_buf|nobuf|oversize|undersize|fragment|jabber)", re.I)
#: RDMA port counters (``counters/`` and ``hw_counters/``) whose growth is an error.
RDMA_ERROR = re.compile(r"(error|err$|_err_|discard|downed|drop|out_of_|seq_err|retry_exc|"
                        r"rnr_nak|VL15|overrun|implied_nak|duplicate_request|local_ack_timeout)",
                        re.I)
#: GPU health counters from the snapshot's gpus.json (agent/snapshot._gpu_health).
GPU_KEYS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
            "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe",
            "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
            "remapped_rows_failure")
#: Port facts that should not change either: a link that went down or renegotiated.
STATE_KEYS = ("operstate", "speed", "state", "phys_state", "rate")


@dataclass(frozen=True)
class Moved:
    """One counter (or link state) that changed between before and after on a node."""

    node: str
    where: str  # "nic eth0", "rdma mlx5_0/1", "gpu0"
    name: str
    before: object
    after: object

    def line(self) -> str:
        if isinstance(self.before, int) and isinstance(self.after, int):
            return (f"{self.node} {self.where}: {self.name} {self.before} -> {self.after} "
                    f"(+{self.after - self.before})")
        return f"{self.node} {self.where}: {self.name} {self.before} -> {self.after}"


@dataclass(frozen=True)
class NodeStatic:
    """What a node's snapshots hold: which were taken and what moved between them."""

    node: str
    before: bool
    after: bool
    moved: tuple[Moved, ...]
    errors: dict[str, str]  # tool or fact -> why it is missing (from the snapshots)
    facts: dict[str, Any]  # a few headline facts for the report (JSON values)


def _load(folder: Path, name: str) -> dict:
    try:
        data = json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _counters(where: str, node: str, a: dict, b: dict, pattern: re.Pattern[str]) -> list[Moved]:
    out = []
    for name in sorted(set(a) & set(b)):
        va, vb = a[name], b[name]
        if pattern.search(name) and isinstance(va, int) and isinstance(vb, int) and vb > va:
            out.append(Moved(node, where, name, va, vb))
    return out


def _states(where: str, node: str, a: dict, b: dict) -> list[Moved]:
    return [Moved(node, where, k, a.get(k), b.get(k)) for k in STATE_KEYS
            if k in a and k in b and a.get(k) != b.get(k)]


def moved_counters(node: str, before: Path, after: Path) -> list[Moved]:
    out: list[Moved] = []
    nb, na = _load(before, "nics.json"), _load(after, "nics.json")
    for iface in sorted(set(nb) & set(na)):
        a, b = nb[iface], na[iface]
        out += _states(f"nic {iface}", node, a, b)
        for key in ("statistics", "ethtool_stats"):
            out += _counters(f"nic {iface}", node, a.get(key) or {}, b.get(key) or {},
                             NIC_ERROR)
    rb, ra = _load(before, "rdma.json"), _load(after, "rdma.json")
    for port in sorted(set(rb) & set(ra)):
        a, b = rb[port], ra[port]
        out += _states(f"rdma {port}", node, a, b)
        for key in ("counters", "hw_counters"):
            out += _counters(f"rdma {port}", node, a.get(key) or {}, b.get(key) or {},
                             RDMA_ERROR)
    gb = {g.get("index"): g for g in _load(before, "gpus.json").get("gpus", [])}
    ga = {g.get("index"): g for g in _load(after, "gpus.json").get("gpus", [])}
    for idx in sorted(set(gb) & set(ga), key=str):
        a = {k: gb[idx].get(k) for k in GPU_KEYS}
        b = {k: ga[idx].get(k) for k in GPU_KEYS}
        out += _counters(f"gpu{idx}", node, a, b, re.compile("."))
    return out


def node_static(node_dir: Path) -> NodeStatic:
    """The static snapshots of one node folder, and the counters that moved."""
    before, after = node_dir / "static" / "before", node_dir / "static" / "after"
    has_b, has_a = before.is_dir(), after.is_dir()
    moved = moved_counters(node_dir.name, before, after) if has_b and has_a else []
    src = before if has_b else after
    errors = {str(k): str(v) for k, v in _load(src, "errors.json").items()}
    host = _load(src, "host.json")
    gpus = _load(src, "gpus.json")
    facts: dict[str, Any] = {
        "kernel": (host.get("uname") or {}).get("release"),
        "cpu": _load(src, "cpu.json").get("model_name"),
        "gpus": len(gpus.get("gpus", [])) if gpus else 0,
        "driver": gpus.get("driver_version"),
        "nics": sorted(_load(src, "nics.json")),
        "rdma_ports": sorted(_load(src, "rdma.json")),
        "container": _container_fact(_load(src, "container.json")),
    }
    return NodeStatic(node_dir.name, has_b, has_a, tuple(moved), errors, facts)


def _container_fact(c: dict) -> str:
    """The server's container in one line (``container.json``, written on the head by
    ``run/agents.py`` when the server runs in a container): runtime, image, image id."""
    if not c:
        return ""
    info, image = c.get("container") or {}, c.get("image") or {}
    name = info.get("ImageName") or (info.get("Config") or {}).get("Image") or "?"
    image_id = str(image.get("Id") or info.get("Image") or "?").removeprefix("sha256:")
    return (f"{c.get('runtime', '?')} container {str(info.get('Name', '')).lstrip('/')} "
            f"of image {name} (id {image_id[:12]})")


def run_static(run_dir: Path) -> list[NodeStatic]:
    """Every node of a run folder that has a snapshot, by name."""
    nodes = run_dir / "nodes"
    if not nodes.is_dir():
        return []
    return [node_static(d) for d in sorted(nodes.iterdir())
            if d.is_dir() and (d / "static").is_dir()]
