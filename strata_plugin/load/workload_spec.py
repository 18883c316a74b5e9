"""A workload from one line of text: ``isl=256,osl=64,concurrency=4,requests=40``.

So a workload can be measured from the command line (``--strata-workload``,
``python -m strata_plugin bench``) without writing a case. The keys are
:class:`Workload`'s own fields; anything else is refused with the list of keys, and
a bad value names its key and the type expected, before a server starts.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from strata_plugin.errors import StrataError
from strata_plugin.load.workload import Workload

#: Key -> type of its value, from Workload's fields.
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "float | None": float}


class WorkloadSpecError(StrataError, ValueError):
    """The text does not describe a workload; the message says what and where."""


def _convert(key: str, text: str, kind: str) -> object:
    if kind == "bool":
        low = text.lower()
        if low in ("1", "true", "yes"):
            return True
        if low in ("0", "false", "no"):
            return False
        raise WorkloadSpecError(f"{key}={text}: expected true or false")
    typ = _TYPES.get(kind, str)
    try:
        return typ(text)
    except ValueError:
        word = {int: "an integer", float: "a number"}.get(typ, "text")
        raise WorkloadSpecError(f"{key}={text}: expected {word}") from None


def parse_workload(text: str, *, default_name: str = "adhoc") -> Workload:
    """``key=value`` pairs, comma-separated, into a validated Workload.

    ``isl`` and ``osl`` are required; every other key has Workload's default.
    """
    kinds = {f.name: str(f.type) for f in fields(Workload)}
    values: dict[str, Any] = {"name": default_name}  # Workload's fields, converted
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise WorkloadSpecError(f"{part!r}: expected key=value")
        if key not in kinds:
            raise WorkloadSpecError(
                f"unknown key {key!r}; the keys are {', '.join(sorted(kinds))}")
        values[key] = _convert(key, raw, kinds[key])
    if "texts" in values:  # the user's own prompts: their lengths are their own
        values.setdefault("isl", 0)
    missing = [k for k in ("isl", "osl") if k not in values]
    if missing:
        raise WorkloadSpecError(f"missing {' and '.join(missing)} (e.g. isl=256,osl=64)")
    try:
        return Workload(**values)
    except ValueError as exc:
        raise WorkloadSpecError(str(exc)) from None
