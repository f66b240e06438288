"""``AsyncMergeInsertBuilder``: merge_insert on worker threads, conflicts retried by replay.

The retry strategy per source mode, tables without a primary key and the
cancellation rule are described in the package docstring (``merge/__init__.py``);
the MemWAL path (``via_mem_wal``) in ``mem_wal.py``; the checks of a pass
of the source in ``passes.py``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import pyarrow as pa
from lance.dataset import LanceDataset

from .._args import check_choice, check_int, check_timedelta
from .._duplicates import DUPLICATE_POLICIES
from .._loop import unwrap_groups
from .._metrics import record_merge
from .._table import Table
from .._threads import run_sync
from ..errors import (
    ConflictError,
    ContentionError,
    MergeShapeError,
    SchemaMismatchError,
    map_engine_error,
    raise_mapped,
)
from ..memwal.acks import PutSummary
from ..sources import SourceMode, WriteSource, resolve_source
from .passes import PassGuard, check_keys, insert_lock, materialize, read_keys, read_whole
from .result import MergeResult, backoff_delay, engine_stats
from .route import check_base_keys, choose_route, whole_rows
from .via_mem_wal import (
    MemWalWriter,
    check_join,
    check_step,
    check_writer,
    mem_wal_kind,
    put_via_mem_wal,
)

__all__ = ["AsyncMergeInsertBuilder", "MergeResult", "backoff_delay"]

log = logging.getLogger("lance_async.merge")
T = TypeVar("T")

_RETRIES_RE = re.compile(r"Attempted (\d+) retries")


class AsyncMergeInsertBuilder:
    """Configure and run an upsert, like ``lance.MergeInsertBuilder`` (pylance).

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

    def __init__(self, dataset: Table, on: str | Iterable[str] | None) -> None:
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
        self._mem_wal = False
        self._base = False
        self._writer: MemWalWriter | None = None
        self.last_result: MergeResult | None = None

    # -- configuration (mirrors pylance) -----------------------------------
    def _add(self, name: str, *args: Any) -> AsyncMergeInsertBuilder:
        if self._mem_wal:
            check_step(name, args)
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
        """Retries after a commit conflict (default 10; 0 fails at once;
        ValueError below 0). Through the MemWAL there are no commits to retry."""
        self._retries = check_int("conflict_retries", max_retries, minimum=0)
        return self

    def retry_timeout(self, timeout: timedelta) -> AsyncMergeInsertBuilder:
        """Time budget for retries (default 30 s); the first attempt always runs
        (TypeError for anything but a timedelta, ValueError when negative)."""
        self._timeout = check_timedelta("retry_timeout", timeout)
        return self

    def use_index(self, use_index: bool) -> AsyncMergeInsertBuilder:
        """Whether to use an index on the join key (default True)."""
        return self._add("use_index", use_index)

    def write_mode(self, mode: str) -> AsyncMergeInsertBuilder:
        """``"auto"``, ``"rewrite_rows"`` or ``"rewrite_columns"`` (see pylance;
        ValueError for another)."""
        return self._add(
            "write_mode", check_choice("mode", mode, ("auto", "rewrite_rows", "rewrite_columns"))
        )

    def data_storage_version(self, version: str) -> AsyncMergeInsertBuilder:
        """File format version for the files this merge writes."""
        return self._add("data_storage_version", version)

    def mark_sstables_as_compacted(self, sstables: Sequence[Any]) -> AsyncMergeInsertBuilder:
        """Record, in the merge's own commit, that MemWAL SSTables were compacted
        (a list of ``lance.mem_wal.CompactedSsTable``; at most one per shard)."""
        return self._add("mark_sstables_as_compacted", list(sstables))

    def via_mem_wal(self, writer: MemWalWriter | None = None) -> AsyncMergeInsertBuilder:
        """Send this upsert to the table's MemWAL instead of committing it to
        the base table (LanceDB's LSM write path for ``merge_insert``).

        :meth:`execute` then puts the source rows into the shard writers --
        each row to its own shard, by the table's sharding -- and resolves
        once the writer acknowledged them (durable in the WAL with
        ``durable_write``, the default). No version is committed: LSM reads
        (``lsm_scan``, ``lsm_point_lookup``, a writer's reads) see the rows
        at once, base-table reads after :meth:`AsyncDataset.compact_mem_wal`,
        which leaves the table as the base-table merge would have. See
        ``docs/parity.md`` for when to use which path.

        Two shapes have a MemWAL form: ``when_matched_update_all()`` with
        ``when_not_matched_insert_all()`` (every row put; columns the source lacks
        keep the stored value, or are null for a new key),
        and ``when_matched_delete()`` alone (every source key deleted). The
        join is on the primary key. The source is read whole into memory
        and its keys checked (``duplicate_keys``) before anything is sent,
        so a bad row anywhere sends nothing.

        Parameters
        ----------
        writer : ShardRouter or AsyncShardWriter, optional
            An open writer of this table to send through (the one an app
            already holds for its ingest: many merges then share its
            coalesced puts). By default a routing writer is opened for the
            one call and closed after it: that claims the shards it writes,
            fencing any other writer of them (in this process or another),
            and flushes a generation per shard it wrote at close. Pass a
            writer wherever one is open.

        Returns
        -------
        AsyncMergeInsertBuilder
            ``self`` (does not block).

        Raises
        ------
        MergeShapeError
            A clause given so far, or later, has no MemWAL form (a condition,
            ``when_matched_fail``, ``when_not_matched_by_source_delete``,
            base-table settings), or the join is not on the primary key; at
            :meth:`execute`, a combination with none (insert only, update
            only). A ValueError.
        TypeError, ValueError
            ``writer`` is not a writer of this table's schema.
        InvalidInputError
            The table declares no primary key.

        Notes
        -----
        Cancellation: once the rows are queued in the writer they are written
        whatever happens to the awaiting task (the writer's rule); a routing
        writer opened for the call is closed shielded, flushing them.
        """
        checked = check_writer(writer, self._dataset.schema)
        check_join(self._on, self._dataset.primary_key)
        for name, args in self._steps:
            check_step(name, args)
        self._mem_wal = True
        self._base = False
        self._writer = checked
        return self

    def via_base_table(self) -> AsyncMergeInsertBuilder:
        """Merge into the base table even though the table has a MemWAL.

        On a table with a MemWAL, merges go through it by default (the one
        write rule, as LanceDB routes ``merge_insert`` once a write spec is
        set; see ``merge/route.py``). This asks for the base table instead:
        a new version, committed as on a table without a MemWAL. Because
        compaction later writes the MemWAL's row of a key over the base
        table's, :meth:`execute` refuses it while the MemWAL holds any of the
        source's keys in generations not compacted yet, or holds rows not
        flushed yet (:class:`~lance_async.errors.InvalidInputError` saying
        what to do; nothing is committed). On a table without a MemWAL it
        changes nothing.

        Returns
        -------
        AsyncMergeInsertBuilder
            ``self`` (does not block).
        """
        self._mem_wal = False
        self._base = True
        self._writer = None
        return self

    def _refuse_mem_wal(self, call: str) -> None:
        if self._mem_wal:
            raise MergeShapeError(
                f"{call}() has no MemWAL form (the MemWAL commits no transaction and plans "
                "no join): leave out via_mem_wal()",
                clause="via_mem_wal",
            )

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
        src = await resolve_source(source, schema=schema, rows_into=self._dataset.schema)
        self._check_source(src)
        if self._duplicates == "keep_last" and src.mode is not SourceMode.MATERIALIZED:
            src = await materialize(src)
        batches = src.batches() if src.mode is SourceMode.MATERIALIZED else None
        if batches:
            table = await run_sync(lambda: check_keys(batches, self._key_sets(), self._duplicates))
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
            return insert_lock(self._dataset.uri)
        return nullcontext()

    def _guard(self) -> PassGuard:
        keep_empty = any(  # these act even on an empty source (a compaction's mark)
            name in ("when_not_matched_by_source_delete", "mark_sstables_as_compacted")
            for name, _ in self._steps
        )
        return PassGuard(self._key_sets(), keep_empty=keep_empty, stop=threading.Event())

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
        asked = "mem_wal" if self._mem_wal else "base" if self._base else "auto"
        marks = any(name == "mark_sstables_as_compacted" for name, _ in self._steps)
        route = await choose_route(self._dataset, asked, marks=marks)
        if route == "mem_wal":
            return await self._execute_mem_wal(source, schema, explicit=self._mem_wal)
        src = await self._prepare(source, schema)
        if route == "checked_base":
            await check_base_keys(self._dataset, await read_keys(src, self._dataset.primary_key))
        if src.mode is SourceMode.REPLAYABLE:
            return await self._execute_replayable(src)
        return await self._execute_once(src)

    async def _execute_mem_wal(
        self, source: Any, schema: pa.Schema | None, *, explicit: bool = True
    ) -> MergeResult:
        """The MemWAL path: the source read whole and checked, then one put.

        ``explicit``: asked for with ``via_mem_wal()``; otherwise chosen by
        the write rule, and a merge with no MemWAL form says how to reach the
        base table instead.
        """
        try:
            if not explicit:
                check_join(self._on, self._dataset.primary_key)
            kind = mem_wal_kind(self._steps)
        except MergeShapeError as exc:
            if explicit:
                raise
            raise MergeShapeError(
                f"{self._dataset.uri} has a MemWAL, so merges go through it (as LanceDB routes "
                f"merge_insert once a write spec is set): {exc}",
                clause=exc.clause,
            ) from exc
        src = await resolve_source(source, schema=schema, rows_into=self._dataset.schema)
        self._check_source(src)
        rows = await read_whole(src)
        if rows.num_rows:
            batches = rows.to_batches()
            deduped = await run_sync(
                lambda: check_keys(batches, self._key_sets(), self._duplicates)
            )
            if deduped is not None:
                rows = deduped
            if kind == "upsert":  # the columns the source lacks: stored values, or null
                rows = await whole_rows(self._dataset, rows)
            # all rows or none: once the put starts it ends, even for a cancelled caller
            with anyio.CancelScope(shield=True):
                summary = await put_via_mem_wal(self._dataset, self._writer, kind, rows)
        else:
            summary = PutSummary(0, 0, 0)
        written = summary.rows + summary.deletes > 0
        result = MergeResult(
            0, 0, 0, 1, src.mode, self._dataset.version, committed=written, mem_wal=summary
        )
        self.last_result = result
        await anyio.lowlevel.checkpoint_if_cancelled()
        return result

    def _record(
        self, target: LanceDataset, stats: Any, attempts: int, mode: SourceMode
    ) -> MergeResult:
        ins, upd, dele = engine_stats(stats)
        result = MergeResult(ins, upd, dele, attempts, mode, int(target.version))
        record_merge(self._dataset.uri, attempts)
        self.last_result = result
        self._dataset.advance(target)
        return result

    def _on_cancel(
        self, mode: SourceMode, attempts: int
    ) -> Callable[[Any, BaseException | None], None]:
        def handle(outcome: Any, error: BaseException | None) -> None:
            if error is None and outcome is not None:
                target, stats = outcome
                self._warn_cancelled(self._record(target, stats, attempts, mode))

        return handle

    def _warn_cancelled(self, result: MergeResult) -> None:
        log.warning(
            "lance_async: merge_insert committed version %d of %s, but the awaiting "
            "task was cancelled; see AsyncMergeInsertBuilder.last_result",
            result.version,
            self._dataset.uri,
            extra={"table": self._dataset.uri},
        )

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
        :class:`PassGuard`). A failing source's own error replaces the
        engine's text-only version of it; with ``source_must_succeed`` it is
        raised even when the engine call returned.
        """
        guard = self._guard()
        stop = guard.stop
        assert stop is not None

        async def stop_on_cancel() -> None:
            try:
                await anyio.sleep_forever()
            finally:  # the awaiting task was cancelled: the engine's next batch stops it
                stop.set()

        async with src.reader_plan() as plan:
            try:
                with unwrap_groups():
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(stop_on_cancel)
                        result = await run_sync(
                            lambda: work(guard.wrap(plan.data())),
                            on_cancel_result=on_cancel_result,
                        )
                        tg.cancel_scope.cancel()
            except BaseException as exc:
                guard.reraise(exc)
                plan.reraise(exc)
                raise
            if source_must_succeed and plan.error is not None:
                raise plan.error
            return result

    async def _attempt(self, src: WriteSource, retries: int, attempts: int) -> MergeResult:
        """One pass of the source through one engine merge.

        A replayable source's merge (Lance's retries off: lance_async replays)
        runs in two engine calls, the merge uncommitted and then its commit, so
        a task cancelled before the commit commits nothing: its source stops
        at the next batch (``PassGuard.stop``) and the engine's work is
        dropped. The commit itself runs to its end, shielded, and is recorded.
        """
        base = self._dataset.lance
        lock = self._serialize()
        # pylance's uncommitted merge drops mark_sstables_as_compacted: compaction's
        # merges (which mark) commit in the one call
        marks = any(name == "mark_sstables_as_compacted" for name, _ in self._steps)
        split = src.mode is SourceMode.REPLAYABLE and isinstance(lock, nullcontext) and not marks

        def work(data: Any) -> tuple[LanceDataset, Any] | None:
            if data is None:
                return None  # no rows: nothing to merge, no empty version
            with lock:
                target = base.checkout_version(base.latest_version)
                if split:
                    return target, self._build(target, retries).execute_uncommitted(data)
                return target, self._build(target, retries).execute(data)

        outcome = await self._run_pass(
            src, work, on_cancel_result=None if split else self._on_cancel(src.mode, attempts)
        )
        if outcome is not None and split:
            target, (txn, stats) = outcome
            await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled: nothing committed

            def commit() -> LanceDataset:
                return LanceDataset.commit(target, txn, max_retries=max(retries, 20))

            with anyio.CancelScope(shield=True):
                committed = await run_sync(commit)
                result = self._record(committed, stats, attempts, src.mode)
            try:
                await anyio.lowlevel.checkpoint_if_cancelled()
            except anyio.get_cancelled_exc_class():
                self._warn_cancelled(result)
                raise
            return result
        if outcome is None:
            log.info(
                "lance_async: merge_insert into %s: the source held no rows; nothing was committed",
                self._dataset.uri,
                extra={"table": self._dataset.uri},
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
                    extra={"table": self._dataset.uri},
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
        self._refuse_mem_wal("execute_uncommitted")
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
        self._refuse_mem_wal("analyze_plan")
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
        self._refuse_mem_wal("explain_plan")
        base = self._dataset.lance
        return str(
            await run_sync(lambda: self._build(base, 0).explain_plan(schema, verbose=verbose))
        )
