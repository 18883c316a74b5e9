"""The pool's worker, re-exported: it lives on the run path now.

See :mod:`strata_plugin.load.pool_worker`.
"""

from strata_plugin.load.pool_worker import run_batch, serve  # noqa: F401
