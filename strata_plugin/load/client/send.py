"""One streaming request in the caller's thread, always returning a RequestRecord."""

from __future__ import annotations

from collections.abc import Mapping

import requests

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.reader import read_blocking
from strata_plugin.load.client.spec import RequestSpec, Timeouts


def send_streaming(
    session: requests.Session,
    base_url: str,
    api: str,
    spec: RequestSpec,
    *,
    scheduled_ns: int,
    timeouts: Timeouts = Timeouts(),
    headers: Mapping[str, str] | None = None,
) -> RequestRecord:
    """Send ``spec`` to ``base_url`` in flavour ``api`` and record the stream.

    A server or network failure is a record with ``error`` set, never an
    exception. A spec the API cannot express (token ids to chat, an unknown
    api) raises ValueError before anything is sent: that is a harness bug.
    The calling thread wakes for every read; past ~100 concurrent streams use
    :class:`strata_plugin.load.client.mux.StreamMux`, whose ``send_streaming`` is
    a drop-in replacement that reads every body from one loop thread.
    """
    a = Attempt(session, base_url, api, spec, scheduled_ns, timeouts, headers)
    resp = a.open()
    if resp is not None:
        read_here(a, resp)
    return a.record()


def read_here(a: Attempt, resp: requests.Response) -> None:
    """Read the body in this thread; errors land in ``a.error``; the response is closed."""
    try:
        raw = resp.raw
        unframed = (not getattr(raw, "chunked", False)
                    and getattr(raw, "length_remaining", 0) is None)
        read_blocking(raw, a.core, a.t.read_s, a.deadline_ns, unframed)
    except StreamError as e:
        a.error = e
    except Exception as e:  # a client bug must still come back as a record
        a.error = StreamError("client", f"{type(e).__name__}: {e}")
    finally:
        resp.close()
