"""The exact streaming client: one request in, one RequestRecord out.

``send_streaming`` is the whole API for one request; ``pool.run_streams``
spreads many over worker processes when one process of threads is too slow
to stamp events on time.
"""

from strata_plugin.load.client.send import send_streaming
from strata_plugin.load.client.spec import API_FLAVOURS, RequestSpec, Timeouts

__all__ = ["API_FLAVOURS", "RequestSpec", "Timeouts", "send_streaming"]
