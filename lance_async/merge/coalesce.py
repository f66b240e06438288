"""Group commit of upserts: concurrent merge_inserts on one table made one engine merge.

The MemWAL writer's group commit brought to the base table. Upserts on one
table in one event loop, with the same join columns, the same clauses and
the same source columns, form a *lane*. While a merge of the lane is in
flight, the upserts that arrive wait as one pending *group*; when it ends,
the group's first member (its leader) runs the whole group as one engine
merge -- one commit, one version -- and every member gets its own
:class:`~lance_async.MergeResult`:

* **Serial order.** The group's rows are applied in arrival order: for an
  upsert or an update the last member to name a key wins (keep-last), for an
  insert-only merge the first (later inserts of the key are no-ops, as they
  would be run one after another). Each member's counts are the ones it
  would get run alone in that order: a key is *updated* when the table held
  it at the version the merge read, or an earlier member of the group put
  it, and *inserted* otherwise. The counts of all members add up to the
  engine's (``num_inserted_rows``).
* **Isolation.** Every member's rows are checked (columns, null and repeated
  keys) before it joins, so a bad source fails only its own caller. A group
  merge that fails for another reason than a conflict is retried member by
  member, so each gets its own outcome.
* **Backpressure.** A pending group holds at most ``max_rows`` rows and
  ``max_bytes`` bytes; an upsert that does not fit waits for the next group.
  A source larger than that alone is not held back: it runs by itself at
  once, concurrently, as without coalescing.
* **Conflicts** with other processes replay the group's rows (in memory)
  through :func:`~lance_async.merge.attempt.replayed`, as any source's.
* **Cancellation.** A member cancelled while its group is pending is
  withdrawn and commits nothing. Once the group's merge has started, its rows
  commit with the group (the MemWAL writer's rule for queued rows): the
  cancellation is delivered at once and the result, if committed, is kept
  in the builder's ``last_result`` and logged. The group's leader (its first
  member, whose task runs the merge) cancelled before the commit -- during a
  backoff, or before an attempt's commit point -- withdraws its own rows and
  leaves at once; the others go back to the front of the lane and the next
  of them leads. Cancelled after the commit landed, it settles every member
  first.

Who coalesces: merges whose clauses are exactly an upsert
(``when_matched_update_all()`` + ``when_not_matched_insert_all()``), an
insert of new keys only, or an update of matched rows only (no conditions),
through the base table, with an in-memory source or a replayable one of at
most ``max_bytes`` (read into memory to join). The first upsert of an idle
lane runs at once with its own source, so a lone caller never waits.

Where the idea comes from: group commit in databases (and the MemWAL writer's
coalescing of puts), Kafka's producer batching per partition; LanceDB and
pylance commit every call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pyarrow as pa

from .._duplicates import keep_last
from .._loop import LoopHandle
from .._threads import run_sync, stream_limiter
from ..errors import ContentionError, InvalidInputError
from ..lsm.keyindex import KeyIndex
from ..lsm.keyvalues import keys_filter
from ..sources import SourceMode, WriteSource, resolve_source
from .attempt import SETTING_STEPS, MergeSpec, Outcome, group_shape, replayed
from .passes import check_keys, check_required
from .result import MergeResult, engine_stats

__all__ = [
    "COALESCE_BYTES",
    "COALESCE_ROWS",
    "Member",
    "MergeStatistics",
    "coalesced",
    "group_shape",
    "merge_statistics",
]

log = logging.getLogger("lance_async.merge")

#: Rows a pending group holds at most (default of ``coalesce(max_rows=...)``).
COALESCE_ROWS = 1_000_000
#: Bytes of Arrow data a pending group holds at most (``coalesce(max_bytes=...)``).
COALESCE_BYTES = 64 * 1024 * 1024

_FILTER_KEYS = 2048  # keys looked up by an IN filter at most; more: the key columns scanned


@dataclass(eq=False)
class Member:
    """One upsert waiting in, or merged by, a group (loop side only).

    Attributes
    ----------
    rows : pa.Table
        Its rows, checked (no null or repeated join key).
    mode : SourceMode
        How its source was given (reported in its result).
    settle : callable
        ``settle(result, committed_dataset)``: records a committed result
        for the member's builder (its ``last_result``, its table's version).
    """

    rows: pa.Table
    mode: SourceMode
    settle: Callable[[MergeResult, Any], None]
    group: list[Member] | None = None
    result: MergeResult | None = None
    error: BaseException | None = None
    alone: bool = False
    abandoned: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    @property
    def pending(self) -> bool:
        """True while the member waits in its lane for a group (not taken yet)."""
        return self.group is None


class _Lane:
    """The merges of one table and one shape in one event loop (loop side only)."""

    def __init__(self) -> None:
        self.busy = False
        self.pending: list[Member] = []
        self.rows = 0
        self.nbytes = 0
        self._changed = anyio.Event()

    def idle(self) -> bool:
        return not self.busy and not self.pending

    def changed(self) -> anyio.Event:
        return self._changed

    def notify(self) -> None:
        event, self._changed = self._changed, anyio.Event()
        event.set()

    def fits(self, member: Member, max_rows: int, max_bytes: int) -> bool:
        if not self.pending:
            return True
        return (
            self.rows + member.rows.num_rows <= max_rows
            and self.nbytes + member.nbytes <= max_bytes
        )

    def add(self, member: Member) -> None:
        self.pending.append(member)
        self.rows += member.rows.num_rows
        self.nbytes += member.nbytes

    def remove(self, member: Member) -> None:
        self.pending.remove(member)
        self.rows -= member.rows.num_rows
        self.nbytes -= member.nbytes
        self.notify()

    def take(self) -> list[Member]:
        group, self.pending, self.rows, self.nbytes = self.pending, [], 0, 0
        for member in group:
            member.group = group
        self.busy = True
        self.notify()  # room for the next group
        return group


_lanes: dict[tuple[Any, ...], _Lane] = {}


def _table_key(uri: str) -> str:
    return uri if "://" in uri else os.path.realpath(uri)


def lane_key(spec: MergeSpec, shape: str, schema: pa.Schema) -> tuple[Any, ...]:
    """What merges must share to be one engine merge (and this event loop)."""
    columns = tuple((f.name, str(f.type), f.nullable) for f in schema)
    settings = tuple(sorted(((n, a) for n, a in spec.steps if n in SETTING_STEPS), key=repr))
    options = tuple(sorted((spec.dataset.storage_options or {}).items()))
    return (
        LoopHandle().key,
        _table_key(spec.dataset.uri),
        options,
        spec.on,
        shape,
        settings,
        columns,
        spec.retries,
        spec.timeout,
    )


@dataclass(frozen=True)
class MergeStatistics:
    """Upserts of one table in this event loop, as the group commit sees them.

    Attributes
    ----------
    in_flight : int
        Coalescible merges running now (alone or as a group).
    pending_upserts : int
        Upserts waiting for the next group.
    pending_rows, pending_bytes : int
        Their rows, and bytes of Arrow data.
    """

    in_flight: int
    pending_upserts: int
    pending_rows: int
    pending_bytes: int


def merge_statistics(uri: str) -> MergeStatistics:
    """The group commit's state for table ``uri`` in the running event loop.

    Does not block. Useful to watch backpressure, and to tell in a test when
    upserts are waiting (instead of sleeping).
    """
    loop, table = LoopHandle().key, _table_key(uri)
    lanes = [lane for key, lane in _lanes.items() if key[0] == loop and key[1] == table]
    return MergeStatistics(
        in_flight=sum(1 for lane in lanes if lane.busy),
        pending_upserts=sum(len(lane.pending) for lane in lanes),
        pending_rows=sum(lane.rows for lane in lanes),
        pending_bytes=sum(lane.nbytes for lane in lanes),
    )


def _lane(key: tuple[Any, ...]) -> _Lane:
    lane = _lanes.get(key)
    if lane is None:
        lane = _lanes[key] = _Lane()
    return lane


def _forget(key: tuple[Any, ...], lane: _Lane) -> None:
    if lane.idle() and _lanes.get(key) is lane:
        del _lanes[key]


async def _in_memory(src: WriteSource, spec: MergeSpec, max_bytes: int) -> pa.Table | None:
    """The source's rows as one table, checked; None when it holds more than
    ``max_bytes`` (a replayable source is then read no further)."""
    batches = src.batches()
    if batches is not None:  # MATERIALIZED: checked by the builder already
        table = pa.Table.from_batches(batches, schema=src.schema)
        return table if table.nbytes <= max_bytes else None
    async with src.reader_plan() as plan:

        def read() -> list[pa.RecordBatch] | None:
            kept: list[pa.RecordBatch] = []
            held = 0
            reader = plan.make()
            try:
                for batch in reader:
                    held += batch.nbytes
                    if held > max_bytes:
                        return None
                    if batch.num_rows:
                        kept.append(batch)
            finally:
                reader.close()
            return kept

        # nothing is written here: a factory or iterator that blocks in this
        # thread is abandoned if cancelled (a bridged one ends by itself)
        read_batches = await run_sync(
            read,
            limiter=stream_limiter(),
            abandon_on_cancel=(lambda: True) if src.native else None,
            what="the read of a coalesced upsert's source",
        )
    if read_batches is None:
        return None
    if read_batches:

        def check() -> None:
            check_required(read_batches, spec.dataset.schema)
            check_keys(read_batches, spec.key_sets, "error")

        await run_sync(check)
    return pa.Table.from_batches(read_batches, schema=src.schema)


async def coalesced(
    spec: MergeSpec,
    shape: str,
    src: WriteSource,
    *,
    solo: Callable[[], Awaitable[MergeResult]],
    settle: Callable[[MergeResult, Any], None],
    warn_cancelled: Callable[[MergeResult], None],
    max_rows: int = COALESCE_ROWS,
    max_bytes: int = COALESCE_BYTES,
) -> MergeResult:
    """Run an upsert alone when its lane is idle, else as a member of the next group.

    Parameters
    ----------
    spec : MergeSpec
        The upsert (its shape is ``shape``, see :func:`group_shape`).
    src : WriteSource
        MATERIALIZED (checked) or REPLAYABLE.
    solo : callable
        Runs the upsert by itself (its own source, its own retries).
    settle : callable
        ``settle(result, dataset)`` once the member's rows committed.
    warn_cancelled : callable
        Logs a committed result whose awaiting task was cancelled.
    max_rows, max_bytes : int
        A pending group's bounds (rows; bytes of Arrow data).

    Returns
    -------
    MergeResult
        The member's own counts; ``group_size`` says how many upserts the
        commit held.

    Raises
    ------
    ContentionError
        The group lost to concurrent writers through every retry.
    BaseException
        What running alone raised (after a group failure, see the module
        docstring).
    """
    key = lane_key(spec, shape, src.schema)
    lane = _lane(key)
    if lane.idle():
        lane.busy = True
        try:
            return await solo()
        finally:
            lane.busy = False
            lane.notify()
            _forget(key, lane)
    rows = await _in_memory(src, spec, max_bytes)
    if rows is None or rows.num_rows > max_rows or rows.num_rows == 0:
        return await solo()  # too large to share a merge (or empty): alone, at once
    member = Member(rows, src.mode, settle)
    lane = _lane(key)  # the lane may have gone idle, and away, meanwhile
    try:
        while not lane.fits(member, max_rows, max_bytes):
            await lane.changed().wait()
        lane.add(member)
        while True:
            if member.group is not None:
                await member.done.wait()
                if member.pending:
                    continue  # its group's leader left before the commit: pending again
                break
            if not lane.busy and lane.pending[0] is member:
                group = lane.take()
                try:
                    await _run_group(spec, shape, group, lane)
                finally:
                    lane.busy = False
                    lane.notify()
                    _forget(key, lane)
                break
            await lane.changed().wait()
        if member.alone:
            return await solo()
        if member.error is not None:
            raise member.error
        assert member.result is not None
        await anyio.lowlevel.checkpoint_if_cancelled()
        return member.result
    except anyio.get_cancelled_exc_class():
        if member.group is None:
            if member in lane.pending:
                lane.remove(member)  # withdrawn: nothing of it is committed
        elif member.result is not None:
            warn_cancelled(member.result)
        else:
            member.abandoned = True  # its rows commit with the group; logged then
        raise


async def _run_group(spec: MergeSpec, shape: str, group: list[Member], lane: _Lane) -> None:
    """One engine merge for every member's rows; each member settled (loop side).

    Run by the group's leader, ``group[0]``. Every member is done when this
    returns, whatever happened: with its result, its error, or ``alone``
    (run by itself: the group failed before anything was committed). The
    leader cancelled before the group's commit (while its rows are joined,
    during a backoff, before an attempt's commit point) leaves at once: the
    others go back to the front of the lane, in their order, and the first
    of them leads them in the next group. Cancelled once a commit landed, it
    settles every member first.
    """
    landed: list[tuple[Outcome, int]] = []
    try:
        merged, full, offsets = await run_sync(lambda: _combine(group, shape, spec.on))
        src = await resolve_source(merged)
        outcome, attempts = await replayed(
            spec, src, on_cancel=lambda done, tries: landed.append((done, tries))
        )
        if outcome is None:  # cannot happen: every member holds rows
            raise RuntimeError("a coalesced merge held no rows")
    except anyio.get_cancelled_exc_class():
        if landed:
            with anyio.CancelScope(shield=True):
                await _settle(spec, shape, group, full, offsets, *landed[0])
        else:
            _requeue(lane, [m for m in group[1:] if not m.abandoned])
        raise
    except ContentionError as exc:
        for member in group:
            member.error = ContentionError(str(exc), num_attempts=exc.num_attempts)
            member.error.__cause__ = exc.__cause__
        _finish(group)
        return
    except Exception as exc:  # nothing was committed: each runs alone, with its own outcome
        if len(group) == 1:
            group[0].error = exc
        else:
            log.info(
                "lance_async: a merge of %d coalesced upserts into %s failed (%s); each runs alone",
                len(group),
                spec.dataset.uri,
                exc,
                extra={"table": spec.dataset.uri},
            )
            for member in group:
                member.alone = True
        _finish(group)
        return
    except BaseException as exc:  # a panic, an interrupt: every member hears it
        for member in group:
            member.error = exc
        _finish(group)
        raise
    # committed: from here on nothing may make a member run again
    with anyio.CancelScope(shield=True):
        await _settle(spec, shape, group, full, offsets, outcome, attempts)


def _requeue(lane: _Lane, members: list[Member]) -> None:
    """Put the members of a group withdrawn before its commit back at the
    front of the lane, in their order (loop side)."""
    for member in members:
        done, member.done, member.group = member.done, anyio.Event(), None
        done.set()  # wakes its task, which finds itself pending again
    lane.pending[:0] = members
    lane.rows += sum(m.rows.num_rows for m in members)
    lane.nbytes += sum(m.nbytes for m in members)
    lane.notify()


async def _settle(
    spec: MergeSpec,
    shape: str,
    group: list[Member],
    full: pa.Table,
    offsets: list[int],
    outcome: Outcome,
    attempts: int,
) -> None:
    """Each member's result of the group's commit, recorded and handed over."""
    try:
        counts = await run_sync(lambda: _member_counts(spec, shape, group, full, offsets, outcome))
    except Exception as exc:
        log.warning(
            "lance_async: the coalesced merge into %s committed version %d, but the table's "
            "keys at the version it read could not be read (%s): each upsert's counts "
            "treat every key as new to the table",
            spec.dataset.uri,
            int(outcome.target.version),
            exc,
            extra={"table": spec.dataset.uri},
        )
        counts = _member_counts(spec, shape, group, full, offsets, outcome, known=False)
    version = int(outcome.target.version)
    for index, (member, (ins, upd)) in enumerate(zip(group, counts, strict=True)):
        result = MergeResult(
            ins, upd, 0, attempts, member.mode, version, group_size=len(group), group_index=index
        )
        member.result = result
        member.settle(result, outcome.target)
        if member.abandoned:
            log.warning(
                "lance_async: merge_insert committed version %d of %s in a group of %d, "
                "but the awaiting task was cancelled; see AsyncMergeInsertBuilder.last_result",
                version,
                spec.dataset.uri,
                len(group),
                extra={"table": spec.dataset.uri},
            )
    _finish(group)


def _finish(group: list[Member]) -> None:
    for member in group:
        member.done.set()


def _keys(table: pa.Table, on: Sequence[str]) -> list[pa.ChunkedArray]:
    return [table.column(name) for name in on]


def _combine(
    group: list[Member], shape: str, on: Sequence[str]
) -> tuple[pa.Table, pa.Table, list[int]]:
    """The group's rows in arrival order (``full``), each member's first row
    in it (``offsets``), and the rows to merge: one per key, the last
    member's (upsert, update) or the first's (insert). Blocking."""
    schema = group[0].rows.schema
    tables = [
        m.rows
        if m.rows.schema.equals(schema)
        else pa.Table.from_arrays(m.rows.columns, schema=schema)
        for m in group
    ]
    offsets = list(np.cumsum([0] + [t.num_rows for t in tables[:-1]]).tolist())
    full = pa.concat_tables(tables)
    if shape == "insert":
        cols = _keys(full, on)
        first = KeyIndex(cols).find(cols)
        merged = full.filter(pa.array(first == np.arange(full.num_rows)))
    else:
        merged = keep_last(full, on)
    return merged, full, offsets


def _present(spec: MergeSpec, merged_keys: list[pa.ChunkedArray], outcome: Outcome) -> KeyIndex:
    """The group's keys the table held at the version the merge read. Blocking."""
    base = outcome.target.checkout_version(outcome.read_version)
    on = list(spec.on)
    where = None
    if len(merged_keys[0]) <= _FILTER_KEYS:
        probe = [c.combine_chunks() for c in merged_keys]
        try:
            where = keys_filter(base.schema, on, probe)
        except InvalidInputError:  # a key type Lance SQL cannot spell (binary): scan the keys
            where = None
    found = base.to_table(columns=on, filter=where)
    return KeyIndex(_keys(found, on))


