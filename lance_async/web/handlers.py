"""Errors as HTTP responses: statuses, JSON payloads and the exception handlers."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from ..errors import (
    BackpressureTimeoutError,
    ClosedError,
    ConflictError,
    DatasetNotFoundError,
    FilterError,
    InvalidInputError,
    LanceAsyncError,
    PayloadTooLargeError,
    SourceError,
    StorageFullError,
    StorageTimeoutError,
    StorageUnavailableError,
    WriterFailedError,
)
from .errors import (
    AuthenticationError,
    BodyConsumedError,
    BodyTimeoutError,
    ClientDisconnectedError,
    EmptyBodyError,
    NoShardWriterError,
    NotAcceptableError,
    PermissionDeniedError,
    ServerBusyError,
    UnknownTableError,
    UnsupportedMediaTypeError,
)
from .responses import dumps_json

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = [
    "error_payload",
    "http_status",
    "install_error_handlers",
    "lance_error_handler",
    "public_error_name",
    "www_authenticate",
]

log = logging.getLogger("lance_async.web")

_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (NotAcceptableError, 406),
    (ClientDisconnectedError, 499),
    (BodyTimeoutError, 408),
    (ServerBusyError, 503),
    (BodyConsumedError, 400),
    (EmptyBodyError, 400),
    (FilterError, 400),
    (UnknownTableError, 404),
    (DatasetNotFoundError, 404),
    (StorageFullError, 507),
    (StorageUnavailableError, 503),
    (StorageTimeoutError, 503),
    (NoShardWriterError, 409),
    (ConflictError, 409),
    (BackpressureTimeoutError, 503),
    (WriterFailedError, 503),
    (ClosedError, 503),
    (InvalidInputError, 422),
    (SourceError, 400),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status for a lance_async error (500 for anything unknown).

    ======================================================  ======
    error                                                   status
    ======================================================  ======
    AuthenticationError (with WWW-Authenticate)             401
    PermissionDeniedError (with WWW-Authenticate)           403
    PayloadTooLargeError                                    413
    UnsupportedMediaTypeError                               415
    NotAcceptableError                                      406
    ClientDisconnectedError                                 499
    BodyTimeoutError                                        408
    ServerBusyError (with Retry-After)                      503
    BodyConsumedError, EmptyBodyError, FilterError          400
    UnknownTableError, DatasetNotFoundError                 404
    StorageFullError (the table's store is full)            507
    StorageUnavailableError, StorageTimeoutError            503
    other StorageError (permission, missing bucket)         500
    NoShardWriterError, ConflictError, ContentionError      409
    BackpressureTimeoutError, WriterFailedError, Closed...  503
    SchemaMismatchError, DecodeError, InvalidInputError     422
    other SourceError                                       400
    ======================================================  ======
    """
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def public_error_name(exc: BaseException) -> str:
    """The name of the public error type ``exc`` is: its own class's when
    :mod:`lance_async.errors` or :mod:`lance_async.web.errors` exports it (or
    it is a built-in), else its nearest such base class's (``DecodeError``
    for an internal subclass of it), so a client never sees an internal
    class name."""
    from .. import errors
    from . import errors as web_errors

    public = {module.__name__: set(module.__all__) for module in (errors, web_errors)}
    for kind in type(exc).__mro__:
        if kind.__module__ == "builtins" or kind.__name__ in public.get(kind.__module__, ()):
            return kind.__name__
    return "Exception"


def error_payload(exc: BaseException) -> dict[str, Any]:
    """The JSON body for an error: ``detail``, ``error`` (a public type name,
    see :func:`public_error_name`) and, when set, ``field``, ``limit``,
    ``maximum``, ``actual``, ``filter`` and ``retryable``."""
    payload: dict[str, Any] = {"detail": str(exc), "error": public_error_name(exc)}
    for attr in ("field", "limit", "maximum", "actual", "filter"):
        value = getattr(exc, attr, None)
        if value is not None:
            payload[attr] = value
    if getattr(exc, "retryable", False):
        payload["retryable"] = True
    return payload


async def lance_error_handler(request: Request, exc: Exception) -> Response:
    """Exception handler: a lance_async error as a JSON response (see :func:`http_status`).

    Retryable errors and 503s carry ``Retry-After`` (the error's
    ``retry_after`` seconds, rounded up; 1 by default).
    """
    status = http_status(exc)
    fields = {"table": request.path_params.get("name"), "status": status}
    if status == 499:
        log.info("lance_async: %s %s: %s", request.method, request.url.path, exc, extra=fields)
    elif status >= 500:
        log.error(
            "lance_async: %s %s failed: %r", request.method, request.url.path, exc, extra=fields
        )
    headers = {}
    if isinstance(exc, (AuthenticationError, PermissionDeniedError)):
        headers["WWW-Authenticate"] = www_authenticate(exc)
    if status == 503 or getattr(exc, "retryable", False):
        headers["Retry-After"] = str(max(1, math.ceil(getattr(exc, "retry_after", 1))))
    return Response(
        dumps_json(error_payload(exc)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def www_authenticate(exc: AuthenticationError | PermissionDeniedError) -> str:
    """The ``WWW-Authenticate`` challenge of a 401 or 403 (RFC 6750, section 3):
    ``Bearer realm="lance_async"``, with ``error="invalid_token"`` when
    credentials were sent but matched no key, or ``error="insufficient_scope"``
    and the ``scope`` needed when the key's scope is too narrow."""
    challenge = 'Bearer realm="lance_async"'
    if isinstance(exc, PermissionDeniedError):
        return f'{challenge}, error="insufficient_scope", scope="{exc.required}"'
    if exc.reason == "invalid":
        return f'{challenge}, error="invalid_token"'
    return challenge


def install_error_handlers(app: Starlette) -> None:
    """Answer every :class:`~lance_async.LanceAsyncError` with
    :func:`lance_error_handler` (a JSON body and the status of :func:`http_status`)."""
    app.add_exception_handler(LanceAsyncError, lance_error_handler)
