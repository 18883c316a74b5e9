"""Reading raw files through their types: every value checked against the field that
holds it, and a wrong one named as ``path:line: key 'k': expected ..., got ...``.

Why: the offline tools (``report``, ``compare``, ``scorecard``) read files a user may
have copied, edited or damaged. A value of the wrong type read without a check fails
later, far from its line, as an AttributeError or TypeError traceback, or worse, as a
silently wrong number. Here a dataclass's own field types (its annotations) say what
each JSON value must be, so a new field is checked the day it is added.

Also here: JSON lines read with their numbers. A last line cut mid-write (no newline,
not whole JSON) is a *torn* line: the writer was stopped inside a write, so it is
skipped and reported, never an error. Any other line that is not one JSON object is
damage, an error naming the line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from strata_plugin.errors import StrataError


class FormatError(StrataError, ValueError):
    """A raw file that does not hold what its format says, named by file, line and key."""


def shown(v: Any) -> str:
    """A value as an error shows it: its type and its JSON text, cut short (as
    formats/cases.py does: ``str "0.5"``, ``int 3``, ``null``)."""
    if v is None:
        return "null"
    text = json.dumps(v, default=str)
    return f"{type(v).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def expected(where: str, key: str, what: str, v: Any) -> FormatError:
    return FormatError(f"{where}: key {key!r}: expected {what}, got {shown(v)}")


def is_int(v: object) -> bool:
    return type(v) is int


def is_number(v: object) -> bool:
    return type(v) is int or type(v) is float


# --- dataclasses from JSON objects, checked against their annotations ----------------------

#: A checker: (value, where, key) -> the value as the field holds it, or FormatError.
Check = Callable[[Any, str, str], Any]


class Reader(Protocol):
    """A dataclass's reader (:func:`reader_of`): a checker that may also be told what
    the object is, for its error."""

    def __call__(self, v: Any, where: str, key: str = "", what: str = "") -> Any: ...


def _scalar(test: Callable[[Any], bool], what: str, nullable: bool) -> tuple[Check, str]:
    what = f"{what} or null" if nullable else what

    def check(v: Any, where: str, key: str) -> Any:
        if not test(v) and not (nullable and v is None):
            raise expected(where, key, what, v)
        return v

    return check, what


def _checker(hint: Any, nullable: bool = False) -> tuple[Check, str]:
    """The checker of one annotation, and what it expects in words."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return _checker(rest[0], nullable=True)
        raise TypeError(f"no reader for {hint!r}")
    if hint is Any:
        return (lambda v, where, key: v), "any value"
    scalar = {str: (lambda v: type(v) is str, "a string"),
              bool: (lambda v: type(v) is bool, "true or false"),
              int: (is_int, "an integer"), float: (is_number, "a number")}.get(hint)
    if scalar is not None:
        return _scalar(*scalar, nullable)
    tail = " or null" if nullable else ""
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item, what = _checker(args[0])
        what_all = f"a list of {_plural(what)}{tail}"

        def many(v: Any, where: str, key: str) -> Any:
            if nullable and v is None:
                return None
            if type(v) is not list and type(v) is not tuple:
                raise expected(where, key, what_all, v)
            return tuple(item(x, where, f"{key}[{i}]") for i, x in enumerate(v))

        return many, what_all
    if origin is tuple and args and Ellipsis not in args:  # (name, share): fixed length
        items = [_checker(a) for a in args]
        what_fixed = f"a list of {len(items)} ({', '.join(w for _, w in items)}){tail}"

        def fixed(v: Any, where: str, key: str) -> Any:
            if nullable and v is None:
                return None
            if (type(v) is not list and type(v) is not tuple) or len(v) != len(items):
                raise expected(where, key, what_fixed, v)
            return tuple(c(x, where, f"{key}[{i}]") for i, ((c, _), x) in
                         enumerate(zip(items, v)))

        return fixed, what_fixed
    if origin is dict or hint is dict:
        def obj(v: Any, where: str, key: str) -> Any:
            if nullable and v is None:
                return None
            if type(v) is not dict:
                raise expected(where, key, "an object" + tail, v)
            return dict(v)

        return obj, "an object" + tail
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        reader = reader_of(hint)
        what = f"an object ({hint.__name__}){tail}"

        def nested(v: Any, where: str, key: str) -> Any:
            if nullable and v is None:
                return None
            return reader(v, where, key, what)

        return nested, what
    raise TypeError(f"no reader for {hint!r}")


def _plural(what: str) -> str:
    for a in ("an object (", "a ", "an "):
        if what.startswith(a):
            return what[len(a):].rstrip(")") + "s" if a.endswith("(") else what[len(a):] + "s"
    return what


@dataclass(frozen=True)
class _Field:
    name: str
    check: Check
    required: bool


_READERS: dict[type, Reader] = {}


def reader_of(cls: type, overrides: Mapping[str, Check] | None = None
              ) -> Reader:
    """``read(value, where, key)``: an instance of dataclass ``cls`` from a JSON object,
    every field checked against its annotation (``key`` names the object in an error:
    ``usage``, ``events[3]``; "" at the top). A missing field with a default takes it; a
    missing one without is an error; a key the class does not have is ignored (a later
    Strata's field, read by an older one). ``overrides``: a field's own checker (a hot
    field read a million times a run)."""
    if cls in _READERS and not overrides:
        return _READERS[cls]
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        check = (overrides or {}).get(f.name) or _checker(hints[f.name])[0]
        required = (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING)
        fields.append(_Field(f.name, check, required))

    def read(v: Any, where: str, key: str = "", what: str = "") -> Any:
        if type(v) is not dict:
            raise expected(where, key or cls.__name__, what or f"an object ({cls.__name__})",
                           v)
        kw = {}
        for f in fields:
            sub = f"{key}.{f.name}" if key else f.name
            if f.name in v:
                kw[f.name] = f.check(v[f.name], where, sub)
            elif f.required:
                raise FormatError(f"{where}: key {sub!r}: missing")
        try:
            return cls(**kw)
        except (TypeError, ValueError) as exc:  # the class's own check (__post_init__)
            raise FormatError(f"{where}: key {key or cls.__name__!r}: {exc}") from None

    if not overrides:
        _READERS[cls] = read
    return read


