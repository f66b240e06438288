"""Point lookups in batches, and the coalescer that makes batches of single lookups.

The engine's ``LsmPointLookupPlanner`` plans one key at a time, and each
plan probes every level. :func:`lookup_view` answers many keys with one
probe of each level of an :class:`~lance_async.lsm.levels.LsmView`:

1. the unflushed rows' newest states (memtables and WAL tails, in memory),
2. each shard's winner index (which generation row holds the newest version
   of the key), then one ``take`` per generation that has hits,
3. for the keys no newer level holds, one ``take`` by row offset when the
   base version's keys are in memory (``basekeys.py``), else one base-table
   query ``key IN (...)`` (a BTREE index on the key makes it an index lookup).

A key whose newest version is a delete is answered "absent" at its level and
never reaches an older one.

:class:`LookupCoalescer` gathers lookups issued concurrently on one table
and answers them together -- group commit for reads, as aiokafka's
accumulator batches records while a request is in flight. There is no
background task: the first caller that finds the coalescer idle runs the
batch for everyone waiting (trio's rule: no task outlives its caller).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pyarrow as pa

from .._engine_errors import raise_mapped
from .._loop import LoopHandle
from .basekeys import base_keys
from .keyindex import KeyIndex
from .keyvalues import keys_filter
from .levels import LsmView
from .scan import output_schema

__all__ = ["CoalescerStats", "LookupCoalescer", "coalescer_for", "lookup_view", "split_rows"]

BASE_QUERY_KEYS = 1024
"""Keys per base-table ``IN (...)`` query at most."""

RunBatch = Callable[[list[pa.Array], "list[str] | None"], Awaitable[tuple[pa.Table, np.ndarray]]]


def lookup_view(
    view: LsmView, probe: list[pa.Array], columns: Sequence[str] | None = None
) -> tuple[pa.Table, np.ndarray]:
    """The newest live row of each probe key (blocking).

    Parameters
    ----------
    view : LsmView
    probe : list of pa.Array
        Key columns of the m keys to look up.
    columns : sequence of str, optional

    Returns
    -------
    rows : pa.Table
        The found rows (keys absent or deleted have none), table schema
        projected on ``columns``.
    owner : np.ndarray of int64
        For each row, the position of its key in ``probe``.

    Raises
    ------
    LanceAsyncError
        Engine errors, mapped.
    """
    schema, keys = view.schema, view.keys
    cols = list(columns) if columns is not None else list(schema.names)
    out = output_schema(schema, cols)
    m = len(probe[0]) if probe else 0
    todo = np.ones(m, dtype=bool)
    pieces: list[pa.Table] = []
    owners: list[np.ndarray] = []

    def at(idx: np.ndarray) -> list[pa.Array]:
        return [c.take(pa.array(idx)) for c in probe]

    def found(table: pa.Table, owner: np.ndarray) -> None:
        pieces.append(pa.Table.from_arrays(table.select(cols).columns, schema=out))
        owners.append(owner)

    try:
        for mem in view.memtables:
            idx = np.flatnonzero(todo)
            if not len(idx):
                break
            pos = mem.index.find(at(idx))
            hit = pos >= 0
            todo[idx[hit]] = False
            live = hit.copy()
            live[hit] = ~mem.tomb[pos[hit]]
            if live.any():
                found(mem.table.take(pa.array(pos[live])), idx[live])
        for shard in view.shards:
            idx = np.flatnonzero(todo)
            index, src, rowpos = shard.index
            if not len(idx) or not index.size:
                continue
            pos = index.find(at(idx))
            hit = pos >= 0
            todo[idx[hit]] = False
            gen_of, row_of, req = src[pos[hit]], rowpos[pos[hit]], idx[hit]
            for g in np.unique(gen_of):
                gen = shard.generations[int(g)]
                sel = gen_of == g
                rows, who = row_of[sel], req[sel]
                live = ~gen.tomb[rows]
                if live.any():
                    order = np.argsort(rows[live])
                    taken = gen.dataset.take(rows[live][order], columns=cols)
                    found(taken, who[live][order])
        idx = np.flatnonzero(todo)
        indexed = base_keys.get(view.base, keys) if len(idx) else None
        if indexed is not None:  # the version's keys are in memory: take by offset
            pos = indexed.index.find(at(idx))
            hit = pos >= 0
            if hit.any():
                order = np.argsort(pos[hit], kind="stable")
                taken = indexed.dataset.take(pos[hit][order], columns=cols)
                found(taken, idx[hit][order])
            idx = idx[:0]
        need = [k for k in keys if k not in cols]
        for start in range(0, len(idx), BASE_QUERY_KEYS):
            part = idx[start : start + BASE_QUERY_KEYS]
            keys_part = at(part)
            table = view.base.to_table(
                columns=cols + need, filter=keys_filter(schema, keys, keys_part)
            )
            if not table.num_rows:
                continue
            pos = KeyIndex([table.column(k) for k in keys]).find(keys_part)
            hit = pos >= 0
            if hit.any():
                found(table.take(pa.array(pos[hit])), part[hit])
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise
    if not pieces:
        return out.empty_table(), np.zeros(0, dtype=np.int64)
    return pa.concat_tables(pieces), np.concatenate(owners)


def split_rows(table: pa.Table, owner: np.ndarray, m: int) -> list[pa.Table]:
    """One table (0 or 1 row) per probe key, from :func:`lookup_view`'s result."""
    first = np.full(m, -1, dtype=np.int64)
    rev = np.arange(len(owner) - 1, -1, -1)
    first[owner[rev]] = rev
    empty = table.schema.empty_table()
    return [table.slice(int(p), 1) if p >= 0 else empty for p in first]


