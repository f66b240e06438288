"""The streaming LSM scan: :func:`scan_view`, newest row per key, batch by batch.

The engine's ``LsmScanner`` merges every level in the engine and collects
the whole result before it returns a batch (memory proportional to the
result, and a cancel that waits for all of it). The levels differ hugely in
size, so this scan reads them apart:

1. the unflushed rows (memtables and WAL tails: in memory already), then
2. each flushed generation's winning rows, newest generation first (a scan
   of the small SSTable, keeping the rows whose address is a winner), then
3. the base table, streamed batch by batch by the engine, dropping each row
   whose key a newer level holds (one probe of the view's key index).

Every ``next()`` does a bounded amount of work (one batch), so memory is
bounded by the batch size and a consumer that stops frees the thread within
one batch. The filter applies to the newest version of each row, as the
engine's does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .._engine_errors import raise_mapped
from ..errors import LanceAsyncError
from .levels import ROWADDR, Generation, LsmView
from .pinned import raise_expired

__all__ = ["DEFAULT_BATCH_ROWS", "ROWID", "output_schema", "scan_view"]

ROWID = "_rowid"
"""The row-id column of ``with_row_id=True`` scans (null for unflushed and
flushed-generation rows: only base rows have a row id)."""

DEFAULT_BATCH_ROWS = 8192
"""Rows per batch of the in-memory levels when no ``batch_size`` is given."""
READ_AHEAD = 3
"""Generations read side by side ahead of the one a scan emits."""
WHOLE_ROWS = 262_144
"""Generations of at most this many rows are read whole (and ahead); larger ones stream."""
WHOLE_BATCH_ROWS = 65_536
"""Rows per batch of a generation read whole, when no ``batch_size`` is given."""


def output_schema(
    schema: pa.Schema, columns: Sequence[str] | None, with_row_id: bool = False
) -> pa.Schema:
    """The table schema projected on ``columns`` (metadata kept), with
    ``_rowid`` (uint64, nullable) last when ``with_row_id``."""
    out = schema if columns is None else pa.schema([schema.field(c) for c in columns])
    if with_row_id:
        out = out.append(pa.field(ROWID, pa.uint64()))
    return out.with_metadata(schema.metadata)


def _mask_of(gen: Generation, keep: np.ndarray, addresses: np.ndarray) -> np.ndarray:
    """``keep`` of the rows at ``addresses`` (rows of ``gen``, any subset)."""
    return np.asarray(keep[gen.positions(addresses)])


class _Emitter:
    """Relabels batches to the output schema, slices them, skips the offset,
    counts the limit, adds a null row id to rows that have none."""

    def __init__(self, schema: pa.Schema, limit: int | None, size: int, offset: int = 0) -> None:
        self.schema = schema
        self.remaining = limit
        self.skip = offset
        self.size = size
        self.row_ids = ROWID in schema.names

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def __call__(
        self, data: pa.Table | pa.RecordBatch, size: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        if isinstance(data, pa.Table):
            batches = data.to_batches(max_chunksize=size or self.size)
        else:
            batches = [data]
        for batch in batches:
            if self.done:
                return
            if not batch.num_rows:
                continue
            if self.skip:
                if batch.num_rows <= self.skip:
                    self.skip -= batch.num_rows
                    continue
                batch, self.skip = batch.slice(self.skip), 0
            if self.remaining is not None:
                batch = batch.slice(0, self.remaining)
                self.remaining -= batch.num_rows
            columns = list(batch.columns)
            if self.row_ids and len(columns) < len(self.schema):
                columns.append(pa.nulls(batch.num_rows, pa.uint64()))
            yield pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _memtables(
    view: LsmView, cols: list[str], filter: str | None, emit: _Emitter
) -> Iterator[pa.RecordBatch]:
    for mem in view.memtables:
        table = mem.select(cols, filter)
        if table is None:
            continue
        yield from emit(table.select(cols))
        if emit.done:
            return


def _read_generation(
    gen: Generation, keep: np.ndarray, cols: list[str], filter: str | None
) -> pa.Table:
    """A whole generation's rows that ``keep`` keeps, projected (blocking)."""
    every = bool(keep.all())
    # unfiltered, a generation's scan gives its rows in the order its keys
    # were read in (``load_generation``): the mask applies by position;
    # filtered, by row address
    by_address = not every and filter is not None
    table = gen.dataset.to_table(columns=cols, filter=filter, with_row_address=by_address)
    if by_address:
        mask = _mask_of(gen, keep, table.column(ROWADDR).to_numpy())
        return table.filter(pa.array(mask)).select(cols)
    if not every:
        if table.num_rows != len(keep):
            raise LanceAsyncError(
                f"generation {gen.uri} holds other rows than when its keys were read; "
                "generations never change: its folder was written again"
            )
        table = table.filter(pa.array(keep))
    return table.combine_chunks()  # one batch per generation, not one per chunk read


