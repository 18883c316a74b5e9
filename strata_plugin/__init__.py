"""Strata: a pytest plugin that times every LLM request and explains why a server is slow.

The public API for case authors (docs/writing-cases.md). Names resolve lazily, so
importing the package (as pytest does for every run once it is installed) costs
nothing until a case uses them.

* ``Workload``: one workload (ISL, OSL, concurrency, requests, arrivals, prefix).
* ``Injection``: one request injected at a fixed offset into a case (mixed A/B).
* ``ABArm``: marks a case as one arm of an A/B group (``strata.run(w, ab=ABArm(...))``).
* ``CaseResult`` / ``CaseRunner``: what ``strata.run`` returns / what ``strata`` is.
* ``Effect``, ``effect``, ``mixed_effects``, ``outputs_identical``: A/B effects with
  95% intervals that name their unit of resampling (repetitions, or requests).
* ``json_fields``, ``code_passes``, ``extract_code``: output validators.
* ``StrataError``: the root of every exception Strata raises (``except StrataError``).
* fixtures ``strata`` (the case runner), ``strata_server`` (the server of one
  configuration), ``strata_session``, ``strata_config``.

PYTEST_DONT_REWRITE: pytest rewrites the assertions of an installed plugin's modules as
it imports them; ``python -m strata_plugin bench`` has imported this package before
pytest starts, and pytest then warned on every run (PytestAssertRewriteWarning: "Module
already imported so cannot be rewritten: strata_plugin"). This module has no assertion
to rewrite; the modules below it are still rewritten as pytest imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from strata_plugin.analysis.ab_groups import mixed_effects, outputs_identical
    from strata_plugin.analysis.effects import Effect, effect
    from strata_plugin.analysis.metrics import Slo
    from strata_plugin.analysis.sufficiency import SampleTarget
    from strata_plugin.errors import StrataError
    from strata_plugin.load.case_runner import ABArm, CaseResult, CaseRunner, Injection
    from strata_plugin.load.sweep import CapacitySweep
    from strata_plugin.load.trace import TraceWorkload, read_trace
    from strata_plugin.load.validators import code_passes, extract_code, json_fields
    from strata_plugin.load.workload import Workload

_WHERE = {
    "Workload": "strata_plugin.load.workload",
    "SampleTarget": "strata_plugin.analysis.sufficiency",
    "StrataError": "strata_plugin.errors",
    "CapacitySweep": "strata_plugin.load.sweep",
    "Slo": "strata_plugin.analysis.metrics",
    "TraceWorkload": "strata_plugin.load.trace",
    "read_trace": "strata_plugin.load.trace",
    "Injection": "strata_plugin.load.case_runner",
    "ABArm": "strata_plugin.load.case_runner",
    "CaseResult": "strata_plugin.load.case_runner",
    "CaseRunner": "strata_plugin.load.case_runner",
    "Effect": "strata_plugin.analysis.effects",
    "effect": "strata_plugin.analysis.effects",
    "mixed_effects": "strata_plugin.analysis.ab_groups",
    "outputs_identical": "strata_plugin.analysis.ab_groups",
    "json_fields": "strata_plugin.load.validators",
    "code_passes": "strata_plugin.load.validators",
    "extract_code": "strata_plugin.load.validators",
}
__all__ = [
    "ABArm",
    "CapacitySweep",
    "CaseResult",
    "CaseRunner",
    "Effect",
    "Injection",
    "SampleTarget",
    "Slo",
    "StrataError",
    "TraceWorkload",
    "Workload",
    "code_passes",
    "effect",
    "extract_code",
    "json_fields",
    "mixed_effects",
    "outputs_identical",
    "read_trace",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'strata_plugin' has no attribute {name!r}")
