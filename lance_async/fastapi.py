"""FastAPI and Starlette integration: tables, streamed uploads and streamed scans.

Needs the ``fastapi`` extra (``pip install 'lance-async[fastapi]'``).

A sketch of an app (``lance_async.serve`` is a complete one)::

    from fastapi import FastAPI, Request
    from lance_async.fastapi import (
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
:class:`BodyDrainMiddleware`, :func:`install_body_guard`, :func:`install_error_handlers`
    Typed errors become JSON responses with the right status, and those
    responses reach clients that are still uploading; a body that a
    middleware read before the handler is a 400, never an empty write.

Retries of uploaded bodies
--------------------------
A request body is a one-shot (STREAMING) source: it cannot be read twice
from the client. pylance 14 can retry a streamed merge itself
(``conflict_retries > 0``) by buffering the stream -- but it keeps up to
100 MB of it in memory before spilling (measured: a 100 MiB upload raised
peak RSS by about 138 MiB, against about 6 MiB with Lance's retries off).
:func:`merge_body` therefore defaults to ``replay="spool"``: the first pass
streams with Lance's retries off while the body is spooled (memory up to
4 MiB, then a temporary Arrow file); a commit conflict replays the spool as
a REPLAYABLE source through lance_async's own retry loop. ``replay="lance"``
selects Lance's buffered retries instead.

Threads
-------
Nothing here blocks the event loop or uses anyio's default thread pool (the
one Starlette uses for sync endpoints and dependencies): decoding and
encoding run on the library's ``stream`` limiter, engine calls on its
``engine`` limiter (see :func:`lance_async.configure_threads`). Slow
clients can exhaust those, never the app's own sync work.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import pyarrow as pa

try:
    from fastapi import Depends
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response, StreamingResponse
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lance_async.fastapi needs FastAPI: pip install 'lance-async[fastapi]'"
    ) from exc

from ._http_bodies import (
    CSV,
    IPC_FILE,
    IPC_STREAM,
    NDJSON,
    SLICE_ROWS,
    BodyBatches,
    BodyConsumedError,
    BodyLimits,
    BodyStats,
    ClientDisconnectedError,
    EmptyBodyError,
    NotAcceptableError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
    body_format,
)
from ._http_responses import BatchEncoder, dumps_json, jsonable_rows, make_encoder
from ._http_writes import ingest_body, merge_body
from ._threads import ThreadLimits, configure_threads, run_sync, stream_limiter
from .dataset import AsyncDataset, open_dataset
from .errors import (
    BackpressureTimeoutError,
    ClosedError,
    ConflictError,
    DatasetNotFoundError,
    FilterError,
    InvalidInputError,
    LanceAsyncError,
    NoShardWriterError,
    SourceError,
    UnknownTableError,
    WriterFailedError,
)
from .memwal.writer import AsyncShardWriter

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .sources.streams import AsyncBatchStream

__all__ = [
    "CSV",
    "IPC_FILE",
    "IPC_STREAM",
    "NDJSON",
    "BatchEncoder",
    "BatchStreamResponse",
    "BodyBatches",
    "BodyConsumedError",
    "BodyDrainMiddleware",
    "BodyLimits",
    "BodyStats",
    "ClientDisconnectedError",
    "DatasetDep",
    "EmptyBodyError",
    "FilterError",
    "NoShardWriterError",
    "NotAcceptableError",
    "OpenTable",
    "PayloadTooLargeError",
    "RegistryState",
    "TableDep",
    "TableRegistry",
    "TableSpec",
    "UnknownTableError",
    "UnsupportedMediaTypeError",
    "WriterDep",
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
    "install_body_guard",
    "install_error_handlers",
    "json_response",
    "jsonable_rows",
    "lance_error_handler",
    "lance_lifespan",
    "make_encoder",
    "merge_body",
    "negotiate_format",
    "request_batches",
    "scan_response",
]

log = logging.getLogger("lance_async")

#: The ``app.state`` attribute that :func:`lance_lifespan` sets.
REGISTRY_STATE_KEY = "lance_registry"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    """How to open one registered table.

    Attributes
    ----------
    uri : str
        The dataset's URI or local path (chosen by the app, never by a client).
    shard_id : str, optional
        A MemWAL shard (UUID string) to open an :class:`AsyncShardWriter` on at
        startup. The table must have a MemWAL (``initialize_mem_wal``).
        Reusing the same id after a restart replays the shard's WAL.
    writer_options : dict
        Keyword arguments for :meth:`AsyncDataset.mem_wal_writer`.
    storage_options : dict, optional
        Passed to :func:`lance_async.open_dataset`.
    """

    uri: str
    shard_id: str | None = None
    writer_options: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, str] | None = None


@dataclass(frozen=True)
class OpenTable:
    """A registered table, open.

    Attributes
    ----------
    name : str
    dataset : AsyncDataset
        Shared by all requests; mutations move it to the versions they commit.
    writer : AsyncShardWriter or None
        Its MemWAL shard writer, when the spec named a shard.
    spec : TableSpec
    """

    name: str
    dataset: AsyncDataset
    writer: AsyncShardWriter | None
    spec: TableSpec


class RegistryState(enum.Enum):
    """Life cycle of a :class:`TableRegistry`."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class TableRegistry:
    """Tables an app serves, by name; opened and closed as one unit.

    Parameters
    ----------
    tables : mapping of str to TableSpec, str or PathLike, optional
        Name -> spec (a bare URI is ``TableSpec(uri)``).

    Notes
    -----
    * Names match ``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`` without ``..``.
      Requests resolve names by dictionary lookup only, so no client input
      ever becomes part of a path.
    * Use it as ``async with registry:`` (or through :func:`lance_lifespan`).
      Opening opens every dataset and MemWAL writer (on the library's engine
      threads); closing flushes and closes the writers (each shields its
      flush from cancellation, bounded by its ``close_timeout``).
    * Open and close it in the same task (the lifespan task): writers own
      task groups.
    """

    def __init__(
        self, tables: Mapping[str, TableSpec | str | os.PathLike[str]] | None = None
    ) -> None:
        self._specs: dict[str, TableSpec] = {}
        self._open: dict[str, OpenTable] = {}
        self._stack: AsyncExitStack | None = None
        self._state = RegistryState.NEW
        for name, spec in (tables or {}).items():
            self.add(name, spec)

    def __repr__(self) -> str:
        return f"<TableRegistry {sorted(self._specs)} state={self._state.value}>"

    @property
    def state(self) -> RegistryState:
        """Where the registry is in its life cycle."""
        return self._state

    @property
    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._specs)

    def add(self, name: str, spec: TableSpec | str | os.PathLike[str]) -> None:
        """Register a table (before the registry is opened).

        Raises
        ------
        ValueError
            An invalid or duplicate name.
        ClosedError
            The registry was already opened.
        """
        if self._state is not RegistryState.NEW:
            raise ClosedError("tables can be added only before the registry is opened")
        if not _NAME_RE.fullmatch(name) or ".." in name:
            raise ValueError(
                f"invalid table name {name!r}: use letters, digits, '_', '-', '.' "
                "(at most 128, no '..')"
            )
        if name in self._specs:
            raise ValueError(f"table {name!r} is already registered")
        self._specs[name] = spec if isinstance(spec, TableSpec) else TableSpec(os.fspath(spec))

    async def open(self) -> TableRegistry:
        """Open every dataset and MemWAL writer.

        Returns
        -------
        TableRegistry
            ``self``.

        Raises
        ------
        DatasetNotFoundError
            A registered URI holds no dataset (what was opened is closed again).
        ClosedError
            Opened before.
        """
        if self._state is not RegistryState.NEW:
            raise ClosedError(f"{self!r} was already opened")
        stack = AsyncExitStack()
        try:
            for name, spec in self._specs.items():
                storage = dict(spec.storage_options) if spec.storage_options else None
                dataset = await open_dataset(spec.uri, storage_options=storage)
                writer = None
                if spec.shard_id is not None:
                    writer = dataset.mem_wal_writer(spec.shard_id, **dict(spec.writer_options))
                    await stack.enter_async_context(writer)
                self._open[name] = OpenTable(name, dataset, writer, spec)
        except BaseException:
            self._state = RegistryState.CLOSED
            await stack.aclose()  # writers shield their own flush and close
            raise
        self._stack = stack
        self._state = RegistryState.OPEN
        return self

    async def aclose(self) -> None:
        """Flush and close every writer (each flush is shielded). Safe twice.

        Raises
        ------
        WriterFailedError, BaseException
            What closing a writer raised (after all of them were closed).
        """
        if self._state is RegistryState.CLOSED:
            return
        self._state = RegistryState.CLOSED
        stack, self._stack = self._stack, None
        if stack is not None:
            # No CancelScope around this: each writer exits the task group it
            # entered at open, and shields its own flush and close.
            await stack.aclose()

    async def __aenter__(self) -> TableRegistry:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def get(self, name: str) -> OpenTable:
        """The open table registered as ``name`` (does not block).

        Raises
        ------
        UnknownTableError
            No such name.
        ClosedError
            The registry is not open.
        """
        if self._state is not RegistryState.OPEN:
            raise ClosedError(f"{self!r} is not open; use lance_lifespan(registry)")
        table = self._open.get(name)
        if table is None:
            raise UnknownTableError(name)
        return table

    def tables(self) -> list[OpenTable]:
        """Every open table, by name."""
        return [self._open[n] for n in sorted(self._open)]


