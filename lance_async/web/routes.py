"""The table routes as a FastAPI router: :func:`table_router`.

``GET /tables``, ``POST /tables/{name}/merge``, ``POST /tables/{name}/ingest``,
``GET /tables/{name}/rows`` and ``GET /tables/{name}/lookup/{key}`` (see
:mod:`lance_async.web.server` for what each does), over the tables of the
app's :class:`~lance_async.web.registry.TableRegistry`. The example app
(``lance-async serve``) is this router plus ``/health``, ``/metrics`` and the
docs; an app of your own includes it the same way::

    app = FastAPI(lifespan=lance_lifespan(registry))
    install_body_guard(app)
    install_error_handlers(app)
    app.include_router(table_router(auth=my_auth), prefix="/lance")

Authentication is a FastAPI dependency, ``auth``: every route depends on
``Security(auth, scopes=[...])`` -- ``read`` for the reads and the table
list, ``write`` for merge and ingest -- before anything else runs, so a
caller without credentials learns nothing, not even which tables exist.
Pass :class:`~lance_async.web.auth.ApiKeyAuth` (API keys with scopes), or
your own dependency (OAuth2, JWT, a proxy's header: read the scopes from
:class:`fastapi.security.SecurityScopes` if you care about them), or None
for no authentication (a server that only listens on loopback).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Depends, Query, Request, Response, Security
from fastapi.params import Depends as DependsParam

from .._args import INT64_MAX
from .._filters import DECIMAL_FLOAT, DECIMAL_INT
from ..errors import FilterError, InvalidInputError, SchemaMismatchError
from .audit import audit_rows
from .bodies import BodyBatches
from .errors import ServerBusyError
from .filters import compile_filter
from .limits import BodyLimits
from .receive import request_batches
from .registry import TableDep, TableRegistry, WriterDep, get_registry
from .responses import BatchStreamResponse, json_response, jsonable_rows, scan_response
from .writes import ingest_body, merge_body

__all__ = ["DEFAULT_SCAN_BATCH", "RouteGauges", "scope_dependencies", "table_router"]

#: Rows per batch of a ``/rows`` scan unless ``batch_size`` says otherwise.
DEFAULT_SCAN_BATCH = 8192


@dataclass
class RouteGauges:
    """What the table routes are doing, for ``/health``.

    Attributes
    ----------
    uploads_in_flight, uploads_ok, uploads_failed, uploads_refused : int
        Request bodies being read; read and written; failed; refused (503).
    scans_open, scans_done, rows_streamed : int
        Scans being streamed; finished; rows they sent.
    """

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
        """Count a scan that ended (``on_close`` of its response)."""
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


def scope_dependencies(auth: Callable[..., Any] | None, scope: str) -> list[DependsParam]:
    """``[Security(auth, scopes=[scope])]``, or no dependency when ``auth`` is None."""
    return [] if auth is None else [Security(auth, scopes=[scope])]


def table_router(
    *,
    auth: Callable[..., Any] | None = None,
    limits: BodyLimits | None = None,
    allow_raw_sql: bool = False,
    conflict_retries: int = 10,
    retry_timeout: float = 60.0,
    max_ingest_rows: int | None = None,
    spool_dir: str | None = None,
    max_uploads: int | None = 16,
    gauges: RouteGauges | None = None,
) -> APIRouter:
    """The table routes, each behind ``auth``.

    Parameters
    ----------
    auth : callable, optional
        A FastAPI dependency every route depends on through
        ``Security(auth, scopes=["read"])`` (list, rows, lookup) or
        ``scopes=["write"]`` (merge, ingest), before anything else:
        :class:`~lance_async.web.auth.ApiKeyAuth`, or the app's own. None:
        no authentication.
    limits : BodyLimits, optional
        Body limits (default :class:`BodyLimits`); ``max_batch_rows`` also
        caps a scan's ``batch_size``.
    allow_raw_sql : bool
        Accept raw Lance SQL in ``filter`` (trusted clients only).
    conflict_retries, retry_timeout : int, float
        Merge retries after a commit conflict, and the seconds they may take.
    max_ingest_rows : int, optional
        Rows per ingest body.
    spool_dir : str, optional
        Where merge and ingest bodies are spooled.
    max_uploads : int or None
        Request bodies read at once (default 16; None: no cap); one more is
        a 503 with ``Retry-After`` before its body is read.
    gauges : RouteGauges, optional
        Where the routes count uploads and scans (for a ``/health``).

    Returns
    -------
    fastapi.APIRouter
        Include it with ``app.include_router(...)``; the app needs
        :func:`~lance_async.web.registry.lance_lifespan`, and should have
        :func:`~lance_async.web.receive.install_body_guard` and
        :func:`~lance_async.web.handlers.install_error_handlers`.

    Raises
    ------
    ValueError
        ``max_uploads`` < 1.
    """
    if max_uploads is not None and max_uploads < 1:
        raise ValueError(f"max_uploads must be >= 1 or None, got {max_uploads}")
    body_limits = limits or BodyLimits()
    gauges = gauges if gauges is not None else RouteGauges()
    read = scope_dependencies(auth, "read")
    write = scope_dependencies(auth, "write")
    router = APIRouter()

    @router.get("/tables", dependencies=read)
    async def list_tables(
        registry: Annotated[TableRegistry, Depends(get_registry)],
    ) -> Response:
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

    @router.post("/tables/{name}/merge", dependencies=write)
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
        # through the MemWAL the engine counts nothing: the put's summary does
        audit_rows(
            request,
            result.num_inserted_rows + result.num_updated_rows
            if result.mem_wal is None
            else result.mem_wal.rows + result.mem_wal.deletes,
        )
        return json_response(
            {
                "num_inserted_rows": result.num_inserted_rows,
                "num_updated_rows": result.num_updated_rows,
                "num_deleted_rows": result.num_deleted_rows,
                "num_attempts": result.num_attempts,
                "source_mode": result.source_mode.value,
                "version": result.version,
                "group_size": result.group_size,
                "group_index": result.group_index,
                "mem_wal": None if result.mem_wal is None else dataclasses.asdict(result.mem_wal),
                "body": {"format": stats.format, "bytes": stats.bytes_received, "rows": stats.rows},
            }
        )

    @router.post("/tables/{name}/ingest", dependencies=write)
    async def ingest(request: Request, writer: WriterDep) -> Response:
        """Check and spool the body, write it to the MemWAL; answers after the durable ack."""
        async with upload(request, writer.schema, all_columns=True) as body:
            summary = await ingest_body(writer, body, max_rows=max_ingest_rows)
            stats = body.statistics()
        audit_rows(request, summary.rows)
        return json_response(
            {
                "rows": summary.rows,
                "engine_puts": summary.engine_puts,
                "durable": writer.durable_write,
                "body": {"format": stats.format, "bytes": stats.bytes_received, "rows": stats.rows},
            }
        )

    max_scan_batch = body_limits.max_batch_rows

    @router.get("/tables/{name}/rows", dependencies=read)
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
            stream = table.writer.lsm.scan(columns=cols, filter=sql, limit=limit, offset=offset)
        else:
            await dataset.refresh()
            stream = dataset.scan(
                columns=cols, filter=sql, limit=limit, offset=offset, batch_size=batch_size
            )
        gauges.scans_open += 1
        try:

            def closed(response: BatchStreamResponse) -> None:
                gauges.scan_closed(response)
                audit_rows(request, response.rows_sent)

            return await scan_response(request, stream, format=format, on_close=closed)
        except BaseException as exc:
            gauges.scans_open -= 1
            if allow_raw_sql and sql and isinstance(exc, (ValueError, OSError, InvalidInputError)):
                raise FilterError(f"the filter was rejected: {exc}", filter=sql) from exc
            raise

    @router.get("/tables/{name}/lookup/{key}", dependencies=read)
    async def lookup(request: Request, table: TableDep, key: str) -> Response:
        """The newest row for a (single-column) primary key."""
        dataset = table.dataset
        keys = dataset.primary_key
        if len(keys) != 1:
            raise InvalidInputError(
                f"lookups need a one-column primary key; this table's is {keys or 'missing'}"
            )
        value = _parse_key(key, dataset.schema.field(keys[0]))
        if table.writer is not None:
            found = await table.writer.lsm.point_lookup(value)
        else:
            await dataset.refresh()
            found = await dataset.lsm.point_lookup(value)
        audit_rows(request, found.num_rows)
        if found.num_rows == 0:
            return json_response({"detail": f"no row with {keys[0]} = {key[:64]!r}"}, 404)
        row = {k: v for k, v in jsonable_rows(found)[0].items() if not k.startswith("_")}
        return json_response({"key": keys[0], "row": row})

    return router
