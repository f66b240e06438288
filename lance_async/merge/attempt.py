"""One merge_insert attempt on an engine thread, and the loop that replays it.

:class:`MergeSpec` is what an upsert is, apart from its rows: the table, the
join columns, the clauses and the retry budget. :func:`attempt` runs one pass
of a source through one engine merge that commits in the same call;
:func:`replayed` repeats attempts with Lance's own retries off, replaying
the source after each conflict; :func:`once` is the single pass of a
streamed source.

Why every attempt commits in the engine's own call: pylance 14's
``execute_uncommitted`` + ``LanceDataset.commit`` loses the engine's check
that the new keys a merge inserts are still absent, so two merges inserting
the same key both commit (DESIGN.md, facts of 2026-12-06). ``execute()`` with
``conflict_retries(0)`` keeps the check: of two such merges one commits and
the other fails with a retryable conflict, which :func:`replayed` retries
against the new version. Every attempt is therefore a serial step: it commits
as if alone, or fails and is replayed.

Cancellation without the split: a pass's source stops at its next batch, and
at its end, once the awaiting task is cancelled (``PassGuard.stop``), and
the engine commits nothing. The end of the source is the commit point: once
the engine has read it, the attempt runs to its end in its thread, and a
commit it makes is handed to ``on_cancel`` (recorded, never lost).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple, TypeVar

import anyio
import anyio.lowlevel
from lance.dataset import LanceDataset

from .._engine_errors import map_engine_error, raise_mapped
from .._loop import unwrap_groups
from .._table import Table
from .._threads import run_sync, stream_limiter
from ..errors import ConflictError, ContentionError
from ..sources import SourceMode, WriteSource, replayable
from ..sources.spool import Spool
from .passes import PassGuard, merge_lock, warn_no_primary_key
from .result import backoff_delay

__all__ = ["SETTING_STEPS", "MergeSpec", "Outcome", "attempt", "group_shape", "once", "replayed"]

log = logging.getLogger("lance_async.merge")
T = TypeVar("T")

SLICE_ROWS = 65_536  # rows per batch of a spool's replay at most

Step = tuple[str, tuple[Any, ...]]

SETTING_STEPS = frozenset({"use_index", "write_mode", "data_storage_version"})
_SHAPES: dict[frozenset[Step], str] = {
    frozenset({("when_matched_update_all", (None,)), ("when_not_matched_insert_all", ())}): (
        "upsert"
    ),
    frozenset({("when_not_matched_insert_all", ())}): "insert",
    frozenset({("when_matched_update_all", (None,))}): "update",
}


def group_shape(steps: Sequence[Step]) -> str | None:
    """``"upsert"``, ``"insert"`` or ``"update"`` when merges with these steps
    can share one engine merge; None otherwise (conditions, deletes, fails,
    marks). Settings (``use_index``, ``write_mode``, ...) are allowed."""
    clauses = [(name, args) for name, args in steps if name not in SETTING_STEPS]
    try:
        if len(set(clauses)) != len(clauses):
            return None
        return _SHAPES.get(frozenset(clauses))
    except TypeError:  # an unhashable argument (a list of SSTables): not a plain clause
        return None


class Outcome(NamedTuple):
    """What a committed attempt left: the dataset at the version it committed,
    pylance's row counts, and the version the merge read."""

    target: LanceDataset
    stats: Any
    read_version: int


