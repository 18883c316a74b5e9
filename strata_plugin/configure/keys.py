"""One declaration per profile key: its field says everything about it.

A profile key is a dataclass field (``configure/profile.py``, ``configure/load_spec.py``)
declared with :func:`key`: the annotation is its type, the field's default is its
default, and the field's metadata holds the rest (a :class:`Key`): its bounds, its
allowed values, the rule a value must follow and its one-line meaning. The profile
reader takes a missing key's default, a number's bounds and a choice's values from
there, and so does the reference (``configure/profile_doc.py`` renders
docs/profile.md), so the two cannot drift apart.

Standard library only (``configure/load_spec.py`` uses it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

#: The field metadata entry that holds a key's :class:`Key`.
METADATA = "strata_key"


@dataclass(frozen=True)
class Key:
    """What a profile key's field says beyond its type and default."""

    #: one line: what the key is for
    doc: str
    #: bounds of a number (each value of a table of numbers), both inclusive; None: none
    lo: float | None = None
    hi: float | None = None
    #: the values a string may take; a callable where they are known only at load time
    #: (installed plugins' engines), with ``rule`` saying so in the reference
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    #: the rule a value follows where it is not a plain bound or choice, as the reader's
    #: error message and the reference say it
    rule: str = ""
    #: the default as the reference shows it, where the reader computes it (the engine's
    #: API, one local node); "" shows the field's default
    shown: str = ""
    #: the key's name in the TOML file where it is not the field's
    toml: str = ""

    def bounds(self) -> str:
        """The bounds column of the reference: ``[lo, hi]``, the choices or the rule."""
        if self.lo is not None and self.hi is not None:
            return f"[{_num(self.lo)}, {_num(self.hi)}]"
        if self.choices and not callable(self.choices):
            return ", ".join(f"`{c}`" for c in self.choices)
        return self.rule


def key(default: Any = MISSING, *, doc: str, lo: float | None = None, hi: float | None = None,
        choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = (), rule: str = "",
        shown: str = "", toml: str = "", default_factory: Any = MISSING,
        **field_kw: Any) -> Any:
    """A dataclass field that is a profile key: ``dataclasses.field`` with a :class:`Key`."""
    if (lo is None) != (hi is None):
        raise ValueError("a key's bounds are both given or neither")
    meta = {METADATA: Key(doc, lo, hi, choices, rule, shown, toml)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta,
                             **field_kw)


def key_of(f: dataclasses.Field) -> Key | None:
    """The :class:`Key` a field was declared with (None: not a profile key)."""
    return f.metadata.get(METADATA)


def toml_name(f: dataclasses.Field) -> str:
    k = key_of(f)
    return (k.toml if k is not None and k.toml else "") or f.name


def field_for(cls: type | None, name: str) -> dataclasses.Field | None:
    """The field of ``cls`` that TOML key ``name`` fills, or None."""
    for f in dataclasses.fields(cls) if cls is not None else ():
        if toml_name(f) == name:
            return f
    return None


def default_of(f: dataclasses.Field) -> Any:
    """The field's default (``...`` where it has none: the key is required)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return ...


def _num(v: float) -> str:
    """A bound as the reference writes it: 0.1, 3600, 1e+13."""
    return str(v) if isinstance(v, int) else format(v, "g")
