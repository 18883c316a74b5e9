"""The report: per-case analysis, report.md, CSV/JSON files, plots, benchmark JSON.

What the plugin calls:

* ``summarize_case(run_dir, case_id) -> CaseAnalysis`` at a case's teardown;
* ``write_report(run_dir) -> Path`` at session end (and offline, from raw files);
* ``regression_check(records_by_case, baseline_dir, metric, max_worse_pct, alpha)``
  for ``--strata-baseline`` / ``--strata-max-regression``.

Imports are lazy: importing this package costs nothing until a function is called
(pandas and matplotlib stay out of ``pytest --help``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata_plugin.analysis.case_summary import CaseAnalysis, summarize_case
    from strata_plugin.analysis.regression import Regression, regression_check
    from strata_plugin.report.writer import write_report

__all__ = ["CaseAnalysis", "Regression", "regression_check", "summarize_case", "write_report"]

_WHERE = {
    "CaseAnalysis": "strata_plugin.analysis.case_summary",
    "summarize_case": "strata_plugin.analysis.case_summary",
    "Regression": "strata_plugin.analysis.regression",
    "regression_check": "strata_plugin.analysis.regression",
    "write_report": "strata_plugin.report.writer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
