"""The example app: Lance tables behind FastAPI, runnable with one command.

Run it with ``lance-async serve --root DIR``. Needs the ``fastapi`` extra.

Tables
------
At startup every directory ``DIR/<name>.lance`` holding a Lance dataset is
registered as table ``<name>``; a table created later is found when a
request names it (or lists ``/tables``): the root is listed again, at most
once a second. Names are resolved through that registry only, never as paths. A table whose MemWAL
is initialized (``initialize_mem_wal``) gets a MemWAL writer: the routing
writer when the MemWAL has a sharding spec (every row to its own shard), or
lance_async's default shard of a table with manual shards; shard ids are
stable, so a restart replays their WALs. It takes writes through ``/ingest``
and ``/merge`` (both into the MemWAL) and serves reads from its LSM view.
The other tables take writes through ``/merge``. Run one server per
directory (a second one would fence the first's writers). A local
``<name>.lance`` that is a link (or under one) whose real path leaves the
root is not served (a warning says so); the others are opened by their real
paths.

Endpoints
---------
``POST /tables/{name}/merge?on=KEY[&base_table=true]``
    Reads the body (Arrow IPC stream, NDJSON or CSV) to its end into a spool
    (memory up to 4 MiB, then a temporary file), then merges the spool with
    one merge_insert (update matched rows, insert the rest; ``on`` defaults
    to the primary key, repeat it for composite keys; on a table with a
    primary key, any other ``on`` is a 422: it would insert a second row for
    a key the table holds) and answers the MergeResult as JSON. Conflicts replay the spool (see
    :func:`lance_async.fastapi.merge_body`). A table with a MemWAL takes the
    merge through it, as every merge path does (``mem_wal`` in the answer;
    ``base_table=true``: the base table, a 422 while the MemWAL holds any of
    the body's keys). Columns the body lacks keep their stored values in
    updated rows and are null in inserted ones.
``POST /tables/{name}/ingest``
    Reads the body to its end, checking every row and spooling it (memory
    up to 4 MiB, then a temporary file), then streams it into the table's
    MemWAL shard and answers after the durable ack (see
    :func:`lance_async.fastapi.ingest_body`): a bad row anywhere or a client
    that leaves mid-upload writes nothing.
``GET /tables/{name}/rows?filter=COL<op>VALUE&columns=a,b&limit=N``
    Streams rows as NDJSON, or Arrow IPC with
    ``Accept: application/vnd.apache.arrow.stream`` (or ``format=arrow``);
    ``limit``, ``offset`` or ``batch_size`` past int64 is a 422.
    Filters are comparisons ``column <op> literal`` combined with AND, OR,
    NOT and parentheses (repeated ``filter`` parameters must all hold)
    unless the server runs with ``--allow-raw-sql``. On MemWAL tables the rows
    are the writer's LSM view (every acknowledged row); pylance collects
    an LSM scan in the engine before it is streamed, so filter it.
``GET /tables/{name}/lookup/{key}``
    The newest row for a primary key, as JSON (404 when absent).
``GET /tables``, ``GET /health``
    The tables; liveness plus a few gauges (open to all; without the table
    names when keys are required).
``GET /metrics``, ``GET /docs``, ``GET /openapi.json``
    Prometheus metrics (``--metrics``); the API's documentation.

The table routes are :func:`lance_async.web.routes.table_router`.

Errors are JSON ``{"detail": ..., "error": ...}`` with the statuses of
:func:`lance_async.fastapi.http_status`: 413 past a body limit, 415 for an
unknown ``Content-Type``, 422 when the body does not fit the table (naming
the column), 404 for unknown tables, 400 for filters outside the allowed form
and for bodies already consumed, 409 when a table does not take that kind of
write; 401 without a known key and 403 when its scope is too narrow.

Exposure
--------
With API keys (``--api-keys-file``, ``LANCE_ASYNC_SERVE_API_KEYS``; see
:mod:`lance_async.web.auth`) every table route needs a key: ``read`` for
the list, rows and lookups, ``write`` for merge and ingest; ``/metrics``
and the docs need ``read`` unless ``metrics_access`` / ``docs_access`` say
otherwise; ``/health`` is open. Every request leaves an audit line (key id,
table, operation, rows, status: :mod:`lance_async.web.audit`). The key
file is watched: a key removed from it is refused from the next request on,
one added accepted, and ``SIGHUP`` re-reads it at once; a file that does not
parse keeps the last good keys and says so in the log
(:mod:`lance_async.web.keyfile`). TLS comes from ``--ssl-certfile`` and
``--ssl-keyfile``; a certificate that does not load with its key is one
line and exit 2. Without keys, ``serve`` listens on loopback only: another
address is refused (exit 2) unless ``--dangerously-serve-without-auth``,
and the start says how the server is exposed. Request heads are bounded
below the app (:mod:`lance_async.web.headlimits`): past 32 KiB or 100
header lines a 431, not complete within 10 s a 408, and the connection
closed; over TLS the handshake counts in those 10 s (one never finished:
closed).

Slow clients
------------
No engine thread ever waits on a client: bodies are read whole before the
engine runs. A body that pauses longer than ``BodyLimits.body_idle_timeout``
(30 s by default), that averages less than ``min_body_rate`` (1 KiB/s, after
a ``body_rate_grace`` of 10 s) or that takes longer than ``max_body_time``
(1 hour) is a 408 and writes nothing; past ``max_uploads`` bodies in flight
(16 by default) a new upload is a 503 with ``Retry-After``. ``serve`` sets
them with ``LANCE_ASYNC_SERVE_BODY_IDLE_TIMEOUT``, ``..._MIN_BODY_RATE``,
``..._BODY_RATE_GRACE`` and ``..._MAX_BODY_TIME`` (or the config file).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Response

from .._threads import ThreadLimits
from .audit import install_audit_log
from .discovery import Discovery, discover_tables, discovery_middleware
from .handlers import install_error_handlers
from .headlimits import handshake_bounded_loop, head_limited_protocol
from .keyfile import KeyFileWatcher
from .limits import BodyLimits
from .receive import install_body_guard
from .registry import TableRegistry, TableSpec, lance_lifespan
from .responses import json_response
from .routes import RouteGauges, scope_dependencies, table_router
from .settings import ServeSettings

__all__ = ["create_app", "discover_tables", "main"]

log = logging.getLogger("lance_async.web")


def create_app(
    root: str | os.PathLike[str] | None = None,
    *,
    tables: Mapping[str, TableSpec | str | os.PathLike[str]] | None = None,
    limits: BodyLimits | None = None,
    allow_raw_sql: bool = False,
    conflict_retries: int = 10,
    retry_timeout: float = 60.0,
    max_ingest_rows: int | None = None,
    spool_dir: str | None = None,
    threads: ThreadLimits | None = None,
    writer_options: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, str] | None = None,
    max_uploads: int | None = 16,
    metrics: bool = False,
    lance_metrics: bool = False,
    auth: Callable[..., Any] | None = None,
    metrics_access: str = "read",
    docs_access: str = "read",
    audit: bool = True,
    key_watcher: KeyFileWatcher | None = None,
) -> FastAPI:
    """Build the example app.

    Parameters
    ----------
    root : str or PathLike, optional
        Serve every ``<name>.lance`` dataset in this directory, or under this
        object-store prefix (``s3://bucket/tables``), found at startup. A
        local table whose real path (links followed) leaves the root is not
        served.
    tables : mapping, optional
        Tables to serve as well (name -> :class:`TableSpec` or URI).
    limits : BodyLimits, optional
        Body limits (default :class:`BodyLimits`: 1 GiB bodies, 262,144-row
        and 64 MiB IPC batches).
    allow_raw_sql : bool
        Accept raw Lance SQL in ``filter`` (trusted clients only). Off by
        default: filters must be ``column <op> literal``.
    conflict_retries : int
        Merge retries after a commit conflict (default 10).
    retry_timeout : float
        Seconds merge retries may take (default 60).
    max_ingest_rows : int, optional
        Rows per ingest body (default: no limit beyond ``limits``).
    spool_dir : str, optional
        Where merge and ingest bodies are spooled (default: the system's
        temporary directory).
    threads : ThreadLimits, optional
        The library's thread limits (``configure_threads``).
    writer_options : mapping, optional
        Options of the shard writers of the MemWAL tables found in ``root``
        (:class:`~lance_async.AsyncShardWriter` and pylance's
        ``mem_wal_writer`` keywords). The engine keeps ingested rows in
        memory until their memtable is flushed, up to
        ``max_unflushed_memtable_bytes`` (pylance's default: 1 GB); set it
        (with ``max_memtable_size`` below it) to bound a server's memory.
    storage_options : mapping, optional
        Object-store options of ``root`` and its tables.
    max_uploads : int or None
        Request bodies (merges and ingests) read at once (default 16; None:
        no cap). One more is answered 503 with ``Retry-After``
        (:class:`~lance_async.web.errors.ServerBusyError`) before its body is
        read. Bodies are read whole (spooled) before any engine call, so
        slow or stalled uploads never hold engine threads; this cap bounds
        the connections, spools and decoder work they can hold instead.
    metrics : bool
        Turn lance_async's OpenTelemetry instruments on with a Prometheus
        reader and serve them at ``GET /metrics`` (the ``metrics`` extra;
        see :mod:`lance_async._metrics`).
    lance_metrics : bool
        With ``metrics``, pylance's own instruments too (object-store
        requests, bytes, latency: ``lance.otel.instrument_lance_metrics``).
    auth : callable, optional
        The authentication dependency of every table route (see
        :func:`~lance_async.web.routes.table_router`):
        :class:`~lance_async.web.auth.ApiKeyAuth` or the app's own. None:
        no authentication (listen on loopback only).
    metrics_access, docs_access : str
        With ``auth``: the scope ``GET /metrics`` and ``/docs``,
        ``/openapi.json`` need (``"read"``, the default, ``"write"`` or
        ``"admin"``), ``"open"`` for none, or ``"off"`` not to serve them.
        (A browser sends no key when it opens ``/docs``: make the docs
        ``"open"`` to browse them.) Without ``auth`` they are open unless
        ``"off"``. ``GET /health`` is always open; with ``auth`` it leaves
        out the table names.
    audit : bool
        Log one line per request to ``lance_async.web.audit`` (key id,
        table, operation, rows, status; see :mod:`lance_async.web.audit`).
    key_watcher : KeyFileWatcher, optional
        Keeps ``auth``'s keys in step with their file while the app runs
        (:mod:`lance_async.web.keyfile`; run in the lifespan).

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ValueError
        ``root`` is not a directory, a table name is invalid, an access is
        not one of the values above, or ``max_uploads`` < 1.
    """
    root_dir = os.fspath(root) if root is not None else None
    if root_dir is not None and "://" not in root_dir and not os.path.isdir(root_dir):
        raise ValueError(f"root {root_dir!r} is not a directory")
    for name, access in (("metrics_access", metrics_access), ("docs_access", docs_access)):
        if access not in ACCESS:
            raise ValueError(f"{name} must be one of {', '.join(ACCESS)}, got {access!r}")
    body_limits = limits or BodyLimits()
    registry = TableRegistry(tables)
    gauges = RouteGauges()
    routes = table_router(
        auth=auth,
        limits=body_limits,
        allow_raw_sql=allow_raw_sql,
        conflict_retries=conflict_retries,
        retry_timeout=retry_timeout,
        max_ingest_rows=max_ingest_rows,
        spool_dir=spool_dir,
        max_uploads=max_uploads,
        gauges=gauges,
    )
    open_registry = lance_lifespan(registry, threads=threads)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if root_dir is not None:
            found = await discover_tables(
                root_dir, writer_options=writer_options, storage_options=storage_options
            )
            for name, spec in found.items():
                if name not in registry.names:
                    registry.add(name, spec)
        async with open_registry(app):
            log.info("lance_async.serve: serving tables %s", registry.names)
            if discovery is None and key_watcher is None:
                yield
                return
            async with anyio.create_task_group() as tg:
                if discovery is not None:
                    await tg.start(discovery.run)
                if key_watcher is not None:
                    await tg.start(key_watcher.run)
                yield
                tg.cancel_scope.cancel()

    discovery = (
        None if root_dir is None else Discovery(root_dir, registry, writer_options, storage_options)
    )
    docs_open = docs_access == "open" or (auth is None and docs_access != "off")
    app = FastAPI(
        title="lance_async example",
        lifespan=lifespan,
        docs_url="/docs" if docs_open else None,
        redoc_url="/redoc" if docs_open else None,
        openapi_url="/openapi.json" if docs_open else None,
    )
    if discovery is not None:  # tables created under the root after startup
        app.add_middleware(discovery_middleware, discovery=discovery)
    install_body_guard(
        app, drain_bytes=body_limits.drain_bytes, drain_timeout=body_limits.drain_timeout
    )
    install_error_handlers(app)
    if audit:
        install_audit_log(app, skip_paths=("/health", "/metrics"))
    app.state.gauges = gauges
    app.include_router(routes)
    if auth is not None and docs_access in ("read", "write", "admin"):
        _protected_docs(app, scope_dependencies(auth, docs_access))
    if metrics and metrics_access != "off":
        from .._metrics import prometheus_export

        export = prometheus_export(lance=lance_metrics)
        guard = scope_dependencies(auth, metrics_access) if metrics_access != "open" else []

        @app.get("/metrics", dependencies=guard)
        async def prometheus_metrics() -> Response:
            """Every instrument of the process in Prometheus' text format."""
            return Response(export(), media_type=export.content_type)

    @app.get("/health")
    async def health() -> Response:
        """Liveness, plus gauges of uploads and scans in flight (open to all)."""
        threads_alive = sum(1 for t in threading.enumerate() if t.name == "lance_async-stream")
        report: dict[str, Any] = {"status": "ok"}
        if auth is None:
            report["tables"] = registry.names
        report.update(
            {
                "uploads_in_flight": gauges.uploads_in_flight,
                "upload_bytes_received": gauges.upload_bytes(),
                "uploads_ok": gauges.uploads_ok,
                "uploads_failed": gauges.uploads_failed,
                "uploads_refused": gauges.uploads_refused,
                "scans_open": gauges.scans_open,
                "scans_done": gauges.scans_done,
                "rows_streamed": gauges.rows_streamed,
                "stream_threads": threads_alive,
            }
        )
        return json_response(report)

    return app


#: Who may read ``/metrics`` and the docs: a scope, everyone, or no one.
ACCESS = ("read", "write", "admin", "open", "off")


def _protected_docs(app: FastAPI, guard: list[Any]) -> None:
    """``/openapi.json`` and ``/docs`` behind ``guard`` (FastAPI's own are off)."""
    from fastapi.openapi.docs import get_swagger_ui_html

    @app.get("/openapi.json", include_in_schema=False, dependencies=guard)
    async def openapi() -> Response:
        return json_response(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=guard)
    async def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)


