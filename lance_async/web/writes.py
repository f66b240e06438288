"""Writing HTTP request bodies into Lance: ``merge_body`` and ``ingest_body``.

A request body is a one-shot stream. :func:`merge_body` streams it into one
merge_insert with Lance's retries off while it spools the body (memory, then
a temporary file); a commit conflict replays the spool as a replayable
source through lance_async's retry loop. :func:`ingest_body` writes a body
to a MemWAL shard -- checked and spooled to its end first, then streamed
into the writer -- and returns after the durable ack.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

import anyio
import pyarrow as pa

from .._duplicates import DUPLICATE_POLICIES, KeyTracker
from .._schema import TableFit, primary_key
from .._threads import run_sync, stream_limiter
from ..errors import ConflictError, PayloadTooLargeError
from ..merge import backoff_delay
from ..sources import WriteSource, replayable
from ..sources.spool import Spool
from .bodies import BodyBatches
from .errors import EmptyBodyError
from .limits import FEED_BYTES, SLICE_ROWS

if TYPE_CHECKING:
    from ..dataset import AsyncDataset
    from ..memwal.acks import PutSummary
    from ..memwal.router import ShardRouter
    from ..memwal.writer import AsyncShardWriter
    from ..merge import AsyncMergeInsertBuilder, MergeResult

__all__ = ["ingest_body", "merge_body", "read_whole_body"]


async def merge_body(
    dataset: AsyncDataset,
    body: BodyBatches,
    on: str | Sequence[str] | None = None,
    *,
    when: Callable[[AsyncMergeInsertBuilder], AsyncMergeInsertBuilder] | None = None,
    conflict_retries: int = 10,
    retry_timeout: float = 30.0,
    replay: str = "spool",
    read_first: bool = True,
    spool_dir: str | None = None,
) -> MergeResult:
    """Upsert a request body into a table with one commit.

    Parameters
    ----------
    dataset : AsyncDataset
        The target table.
    body : BodyBatches
        Started (``await body.start()``) or not; read once, streamed into
        the engine through a bounded bridge.
    on : str or list of str, optional
        Join columns (default: the table's primary key).
    when : callable, optional
        Configures the builder; default
        ``when_matched_update_all().when_not_matched_insert_all()``.
    conflict_retries : int
        Retries after a commit conflict (default 10).
    retry_timeout : float
        Seconds that retries may take in all (default 30).
    replay : {"spool", "none"}
        How a conflict is retried. A request body is a one-shot source, so it
        cannot be re-read from the client:

        ``"spool"`` (default)
            The first pass streams the body into the engine with Lance's own
            retries off, so Lance buffers nothing; the body keeps a spool
            (``spool=True``, in memory up to 4 MiB, then on disk). On a
            conflict the spool is replayed as a REPLAYABLE source by
            lance_async's retry loop (backoff, fresh target each attempt).
            Memory stays flat whatever the body size; the disk holds one copy.
        ``"none"``
            One pass, no retry: a conflict raises :class:`ContentionError`.
    read_first : bool
        Read (decode, check and spool) the whole body before the engine
        starts (default True), so no engine thread ever waits on the client:
        a slow or stalled upload holds its connection and its spool, not
        engine capacity that lookups, scans and other merges need. The merge
        then reads the spool, and a conflict replays it (``replay="spool"``;
        ``"none"`` allows no retry). With False, the first pass streams the
        body into the engine as it arrives (lower latency for large bodies
        from fast clients; an engine thread waits while the client is slow,
        up to ``BodyLimits.body_idle_timeout`` per pause).
    spool_dir : str, optional
        Directory of the spool file when ``read_first`` spools a body that
        keeps no spool of its own (default: the system's temporary directory).

    Returns
    -------
    MergeResult
        Of the committed attempt; ``num_attempts`` counts the first pass, and
        ``source_mode`` is REPLAYABLE when the merge read the spool (always
        with ``read_first``), STREAMING when a streamed first pass committed.

    Raises
    ------
    PayloadTooLargeError, SchemaMismatchError, DecodeError, EmptyBodyError
        The body broke a limit or does not fit (nothing committed).
    ClientDisconnectedError, BodyTimeoutError
        The client left, or went silent, before the body ended (nothing
        committed).
    ContentionError, ConflictError
        Conflicts outlasted the retries, or cannot be retried.

    Notes
    -----
    The engine runs on the library's engine threads; the event loop only
    moves batch references.
    """
    if replay not in ("spool", "none"):
        raise ValueError(f"replay must be 'spool' or 'none', got {replay!r}")
    if conflict_retries < 0:
        raise ValueError("conflict_retries must be >= 0")

    def build(retries: int, timeout: float) -> AsyncMergeInsertBuilder:
        builder = dataset.merge_insert(on)
        builder = (
            when(builder)
            if when is not None
            else builder.when_matched_update_all().when_not_matched_insert_all()
        )
        return builder.conflict_retries(retries).retry_timeout(timedelta(seconds=timeout))

    schema = await body.start()
    if read_first:
        async with read_whole_body(body, spool_dir=spool_dir) as spooled:
            retries = conflict_retries if replay == "spool" else 0
            return await build(retries, retry_timeout).execute(spooled)
    started = time.monotonic()
    try:  # the body keeps its own spool: the builder spools nothing more
        return await build(0, retry_timeout).execute(body, schema=schema)
    except ConflictError as exc:
        if replay != "spool" or not exc.retryable or conflict_retries == 0 or not body.complete:
            raise
    source = await body.replay_source()
    await anyio.sleep(backoff_delay(1, 0.0))
    remaining = max(retry_timeout - (time.monotonic() - started), 0.001)
    result = await build(conflict_retries - 1, remaining).execute(source)
    return dataclasses.replace(result, num_attempts=result.num_attempts + 1)


async def ingest_body(
    writer: AsyncShardWriter | ShardRouter,
    body: BodyBatches,
    *,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    timeout: float | None = None,
    spool_dir: str | None = None,
    duplicate_keys: str = "error",
) -> PutSummary:
    """Write a request body to a MemWAL shard; return after the (durable) ack.

    Two phases, each with bounded memory whatever the body's size:

    1. **Check and spool.** The body is read to its end; every batch is
       checked against the table as the writer would check it (columns,
       types, nulls in key and non-nullable columns) and against the limits,
       and kept in a spool (in memory up to 4 MiB, then a temporary Arrow IPC
       file). Nothing reaches the writer in this phase, so a bad row
       anywhere, a passed limit or a client that leaves mid-upload writes
       nothing.
    2. **Write.** Only once the whole body is read and valid, the spool is
       streamed into the writer's queue batch by batch (under its
       backpressure, shielded from cancellation so that a complete, valid
       body is queued whole), and the ack is awaited.

    Parameters
    ----------
    writer : AsyncShardWriter or ShardRouter
        An open writer (the routing writer puts each row in its own shard);
        the body must hold every table column (``all_columns=True``).
    body : BodyBatches
        Started or not; read once. A body made with ``spool=True`` (as
        :func:`lance_async.fastapi.request_batches` can) is spooled by itself
        (an Arrow IPC body as the very messages that arrived); otherwise
        this function spools the decoded batches.
    max_rows : int, optional
        Rows one body may hold (default: no limit beyond the body limits).
    max_bytes : int, optional
        Bytes of decoded rows one body may hold (default: no limit beyond
        the body limits).
    timeout : float, optional
        Seconds each batch may wait for room in the writer's queue (see
        :meth:`AsyncShardWriter.send`). Past it, the batches queued before
        are written all the same: leave it None for all-or-nothing bodies.
    spool_dir : str, optional
        Directory of the spool file when this function spools (default: the
        system's temporary directory). Deleted before returning.
    duplicate_keys : {"error", "keep_last"}
        A primary key repeated inside the body: ``"error"`` (default) refuses
        the body with :class:`~lance_async.errors.DuplicateKeyError` naming
        the key, before anything is written; ``"keep_last"`` writes it as it
        is, in body order, so the LSM's newest-wins keeps its last occurrence.

    Returns
    -------
    PutSummary
        After the ack of every row: durable in the WAL when the writer has
        ``durable_write`` on (the engine's default). A body longer than
        ``writer.max_put_rows`` spans several engine puts.

    Raises
    ------
    PayloadTooLargeError
        The body holds more than ``max_rows`` rows or ``max_bytes`` bytes
        (nothing written).
    DuplicateKeyError
        The body repeats a primary key (nothing written).
    EmptyBodyError, SchemaMismatchError, DecodeError, ClientDisconnectedError
        As :meth:`BodyBatches.start` and iteration (nothing written).
    InvalidInputError, BackpressureTimeoutError, WriterFailedError, ClosedError
        As :meth:`AsyncShardWriter.put`.

    Notes
    -----
    Blocks only the calling task: decoding and spool I/O run on the
    library's ``stream`` threads, the checks on the loop (a schema
    comparison and a null count per key column per batch). Each engine put
    is atomic, a body of several puts is not: if the server dies, or the
    writer fails, during phase 2, a prefix of the body may be written (the
    request then gets no success). Client errors and disconnects always
    happen in phase 1.
    """
    row_cap = max_rows if max_rows is not None else math.inf
    byte_cap = max_bytes if max_bytes is not None else math.inf
    if row_cap < 1 or byte_cap < 1:
        raise ValueError("max_rows and max_bytes must be >= 1")
    if duplicate_keys not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicate_keys must be one of {DUPLICATE_POLICIES}")
    keys = primary_key(writer.schema)
    fit = TableFit(writer.schema, keys)
    tracker = KeyTracker(keys, what="the body") if keys and duplicate_keys == "error" else None
    rows = 0
    nbytes = 0

    def check(batch: pa.RecordBatch, index: int) -> None:
        nonlocal rows, nbytes
        rows += batch.num_rows
        nbytes += batch.nbytes
        if rows > row_cap:
            raise PayloadTooLargeError(
                f"an ingest body may hold at most {row_cap:,} rows (max_ingest_rows); "
                "split it into several requests; nothing was written",
                limit="max_ingest_rows",
                maximum=int(row_cap),
                actual=rows,
            )
        if nbytes > byte_cap:
            raise PayloadTooLargeError(
                f"an ingest body may hold at most {byte_cap:,} bytes of rows "
                "(max_ingest_bytes); nothing was written",
                limit="max_ingest_bytes",
                maximum=int(byte_cap),
                actual=nbytes,
            )
        fit.check(batch, index)
        if tracker is not None:
            tracker.add(batch)

    async with read_whole_body(body, check=check, spool_dir=spool_dir) as source:
        if tracker is not None:
            await run_sync(tracker.check, limiter=stream_limiter())
        # The body is complete and valid: queue all of it, or (on a writer
        # error) as much as the writer took. A cancelled caller must not leave
        # a prefix of a good body queued and the rest dropped.
        with anyio.CancelScope(shield=True):
            ack = await writer.send(source, timeout=timeout)
        return await ack


@asynccontextmanager
async def read_whole_body(
    body: BodyBatches,
    *,
    check: Callable[[pa.RecordBatch, int], None] | None = None,
    spool_dir: str | None = None,
) -> AsyncIterator[WriteSource]:
    """Read a body to its end into a spool; yield the spool as a replayable source.

    Parameters
    ----------
    body : BodyBatches
        Started or not; read once. A body made with ``spool=True`` spools
        itself; otherwise a spool is made here (deleted on exit).
    check : callable, optional
        ``check(batch, index)`` for every batch, on the loop; what it raises
        ends the read (nothing is written).
    spool_dir : str, optional
        Directory of the spool file made here.

    Yields
    ------
    WriteSource
        REPLAYABLE: every pass reads the spool (memory up to 4 MiB, then an
        Arrow IPC file), never the client.

    Raises
    ------
    EmptyBodyError
        The body holds no rows.
    BaseException
        What reading the body raised (limits, decode errors, a client that
        left or went silent: :class:`BodyTimeoutError`).

    Notes
    -----
    Nothing here runs on an engine thread: decoding and spool writes run on
    the library's ``stream`` threads, so a slow or stalled client holds a
    connection and at most a spool, never engine capacity.
    """
    own = None if body.spooled else Spool(spool_dir, SLICE_ROWS)
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    rows = 0
    index = 0
    try:
        schema = await body.start()
        async for batch in body:
            rows += batch.num_rows
            if check is not None:
                check(batch, index)
            index += 1
            if own is not None:
                pending.append(batch)
                pending_bytes += batch.nbytes
                if pending_bytes >= FEED_BYTES:
                    chunk, pending, pending_bytes = pending, [], 0
                    await run_sync(
                        partial(own.add_batches, schema, chunk), limiter=stream_limiter()
                    )
        if rows == 0:
            raise EmptyBodyError("the body holds no rows; nothing was written")
        if own is None:
            source = await body.replay_source()
        else:
            if pending:
                chunk, pending = pending, []
                await run_sync(partial(own.add_batches, schema, chunk), limiter=stream_limiter())
            await run_sync(own.seal, limiter=stream_limiter())
            source = replayable(own.factory(schema), schema=schema)
        yield source
    finally:
        if own is not None:
            with anyio.CancelScope(shield=True):
                await run_sync(own.discard, limiter=stream_limiter())