def lance_lifespan(
    registry: TableRegistry, *, threads: ThreadLimits | None = None
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """A lifespan that opens ``registry`` at startup and closes it at shutdown.

    Parameters
    ----------
    registry : TableRegistry
    threads : ThreadLimits, optional
        Set the library's thread limits (``configure_threads``) at startup.

    Returns
    -------
    callable
        For ``FastAPI(lifespan=...)`` / ``Starlette(lifespan=...)``. It sets
        ``app.state.lance_registry``, which the dependencies read. Compose it
        with your own lifespan as ``async with lance_lifespan(registry)(app):``.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if threads is not None:
            configure_threads(engine=threads.engine, stream=threads.stream, reader=threads.reader)
        async with registry:
            setattr(app.state, REGISTRY_STATE_KEY, registry)
            yield

    return lifespan


# ---------------------------------------------------------------------------
# dependencies
# ---------------------------------------------------------------------------


async def get_registry(request: Request) -> TableRegistry:
    """Dependency: the app's :class:`TableRegistry` (set by :func:`lance_lifespan`).

    Raises
    ------
    RuntimeError
        The app has no registry (no ``lifespan=lance_lifespan(registry)``).
    """
    registry = getattr(request.app.state, REGISTRY_STATE_KEY, None)
    if not isinstance(registry, TableRegistry):
        raise RuntimeError("this app has no TableRegistry: use lifespan=lance_lifespan(registry)")
    return registry


async def get_table(
    name: str, registry: Annotated[TableRegistry, Depends(get_registry)]
) -> OpenTable:
    """Dependency: the table named by the ``name`` path parameter.

    Raises
    ------
    UnknownTableError
        No such table (HTTP 404).
    """
    return registry.get(name)


async def get_dataset(table: Annotated[OpenTable, Depends(get_table)]) -> AsyncDataset:
    """Dependency: the named table's :class:`AsyncDataset`."""
    return table.dataset


async def get_writer(table: Annotated[OpenTable, Depends(get_table)]) -> AsyncShardWriter:
    """Dependency: the named table's MemWAL writer.

    Raises
    ------
    NoShardWriterError
        The table has none in this app (HTTP 409).
    """
    if table.writer is None:
        raise NoShardWriterError(
            f"table {table.name!r} has no MemWAL shard writer in this app; it takes no ingest"
        )
    return table.writer


TableDep = Annotated[OpenTable, Depends(get_table)]
DatasetDep = Annotated[AsyncDataset, Depends(get_dataset)]
WriterDep = Annotated[AsyncShardWriter, Depends(get_writer)]


# ---------------------------------------------------------------------------
# request bodies
# ---------------------------------------------------------------------------


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


class _BodyLedger:
    """What the outermost :class:`BodyDrainMiddleware` saw of one request body.

    Kept in the ASGI scope under :data:`BODY_LEDGER_SCOPE_KEY`, so that a
    handler reading the body deeper in the stack can tell that someone else
    read it first.
    """

    __slots__ = ("ended", "gone", "readers", "received", "refused", "stalled")

    def __init__(self) -> None:
        self.received = 0  # body bytes the server delivered
        self.ended = False  # the last body message was delivered
        self.gone = False  # the client disconnected
        self.readers = 0  # request_batches readers waiting for a body message now
        self.refused = False  # a reader asked for more of a body delivered whole
        self.stalled = False  # a reader gave up waiting for the first body bytes


#: The ASGI scope key under which :class:`BodyDrainMiddleware` keeps its ledger.
BODY_LEDGER_SCOPE_KEY = "lance_async.body"


def _consumed_error(detail: str) -> BodyConsumedError:
    return BodyConsumedError(
        f"{detail}: a middleware (or an earlier reader) consumed the request body; "
        "nothing was written. Middleware must not read bodies that handlers stream."
    )


async def _receive_chunks(request: Request, limits: BodyLimits) -> AsyncIterator[bytes]:
    """``request.stream()`` with its failures turned into lance_async errors.

    With a :class:`BodyDrainMiddleware` ledger in the scope: a body already
    delivered to someone else is a :class:`BodyConsumedError` at once (the
    middleware refuses to wait for a body message that will never come), and
    so is a body of which fewer bytes reached us than the server delivered.
    Without one (or when the body was consumed outside the middleware), the
    wait for the first bytes is bounded by ``limits.body_start_timeout``.
    """
    ledger = request.scope.get(BODY_LEDGER_SCOPE_KEY)
    if not isinstance(ledger, _BodyLedger):
        ledger = None
    received = 0
    first = True
    try:
        async with aclosing(request.stream()) as stream:
            iterator = aiter(stream)
            while True:
                if ledger is not None:
                    ledger.readers += 1
                try:
                    if first and limits.body_start_timeout > 0:
                        with anyio.move_on_after(limits.body_start_timeout) as waited:
                            chunk = await anext(iterator)
                        if waited.cancelled_caught:
                            if ledger is not None:
                                ledger.stalled = True
                            raise _consumed_error(
                                f"no body bytes arrived within {limits.body_start_timeout:g} s "
                                "(body_start_timeout); either the client stalled, or a "
                                "middleware outside BodyDrainMiddleware read the body"
                            )
                    else:
                        chunk = await anext(iterator)
                except StopAsyncIteration:
                    break
                finally:
                    if ledger is not None:
                        ledger.readers -= 1
                first = False
                if chunk:
                    received += len(chunk)
                    yield chunk
    except ClientDisconnect as exc:
        raise ClientDisconnectedError(
            "the client disconnected before the body ended; nothing was written"
        ) from exc
    except RuntimeError as exc:
        if str(exc) == "Stream consumed":  # Starlette raises no dedicated type
            raise _consumed_error("the request body was already read") from exc
        raise
    if ledger is not None and ledger.refused:
        raise _consumed_error(
            f"the whole body ({ledger.received:,} bytes) was delivered before this handler "
            f"read {'it' if not received else 'its end'}"
        )
    if ledger is not None and ledger.received > received:
        raise _consumed_error(
            f"the server delivered {ledger.received:,} body bytes but {received:,} reached "
            "this handler"
        )


@asynccontextmanager
async def request_batches(
    request: Request,
    table_schema: pa.Schema,
    *,
    limits: BodyLimits | None = None,
    required_columns: Sequence[str] = (),
    all_columns: bool = False,
    spool: bool = False,
    spool_dir: str | None = None,
    slice_rows: int = SLICE_ROWS,
) -> AsyncIterator[BodyBatches]:
    """The request body as a one-shot stream of batches checked against a table.

    Use it as ``async with request_batches(request, ds.schema, ...) as body:``
    and hand ``body`` to :func:`merge_body`, :func:`ingest_body` or any
    lance_async write (it is a STREAMING source).

    Parameters
    ----------
    request : starlette.requests.Request
        Its body must not have been read yet.
    table_schema : pa.Schema
        The target table's schema.
    limits : BodyLimits, optional
    required_columns : sequence of str
        Columns the body must hold (merge keys, non-nullable columns ...).
    all_columns : bool
        The body must hold every table column (MemWAL ingest).
    spool : bool
        Keep a replay spool (needed by ``merge_body(replay="spool")``).
    spool_dir : str, optional
        Where spool files go (default: the system's temporary directory).
    slice_rows : int
        Rows per batch handed on (larger ones are sliced, zero-copy; default
        8,192, where Lance's merge keeps its smallest working set).

    Yields
    ------
    BodyBatches
        Already started: the format, the limits known up front, the schema
        and the first rows were checked before the ``async with`` body runs.

    Raises
    ------
    UnsupportedMediaTypeError
        No decoder for the ``Content-Type`` (HTTP 415).
    PayloadTooLargeError
        ``Content-Length`` or the first message passes a limit (HTTP 413).
    SchemaMismatchError, DecodeError
        The body does not fit the table or its format (HTTP 422).
    EmptyBodyError, BodyConsumedError
        No bytes, no rows, or the body was consumed earlier (HTTP 400): see
        :class:`BodyDrainMiddleware` for what can be detected, at once or
        after ``limits.body_start_timeout``. Raised by iteration too (a
        body of which a middleware read only the first chunks).
    ClientDisconnectedError
        The client left (HTTP 499).

    Notes
    -----
    Leaving the block closes the body and deletes its spool (shielded).
    Reading never blocks the loop: chunks are collected on the loop and
    decoded on the library's ``stream`` threads.
    """
    limits = limits or BodyLimits()
    body = BodyBatches(
        _receive_chunks(request, limits),
        format=body_format(request.headers.get("content-type")),
        table_schema=table_schema,
        limits=limits,
        required_columns=required_columns,
        all_columns=all_columns,
        content_length=_content_length(request),
        spool=spool,
        spool_dir=spool_dir,
        slice_rows=slice_rows,
    )
    try:
        await body.start()
        yield body
    finally:
        await body.aclose()
        await body.discard_spool()


class BodyDrainMiddleware:
    """Guard request bodies: detect bodies read twice, and let early error
    responses reach clients that are still uploading.

    Consumed bodies
        The middleware counts the body messages the server delivers, in a
        ledger kept in the ASGI scope. When a handler reading through
        :func:`request_batches` asks for more of a body that was already
        delivered whole (a middleware inside this one read it and passed the
        original ``receive`` on), the request fails at once with
        :class:`BodyConsumedError` (HTTP 400) instead of waiting for a body
        message that the server will never send; a body of which fewer bytes
        reached the handler than the server delivered (a middleware read the
        first chunks) fails the same way when it ends.
    Early errors
        When a handler answers with a status >= 400 before the body has ended
        (a 413 at the first oversized message, a 422 at the schema check),
        closing the connection with unread bytes makes the kernel reset it,
        and the client never sees the response. The middleware reads and
        discards up to ``drain_bytes`` more of the body (within
        ``drain_timeout`` seconds) before the response starts; past that the
        response is sent with ``Connection: close``.

    Parameters
    ----------
    app : ASGI app
    drain_bytes : int
        Default 8 MiB.
    drain_timeout : float
        Default 5 seconds.

    Notes
    -----
    It sees only what passes through it, so it must be the outermost layer:
    use :func:`install_body_guard` (which keeps it outermost whatever
    middleware is added later), or wrap the ASGI app handed to the server.
    A body read by a middleware *outside* it cannot be told from a stalled
    client; ``BodyLimits.body_start_timeout`` bounds that wait (400 after 10
    s by default). A middleware that rewrites bodies (decompression) must not
    sit inside it: the byte counts would not match. A nested instance passes
    through untouched, as do requests without a body (no ``Content-Length``
    > 0, no ``Transfer-Encoding``) and responses below 400.
    """

    def __init__(
        self, app: ASGIApp, *, drain_bytes: int = 8 << 20, drain_timeout: float = 5.0
    ) -> None:
        self.app = app
        self.drain_bytes = drain_bytes
        self.drain_timeout = drain_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or BODY_LEDGER_SCOPE_KEY in scope:
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
            elif key == b"transfer-encoding":
                chunked = True
        if not chunked and not length:
            await self.app(scope, receive, send)
            return
        ledger = _BodyLedger()
        scope[BODY_LEDGER_SCOPE_KEY] = ledger

        async def tracked_receive() -> Message:
            if ledger.ended and ledger.readers and not ledger.gone:
                # A body reader asks for more of a body delivered whole before:
                # someone else read it, and the server would answer only when
                # the client leaves. End the body here; the reader raises (an
                # error raised here could reach the handler wrapped in the
                # exception group of a middleware's task group).
                ledger.refused = True
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                ledger.received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    ledger.ended = True
            elif message["type"] == "http.disconnect":
                ledger.gone = True
            return message

        async def drain() -> bool:
            if length is not None and length - ledger.received > self.drain_bytes:
                return False
            budget = ledger.received + self.drain_bytes
            with anyio.move_on_after(self.drain_timeout):
                while not ledger.ended and not ledger.gone:
                    await tracked_receive()
                    if ledger.received > budget:
                        break
            return ledger.ended

        async def guarded_send(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and int(message.get("status", 200)) >= 400
                and not ledger.ended
                and not ledger.gone
                and (ledger.stalled or not await drain())
            ):
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, tracked_receive, guarded_send)


