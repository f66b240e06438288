"""The writer's accumulator: queue room, the hand-off to the writer task, coalescing.

The middle one of a shard writer's three parts, as aiokafka splits its
producer (``AIOKafkaProducer`` / ``MessageAccumulator`` / ``Sender``):

* the producer side (:meth:`Accumulator.submit`, :meth:`~Accumulator.submit_nowait`)
  checks rows against the table, cuts them to at most ``max_put_rows`` and
  queues them whole or not at all, waiting while the queue holds
  ``max_queue_rows`` rows or ``max_queue_bytes`` bytes (queued or in flight);
* the consumer side (:meth:`Accumulator.next_run`, used by the committer)
  takes what queued while the previous engine put was in flight, lingers for
  more when asked to, and hands out runs of items of one kind of at most
  ``max_put_rows`` / ``max_put_bytes``.

Each send gets one :class:`~lance_async.Ack` whatever the number of pieces
its rows are cut into. Room is given back by the committer once a run's
engine put returned (:meth:`Accumulator.release`).
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import pyarrow as pa
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._loop import aclose_shielded
from .._schema import TableFit
from .._threads import run_sync, stream_limiter
from ..errors import BackpressureTimeoutError, ClosedError, InvalidInputError, SchemaMismatchError
from ..sources import SourceMode, resolve_source
from .acks import Ack

__all__ = ["Accumulator", "Item", "Kind"]


class Kind(enum.Enum):
    """What an item asks of the engine."""

    PUT = 1
    DELETE = 2
    FLUSH = 3


@dataclass(slots=True)
class Item:
    """One piece of one send, queued for the writer task."""

    kind: Kind
    batch: pa.RecordBatch | None
    ack: Ack
    rows: int
    nbytes: int
    queued_at: float


Conform = Callable[[pa.RecordBatch, int], pa.RecordBatch]
ShardCheck = Callable[[pa.RecordBatch], None]

INLINE_CHECK_ROWS = 1_024
"""Sends of up to this many rows are checked for their shard on the loop (a
few microseconds); larger ones on a worker thread."""


class Accumulator:
    """Queue room, validation and coalescing for one shard writer.

    Parameters
    ----------
    fit, key_fit : TableFit
        Checks for put rows (the table's columns) and delete keys.
    keys : list of str
        The table's primary-key columns.
    max_queue_rows, max_queue_bytes : int
        Rows / bytes queued or in flight before senders wait.
    max_put_rows, max_put_bytes : int
        The largest run handed to one engine call.
    linger : float
        Seconds the consumer waits for more rows before a run smaller than
        ``max_put_rows`` (0: coalesce only what queued meanwhile).
    check : callable
        Raises when the writer can take no more rows (closed, failed).
    describe : callable
        The writer's repr, for messages.
    shard_check : callable, optional
        Raises :class:`~lance_async.errors.WrongShardError` for a batch with a
        row of another shard (see ``sharding.py``); None on tables with
        manual shards.
    """

    def __init__(
        self,
        *,
        fit: TableFit,
        key_fit: TableFit,
        keys: list[str],
        max_queue_rows: int,
        max_queue_bytes: int,
        max_put_rows: int,
        max_put_bytes: int,
        linger: float,
        check: Callable[[], None],
        describe: Callable[[], str],
        shard_check: ShardCheck | None = None,
    ) -> None:
        self.fit = fit
        self.key_fit = key_fit
        self.keys = keys
        self.max_queue_rows = max_queue_rows
        self.max_queue_bytes = max_queue_bytes
        self.max_put_rows = max_put_rows
        self.max_put_bytes = max_put_bytes
        self.linger = linger
        self._check = check
        self._describe = describe
        self._shard_check = shard_check
        self._send: MemoryObjectSendStream[Item]
        self._recv: MemoryObjectReceiveStream[Item]
        self._send, self._recv = anyio.create_memory_object_stream[Item](math.inf)
        self._space: anyio.Event | None = None
        self.queue_rows = 0
        self.queue_bytes = 0
        self.max_rows_seen = 0
        self.max_bytes_seen = 0

    # -- room -----------------------------------------------------------------
    def wake_senders(self) -> None:
        """Let senders waiting for room look again (room freed, or the writer ended)."""
        if self._space is not None:
            self._space.set()
            self._space = None

    def has_room(self, rows: int, nbytes: int) -> bool:
        """Room for this many more rows and bytes? (An empty queue takes anything.)"""
        return self.queue_rows == 0 or (
            self.queue_rows + rows <= self.max_queue_rows
            and self.queue_bytes + nbytes <= self.max_queue_bytes
        )

    def _take_room(self, rows: int, nbytes: int) -> None:
        self._check()
        self.queue_rows += rows
        self.queue_bytes += nbytes
        self.max_rows_seen = max(self.max_rows_seen, self.queue_rows)
        self.max_bytes_seen = max(self.max_bytes_seen, self.queue_bytes)

    async def _reserve(self, rows: int, nbytes: int, deadline: float | None) -> None:
        while not self.has_room(rows, nbytes):
            self._check()
            if self._space is None:
                self._space = anyio.Event()
            if deadline is None:
                await self._space.wait()
            else:
                with anyio.move_on_at(deadline) as scope:
                    await self._space.wait()
                if scope.cancelled_caught:
                    raise BackpressureTimeoutError(
                        f"{self._describe()}: the queue stayed full ({self.queue_rows} rows, "
                        f"{self.queue_bytes} bytes) past the timeout; this batch was not "
                        "queued (batches of the same send before it were)"
                    )
        self._take_room(rows, nbytes)

    def release(self, rows: int, nbytes: int) -> None:
        """Give back the room of rows written or failed."""
        self.queue_rows -= rows
        self.queue_bytes -= nbytes
        self.wake_senders()

    # -- producer side ----------------------------------------------------------
    def conform_keys(self, batch: pa.RecordBatch, index: int) -> pa.RecordBatch:
        """Check the key columns of a delete batch; other columns are dropped."""
        if not self.keys:
            raise InvalidInputError("delete needs a primary key, and the table has none")
        missing = [k for k in self.keys if k not in batch.schema.names]
        if missing:
            raise SchemaMismatchError(f"delete keys lack column {missing[0]!r}", field=missing[0])
        return self.key_fit.check(batch.select(self.keys), index)

    @staticmethod
    def in_memory(data: Any, conform: Conform) -> list[pa.RecordBatch] | None:
        """Checked batches of a RecordBatch or Table (None for any other data)."""
        if isinstance(data, pa.RecordBatch):
            return [conform(data, 0)]
        if isinstance(data, pa.Table):
            return [conform(b, i) for i, b in enumerate(data.to_batches()) if b.num_rows]
        return None

    def pieces(self, batches: Sequence[pa.RecordBatch]) -> list[tuple[pa.RecordBatch, int]]:
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

    def _queue(self, kind: Kind, pieces: list[tuple[pa.RecordBatch, int]], ack: Ack) -> None:
        """Hand pieces whose queue room is taken to the writer task."""
        now = time.monotonic()
        for piece, nbytes in pieces:
            ack._add_part()
            self._send.send_nowait(Item(kind, piece, ack, piece.num_rows, nbytes, now))

    async def _enqueue(
        self, kind: Kind, batches: Sequence[pa.RecordBatch], ack: Ack, deadline: float | None
    ) -> None:
        """Queue checked batches whole, or nothing of them (never a part)."""
        pieces = self.pieces(batches)
        if not pieces:
            return
        await self._reserve(sum(p.num_rows for p, _ in pieces), sum(n for _, n in pieces), deadline)
        self._queue(kind, pieces, ack)

    def check_shard_nowait(self, batches: Sequence[pa.RecordBatch]) -> None:
        """Refuse rows of another shard, on the loop (small sends)."""
        if self._shard_check is not None:
            for batch in batches:
                self._shard_check(batch)

    async def check_shard(self, batches: Sequence[pa.RecordBatch]) -> None:
        """Refuse rows of another shard (on a worker thread for large sends)."""
        if self._shard_check is None:
            return
        if sum(b.num_rows for b in batches) <= INLINE_CHECK_ROWS:
            self.check_shard_nowait(batches)
        else:
            await run_sync(lambda: self.check_shard_nowait(batches), limiter=stream_limiter())

    async def submit(
        self,
        kind: Kind,
        data: Any,
        ack: Ack,
        deadline: float | None,
        schema: pa.Schema | None,
        *,
        routed: bool = False,
    ) -> None:
        """Check and queue one send's rows; seal ``ack`` once all are queued.

        In-memory rows are checked whole (schema, then shard) before anything
        is queued; a stream batch by batch (batches before a bad one stay
        queued, and ``ack`` reports the failure). ``routed`` rows were split
        by shard by a :class:`~lance_async.ShardRouter` already.
        """
        conform: Conform = self.fit.check if kind is Kind.PUT else self.conform_keys
        # fast path: one batch or table, checked before anything is queued
        batches = self.in_memory(data, conform) if schema is None else None
        if batches is None:
            source = await resolve_source(
                data, schema=schema, rows_into=self.fit.schema if kind is Kind.PUT else None
            )
            if source.mode is not SourceMode.MATERIALIZED:
                await self._submit_stream(kind, source.open(), ack, deadline, conform, routed)
                return
            batches = [conform(b, i) for i, b in enumerate(source.batches() or [])]
        if not routed:
            await self.check_shard(batches)
        await self._enqueue(kind, batches, ack, deadline)  # all rows of the send, or none
        ack._seal()

    async def _submit_stream(
        self,
        kind: Kind,
        stream: Any,
        ack: Ack,
        deadline: float | None,
        conform: Conform,
        routed: bool,
    ) -> None:
        index = 0
        try:
            async for batch in stream:
                if batch.num_rows:
                    checked = [conform(batch, index)]
                    if not routed:
                        await self.check_shard(checked)
                    await self._enqueue(kind, checked, ack, deadline)
                index += 1
        except BaseException as exc:
            # batches already queued are written; the ack reports the failure
            ack._fail_unsealed(exc if isinstance(exc, Exception) else ClosedError("send cancelled"))
            raise
        finally:
            await aclose_shielded(stream)
        ack._seal()

    def submit_nowait(
        self, batches: list[pa.RecordBatch], ack: Ack, *, routed: bool = False
    ) -> None:
        """Queue checked in-memory rows at once, or raise ``anyio.WouldBlock``."""
        if not routed:
            self.check_shard_nowait(batches)
        pieces = self.pieces(batches)
        if pieces:
            rows = sum(p.num_rows for p, _ in pieces)
            nbytes = sum(n for _, n in pieces)
            if not self.has_room(rows, nbytes):
                raise anyio.WouldBlock
            self._take_room(rows, nbytes)
            self._queue(Kind.PUT, pieces, ack)
        ack._seal()

    def submit_flush(self, ack: Ack) -> None:
        """Queue a marker that resolves ``ack`` once everything before it is written."""
        ack._add_part()
        ack._seal()
        self._send.send_nowait(Item(Kind.FLUSH, None, ack, 0, 0, time.monotonic()))

    def close(self) -> None:
        """No more sends: the consumer drains what is queued, then ends."""
        self._send.close()

    # -- consumer side (the writer task) -----------------------------------------
    async def next_run(self, pending: deque[Item]) -> list[Item] | None:
        """The next run of items for one engine call; None once closed and drained.

        ``pending`` holds items received and not yet handed out; the caller
        keeps it so that, on the way out, whatever is left can be failed.
        """
        if not pending:
            try:
                pending.append(await self._recv.receive())
            except anyio.EndOfStream:
                return None
        self.drain_nowait(pending)
        if self.linger > 0 and pending[0].kind is Kind.PUT:
            await self._linger(pending)
        return self._take_run(pending)

    def drain_nowait(self, pending: deque[Item]) -> None:
        """Move every item queued now into ``pending``."""
        while True:
            try:
                pending.append(self._recv.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return

    async def _linger(self, pending: deque[Item]) -> None:
        remaining = pending[0].queued_at + self.linger - time.monotonic()
        rows = sum(i.rows for i in pending if i.kind is Kind.PUT)
        if remaining <= 0:
            return
        with anyio.move_on_after(remaining):
            while rows < self.max_put_rows:
                try:
                    item = await self._recv.receive()
                except anyio.EndOfStream:
                    return
                pending.append(item)
                rows += item.rows

    def _take_run(self, pending: deque[Item]) -> list[Item]:
        first = pending.popleft()
        run = [first]
        if first.kind is Kind.FLUSH:
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

    def close_receiver(self) -> None:
        """The writer task ended: later sends fail instead of queueing."""
        self._recv.close()