def _member_counts(
    spec: MergeSpec,
    shape: str,
    group: list[Member],
    full: pa.Table,
    offsets: list[int],
    outcome: Outcome,
    *,
    known: bool = True,
) -> list[tuple[int, int]]:
    """Each member's (inserted, updated) in the group's serial order. Blocking.

    The table's keys at the version read are looked up only when the
    engine's counts leave them open (some of the group's keys new, some not);
    with ``known`` False they are not, and every key counts as new to the
    table (the fallback when they cannot be read).
    """
    inserted, updated, _ = engine_stats(outcome.stats)
    on = list(spec.on)
    full_keys = _keys(full, on)
    index = KeyIndex(full_keys)
    distinct = int(np.count_nonzero(index.find(full_keys) == np.arange(full.num_rows)))
    matched = updated if shape != "insert" else distinct - inserted
    present: KeyIndex | None = None
    if not known:
        matched = 0
    elif 0 < matched < distinct:
        first = index.find(full_keys) == np.arange(full.num_rows)
        present = _present(spec, [c.filter(pa.array(first)) for c in full_keys], outcome)
    counts: list[tuple[int, int]] = []
    for member, offset in zip(group, offsets, strict=True):
        keys = _keys(member.rows, on)
        n = member.rows.num_rows
        if present is not None:
            held = present.contains(keys)
        else:
            held = np.full(n, matched == distinct and distinct > 0, dtype=bool)
        if shape == "update":
            counts.append((0, int(np.count_nonzero(held))))
            continue
        earlier = index.find(keys) < offset
        new = int(np.count_nonzero(~held & ~earlier))
        counts.append((new, 0 if shape == "insert" else n - new))
    total = sum(c[0] for c in counts)
    if known and total != inserted:
        log.warning(
            "lance_async: the coalesced counts of %s (%d inserted) differ from the engine's (%d)",
            spec.dataset.uri,
            total,
            inserted,
            extra={"table": spec.dataset.uri},
        )
    return counts