def install_body_guard(
    app: Starlette, *, drain_bytes: int = 8 << 20, drain_timeout: float = 5.0
) -> None:
    """Make :class:`BodyDrainMiddleware` the outermost layer of ``app``.

    ``app.add_middleware`` puts the middleware added last outermost, so a
    :class:`BodyDrainMiddleware` added early would not see what a later one
    does to the body. This wraps the whole middleware stack that the app
    builds at its first request instead, outside every middleware added
    before or after (and outside Starlette's ``ServerErrorMiddleware``).

    Parameters
    ----------
    app : Starlette or FastAPI
        Not started yet.
    drain_bytes, drain_timeout
        As :class:`BodyDrainMiddleware`.

    Raises
    ------
    RuntimeError
        The app has already built its middleware stack (it has served).
    """
    if getattr(app, "middleware_stack", None) is not None:
        raise RuntimeError("install_body_guard must be called before the app starts")
    build = app.build_middleware_stack

    def build_guarded() -> ASGIApp:
        return BodyDrainMiddleware(build(), drain_bytes=drain_bytes, drain_timeout=drain_timeout)

    app.build_middleware_stack = build_guarded  # type: ignore[method-assign]


# ---------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------

_ACCEPT: dict[str, str] = {IPC_STREAM: "ipc", NDJSON: "ndjson", "application/jsonl": "ndjson"}
_FORMAT_NAMES: dict[str, str] = {
    "arrow": "ipc",
    "ipc": "ipc",
    "arrows": "ipc",
    "ndjson": "ndjson",
    "jsonl": "ndjson",
}


