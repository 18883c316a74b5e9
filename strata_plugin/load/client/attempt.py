"""One request's life outside the body: build, send, wait for headers, make the record."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import time
from collections.abc import Mapping, Sequence

import requests
from urllib3.exceptions import (
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
)

from strata_plugin.configure.credentials import secret_values
from strata_plugin.formats.records import RequestRecord
from strata_plugin.limits import max_events
from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.flavours import flavour, merge_body
from strata_plugin.load.client.http1 import head_problem
from strata_plugin.load.client.parse_base import as_id
from strata_plugin.load.client.spec import RequestSpec, Timeouts

_ERROR_BODY_BYTES = 64 * 1024  # how much of a non-2xx body is read

_BASE_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    # A compressed stream is decoded in blocks, which would delay events.
    "Accept-Encoding": "identity",
}


class Attempt:
    """Mutable state of one request while it runs; frozen into a record at the end.

    Building the body raises ValueError for a spec the API cannot express (a
    harness bug); everything after that ends up in ``error`` instead.
    """

    def __init__(
        self,
        session: requests.Session,
        base_url: str,
        api: str,
        spec: RequestSpec,
        scheduled_ns: int,
        timeouts: Timeouts,
        headers: Mapping[str, str] | None,
    ) -> None:
        f = flavour(api)
        body = merge_body(f.body(spec), spec.extra_body)
        hdrs = dict(_BASE_HEADERS)
        hdrs.update(headers or {})
        # the credential headers' values only: "Connection: close" is not a secret
        self.secrets = secret_values(headers or {})
        self.prep = session.prepare_request(
            requests.Request(
                "POST",
                base_url.rstrip("/") + f.path,
                data=json.dumps(body, separators=(",", ":")).encode(),
                headers=hdrs,
            )
        )
        self.session = session
        self.spec = spec
        self.api = api
        self.scheduled_ns = scheduled_ns
        self.t = timeouts
        self.core = StreamCore(f.parser(), timeouts.max_event_bytes,
                               max_events(spec.max_tokens))
        self.dispatched_ns = 0
        self.sent_ns: int | None = None  # the request's last byte left (the loop knows)
        self.deadline_ns: int | None = None
        self.first_byte_ns: int | None = None
        self.http_status: int | None = None
        self.content_type: str | None = None  # the response's, to name a non-stream reply
        #: the response's X-Request-Id (vLLM with --enable-request-id-headers, gateways)
        self.id_header: str | None = None
        self.error: StreamError | None = None

    def open(self) -> requests.Response | None:
        """Send and wait for the response headers; None (with ``error`` set) on failure."""
        t = self.t
        head_s = t.read_s if t.total_s is None else min(t.read_s, t.total_s)
        self.dispatched_ns = time.monotonic_ns()
        if t.total_s is not None:
            self.deadline_ns = self.dispatched_ns + int(t.total_s * 1e9)
        try:
            resp = self.session.send(
                self.prep, stream=True, timeout=(t.connect_s, head_s), allow_redirects=False
            )
        except requests.exceptions.RequestException as e:
            self.error = send_error(e, t)
            return None
        except Exception as e:  # a client bug must still come back as a record
            self.error = StreamError("client", f"{type(e).__name__}: {e}")
            return None
        self.first_byte_ns = time.monotonic_ns()
        self.http_status = resp.status_code
        self.content_type = resp.headers.get("Content-Type")
        self.id_header = resp.headers.get("X-Request-Id")
        if not 200 <= resp.status_code < 300:
            self.error = StreamError(
                "http_status",
                f"HTTP {resp.status_code}: {_error_body(resp)}",
                http_status=resp.status_code,
            )
            resp.close()
            return None
        problem = head_problem(resp.headers, _defects(resp))
        if problem is not None:
            self.error = StreamError("malformed_response", problem)
            resp.close()
            return None
        return resp

    def record(self) -> RequestRecord:
        """The record of this attempt; never raises (a bug here is a ``client`` error record,
        so that no driver is left without a record to hand back)."""
        try:
            return self._record()
        except Exception as e:
            self.error = StreamError("client", f"building the record: {type(e).__name__}: {e}")
        try:
            return self._record()
        except Exception:
            return RequestRecord(
                request_id=self.spec.request_id,
                case_id=self.spec.case_id,
                phase=self.spec.phase,
                api=self.api,
                scheduled_ns=self.scheduled_ns,
                dispatched_ns=self.dispatched_ns,
                first_byte_ns=self.first_byte_ns,
                error=self.error.to_record(),
                isl=self.spec.isl,
                osl=self.spec.max_tokens,
            )

    def _record(self) -> RequestRecord:
        core, p = self.core, self.core.parser
        text = p.output_text
        extra = dict(p.extra)
        extra["n_sse_events"] = p.n_events
        extra["n_bytes"] = core.n_bytes
        if self.sent_ns is not None:
            extra["sent_ns"] = self.sent_ns
        if core.first_ns is not None:
            extra["first_body_ns"] = core.first_ns
        if self.http_status is not None:
            extra["http_status"] = self.http_status
        if p.reasoning_parts:
            extra["reasoning_text"] = p.reasoning_text
        if self.id_header and p.server_id and self.id_header != p.server_id:
            extra["x_request_id"] = self.id_header[:200]  # a gateway's, beside the engine's
        if (
            not core.events
            and p.n_events
            and not p.saw_finish
            and (self.error is None or self.error.cls == "truncated_stream")
        ):
            self.error = no_tokens_error(p.n_events, self.api, core.first_event)
        if (self.error is not None and self.error.cls == "truncated_stream"
                and not p.n_events and self.content_type is not None
                and "event-stream" not in self.content_type.lower()):
            self.error = not_streaming_error(self.http_status, self.content_type, core)
        err = None
        if self.error is not None:
            self.error.message = scrub(self.error.message, self.secrets)
            err = self.error.to_record()
        timings, engine = p.timings, p.engine_clocks()
        if p.clock_dropped:  # counted per case with the reasons (analysis/engine_clocks.py)
            extra["engine_clock_dropped"] = dict(sorted(p.clock_dropped.items()))
        return RequestRecord(
            request_id=self.spec.request_id,
            case_id=self.spec.case_id,
            phase=self.spec.phase,
            api=self.api,
            scheduled_ns=self.scheduled_ns,
            dispatched_ns=self.dispatched_ns,
            first_byte_ns=self.first_byte_ns,
            events=tuple(core.events),
            done_ns=core.done_ns if core.done_ns is not None else core.eof_ns,
            usage=p.usage,
            timings=timings,
            finish_reason=p.finish_reason,
            output_text=text,
            output_sha256=hashlib.sha256(text.encode()).hexdigest(),
            error=err,
            isl=self.spec.isl,
            osl=self.spec.max_tokens,
            extra=extra,
            engine=engine,
            server_request_id=p.server_id or as_id(self.id_header),
        )


def no_tokens_error(n_events: int, api: str, first_event: str | None) -> StreamError:
    """Events came but none parsed as a token, and no finish: another API's stream."""
    first = (first_event or "")[:500]
    return StreamError(
        "no_tokens",
        f"{n_events} SSE events, 0 tokens parsed as {api}; does the server speak {api}? "
        f"first event: {first}",
    )


