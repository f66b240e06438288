"""Awaitable merge_insert (upsert) whose conflict retries replay the source.

:class:`AsyncMergeInsertBuilder` mirrors ``lance.MergeInsertBuilder`` of
pylance 14. What differs is how a commit conflict is retried, chosen by the
source's :class:`~lance_async.SourceMode`:

MATERIALIZED
    Lance's in-memory path (``execute_batches``) with Lance's own retries;
    the rows are in memory already, nothing spills.
REPLAYABLE
    Lance's retries are turned off (``conflict_retries(0)``), so Lance never
    buffers or spills the input. On a retryable conflict lance_async backs off
    (about 50, 100, 200, 400 ms ... with jitter; from the third retry on, at
    least half the last attempt's time), reopens the target at its latest
    version, opens a fresh pass of the source (calls the factory again) and
    tries again, up to ``conflict_retries`` retries within ``retry_timeout``.
STREAMING
    One pass. Lance's own buffered retries when ``conflict_retries > 0``;
    a conflict fails at once with ``conflict_retries(0)``.

Every attempt runs on an engine thread; the loop stays free during attempts
and during backoff.

Tables without a declared primary key
-------------------------------------
Lance detects two concurrent merges inserting the same new key only when the
key is declared (``lance-schema:unenforced-primary-key``); otherwise both
commit, and the key is inserted twice. lance_async therefore runs merges that
can insert into such a table one at a time per table within a process (a
lock held from the attempt's checkout to its commit), so the later one sees
the earlier one's rows and updates them. Other processes are not protected:
declare the primary key. The first such merge of a table logs a warning
(logger ``lance_async``).

Cancellation
------------
Cancelling the task that awaits :meth:`AsyncMergeInsertBuilder.execute`
never leaves a thread running on its behalf: an attempt in flight runs to its
end in its thread (a merge cannot be interrupted half-way), then the
cancellation is delivered. If that attempt committed, its
:class:`MergeResult` is stored in :attr:`AsyncMergeInsertBuilder.last_result`
and logged (logger ``lance_async``, level WARNING) so the outcome is known.
Cancelled during backoff, nothing is in flight and nothing more is committed.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import pyarrow as pa
from lance.dataset import LanceDataset

from ._keys import DUPLICATE_POLICIES, KeyTracker, check_unique_keys, keep_last
from ._threads import run_sync
from .errors import (
    ConflictError,
    ContentionError,
    SchemaMismatchError,
    map_engine_error,
    raise_mapped,
)
from .sources import SourceMode, WriteSource, resolve_source

if TYPE_CHECKING:
    from .dataset import AsyncDataset

__all__ = ["AsyncMergeInsertBuilder", "MergeResult", "backoff_delay"]

log = logging.getLogger("lance_async")
T = TypeVar("T")

BASE_BACKOFF = 0.05
MAX_BACKOFF = 5.0


@dataclass(frozen=True)
class MergeResult:
    """What one merge_insert did.

    Attributes
    ----------
    num_inserted_rows, num_updated_rows, num_deleted_rows : int
        Row counts reported by Lance for the committed attempt.
    num_attempts : int
        Attempts lance_async ran (1 + retries). For MATERIALIZED sources Lance
        retries inside one attempt, so this stays 1 there.
    source_mode : SourceMode
        How the source was read (decides the retry strategy).
    version : int
        The dataset version the merge committed (the version read, when
        nothing was committed).
    committed : bool
        False when the source held no rows and nothing was committed (an
        empty merge is no new version; with
        ``when_not_matched_by_source_delete`` an empty source still runs).
    """

    num_inserted_rows: int
    num_updated_rows: int
    num_deleted_rows: int
    num_attempts: int
    source_mode: SourceMode
    version: int
    committed: bool = True


def backoff_delay(
    attempt: int, last_attempt_seconds: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based).

    ``0.05 * 2**(attempt-1)`` seconds -- 50, 100, 200, 400 ms ... -- times a
    jitter in [0.5, 1.5), capped at 5 s. From the third retry on, the wait is
    at least half the last attempt's duration, so writers whose attempts are
    slow spread out instead of colliding again; the first retries stay short,
    since one conflict usually means one competitor that has just committed.
    The shape follows Lance's own commit retry backoff.
    """
    base = BASE_BACKOFF * (2 ** max(attempt - 1, 0))
    if attempt >= 3:
        base = max(base, 0.5 * last_attempt_seconds)
    jitter = (rng or random).uniform(0.5, 1.5)
    return float(min(MAX_BACKOFF, base * jitter))