def main(settings: ServeSettings) -> None:
    """Serve the example app with uvicorn until interrupted (blocks).

    Checks the settings first (:meth:`ServeSettings.check_exposure`: no
    listening beyond loopback without authentication unless the settings
    say so explicitly), reads the API keys, then says on standard error how
    the server is exposed (address, TLS, authentication) and serves with
    :func:`~lance_async.web.headlimits.head_limited_protocol` and the TLS
    certificate of the settings; TLS handshakes are bounded by the head
    timeout (:func:`~lance_async.web.headlimits.handshake_bounded_loop`), the
    key file is watched (:class:`~lance_async.web.keyfile.KeyFileWatcher`;
    ``SIGHUP`` re-reads it at once and never ends the server).

    Parameters
    ----------
    settings : ServeSettings
        Where the tables are, where to listen, keys, TLS, limits (see
        :mod:`lance_async.web.settings`).

    Raises
    ------
    ValueError
        ``root`` is a local path that is not a directory; a key file that
        does not parse; a non-loopback address without authentication and
        without ``dangerously_serve_without_auth``; a TLS file that is
        missing or only half of the pair, or a certificate that does not
        load with its key.
    """
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    settings.check_exposure()
    auth = settings.auth()
    if hasattr(signal, "SIGHUP"):
        # until the key watcher receives it (in the lifespan), a SIGHUP must
        # not end the server: its default action would
        signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
    app = create_app(
        settings.root,
        limits=settings.body_limits(),
        allow_raw_sql=settings.allow_raw_sql,
        spool_dir=settings.spool_dir,
        writer_options=settings.writer_options,
        storage_options=settings.storage_options or None,
        metrics=settings.metrics,
        lance_metrics=settings.lance_metrics,
        auth=auth,
        metrics_access=settings.metrics_access,
        docs_access=settings.docs_access,
        key_watcher=settings.key_watcher(auth),
    )
    log_config = copy.deepcopy(LOGGING_CONFIG)
    log_config["loggers"]["lance_async"] = {
        "handlers": ["default"],
        "level": settings.log_level.upper(),
        "propagate": False,
    }
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config,
        http=head_limited_protocol(settings.head_limits()),
        # TLS handshakes within the head timeout (uvicorn sets no bound of its own)
        loop=handshake_bounded_loop(settings.head_timeout),  # type: ignore[arg-type]
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_keyfile_password=(
            settings.ssl_keyfile_password.get_secret_value()
            if settings.ssl_keyfile_password is not None
            else None
        ),
    )
    for level, line in settings.exposure_report(auth):
        logging.getLogger("lance_async.serve").log(level, "%s", line)
    uvicorn.Server(config).run()
