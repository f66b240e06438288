"""``AsyncShardWriter``: a MemWAL shard writer with a bounded queue and group commit.

A durable ``ShardWriter.put`` waits for a WAL flush (about 55 ms on pylance
14 whatever the batch size) and puts on one writer serialize, so throughput
comes only from putting many rows per put. The writer task here coalesces:
while one engine put is in flight, everything that arrives queues up; the
next put takes all of it (up to ``max_put_rows`` / ``max_put_bytes``,
concatenated into one batch), like aiokafka's accumulator batches records
while a request is in flight.

Guarantees
----------
* Backpressure: :meth:`AsyncShardWriter.send` waits while the queue holds
  ``max_queue_rows`` rows or ``max_queue_bytes`` bytes (queued or in flight).
  Nothing is dropped; ``timeout=`` turns a long wait into
  :class:`~lance_async.BackpressureTimeoutError`.
* Validation before queueing: each batch is checked against the table
  (names, types, nulls in key and non-nullable columns) before it enters the
  queue, so a bad batch fails only its sender.
* Acks: an :class:`~lance_async.Ack` resolves when the engine put that
  carried its rows returned -- after the WAL flush when ``durable_write`` is
  on (the engine's default). If the engine still rejects a coalesced put, its
  items are retried one by one so exactly the bad ones fail; the writer stays
  usable.
* Fatal errors: an engine error that is not about the input (an I/O error, a
  failed WAL flush) fails every pending and later ack, promptly, with one
  :class:`~lance_async.WriterFailedError`.
* Order: puts and deletes on one writer reach the engine in the order they
  were queued.
* Read-your-writes: the writer's LSM reads wait out a sealed ("frozen")
  memtable before planning, so every acked row is visible (pylance 14's own
  scanner hides a frozen memtable's rows until its SSTable is written).

Cancellation rule
-----------------
A send of in-memory rows (a batch, a table, a frame...) is queued whole or
not at all; a streamed send (an iterator, a reader) is queued whole or not
at all per batch. Cancelling a task blocked in ``send``/``put`` before its
rows were queued queues nothing; cancelling it afterwards (while it awaits
the ack) leaves the rows queued: they are written exactly once and the
:class:`~lance_async.Ack` (kept by ``send`` callers) still resolves. Closing
the writer flushes everything queued (shielded from cancellation, bounded
by ``close_timeout``).
"""

from __future__ import annotations

import enum
import logging
import math
import time
import warnings
from collections import deque
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._loop import LoopHandle, aclose_shielded, unwrap_groups
from ._retired import NO_KEY, retired_shards
from ._schema import TableFit, primary_key
from ._threads import run_sync
from .acks import Ack, PutSummary
from .errors import (
    BackpressureTimeoutError,
    ClosedError,
    InvalidInputError,
    LanceAsyncError,
    SchemaMismatchError,
    WriterFailedError,
    map_engine_error,
    raise_mapped,
)
from .lsm import _lance_snaps, exact_knn_scan, key_filter, scanner_stream, shard_snapshots
from .sources import SourceMode, resolve_source

if TYPE_CHECKING:
    from .dataset import AsyncDataset
    from .lsm import ShardSnapshots
    from .sources.streams import AsyncBatchStream

__all__ = ["AsyncShardWriter", "WriterState", "WriterStats"]

log = logging.getLogger("lance_async")

DEFAULT_MAX_MEMTABLE_ROWS = 100_000
_LATENCY_SAMPLES = 20_000


