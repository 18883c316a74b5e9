"""The run folder: one per run, never reused, written so a crash loses nothing.

Raw files are appended line by line and flushed as events happen
(``requests.jsonl``, ``cases.jsonl``), so the data of an interrupted run is
on disk. ``manifest.json`` is rewritten atomically and says whether the run
completed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import platform
import secrets
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from strata_plugin.configure.credentials import redact_argv
from strata_plugin.configure.names import NAME_RULE, is_name
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.records import ClockAnchor, RequestRecord
from strata_plugin.formats.windows import Marker, write_markers

#: Request markers wait at most this long before markers.csv is rewritten with them.
MARKER_FLUSH_S = 1.0
#: Room kept aside in the run folder (a hidden file, removed at the run's end) for the
#: manifest's last words: on a disk that fills up, the manifest is still rewritten once
#: more with why the run is incomplete, instead of keeping ``complete: false`` without a
#: reason. 128 KiB: a manifest is 2-10 KB (one that lists many nodes and servers, tens).
RESERVE_NAME = ".strata-reserve"
RESERVE_BYTES = 128 * 1024
#: Packages whose versions go into the manifest.
_VERSIONED = ("pytest", "pytest-benchmark", "requests", "sseclient-py", "pandas",
              "nvidia-ml-py", "matplotlib", "numpy")


def new_run_id(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


#: The umask of a private run folder: nothing for the group or others.
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Set :data:`PRIVATE_UMASK` for this process (and the processes it starts from now
    on); returns the previous umask, for the caller to restore."""
    return os.umask(PRIVATE_UMASK)


def create_run_dir(reports_dir: Path, run_id: str, *, private: bool = False) -> Path:
    """Make the run folder; refuse to reuse one (two runs never share a folder).

    ``run_id`` is one path component (``configure.profile.is_name``): the option is checked
    where it is read, and again here, so no id makes a folder outside ``reports_dir``.
    ``private``: the folder is mode 0700 whatever the umask (files in it follow the
    caller's umask, :func:`private_umask`)."""
    if not is_name(run_id):
        raise ValueError(f"run id {run_id!r}: expected {NAME_RULE}")
    reports_dir.mkdir(parents=True, exist_ok=True)
    path = reports_dir / run_id
    try:
        path.mkdir(mode=0o700 if private else 0o777, exist_ok=False)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "run folder already exists (a run never reuses "
                              "another's folder: pass a new --strata-run-id)", str(path)) from None
    if private:
        path.chmod(0o700)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:  # a full disk: keep the old file, leave no temporary
        tmp.unlink(missing_ok=True)
        raise