@dataclass(frozen=True)
class MergeSpec:
    """An upsert apart from its rows (does not block).

    Attributes
    ----------
    dataset : Table
        The target table.
    on : tuple of str
        Join columns.
    steps : tuple of (name, args)
        The ``MergeInsertBuilder`` calls, in order (clauses and settings).
    retries : int
        Conflicts retried at most (``conflict_retries``).
    timeout : timedelta
        Time the retries may take in all (``retry_timeout``); the first
        attempt always runs.
    """

    dataset: Table
    on: tuple[str, ...]
    steps: tuple[Step, ...]
    retries: int
    timeout: timedelta

    def build(self, target: LanceDataset, retries: int) -> Any:
        """pylance's ``MergeInsertBuilder`` on ``target`` with these steps."""
        builder = target.merge_insert(list(self.on))
        for name, args in self.steps:
            builder = getattr(builder, name)(*args)
        return builder.conflict_retries(retries).retry_timeout(self.timeout)

    def has(self, *names: str) -> bool:
        """True when any step is one of ``names``."""
        return any(name in names for name, _ in self.steps)

    @property
    def key_sets(self) -> list[list[str]]:
        """Columns whose values must be unique in a source: the join key and,
        when it differs, the table's primary key (rows inserted with a repeated
        primary key would break it)."""
        sets = [list(self.on)]
        pk = self.dataset.primary_key
        if pk and sorted(pk) != sorted(self.on):
            sets.append(pk)
        return sets

    def serialize(self, stop: threading.Event | None = None) -> AbstractContextManager[Any]:
        """The table's :class:`~.passes.MergeLock`, held by an attempt from
        checkout to commit: shared by plain upserts of a table with a declared
        primary key joined on it (Lance's own checks make those safe side by
        side), exclusive for every other merge -- those whose outcome for a key
        they leave unwritten depends on what they read (Lance would rebase
        them over a concurrent commit of that key), and inserting merges into
        a table without a primary key (Lance would let two inserts of one key
        both commit). ``stop`` ends the wait (:class:`~.passes.MergeStopped`)."""
        pk = self.dataset.primary_key
        if not pk and self.has("when_not_matched_insert_all"):
            warn_no_primary_key(self.dataset.uri)
        shared = bool(pk) and sorted(pk) == sorted(self.on) and group_shape(self.steps) == "upsert"
        return merge_lock(self.dataset.uri).hold(exclusive=not shared, stop=stop)

    def guard(self) -> PassGuard:
        """A fresh :class:`PassGuard` for one pass (with its stop event)."""
        keep_empty = self.has("when_not_matched_by_source_delete", "mark_sstables_as_compacted")
        return PassGuard(self.key_sets, keep_empty=keep_empty, stop=threading.Event())


async def run_pass(
    spec: MergeSpec,
    src: WriteSource,
    work: Callable[[Any, PassGuard], T],
    *,
    on_cancel_result: Callable[[T | None, BaseException | None], None] | None = None,
    source_must_succeed: bool = False,
) -> T:
    """``work(data, guard)`` on an engine thread over one pass of ``src``.

    ``data`` is the rows as one table for in-memory sources, a fresh
    reader otherwise, or None when the pass holds no rows (see
    :class:`PassGuard`); ``work`` calls ``guard.commit_point()`` right
    before its engine call when ``guard.streamed`` is False. A failing
    source's own error replaces the engine's text-only version of it; with
    ``source_must_succeed`` it is raised even when the engine call returned.

    Cancelled before the commit point -- a factory or iterator of the
    source blocked, or the engine still reading the stream -- the pass is
    abandoned: the cancellation is delivered at once, and the thread, once
    the source lets it go, stops at the next batch without committing.
    """
    guard = spec.guard()
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
                        lambda: work(guard.wrap(plan.data()), guard),
                        on_cancel_result=on_cancel_result,
                        # a bridged source ends at once when cancelled; a native one
                        # runs the user's code in this thread, which may block for ever
                        abandon_on_cancel=guard.try_abandon if src.native else None,
                        what=f"a merge_insert into {spec.dataset.uri}",
                    )
                    tg.cancel_scope.cancel()
        except BaseException as exc:
            guard.reraise(exc)
            plan.reraise(exc)
            raise
        if source_must_succeed and plan.error is not None:
            raise plan.error
        return result


