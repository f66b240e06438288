"""Writing HTTP request bodies into Lance: ``merge_body`` and ``ingest_body``.

A request body is a one-shot stream. :func:`merge_body` streams it into one
merge_insert with Lance's retries off while it spools the body (memory, then
a temporary file); a commit conflict replays the spool as a replayable
source through lance_async's retry loop. :func:`ingest_body` writes a body
to a MemWAL shard as one atomic put and returns after the durable ack.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import pyarrow as pa

from ._http_bodies import BodyBatches
from ._threads import run_sync, stream_limiter
from .errors import ConflictError, EmptyBodyError, PayloadTooLargeError
from .merge import backoff_delay

if TYPE_CHECKING:
    from collections.abc import Callable

    from .acks import PutSummary
    from .dataset import AsyncDataset
    from .mem_wal import AsyncShardWriter
    from .merge import AsyncMergeInsertBuilder, MergeResult

__all__ = ["ingest_body", "merge_body"]

# ---------------------------------------------------------------------------
# writes
# ---------------------------------------------------------------------------


async def merge_body(
    dataset: AsyncDataset,
    body: BodyBatches,
    on: str | Sequence[str] | None = None,
    *,
    when: Callable[[AsyncMergeInsertBuilder], AsyncMergeInsertBuilder] | None = None,
    conflict_retries: int = 10,
    retry_timeout: float = 30.0,
    replay: str = "spool",
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
    replay : {"spool", "lance", "none"}
        How a conflict is retried. A request body is a one-shot source, so it
        cannot be re-read from the client:

        ``"spool"`` (default)
            The first pass streams the body into the engine with Lance's own
            retries off, so Lance buffers nothing; the body keeps a spool
            (``spool=True``, in memory up to 4 MiB, then on disk). On a
            conflict the spool is replayed as a REPLAYABLE source by
            lance_async's retry loop (backoff, fresh target each attempt).
            Memory stays flat whatever the body size; the disk holds one copy.
        ``"lance"``
            Lance's own buffered retries (``conflict_retries > 0`` on the
            stream): pylance 14 keeps up to 100 MB of the stream **in
            memory** before spilling to disk, so a large body costs that much
            RAM per request.
        ``"none"``
            One pass, no retry: a conflict raises :class:`ContentionError`.

    Returns
    -------
    MergeResult
        Of the committed attempt; ``num_attempts`` counts the first pass, and
        ``source_mode`` is STREAMING when the first pass committed, REPLAYABLE
        when a replay did.

    Raises
    ------
    PayloadTooLargeError, SchemaMismatchError, DecodeError, EmptyBodyError
        The body broke a limit or does not fit (nothing committed).
    ClientDisconnectedError
        The client left before the body ended (nothing committed).
    ContentionError, ConflictError
        Conflicts outlasted the retries, or cannot be retried.

    Notes
    -----
    The engine runs on the library's engine threads; the event loop only
    moves batch references.
    """
    if replay not in ("spool", "lance", "none"):
        raise ValueError(f"replay must be 'spool', 'lance' or 'none', got {replay!r}")
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
    started = time.monotonic()
    first_retries = conflict_retries if replay == "lance" else 0
    try:
        return await build(first_retries, retry_timeout).execute(body, schema=schema)
    except ConflictError as exc:
        if replay != "spool" or not exc.retryable or conflict_retries == 0 or not body.complete:
            raise
    source = await body.replay_source()
    await anyio.sleep(backoff_delay(1, 0.0))
    remaining = max(retry_timeout - (time.monotonic() - started), 0.001)
    result = await build(conflict_retries - 1, remaining).execute(source)
    return dataclasses.replace(result, num_attempts=result.num_attempts + 1)


async def ingest_body(
    writer: AsyncShardWriter,
    body: BodyBatches,
    *,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    timeout: float | None = None,
) -> PutSummary:
    """Write a request body to a MemWAL shard as one atomic put; wait for the ack.

    The body's batches are collected (bounded by ``max_rows`` / ``max_bytes``)
    and written with a single engine ``put`` once the body has ended, so a
    body is written whole or not at all: a client that leaves mid-upload
    writes nothing.

    Parameters
    ----------
    writer : AsyncShardWriter
        An open writer; the body must hold every table column
        (``all_columns=True``).
    body : BodyBatches
    max_rows : int, optional
        Rows one body may hold (default and ceiling: ``writer.max_put_rows``,
        since one engine put never spans memtables).
    max_bytes : int, optional
        Bytes of rows one body may hold (default and ceiling:
        ``writer.max_put_bytes``).
    timeout : float, optional
        Seconds to wait for room in the writer's queue.

    Returns
    -------
    PutSummary
        After the ack: durable in the WAL when the writer has
        ``durable_write`` on (the engine's default).

    Raises
    ------
    PayloadTooLargeError
        The body holds more than ``max_rows`` rows or ``max_bytes`` bytes.
    EmptyBodyError, SchemaMismatchError, DecodeError, ClientDisconnectedError
        As :meth:`BodyBatches.start` (nothing written).
    InvalidInputError, BackpressureTimeoutError, WriterFailedError, ClosedError
        As :meth:`AsyncShardWriter.put`.
    """
    row_cap = min(max_rows or writer.max_put_rows, writer.max_put_rows)
    byte_cap = min(max_bytes or writer.max_put_bytes, writer.max_put_bytes)
    batches: list[pa.RecordBatch] = []
    rows = 0
    nbytes = 0
    await body.start()
    async for batch in body:
        rows += batch.num_rows
        nbytes += batch.nbytes
        if rows > row_cap:
            raise PayloadTooLargeError(
                f"an ingest body is written as one atomic put of at most {row_cap:,} rows "
                "(max_ingest_rows); split it into several requests",
                limit="max_ingest_rows",
                maximum=row_cap,
                actual=rows,
            )
        if nbytes > byte_cap:
            raise PayloadTooLargeError(
                f"an ingest body may hold at most {byte_cap:,} bytes of rows (max_ingest_bytes)",
                limit="max_ingest_bytes",
                maximum=byte_cap,
                actual=nbytes,
            )
        batches.append(batch)
    if not batches:
        raise EmptyBodyError("the body holds no rows; nothing was written")
    schema = body.schema

    def combine() -> pa.RecordBatch:
        table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
        (only,) = table.to_batches(max_chunksize=table.num_rows)
        return only

    one = batches[0] if len(batches) == 1 else await run_sync(combine, limiter=stream_limiter())
    return await writer.put(one, timeout=timeout)
