"""The errors of the HTTP helpers, each with its status.

They derive from :class:`~lance_async.LanceAsyncError` like every other
error of the library (``except LanceAsyncError`` still catches them), and
:func:`lance_async.web.handlers.http_status` gives their statuses. The
errors the lower layers raise as well stay in :mod:`lance_async.errors`
(:class:`~lance_async.errors.PayloadTooLargeError` for limits,
:class:`~lance_async.errors.FilterError` for filters).

The tree (their bases are in :mod:`lance_async.errors`)::

    LanceAsyncError
    ├── UnsupportedMediaTypeError                    no decoder for the Content-Type (415)
    ├── NotAcceptableError                           no encoder for the Accept header (406)
    ├── UnknownTableError                            no table registered under the name (404)
    ├── NoShardWriterError                           the table has no MemWAL writer in the app (409)
    ├── ServerBusyError                              too many uploads in flight (503, .retryable)
    ├── AuthenticationError                          no credentials, or unknown ones (401)
    ├── PermissionDeniedError                        the key's scope does not cover the call (403)
    ├── SourceConsumedError ─ BodyConsumedError      body already read (400)
    ├── SourceError ─ ClientDisconnectedError        client left mid-upload (499)
    ├── SourceError ─ BodyTimeoutError               client too slow mid-upload (408)
    └── InvalidInputError ─ EmptyBodyError           a body without rows (400)
"""

from __future__ import annotations

from ..errors import InvalidInputError, LanceAsyncError, SourceConsumedError, SourceError

__all__ = [
    "AuthenticationError",
    "BodyConsumedError",
    "BodyTimeoutError",
    "ClientDisconnectedError",
    "EmptyBodyError",
    "NoShardWriterError",
    "NotAcceptableError",
    "PermissionDeniedError",
    "ServerBusyError",
    "UnknownTableError",
    "UnsupportedMediaTypeError",
]


class UnsupportedMediaTypeError(LanceAsyncError):
    """The body's ``Content-Type`` has no decoder. Send Arrow IPC
    (``application/vnd.apache.arrow.stream``), NDJSON (``application/x-ndjson``)
    or CSV (``text/csv``, UTF-8)."""

    def __init__(self, message: str, *, content_type: str | None) -> None:
        super().__init__(message)
        self.content_type = content_type


class NotAcceptableError(LanceAsyncError):
    """The ``Accept`` header names no format this response can be sent in.
    Ask for ``application/vnd.apache.arrow.stream`` or ``application/x-ndjson``."""


class BodyConsumedError(SourceConsumedError):
    """The request body was already read (by a middleware or an earlier reader)
    before lance_async got it, so nothing was written. Read the body only once:
    middleware must not consume bodies that handlers stream."""


class ClientDisconnectedError(SourceError):
    """The client disconnected before the body ended; nothing was written."""


class BodyTimeoutError(SourceError):
    """The client sent the body too slowly (HTTP 408): no bytes for longer than
    ``BodyLimits.body_idle_timeout``, an average below
    ``BodyLimits.min_body_rate`` once ``body_rate_grace`` has passed, or
    longer in all than ``BodyLimits.max_body_time``. Nothing was written;
    send the body again, without pausing."""


class ServerBusyError(LanceAsyncError):
    """The server holds as many uploads as it takes at once (HTTP 503, with
    ``Retry-After``). Nothing was read or written; retry later.

    Attributes
    ----------
    retry_after : float
        Seconds to wait before retrying.
    """

    retryable = True

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EmptyBodyError(InvalidInputError):
    """The body held no bytes, or no rows; nothing was written (an empty write
    is never reported as a success)."""


class UnknownTableError(LanceAsyncError):
    """No table is registered under this name (HTTP 404). Table names are
    looked up in the app's :class:`TableRegistry`, never on disk.

    Attributes
    ----------
    name : str
        The name asked for (at most 128 characters of it).
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"no table named {name[:128]!r}")
        self.name = name[:128]


class NoShardWriterError(LanceAsyncError):
    """The table has no MemWAL shard writer in this app (HTTP 409). Register it
    with ``TableSpec(uri, shard_id=...)`` on a table where
    ``initialize_mem_wal`` ran."""


class AuthenticationError(LanceAsyncError):
    """The request carries no credentials, or credentials no key matches (HTTP 401,
    with ``WWW-Authenticate: Bearer``). Send ``Authorization: Bearer <token>``
    (or ``X-API-Key: <token>``) with a key the server knows.

    Attributes
    ----------
    reason : str
        ``"missing"`` (no credentials) or ``"invalid"`` (no key matches);
        ``"invalid"`` is told to the client as RFC 6750's ``invalid_token``.
    """

    def __init__(self, message: str, *, reason: str = "missing") -> None:
        super().__init__(message)
        self.reason = reason


class PermissionDeniedError(LanceAsyncError):
    """The key is known but its scope does not cover the call (HTTP 403): a
    ``read`` key asked to write, or any key but ``admin`` asked for what only
    ``admin`` may do. Use a key of the scope named, or widen the key's scope.

    Attributes
    ----------
    required : str
        The scope the call needs (``"read"``, ``"write"`` or ``"admin"``).
    key_id : str or None
        The id of the key that was refused (never its secret).
    """

    def __init__(self, message: str, *, required: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.required = required
        self.key_id = key_id
