"""An audit log of requests: who, which table, what operation, how many rows, what status.

:class:`AuditMiddleware` writes one line per request to the
``lance_async.web.audit`` logger once the response is complete (a streamed
scan: once its last row is sent)::

    audit key=ci table=events op=ingest rows=1000 status=200 client=10.0.0.7:51234 ms=84.2

``key`` is the id of the API key (``-`` without one; never the secret),
``op`` the route's name (``merge``, ``ingest``, ``rows``, ``lookup``,
``list_tables``, ...), ``rows`` what the handler reported (rows merged,
ingested, streamed or found; ``-`` when none). The same fields are on the
record as ``record.audit`` (a dict) for structured handlers. Requests to
``skip_paths`` (``/health`` by default) are logged only when they fail.

Who a request is comes from the :class:`~lance_async.web.auth.Principal`
that :class:`~lance_async.web.auth.ApiKeyAuth` leaves in the request scope
under :data:`~lance_async.web.auth.PRINCIPAL_SCOPE_KEY`; an app with its
own authentication leaves its own there (anything with a ``key_id``).
Handlers report rows with :func:`audit_rows`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import PRINCIPAL_SCOPE_KEY

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["AUDIT_SCOPE_KEY", "AuditMiddleware", "audit_rows", "install_audit_log"]

log = logging.getLogger("lance_async.web.audit")

#: The ASGI scope key of a request's :class:`_AuditNote`.
AUDIT_SCOPE_KEY = "lance_async.audit"


class _AuditNote:
    """What handlers add to a request's audit line."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: int | None = None


def audit_rows(request: Request, rows: int) -> None:
    """Report the rows a request merged, ingested, streamed or found (for its audit line).

    Does nothing when no :class:`AuditMiddleware` is installed.
    """
    note = request.scope.get(AUDIT_SCOPE_KEY)
    if isinstance(note, _AuditNote):
        note.rows = rows


class AuditMiddleware:
    """ASGI middleware: one ``lance_async.web.audit`` line per HTTP request.

    Parameters
    ----------
    app : ASGI app
    skip_paths : collection of str
        Paths logged only when their status is 400 or more (default
        ``("/health",)``: probes would drown the rest).

    Notes
    -----
    Logs after the app returns, so a streamed response is logged with the
    rows it sent; an exception from the app is logged with status 500 and
    raised again. Adds no task and no I/O of its own.
    """

    def __init__(self, app: ASGIApp, skip_paths: Collection[str] = ("/health",)) -> None:
        self.app = app
        self.skip_paths = frozenset(skip_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        note = _AuditNote()
        scope[AUDIT_SCOPE_KEY] = note
        status = 0
        started = time.perf_counter()

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message.get("status", 200))
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        except BaseException:
            status = status or 500
            raise
        finally:
            if status >= 400 or scope.get("path") not in self.skip_paths:
                self._log(scope, note, status, time.perf_counter() - started)

    @staticmethod
    def _log(scope: Scope, note: _AuditNote, status: int, seconds: float) -> None:
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        key = getattr(principal, "key_id", None) or "-"
        params = scope.get("path_params") or {}
        table = params.get("name") if isinstance(params, dict) else None
        route = scope.get("route")
        op = getattr(route, "name", None) or f"{scope.get('method')} {scope.get('path')}"
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        fields: dict[str, Any] = {
            "key": key,
            "table": table,
            "op": op,
            "rows": note.rows,
            "status": status,
            "client": where,
            "ms": round(seconds * 1000, 1),
        }
        log.info(
            "audit key=%s table=%s op=%s rows=%s status=%d client=%s ms=%.1f",
            key,
            "-" if table is None else str(table)[:128],
            op,
            "-" if note.rows is None else note.rows,
            status,
            where,
            seconds * 1000,
            extra={"audit": fields},
        )


def install_audit_log(app: Starlette, *, skip_paths: Collection[str] = ("/health",)) -> None:
    """Add :class:`AuditMiddleware` to ``app`` (inside the body guard, if one is installed)."""
    app.add_middleware(AuditMiddleware, skip_paths=skip_paths)