def check_present(cls: type, v: Any, where: str, key: str) -> None:
    """The keys of object ``v`` that name fields of dataclass ``cls`` hold their types
    (nested objects whole); missing ones are not an error. For an object read back by
    a tolerant reader that recomputes what it lacks (a recorded verdict)."""
    if type(v) is not dict:
        raise expected(where, key, f"an object ({cls.__name__})", v)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in v:
            _checker(hints[f.name])[0](v[f.name], where, f"{key}.{f.name}")


# --- shapes: JSON objects that no dataclass types (the manifest, a case's params) ---------

# A shape is a leaf kind (STR, INT, NUM, BOOL, OBJ), ("?", shape) for "or null", ("list", shape),
# ("map", shape) for an object whose every value has that shape, or {key: shape} for an
# object with these keys (others free; a key whose shape is not ("?", ...) is required).
STR, INT, NUM, BOOL, OBJ = "string", "integer", "number", "boolean", "object"
_WORDS = {STR: "a string", INT: "an integer", NUM: "a number", BOOL: "true or false",
          OBJ: "an object"}
_TEST: dict[str, Callable[[Any], bool]] = {
    STR: lambda v: type(v) is str, INT: is_int, NUM: is_number,
    BOOL: lambda v: type(v) is bool, OBJ: lambda v: type(v) is dict}


def opt(shape: Any) -> tuple[str, Any]:
    return ("?", shape)


def _shape_words(shape: Any) -> str:
    if isinstance(shape, str):
        return _WORDS[shape]
    if isinstance(shape, dict):
        return "an object"
    kind, inner = shape
    if kind == "?":
        return _shape_words(inner) + " or null"
    return "a list" if kind == "list" else "an object"


def check_shape(v: Any, shape: Any, where: str, key: str) -> None:
    """``v`` has ``shape``, else FormatError naming ``where`` and ``key``."""
    if isinstance(shape, str):
        if not _TEST[shape](v):
            raise expected(where, key, _WORDS[shape], v)
        return
    if isinstance(shape, dict):
        if type(v) is not dict:
            raise expected(where, key, "an object", v)
        for k, sub in shape.items():
            if k in v:
                check_shape(v[k], sub, where, f"{key}.{k}")
            elif not (isinstance(sub, tuple) and sub[0] == "?"):
                raise FormatError(f"{where}: key {f'{key}.{k}'!r}: missing")
        return
    kind, inner = shape
    if kind == "?":
        if v is not None:
            check_shape(v, inner, where, key)
        return
    if kind == "list":
        if type(v) is not list:
            raise expected(where, key, f"a list ({_shape_words(inner)} each)", v)
        for i, x in enumerate(v):
            check_shape(x, inner, where, f"{key}[{i}]")
        return
    if type(v) is not dict:  # "map"
        raise expected(where, key, f"an object ({_shape_words(inner)} per key)", v)
    for k, x in v.items():
        check_shape(x, inner, where, f"{key}.{k}")


# --- JSON lines with their numbers ----------------------------------------------------------

TORN = "torn line (the run ended mid-write)"


@dataclass
class JsonLines:
    """The objects of a JSON-lines file with their line numbers. ``torn`` names a last
    line cut mid-write (``requests.jsonl:N: torn line ...``), which is not among them:
    a last line without its newline that is not whole JSON (one that is whole lost only
    its newline, and is read)."""

    path: Path
    torn: str | None = None

    def read(self, must_contain: bytes | None = None, *,
             live: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(line number, object)`` of each line. ``must_contain``: lines without these
        bytes are skipped unparsed (a cheap filter). ``live``: the file is still being
        written (a case's teardown): an unreadable last line is skipped, whatever it is.
        Raises FormatError for any other line that is not UTF-8, not JSON or not an
        object."""
        if not self.path.exists():
            return
        where = str(self.path)
        with self.path.open("rb") as fh:
            prev: tuple[int, bytes] | None = None
            for n, raw in enumerate(fh, 1):
                if prev is not None:
                    yield from _one(where, *prev, must_contain)
                prev = (n, raw)
        if prev is None:
            return
        n, raw = prev
        try:
            last = list(_one(where, n, raw, must_contain))
        except FormatError:
            if live:
                return
            if raw.endswith(b"\n"):
                raise
            self.torn = f"{self.path.name}:{n}: {TORN}"
            return
        yield from last


def _one(where: str, n: int, raw: bytes,
         filt: bytes | None) -> Iterator[tuple[int, dict[str, Any]]]:
    if filt is not None and filt not in raw:
        return
    if not raw.strip():
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}:{n}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                          f"{exc.start + 1})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where}:{n}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise FormatError(f"{where}:{n}: not JSON (nested too deep)") from None
    if type(d) is not dict:
        raise FormatError(f"{where}:{n}: expected a JSON object, got {shown(d)}")
    yield n, d
