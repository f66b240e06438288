"""FastAPI and Starlette integration: tables, streamed uploads and streamed scans.

Needs the ``fastapi`` extra (``pip install 'lance-async[fastapi]'``).

A sketch of an app (``lance_async.web.server`` is a complete one)::

    from fastapi import FastAPI, Request
    from lance_async.web import (
        DatasetDep, TableRegistry, install_body_guard, install_error_handlers,
        lance_lifespan, merge_body, request_batches, scan_response,
    )

    registry = TableRegistry({"events": "/data/events.lance"})
    app = FastAPI(lifespan=lance_lifespan(registry))
    install_body_guard(app)
    install_error_handlers(app)

    @app.post("/tables/{name}/merge")
    async def merge(request: Request, ds: DatasetDep, on: str):
        async with request_batches(request, ds.schema, required_columns=[on],
                                   spool=True) as body:
            result = await merge_body(ds, body, on)
        return {"inserted": result.num_inserted_rows, "updated": result.num_updated_rows}

    @app.get("/tables/{name}/rows")
    async def rows(request: Request, ds: DatasetDep, id_min: int = 0):
        return await scan_response(request, ds.scan(filter=f"id >= {id_min}"))

The package, one module per job (``lance_async.fastapi`` re-exports it all):
``limits`` (media types, body limits), ``bodies``
(bodies as record batches), ``receive`` (request bodies from ASGI, the body
guard), ``responses`` (encoders, streamed scans, JSON), ``writes`` (merge and
ingest of bodies), ``registry`` (tables by name, lifespan, dependencies),
``filters`` (query-string filters), ``handlers`` (errors as HTTP),
``errors`` (the HTTP errors), ``auth`` (API keys with scopes), ``audit`` (a
log line per request), ``routes`` (the table routes as a router),
``headlimits`` (request-head limits for uvicorn; not re-exported here, it
imports uvicorn), ``settings`` and ``server`` (the example app).

What is here
------------
:class:`TableRegistry`, :func:`lance_lifespan`
    Tables by name (never by path), opened at startup with their MemWAL
    shard writers; writers flushed and closed at shutdown.
:func:`get_registry`, :func:`get_table`, :func:`get_dataset`, :func:`get_writer`
    Dependencies (``TableDep``, ``DatasetDep``, ``WriterDep`` are the
    ``Annotated`` forms). An unknown name is a 404, never a file lookup.
:func:`request_batches`
    The request body as a one-shot stream of checked record batches (Arrow
    IPC stream, NDJSON, CSV), decoded incrementally (never on anyio's default
    thread pool), with limits (413) and a schema check before any write (422).
:func:`merge_body`, :func:`ingest_body`
    An upsert with one commit; a MemWAL write that checks and spools the
    whole body (disk past 4 MiB) before its first row reaches the writer,
    then streams it in and returns after the durable ack. A bad row or a
    client that disconnects mid-upload commits nothing.
:class:`BatchStreamResponse`, :func:`scan_response`
    Scans streamed as Arrow IPC or NDJSON; a client that leaves early stops
    the scan and closes its reader at once.
:func:`compile_filter`
    Row filters in an allowed form only (column, comparison, literal) unless
    the app enables raw Lance SQL.
:func:`table_router`
    The example app's table routes (list, merge, ingest, rows, lookup) as
    a router to include, each behind an authentication dependency.
:class:`ApiKeyAuth`, :class:`ApiKey`, :class:`Scope`, :class:`Principal`
    API keys with scopes (read, write, admin) as a FastAPI dependency
    (``Security(auth, scopes=["write"])``); 401 without a known key, 403
    out of scope. Any other dependency can take its place.
:class:`AuditMiddleware`, :func:`install_audit_log`, :func:`audit_rows`
    One log line per request: key id, table, operation, rows, status.
:class:`BodyDrainMiddleware`, :func:`install_body_guard`, :func:`install_error_handlers`
    Typed errors become JSON responses with the right status, and those
    responses reach clients that are still uploading; a body that a
    middleware read before the handler is a 400, never an empty write.

Retries of uploaded bodies
--------------------------
A request body is a one-shot (STREAMING) source: it cannot be read twice
from the client. pylance can retry a streamed merge itself
(``conflict_retries > 0``) by buffering the stream -- but it keeps up to
100 MB of it in memory before spilling (measured: a 100 MiB upload raised
peak RSS by about 138 MiB, against about 6 MiB with Lance's retries off).
:func:`merge_body` therefore defaults to ``replay="spool"``: the first pass
streams with Lance's retries off while the body is spooled (memory up to
4 MiB, then a temporary Arrow file); a commit conflict replays the spool as
a REPLAYABLE source through lance_async's own retry loop.

Threads
-------
Nothing here blocks the event loop or uses anyio's default thread pool (the
one Starlette uses for sync endpoints and dependencies): decoding and
encoding run on the library's ``stream`` limiter, engine calls on its
``engine`` limiter (see :func:`lance_async.configure_threads`). Slow
clients can exhaust those, never the app's own sync work.
"""

