"""manifest.json read back: whole JSON, one object, and every key the analysis and the
report read holding the type the run writes there.

Why: the offline tools read a manifest a user may have edited or damaged (``servers`` a
list, a clock offset a string); unchecked, such a value fails deep in the report as a
bare traceback. Each key the readers use is declared here once, with its shape, and a
wrong one is named ``manifest.json:LINE: key 'servers': expected ..., got ...``. Keys not
declared here are free (the manifest holds many facts no reader interprets).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from strata_plugin.formats.typed import BOOL, INT, NUM, STR, FormatError, check_shape, opt

_CLOCK = {k: opt(INT) for k in ("clock_offset_ns", "clock_uncertainty_ns", "offset_start_ns",
                               "offset_end_ns", "start_wall_ns", "end_wall_ns")}
_SERVER = {"argv": opt(("list", STR)), "command": opt(("list", STR)), "base_url": opt(STR),
           "startup_s": opt(NUM), "restarts": opt(INT)}

#: Every key a reader of manifest.json uses (analysis/, report/, formats/outcome.py), with
#: the shape the run writes (run/session.py, run/run_folder.py, run/agents.py).
SCHEMA: dict[str, Any] = {
    "run_id": opt(STR),
    "strata_version": opt(STR),
    "git_sha": opt(STR),
    "started_utc": opt(STR),
    "finished_utc": opt(STR),
    "argv": opt(("list", STR)),
    "complete": opt(BOOL),
    "incomplete_reason": opt(STR),
    "incomplete_reasons": opt(("list", {"kind": STR, "detail": STR})),
    "host": opt({"hostname": opt(STR), "cpu_model": opt(STR), "kernel": opt(STR),
                  "cpus": opt(INT), "machine": opt(STR), "python": opt(STR)}),
    "versions": opt(("map", opt(STR))),
    "clock_anchor": opt({"mono_ns": INT, "wall_ns": INT}),
    "gpu_expected": opt(BOOL),
    "nodes": opt(("map", opt(_CLOCK))),
    "servers": opt(("map", _SERVER)),
    "server": opt(_SERVER),
    "agents_lost": opt(("list", {"node": opt(STR), "reason": opt(STR),
                                  "cases": opt(("list", STR))})),
}


def _line_of(text: str, key: str) -> int | None:
    """The line of a top-level key in the manifest's text (written with indent 2)."""
    m = re.search(rf'^  {re.escape(json.dumps(key))}\s*:', text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None


def check_manifest(d: Any, where: str, text: str = "") -> dict[str, Any]:
    """The manifest ``d`` with every declared key checked (``text``: the file, to name
    a key's line)."""
    if type(d) is not dict:
        raise FormatError(f"{where}: expected a JSON object, got "
                          f"{type(d).__name__ if d is not None else 'null'}")
    for key, spec in SCHEMA.items():
        if key in d:
            line = _line_of(text, key) if text else None
            check_shape(d[key], spec, f"{where}:{line}" if line else where, key)
    return d


def read_manifest(path: Path) -> dict[str, Any]:
    """``manifest.json``, checked; {} where there is none. FormatError when it is not
    UTF-8 JSON holding one object, or a key holds the wrong type."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    return check_manifest(d, str(path), text)