def negotiate_format(
    request: Request, *, override: str | None = None, default: str = "ndjson"
) -> str:
    """Choose a response format: ``override`` if given, else the ``Accept`` header.

    Parameters
    ----------
    request : Request
    override : str, optional
        ``"arrow"`` / ``"ipc"`` or ``"ndjson"`` / ``"jsonl"`` (a ``?format=``).
    default : {"ndjson", "ipc"}
        For a missing ``Accept`` or a wildcard.

    Returns
    -------
    str
        ``"ipc"`` or ``"ndjson"``.

    Raises
    ------
    NotAcceptableError
        Nothing acceptable (HTTP 406).
    """
    if override is not None:
        fmt = _FORMAT_NAMES.get(override.lower())
        if fmt is None:
            raise NotAcceptableError(
                f"unknown format {override[:40]!r}; use one of {sorted(_FORMAT_NAMES)}"
            )
        return fmt
    accept = request.headers.get("accept")
    if not accept:
        return default
    best: tuple[float, str] | None = None
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        fmt = _ACCEPT.get(media) or (default if media in ("*/*", "application/*") else None)
        if fmt is not None and quality > 0 and (best is None or quality > best[0]):
            best = (quality, fmt)
    if best is None:
        raise NotAcceptableError(
            f"cannot answer in {accept[:100]!r}; accept {IPC_STREAM} or {NDJSON}"
        )
    return best[1]