def _git_sha(root: Path) -> str:
    """HEAD's sha; "no commits" in a repository without one (``rev-parse HEAD`` then
    prints "HEAD" and fails); "unknown" outside a repository or without git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "-q",
                              "HEAD^{commit}"], capture_output=True, text=True, timeout=5,
                             check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
        repo = subprocess.run(["git", "-C", str(root), "rev-parse", "--git-dir"],
                              capture_output=True, text=True, timeout=5, check=False)
        return "no commits" if repo.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def host_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"hostname": platform.node(), "kernel": platform.release(),
            "machine": platform.machine(), "cpu_model": cpu_model, "cpus": os.cpu_count(),
            "python": sys.version.split()[0]}


class JsonlWriter:
    """Append-only JSON lines, each on disk as soon as it is written; safe from several
    threads. A line never stays half-written: it goes out in one ``write(2)``, and a
    write that fails part way (a full disk: the kernel writes what fits, then ENOSPC)
    is cut back to the last whole line before the error goes on. (A process killed
    inside the write can still leave a torn last line; the readers name it:
    formats/typed.JsonLines.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._size = os.fstat(self._fd).st_size  # the end of the last whole line
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path.name}: write after close")
            done = 0
            try:
                while done < len(data):
                    done += os.write(self._fd, data[done:])
            except BaseException:  # ENOSPC, EIO, Ctrl-C between two partial writes
                if done:
                    with contextlib.suppress(OSError):
                        os.ftruncate(self._fd, self._size)
                raise
            self._size += len(data)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class RunRecorder:
    """Everything the live run writes into its folder."""

    def __init__(self, run_dir: Path, anchor: ClockAnchor, manifest: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.anchor = anchor
        self.manifest = dict(manifest, clock_anchor={"mono_ns": anchor.mono_ns,
                                                     "wall_ns": anchor.wall_ns})
        self.markers: list[Marker] = []
        self._lock = threading.Lock()
        self._markers_written = 0.0  # monotonic s of the last markers.csv rewrite
        self._markers_dirty = False
        #: whole-file rewrites (markers.csv, manifest.json) that failed and were not redone
        #: since, by file name: the file keeps its last whole version and the next rewrite
        #: carries everything (a full disk that frees up loses nothing). Whatever is left
        #: here at the run's end is lost, and the run says so (run/session.py).
        self.unwritten: dict[str, OSError] = {}
        self._reserve: Path | None = _make_reserve(run_dir / RESERVE_NAME)
        self.requests = JsonlWriter(run_dir / "requests.jsonl")
        self.cases = JsonlWriter(run_dir / "cases.jsonl")
        self.write_manifest(complete=False)

    def wall(self, mono_ns: int) -> int:
        return self.anchor.to_wall_ns(mono_ns)

    def record(self, rec: RequestRecord) -> None:
        self.requests.write(rec.to_json())
        if rec.done_ns is not None:
            self.mark("request", rec.request_id, rec.case_id, rec.dispatched_ns, rec.done_ns)

    def mark(self, kind: str, name: str, case_id: str, start_mono_ns: int,
             end_mono_ns: int) -> Marker:
        m = Marker(kind, name, case_id, self.wall(start_mono_ns), self.wall(end_mono_ns))
        with self._lock:
            self.markers.append(m)
            # markers.csv is rewritten whole (sorted, atomically): once per request it
            # costs O(n) per request, 26 ms at 2,500 markers, under this lock. Request
            # markers (also in requests.jsonl) are batched to one rewrite per
            # MARKER_FLUSH_S; every other kind is written at once.
            now = time.monotonic()
            if kind == "request" and now - self._markers_written < MARKER_FLUSH_S:
                self._markers_dirty = True
            else:
                self._write_markers(now)
        return m

    def _write_markers(self, now: float) -> None:
        try:
            write_markers(self.run_dir / "markers.csv", self.markers)
        except OSError as exc:  # kept in memory: the next rewrite carries it
            self.unwritten["markers.csv"] = exc
            self._markers_dirty = True
            return
        self.unwritten.pop("markers.csv", None)
        self._markers_written, self._markers_dirty = now, False

    def flush_markers(self) -> None:
        with self._lock:
            if self._markers_dirty:
                self._write_markers(time.monotonic())

    def add_case(self, case: CaseLine) -> None:
        self.cases.write(case.to_json())

    def update_manifest(self, **fields: Any) -> None:
        """Add to the manifest and rewrite it; a rewrite that fails (a full disk) is noted
        in :attr:`unwritten`, not raised: the next one carries these fields too."""
        with self._lock:
            self.manifest.update(fields)
        try:
            self.write_manifest(complete=self.manifest.get("complete", False))
        except OSError as exc:
            self.unwritten["manifest.json"] = exc

    def write_manifest(self, *, complete: bool) -> None:
        """Rewrite the manifest now; raises OSError when it cannot. A full disk first
        gives up the room kept aside (:data:`RESERVE_BYTES`), once."""
        with self._lock:
            self.manifest["complete"] = complete
            text = json.dumps(self.manifest, indent=2, sort_keys=True, default=str) + "\n"
        try:
            atomic_write_text(self.run_dir / "manifest.json", text)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self.release_reserve():
                raise
            atomic_write_text(self.run_dir / "manifest.json", text)
        self.unwritten.pop("manifest.json", None)

    def release_reserve(self) -> bool:
        """Remove the room kept aside; True when there was some to give."""
        path, self._reserve = self._reserve, None
        if path is None:
            return False
        try:
            path.unlink()
        except OSError:
            return False
        return True

    def close(self) -> None:
        try:
            self.flush_markers()
        finally:
            self.requests.close()
            self.cases.close()
            self.release_reserve()


def _make_reserve(path: Path) -> Path | None:
    """:data:`RESERVE_BYTES` of the disk, held by a hidden file; None where there is no
    room even for that (the run goes on without it)."""
    try:
        with path.open("wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)  # written, not sparse: the blocks are taken
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        return None
    return path


def base_manifest(*, run_id: str, profile: dict[str, Any], argv: list[str],
                  root: Path) -> dict[str, Any]:
    """The manifest's first facts; the command line with every URL's credentials
    hidden (``--strata-server-url http://user:pw@...``)."""
    from strata_plugin import __version__

    return {"run_id": run_id, "strata_version": __version__, "argv": redact_argv(argv),
            "git_sha": _git_sha(root), "host": host_facts(), "versions": package_versions(),
            "profile": profile,
            "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
