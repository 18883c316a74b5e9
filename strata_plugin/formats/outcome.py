"""The run's outcome: complete, or incomplete for these reasons, in one typed value.

Why one value: a run is incomplete for many reasons found in many places (a server that
did not start, an agent lost, a case whose requests mostly failed, an interrupt, a
report that could not be written, a raw file torn mid-line, a run killed before its
end), and each used to rewrite one string. Now each place appends a typed
:class:`Reason` to the run's :class:`RunOutcome`, which never forgets one (a failed
report write adds to the earlier reasons), and everything else is derived from it:
``complete`` (no reason), the manifest's ``incomplete_reason`` (the reasons' words,
joined by ``; ``: what older readers and the report's first lines show) and
``incomplete_reasons`` (each reason typed, for tools).

It lives in ``formats/`` because it is read back: the live run writes it into
``manifest.json`` and the offline report (``python -m strata_plugin report DIR``) reads
it from there with :meth:`RunOutcome.from_manifest`, which also says what the manifest
alone shows (a run killed before its end marker), and adds what only the raw files show
(a torn line).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Every kind of reason, with the words that lead its detail (``{}``: the detail). One
#: table, so the manifest's words for a kind are written in one place.
KINDS: dict[str, str] = {
    "preflight_failed": "preflight failed: {}",  # a port, tool, node or GPU not ready
    "server_failed": "{}",  # "server X: ..." could not be started or reached
    "container_left": "{}",  # "server X: container ... still exists"
    "agent_lost": "{}",  # "agent on N lost during ...; ..."
    "requests_failed": "{}",  # "case X: requests_failed: 4 of 4 requests failed ..."
    "interrupted": "interrupted",  # Ctrl-C / SIGTERM
    "interrupted_in_report": "interrupted while writing the report",
    "run_folder_failed": "could not write the run folder {}",  # "DIR: OSError ..."
    "report_failed": "report failed: {}",
    "torn_line": "{}",  # "requests.jsonl:1234: torn line (the run ended mid-write)"
    "not_finished": "the run did not finish: {}",  # killed: no end marker
    "recorded": "{}",  # words an older Strata recorded, without a kind
}

#: Reasons that fail the run even when every test passed: the run is left without its
#: report or with damaged raw data, which no test can see. (The others fail a test
#: already, as a server that did not start or a case whose requests failed, stop the
#: run, as an interrupt, or leave the measurements standing, as a lost and restarted
#: agent, and say so.)
FAILS_RUN = frozenset({"report_failed", "run_folder_failed", "torn_line", "not_finished"})

#: The manifest's keys this module writes and reads.
WORDS_KEY = "incomplete_reason"
REASONS_KEY = "incomplete_reasons"
#: The run's end marker: written once every raw file is whole, before the report.
END_KEY = "finished_utc"


@dataclass(frozen=True)
class Reason:
    """One reason the run is incomplete: its kind (:data:`KINDS`) and what happened."""

    kind: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown reason kind {self.kind!r}")

    @property
    def words(self) -> str:
        return KINDS[self.kind].format(self.detail)

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail, "words": self.words}


class RunOutcome:
    """The reasons a run is incomplete, in the order they were found; append-only.

    ``complete`` is true when there is none. Safe to add to from several threads (an
    agent's exit callback, the main thread)."""

    def __init__(self, reasons: Iterable[Reason] = ()) -> None:
        self._lock = threading.Lock()
        self._reasons: list[Reason] = []
        for r in reasons:
            self._append(r)

    def _append(self, r: Reason) -> bool:
        if r in self._reasons:  # the same reason found twice is one reason
            return False
        self._reasons.append(r)
        return True

    def add(self, kind: str, detail: str = "") -> bool:
        """Append a reason; False when the run already had exactly this one."""
        r = Reason(kind, detail)
        with self._lock:
            return self._append(r)

    def extend(self, reasons: Iterable[Reason]) -> None:
        with self._lock:
            for r in reasons:
                self._append(r)

    @property
    def reasons(self) -> tuple[Reason, ...]:
        with self._lock:
            return tuple(self._reasons)

    def has(self, kind: str) -> bool:
        return any(r.kind == kind for r in self.reasons)

    @property
    def complete(self) -> bool:
        return not self.reasons

    @property
    def fails_run(self) -> bool:
        """A reason in :data:`FAILS_RUN`: the pytest run exits non-zero for it."""
        return any(r.kind in FAILS_RUN for r in self.reasons)

    @property
    def words(self) -> str:
        """The manifest's ``incomplete_reason``: every reason's words, ``; ``-joined."""
        return "; ".join(r.words for r in self.reasons)

    def manifest_fields(self) -> dict[str, Any]:
        """What the manifest records of the outcome (``complete`` is written apart: it
        is true only once the report is on disk)."""
        rs = self.reasons
        return {WORDS_KEY: "; ".join(r.words for r in rs) or None,
                REASONS_KEY: [r.to_json() for r in rs]}

    def to_json(self) -> dict[str, Any]:
        """The outcome in ``summary.json``: complete, the words and each reason."""
        return {"complete": self.complete, **self.manifest_fields()}

    def __repr__(self) -> str:
        return f"RunOutcome({list(self.reasons)!r})"

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> RunOutcome:
        """The outcome a run folder's manifest records, read after the run.

        The typed reasons where the manifest has them, else the words of an older
        Strata as one ``recorded`` reason. A manifest that is not ``complete: true`` and
        gives no reason is a run that did not finish: killed before its end marker
        (``finished_utc``), or while its report was being written. (The live run passes
        its own outcome to the report instead: its manifest says ``complete: false``
        while the report is written.)
        """
        out = cls()
        typed = manifest.get(REASONS_KEY)
        if isinstance(typed, list) and typed:
            out.extend(Reason(r["kind"] if r.get("kind") in KINDS else "recorded",
                              str(r.get("detail") if r.get("kind") in KINDS
                                  else r.get("words") or r.get("detail") or ""))
                       for r in typed if isinstance(r, Mapping))
        elif manifest.get(WORDS_KEY):
            out.add("recorded", str(manifest[WORDS_KEY]))
        if manifest.get("complete") is not True and out.complete:
            if "complete" not in manifest:
                out.add("not_finished", "manifest.json has no 'complete' (not a finished run)")
            elif not manifest.get(END_KEY):
                out.add("not_finished", f"no end marker (manifest.json has no {END_KEY!r} "
                        "and 'complete' is false): it was killed or lost its host mid-run")
            else:
                out.add("not_finished", "it ended while its report was being written "
                        "(manifest.json 'complete' is false, no reason recorded)")
        return out