def _stream_generation(
    gen: Generation,
    keep: np.ndarray,
    cols: list[str],
    filter: str | None,
    batch_size: int | None,
    emit: _Emitter,
) -> Iterator[pa.RecordBatch]:
    """A large generation batch by batch (as :func:`_read_generation` reads it whole)."""
    every = bool(keep.all())
    by_address = not every and filter is not None
    scanner = gen.dataset.scanner(
        columns=cols, filter=filter, with_row_address=by_address, batch_size=batch_size
    )
    reader = scanner.to_reader()
    at = 0
    try:
        for batch in reader:
            if by_address:
                mask = _mask_of(gen, keep, batch.column(ROWADDR).to_numpy())
                batch = batch.filter(pa.array(mask)).select(cols)
            elif not every:
                n = batch.num_rows
                if at + n > len(keep):
                    raise LanceAsyncError(
                        f"generation {gen.uri} holds more rows than when its keys were "
                        "read; generations never change: its folder was written again"
                    )
                batch = batch.filter(pa.array(keep[at : at + n]))
                at += n
            yield from emit(batch)
            if emit.done:
                return
    finally:
        reader.close()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="lance_async generations")
        return _pool


def _generations(
    view: LsmView, cols: list[str], filter: str | None, batch_size: int | None, emit: _Emitter
) -> Iterator[pa.RecordBatch]:
    """The generations' winning rows, newest first within a shard.

    A generation is a small Lance dataset of its own, and reading one costs
    a fixed setup besides its rows; so up to :data:`READ_AHEAD` generations
    (of at most :data:`WHOLE_ROWS` rows each) are read side by side ahead of
    the one being emitted, and emitted in order: memory is bounded by that
    many generations. A larger generation is streamed batch by batch.
    """
    todo = iter(view.live_generations())
    ahead: deque[tuple[Generation, np.ndarray, Future[pa.Table] | None]] = deque()
    size = batch_size or max(emit.size, WHOLE_BATCH_ROWS)

    def refill() -> None:
        while len(ahead) < READ_AHEAD:
            item = next(todo, None)
            if item is None:
                return
            gen, keep = item
            if len(gen) > WHOLE_ROWS:
                ahead.append((gen, keep, None))
                return  # streamed in its turn; nothing read ahead past it
            ahead.append((gen, keep, _readers().submit(_read_generation, gen, keep, cols, filter)))

    try:
        refill()
        while ahead:
            gen, keep, future = ahead.popleft()
            if future is None:
                yield from _stream_generation(gen, keep, cols, filter, batch_size, emit)
            else:
                table = future.result()
                refill()
                yield from emit(table, size)
            if emit.done:
                return
            refill()
    finally:
        for _gen, _keep, future in ahead:
            if future is not None:
                future.cancel()


def _base(
    view: LsmView, cols: list[str], filter: str | None, batch_size: int | None, emit: _Emitter
) -> Iterator[pa.RecordBatch]:
    keys = view.keys
    hides = view.shadow.size > 0 or any(m.table.num_rows for m in view.memtables)
    extra = [k for k in keys if k not in cols] if hides else []
    out = [*cols, ROWID] if emit.row_ids else cols
    scanner = view.base.scanner(
        columns=cols + extra,
        filter=filter,
        batch_size=batch_size,
        limit=None if hides or emit.skip else emit.remaining,
        with_row_id=emit.row_ids,
    )
    reader = scanner.to_reader()
    try:
        for batch in reader:
            if hides:
                mask = view.hidden([batch.column(k) for k in keys])
                if mask.any():
                    batch = batch.filter(pa.array(~mask))
            if extra or emit.row_ids:
                batch = batch.select(out)
            yield from emit(batch)
            if emit.done:
                return
    finally:
        reader.close()


def scan_view(
    view: LsmView,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    *,
    offset: int = 0,
    with_row_id: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Newest live row of every key across the view's levels, streamed (a generator).

    Parameters
    ----------
    view : LsmView
    columns : sequence of str, optional
        Default: every column of the table.
    filter : str, optional
        Lance SQL, applied to the newest version of each row.
    limit : int, optional
        Stop after this many rows.
    batch_size : int, optional
        Rows per batch at most (default: the engine's for stored levels,
        :data:`DEFAULT_BATCH_ROWS` for unflushed rows).
    offset : int
        Skip this many rows first (in the order of the scan).
    with_row_id : bool
        Add ``_rowid`` (uint64): the base row's id, null for rows of newer
        levels (they have none until compacted).

    Yields
    ------
    pa.RecordBatch
        Batches of the table schema projected on ``columns``: unflushed rows
        first, then generations (newest first), then the base table.

    Raises
    ------
    LanceAsyncError
        Engine errors, mapped (a bad filter is
        :class:`~lance_async.errors.InvalidInputError`).

    Notes
    -----
    Blocking: run it on a worker thread (``LsmReader.scan`` does). Each ``next()``
    reads at most one batch.
    """
    cols = list(columns) if columns is not None else list(view.schema.names)
    emit = _Emitter(
        output_schema(view.schema, cols, with_row_id),
        limit,
        batch_size or DEFAULT_BATCH_ROWS,
        offset,
    )
    if emit.done:
        return
    try:
        yield from _memtables(view, cols, filter, emit)
        if not emit.done:
            yield from _generations(view, cols, filter, batch_size, emit)
        if not emit.done:
            yield from _base(view, cols, filter, batch_size, emit)
    except (OSError, ValueError, RuntimeError) as exc:
        if view.pinned:
            raise_expired(exc, "a file")
        raise_mapped(exc)
        raise