async def attempt(
    spec: MergeSpec,
    src: WriteSource,
    retries: int,
    *,
    on_cancel: Callable[[Outcome], None] | None = None,
    tee: Spool | None = None,
) -> Outcome | None:
    """One pass of ``src`` through one engine merge that commits in the same call.

    Parameters
    ----------
    spec : MergeSpec
    src : WriteSource
        Read once.
    retries : int
        Lance's own conflict retries inside the call (0 whenever lance_async
        replays).
    on_cancel : callable, optional
        Called on the loop with the outcome of a commit that landed while the
        awaiting task was cancelled, before the cancellation is re-raised.
    tee : Spool, optional
        Copies the pass into this spool as the engine reads it (a streamed
        source's replay; sealed when the engine saw its end).

    Returns
    -------
    Outcome or None
        None when the pass held no rows (nothing ran, no version was made).

    Raises
    ------
    OSError, ValueError, RuntimeError
        The engine's errors, unmapped (the caller maps them).
    BaseException
        The source's own error (nothing committed).
    """
    base = spec.dataset.lance

    def work(data: Any, guard: PassGuard) -> Outcome | None:
        if data is None:
            return None  # no rows: nothing to merge, no empty version
        if tee is not None:
            data = tee.tee(data)
        with spec.serialize(guard.stop) as lease:
            guard.keep(lease)
            if not guard.streamed:
                guard.commit_point()
            target = base.checkout_version(base.latest_version)
            read = int(target.version)
            stats = spec.build(target, retries).execute(data)
            return Outcome(target, stats, read)

    def handed_over(outcome: Outcome | None, error: BaseException | None) -> None:
        if error is None and outcome is not None and on_cancel is not None:
            on_cancel(outcome)

    return await run_pass(spec, src, work, on_cancel_result=handed_over)


def _with_attempts(on_cancel: Callable[[Outcome, int], None], attempts: int, o: Outcome) -> None:
    on_cancel(o, attempts)


def _retryable(exc: BaseException) -> bool:
    mapped = map_engine_error(exc)
    return isinstance(mapped, ConflictError) and mapped.retryable


async def replayed(
    spec: MergeSpec,
    src: WriteSource,
    *,
    on_cancel: Callable[[Outcome, int], None] | None = None,
) -> tuple[Outcome | None, int]:
    """Attempts with Lance's retries off until one commits, replaying ``src``.

    Each attempt reads the target at its latest version and a fresh pass of
    ``src`` (a replayable source's factory is called again; in-memory rows
    are read again from memory). A retryable conflict is backed off
    (:func:`~lance_async.merge.backoff_delay`) and replayed, up to
    ``spec.retries`` retries within ``spec.timeout``.

    Parameters
    ----------
    spec : MergeSpec
    src : WriteSource
        MATERIALIZED or REPLAYABLE.
    on_cancel : callable, optional
        ``on_cancel(outcome, attempts)`` for a commit that landed while the
        awaiting task was cancelled.

    Returns
    -------
    (Outcome or None, int)
        The committed attempt (None: the source held no rows) and how many
        attempts ran.

    Raises
    ------
    ContentionError
        Every attempt lost to concurrent writers (``num_attempts`` says how many).
    LanceAsyncError
        Any other engine error, mapped; the source's own error unchanged.

    Notes
    -----
    Cancelled during an attempt, the attempt ends in its thread first (see
    the module docstring); cancelled during the backoff, nothing is in
    flight and nothing more is committed.
    """
    deadline = time.monotonic() + spec.timeout.total_seconds()
    attempts = 0
    while True:
        attempts += 1
        started = time.monotonic()
        try:
            handed = None if on_cancel is None else partial(_with_attempts, on_cancel, attempts)
            return await attempt(spec, src, 0, on_cancel=handed), attempts
        except (OSError, ValueError, RuntimeError) as exc:
            if not _retryable(exc):
                raise_mapped(exc)
                raise
            delay = backoff_delay(attempts, time.monotonic() - started)
            if attempts > spec.retries or time.monotonic() + delay > deadline:
                raise ContentionError(
                    f"merge_insert into {spec.dataset.uri} lost to concurrent writers "
                    f"{attempts} time(s); retries exhausted (conflict_retries="
                    f"{spec.retries}, retry_timeout={spec.timeout.total_seconds():g}s)",
                    num_attempts=attempts,
                ) from exc
            log.debug(
                "lance_async: merge_insert attempt %d conflicted; replaying in %.3f s",
                attempts,
                delay,
                extra={"table": spec.dataset.uri},
            )
        await anyio.sleep(delay)


