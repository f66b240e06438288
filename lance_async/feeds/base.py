"""The feed protocol and :func:`ingest`: feed messages into a MemWAL writer.

A *feed* is a Kafka-like source of messages, each with an offset and a way
to acknowledge it (JetStream ``ack``, Redis ``XACK``, a Kafka offset commit,
a file position). :func:`ingest` pulls messages in micro-batches, decodes
them into record batches of the table's schema, sends them through an
:class:`~lance_async.AsyncShardWriter` (or :class:`~lance_async.ShardRouter`)
and acknowledges each message only after every row decoded from it is
durable -- the writer's :class:`~lance_async.Ack` resolved.

Delivery is at least once. A message whose rows were written but whose ack
was lost (a crash in between) comes again; with a primary key the LSM's
newest-wins makes the end state the same. Acknowledgements are made in feed
order, and never for rows whose write outcome is unknown (cancelled) or
failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import anyio
import pyarrow as pa

from .._args import check_fetch, check_int, check_seconds
from .._loop import unwrap_groups
from .._schema import primary_key
from .._threads import run_sync, stream_limiter
from ..errors import DecodeError, LanceAsyncError
from ..memwal.acks import Ack
from ..sources.jsonrows import few_chunks
from .messages import DeadLetter, Feed, Message, decode_json
from .ops import OpWriter, decode_ops

__all__ = [
    "DeadLetter",
    "Feed",
    "IngestStats",
    "IterableFeed",
    "Message",
    "decode_json",
    "ingest",
]

log = logging.getLogger("lance_async.feeds")


@dataclass
class IngestStats:
    """What :func:`ingest` did.

    Attributes
    ----------
    messages : int
        Messages acknowledged.
    rows : int
        Rows written (durable) and acknowledged.
    dead_letters : int
        Messages handed to the dead-letter hook (and then acknowledged).
    sends : int
        Writer sends (one per micro-batch).
    seconds : float
        Wall time.
    """

    messages: int = 0
    rows: int = 0
    dead_letters: int = 0
    sends: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        """Throughput over the run."""
        return self.rows / self.seconds if self.seconds else 0.0


class _Writer(Protocol):
    async def send(self, data: Any, *, timeout: float | None = ...) -> Ack | None: ...


async def _dead_letter(hook: DeadLetter | None, message: Message, error: BaseException) -> None:
    if hook is None:
        if isinstance(error, LanceAsyncError) and not isinstance(error, DecodeError):
            raise error
        # the decoder does not know which message it read: name the offset here
        raise DecodeError(
            f"message at offset {message.offset!r}: {error}", offset=message.offset
        ) from error
    result = hook(message, error)
    if result is not None:
        await result


_DECODE_ERRORS = (DecodeError, pa.ArrowException, ValueError, UnicodeDecodeError)


def _decode_each(
    messages: list[Message],
    schema: pa.Schema,
    decode: Callable[[Sequence[Message], pa.Schema], pa.Table],
) -> list[pa.Table | BaseException]:
    """Decode messages one by one (blocking): a table or the decode error of each."""
    out: list[pa.Table | BaseException] = []
    for m in messages:
        try:
            out.append(decode([m], schema))
        except _DECODE_ERRORS as exc:
            out.append(exc)
    return out


def _decode_whole(
    messages: list[Message],
    schema: pa.Schema,
    decode: Callable[[Sequence[Message], pa.Schema], pa.Table],
) -> pa.Table:
    """Decode a micro-batch (blocking): a small one made one chunk here, on the
    worker thread, so the writer queues it as one entry; a large one keeps
    its chunks (combining would copy it whole; see
    :func:`~lance_async.sources.jsonrows.few_chunks`)."""
    return few_chunks(decode(messages, schema))


async def _decode_group(
    messages: list[Message],
    schema: pa.Schema,
    decode: Callable[[Sequence[Message], pa.Schema], pa.Table],
    dead_letter: DeadLetter | None,
    stats: IngestStats,
) -> tuple[pa.Table | None, list[Message], BaseException | None]:
    """Decode a micro-batch on a worker thread; on failure, isolate the bad
    messages one by one (so one bad message never fails its neighbours).

    The isolation decodes every message of the micro-batch in one worker
    thread call; the dead-letter hook is then called on the loop for each
    bad message, in feed order. Returns the rows and the messages they
    settle, and the error that stops the ingest (no hook, or the hook
    raised): the messages before the one that stopped it are returned with
    their rows, so they are written and acknowledged either way.
    """
    try:
        table = await run_sync(
            partial(_decode_whole, messages, schema, decode), limiter=stream_limiter()
        )
        return table, messages, None
    except _DECODE_ERRORS:
        pass
    results = await run_sync(
        partial(_decode_each, messages, schema, decode), limiter=stream_limiter()
    )
    tables: list[pa.Table] = []
    for i, (m, result) in enumerate(zip(messages, results, strict=True)):
        if isinstance(result, BaseException):
            try:
                await _dead_letter(dead_letter, m, result)
            except Exception as stop:  # no hook, or the hook gave up: the ones before it go
                return (pa.concat_tables(tables) if tables else None), messages[:i], stop
            stats.dead_letters += 1
            # a dead-lettered message is handled: ack it once the ones before it are
            tables.append(schema.empty_table())
        else:
            tables.append(result)
    return (pa.concat_tables(tables) if tables else None), list(messages), None


def release_payloads(messages: Sequence[Message]) -> None:
    """Let go of the payloads of decoded messages (``payload`` becomes ``b""``).

    A message waits for its rows to be durable before it is acknowledged;
    only its offset and ack are needed then. Holding its payload too kept a
    second copy of every row in flight (the bytes beside the decoded rows),
    several for a large message. Record batches handed out by a file feed
    are the rows themselves and are kept.
    """
    for m in messages:
        if not isinstance(m.payload, pa.RecordBatch):
            m.payload = b""


async def ingest(
    feed: Feed,
    writer: _Writer,
    *,
    decode: Callable[[Sequence[Message], pa.Schema], pa.Table] | None = None,
    schema: pa.Schema | None = None,
    dead_letter: DeadLetter | None = None,
    max_batch: int = 1000,
    fetch_timeout: float = 0.5,
    max_pending_acks: int = 16,
    idle_timeout: float | None = None,
    on_progress: Callable[[IngestStats], None] | None = None,
    stop: anyio.Event | None = None,
) -> IngestStats:
    """Stream a feed into a MemWAL writer; ack each message once its rows are durable.

    Parameters
    ----------
    feed : Feed
        The message source (see :mod:`lance_async.feeds`).
    writer : AsyncShardWriter or ShardRouter
        Anything with ``await writer.send(rows) -> Ack``. A routing writer
        first recovers every shard whose WAL tail holds rows a dead writer
        left (:meth:`~lance_async.ShardRouter.recover`); a shard writer did
        so for its shard when it opened.
    decode : callable, optional
        ``(messages, schema) -> pa.Table``; default :func:`decode_json`
        (JSON / NDJSON payloads, values coerced to the schema) with the
        ``lance-op: delete`` header's rule (:mod:`lance_async.feeds.ops`:
        such a message deletes its rows by key, in feed order; on a table
        without a primary key it is a bad message). Called on a
        worker thread (``stream`` limiter), once per micro-batch; its table
        is made one chunk there, so the writer queues a micro-batch as one
        entry (one send, one ack).
    schema : pa.Schema, optional
        Target schema; default ``writer.schema``.
    dead_letter : callable, optional
        ``(message, error)`` (sync or async) for a message that cannot be
        decoded; it is then acknowledged. Default: raise :class:`DecodeError`
        (nothing after it is acknowledged); a hook that raises stops the
        ingest the same way (:class:`DeadLetterFile` past its ``max_bad``).
        Either way the messages of the micro-batch before the bad one are
        written and acknowledged first. Never dropped silently.
    max_batch : int
        Messages decoded and sent together (default 1,000).
    fetch_timeout : float
        Seconds one fetch waits for messages (default 0.5).
    max_pending_acks : int
        Micro-batches sent but not yet acknowledged before fetching pauses
        (default 16); with the writer's queue limits this bounds memory.
    idle_timeout : float, optional
        Return after this many seconds without a message: once a fetch begun
        after that long finds nothing (default: run until the feed is
        exhausted, or forever for an endless feed, until cancelled).
    on_progress : callable, optional
        Called with the running :class:`IngestStats` after each acknowledged
        micro-batch.
    stop : anyio.Event, optional
        Set it to stop gracefully: no more fetches (a fetch in progress ends
        within ``fetch_timeout``), the micro-batches sent are acknowledged as
        their rows become durable, then ``ingest`` returns. A worker handing
        a partition over uses it.

    Returns
    -------
    IngestStats

    Raises
    ------
    ValueError, TypeError
        ``max_batch`` or ``max_pending_acks`` below 1, a negative timeout, no
        schema to decode with (at the call).
    DecodeError
        A bad message and no dead-letter hook.
    WriterFailedError, InvalidInputError
        The rows of a micro-batch could not be written; it and everything
        after it stay unacknowledged (they will be delivered again).

    Notes
    -----
    Cancellation: fetching stops at once; micro-batches whose rows are not
    yet durable are not acknowledged (they will come again); nothing is
    acknowledged after the cancellation.

    Memory: a message's payload is let go once decoded (its ``payload``
    becomes ``b""``, :func:`release_payloads`), so while its rows wait to be
    durable only the decoded rows are held; a large JSON payload is parsed
    in blocks (:data:`~lance_async.sources.jsonrows.BLOCK_BYTES`), so its
    decoding holds little beyond the payload and its rows.
    """
    check_int("max_batch", max_batch, minimum=1)
    check_seconds("fetch_timeout", fetch_timeout)
    check_int("max_pending_acks", max_pending_acks, minimum=1)
    if idle_timeout is not None:
        check_seconds("idle_timeout", idle_timeout)
    target = schema if schema is not None else getattr(writer, "schema", None)
    if target is None:
        raise ValueError("ingest needs schema= when the writer has no .schema")
    batch_ack = getattr(feed, "ack_batch", None)
    recover = getattr(writer, "recover", None)
    decoder = decode
    if decoder is None:  # JSON, and the lance-op rule every ingest follows (ops.py)
        keys = primary_key(target) if hasattr(writer, "delete") else []
        decoder = partial(decode_ops, keys=keys)
        if keys:
            writer = OpWriter(writer, keys)
    if recover is not None:  # a routing writer owns the table: flush what a dead one left
        await recover()
    stats = IngestStats()
    started = time.monotonic()
    # Sent micro-batches wait here, in feed order, for their rows to be durable.
    to_ack, acks_in = anyio.create_memory_object_stream[tuple[list[Message], Ack | None, int]](
        max_pending_acks
    )

    async def acker() -> None:
        async with acks_in:
            async for messages, ack, rows in acks_in:
                if ack is not None:
                    await ack  # a write error propagates: nothing more is acked
                if batch_ack is not None:
                    await batch_ack(messages)
                    for m in messages:
                        m.acked = True
                else:
                    for m in messages:
                        await m.ack()
                stats.messages += len(messages)
                stats.rows += rows
                stats.seconds = time.monotonic() - started
                if on_progress is not None:
                    on_progress(stats)

    idle_since = time.monotonic()
    stopped: BaseException | None = None
    with unwrap_groups():
        async with anyio.create_task_group() as tg:
            tg.start_soon(acker)
            async with to_ack:
                while not feed.exhausted and not (stop is not None and stop.is_set()):
                    fetched_at = time.monotonic()
                    batch = await feed.fetch(max_batch, fetch_timeout)
                    if not batch:
                        # idle: a fetch begun once the timeout had passed found nothing
                        # (one begun earlier may have slept through a SIGSTOP while
                        # messages arrived)
                        if idle_timeout is not None and fetched_at - idle_since > idle_timeout:
                            break
                        continue
                    idle_since = time.monotonic()
                    table, messages, stopped = await _decode_group(
                        batch, target, decoder, dead_letter, stats
                    )
                    if not messages and stopped is None:
                        continue
                    ack: Ack | None = None
                    rows = 0
                    release_payloads(messages)
                    if table is not None and table.num_rows:
                        rows = table.num_rows
                        ack = await writer.send(table)
                        stats.sends += 1
                    table = None  # the writer holds the rows now; not this loop too
                    if messages:
                        await to_ack.send((messages, ack, rows))
                    if stopped is not None:
                        break  # the acker settles what was sent, then the error is raised
    stats.seconds = time.monotonic() - started
    if stopped is not None:
        raise stopped
    return stats


class IterableFeed:
    """A feed over an (async) iterable of payloads, for tests and replays.

    Each item becomes a :class:`Message` whose offset is its position;
    ``on_ack(offset)`` (optional) is called for each offset acknowledged, in
    order, so a caller can record the committed position.

    Parameters
    ----------
    items : iterable or async iterable of bytes or pa.RecordBatch
    on_ack : callable, optional
        ``(offset) -> None`` called after each acknowledgement.
    """

    def __init__(self, items: Any, on_ack: Callable[[int], None] | None = None) -> None:
        self._aiter: AsyncIterator[Any] | None = None
        self._iter = None
        if hasattr(items, "__aiter__"):
            self._aiter = items.__aiter__()
        else:
            self._iter = iter(items)
        self._offset = 0
        self._done = False
        self._on_ack = on_ack
        self.committed = -1
        """The highest offset acknowledged so far (-1 before any)."""

    @property
    def exhausted(self) -> bool:
        """True once the iterable has ended."""
        return self._done

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        """Acknowledge messages (in feed order): commits the highest offset."""
        for m in messages:
            if m.offset > self.committed:
                self.committed = m.offset
                if self._on_ack is not None:
                    self._on_ack(m.offset)
        await anyio.lowlevel.checkpoint()

    def _message(self, payload: Any) -> Message:
        offset = self._offset
        self._offset += 1
        return Message(offset, payload, _owner=self)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` next items.

        A sync iterable is read without waiting; an async iterable is awaited
        item by item without a timeout (``timeout`` is ignored there), since
        cancelling an async generator mid-step would end it.

        Raises
        ------
        ValueError, TypeError
            ``max_messages`` below 1 or a negative ``timeout`` (at the call).
        """
        check_fetch(max_messages, timeout)
        out: list[Message] = []
        if self._done:
            return out
        if self._iter is not None:
            # a sync iterable may do real work per item (making batches):
            # yield to the loop every 128 items, as the async path does
            while len(out) < max_messages and not self._done:
                for item in self._iter:
                    out.append(self._message(item))
                    if len(out) >= max_messages or len(out) % 128 == 0:
                        break
                else:
                    self._done = True
                await anyio.lowlevel.checkpoint()
            return out
        assert self._aiter is not None
        # No timeout around __anext__: cancelling an async generator mid-step
        # would finalize it and silently end the feed.
        while len(out) < max_messages:
            try:
                item = await self._aiter.__anext__()
            except StopAsyncIteration:
                self._done = True
                break
            out.append(self._message(item))
            if len(out) % 256 == 0:
                await anyio.lowlevel.checkpoint()  # a fast producer never hogs the loop
        return out

    async def aclose(self) -> None:
        """Close the async iterable, if it can be closed."""
        aclose = getattr(self._aiter, "aclose", None)
        if aclose is not None:
            await aclose()
