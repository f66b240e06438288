"""``AsyncMergeInsertBuilder``: merge_insert on worker threads, conflicts retried by replay.

The builder holds the configuration and picks the path: the MemWAL
(``via_mem_wal.py``), a group commit with concurrent upserts
(``coalesce.py``), or the upsert alone (``attempt.py``: one engine merge per
attempt, replayed after a conflict). The retry strategy per source mode,
tables without a primary key and the cancellation rule are described in the
package docstring (``merge/__init__.py``); the checks of a pass of the
source in ``passes.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import anyio
import pyarrow as pa
from lance.dataset import LanceDataset

from .._args import check_choice, check_int, check_timedelta
from .._duplicates import DUPLICATE_POLICIES
from .._engine_errors import raise_mapped
from .._metrics import record_merge
from .._schema import primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import MergeShapeError, SchemaMismatchError
from ..memwal.acks import PutSummary
from ..sources import SourceMode, WriteSource, resolve_source
from .attempt import MergeSpec, Outcome, once, replayed, replays, run_pass
from .coalesce import COALESCE_BYTES, COALESCE_ROWS, coalesced, group_shape
from .passes import (
    PassGuard,
    check_keys,
    check_required,
    materialize,
    read_keys,
    read_whole,
)
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

#: The clauses that say what a merge does with a row (the rest are settings).
_CLAUSES = frozenset(
    {
        "when_matched_update_all",
        "when_matched_delete",
        "when_matched_fail",
        "when_not_matched_insert_all",
        "when_not_matched_by_source_delete",
    }
)


def _sql(name: str, value: object) -> str | None:
    """A clause's SQL condition, checked at the call (pylance would raise a
    TypeError only when the merge is built, on a worker thread)."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string of SQL or None, not {type(value).__name__}")
    return value


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
        named = None if on is None else [on] if isinstance(on, str) else list(on)
        if not named:  # None or no column: the primary key (pylance and LanceDB read [] so)
            keys = dataset.primary_key
            if not keys:
                raise ValueError(
                    "merge_insert() with no join column uses the primary key, but the schema "
                    "marks none; pass on='column' or add the "
                    "lance-schema:unenforced-primary-key metadata"
                )
            self._on = keys
        else:
            self._on = named
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
        self._coalesce: tuple[int, int] | None = (COALESCE_ROWS, COALESCE_BYTES)
        self.last_result: MergeResult | None = None

    # -- configuration (mirrors pylance) -----------------------------------
    def _add(self, name: str, *args: Any) -> AsyncMergeInsertBuilder:
        if self._mem_wal:
            check_step(name, args)
        self._steps.append((name, args))
        return self

    def when_matched_update_all(self, condition: str | None = None) -> AsyncMergeInsertBuilder:
        """Update target rows that match a source row (optionally only where
        the SQL ``condition`` over ``source.`` / ``target.`` columns holds).

        Raises
        ------
        TypeError
            ``condition`` is not a string of SQL (at the call).
        """
        return self._add("when_matched_update_all", _sql("condition", condition))

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
        the SQL ``expr`` when given). Called again, the last call's ``expr``
        holds (none: every such row), as in pylance.

        Raises
        ------
        TypeError
            ``expr`` is not a string of SQL (at the call; LanceDB also takes
            its own expression objects, pylance and lance_async SQL only).
        """
        return self._add("when_not_matched_by_source_delete", _sql("expr", expr))

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

    def coalesce(
        self,
        enabled: bool = True,
        *,
        max_rows: int = COALESCE_ROWS,
        max_bytes: int = COALESCE_BYTES,
    ) -> AsyncMergeInsertBuilder:
        """Whether this upsert may share one commit with concurrent ones (group commit).

        On by default. While another upsert of the same table, join columns,
        clauses and source columns is in flight in this event loop, this one
        waits with the others that arrive, and all of them then run as one
        engine merge: one commit, one version, rows applied in arrival order
        (the last upsert of a key wins; for insert-only merges the first),
        each caller with its own counts (``MergeResult.group_size`` says how
        many shared the commit). A lone upsert never waits. See
        ``merge/coalesce.py`` for the rules; pylance and LanceDB commit every
        call.

        Only plain clauses coalesce: ``when_matched_update_all()`` and/or
        ``when_not_matched_insert_all()`` without a condition, through the
        base table, from an in-memory source or a replayable one of at most
        ``max_bytes`` (read into memory to join); any other merge runs alone.

        Parameters
        ----------
        enabled : bool
            False: always run alone (one commit per call, as pylance).
        max_rows : int
            Rows a pending group holds at most (default 1,000,000); an upsert
            that does not fit waits for the next group (backpressure).
        max_bytes : int
            Bytes of Arrow data a pending group holds at most (default 64
            MiB); a source larger than that runs alone at once.

        Returns
        -------
        AsyncMergeInsertBuilder
            ``self`` (does not block).

        Raises
        ------
        TypeError, ValueError
            ``max_rows`` or ``max_bytes`` not an int of at least 1.
        """
        rows = check_int("max_rows", max_rows, minimum=1)
        nbytes = check_int("max_bytes", max_bytes, minimum=1)
        self._coalesce = (rows, nbytes) if enabled else None
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
        (``ds.lsm.scan``, ``ds.lsm.point_lookup``, a writer's ``lsm`` reads) see the rows
        at once, base-table reads after :meth:`AsyncDataset.compact_mem_wal`,
        which leaves the table as the base-table merge would have. See
        ``docs/upserts.md`` for when to use which path.

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

    def _check_clauses(self) -> None:
        """A merge with no clause changes nothing: pylance refuses it with a
        ``ValueError`` from the engine; here it is refused before any I/O."""
        if not any(name in _CLAUSES for name, _ in self._steps):
            raise MergeShapeError(
                "merge_insert has no clause, so it would change nothing: add "
                "when_matched_update_all(), when_not_matched_insert_all(), when_matched_delete(), "
                "when_matched_fail() or when_not_matched_by_source_delete(); nothing was read",
                clause=None,
            )

    # -- building -----------------------------------------------------------
    def _check_source(self, source: WriteSource) -> None:
        table = self._dataset.schema
        for name in self._on:
            if name not in source.schema.names:
                raise SchemaMismatchError(f"the source lacks join column {name!r}", field=name)
        for name in primary_key(source.schema):
            if source.schema.field(name).nullable:  # Lance refuses it with an untyped OSError
                raise SchemaMismatchError(
                    f"the source's schema marks column {name!r} as a primary key (field "
                    "metadata lance-schema:unenforced-primary-key) but lets it be null, which "
                    "Lance refuses; make the field non-nullable or drop the source's field "
                    "metadata (the table's schema names the key); nothing was written",
                    field=name,
                )
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
            table = await run_sync(lambda: self._check_rows(batches))
            if table is not None:  # keep_last dropped earlier occurrences
                src = await resolve_source(table)
        return src

    def _check_rows(self, batches: list[pa.RecordBatch]) -> pa.Table | None:
        """In-memory rows: keys never null nor repeated, non-nullable columns
        without nulls (blocking); the deduplicated rows under ``keep_last``."""
        check_required(batches, self._dataset.schema)
        return check_keys(batches, self._key_sets(), self._duplicates)

    def _spec(self) -> MergeSpec:
        return MergeSpec(
            self._dataset, tuple(self._on), tuple(self._steps), self._retries, self._timeout
        )

    def _key_sets(self) -> list[list[str]]:
        return self._spec().key_sets

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
        MergeShapeError
            No clause (the merge would change nothing; pylance's engine
            refuses it with a ValueError), before anything is read; on a
            table with a MemWAL, a shape it has no form for.
        InvalidInputError
            ``when_matched_fail()`` and a source key the table holds (the
            engine's "found matching row"; nothing was committed).
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
        self._check_clauses()
        asked = "mem_wal" if self._mem_wal else "base" if self._base else "auto"
        marks = any(name == "mark_sstables_as_compacted" for name, _ in self._steps)
        route = await choose_route(self._dataset, asked, marks=marks)
        if route == "mem_wal":
            return await self._execute_mem_wal(source, schema, explicit=self._mem_wal)
        src = await self._prepare(source, schema)
        if route == "checked_base":
            await check_base_keys(self._dataset, await read_keys(src, self._dataset.primary_key))
        spec = self._spec()
        shape = group_shape(spec.steps) if self._coalesce is not None else None
        if shape is not None and replays(src):
            max_rows, max_bytes = self._coalesce or (COALESCE_ROWS, COALESCE_BYTES)
            return await coalesced(
                spec,
                shape,
                src,
                solo=lambda: self._execute_alone(spec, src),
                settle=self._settle,
                warn_cancelled=self._warn_cancelled,
                max_rows=max_rows,
                max_bytes=max_bytes,
            )
        return await self._execute_alone(spec, src)

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

    def _settle(self, result: MergeResult, committed: LanceDataset) -> None:
        """A committed result: metrics, ``last_result``, the table moved on."""
        record_merge(self._dataset.uri, result.num_attempts)
        self.last_result = result
        self._dataset._advance(committed)

    def _result(self, outcome: Outcome, attempts: int, mode: SourceMode) -> MergeResult:
        ins, upd, dele = engine_stats(outcome.stats)
        result = MergeResult(ins, upd, dele, attempts, mode, int(outcome.target.version))
        self._settle(result, outcome.target)
        return result

    def _warn_cancelled(self, result: MergeResult) -> None:
        log.warning(
            "lance_async: merge_insert committed version %d of %s, but the awaiting "
            "task was cancelled; see AsyncMergeInsertBuilder.last_result",
            result.version,
            self._dataset.uri,
            extra={"table": self._dataset.uri},
        )

    async def _execute_alone(self, spec: MergeSpec, src: WriteSource) -> MergeResult:
        """This upsert by itself, replayed by lance_async after a conflict: an
        in-memory source from memory, a replayable one by its factory, a
        streamed one from the spool its first pass left."""

        def cancelled(outcome: Outcome, attempts: int) -> None:
            self._warn_cancelled(self._result(outcome, attempts, src.mode))

        if replays(src):
            outcome, attempts = await replayed(spec, src, on_cancel=cancelled)
        else:
            outcome, attempts = await once(spec, src, on_cancel=cancelled)
        if outcome is None:
            log.info(
                "lance_async: merge_insert into %s: the source held no rows; nothing was committed",
                self._dataset.uri,
                extra={"table": self._dataset.uri},
            )
            result = MergeResult(0, 0, 0, attempts, src.mode, self._dataset.version, False)
            self.last_result = result
            return result
        return self._result(outcome, attempts, src.mode)

    async def execute_uncommitted(
        self, source: Any, *, schema: pa.Schema | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Run the merge without committing; the source is read once.

        pylance's twin, for transactions committed elsewhere. Beware: pylance
        14's commit of such a transaction (``AsyncDataset.commit``) does not
        check that the keys it inserts are still absent, so two of them
        inserting the same new key both commit; :meth:`execute` does not
        have that gap.

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
        self._check_clauses()
        src = await self._prepare(source, schema)
        base = self._dataset.lance

        def work(data: Any, guard: PassGuard) -> tuple[Any, dict[str, Any]]:
            if data is None:
                data = pa.RecordBatchReader.from_batches(src.schema, [])
            if not guard.streamed:
                guard.commit_point()
            txn, stats = self._spec().build(base, 0).execute_uncommitted(data)
            return txn, dict(stats)

        try:
            return await run_pass(self._spec(), src, work)
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
        self._check_clauses()
        src = await self._prepare(source, schema)
        base = self._dataset.lance

        def work(data: Any, guard: PassGuard) -> str:
            if data is None:
                data = pa.RecordBatchReader.from_batches(src.schema, [])
            if not guard.streamed:
                guard.commit_point()
            return str(self._spec().build(base, 0).analyze_plan(data))

        return await run_pass(self._spec(), src, work, source_must_succeed=True)

    async def explain_plan(self, schema: pa.Schema | None = None, verbose: bool = False) -> str:
        """The plan Lance would run for a streamed source of ``schema``
        (default: the table's schema). Writes nothing.

        Raises
        ------
        MergeShapeError
            No clause; or a plan the engine cannot explain -- pylance 14
            explains no merge whose join goes through a scalar index on the
            key (``use_index(False)`` explains the hash join instead).
        """
        self._refuse_mem_wal("explain_plan")
        self._check_clauses()
        base = self._dataset.lance
        try:
            return str(
                await run_sync(
                    lambda: self._spec().build(base, 0).explain_plan(schema, verbose=verbose)
                )
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise_mapped(exc)
            raise
