"""The case ``--strata-workload`` generates: one workload, from the command line.

Collected only when that option is given (plugin/hooks.py adds this file to the
paths pytest collects); ``python -m strata_plugin bench`` runs it the same way. The
workload runs as stated, not scaled by the profile, so ``isl=256`` sends 256 tokens.
"""

from __future__ import annotations

from strata_plugin.plugin.options import adhoc_workload


def test_strata_workload(strata, request) -> None:
    w = adhoc_workload(request.config)
    assert w is not None, "collected without --strata-workload"
    result = strata.run(w, case_id=w.name, scale=False)
    assert not result.problems, "\n".join(result.problems)