async def once(
    spec: MergeSpec,
    src: WriteSource,
    *,
    on_cancel: Callable[[Outcome, int], None] | None = None,
    spool_dir: str | None = None,
) -> tuple[Outcome | None, int]:
    """A streamed (one-shot) source: one pass, spooled for a replay.

    With ``spec.retries > 0`` the pass is copied into a :class:`Spool` as
    the engine reads it (memory up to 4 MiB, then a temporary Arrow IPC
    file in ``spool_dir``; deleted at the end), and a conflict replays the
    spool through :func:`replayed` -- lance_async's retries instead of
    Lance's buffered ones, which keep up to about 100 MB of a stream in
    memory and whose attempts pylance does not count. With 0 retries a
    conflict fails at once.

    Returns
    -------
    (Outcome or None, int)
        As :func:`replayed` (the first pass counts as one attempt).

    Raises
    ------
    ContentionError
        The first pass lost with no retry allowed, or every replay lost.
    LanceAsyncError
        Any other engine error, mapped.
    """
    spool = Spool(spool_dir, SLICE_ROWS) if spec.retries > 0 else None
    started = time.monotonic()
    try:
        try:
            handed = None if on_cancel is None else partial(_with_attempts, on_cancel, 1)
            return await attempt(spec, src, 0, on_cancel=handed, tee=spool), 1
        except (OSError, ValueError, RuntimeError) as exc:
            if not _retryable(exc):
                raise_mapped(exc)
                raise
            if spool is None or not spool.sealed:
                raise ContentionError(
                    f"merge_insert into {spec.dataset.uri} lost to a concurrent writer "
                    f"({src.mode.value} source, conflict_retries=0: no replay); pass a "
                    "replayable source or allow retries",
                    num_attempts=1,
                ) from exc
            delay = backoff_delay(1, time.monotonic() - started)
        log.debug(
            "lance_async: a streamed merge_insert conflicted; replaying its spool in %.3f s",
            delay,
            extra={"table": spec.dataset.uri},
        )
        await anyio.sleep(delay)
        replay = replayable(spool.factory(src.schema), schema=src.schema)
        replay.verify_replays = False  # a spool cannot change between passes
        left = spec.timeout - timedelta(seconds=time.monotonic() - started)
        rest = dataclasses.replace(
            spec, retries=spec.retries - 1, timeout=max(left, timedelta(milliseconds=1))
        )
        shifted = None if on_cancel is None else (lambda o, n: on_cancel(o, n + 1))
        try:
            outcome, attempts = await replayed(rest, replay, on_cancel=shifted)
        except ContentionError as exc:
            raise ContentionError(
                f"merge_insert into {spec.dataset.uri} lost to concurrent writers "
                f"{exc.num_attempts + 1} time(s), replaying its spool; retries exhausted "
                f"(conflict_retries={spec.retries}, "
                f"retry_timeout={spec.timeout.total_seconds():g}s)",
                num_attempts=exc.num_attempts + 1,
            ) from exc
        return outcome, attempts + 1
    finally:
        if spool is not None:
            with anyio.CancelScope(shield=True):
                await run_sync(spool.discard, limiter=stream_limiter())


def replays(src: WriteSource) -> bool:
    """True when lance_async can replay ``src`` itself (in memory, or a factory)."""
    return src.mode in (SourceMode.MATERIALIZED, SourceMode.REPLAYABLE)