class WriterState(enum.Enum):
    """Life cycle of an :class:`AsyncShardWriter`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(frozen=True)
class WriterStats:
    """A snapshot of an :class:`AsyncShardWriter` (from :meth:`~AsyncShardWriter.stats`).

    Attributes
    ----------
    state : WriterState
    queue_rows, queue_bytes : int
        Rows / bytes accepted and not yet acknowledged (queued or in flight).
    max_queue_rows_seen, max_queue_bytes_seen : int
        The highest those have been.
    engine_puts, engine_deletes : int
        Engine calls made.
    rows : int
        Rows written.
    rows_per_put : float
        ``rows / engine_puts``.
    ack_latency_p50, ack_latency_p99 : float
        Seconds from queueing to ack, over the last 20,000 acked parts.
    failed_puts : int
        Engine puts rejected (their items were retried one by one).
    engine : dict
        The engine's ``stats()`` after the last put.
    memtable : dict
        The engine's ``memtable_stats()`` after the last put.
    """

    state: WriterState
    queue_rows: int
    queue_bytes: int
    max_queue_rows_seen: int
    max_queue_bytes_seen: int
    engine_puts: int
    engine_deletes: int
    rows: int
    rows_per_put: float
    ack_latency_p50: float
    ack_latency_p99: float
    failed_puts: int
    engine: dict[str, Any] = field(default_factory=dict)
    memtable: dict[str, Any] = field(default_factory=dict)


class _Kind(enum.Enum):
    PUT = 1
    DELETE = 2
    FLUSH = 3


@dataclass
class _Item:
    kind: _Kind
    batch: pa.RecordBatch | None
    ack: Ack
    rows: int
    nbytes: int
    queued_at: float


def percentiles(values: Sequence[float], *qs: float) -> list[float]:
    """Nearest-rank percentiles (``q`` in 0..1) of ``values``, sorted once;
    zeros for no values."""
    if not values:
        return [0.0 for _ in qs]
    ordered = sorted(values)
    n = len(ordered)
    return [float(ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]) for q in qs]


class AsyncShardWriter:
    """Write one MemWAL shard from async code, with group commit.

    Obtain it from :meth:`AsyncDataset.mem_wal_writer` and use it as
    ``async with``; it owns one ``lance.mem_wal.ShardWriter`` and one writer
    task (in a task group owned by the ``async with`` block, so the task's
    errors reach you).

    Parameters
    ----------
    dataset : AsyncDataset
        A dataset on which ``initialize_mem_wal`` ran.
    shard_id : str
        The shard's UUID, in any spelling ``uuid.UUID`` takes; kept (and
        shown as :attr:`shard_id`) in its canonical lower-case form.
        Reopening the same shard replays its WAL.
    max_queue_rows : int, optional
        Rows queued or in flight before senders wait (default
        ``2 * max_put_rows``).
    max_queue_bytes : int
        Bytes queued or in flight before senders wait (default 256 MiB).
    max_put_rows : int, optional
        Rows per engine put (default half the engine's ``max_memtable_rows``;
        never above it, since one put never spans memtables).
    max_put_bytes : int
        Bytes per engine put (default 64 MiB).
    linger : float
        Seconds to wait for more rows when the queue holds less than
        ``max_put_rows`` (default 0: coalescing then comes only from what
        arrives while a put is in flight).
    close_timeout : float
        Seconds that closing may spend flushing (default 60).
    **lance_writer_kwargs
        Passed to ``LanceDataset.mem_wal_writer`` (``durable_write``,
        ``max_memtable_rows``, ``max_wal_flush_interval_ms``, ...).

    Notes
    -----
    Ack latency. pylance 14 flushes a durable put's WAL when the buffered WAL
    bytes reach ``max_wal_buffer_size`` (default 10 MB), otherwise at the
    next ``max_wal_flush_interval_ms`` tick (default 100 ms). Puts that follow
    each other closely each wait for a tick, so with the defaults a row that
    arrives while a put is in flight is durable after up to two ticks (ack
    p99 178 ms over 120,000 10-row messages in ``bench/``).
    ``max_wal_buffer_size=1`` makes every put flush when it is made; with
    ``linger=0.02`` to keep puts large the same bench measured ack p99 30 ms
    at 0.83x the default's rows/s and a lower peak RSS, in exchange for more,
    smaller WAL writes (``python -m bench``, configuration
    ``lance_async_low_latency``; bench/results/REPORT.md).
    """

    def __init__(
        self,
        dataset: AsyncDataset,
        shard_id: str,
        *,
        max_queue_rows: int | None = None,
        max_queue_bytes: int = 256 * 1024 * 1024,
        max_put_rows: int | None = None,
        max_put_bytes: int = 64 * 1024 * 1024,
        linger: float = 0.0,
        close_timeout: float = 60.0,
        **lance_writer_kwargs: Any,
    ) -> None:
        import uuid

        try:
            canonical = str(uuid.UUID(str(shard_id)))  # the engine's folder name
        except ValueError:
            raise ValueError(f"shard_id must be a UUID string, got {shard_id!r}") from None
        for name, value in (
            ("max_queue_rows", max_queue_rows),
            ("max_put_rows", max_put_rows),
            ("max_queue_bytes", max_queue_bytes),
            ("max_put_bytes", max_put_bytes),
        ):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if linger < 0:
            raise ValueError("linger must be >= 0")
        self._dataset = dataset
        self.shard_id = canonical
        self._requested_queue_rows = max_queue_rows
        self._requested_put_rows = max_put_rows
        self.max_queue_bytes = max_queue_bytes
        self.max_put_bytes = max_put_bytes
        self.max_queue_rows = 0
        self.max_put_rows = 0
        self.linger = linger
        self.close_timeout = close_timeout
        self._writer_kwargs = dict(lance_writer_kwargs)
        self.durable_write = bool(self._writer_kwargs.get("durable_write", True))
        self._table_schema = dataset.schema
        self._keys = primary_key(self._table_schema)
        self._fit = TableFit(self._table_schema, self._keys)
        self._key_fit = TableFit(
            pa.schema([self._table_schema.field(k) for k in self._keys]), self._keys
        )
        self._state = WriterState.NEW
        self._engine: Any = None
        self._loop: LoopHandle | None = None
        self._tg: TaskGroup | None = None
        self._task_scope: anyio.CancelScope | None = None
        self._send_stream: MemoryObjectSendStream[_Item] | None = None
        self._recv_stream: MemoryObjectReceiveStream[_Item] | None = None
        self._gate: anyio.Lock | None = None
        self._task_done: anyio.Event | None = None
        self._space: anyio.Event | None = None
        self._failure: WriterFailedError | None = None
        self._queue_rows = 0
        self._queue_bytes = 0
        self._max_rows_seen = 0
        self._max_bytes_seen = 0
        self._engine_puts = 0
        self._engine_deletes = 0
        self._rows = 0
        self._failed_puts = 0
        self._latencies: deque[float] = deque(maxlen=_LATENCY_SAMPLES)
        self._engine_stats: dict[str, Any] = {}
        self._memtable_stats: dict[str, Any] = {}
        self._put_seq = 0

    def __repr__(self) -> str:
        return f"<AsyncShardWriter shard={self.shard_id} state={self._state.value}>"

    def __del__(self) -> None:
        if getattr(self, "_state", None) in (WriterState.OPEN, WriterState.FAILED):
            warnings.warn(
                f"{self!r} was never closed; use `async with` or await aclose()",
                ResourceWarning,
                stacklevel=1,
            )

    # -- life cycle ---------------------------------------------------------
    @property
    def state(self) -> WriterState:
        """Where the writer is in its life cycle."""
        return self._state

    @property
    def schema(self) -> pa.Schema:
        """The table schema that every batch must match."""
        return self._table_schema

    async def __aenter__(self) -> AsyncShardWriter:
        await self._open(None)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self, task_group: TaskGroup) -> AsyncShardWriter:
        """Open the engine writer and start the writer task in ``task_group``.

        ``async with dataset.mem_wal_writer(...)`` is the usual way: it owns the
        writer task. Use ``open`` when the writer must outlive one block: the
        task runs in the task group you pass (trio's rule: no task outlives its
        caller unless a task group is passed explicitly), and you must
        ``await writer.aclose()`` before that task group ends.

        Parameters
        ----------
        task_group : anyio.abc.TaskGroup
            Where the writer task runs; its owner sees the task's errors.

        Raises
        ------
        ClosedError
            Already opened once.
        InvalidInputError
            The table has no primary key; the shard was retired by a later
            ``initialize_mem_wal`` (see ``lance_async._retired``); or the
            engine refused: the MemWAL is not initialized, or an option is
            out of range.
        OSError
            Storage errors, unchanged.
        """
        return await self._open(task_group)

    async def _open(self, task_group: TaskGroup | None) -> AsyncShardWriter:
        if self._state is not WriterState.NEW:
            raise ClosedError(f"{self!r} was already opened; open a new writer")
        self._loop = LoopHandle()
        kwargs = self._writer_kwargs
        ds = self._dataset.lance

        if not self._keys:
            raise InvalidInputError(f"{self!r}: {NO_KEY}")

        def work() -> tuple[Any, int]:
            if self.shard_id in retired_shards(ds.checkout_version(ds.latest_version)):
                raise InvalidInputError(
                    f"shard {self.shard_id} belongs to a MemWAL that this table replaced "
                    "(an overwrite, then initialize_mem_wal); opening it would replay the old "
                    "table's rows. Use another shard id"
                )
            engine = ds.mem_wal_writer(self.shard_id, **kwargs)
            limit = kwargs.get("max_memtable_rows")
            if limit is None:
                details = ds.mem_wal_index_details() or {}
                limit = (details.get("writer_config_defaults") or {}).get("max_memtable_rows")
            return engine, int(limit or DEFAULT_MAX_MEMTABLE_ROWS)

        try:
            self._engine, memtable_rows = await run_sync(work)
        except (OSError, ValueError, RuntimeError) as exc:
            raise_mapped(exc)
            raise
        put_rows = self._requested_put_rows or max(1, memtable_rows // 2)
        self.max_put_rows = min(put_rows, memtable_rows)
        self.max_queue_rows = self._requested_queue_rows or 2 * self.max_put_rows
        self._gate = anyio.Lock()
        self._task_done = anyio.Event()
        self._send_stream, self._recv_stream = anyio.create_memory_object_stream[_Item](math.inf)
        self._task_scope = anyio.CancelScope()
        if task_group is None:
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            task_group = self._tg
        task_group.start_soon(self._run_scoped, name=f"lance_async writer {self.shard_id}")
        self._state = WriterState.OPEN
        return self

    def _check_usable(self) -> None:
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))
        self._check_state()

    def _check_state(self) -> None:
        if self._state is WriterState.FAILED:
            assert self._failure is not None
            raise self._failure
        if self._state is not WriterState.OPEN:
            raise ClosedError(f"{self!r} is not open; use `async with dataset.mem_wal_writer(...)`")

    async def flush(self) -> PutSummary:
        """Wait until everything queued before this call is written.

        With ``durable_write`` on (the default) written means durable in the
        WAL; with it off, accepted by the engine (durable after close).

        Raises
        ------
        WriterFailedError
            The writer broke before the queue drained.
        """
        self._check_usable()
        assert self._send_stream is not None
        ack = Ack(self._loop)
        ack._add_part()
        ack._seal()
        self._send_stream.send_nowait(_Item(_Kind.FLUSH, None, ack, 0, 0, time.monotonic()))
        return await ack

    async def aclose(self) -> None:
        """Flush what is queued, close the engine writer, stop the writer task.

        Safe to call twice. The flush is shielded from cancellation and
        bounded by ``close_timeout``; acks still pending after it fail with
        :class:`ClosedError`. Errors of the writer task are raised here.
        """
        if self._state in (WriterState.NEW, WriterState.CLOSED, WriterState.CLOSING):
            if self._state is WriterState.NEW:
                self._state = WriterState.CLOSED
            return
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))  # close it from the loop that opened it
        failed = self._state is WriterState.FAILED
        self._state = WriterState.CLOSING
        assert self._send_stream is not None and self._task_scope is not None
        assert self._task_done is not None
        engine = self._engine

        def close_engine() -> None:
            try:
                engine.close()
            except (OSError, ValueError, RuntimeError) as exc:
                if failed or "already closed" in str(exc):
                    log.debug("lance_async: closing a failed writer: %s", exc)
                    return
                raise

        try:
            with anyio.CancelScope(shield=True):
                self._send_stream.close()  # the writer task drains the queue, then ends
                with anyio.move_on_after(self.close_timeout):
                    await self._task_done.wait()
                if not self._task_done.is_set():
                    log.warning("lance_async: %r did not drain within close_timeout", self)
                    self._task_scope.cancel()
                    await self._task_done.wait()
                try:
                    await run_sync(close_engine)
                except (OSError, ValueError, RuntimeError) as exc:
                    mapped = map_engine_error(exc)
                    raise (mapped or self._fail_writer(exc)) from exc
        finally:
            self._state = WriterState.CLOSED
            self._wake_senders()
            if self._tg is not None:
                tg, self._tg = self._tg, None
                with unwrap_groups():
                    await tg.__aexit__(None, None, None)

    # -- sending -------------------------------------------------------------
    def _wake_senders(self) -> None:
        if self._space is not None:
            self._space.set()
            self._space = None

    def _has_room(self, rows: int, nbytes: int) -> bool:
        """Room for this many more rows and bytes? (An empty queue takes anything.)"""
        return self._queue_rows == 0 or (
            self._queue_rows + rows <= self.max_queue_rows
            and self._queue_bytes + nbytes <= self.max_queue_bytes
        )

    def _take_room(self, rows: int, nbytes: int) -> None:
        self._check_state()
        self._queue_rows += rows
        self._queue_bytes += nbytes
        self._max_rows_seen = max(self._max_rows_seen, self._queue_rows)
        self._max_bytes_seen = max(self._max_bytes_seen, self._queue_bytes)

    async def _reserve(self, rows: int, nbytes: int, deadline: float | None) -> None:
        while not self._has_room(rows, nbytes):
            self._check_state()
            if self._space is None:
                self._space = anyio.Event()
            if deadline is None:
                await self._space.wait()
            else:
                with anyio.move_on_at(deadline) as scope:
                    await self._space.wait()
                if scope.cancelled_caught:
                    raise BackpressureTimeoutError(
                        f"{self!r}: the queue stayed full ({self._queue_rows} rows, "
                        f"{self._queue_bytes} bytes) past the timeout; this batch was not "
                        "queued (batches of the same send before it were)"
                    )
        self._take_room(rows, nbytes)

    def _release(self, rows: int, nbytes: int) -> None:
        self._queue_rows -= rows
        self._queue_bytes -= nbytes
        self._wake_senders()

    @staticmethod
    def _in_memory(data: Any, conform: Any) -> list[pa.RecordBatch] | None:
        """Checked batches of a RecordBatch or Table (None for any other data)."""
        if isinstance(data, pa.RecordBatch):
            return [conform(data, 0)]
        if isinstance(data, pa.Table):
            return [conform(b, i) for i, b in enumerate(data.to_batches()) if b.num_rows]
        return None

    def _pieces(self, batches: Sequence[pa.RecordBatch]) -> list[tuple[pa.RecordBatch, int]]:
        """Batches cut to at most ``max_put_rows`` rows, with their sizes in bytes."""
        limit = self.max_put_rows
        out: list[tuple[pa.RecordBatch, int]] = []
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if batch.num_rows <= limit:
                out.append((batch, batch.get_total_buffer_size()))
            else:  # slices share buffers: count what each one spans
                out.extend(
                    (piece, piece.nbytes)
                    for piece in (batch.slice(i, limit) for i in range(0, batch.num_rows, limit))
                )
        return out

    async def _enqueue(
        self, kind: _Kind, batches: Sequence[pa.RecordBatch], ack: Ack, deadline: float | None
    ) -> None:
        """Queue checked batches whole, or nothing of them (never a part)."""
        pieces = self._pieces(batches)
        if not pieces:
            return
        await self._reserve(sum(p.num_rows for p, _ in pieces), sum(n for _, n in pieces), deadline)
        self._queue(kind, pieces, ack)

    def _queue(self, kind: _Kind, pieces: list[tuple[pa.RecordBatch, int]], ack: Ack) -> None:
        """Hand pieces whose queue room is taken to the writer task."""
        assert self._send_stream is not None
        now = time.monotonic()
        for piece, nbytes in pieces:
            ack._add_part()
            self._send_stream.send_nowait(_Item(kind, piece, ack, piece.num_rows, nbytes, now))

    async def _send_batches(
        self, kind: _Kind, data: Any, timeout: float | None, schema: pa.Schema | None
    ) -> Ack:
        self._check_usable()
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
        await anyio.lowlevel.checkpoint()  # every send is a checkpoint (trio's rule)
        deadline = None if timeout is None else anyio.current_time() + timeout
        ack = Ack(self._loop)
        conform = self._fit.check if kind is _Kind.PUT else self._conform_keys
        # fast path: one batch or table, checked before anything is queued
        batches = self._in_memory(data, conform) if schema is None else None
        if batches is None:
            source = await resolve_source(data, schema=schema)
            if source.mode is SourceMode.MATERIALIZED:
                batches = [conform(b, i) for i, b in enumerate(source.batches() or [])]
            else:
                await self._send_stream_source(kind, source.open(), ack, deadline, conform)
                return ack
        await self._enqueue(kind, batches, ack, deadline)  # all rows of the send, or none
        ack._seal()
        return ack

    async def _send_stream_source(
        self, kind: _Kind, stream: Any, ack: Ack, deadline: float | None, conform: Any
    ) -> None:
        index = 0
        try:
            async for batch in stream:
                if batch.num_rows:
                    await self._enqueue(kind, [conform(batch, index)], ack, deadline)
                index += 1
        except BaseException as exc:
            # batches already queued are written; the ack reports the failure
            ack._fail_unsealed(exc if isinstance(exc, Exception) else ClosedError("send cancelled"))
            raise
        finally:
            await aclose_shielded(stream)
        ack._seal()

    async def send(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> Ack:
        """Queue rows for writing; wait only for room in the queue.

        Parameters
        ----------
        data : anything :func:`~lance_async.coerce_source` accepts
            Rows with exactly the table's column names (any order) and types.
            A stream (iterator, async iterator, reader) is queued batch by
            batch under backpressure; this returns after its last batch.
        timeout : float, optional
            Seconds to wait for room; then :class:`BackpressureTimeoutError`
            (batches queued before the timeout stay queued).
        schema : pa.Schema, optional
            The data's schema, for generators (saves peeking).

        Returns
        -------
        Ack
            Resolves when every row is written (see the module notes).

        Raises
        ------
        SchemaMismatchError
            A batch does not fit the table (nothing of that batch is queued).
        BackpressureTimeoutError
            No room before ``timeout``.
        ClosedError, WriterFailedError
            The writer is closed or broken.
        """
        return await self._send_batches(_Kind.PUT, data, timeout, schema)

    def send_nowait(self, data: pa.RecordBatch | pa.Table) -> Ack:
        """Queue in-memory rows at once, or fail at once when there is no room.

        The ``send`` / ``send_nowait`` pair of anyio's memory streams: no
        waiting, no checkpoint, the cheapest way to hand a writer many small
        batches (check the returned ack later, or call :meth:`flush`).

        Parameters
        ----------
        data : pa.RecordBatch or pa.Table
            Rows with the table's columns (any order) and types.

        Returns
        -------
        Ack

        Raises
        ------
        anyio.WouldBlock
            The queue has no room for these rows now (nothing was queued).
        SchemaMismatchError
            The rows do not fit the table (nothing was queued).
        TypeError
            ``data`` is not a RecordBatch or Table; use :meth:`send`.
        ClosedError, WriterFailedError, WrongEventLoopError
            As :meth:`send`.
        """
        self._check_usable()
        batches = self._in_memory(data, self._fit.check)
        if batches is None:
            raise TypeError(
                f"send_nowait takes a pyarrow RecordBatch or Table, not {type(data).__name__}; "
                "use `await writer.send(...)` for other sources"
            )
        ack = Ack(self._loop)
        pieces = self._pieces(batches)
        if pieces:
            rows = sum(p.num_rows for p, _ in pieces)
            nbytes = sum(n for _, n in pieces)
            if not self._has_room(rows, nbytes):
                raise anyio.WouldBlock
            self._take_room(rows, nbytes)
            self._queue(_Kind.PUT, pieces, ack)
        ack._seal()
        return ack

    async def put(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> PutSummary:
        """Write rows and wait until they are written (``await (await send(data))``).

        Returns
        -------
        PutSummary
            Rows, batches and the engine puts that carried them.

        Raises
        ------
        SchemaMismatchError, BackpressureTimeoutError, ClosedError, WriterFailedError
            As :meth:`send`.
        InvalidInputError
            The engine rejected these rows (the writer stays usable).
        """
        ack = await self.send(data, timeout=timeout, schema=schema)
        return await ack

    async def put_stream(
        self, stream: AsyncIterable[Any] | Iterable[Any], *, timeout: float | None = None
    ) -> PutSummary:
        """Drain a feed of batches through the queue and wait for all of it.

        Memory stays bounded by the queue limits, whatever the feed's length:
        each batch waits for room before it is queued.

        Returns
        -------
        PutSummary
        """
        return await self.put(stream, timeout=timeout)

    def _conform_keys(self, batch: pa.RecordBatch, index: int) -> pa.RecordBatch:
        if not self._keys:
            raise InvalidInputError("delete needs a primary key, and the table has none")
        missing = [k for k in self._keys if k not in batch.schema.names]
        if missing:
            raise SchemaMismatchError(f"delete keys lack column {missing[0]!r}", field=missing[0])
        return self._key_fit.check(batch.select(self._keys), index)

    async def delete(self, keys: Any, *, timeout: float | None = None) -> PutSummary:
        """Delete rows by primary key, in order with the puts queued before it.

        Parameters
        ----------
        keys : table-like
            Rows holding the primary-key column(s); other columns are ignored.
            A dict of columns works: ``{"id": [1, 2]}``.

        Returns
        -------
        PutSummary
            With ``deletes`` = number of keys.
        """
        ack = await self._send_batches(_Kind.DELETE, keys, timeout, None)
        return await ack

    # -- the writer task ---------------------------------------------------
    async def _run_scoped(self) -> None:
        assert self._task_scope is not None and self._task_done is not None
        try:
            with self._task_scope:
                await self._run()
        finally:
            assert self._recv_stream is not None
            self._recv_stream.close()
            self._task_done.set()

    async def _run(self) -> None:
        assert self._recv_stream is not None
        pending: deque[_Item] = deque()
        recv = self._recv_stream
        try:
            while True:
                if not pending:
                    try:
                        pending.append(await recv.receive())
                    except anyio.EndOfStream:
                        return
                self._drain_nowait(pending)
                if self.linger > 0 and pending[0].kind is _Kind.PUT:
                    await self._linger(pending)
                await self._execute(self._take_run(pending))
        finally:
            self._drain_nowait(pending)
            error = self._failure or ClosedError(f"{self!r} closed before these rows were written")
            for item in pending:
                self._fail_item(item, error)
            pending.clear()

    def _drain_nowait(self, pending: deque[_Item]) -> None:
        assert self._recv_stream is not None
        while True:
            try:
                pending.append(self._recv_stream.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return

    async def _linger(self, pending: deque[_Item]) -> None:
        assert self._recv_stream is not None
        remaining = pending[0].queued_at + self.linger - time.monotonic()
        rows = sum(i.rows for i in pending if i.kind is _Kind.PUT)
        if remaining <= 0:
            return
        with anyio.move_on_after(remaining):
            while rows < self.max_put_rows:
                try:
                    item = await self._recv_stream.receive()
                except anyio.EndOfStream:
                    return
                pending.append(item)
                rows += item.rows

    def _take_run(self, pending: deque[_Item]) -> list[_Item]:
        first = pending.popleft()
        run = [first]
        if first.kind is _Kind.FLUSH:
            return run
        rows, nbytes = first.rows, first.nbytes
        while pending and pending[0].kind is first.kind:
            nxt = pending[0]
            if rows + nxt.rows > self.max_put_rows or nbytes + nxt.nbytes > self.max_put_bytes:
                break
            run.append(pending.popleft())
            rows += nxt.rows
            nbytes += nxt.nbytes
        return run

    def _fail_item(self, item: _Item, error: BaseException) -> None:
        if item.kind is not _Kind.FLUSH:
            self._release(item.rows, item.nbytes)
        item.ack._part_failed(error)

    def _settle(self, run: list[_Item], put_id: int) -> None:
        """The run's rows are written: free their room once, resolve their acks."""
        now = time.monotonic()
        rows = nbytes = 0
        for item in run:
            if item.kind is _Kind.FLUSH:
                item.ack._part_done()
                continue
            rows += item.rows
            nbytes += item.nbytes
            self._latencies.append(now - item.queued_at)
            put = (self.shard_id, put_id)  # unique across writers, for Ack.combine
            if item.kind is _Kind.PUT:
                item.ack._part_done(rows=item.rows, batches=1, put_id=put)
            else:
                item.ack._part_done(deletes=item.rows, put_id=put)
        if rows or nbytes:
            self._release(rows, nbytes)

    def _fail_writer(self, exc: BaseException) -> WriterFailedError:
        if self._failure is None:
            self._state = WriterState.FAILED if self._state is WriterState.OPEN else self._state
            failure = WriterFailedError(
                f"{self!r} failed and cannot write any more: {exc}. Close it and open a new "
                "writer on the same shard; acknowledged rows are replayed from the WAL"
            )
            failure.__cause__ = exc
            self._failure = failure
            self._wake_senders()
        return self._failure

    async def _engine_call(self, kind: _Kind, batches: list[pa.RecordBatch]) -> None:
        engine = self._engine
        fit = self._fit if kind is _Kind.PUT else self._key_fit

        def work() -> tuple[dict[str, Any], dict[str, Any]]:
            if kind is _Kind.PUT:
                engine.put(fit.relabel(batches))
            else:
                engine.delete(fit.relabel(batches).combine_chunks())
            return engine.stats(), engine.memtable_stats()

        assert self._gate is not None
        async with self._gate:
            self._engine_stats, self._memtable_stats = await run_sync(work)

    async def _execute(self, run: list[_Item]) -> None:
        kind = run[0].kind
        if kind is _Kind.FLUSH:
            self._settle(run, 0)
            return
        if self._failure is not None:
            for item in run:
                self._fail_item(item, self._failure)
            return
        outcome = await self._try_engine(kind, run)
        if outcome is None:
            return
        # The engine rejected the input. Retry one by one so only bad items fail.
        if len(run) == 1:
            self._fail_item(run[0], outcome)
            return
        for item in run:
            single = await self._try_engine(kind, [item])
            if single is not None:
                self._fail_item(item, single)

    async def _try_engine(self, kind: _Kind, run: list[_Item]) -> BaseException | None:
        """One engine call; resolve acks on success. Returns an input error to
        retry item by item, or None when the run is settled."""
        batches = [i.batch for i in run if i.batch is not None]
        try:
            await self._engine_call(kind, batches)
        except anyio.get_cancelled_exc_class():
            # run_sync let the engine call finish; its outcome is unknown to us
            # only if the thread raised. Treat the rows as not written.
            for item in run:
                self._fail_item(item, ClosedError("the writer task was cancelled"))
            raise
        except BaseException as exc:
            mapped = map_engine_error(exc)
            if isinstance(mapped, InvalidInputError):
                self._failed_puts += 1
                mapped.__cause__ = exc
                return mapped
            failure = self._fail_writer(exc)
            for item in run:
                self._fail_item(item, failure)
            return None
        self._put_seq += 1
        if kind is _Kind.PUT:
            self._engine_puts += 1
            self._rows += sum(i.rows for i in run)
        else:
            self._engine_deletes += 1
        self._settle(run, self._put_seq)
        return None

    # -- statistics ---------------------------------------------------------
    def stats(self) -> WriterStats:
        """Queue depth, engine puts, rows per put, ack latency (does not block).

        The engine's own ``stats()`` / ``memtable_stats()`` are those read
        after the last put; :meth:`engine_stats` reads them fresh.
        """
        p50, p99 = percentiles(list(self._latencies), 0.50, 0.99)
        return WriterStats(
            state=self._state,
            queue_rows=self._queue_rows,
            queue_bytes=self._queue_bytes,
            max_queue_rows_seen=self._max_rows_seen,
            max_queue_bytes_seen=self._max_bytes_seen,
            engine_puts=self._engine_puts,
            engine_deletes=self._engine_deletes,
            rows=self._rows,
            rows_per_put=self._rows / self._engine_puts if self._engine_puts else 0.0,
            ack_latency_p50=p50,
            ack_latency_p99=p99,
            failed_puts=self._failed_puts,
            engine=dict(self._engine_stats),
            memtable=dict(self._memtable_stats),
        )

    async def engine_stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The engine's ``stats()`` and ``memtable_stats()``, read on a worker thread."""
        if self._engine is None:
            raise ClosedError(f"{self!r} is not open")
        engine = self._engine
        return await run_sync(lambda: (engine.stats(), engine.memtable_stats()))

    # -- read-your-writes ----------------------------------------------------
    async def _wait_unsealed(self, engine: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            mt = await run_sync(engine.memtable_stats)
            if not mt.get("frozen_count"):
                return
            if time.monotonic() > deadline:
                raise LanceAsyncError(f"{self!r}: a sealed memtable was not flushed in {timeout} s")
            await anyio.sleep(0.005)

    async def wait_flushed(self, timeout: float = 30.0) -> None:
        """Wait until no sealed (frozen) memtable is waiting to be written.

        After it returns, every memtable sealed so far is a flushed
        generation (an SSTable) that :meth:`AsyncDataset.shard_snapshots`
        lists. It does not seal the active memtable; closing the writer does.

        Raises
        ------
        LanceAsyncError
            Still sealed after ``timeout`` seconds.
        ClosedError
            The writer is not open.
        """
        if self._engine is None or self._state is WriterState.CLOSED:
            raise ClosedError(f"{self!r} is not open")
        await self._wait_unsealed(self._engine, timeout)

    async def _scanner(self, snapshots: ShardSnapshots | None) -> Any:
        """An engine LSM scanner that sees every acked row (see module notes)."""
        if self._state not in (WriterState.OPEN, WriterState.FAILED):
            raise ClosedError(f"{self!r} is not open")
        if self._loop is not None:
            self._loop.check(repr(self))

        engine = self._engine
        if snapshots is None:
            # The other shards' flushed generations, compacted ones included:
            # the writer's base table is the version it opened on.
            snapshots = await shard_snapshots(self._dataset, include_compacted=True)
        raw = _lance_snaps(s for s in snapshots if s.shard_id != self.shard_id)
        assert self._gate is not None
        deadline = time.monotonic() + 30.0
        while True:
            # wait for sealed memtables without holding up the puts ...
            await self._wait_unsealed(engine, max(0.0, deadline - time.monotonic()))
            # ... then plan while no put can seal another one
            async with self._gate:
                mt = await run_sync(engine.memtable_stats)
                if not mt.get("frozen_count"):
                    return await run_sync(lambda: engine.lsm_scanner(raw))

    def lsm_scan(
        self,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
    ) -> AsyncBatchStream:
        """Scan base table, flushed SSTables and this writer's memtable.

        Newest row per primary key wins; every row acked so far is visible.
        With ``snapshots=None`` the other shards' flushed generations are
        discovered and included (their live memtables are not: pylance 14
        reads a memtable only through its own writer). The base table is the
        version the writer was opened on.

        Returns
        -------
        AsyncBatchStream
        """

        return scanner_stream(
            lambda: self._scanner(snapshots), self._table_schema, columns, filter, limit
        )

    async def lsm_point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row for ``key`` across all levels, this writer's memtable
        included (a table of 0 or 1 row). Composite keys as a dict or tuple."""

        expr = key_filter(self._table_schema, self._keys, key)
        scanner = await self._scanner(snapshots)

        def work() -> pa.Table:
            sc = scanner.filter(expr).limit(1)
            if columns is not None:
                sc = sc.project(list(columns))
            return sc.to_table()

        return await run_sync(work)

    async def lsm_vector_search(
        self,
        query: Any,
        *,
        column: str,
        k: int = 10,
        nprobes: int = 20,
        filter: str | None = None,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        metric: str = "l2",
    ) -> pa.Table:
        """Exact k-nearest search over every level, this writer's memtable included.

        The parameters of :meth:`AsyncDataset.lsm_vector_search`. pylance 14
        gives no vector planner over a live memtable, so this scans the LSM
        view on a worker thread (only ``columns`` and ``column`` when
        ``columns`` is given) and ranks exactly; ``nprobes`` is accepted for
        the same call shape and has no effect. For large tables prefer
        :meth:`AsyncDataset.lsm_vector_search` (indexed, flushed levels only).

        Returns
        -------
        pa.Table
            At most ``k`` rows, newest version per key, with ``_distance``
            (``columns`` and ``_distance`` when ``columns`` is given).

        Raises
        ------
        InvalidInputError
            ``k`` < 1 or a bad metric or query.
        SchemaMismatchError
            ``column`` is not in the table.
        ClosedError
            The writer is not open.
        """

        if k < 1:
            raise InvalidInputError("k must be >= 1")
        scanner = await self._scanner(snapshots)
        return await run_sync(
            partial(
                exact_knn_scan, scanner, column, query, k, metric, filter=filter, columns=columns
            )
        )