class BatchStreamResponse(StreamingResponse):
    """A streaming response of record batches (Arrow IPC stream or NDJSON).

    Parameters
    ----------
    batches : async iterable of pa.RecordBatch
        For example an :class:`~lance_async.AsyncBatchStream`. Closed
        (``aclose``) when the response ends, fails, or the client leaves.
    format : {"ndjson", "ipc"}
    schema : pa.Schema, optional
        Needed for an Arrow response that may hold no batch.
    status_code : int
    headers : mapping, optional
    on_close : callable, optional
        Called with the response once it is over, whatever the outcome.

    Attributes
    ----------
    rows_sent, batches_sent, bytes_sent : int
        Handed to the server so far.
    completed : bool
        True when every batch was sent.

    Notes
    -----
    Batches are encoded on the library's ``stream`` threads. A client that
    disconnects stops the response at once; the source is closed before the
    ASGI call returns (an :class:`AsyncBatchStream` stops its reader thread
    and closes the engine reader). An error after the first bytes aborts the
    connection: an Arrow stream then lacks its end marker and a chunked NDJSON
    body its last chunk, so clients never mistake it for a complete answer.
    """

    def __init__(
        self,
        batches: AsyncIterable[pa.RecordBatch],
        *,
        format: str = "ndjson",
        schema: pa.Schema | None = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        on_close: Callable[[BatchStreamResponse], object] | None = None,
    ) -> None:
        self._source = batches
        self._encoder = make_encoder(format, schema)
        self._on_close = on_close
        self._finished = False
        self.rows_sent = 0
        self.batches_sent = 0
        self.bytes_sent = 0
        self.completed = False
        self._chunks = self._generate()
        super().__init__(
            self._chunks,
            status_code=status_code,
            headers=headers,
            media_type=self._encoder.media_type,
        )

    async def _close_source(self) -> None:
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()

    async def _generate(self) -> AsyncIterator[bytes]:
        encoder = self._encoder
        try:
            async for batch in self._source:
                data = await run_sync(partial(encoder.encode, batch), limiter=stream_limiter())
                if data:
                    yield data
                    self.bytes_sent += len(data)
                self.rows_sent += batch.num_rows
                self.batches_sent += 1
            tail = await run_sync(encoder.finish, limiter=stream_limiter())
            if tail:
                yield tail
                self.bytes_sent += len(tail)
            self.completed = True
        finally:
            await self._close_source()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()  # type: ignore[attr-defined]
                await self._close_source()
            if not self._finished:
                self._finished = True
                if self._on_close is not None:
                    self._on_close(self)