_RETRIES_RE = re.compile(r"Attempted (\d+) retries")


def _stats(result: Any) -> tuple[int, int, int]:
    get = result.get if isinstance(result, dict) else (lambda k, d=0: getattr(result, k, d))
    return (
        int(get("num_inserted_rows", 0)),
        int(get("num_updated_rows", 0)),
        int(get("num_deleted_rows", 0)),
    )


class AsyncMergeInsertBuilder:
    """Configure and run an upsert, like ``lance.MergeInsertBuilder`` (pylance 14).

    Obtain one from :meth:`AsyncDataset.merge_insert`. The configuration
    methods return ``self`` for chaining and do not block; :meth:`execute`,
    :meth:`execute_uncommitted`, :meth:`analyze_plan` and :meth:`explain_plan`
    are coroutines that run the engine on a worker thread.

    Attributes
    ----------
    last_result : MergeResult or None
        The result of the last committed execution, also set when the
        awaiting task was cancelled after the commit landed.
    """

    def __init__(self, dataset: AsyncDataset, on: str | Iterable[str] | None) -> None:
        self._dataset = dataset
        if on is None:
            keys = dataset.primary_key
            if not keys:
                raise ValueError(
                    "merge_insert(on=None) uses the primary key, but the schema marks none; "
                    "pass on='column' or add the lance-schema:unenforced-primary-key metadata"
                )
            self._on = keys
        else:
            self._on = [on] if isinstance(on, str) else list(on)
        unknown = [c for c in self._on if c not in dataset.schema.names]
        if unknown:
            raise SchemaMismatchError(
                f"join column {unknown[0]!r} is not in the table", field=unknown[0]
            )
        self._steps: list[tuple[str, tuple[Any, ...]]] = []
        self._duplicates = "error"
        self._retries = 10
        self._timeout = timedelta(seconds=30)
        self.last_result: MergeResult | None = None

    # -- configuration (mirrors pylance) -----------------------------------
    def _add(self, name: str, *args: Any) -> AsyncMergeInsertBuilder:
        self._steps.append((name, args))
        return self

    def when_matched_update_all(self, condition: str | None = None) -> AsyncMergeInsertBuilder:
        """Update target rows that match a source row (optionally only where
        the SQL ``condition`` over ``source.`` / ``target.`` columns holds)."""
        return self._add("when_matched_update_all", condition)

    def when_matched_delete(self) -> AsyncMergeInsertBuilder:
        """Delete target rows that match a source row."""
        return self._add("when_matched_delete")

    def when_matched_fail(self) -> AsyncMergeInsertBuilder:
        """Fail the whole operation if any row matches."""
        return self._add("when_matched_fail")

    def when_not_matched_insert_all(self) -> AsyncMergeInsertBuilder:
        """Insert source rows that match no target row."""
        return self._add("when_not_matched_insert_all")

    def when_not_matched_by_source_delete(self, expr: str | None = None) -> AsyncMergeInsertBuilder:
        """Delete target rows that no source row matches (only those matching
        the SQL ``expr`` when given)."""
        return self._add("when_not_matched_by_source_delete", expr)

    def duplicate_keys(self, policy: str) -> AsyncMergeInsertBuilder:
        """What to do with a join key repeated inside the source.

        Parameters
        ----------
        policy : {"error", "keep_last"}
            ``"error"`` (the default): raise
            :class:`~lance_async.errors.DuplicateKeyError` naming the key,
            before anything commits (pylance would insert a repeated new key
            twice). ``"keep_last"``: merge only the last occurrence of each
            key, in source order (newest wins, as in a feed); a streamed or
            replayable source is then read into memory first.

        Raises
        ------
        ValueError
            Another policy.
        """
        if policy not in DUPLICATE_POLICIES:
            raise ValueError(f"duplicate_keys must be one of {DUPLICATE_POLICIES}, got {policy!r}")
        self._duplicates = policy
        return self

    def conflict_retries(self, max_retries: int) -> AsyncMergeInsertBuilder:
        """Retries after a commit conflict (default 10; 0 fails at once)."""
        if max_retries < 0:
            raise ValueError("conflict_retries must be >= 0")
        self._retries = int(max_retries)
        return self

    def retry_timeout(self, timeout: timedelta) -> AsyncMergeInsertBuilder:
        """Time budget for retries (default 30 s); the first attempt always runs."""
        self._timeout = timeout
        return self

    def use_index(self, use_index: bool) -> AsyncMergeInsertBuilder:
        """Whether to use an index on the join key (default True)."""
        return self._add("use_index", use_index)

    def write_mode(self, mode: str) -> AsyncMergeInsertBuilder:
        """``"auto"``, ``"rewrite_rows"`` or ``"rewrite_columns"`` (see pylance)."""
        return self._add("write_mode", mode)

    def data_storage_version(self, version: str) -> AsyncMergeInsertBuilder:
        """File format version for the files this merge writes."""
        return self._add("data_storage_version", version)

    def mark_sstables_as_compacted(self, sstables: Sequence[Any]) -> AsyncMergeInsertBuilder:
        """Record, in the merge's own commit, that MemWAL SSTables were compacted
        (a list of ``lance.mem_wal.CompactedSsTable``; at most one per shard)."""
        return self._add("mark_sstables_as_compacted", list(sstables))

    # -- building -----------------------------------------------------------
    def _build(self, target: LanceDataset, retries: int) -> Any:
        builder = target.merge_insert(self._on)
        for name, args in self._steps:
            builder = getattr(builder, name)(*args)
        return builder.conflict_retries(retries).retry_timeout(self._timeout)

    def _check_source(self, source: WriteSource) -> None:
        table = self._dataset.schema
        for name in self._on:
            if name not in source.schema.names:
                raise SchemaMismatchError(f"the source lacks join column {name!r}", field=name)
        for field in source.schema:
            target = table.field(field.name) if field.name in table.names else None
            if target is None:
                raise SchemaMismatchError(
                    f"the source has column {field.name!r}, which the table lacks", field=field.name
                )
            if not target.type.equals(field.type):
                raise SchemaMismatchError(
                    f"column {field.name!r} is {field.type} in the source but {target.type} "
                    "in the table",
                    field=field.name,
                )

    async def _prepare(self, source: Any, schema: pa.Schema | None) -> WriteSource:
        src = await resolve_source(source, schema=schema)
        self._check_source(src)
        if self._duplicates == "keep_last" and src.mode is not SourceMode.MATERIALIZED:
            src = await _materialize(src)
        batches = src.batches() if src.mode is SourceMode.MATERIALIZED else None
        if batches:
            table = await run_sync(lambda: _check_keys(batches, self._key_sets(), self._duplicates))
            if table is not None:  # keep_last dropped earlier occurrences
                src = await resolve_source(table)
        return src

    def _key_sets(self) -> list[list[str]]:
        """Columns whose values must be unique in a source: the join key and,
        when it differs, the table's primary key (rows inserted with a repeated
        primary key would break it)."""
        sets = [list(self._on)]
        pk = self._dataset.primary_key
        if pk and sorted(pk) != sorted(self._on):
            sets.append(pk)
        return sets

    def _serialize(self) -> AbstractContextManager[Any]:
        """The lock an attempt holds from checkout to commit: the table's
        insert lock when this merge can insert and the table declares no
        primary key (Lance would let two such inserts of one key both
        commit), else nothing."""
        inserts = any(name == "when_not_matched_insert_all" for name, _ in self._steps)
        if inserts and not self._dataset.primary_key:
            return _insert_lock(self._dataset.uri)
        return nullcontext()

    def _guard(self) -> _PassGuard:
        keep_empty = any(  # these act even on an empty source (a compaction's mark)
            name in ("when_not_matched_by_source_delete", "mark_sstables_as_compacted")
            for name, _ in self._steps
        )
        return _PassGuard(self._key_sets(), keep_empty=keep_empty)

    # -- execution -----------------------------------------------------------
    async def execute(self, source: Any, *, schema: pa.Schema | None = None) -> MergeResult:
        """Run the upsert and commit it, retrying conflicts by source mode.

        Parameters
        ----------
        source : anything :func:`~lance_async.coerce_source` accepts
            The new rows. Pass ``lance_async.replayable(factory, schema=...)``
            to promise repeatability.
        schema : pa.Schema, optional
            The source's schema (needed only for an empty list; saves peeking
            at the first batch of an iterator).

        Returns
        -------
        MergeResult
            ``committed`` is False, and no version was made, when the source
            held no rows (and no ``when_not_matched_by_source_delete`` asked
            for a run all the same).

        Raises
        ------
        SchemaMismatchError
            The source's columns do not fit the table (before anything runs),
            or a batch drifts (nothing committed); in-memory rows with a null
            join key.
        DuplicateKeyError
            The source repeats a join key (unless ``duplicate_keys("keep_last")``):
            in-memory rows are checked on a worker thread before anything
            runs; streamed and replayable sources as they stream (their key
            columns are kept until the pass ends), raised before the engine
            sees the end, so nothing is committed.
        SourceChangedError
            A replay gave another schema or changed files (nothing committed).
        ContentionError
            Every attempt lost to concurrent writers (``num_attempts`` says how
            many ran).
        ConflictError
            A conflict that no retry can cure (``retryable`` False).
        BaseException
            An error raised by the source itself, unchanged (nothing committed).
        """
        src = await self._prepare(source, schema)
        if src.mode is SourceMode.REPLAYABLE:
            return await self._execute_replayable(src)
        return await self._execute_once(src)

    def _record(
        self, target: LanceDataset, stats: Any, attempts: int, mode: SourceMode
    ) -> MergeResult:
        ins, upd, dele = _stats(stats)
        result = MergeResult(ins, upd, dele, attempts, mode, int(target.version))
        self.last_result = result
        self._dataset._replace(target)
        return result

    def _on_cancel(
        self, mode: SourceMode, attempts: int
    ) -> Callable[[Any, BaseException | None], None]:
        def handle(outcome: Any, error: BaseException | None) -> None:
            if error is None and outcome is not None:
                target, stats = outcome
                result = self._record(target, stats, attempts, mode)
                log.warning(
                    "lance_async: merge_insert committed version %d of %s, but the awaiting "
                    "task was cancelled; see AsyncMergeInsertBuilder.last_result",
                    result.version,
                    self._dataset.uri,
                )

        return handle

    async def _run_pass(
        self,
        src: WriteSource,
        work: Callable[[Any], T],
        *,
        on_cancel_result: Callable[[T | None, BaseException | None], None] | None = None,
        source_must_succeed: bool = False,
    ) -> T:
        """``work(data)`` on an engine thread over one pass of ``src``.

        ``data`` is the rows as one table for in-memory sources, a fresh
        reader otherwise, or None when the pass holds no rows (see
        :class:`_PassGuard`). A failing source's own error replaces the
        engine's text-only version of it; with ``source_must_succeed`` it is
        raised even when the engine call returned.
        """
        guard = self._guard()
        async with src.reader_plan() as plan:
            try:
                result = await run_sync(
                    lambda: work(guard.wrap(plan.data())), on_cancel_result=on_cancel_result
                )
            except BaseException as exc:
                guard.reraise(exc)
                plan.reraise(exc)
                raise
            if source_must_succeed and plan.error is not None:
                raise plan.error
            return result

    async def _attempt(self, src: WriteSource, retries: int, attempts: int) -> MergeResult:
        """One pass of the source through one engine merge."""
        base = self._dataset.lance
        lock = self._serialize()

        def work(data: Any) -> tuple[LanceDataset, Any] | None:
            if data is None:
                return None  # no rows: nothing to merge, no empty version
            with lock:
                target = base.checkout_version(base.latest_version)
                return target, self._build(target, retries).execute(data)

        outcome = await self._run_pass(
            src, work, on_cancel_result=self._on_cancel(src.mode, attempts)
        )
        if outcome is None:
            log.info(
                "lance_async: merge_insert into %s: the source held no rows; nothing was committed",
                self._dataset.uri,
            )
            result = MergeResult(0, 0, 0, attempts, src.mode, self._dataset.version, False)
            self.last_result = result
            return result
        target, stats = outcome
        return self._record(target, stats, attempts, src.mode)

    async def _execute_once(self, src: WriteSource) -> MergeResult:
        try:
            return await self._attempt(src, self._retries, 1)
        except (OSError, ValueError, RuntimeError) as exc:
            mapped = map_engine_error(exc)
            if isinstance(mapped, ConflictError) and mapped.retryable:
                match = _RETRIES_RE.search(str(exc))
                attempts = int(match.group(1)) + 1 if match else 1
                raise ContentionError(
                    f"merge_insert into {self._dataset.uri} lost to concurrent writers after "
                    f"{attempts} attempt(s) ({src.mode.value} source: "
                    + (
                        "no replay possible; pass a replayable source or raise conflict_retries)"
                        if src.mode is SourceMode.STREAMING
                        else "Lance's own retries)"
                    ),
                    num_attempts=attempts,
                ) from exc
            if mapped is not None:
                raise mapped from exc
            raise

    async def _execute_replayable(self, src: WriteSource) -> MergeResult:
        deadline = time.monotonic() + self._timeout.total_seconds()
        attempts = 0
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                return await self._attempt(src, 0, attempts)
            except (OSError, ValueError, RuntimeError) as exc:
                mapped = map_engine_error(exc)
                if not (isinstance(mapped, ConflictError) and mapped.retryable):
                    if mapped is not None:
                        raise mapped from exc
                    raise
                took = time.monotonic() - started
                delay = backoff_delay(attempts, took)
                if attempts > self._retries or time.monotonic() + delay > deadline:
                    raise ContentionError(
                        f"merge_insert into {self._dataset.uri} lost to concurrent writers "
                        f"{attempts} time(s); retries exhausted (conflict_retries="
                        f"{self._retries}, retry_timeout={self._timeout.total_seconds():g}s)",
                        num_attempts=attempts,
                    ) from exc
                log.debug(
                    "lance_async: merge_insert attempt %d conflicted; replaying in %.3f s",
                    attempts,
                    delay,
                )
            await anyio.sleep(delay)

    async def execute_uncommitted(
        self, source: Any, *, schema: pa.Schema | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Run the merge without committing; the source is read once.

        Returns
        -------
        tuple of (lance.Transaction, dict)
            The transaction to commit later (``LanceDataset.commit``) and the
            row counts.

        Raises
        ------
        SchemaMismatchError, BaseException
            As :meth:`execute` (no retries: nothing is committed here).
        """
        src = await self._prepare(source, schema)
        base = self._dataset.lance

        def work(data: Any) -> tuple[Any, dict[str, Any]]:
            if data is None:
                data = pa.RecordBatchReader.from_batches(src.schema, [])
            txn, stats = self._build(base, 0).execute_uncommitted(data)
            return txn, dict(stats)

        try:
            return await self._run_pass(src, work)
        except (OSError, ValueError, RuntimeError) as exc:
            raise_mapped(exc)
            raise

    async def analyze_plan(self, source: Any, *, schema: pa.Schema | None = None) -> str:
        """Run the merge to collect metrics, without committing; returns the
        annotated plan. The source is read the same way :meth:`execute` reads
        it (in memory for MATERIALIZED sources, streamed otherwise).

        Raises
        ------
        BaseException
            The source's own error when it fails: never a plan that looks fine.
        """
        src = await self._prepare(source, schema)
        base = self._dataset.lance

        def work(data: Any) -> str:
            if data is None:
                data = pa.RecordBatchReader.from_batches(src.schema, [])
            return str(self._build(base, 0).analyze_plan(data))

        return await self._run_pass(src, work, source_must_succeed=True)

    async def explain_plan(self, schema: pa.Schema | None = None, verbose: bool = False) -> str:
        """The plan Lance would run for a streamed source of ``schema``
        (default: the table's schema). Writes nothing."""
        base = self._dataset.lance
        return str(
            await run_sync(lambda: self._build(base, 0).explain_plan(schema, verbose=verbose))
        )


_insert_locks: dict[str, threading.Lock] = {}
_insert_locks_guard = threading.Lock()
_warned: set[str] = set()


def _table_key(uri: str) -> str:
    return uri if "://" in uri else os.path.realpath(uri)


def _insert_lock(uri: str) -> threading.Lock:
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
            )
        return lock


def _check_keys(
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


async def _materialize(src: WriteSource) -> WriteSource:
    """Read a streamed or replayable source into memory (``keep_last`` needs every key)."""
    async with src.reader() as reader:
        table = await run_sync(reader.read_all)
    return await resolve_source(table)


class _PassGuard:
    """One pass of a source on its way into the engine (blocking; worker thread).

    Finds an empty pass before the engine runs (so an empty source commits
    nothing) and a join key repeated anywhere in a streamed pass (raised
    before the engine sees the end of the stream, so nothing commits). The
    error is kept, since the engine turns it into text.
    """

    def __init__(self, key_sets: Sequence[Sequence[str]], *, keep_empty: bool) -> None:
        self.key_sets = [list(keys) for keys in key_sets]
        self.keep_empty = keep_empty
        self.error: BaseException | None = None

    def wrap(self, data: pa.Table | pa.RecordBatchReader) -> Any:
        if isinstance(data, pa.Table):  # in memory: checked by _check_keys already
            return data if data.num_rows or self.keep_empty else None
        batches = iter(data)
        first = None
        try:
            for batch in batches:
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
