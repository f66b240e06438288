"""The example app: Lance tables behind FastAPI, runnable with one command.

Run it with ``lance-async serve --root DIR``. Needs the ``fastapi`` extra.

Tables
------
At startup every directory ``DIR/<name>.lance`` holding a Lance dataset is
registered as table ``<name>``; a table created later is found when a
request names it (or lists ``/tables``): the root is listed again, at most
once a second. Names
are resolved through that registry only, never as paths. A table whose MemWAL
is initialized (``initialize_mem_wal``) gets a MemWAL writer: the routing
writer when the MemWAL has a sharding spec (every row to its own shard), or
lance_async's default shard of a table with manual shards; shard ids are
stable, so a restart replays their WALs. It takes writes through ``/ingest``
and ``/merge`` (both into the MemWAL) and serves reads from its LSM view.
The other tables take writes through ``/merge``. Run one server per
directory (a second one would fence the first's writers).

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
    are the writer's LSM view (every acknowledged row); pylance 14 collects
    an LSM scan in the engine before it is streamed, so filter it.
``GET /tables/{name}/lookup/{key}``
    The newest row for a primary key, as JSON (404 when absent).
``GET /tables``, ``GET /health``
    The tables; liveness plus a few gauges.

Errors are JSON ``{"detail": ..., "error": ...}`` with the statuses of
:func:`lance_async.fastapi.http_status`: 413 past a body limit, 415 for an
unknown ``Content-Type``, 422 when the body does not fit the table (naming
the column), 404 for unknown tables, 400 for filters outside the allowed form
and for bodies already consumed, 409 when a table does not take that kind of
write.

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

import dataclasses
import datetime
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
import pyarrow as pa
from fastapi import FastAPI, Query, Request, Response

from .._args import INT64_MAX
from .._filters import DECIMAL_FLOAT, DECIMAL_INT
from .._threads import ThreadLimits
from ..errors import (
    InvalidInputError,
    SchemaMismatchError,
    ServerBusyError,
)
from . import (
    BatchStreamResponse,
    BodyBatches,
    BodyLimits,
    FilterError,
    TableDep,
    TableRegistry,
    TableSpec,
    WriterDep,
    compile_filter,
    ingest_body,
    install_body_guard,
    install_error_handlers,
    json_response,
    jsonable_rows,
    lance_lifespan,
    merge_body,
    request_batches,
    scan_response,
)
from .discovery import Discovery, discover_tables, discovery_middleware
from .settings import ServeSettings

__all__ = ["create_app", "discover_tables", "main"]

log = logging.getLogger("lance_async.web")

#: Rows per batch of a ``/rows`` scan unless ``batch_size`` says otherwise.
DEFAULT_SCAN_BATCH = 8192


@dataclass
class _Gauges:
    uploads_in_flight: int = 0
    uploads_ok: int = 0
    uploads_failed: int = 0
    uploads_refused: int = 0
    scans_open: int = 0
    scans_done: int = 0
    rows_streamed: int = 0
    bodies: set[BodyBatches] = field(default_factory=set)

    def upload_bytes(self) -> int:
        """Body bytes received so far by the uploads in flight."""
        return sum(body.statistics().bytes_received for body in self.bodies)

    def scan_closed(self, response: BatchStreamResponse) -> None:
        self.scans_open -= 1
        self.scans_done += 1
        self.rows_streamed += response.rows_sent


def _parse_key(text: str, field: pa.Field) -> Any:
    dtype = field.type
    try:
        if pa.types.is_integer(dtype):
            if not DECIMAL_INT.fullmatch(text):
                raise ValueError(text)
            return int(text)
        if pa.types.is_floating(dtype):
            if not DECIMAL_FLOAT.fullmatch(text):
                raise ValueError(text)
            return float(text)
        if pa.types.is_boolean(dtype):
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            return text
        if pa.types.is_date(dtype):
            return datetime.date.fromisoformat(text)
        if pa.types.is_timestamp(dtype):
            return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInputError(
            f"key {text[:64]!r} is not a valid {dtype} for {field.name!r}"
        ) from None
    raise InvalidInputError(f"lookups by a {dtype} key are not supported")


def _columns(text: str | None, schema: pa.Schema) -> list[str] | None:
    if text is None:
        return None
    names = [c.strip() for c in text.split(",") if c.strip()]
    for name in names:
        if name not in schema.names:
            raise SchemaMismatchError(
                f"unknown column {name[:64]!r} (columns: {schema.names})", field=name
            )
    return names or None


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
) -> FastAPI:
    """Build the example app.

    Parameters
    ----------
    root : str or PathLike, optional
        Serve every ``<name>.lance`` dataset in this directory, or under this
        object-store prefix (``s3://bucket/tables``), found at startup.
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
    max_uploads : int or None
        Request bodies (merges and ingests) read at once (default 16; None:
        no cap). One more is answered 503 with ``Retry-After``
        (:class:`~lance_async.errors.ServerBusyError`) before its body is
        read. Bodies are read whole (spooled) before any engine call, so
        slow or stalled uploads never hold engine threads; this cap bounds
        the connections, spools and decoder work they can hold instead.

    storage_options : mapping, optional
        Object-store options of ``root`` and its tables.
    metrics : bool
        Turn lance_async's OpenTelemetry instruments on with a Prometheus
        reader and serve them at ``GET /metrics`` (the ``metrics`` extra;
        see :mod:`lance_async._metrics`).
    lance_metrics : bool
        With ``metrics``, pylance's own instruments too (object-store
        requests, bytes, latency: ``lance.otel.instrument_lance_metrics``).

    Returns
    -------
    fastapi.FastAPI

    Raises
    ------
    ValueError
        ``root`` is not a directory, a table name is invalid, or
        ``max_uploads`` < 1.
    """
    if max_uploads is not None and max_uploads < 1:
        raise ValueError(f"max_uploads must be >= 1 or None, got {max_uploads}")
    root_dir = os.fspath(root) if root is not None else None
    if root_dir is not None and "://" not in root_dir and not os.path.isdir(root_dir):
        raise ValueError(f"root {root_dir!r} is not a directory")
    body_limits = limits or BodyLimits()
    registry = TableRegistry(tables)
    gauges = _Gauges()
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
            if discovery is None:
                yield
                return
            async with anyio.create_task_group() as tg:
                await tg.start(discovery.run)
                yield
                tg.cancel_scope.cancel()

    discovery = (
        None if root_dir is None else Discovery(root_dir, registry, writer_options, storage_options)
    )
    app = FastAPI(title="lance_async example", lifespan=lifespan)
    if discovery is not None:  # tables created under the root after startup
        app.add_middleware(discovery_middleware, discovery=discovery)
    install_body_guard(
        app, drain_bytes=body_limits.drain_bytes, drain_timeout=body_limits.drain_timeout
    )
    install_error_handlers(app)
    app.state.gauges = gauges
    if metrics:
        from .._metrics import prometheus_export

        export = prometheus_export(lance=lance_metrics)

        @app.get("/metrics")
        async def prometheus_metrics() -> Response:
            """Every instrument of the process in Prometheus' text format."""
            return Response(export(), media_type=export.content_type)

    @app.get("/health")
    async def health() -> Response:
        """Liveness, plus gauges of uploads and scans in flight."""
        threads_alive = sum(1 for t in threading.enumerate() if t.name == "lance_async-stream")
        return json_response(
            {
                "status": "ok",
                "tables": registry.names,
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

    @app.get("/tables")
    async def list_tables() -> Response:
        """Every table: columns, primary key and which writes it takes."""
        return json_response(
            {
                t.name: {
                    "columns": {f.name: str(f.type) for f in t.dataset.schema},
                    "primary_key": t.dataset.primary_key,
                    "writes": "ingest" if t.writer is not None else "merge",
                    "version": t.dataset.version,
                }
                for t in registry.tables()
            }
        )

    @asynccontextmanager
    async def upload(
        request: Request, schema: pa.Schema, **options: Any
    ) -> AsyncIterator[BodyBatches]:
        """The request body, spooled, counted in the gauges while in flight."""
        if max_uploads is not None and gauges.uploads_in_flight >= max_uploads:
            gauges.uploads_refused += 1
            raise ServerBusyError(
                f"the server is reading {gauges.uploads_in_flight} uploads, as many as it takes "
                "at once (max_uploads); nothing was read, retry later"
            )
        gauges.uploads_in_flight += 1
        try:
            async with request_batches(
                request, schema, limits=body_limits, spool=True, spool_dir=spool_dir, **options
            ) as body:
                gauges.bodies.add(body)
                try:
                    yield body
                finally:
                    gauges.bodies.discard(body)
        except BaseException:
            gauges.uploads_failed += 1
            raise
        else:
            gauges.uploads_ok += 1
        finally:
            gauges.uploads_in_flight -= 1

    @app.post("/tables/{name}/merge")
    async def merge(
        request: Request,
        table: TableDep,
        on: Annotated[list[str] | None, Query()] = None,
        base_table: bool = False,
    ) -> Response:
        """Upsert the body; answers the MergeResult.

        A table with a MemWAL takes it through the MemWAL (the server's own
        writer), as every merge path does; ``base_table=true`` asks for the
        base table (refused while the MemWAL holds any of the body's keys).
        """
        dataset = table.dataset
        keys = list(on or dataset.primary_key)
        if not keys:
            raise InvalidInputError("the table has no primary key: pass ?on=COLUMN")
        for key in keys:
            if key not in dataset.schema.names:
                raise SchemaMismatchError(
                    f"join column {key[:64]!r} is not in the table", field=key
                )
        primary = dataset.primary_key
        if primary and sorted(keys) != sorted(primary):
            # a row whose join value is new would be inserted even when its
            # primary key is in the table already: two rows for one key
            raise InvalidInputError(
                f"merge?on= must be the table's primary key {primary}, got {keys}: joining on "
                "other columns would insert a second row for a key the table holds; leave "
                "out on= to join on the primary key"
            )
        required = list(dict.fromkeys([*keys, *(f.name for f in dataset.schema if not f.nullable)]))
        writer = table.writer

        def clauses(builder: Any) -> Any:
            builder = builder.when_matched_update_all().when_not_matched_insert_all()
            if base_table:
                return builder.via_base_table()
            return builder.via_mem_wal(writer) if writer is not None else builder

        async with upload(request, dataset.schema, required_columns=required) as body:
            result = await merge_body(
                dataset,
                body,
                keys,
                when=clauses,
                conflict_retries=conflict_retries,
                retry_timeout=retry_timeout,
                spool_dir=spool_dir,
            )
            stats = body.statistics()
        return json_response(
            {
                "num_inserted_rows": result.num_inserted_rows,
                "num_updated_rows": result.num_updated_rows,
                "num_deleted_rows": result.num_deleted_rows,
                "num_attempts": result.num_attempts,
                "source_mode": result.source_mode.value,
                "version": result.version,
                "mem_wal": None if result.mem_wal is None else dataclasses.asdict(result.mem_wal),
                "body": {"format": stats.format, "bytes": stats.bytes_received, "rows": stats.rows},
            }
        )

    @app.post("/tables/{name}/ingest")
    async def ingest(request: Request, writer: WriterDep) -> Response:
        """Check and spool the body, write it to the MemWAL; answers after the durable ack."""
        async with upload(request, writer.schema, all_columns=True) as body:
            summary = await ingest_body(writer, body, max_rows=max_ingest_rows)
            stats = body.statistics()
        return json_response(
            {
                "rows": summary.rows,
                "engine_puts": summary.engine_puts,
                "durable": writer.durable_write,
                "body": {"format": stats.format, "bytes": stats.bytes_received, "rows": stats.rows},
            }
        )

    max_scan_batch = body_limits.max_batch_rows

    @app.get("/tables/{name}/rows")
    async def rows(
        request: Request,
        table: TableDep,
        filters: Annotated[list[str] | None, Query(alias="filter")] = None,
        columns: str | None = None,
        limit: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
        offset: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
        batch_size: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
        format: str | None = None,
    ) -> BatchStreamResponse:
        """Stream rows (NDJSON, or Arrow IPC when asked for)."""
        dataset = table.dataset
        if batch_size is None:
            batch_size = min(DEFAULT_SCAN_BATCH, max_scan_batch)
        elif batch_size > max_scan_batch:
            raise InvalidInputError(f"batch_size may be at most {max_scan_batch} (max_batch_rows)")
        sql = compile_filter(filters, dataset.schema, allow_raw_sql=allow_raw_sql)
        cols = _columns(columns, dataset.schema)
        if table.writer is not None:
            stream = table.writer.lsm_scan(columns=cols, filter=sql, limit=limit, offset=offset)
        else:
            await dataset.refresh()
            stream = dataset.scan(
                columns=cols, filter=sql, limit=limit, offset=offset, batch_size=batch_size
            )
        gauges.scans_open += 1
        try:
            return await scan_response(request, stream, format=format, on_close=gauges.scan_closed)
        except BaseException as exc:
            gauges.scans_open -= 1
            if allow_raw_sql and sql and isinstance(exc, (ValueError, OSError, InvalidInputError)):
                raise FilterError(f"the filter was rejected: {exc}", filter=sql) from exc
            raise

    @app.get("/tables/{name}/lookup/{key}")
    async def lookup(table: TableDep, key: str) -> Response:
        """The newest row for a (single-column) primary key."""
        dataset = table.dataset
        keys = dataset.primary_key
        if len(keys) != 1:
            raise InvalidInputError(
                f"lookups need a one-column primary key; this table's is {keys or 'missing'}"
            )
        value = _parse_key(key, dataset.schema.field(keys[0]))
        if table.writer is not None:
            found = await table.writer.lsm_point_lookup(value)
        else:
            await dataset.refresh()
            found = await dataset.lsm_point_lookup(value)
        if found.num_rows == 0:
            return json_response({"detail": f"no row with {keys[0]} = {key[:64]!r}"}, 404)
        row = {k: v for k, v in jsonable_rows(found)[0].items() if not k.startswith("_")}
        return json_response({"key": keys[0], "row": row})

    return app


def main(settings: ServeSettings) -> None:
    """Serve the example app with uvicorn until interrupted (blocks).

    Parameters
    ----------
    settings : ServeSettings
        Where the tables are, where to listen, limits (see
        :mod:`lance_async.web.settings`).

    Raises
    ------
    ValueError
        ``root`` is a local path that is not a directory.
    """
    import uvicorn

    app = create_app(
        settings.root,
        limits=settings.body_limits(),
        allow_raw_sql=settings.allow_raw_sql,
        spool_dir=settings.spool_dir,
        writer_options=settings.writer_options,
        storage_options=settings.storage_options or None,
        metrics=settings.metrics,
        lance_metrics=settings.lance_metrics,
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)
