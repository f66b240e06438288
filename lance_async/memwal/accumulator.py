"""The write path's one queue: room, the hand-off to the task behind it, coalescing.

Every send waits in one bounded queue: a shard writer's own, or -- through
the routing writer -- the router's (a router's shard writers have none:
``handoff.py``). It is the middle one of a writer's three parts, as
aiokafka splits its producer (``AIOKafkaProducer`` / ``MessageAccumulator``
/ ``Sender``):

* the producer side (:meth:`Accumulator.submit`, :meth:`~Accumulator.submit_batch`,
  :meth:`~Accumulator.submit_nowait`)
  checks rows against the table (and, for a shard writer's sends, against
  its shard: the sender's ``shard_check``), cuts them to at most
  ``max_put_rows`` and queues them whole or not at all, waiting while the
  queue holds ``max_queue_rows`` rows or ``max_queue_bytes`` bytes (queued
  or in flight);
* the consumer side (:meth:`Accumulator.next_run`, used by a shard writer's
  committer or a router's routing task) takes what queued while the
  previous engine put (or routed run) was in flight, waits for
  more when the commit policy asks (``linger``, ``min_put_interval``: Kafka's
  ``linger.ms``), and hands out runs of entries of one kind of at most
  ``max_put_rows`` / ``max_put_bytes`` (Kafka's ``batch.size``).

The queue is a plain deque with one wake-up event for the writer task, and
counts its rows as they come and go (no re-summing). A send of one batch --
the common case of a feed of small messages -- is one object besides the
batch: its :class:`~lance_async.Ack` is also its queue entry
(:class:`BatchAck`). Each send gets one ack whatever the number of pieces
its rows are cut into, and several batches sent together (a table of many
chunks, ``send_many``) that fit one put are one entry. Room is given back
once the engine put that carried the rows returned (:meth:`Accumulator.release`:
by the committer, or through a routed shard's ``Handoff``).
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import anyio
import pyarrow as pa

from .._loop import LoopHandle, aclose_shielded
from .._schema import TableFit
from .._threads import run_sync, stream_limiter
from ..errors import BackpressureTimeoutError, ClosedError, InvalidInputError, SchemaMismatchError
from ..sources import SourceMode, resolve_source
from .acks import Ack
from .policy import WriterConfig

__all__ = ["Accumulator", "BatchAck", "Entry", "Item", "Kind", "ShardCheck", "take_run"]


class Kind(enum.Enum):
    """What an entry asks of the engine."""

    PUT = 1
    DELETE = 2
    FLUSH = 3


class Item:
    """One piece of one send (or all of its batches, when they fit one put), queued.

    Attributes
    ----------
    kind : Kind
    batch : pa.RecordBatch, list of pa.RecordBatch, or None
        The rows (a list for a group; None for a flush marker or once written).
    ack : Ack
        The send's acknowledgement (one part of it).
    rows, nbytes : int
        Rows and bytes the entry holds room for.
    queued_at : float
        ``time.monotonic()`` when it was queued (for the linger and latency).
    """

    __slots__ = ("ack", "batch", "kind", "nbytes", "queued_at", "rows")

    def __init__(
        self,
        kind: Kind,
        batch: pa.RecordBatch | list[pa.RecordBatch] | None,
        ack: Ack,
        rows: int,
        nbytes: int,
        queued_at: float,
    ) -> None:
        self.kind = kind
        self.batch = batch
        self.ack = ack
        self.rows = rows
        self.nbytes = nbytes
        self.queued_at = queued_at

    def split(self) -> list[Item]:
        """The entries to retry one by one after the engine rejected this one
        among others: itself (a routed part gives one per send it carries)."""
        return [self]


class BatchAck(Ack):
    """The ack of a one-batch send that is also its queue entry.

    A feed of small messages makes one send per message: sharing one object
    between the ack and the entry halves what each message leaves for the
    garbage collector. It has :class:`Item`'s attributes (``ack`` is itself,
    ``queued_at`` its creation) and resolves in one step once its put
    returned (:meth:`written`).
    """

    __slots__ = ("batch", "nbytes", "rows")

    kind: ClassVar[Kind] = Kind.PUT

    def __init__(
        self, loop: LoopHandle | None, batch: pa.RecordBatch, rows: int, nbytes: int
    ) -> None:
        super().__init__(loop)
        self._parts = 1
        self._sealed = True
        self.batch: pa.RecordBatch | None = batch
        self.rows = rows
        self.nbytes = nbytes

    @property
    def ack(self) -> Ack:
        """Itself (the entry's ack)."""
        return self

    @property
    def queued_at(self) -> float:
        """When the send was made (its ack's creation)."""
        return self.created

    def written(self, put_id: Any, now: float) -> None:
        """Its put returned: resolve (the writer task's fast path)."""
        self._parts = 0
        self._rows = self.rows
        self._batches = 1
        self._puts = put_id
        self.batch = None  # free the rows now
        self._done = True
        self.resolved_at = now
        self._notify()


Entry = Item | BatchAck
"""A queue entry."""

Conform = Callable[[pa.RecordBatch, int], pa.RecordBatch]
ShardCheck = Callable[[pa.RecordBatch], None]

INLINE_CHECK_ROWS = 1_024
"""Sends of up to this many rows are checked for their shard on the loop (a
few microseconds); larger ones on a worker thread."""


def take_run(pending: deque[Entry], max_rows: int, max_bytes: int) -> tuple[list[Entry], int]:
    """Take the next run off a non-empty queue: its first entry and the entries
    of the same kind behind it while the run stays within ``max_rows`` and
    ``max_bytes`` (a flush marker alone). Returns the run and its rows."""
    first = pending.popleft()
    run = [first]
    if first.kind is Kind.FLUSH:
        return run, 0
    rows, nbytes = first.rows, first.nbytes
    while pending and pending[0].kind is first.kind:
        nxt = pending[0]
        if rows + nxt.rows > max_rows or nbytes + nxt.nbytes > max_bytes:
            break
        run.append(pending.popleft())
        rows += nxt.rows
        nbytes += nxt.nbytes
    return run, rows


class Accumulator:
    """Queue room, validation and coalescing: one shard writer's, or a router's.

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
        Seconds the consumer waits, from the first queued entry, for more
        rows before a run smaller than ``max_put_rows`` (0: none).
    min_put_interval : float
        Seconds between the starts of two runs of puts (0: none); the first
        run after an idle spell starts at once. See ``policy.py``.
    pace : callable, optional
        ``pace(seconds)``: the interval after a put that took ``seconds``
        (the policy's adaptive pacing); None keeps ``min_put_interval``.
    check : callable
        Raises when the writer can take no more rows (closed, failed).
    describe : callable
        The writer's repr, for messages.
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
        min_put_interval: float = 0.0,
        pace: Callable[[float], float] | None = None,
        check: Callable[[], None],
        describe: Callable[[], str],
    ) -> None:
        self.fit = fit
        self.key_fit = key_fit
        self.keys = keys
        self.max_queue_rows = max_queue_rows
        self.max_queue_bytes = max_queue_bytes
        self.max_put_rows = max_put_rows
        self.max_put_bytes = max_put_bytes
        self.linger = linger
        self.put_interval = min_put_interval
        """The pacing now (seconds): ``pace(last put's duration)``, see ``policy.py``."""
        self._pace = pace
        self._check = check
        self._describe = describe
        self._pending: deque[Entry] = deque()
        self.pending_rows = 0
        """PUT rows queued and not yet handed to the writer task."""
        self._wake: anyio.Event | None = None  # set while the writer task waits
        self._lingering = False  # it waits for a full put, not for any entry
        self._closed = False  # no more sends: drain, then end
        self._ended = False  # the writer task is gone
        self._last_run = -math.inf
        self.last_put_seconds = 0.0
        """How long the last engine put took (seconds; 0 before any)."""
        self._space: anyio.Event | None = None
        self.queue_rows = 0
        self.queue_bytes = 0
        self.max_rows_seen = 0
        self.max_bytes_seen = 0
        self.entries = 0
        """Entries queued so far (a one-batch send, a group, a piece of a large send)."""

    @classmethod
    def for_writer(
        cls,
        config: WriterConfig,
        limits: tuple[int, int],
        fit: TableFit,
        key_fit: TableFit,
        *,
        check: Callable[[], None],
        describe: Callable[[], str],
    ) -> Accumulator:
        """The accumulator of a writer with ``config`` and ``limits`` =
        ``(max_put_rows, max_queue_rows)`` (see :meth:`WriterConfig.limits`)."""
        put_rows, queue_rows = limits
        return cls(
            fit=fit,
            key_fit=key_fit,
            keys=list(key_fit.schema.names),
            max_queue_rows=queue_rows,
            max_queue_bytes=config.max_queue_bytes,
            max_put_rows=put_rows,
            max_put_bytes=config.max_put_bytes,
            linger=config.linger,
            min_put_interval=config.policy.min_put_interval,
            pace=config.policy.pace,
            check=check,
            describe=describe,
        )

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

    def _check_open(self) -> None:
        self._check()
        if self._ended:
            raise ClosedError(f"{self._describe()}: its writer task has ended; open a new writer")

    def _take_room(self, rows: int, nbytes: int) -> None:
        self._check_open()
        q = self.queue_rows = self.queue_rows + rows
        b = self.queue_bytes = self.queue_bytes + nbytes
        if q > self.max_rows_seen:
            self.max_rows_seen = q
        if b > self.max_bytes_seen:
            self.max_bytes_seen = b

    async def _reserve(self, rows: int, nbytes: int, deadline: float | None) -> None:
        while not self.has_room(rows, nbytes):
            self._check_open()
            if self._space is None:
                self._space = anyio.Event()
            if deadline is None:
                await self._space.wait()
            else:
                with anyio.move_on_at(deadline) as scope:
                    await self._space.wait()
                if scope.cancelled_caught:
                    raise BackpressureTimeoutError(
                        f"{self._describe()}: no room for {rows} more rows ({nbytes} bytes) "
                        f"before the timeout: the queue held {self.queue_rows} of "
                        f"{self.max_queue_rows} rows, {self.queue_bytes} of "
                        f"{self.max_queue_bytes} bytes. These rows were not queued (of a "
                        "stream, the batches before them were)"
                    )
        self._take_room(rows, nbytes)

    def put_took(self, seconds: float) -> None:
        """An engine put took ``seconds``: set the pacing of the next ones."""
        self.last_put_seconds = seconds
        if self._pace is not None:
            self.put_interval = self._pace(seconds)

    def release(self, rows: int, nbytes: int) -> None:
        """Give back the room of rows written or failed."""
        self.queue_rows -= rows
        self.queue_bytes -= nbytes
        self.wake_senders()

    # -- the hand-off -------------------------------------------------------------
    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def _push(self, entry: Entry) -> None:
        """Queue an entry whose room is taken; wake the writer task if it waits
        for it (a lingering task only once a whole put's rows are queued)."""
        self._pending.append(entry)
        self.entries += 1
        if entry.kind is Kind.PUT:
            self.pending_rows += entry.rows
            if self._lingering and self.pending_rows < self.max_put_rows:
                return
        self._poke()

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
        """Checked batches of a RecordBatch, a Table or a list of RecordBatches
        (None for any other data)."""
        if isinstance(data, pa.RecordBatch):
            return [conform(data, 0)]
        if isinstance(data, pa.Table):
            batches: list[pa.RecordBatch] = data.to_batches()
        elif isinstance(data, list) and all(isinstance(b, pa.RecordBatch) for b in data):
            batches = data
        else:
            return None
        return [conform(b, i) for i, b in enumerate(batches) if b.num_rows]

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
        """Hand pieces whose queue room is taken to the writer task.

        Several pieces that fit one put together are one entry (one
        hand-off); otherwise each piece is an entry.
        """
        now = time.monotonic()
        if len(pieces) > 1:
            rows = sum(p.num_rows for p, _ in pieces)
            nbytes = sum(n for _, n in pieces)
            if rows <= self.max_put_rows and nbytes <= self.max_put_bytes:
                ack.add_part()
                self._push(Item(kind, [p for p, _ in pieces], ack, rows, nbytes, now))
                return
        for piece, nbytes in pieces:
            ack.add_part()
            self._push(Item(kind, piece, ack, piece.num_rows, nbytes, now))

    async def _enqueue(
        self, kind: Kind, batches: Sequence[pa.RecordBatch], ack: Ack, deadline: float | None
    ) -> None:
        """Queue checked batches whole, or nothing of them (never a part)."""
        pieces = self.pieces(batches)
        if not pieces:
            return
        await self._reserve(sum(p.num_rows for p, _ in pieces), sum(n for _, n in pieces), deadline)
        self._queue(kind, pieces, ack)

    @staticmethod
    def check_shard_nowait(batches: Sequence[pa.RecordBatch], check: ShardCheck | None) -> None:
        """Refuse rows of another shard, on the loop (small sends)."""
        if check is not None:
            for batch in batches:
                check(batch)

    @staticmethod
    async def check_shard(batches: Sequence[pa.RecordBatch], check: ShardCheck | None) -> None:
        """Refuse rows of another shard (on a worker thread for large sends)."""
        if check is None:
            return
        if sum(b.num_rows for b in batches) <= INLINE_CHECK_ROWS:
            Accumulator.check_shard_nowait(batches, check)
        else:
            await run_sync(
                lambda: Accumulator.check_shard_nowait(batches, check), limiter=stream_limiter()
            )

    async def submit_batch(
        self,
        batch: pa.RecordBatch,
        loop: LoopHandle | None,
        deadline: float | None,
        shard_check: ShardCheck | None = None,
    ) -> Ack | None:
        """The fast path: queue one checked-fitting batch as one entry.

        Returns its :class:`BatchAck`, or None (nothing done, nothing
        raised) when the batch is empty or larger than one put: then use
        :meth:`submit`. The ack's clock starts before any wait for room.
        ``shard_check`` refuses rows of another shard (a shard writer's
        sends; None: a router's, which routes them).

        Raises
        ------
        SchemaMismatchError, WrongShardError, BackpressureTimeoutError, ClosedError
            Nothing was queued.
        """
        batch = self.fit.check(batch, 0)
        rows = batch.num_rows
        if rows == 0 or rows > self.max_put_rows:
            return None
        nbytes = batch.get_total_buffer_size()
        if nbytes > self.max_put_bytes:
            return None
        if shard_check is not None:
            if rows <= INLINE_CHECK_ROWS:
                shard_check(batch)
            else:
                await self.check_shard([batch], shard_check)
        ack = BatchAck(loop, batch, rows, nbytes)
        if self.has_room(rows, nbytes):
            self._take_room(rows, nbytes)
        else:
            await self._reserve(rows, nbytes, deadline)
        self._push(ack)
        return ack

    async def submit(
        self,
        kind: Kind,
        data: Any,
        ack: Ack,
        deadline: float | None,
        schema: pa.Schema | None,
        shard_check: ShardCheck | None = None,
    ) -> None:
        """Check and queue one send's rows; seal ``ack`` once all are queued.

        In-memory rows are checked whole (schema, then ``shard_check``, as
        :meth:`submit_batch`) before anything is queued; a stream batch by
        batch (batches before a bad one stay queued, and ``ack`` reports
        the failure).
        """
        conform: Conform = self.fit.check if kind is Kind.PUT else self.conform_keys
        # fast path: one batch or table, checked before anything is queued
        batches = self.in_memory(data, conform) if schema is None else None
        if batches is None:
            source = await resolve_source(
                data, schema=schema, rows_into=self.fit.schema if kind is Kind.PUT else None
            )
            if source.mode is not SourceMode.MATERIALIZED:
                await self._submit_stream(kind, source.open(), ack, deadline, conform, shard_check)
                return
            batches = [conform(b, i) for i, b in enumerate(source.batches() or [])]
        await self.check_shard(batches, shard_check)
        await self._enqueue(kind, batches, ack, deadline)  # all rows of the send, or none
        ack.seal()

    async def _submit_stream(
        self,
        kind: Kind,
        stream: Any,
        ack: Ack,
        deadline: float | None,
        conform: Conform,
        shard_check: ShardCheck | None,
    ) -> None:
        index = 0
        try:
            async for batch in stream:
                if batch.num_rows:
                    checked = [conform(batch, index)]
                    await self.check_shard(checked, shard_check)
                    await self._enqueue(kind, checked, ack, deadline)
                index += 1
        except BaseException as exc:
            # batches already queued are written; the ack reports the failure
            ack.fail_unsealed(exc if isinstance(exc, Exception) else ClosedError("send cancelled"))
            raise
        finally:
            await aclose_shielded(stream)
        ack.seal()

    def submit_nowait(
        self,
        data: pa.RecordBatch | pa.Table,
        loop: LoopHandle | None,
        shard_check: ShardCheck | None = None,
    ) -> Ack:
        """Check and queue in-memory rows at once, or raise ``anyio.WouldBlock``.

        One batch that fits a put is one entry (a :class:`BatchAck`). Does
        not block and is no checkpoint. ``shard_check``: as :meth:`submit_batch`.

        Raises
        ------
        anyio.WouldBlock
            No room now (nothing was queued).
        SchemaMismatchError, WrongShardError
            The rows do not fit (nothing was queued).
        TypeError
            ``data`` is neither a RecordBatch nor a Table.
        """
        batches = self.in_memory(data, self.fit.check)
        if batches is None:
            raise TypeError(
                f"send_nowait takes a pyarrow RecordBatch or Table, not {type(data).__name__}; "
                "use `await writer.send(...)` for other sources"
            )
        self.check_shard_nowait(batches, shard_check)
        pieces = self.pieces(batches)
        rows = sum(p.num_rows for p, _ in pieces)
        nbytes = sum(n for _, n in pieces)
        if pieces and not self.has_room(rows, nbytes):
            raise anyio.WouldBlock
        if len(pieces) == 1 and isinstance(data, pa.RecordBatch):
            self._take_room(rows, nbytes)
            entry = BatchAck(loop, pieces[0][0], rows, nbytes)
            self._push(entry)
            return entry
        ack = Ack(loop)
        if pieces:
            self._take_room(rows, nbytes)
            self._queue(Kind.PUT, pieces, ack)
        ack.seal()
        return ack

    def submit_flush(self, ack: Ack) -> None:
        """Queue a marker that resolves ``ack`` once everything before it is written."""
        self._check_open()
        ack.add_part()
        ack.seal()
        self._push(Item(Kind.FLUSH, None, ack, 0, 0, time.monotonic()))

    def close(self) -> None:
        """No more sends: the consumer drains what is queued, then ends."""
        self._closed = True
        self._poke()

    # -- consumer side (the writer task) -----------------------------------------
    async def _wait_input(self) -> None:
        self._wake = anyio.Event()
        await self._wake.wait()

    async def next_run(self) -> list[Entry] | None:
        """The next run of entries for one engine call; None once closed and drained.

        Waits for an entry; for a run of puts, then waits out the linger and
        the pacing (``min_put_interval`` from the previous run's start)
        unless a whole put's rows are queued or the writer is closing.
        """
        pending = self._pending
        while not pending:
            if self._closed:
                return None
            await self._wait_input()
        if pending[0].kind is Kind.PUT:
            deadline = -math.inf
            if self.linger > 0:
                deadline = pending[0].queued_at + self.linger
            if self.put_interval > 0:
                deadline = max(deadline, self._last_run + self.put_interval)
            if deadline > time.monotonic() and self.pending_rows < self.max_put_rows:
                await self._linger(deadline)
            self._last_run = time.monotonic()
        return self._take_run()

    async def _linger(self, deadline: float) -> None:
        """Wait until ``deadline``, a whole put's rows, or the close."""
        self._lingering = True
        try:
            while not self._closed and self.pending_rows < self.max_put_rows:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                with anyio.move_on_after(remaining):
                    await self._wait_input()
        finally:
            self._lingering = False
            self._wake = None

    def _take_run(self) -> list[Entry]:
        run, rows = take_run(self._pending, self.max_put_rows, self.max_put_bytes)
        if run[0].kind is Kind.PUT:
            self.pending_rows -= rows
        return run

    def end(self) -> list[Entry]:
        """The writer task ended: later sends fail; returns what is left to fail."""
        self._ended = True
        left = list(self._pending)
        self._pending.clear()
        self.pending_rows = 0
        self.wake_senders()
        return left