from __future__ import annotations

try:
    import fastapi as _fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lance_async.web (and lance_async.fastapi) need FastAPI: pip install 'lance-async[fastapi]'"
    ) from exc

from ..errors import FilterError, PayloadTooLargeError
from .audit import AuditMiddleware, audit_rows, install_audit_log
from .auth import PRINCIPAL_SCOPE_KEY, ApiKey, ApiKeyAuth, Principal, Scope, read_key_file
from .bodies import BodyBatches
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
from .filters import compile_filter
from .handlers import error_payload, http_status, install_error_handlers, lance_error_handler
from .limits import CSV, IPC_FILE, IPC_STREAM, NDJSON, BodyLimits, BodyStats, body_format
from .receive import BodyDrainMiddleware, install_body_guard, request_batches
from .registry import (
    DatasetDep,
    OpenTable,
    RegistryState,
    TableDep,
    TableRegistry,
    TableSpec,
    WriterDep,
    get_dataset,
    get_registry,
    get_table,
    get_writer,
    lance_lifespan,
)
from .responses import (
    BatchEncoder,
    BatchStreamResponse,
    dumps_json,
    json_response,
    jsonable_rows,
    make_encoder,
    negotiate_format,
    scan_response,
)
from .routes import RouteGauges, table_router
from .writes import ingest_body, merge_body

__all__ = [
    "CSV",
    "IPC_FILE",
    "IPC_STREAM",
    "NDJSON",
    "PRINCIPAL_SCOPE_KEY",
    "ApiKey",
    "ApiKeyAuth",
    "AuditMiddleware",
    "AuthenticationError",
    "BatchEncoder",
    "BatchStreamResponse",
    "BodyBatches",
    "BodyConsumedError",
    "BodyDrainMiddleware",
    "BodyLimits",
    "BodyStats",
    "BodyTimeoutError",
    "ClientDisconnectedError",
    "DatasetDep",
    "EmptyBodyError",
    "FilterError",
    "NoShardWriterError",
    "NotAcceptableError",
    "OpenTable",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Principal",
    "RegistryState",
    "RouteGauges",
    "Scope",
    "ServerBusyError",
    "TableDep",
    "TableRegistry",
    "TableSpec",
    "UnknownTableError",
    "UnsupportedMediaTypeError",
    "WriterDep",
    "audit_rows",
    "body_format",
    "compile_filter",
    "dumps_json",
    "error_payload",
    "get_dataset",
    "get_registry",
    "get_table",
    "get_writer",
    "http_status",
    "ingest_body",
    "install_audit_log",
    "install_body_guard",
    "install_error_handlers",
    "json_response",
    "jsonable_rows",
    "lance_error_handler",
    "lance_lifespan",
    "make_encoder",
    "merge_body",
    "negotiate_format",
    "read_key_file",
    "request_batches",
    "scan_response",
    "table_router",
]
