"""What the session and the plugin ask of a dry run's plan: a protocol of its own, since
run/dry_run.py (the plan itself) imports the session."""

from __future__ import annotations

from typing import Protocol

from strata_plugin.formats.cases import CaseLine


class DryPlan(Protocol):
    """run/dry_run.DryRunPlan as the session sees it."""

    def add_case(self, line: CaseLine) -> None: ...

    def end_test(self, nodeid: str, block_id: str, planned: int, stopped: str) -> None: ...
