"""One pass of a merge source on its way into the engine, and the locks around it.

What :class:`~lance_async.AsyncMergeInsertBuilder` checks in a source before
and while the engine reads it (key columns never null, each key at most
once, an empty pass found before the engine runs), and the per-table lock of
inserting merges into tables without a declared primary key (see the
``merge`` package docstring). Blocking helpers run on worker threads.
"""

from __future__ import annotations

import contextlib
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

__all__ = [
    "Lease",
    "MergeLock",
    "PassGuard",
    "check_keys",
    "check_required",
    "materialize",
    "merge_lock",
    "read_whole",
    "warn_no_primary_key",
]

log = logging.getLogger("lance_async.merge")

_locks: dict[str, MergeLock] = {}
_locks_guard = threading.Lock()
_warned: set[str] = set()
_POLL = 0.05  # seconds between checks of a waiting merge's stop event


def _table_key(uri: str) -> str:
    return uri if "://" in uri else os.path.realpath(uri)


class MergeLock:
    """The merges of one table in this process: plain upserts side by side,
    any other merge alone (a writer-preferring readers-writer lock; blocking,
    held on the engine thread from an attempt's checkout to its commit).

    Why: Lance rebases a merge over a concurrent commit that touched none of
    the rows the merge *wrote*, without asking what it *read*. A plain upsert
    of a table with a declared key is safe with that (it writes every key it
    names, and two inserts of one new key conflict), but an update-only or
    delete merge that finds a key absent, an insert-only merge that finds it
    present, or a conditional update that leaves it alone, writes nothing
    for that key and commits over a concurrent commit that changed it -- its
    outcome is then that of running before that commit, though its version
    comes after (pylance 14.0.3). Run alone in the process, such a merge
    sees every commit of the process before its own; merges of other
    processes are not held back (see the ``merge`` package docstring).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive waiters: new shared holders wait behind them

    @contextlib.contextmanager
    def hold(self, *, exclusive: bool, stop: threading.Event | None = None) -> Iterator[Lease]:
        """Hold the lock (blocking); yields the :class:`Lease`, which a
        stopped merge's guard may give back early (:meth:`Lease.release`).

        Raises
        ------
        MergeStopped
            ``stop`` was set while waiting (the merge was cancelled).
        """
        with self._cond:
            if exclusive:
                self._waiting += 1
                try:
                    while self._exclusive or self._shared:
                        self._wait(stop)
                finally:
                    self._waiting -= 1
                    self._cond.notify_all()  # a withdrawn exclusive waiter lets upserts on
                self._exclusive = True
            else:
                while self._exclusive or self._waiting:
                    self._wait(stop)
                self._shared += 1
        lease = Lease(self, exclusive)
        try:
            yield lease
        finally:
            lease.release()

    def _release(self, exclusive: bool) -> None:
        with self._cond:
            if exclusive:
                self._exclusive = False
            else:
                self._shared -= 1
            self._cond.notify_all()

    def _wait(self, stop: threading.Event | None) -> None:
        if stop is not None and stop.is_set():
            raise MergeStopped("the merge was cancelled before its commit; nothing was committed")
        self._cond.wait(_POLL if stop is not None else None)


class Lease:
    """One hold of a :class:`MergeLock`; released once, by whoever comes first."""

    def __init__(self, lock: MergeLock, exclusive: bool) -> None:
        self._lock = lock
        self._exclusive = exclusive
        self._done = False
        self._guard = threading.Lock()

    def release(self) -> None:
        """Give the hold back (idempotent; any thread)."""
        with self._guard:
            if self._done:
                return
            self._done = True
        self._lock._release(self._exclusive)


def merge_lock(uri: str) -> MergeLock:
    """The process-wide :class:`MergeLock` of table ``uri`` (does not block)."""
    key = _table_key(uri)
    with _locks_guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = MergeLock()
        return lock


def warn_no_primary_key(uri: str) -> None:
    """Log, once per table and process, that inserting merges into a table
    without a declared primary key are safe only within this process."""
    key = _table_key(uri)
    with _locks_guard:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(
        "lance_async: %s declares no primary key: merges that insert into it run one at "
        "a time in this process, but merges from other processes can insert the same "
        "new key twice; declare the key (field metadata "
        "lance-schema:unenforced-primary-key)",
        uri,
        extra={"table": uri},
    )


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


def check_required(batches: Sequence[pa.RecordBatch], table: pa.Schema) -> None:
    """No null in a column the table declares non-nullable (blocking, O(columns)).

    Raises
    ------
    SchemaMismatchError
        Naming the column; the engine would refuse the whole merge.
    """
    for field in table:
        if field.nullable:
            continue
        nulls = sum(
            b.column(field.name).null_count for b in batches if field.name in b.schema.names
        )
        if nulls:
            raise SchemaMismatchError(
                f"column {field.name!r} holds {nulls} null value(s) but the table declares it "
                "non-nullable; nothing was written",
                field=field.name,
            )


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

    It also keeps the pass's *commit point*: the moment after which the
    engine may commit. For a streamed pass that is when the engine has read
    the end of the stream (the last stop check passed); for rows handed over
    in memory, :meth:`commit_point` called right before the engine runs.
    Until then a cancelled merge can be abandoned (:meth:`try_abandon`):
    whatever its thread still does, it commits nothing.
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
        self.streamed = False
        """True once :meth:`wrap` handed the engine a checked stream (whose end
        is the commit point)."""
        self._lock = threading.Lock()
        self._committing = False
        self._lease: Lease | None = None

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise MergeStopped("the merge was cancelled before its commit; nothing was committed")

    def commit_point(self) -> None:
        """Pass the commit point (blocking; on the engine's thread): from here on
        the engine runs to its end and may commit, and a cancelled merge is
        waited for. Call it right before the engine call for rows that are
        not a checked stream (``streamed`` False); a stream passes it at its end.

        Raises
        ------
        MergeStopped
            The merge was cancelled (or abandoned) before it got here.
        """
        with self._lock:
            self._check_stop()
            self._committing = True

    def keep(self, lease: Lease) -> None:
        """Record the :class:`MergeLock` hold of this pass (on the engine's
        thread, once acquired), so that abandoning the pass gives it back.

        Raises
        ------
        MergeStopped
            The merge was cancelled meanwhile (the caller's ``with`` releases it).
        """
        with self._lock:
            self._check_stop()
            self._lease = lease

    def try_abandon(self) -> bool:
        """Stop the pass (on the loop, when the merge's task is cancelled); True
        when it has not passed its commit point, so its thread commits
        nothing and need not be waited for. The pass's :class:`MergeLock`
        hold is then given back at once: a source blocked for ever must not
        hold up the other merges of the table."""
        with self._lock:
            if self.stop is not None:
                self.stop.set()
            abandoned = self.stop is not None and not self._committing
            if abandoned and self._lease is not None:
                self._lease.release()
            return abandoned

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
        self.streamed = True
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
            # the end of the source is the commit point: a merge cancelled
            # before the engine sees it commits nothing
            self.commit_point()
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
