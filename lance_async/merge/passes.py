"""One pass of a merge source on its way into the engine, and the locks around it.

What :class:`~lance_async.AsyncMergeInsertBuilder` checks in a source before
and while the engine reads it (key columns never null, each key at most
once, an empty pass found before the engine runs), and the per-table lock of
inserting merges into tables without a declared primary key (see the
``merge`` package docstring). Blocking helpers run on worker threads.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pyarrow as pa

from .._duplicates import KeyTracker, check_unique_keys, keep_last
from .._threads import run_sync
from ..errors import SchemaMismatchError
from ..sources import WriteSource, resolve_source

__all__ = ["PassGuard", "check_keys", "insert_lock", "materialize", "read_whole"]

log = logging.getLogger("lance_async.merge")

_insert_locks: dict[str, threading.Lock] = {}
_insert_locks_guard = threading.Lock()
_warned: set[str] = set()


def _table_key(uri: str) -> str:
    return uri if "://" in uri else os.path.realpath(uri)


def insert_lock(uri: str) -> threading.Lock:
    """The process-wide lock of inserting merges into one table without a primary key."""
    key = _table_key(uri)
    with _insert_locks_guard:
        lock = _insert_locks.get(key)
        if lock is None:
            lock = _insert_locks[key] = threading.Lock()
        if key not in _warned:
            _warned.add(key)
            log.warning(
                "lance_async: %s declares no primary key: merges that insert into it run one at "
                "a time in this process, but merges from other processes can insert the same "
                "new key twice; declare the key (field metadata "
                "lance-schema:unenforced-primary-key)",
                uri,
                extra={"table": uri},
            )
        return lock


def check_keys(
    batches: Sequence[pa.RecordBatch], key_sets: Sequence[Sequence[str]], policy: str
) -> pa.Table | None:
    """Join-key values of in-memory rows: never null, each at most once (blocking).

    Returns None when the rows can be merged as they are, or (``keep_last``)
    the rows holding the last occurrence of each key.

    Raises
    ------
    SchemaMismatchError
        A key column holds nulls.
    DuplicateKeyError
        A key repeats (``policy="error"``): pylance would insert it twice
        when it matches no row, and reject the merge when it does.
    """
    table = pa.Table.from_batches(batches)
    for name in key_sets[0]:
        nulls = table.column(name).null_count
        if nulls:
            raise SchemaMismatchError(
                f"join column {name!r} holds {nulls} null value(s); nothing was written",
                field=name,
            )
    if policy == "keep_last":
        deduped = table
        for keys in key_sets:
            deduped = keep_last(deduped, keys)
        return None if deduped is table else deduped
    for keys in key_sets:
        check_unique_keys(table, keys, what="the merge_insert source")
    return None


async def read_whole(src: WriteSource) -> pa.Table:
    """One pass of a source read into one table (on a worker thread)."""
    async with src.reader() as reader:
        table: pa.Table = await run_sync(reader.read_all)
    return table


async def read_keys(src: WriteSource, keys: Sequence[str]) -> pa.Table:
    """The key columns of one pass of a source (read on a worker thread;
    the other columns are dropped batch by batch)."""
    names = list(keys)
    in_memory = src.batches()
    if in_memory is not None:
        return pa.Table.from_batches(in_memory, schema=src.schema).select(names)
    async with src.reader() as reader:

        def drain() -> pa.Table:
            parts = [pa.Table.from_batches([b]).select(names) for b in reader if b.num_rows]
            schema = pa.schema([src.schema.field(n) for n in names])
            return pa.concat_tables(parts) if parts else schema.empty_table()

        return await run_sync(drain)


class MergeStopped(Exception):
    """Raised into the engine's read of a source when the awaiting task was
    cancelled: the engine stops reading, and nothing is committed."""


async def materialize(src: WriteSource) -> WriteSource:
    """Read a streamed or replayable source into memory (``keep_last`` needs every key)."""
    return await resolve_source(await read_whole(src))


class PassGuard:
    """One pass of a source on its way into the engine (blocking; worker thread).

    Finds an empty pass before the engine runs (so an empty source commits
    nothing) and a join key repeated anywhere in a streamed pass (raised
    before the engine sees the end of the stream, so nothing commits). The
    error is kept, since the engine turns it into text.
    """

    def __init__(
        self,
        key_sets: Sequence[Sequence[str]],
        *,
        keep_empty: bool,
        stop: threading.Event | None = None,
    ) -> None:
        self.key_sets = [list(keys) for keys in key_sets]
        self.keep_empty = keep_empty
        self.stop = stop
        """Set from the loop when the merge's task is cancelled: the next batch
        raises :class:`MergeStopped` into the engine."""
        self.error: BaseException | None = None

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise MergeStopped("the merge was cancelled before its commit; nothing was committed")

    def wrap(self, data: pa.Table | pa.RecordBatchReader) -> Any:
        if isinstance(data, pa.Table):  # in memory: checked by _check_keys already
            return data if data.num_rows or self.keep_empty else None
        batches = iter(data)
        first = None
        try:
            for batch in batches:
                self._check_stop()
                if batch.num_rows:
                    first = batch
                    break
        except BaseException as exc:
            self.error = exc
            raise
        if first is None:
            return pa.RecordBatchReader.from_batches(data.schema, []) if self.keep_empty else None
        return pa.RecordBatchReader.from_batches(data.schema, self._checked(first, batches))

    def _checked(
        self, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        trackers = [KeyTracker(keys, what="the merge_insert source") for keys in self.key_sets]
        try:
            for batch in itertools.chain([first], rest):
                self._check_stop()
                if batch.num_rows:
                    for tracker in trackers:
                        tracker.add(batch)
                yield batch
            for tracker in trackers:
                tracker.check()
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.error = exc
            raise

    def reraise(self, exc: BaseException) -> None:
        """Raise the guard's own error in place of the engine's text of it."""
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return
        if self.error is not None and self.error is not exc:
            raise self.error