@dataclass
class _Request:
    key: list[pa.Array]
    columns: tuple[str, ...] | None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: pa.Table | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class CoalescerStats:
    """What a :class:`LookupCoalescer` did.

    Attributes
    ----------
    lookups : int
        Keys answered.
    batches : int
        Batches run (each: one view of the levels, one probe per level).
    max_batch : int
        The most keys in one batch.
    pending : int
        Keys waiting now.
    """

    lookups: int
    batches: int
    max_batch: int
    pending: int


class LookupCoalescer:
    """Gathers concurrent point lookups on one table and answers them in batches.

    Parameters
    ----------
    run : async callable
        ``run(key_columns, columns) -> (rows, owner)``: answers a batch (as
        :func:`lookup_view` does, after opening a view).
    max_batch : int
        Keys per batch at most (default 256).
    max_in_flight : int
        Batches running at once (default 1: while one runs, the next one
        gathers).

    Notes
    -----
    Bound to the event loop of its creation. Cancelling a caller drops its
    key; cancelling the caller that runs a batch hands the other keys of the
    batch back to the queue (another caller runs them). An error of a batch
    is raised to every caller of that batch.
    """

    def __init__(self, run: RunBatch, *, max_batch: int = 256, max_in_flight: int = 1) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be >= 1")
        self._run = run
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._loop = LoopHandle()
        self._pending: list[_Request] = []
        self._in_flight = 0
        self._changed = anyio.Event()
        self._lookups = self._batches = self._max_seen = 0

    def is_current(self) -> bool:
        """True when used from the event loop it was created in."""
        return self._loop.is_current()

    def stats(self) -> CoalescerStats:
        """Counters (does not block)."""
        return CoalescerStats(self._lookups, self._batches, self._max_seen, len(self._pending))

    async def lookup(self, key: list[pa.Array], columns: Sequence[str] | None) -> pa.Table:
        """The newest row of one key (1-row key columns): a table of 0 or 1 row."""
        self._loop.check("this lookup coalescer")
        req = _Request(key, tuple(columns) if columns is not None else None)
        self._pending.append(req)
        try:
            while not req.done.is_set():
                if self._in_flight < self.max_in_flight and req in self._pending:
                    await self._lead(req)
                else:
                    await self._changed.wait()
        finally:
            if req in self._pending:
                self._pending.remove(req)
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _fire(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _lead(self, leader: _Request) -> None:
        batch = [r for r in self._pending if r.columns == leader.columns][: self.max_batch]
        taken = set(map(id, batch))
        self._pending = [r for r in self._pending if id(r) not in taken]
        self._in_flight += 1
        try:
            n = len(batch)
            probe = [pa.concat_arrays([r.key[j] for r in batch]) for j in range(len(leader.key))]
            cols = list(leader.columns) if leader.columns is not None else None
            rows, owner = await self._run(probe, cols)
            for req, result in zip(batch, split_rows(rows, owner, n), strict=True):
                req.result = result
                req.done.set()
            self._lookups += n
            self._batches += 1
            self._max_seen = max(self._max_seen, n)
        except anyio.get_cancelled_exc_class():
            # hand the others' keys back: a waiting caller runs them
            self._pending[:0] = [r for r in batch if r is not leader and not r.done.is_set()]
            raise
        except Exception as exc:
            for req in batch:
                req.error = exc
                req.done.set()
        finally:
            self._in_flight -= 1
            self._fire()


def coalescer_for(owner: Any, make: Callable[[], LookupCoalescer]) -> LookupCoalescer:
    """The coalescer of ``owner`` (a dataset, writer or router) in this event loop.

    Kept as an attribute of the owner (a reference cycle at most, which the
    garbage collector breaks), made again when used from another loop.
    """
    current: LookupCoalescer | None = getattr(owner, "_lance_async_lookups", None)
    if current is None or not current.is_current():
        current = make()
        owner._lance_async_lookups = current
    return current
