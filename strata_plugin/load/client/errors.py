"""One exception type that already knows its record error class."""

from __future__ import annotations

from strata_plugin.errors import StrataError
from strata_plugin.formats.records import ERROR_CLASSES, RequestError


class StreamError(StrataError):
    """Raised inside the client; :func:`send_streaming` turns it into a RequestError."""

    def __init__(self, cls: str, message: str, http_status: int | None = None) -> None:
        if cls not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {cls!r}")
        super().__init__(message)
        self.cls = cls
        self.message = message
        self.http_status = http_status

    def to_record(self) -> RequestError:
        return RequestError(cls=self.cls, message=self.message, http_status=self.http_status)
