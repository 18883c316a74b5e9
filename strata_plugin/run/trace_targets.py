"""What a trace reader needs to know about the processes and files it traces.

A kernel trace names threads by ID and files by device and inode, and block requests by
disk sector. This snapshot, taken when a capture starts, turns those back into the
server's threads, the harness's threads and the server's mapped files (path, inode, and
the file's extents on disk from ``FS_IOC_FIEMAP``, so a block request's sector is
resolved to a file and an offset). It is written beside the trace as ``meta.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from pathlib import Path
from typing import Any

_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_HDR = "=QQLLLL"  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, _
_FIEMAP_EXT = "=QQQQQLLLL"  # fe_logical, fe_physical, fe_length, 2 reserved, fe_flags, 3 res.
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_FLAG_SYNC = 0x1
#: Extents read per file at most (a generated model has a handful; a fragmented one more).
MAX_EXTENTS = 4096


def threads(pid: int) -> dict[int, str]:
    """{tid: comm} of a live process (empty when it is gone)."""
    out = {}
    with contextlib.suppress(OSError):
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out[int(t)] = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
    return out


def file_maps(pid: int) -> dict[str, list[list[int]]]:
    """{path: [[start, end, file offset], ...]} of a process's file-backed mappings."""
    out: dict[str, list[list[int]]] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.setdefault(parts[5].rstrip("\n"), []).append([a, b, int(parts[2], 16)])
    return out


def disk_of(st_dev: int) -> tuple[str, int, str]:
    """("major,minor" of the disk block requests name, byte offset of the file system on
    it, reason when unknown). A partition's requests are traced on its parent disk."""
    major, minor = os.major(st_dev), os.minor(st_dev)
    sysdir = Path(f"/sys/dev/block/{major}:{minor}")
    if not sysdir.exists():
        return "", 0, f"device {major}:{minor} is not a block device (overlay, tmpfs, NFS?)"
    part = sysdir / "partition"
    if part.exists():
        try:
            start = int((sysdir / "start").read_text()) * 512
            parent = (sysdir.resolve().parent / "dev").read_text().strip().replace(":", ",")
            return parent, start, ""
        except (OSError, ValueError) as exc:
            return "", 0, f"partition {major}:{minor}: {exc}"
    if (sysdir / "dm").exists() or (sysdir / "md").exists():
        return "", 0, f"device {major}:{minor} is device-mapper/md: sectors are remapped"
    return f"{major},{minor}", 0, ""


def extents(path: str) -> tuple[list[list[int]], str]:
    """[[logical, physical, length], ...] of a file on its device, or ([], why not)."""
    out: list[list[int]] = []
    start = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return [], f"open: {exc.strerror}"
    try:
        while len(out) < MAX_EXTENTS:
            n = 256
            buf = bytearray(struct.pack(_FIEMAP_HDR, start, 2**64 - 1 - start, _FIEMAP_FLAG_SYNC,
                                        0, n, 0) + b"\0" * (n * struct.calcsize(_FIEMAP_EXT)))
            try:
                fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf, True)
            except OSError as exc:
                return [], f"FIEMAP not supported here ({exc.strerror})"
            mapped = struct.unpack_from(_FIEMAP_HDR, buf)[3]
            if mapped == 0:
                break
            last = False
            for i in range(mapped):
                e = struct.unpack_from(_FIEMAP_EXT, buf, struct.calcsize(_FIEMAP_HDR)
                                       + i * struct.calcsize(_FIEMAP_EXT))
                out.append([e[0], e[1], e[2]])
                last = bool(e[5] & _FIEMAP_EXTENT_LAST)
            if last:
                break
            start = out[-1][0] + out[-1][2]
    finally:
        os.close(fd)
    return out, ""


def snapshot(server_pid: int, harness_pid: int | None = None,
             with_extents: bool = True) -> dict[str, Any]:
    """Threads, CPUs and mapped files of the server's process tree (a server may fork
    workers), and the harness's threads."""
    from strata_plugin.agent.procfs import process_tree

    harness_pid = harness_pid if harness_pid is not None else os.getpid()
    pids = process_tree(server_pid) or [server_pid]
    maps: dict[str, list[list[int]]] = {}
    server_threads: dict[str, str] = {}
    for pid in pids:
        for path, m in file_maps(pid).items():
            maps.setdefault(path, []).extend(m)
        server_threads.update({str(k): v for k, v in threads(pid).items()})
    try:
        cpus = sorted(os.sched_getaffinity(server_pid))
    except OSError:
        cpus = sorted(os.sched_getaffinity(0))
    files = []
    for path, ranges in maps.items():
        f: dict[str, Any] = {"path": path, "maps": ranges}
        try:
            st = os.stat(path)
        except OSError as exc:
            f["error"] = exc.strerror
            files.append(f)
            continue
        f.update(dev=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", ino=st.st_ino,
                 size=st.st_size)
        if with_extents and st.st_size >= 1 << 20:  # small libraries: not worth the ioctl
            disk, offset, why = disk_of(st.st_dev)
            ext, why2 = extents(path) if disk else ([], why)
            f.update(disk=disk, disk_offset=offset, extents=ext, extents_error=why or why2)
        files.append(f)
    return {
        "server_pid": server_pid,
        "server_pids": pids,
        "server_threads": server_threads,
        "harness_pid": harness_pid,
        "harness_threads": {str(k): v for k, v in threads(harness_pid).items()},
        "cpus": cpus,
        "n_cpus_online": os.cpu_count() or len(cpus),
        "files": files,
    }