def not_streaming_error(status: int | None, content_type: str, core: StreamCore) -> StreamError:
    """A whole reply that is not an event stream: the server ignored ``"stream": true``
    (or a proxy buffered it into one body), so there are no token times to measure."""
    start = " ".join(core.held.decode("utf-8", "replace").split())[:300]
    return StreamError(
        "not_streaming",
        f"HTTP {status} with Content-Type {content_type}: a complete reply of {core.n_bytes} "
        f"bytes and 0 SSE events, not a stream (does the server or a proxy ignore "
        f"\"stream\": true?); it starts: {start}",
    )


def _defects(resp: requests.Response) -> list[str]:
    """What http.client found wrong in the header lines (it keeps going: a line without a
    colon ends the headers, and the lines after it are lost, framing included)."""
    msg = getattr(getattr(resp.raw, "_original_response", None), "msg", None)
    return [type(d).__name__ for d in getattr(msg, "defects", None) or ()]


def send_error(e: requests.exceptions.RequestException, t: Timeouts) -> StreamError:
    """Map what requests raised before any response into an error class."""
    if isinstance(e, requests.exceptions.ConnectTimeout):
        return StreamError("timeout", f"connect timed out after {t.connect_s:g} s")
    if isinstance(e, requests.exceptions.ReadTimeout):
        return StreamError("timeout", "no response headers within the read timeout")
    if isinstance(e, requests.exceptions.ConnectionError):
        reason = e.args[0] if e.args else None
        if isinstance(reason, MaxRetryError):
            reason = reason.reason
        if isinstance(reason, NewConnectionError):  # before its base class ConnectTimeoutError
            return StreamError("connect", f"could not connect: {_short(reason)}")
        if isinstance(reason, ConnectTimeoutError):
            return StreamError("timeout", f"connect timed out after {t.connect_s:g} s")
        if isinstance(reason, ProtocolError):
            if _malformed_head(reason):
                return StreamError("malformed_response", f"malformed response: {_short(reason)}")
            return StreamError("reset", f"connection closed before a response: {_short(reason)}")
        return StreamError("connect", f"connection failed: {_short(e)}")
    return StreamError("client", f"{type(e).__name__}: {_short(e)}")


def _malformed_head(e: ProtocolError) -> bool:
    """http.client rejected the head itself (not an EOF inside it): a whole status line
    that is not HTTP/1.x, a header line or a head too long, too many headers.

    An EOF inside the status line reads as a BadStatusLine too, of a line without its
    end; like an EOF anywhere in the head (and like the loop), that is a ``reset``.
    """
    inner = e.args[-1] if e.args else None
    if isinstance(inner, http.client.RemoteDisconnected):
        return False
    if isinstance(inner, http.client.BadStatusLine):
        line = inner.args[0] if inner.args else ""
        return isinstance(line, str) and line.endswith("\n")
    return isinstance(inner, http.client.HTTPException) and not isinstance(
        inner, http.client.IncompleteRead
    )


def _short(e: object) -> str:
    return str(e)[:300]


def _error_body(resp: requests.Response) -> str:
    """The start of a non-2xx body: at most 64 KiB, for at most a few seconds."""
    raw, got, n = resp.raw, [], 0
    end = time.monotonic() + 5.0
    try:
        while n < _ERROR_BODY_BYTES and time.monotonic() < end:
            chunk = raw.read1(_ERROR_BODY_BYTES - n)
            if not chunk:
                break
            got.append(chunk)
            n += len(chunk)
    except Exception as e:  # the status is the error; the body is a bonus
        if not got:
            return f"(body unreadable: {type(e).__name__})"
    return b"".join(got).decode("utf-8", "replace")[:500]


_USERINFO = re.compile(r"//[^/@\s]+@")


def scrub(msg: str, secrets: Sequence[str]) -> str:
    """Drop URL credentials and the given secrets (the credential headers' values,
    :func:`~strata_plugin.configure.credentials.secret_values`) from an error message."""
    msg = _USERINFO.sub("//***@", msg)
    for s in secrets:
        if s:
            msg = msg.replace(s, "***")
    return msg
