"""The worker pool, re-exported for the tests and benchmarks that import it from here.

The pool is on the run path now: :mod:`strata_plugin.load.pool`.
"""

from strata_plugin.load.pool import (  # noqa: F401
    STREAMS_PER_LOOP,
    ShardedStreamRunner,
    default_processes,
    run_streams,
)