async def scan_response(
    request: Request,
    stream: AsyncBatchStream,
    *,
    format: str | None = None,
    headers: Mapping[str, str] | None = None,
    on_close: Callable[[BatchStreamResponse], object] | None = None,
) -> BatchStreamResponse:
    """Stream a scan to the client in the format it accepts.

    The scan is opened before the response starts, so a bad filter or column
    raises here (and becomes a 4xx), not in the middle of a 200.

    Parameters
    ----------
    request : Request
        For the ``Accept`` header.
    stream : AsyncBatchStream
        For example ``dataset.scan(...)``; this function owns it from now on.
    format : str, optional
        ``"arrow"`` / ``"ndjson"``, overriding ``Accept``.
    headers : mapping, optional
    on_close : callable, optional
        See :class:`BatchStreamResponse`.

    Returns
    -------
    BatchStreamResponse
        Return it from the handler (it closes the stream when done).

    Raises
    ------
    NotAcceptableError
        Nothing acceptable (the scan is not started).
    BaseException
        What opening the scan raised (the stream is closed).
    """
    try:
        fmt = negotiate_format(request, override=format)
        await stream.open()
    except BaseException:
        await stream.aclose()
        raise
    return BatchStreamResponse(
        stream, format=fmt, schema=stream.schema, headers=headers, on_close=on_close
    )


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON response encoded with :func:`dumps_json` (timestamps, binary and
    NaN handled). Blocking CPU work: use it for small payloads."""
    return Response(dumps_json(content), status_code=status_code, media_type="application/json")


# ---------------------------------------------------------------------------
# filters
# ---------------------------------------------------------------------------

MAX_FILTERS = 16
MAX_FILTER_CHARS = 1024
_FILTER_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<>|<=|>=|=|<|>)\s*(.*?)\s*", re.S)
_OPERATORS = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}


def _unquote(text: str, raw: str) -> str:
    if text[:1] in ("'", '"'):
        quote = text[0]
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != quote or quote in inner.replace(quote * 2, ""):
            raise FilterError(f"unterminated or badly quoted string in {raw!r}", filter=raw)
        text = inner.replace(quote * 2, quote)
    if "\x00" in text:
        raise FilterError("a filter literal cannot hold NUL characters", filter=raw)
    return text


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _literal(text: str, field: pa.Field, raw: str) -> str:
    dtype = field.type
    if not text:
        raise FilterError(f"the filter {raw!r} has no value", filter=raw)
    if pa.types.is_integer(dtype):
        if not re.fullmatch(r"[+-]?\d{1,20}", text):
            raise FilterError(f"{field.name!r} is {dtype}: {text[:40]!r} is not one", filter=raw)
        value = int(text)
        bits = dtype.bit_width
        low, high = (
            (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
            if pa.types.is_signed_integer(dtype)
            else (0, (1 << bits) - 1)
        )
        if not low <= value <= high:
            raise FilterError(f"{value} is out of range for {field.name!r} ({dtype})", filter=raw)
        return str(value)
    if pa.types.is_floating(dtype):
        try:
            number = float(text)
        except ValueError:
            raise FilterError(
                f"{field.name!r} is {dtype}: {text[:40]!r} is not a number", filter=raw
            ) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise FilterError("filter numbers must be finite", filter=raw)
        return repr(number)
    if pa.types.is_boolean(dtype):
        if text.lower() not in ("true", "false"):
            raise FilterError(f"{field.name!r} is boolean: use true or false", filter=raw)
        return text.upper()
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return _sql_string(_unquote(text, raw))
    if pa.types.is_date(dtype):
        try:
            day = datetime.date.fromisoformat(_unquote(text, raw))
        except ValueError:
            raise FilterError(f"{field.name!r} is a date: use YYYY-MM-DD", filter=raw) from None
        return f"CAST('{day.isoformat()}' AS DATE)"
    if pa.types.is_timestamp(dtype):
        try:
            moment = datetime.datetime.fromisoformat(_unquote(text, raw))
        except ValueError:
            raise FilterError(f"{field.name!r} is a timestamp: use ISO 8601", filter=raw) from None
        return f"CAST('{moment.replace(tzinfo=None).isoformat(sep=' ')}' AS TIMESTAMP)"
    raise FilterError(
        f"filters on {field.name!r} ({dtype}) are not supported in the allowed form", filter=raw
    )


def compile_filter(
    filters: str | Sequence[str] | None,
    schema: pa.Schema,
    *,
    allow_raw_sql: bool = False,
) -> str | None:
    """Turn client filters into one Lance SQL filter that is safe to run.

    Parameters
    ----------
    filters : str or list of str or None
        Each one ``column <op> literal``, with ``op`` in ``= == != <> < <= >
        >=``; all of them must hold (AND). String literals may be quoted
        (``'O''Brien'`` or ``"x"``) or bare; numbers, ``true`` / ``false``,
        ISO dates and timestamps are checked against the column's type.
    schema : pa.Schema
        The table's schema (columns must exist in it).
    allow_raw_sql : bool
        Accept any Lance SQL expression instead (each wrapped in parentheses
        and joined with AND). Only for trusted clients.

    Returns
    -------
    str or None
        The SQL (identifiers backquoted, literals re-rendered from their
        parsed values), or None when there is no filter.

    Raises
    ------
    FilterError
        Too many or too long filters, a filter not in the allowed form, an
        unknown column or a literal that does not fit its column (HTTP 400).

    Notes
    -----
    Pure and fast; does not block.
    """
    items = [filters] if isinstance(filters, str) else list(filters or [])
    items = [f for f in items if f.strip()]
    if not items:
        return None
    if len(items) > MAX_FILTERS:
        raise FilterError(f"at most {MAX_FILTERS} filters are accepted, got {len(items)}")
    for raw in items:
        if len(raw) > MAX_FILTER_CHARS:
            raise FilterError(f"a filter may hold at most {MAX_FILTER_CHARS} characters")
    if allow_raw_sql:
        return " AND ".join(f"({raw})" for raw in items)
    clauses = []
    for raw in items:
        match = _FILTER_RE.fullmatch(raw)
        if match is None:
            raise FilterError(
                f"filter {raw[:200]!r} is not of the form `column <op> value` "
                "(op: = != < <= > >=); raw SQL is not enabled on this server",
                filter=raw,
            )
        column, op, text = match.groups()
        if column not in schema.names:
            raise FilterError(
                f"unknown column {column!r} in filter (columns: {schema.names})", filter=raw
            )
        literal = _literal(text, schema.field(column), raw)
        clauses.append(f"`{column}` {_OPERATORS[op]} {literal}")
    return " AND ".join(clauses)


# ---------------------------------------------------------------------------
# errors -> HTTP
# ---------------------------------------------------------------------------

_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (NotAcceptableError, 406),
    (ClientDisconnectedError, 499),
    (BodyConsumedError, 400),
    (EmptyBodyError, 400),
    (FilterError, 400),
    (UnknownTableError, 404),
    (DatasetNotFoundError, 404),
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
    PayloadTooLargeError                                    413
    UnsupportedMediaTypeError                               415
    NotAcceptableError                                      406
    ClientDisconnectedError                                 499
    BodyConsumedError, EmptyBodyError, FilterError          400
    UnknownTableError, DatasetNotFoundError                 404
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


def error_payload(exc: BaseException) -> dict[str, Any]:
    """The JSON body for an error: ``detail``, ``error`` and, when set, ``field``,
    ``limit``, ``maximum``, ``actual``, ``filter`` and ``retryable``."""
    payload: dict[str, Any] = {"detail": str(exc), "error": type(exc).__name__}
    for attr in ("field", "limit", "maximum", "actual", "filter"):
        value = getattr(exc, attr, None)
        if value is not None:
            payload[attr] = value
    if getattr(exc, "retryable", False):
        payload["retryable"] = True
    return payload


async def lance_error_handler(request: Request, exc: Exception) -> Response:
    """Exception handler: a lance_async error as a JSON response (see :func:`http_status`).

    Retryable errors and 503s carry ``Retry-After: 1``.
    """
    status = http_status(exc)
    if status == 499:
        log.info("lance_async: %s %s: %s", request.method, request.url.path, exc)
    elif status >= 500:
        log.error("lance_async: %s %s failed: %r", request.method, request.url.path, exc)
    headers = {}
    if status == 503 or getattr(exc, "retryable", False):
        headers["Retry-After"] = "1"
    return Response(
        dumps_json(error_payload(exc)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def install_error_handlers(app: Starlette) -> None:
    """Answer every :class:`~lance_async.LanceAsyncError` with
    :func:`lance_error_handler` (a JSON body and the status of :func:`http_status`)."""
    app.add_exception_handler(LanceAsyncError, lance_error_handler)
