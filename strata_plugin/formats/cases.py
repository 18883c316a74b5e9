"""The case line: what one case of a run was, one JSON line of ``cases.jsonl``.

The case runner writes a line when a case has run (or was cut short, or planned by a
dry run), and the test's teardown writes it again with its outcome and verdict; the
last line of a case id is the one that counts. :class:`CaseLine` types every key
Strata writes, writes itself as the JSON the run folder has always held (sorted keys,
``json.dumps`` defaults, values as given) and reads back lines of any Strata: a key it
does not type (a test's own ``extra=``, a later version's) is kept in :attr:`~CaseLine.
extra` and written back, and a key the line lacks reads as None. A key that holds the
wrong type is refused with the line and the key named: every reader would otherwise
meet it later as an unexplained crash or a silently wrong number.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_plugin.formats.typed import FormatError


class CaseLineError(FormatError):
    """A ``cases.jsonl`` line whose key holds a type no Strata writes there."""


#: A field's metadata: the JSON type its value must have (checked by
#: :meth:`CaseLine.from_dict`). Every field but ``case_id`` defaults to None: absent.
_K = {kind: {"json": kind} for kind in (
    "string", "number", "integer", "boolean", "object", "strings", "objects", "window",
    "allow_errors", "sweep")}


@dataclass(frozen=True)
class CaseLine:
    """One ``cases.jsonl`` line. Every field but ``case_id`` is None where the line does
    not hold the key: a line is one of several kinds (measured, replayed, interrupted,
    planned by a dry run), and each kind writes its own set of keys."""

    case_id: str = field(default="", metadata=_K["string"])
    name: str | None = field(default=None, metadata=_K["string"])  # the workload's name
    #: the workload as run (Workload.params)
    params: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: the nominal workload before the profile's ``scale``; null where it ran unscaled
    scaled_from: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    config_id: str | None = field(default=None, metadata=_K["string"])
    #: the server process (A/B block) the case ran in
    block_id: str | None = field(default=None, metadata=_K["string"])
    api: str | None = field(default=None, metadata=_K["string"])
    #: that server's start-up time, kept apart from every measurement; null: not started
    #: by Strata (an external server) or not known
    server_startup_s: float | None = field(default=None, metadata=_K["number"])
    #: the run's salt and the workload's repetition: why no repetition reuses a prefix
    prompt_salt: str | None = field(default=None, metadata=_K["string"])
    #: the measured window on the monotonic clock ``[start_ns, end_ns]``: the
    #: throughput denominator, exact where markers.csv's wall-clock copy is rounded
    window_mono_ns: tuple[int, int] | None = field(default=None, metadata=_K["window"])
    warmup_s: float | None = field(default=None, metadata=_K["number"])
    #: the load generator's self-check (load/generator.SelfCheck, as a mapping)
    self_check: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: copied out of ``self_check``: the rule table and older readers look here
    client_bound: bool | None = field(default=None, metadata=_K["boolean"])
    #: what the case's own checks found wrong (lengths, validators, an unsent injection)
    problems: tuple[str, ...] | None = field(default=None, metadata=_K["strings"])
    #: the metrics JUnit reported
    headline: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: ``{"validator", "passed", "total"}`` per output validator
    validation: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_K["objects"])
    #: where the injected request was placed and when it was sent; null: none
    injection: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: how the prefix cache was emptied before a cold case (load/cache_flush.Flush)
    cache_flush: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: whether a cold case was verified cold from the server's cached-token counts
    cold_prefix: str | None = field(default=None, metadata=_K["string"])
    #: False where input lengths are not exact token IDs (chat without a tokenizer
    #: endpoint, the user's texts); ``isl_note`` says what was counted instead
    isl_exact: bool | None = field(default=None, metadata=_K["boolean"])
    isl_note: str | None = field(default=None, metadata=_K["string"])
    #: the request failures the case expects: True (any) or error classes
    allow_errors: bool | tuple[str, ...] | None = field(default=None, metadata=_K["allow_errors"])
    #: ``until=``: the percentiles asked for and how the batches ended
    sample_target: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: the report's fixed timeslices
    timeslice_s: float | None = field(default=None, metadata=_K["number"])
    #: cut short (Ctrl-C) in its measured load
    interrupted: bool | None = field(default=None, metadata=_K["boolean"])
    # A/B arm (load/case_runner.ABArm): the report pairs arms by group, repetition by
    # repetition
    ab_group: str | None = field(default=None, metadata=_K["string"])
    ab_arm: str | None = field(default=None, metadata=_K["string"])
    repetition: int | None = field(default=None, metadata=_K["integer"])
    #: a capacity sweep: the sweep's name on a step's line; on a dry run's plan, the
    #: sweep itself (start_rate, factor, max_steps, refine), as only its first step is known
    sweep: str | dict[str, Any] | None = field(default=None, metadata=_K["sweep"])
    #: the step's rate (requests/s)
    offered_rate: float | None = field(default=None, metadata=_K["number"])
    #: the SLO the step is judged by (Slo.describe)
    slo: str | None = field(default=None, metadata=_K["string"])
    good_fraction: float | None = field(default=None, metadata=_K["number"])
    # the diagnostic round (run/diagnostic_round.py): a traced repetition of a case
    diagnostic_of: str | None = field(default=None, metadata=_K["string"])
    traces: tuple[str, ...] | None = field(default=None, metadata=_K["strings"])
    escalated: str | None = field(default=None, metadata=_K["string"])  # why it was traced
    # written again at the test's teardown (plugin/case_teardown.py)
    #: the A/B expectations the test judged on this case's group
    #: (analysis/expectations.ABExpectation.to_json), on each case of the group it ran
    ab_expectations: tuple[dict[str, Any], ...] | None = field(default=None,
                                                              metadata=_K["objects"])
    #: the test's outcome: passed / failed / not established / ...
    outcome: str | None = field(default=None, metadata=_K["string"])
    nodeid: str | None = field(default=None, metadata=_K["string"])
    #: the verdict computed at the case's end (dataclasses.asdict of analysis Verdict):
    #: the one JUnit reported, which the report keeps
    verdict: dict[str, Any] | None = field(default=None, metadata=_K["object"])
    #: False where the agents' last samples were not flushed before the verdict
    telemetry_flushed: bool | None = field(default=None, metadata=_K["boolean"])
    # a dry run's plan (run/dry_run.py): nothing was sent
    planned: bool | None = field(default=None, metadata=_K["boolean"])
    extra_body_keys: tuple[str, ...] | None = field(default=None, metadata=_K["strings"])
    validators: tuple[str, ...] | None = field(default=None, metadata=_K["strings"])
    #: a trace replay, planned as one case
    replay: bool | None = field(default=None, metadata=_K["boolean"])
    #: keys this version does not type, as read (a test's ``extra=``, another version's)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the typed keys the line holds as JSON null. Null and absent both read as None,
    #: but a measured line writes ``scaled_from: null`` where an interrupted one has no
    #: key: kept so that a line is written back as it was
    nulls: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        clash = sorted(set(self.extra) & set(_KINDS))
        if clash:
            raise ValueError(f"case line {self.case_id!r}: extra keys {clash} are fields")

    # --- reading ---------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "case line") -> CaseLine:
        """The line from its parsed JSON. ``where`` names it in an error (``path:line``).

        Raises :class:`CaseLineError` for a typed key holding another type; never for a
        missing or an unknown key."""
        kw: dict[str, Any] = {}
        nulls, extra = set(), {}
        for key, value in d.items():
            kind = _KINDS.get(key)
            if kind is None:
                extra[key] = value
            elif value is None:
                nulls.add(key)
            else:
                kw[key] = _check(kind, key, value, where)
        return cls(**kw, extra=extra, nulls=frozenset(nulls))

    @classmethod
    def from_json(cls, text: str, where: str = "case line") -> CaseLine:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise CaseLineError(f"{where}: expected a JSON object, got {type(d).__name__}")
        return cls.from_dict(d, where)

    @classmethod
    def written(cls, tail: Mapping[str, Any] | None = None, /, **keys: Any) -> CaseLine:
        """The line a writer lists key by key: a key given as None is written as null, a
        key not given is left out. ``tail`` comes last and wins, as ``**extra`` did in the
        dict the runner wrote: a test's ``extra=``, the sweep's and the diagnostic round's
        fields, the A/B arm. Its keys that name a field set that field (checked as a read
        line's are); the others are kept as given."""
        unknown = sorted(set(keys) - set(_KINDS))
        if unknown:
            raise TypeError(f"CaseLine.written: no field(s) {unknown}")
        merged = {**keys, **(tail or {})}
        return cls.from_dict(merged, f"the line of case {merged.get('case_id')!r}")

    def updated(self, **keys: Any) -> CaseLine:
        """This line with ``keys`` set (or added to :attr:`extra`), as ``{**line, ...}``."""
        return CaseLine.from_dict({**self.to_dict(), **keys},
                                  f"the line of case {self.case_id!r}")

    # --- writing ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The keys the line holds, with the values as given (tuples as lists)."""
        out: dict[str, Any] = {}
        for key in _KINDS:
            v = getattr(self, key)
            if v is None:
                if key in self.nulls:
                    out[key] = None
                continue
            out[key] = list(v) if isinstance(v, tuple) else v
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        """The ``cases.jsonl`` line (no newline): sorted keys, ``json.dumps``'s default
        separators, and ``str`` of a value JSON has no type for (a Path in ``extra``)."""
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


#: JSON kind of each typed key, in the dataclass's order.
_KINDS: dict[str, str] = {f.name: f.metadata["json"] for f in dataclasses.fields(CaseLine)
                          if "json" in f.metadata}

_EXPECTED = {
    "string": "a string", "number": "a number", "integer": "an integer",
    "boolean": "true or false", "object": "an object", "strings": "a list of strings",
    "objects": "a list of objects", "window": "[start_ns, end_ns] (two integers)",
    "allow_errors": "true or a list of error classes",
    "sweep": "a sweep name (string) or a planned sweep (object)",
}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(kind: str, key: str, v: Any, where: str) -> Any:
    """``v`` as the field holds it (lists as tuples, objects copied); else the error."""
    ok: Any = _MISSING
    if kind == "string" and isinstance(v, str):
        ok = v
    elif kind == "number" and (_is_int(v) or isinstance(v, float)):
        ok = v  # as written: an int stays an int, so the line is written back the same
    elif kind == "integer" and _is_int(v):
        ok = v
    elif kind == "boolean" and isinstance(v, bool):
        ok = v
    elif kind == "object" and isinstance(v, dict):
        ok = dict(v)
    elif kind == "strings" and isinstance(v, (list, tuple)) and all(
            isinstance(x, str) for x in v):
        ok = tuple(v)
    elif kind == "objects" and isinstance(v, (list, tuple)) and all(
            isinstance(x, dict) for x in v):
        ok = tuple(dict(x) for x in v)
    elif kind == "window" and isinstance(v, (list, tuple)) and len(v) == 2 and all(
            map(_is_int, v)):
        ok = (v[0], v[1])
    elif kind == "allow_errors":
        if isinstance(v, bool):
            ok = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            ok = tuple(v)
    elif kind == "sweep" and isinstance(v, (str, dict)):
        ok = dict(v) if isinstance(v, dict) else v
    if ok is _MISSING:
        shown = json.dumps(v, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CaseLineError(f"{where}: key {key!r}: expected {_EXPECTED[kind]}, got "
                            f"{type(v).__name__} {shown}")
    return ok


_MISSING = object()
