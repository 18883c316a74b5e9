"""Static facts of a node, taken before and after a run: what the numbers ran on.

:func:`collect_snapshot` returns ``{file name: text}`` so the agent can send a
remote node's snapshot over its stdout; :func:`static_snapshot` writes the same
files into a folder. Nothing here fails the run: a tool that is missing or
errors is listed in ``errors.json`` with its reason, and every tool run is in
``commands.json`` as an argv list. Environment variables are never recorded
(they may hold secrets).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, List, Tuple

from . import nvml_lib, procfs
from .protocol import AGENT_VERSION
from .redact import redact
from .targets import run_tool

Runner = Callable[[List[str], float], Tuple[int, str, str]]

#: A one-liner run with the server's own Python to list *its* packages.
_PKG_SCRIPT = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() "
    "if d.metadata['Name']}, sort_keys=True))"
)
_SYSCTLS = (
    "/proc/sys/kernel/perf_event_paranoid",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/vm/swappiness",
    "/proc/sys/vm/overcommit_memory",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/smt/active",
)


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def cpu_summary(cpuinfo: str | None = None) -> dict[str, Any]:
    """Model, counts and flags of the first CPU from /proc/cpuinfo (not the whole file)."""
    text = cpuinfo if cpuinfo is not None else (_read("/proc/cpuinfo") or "")
    first: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            processors += 1
        if processors == 1 and key not in first:
            first[key] = val.strip()
    return {
        "model_name": first.get("model name", platform.processor()),
        "logical_cpus": processors or os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_mhz": first.get("cpu MHz"),
        "cache_size": first.get("cache size"),
        "flags": first.get("flags", "").split(),
    }


def numa_layout(root: str = "/sys/devices/system/node") -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return out
    for n in names:
        meminfo = _read(f"{root}/{n}/meminfo") or ""
        total = next((line.split()[3] for line in meminfo.splitlines() if "MemTotal" in line), None)
        out[n] = {
            "cpulist": (_read(f"{root}/{n}/cpulist") or "").strip(),
            "mem_total_kib": int(total) if total else None,
            "distance": (_read(f"{root}/{n}/distance") or "").split(),
        }
    return out


NET_ROOT = "/sys/class/net"
IB_ROOT = "/sys/class/infiniband"


def _read_counters(folder: str) -> dict[str, int]:
    """Integer files of a sysfs counters folder (statistics/, counters/, hw_counters/)."""
    out: dict[str, int] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        text = _read(os.path.join(folder, name))
        if text is not None and text.strip().lstrip("-").isdigit():
            out[name] = int(text.strip())
    return out


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S`` output (``name: value`` lines under a header) as a dict."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if sep and val.strip().lstrip("-").isdigit():
            out[key.strip()] = int(val.strip())
    return out


def nic_facts(root: str = NET_ROOT, ethtool: Callable[[str], str | None] | None = None
              ) -> dict[str, Any]:
    """Per interface: state, speed, MTU, driver, the kernel's statistics and (for a
    device-backed interface, when ethtool exists) ``ethtool -S``, before and after a run
    so that error counters that moved are seen."""
    out: dict[str, Any] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        base = os.path.join(root, name)
        entry: dict[str, Any] = {
            k: (v.strip() if (v := _read(os.path.join(base, k))) is not None else None)
            for k in ("operstate", "speed", "mtu", "address")}
        try:
            entry["driver"] = os.path.basename(os.readlink(os.path.join(base, "device", "driver")))
        except OSError:
            entry["driver"] = None
        entry["statistics"] = _read_counters(os.path.join(base, "statistics"))
        if ethtool is not None and os.path.exists(os.path.join(base, "device")):
            text = ethtool(name)
            if text:
                entry["ethtool_stats"] = parse_ethtool_stats(text)
        out[name] = entry
    return out


def rdma_facts(root: str = IB_ROOT) -> dict[str, Any]:
    """Per RDMA port: state, physical state, rate, link layer, GID 0, and its error and
    hardware counters."""
    out: dict[str, Any] = {}
    try:
        devs = sorted(os.listdir(root))
    except OSError:
        return out
    for dev in devs:
        ports_dir = os.path.join(root, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir))
        except OSError:
            continue
        for port in ports:
            base = os.path.join(ports_dir, port)
            entry: dict[str, Any] = {
                k: (v.strip() if (v := _read(os.path.join(base, k))) is not None else None)
                for k in ("state", "phys_state", "rate", "link_layer")}
            entry["gid0"] = (_read(os.path.join(base, "gids", "0")) or "").strip() or None
            entry["counters"] = _read_counters(os.path.join(base, "counters"))
            entry["hw_counters"] = _read_counters(os.path.join(base, "hw_counters"))
            out[f"{dev}/{port}"] = entry
    return out


#: NVML's ECC counters: (error type, counter type) -> name (NVML_MEMORY_ERROR_TYPE_*,
#: NVML_VOLATILE_ECC / NVML_AGGREGATE_ECC).
_ECC = {(0, 0): "ecc_corrected_volatile", (1, 0): "ecc_uncorrected_volatile",
        (0, 1): "ecc_corrected_aggregate", (1, 1): "ecc_uncorrected_aggregate"}
#: NVML_PAGE_RETIREMENT_CAUSE_*: multiple single-bit errors, a double-bit error.
_RETIRED = {0: "retired_pages_sbe", 1: "retired_pages_dbe"}


def _gpu_health(nv: Any, h: Any) -> dict[str, Any]:
    """ECC error counts, retired pages and remapped rows: counters that should not move."""
    g: dict[str, Any] = {}
    for (etype, ctype), key in _ECC.items():
        try:
            g[key] = int(nv.nvmlDeviceGetTotalEccErrors(h, etype, ctype))
        except Exception as e:
            g[key] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
    for cause, key in _RETIRED.items():
        try:
            g[key] = len(nv.nvmlDeviceGetRetiredPages(h, cause))
        except Exception as e:
            g[key] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
    try:
        corr, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(h)
        g.update(remapped_rows_correctable=int(corr), remapped_rows_uncorrectable=int(unc),
                 remapped_rows_pending=int(pending), remapped_rows_failure=int(failure))
    except Exception as e:
        g["remapped_rows"] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
    return g


#: NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: the speed of the active links, MB/s (NVML API
#: Reference, Field Value Enums); NVLink has at most NVML_NVLINK_MAX_LINKS links
_NVLINK_SPEED_FIELD = 90


def _nvlink(nv: Any, h: Any) -> dict[str, Any]:
    """The active NVLink links and their common speed (MB/s per link, as NVML reports it)."""
    out: dict[str, Any] = {}
    active = 0
    for link in range(int(nvml_lib.const(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            active += int(bool(nv.nvmlDeviceGetNvLinkState(h, link)))
        except Exception as e:
            if link == 0:  # no NVLink at all (a PCIe card), or no permission
                why = nvml_lib.error_text(nv, e)
                return {"unavailable": f"nvmlDeviceGetNvLinkState: {why}"}
            break  # past the device's last link
    out["links_active"] = active
    try:
        fv = nv.nvmlDeviceGetFieldValues(h, [_NVLINK_SPEED_FIELD])[0]
        if int(fv.nvmlReturn) == 0:
            out["speed_mbps_per_link"] = int(fv.value.ullVal)
        else:
            out["speed_mbps_per_link"] = (f"UNAVAILABLE: field {_NVLINK_SPEED_FIELD}: NVML "
                                          f"return {int(fv.nvmlReturn)}")
    except Exception as e:
        out["speed_mbps_per_link"] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
    return out


def _nvml_facts(nvml: Any | None) -> tuple[dict[str, Any] | None, str | None]:
    nv, reason = nvml_lib.load_nvml(nvml)
    if nv is None:
        return None, reason
    try:
        facts: dict[str, Any] = {}
        for key, fn in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
        ):
            try:
                facts[key] = nvml_lib.decode(getattr(nv, fn)())
            except Exception as e:
                facts[key] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i}
            for key, fn, args in (
                ("name", "nvmlDeviceGetName", ()),
                ("uuid", "nvmlDeviceGetUUID", ()),
                ("serial", "nvmlDeviceGetSerial", ()),
                ("vbios", "nvmlDeviceGetVbiosVersion", ()),
                ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit", ()),
                ("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (1,)),
                ("mem_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (2,)),
                ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
                ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", ()),
                # with the memory clock, the peak memory bandwidth (analysis/device_limits.py)
                ("memory_bus_width_bits", "nvmlDeviceGetMemoryBusWidth", ()),
                ("persistence_mode", "nvmlDeviceGetPersistenceMode", ()),
                ("compute_mode", "nvmlDeviceGetComputeMode", ()),
            ):
                try:
                    v = getattr(nv, fn)(h, *args)
                    g[key] = nvml_lib.decode(v) if isinstance(v, bytes) else v
                except Exception as e:
                    g[key] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
            g.update(_gpu_health(nv, h))
            g["nvlink"] = _nvlink(nv, h)
            try:
                g["memory_total_bytes"] = nv.nvmlDeviceGetMemoryInfo(h).total
                g["pci_bus_id"] = nvml_lib.decode(nv.nvmlDeviceGetPciInfo(h).busId)
            except Exception as e:
                g["memory_or_pci"] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
            gpus.append(g)
        facts["gpus"] = gpus
        return facts, None
    except Exception as e:
        return None, f"NVML query failed: {nvml_lib.error_text(nv, e)}"
    finally:
        nvml_lib.shutdown(nv)


def _server_facts(pids: Iterable[int]) -> list[dict[str, Any]]:
    out = []
    for pid in pids:
        argv = procfs.cmdline_argv(pid)
        if argv is None:
            out.append({"pid": pid, "error": "no such process"})
            continue
        entry: dict[str, Any] = {"pid": pid, "argv": [redact(a) for a in argv]}
        try:
            entry["exe"] = os.readlink(f"/proc/{pid}/exe")
        except OSError as e:
            entry["exe"] = f"UNAVAILABLE: {e.strerror}"
        try:
            entry["cwd"] = os.readlink(f"/proc/{pid}/cwd")
        except OSError as e:
            entry["cwd"] = f"UNAVAILABLE: {e.strerror}"
        try:
            from .collectors.numa import cpulist

            entry["affinity"] = cpulist(set(os.sched_getaffinity(pid)))
        except OSError as e:
            entry["affinity"] = f"UNAVAILABLE: {e.strerror}"
        entry["cgroup"] = (_read(f"/proc/{pid}/cgroup") or "").strip().splitlines()
        entry["tree"] = procfs.process_tree(pid)
        out.append(entry)
    return out


def collect_snapshot(
    server_pids: Iterable[int] = (),
    runner: Runner = run_tool,
    nvml: Any | None = None,
    which: Callable[[str], str | None] = shutil.which,
    python_packages: bool = True,
) -> dict[str, str]:
    """Everything static about this node, as ``{file name: text}``."""
    files: dict[str, str] = {}
    errors: dict[str, str] = {}
    commands: dict[str, list[str]] = {}
    server_pids = list(server_pids)

    def tool(name: str, argv: list[str], timeout_s: float = 30.0) -> str | None:
        if which(argv[0]) is None:
            errors[name] = f"{argv[0]} not found on PATH"
            return None
        commands[name] = argv
        rc, out, err = runner(argv, timeout_s)
        if rc != 0:
            errors[name] = f"exit {rc}: {(err or out).strip()[:500]}"
            return None
        return out

    uname = os.uname()
    files["host.json"] = _json(
        {
            "hostname": socket.gethostname(),
            "uname": {
                "sysname": uname.sysname,
                "release": uname.release,
                "version": uname.version,
                "machine": uname.machine,
            },
            "proc_version": (_read("/proc/version") or "").strip(),
            "os_release": _read("/etc/os-release"),
            "boot_id": (_read("/proc/sys/kernel/random/boot_id") or "").strip(),
            "uptime_s": float((_read("/proc/uptime") or "0").split()[0]),
            "wall_ns": time.time_ns(),
            "agent_version": AGENT_VERSION,
            "python": sys.version,
            "python_executable": sys.executable,
        }
    )
    files["cpu.json"] = _json(cpu_summary())
    files["numa.json"] = _json(numa_layout())
    files["sysctl.json"] = _json(
        {p: (v.strip() if (v := _read(p)) is not None else None) for p in _SYSCTLS}
    )
    meminfo = _read("/proc/meminfo")
    if meminfo:
        files["meminfo.txt"] = meminfo
    lscpu = tool("lscpu", ["lscpu"])
    if lscpu:
        files["lscpu.txt"] = lscpu
    topo = tool("nvidia_smi_topo", ["nvidia-smi", "topo", "-m"])
    if topo:
        files["nvidia-smi-topo.txt"] = topo
    query = tool("nvidia_smi_q", ["nvidia-smi", "-q"])
    if query:
        files["nvidia-smi-q.txt"] = query
    def ethtool_stats(iface: str) -> str | None:
        return tool(f"ethtool_S_{iface}", ["ethtool", "-S", iface], 10.0)

    files["nics.json"] = _json(nic_facts(ethtool=ethtool_stats if which("ethtool") else None))
    if not which("ethtool"):
        errors["ethtool"] = "ethtool not found on PATH (kernel statistics only)"
    rdma = rdma_facts()
    if rdma:
        files["rdma.json"] = _json(rdma)
    facts, reason = _nvml_facts(nvml)
    if facts is not None:
        files["gpus.json"] = _json(facts)
    else:
        errors["nvml"] = reason or "NVML unavailable"
    if server_pids:
        servers = _server_facts(server_pids)
        files["server.json"] = _json(servers)
        if python_packages:
            for s in servers:
                exe = s.get("exe", "")
                if isinstance(exe, str) and "python" in os.path.basename(exe):
                    out = tool(f"server_python_packages_{s['pid']}", [exe, "-c", _PKG_SCRIPT], 60)
                    if out:
                        files[f"server_python_packages_{s['pid']}.json"] = out
                    break
    if python_packages:
        files["python_packages.json"] = _json(_local_packages())
    files["commands.json"] = _json(commands)
    files["errors.json"] = _json(errors)
    return files


def _local_packages() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            out[name] = d.version
    return dict(sorted(out.items()))


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def write_files(dest_dir: Path | str, files: dict[str, str]) -> dict[str, Path]:
    """Write ``{name: text}`` under dest_dir; names are plain file names (no folders)."""
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, text in files.items():
        safe = os.path.basename(name)
        if not safe or safe.startswith("."):
            continue
        path = dest / safe
        path.write_text(text)
        out[safe] = path
    return out


def static_snapshot(
    dest_dir: Path | str,
    server_pids: Iterable[int] = (),
    runner: Runner = run_tool,
    nvml: Any | None = None,
    python_packages: bool = True,
) -> dict[str, Path]:
    """Take a static snapshot of this node into ``dest_dir``; returns the files written."""
    files = collect_snapshot(server_pids, runner=runner, nvml=nvml, python_packages=python_packages)
    return write_files(dest_dir, files)
