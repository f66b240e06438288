"""The LSM levels of one read, resolved once: :class:`LsmView` and :func:`open_view`.

A MemWAL table has four levels, newest first within a shard: a live writer's
memtable in this process (its :class:`~lance_async.lsm.memtable.MemtableMirror`),
the shard's WAL tail (durable rows no generation holds yet, read by any
process: ``wal.py``), its flushed generations (SSTables, immutable Lance
datasets under ``_mem_wal/``) newest first, and the base table. Within a
shard the newest version of a key wins; across shards keys are disjoint
(the MemWAL contract, kept by the routing writer).

Resolution works on keys only and is cached: each generation's key columns,
row addresses and tombstone flags are read once (SSTables never change), and
each shard's winners -- which row of which generation holds the newest
version of each key -- are computed once per list of generations; a WAL
tail is resolved once per position reached. A view then answers, with one
probe of a :class:`~lance_async.lsm.keyindex.KeyIndex` per batch, which
base rows are shadowed. The scan (``scan.py``), the batched point lookups
(``lookup.py``) and the vector search (``vector.py``) all read through a
view, instead of the engine's ``LsmScanner``, which merges every level and
collects its whole result before returning a batch.
"""

from __future__ import annotations

import dataclasses
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, TypeVar

import anyio
import numpy as np
import pyarrow as pa

from .._loop import unwrap_groups
from .._memory import memory_freed
from .._schema import NO_KEY
from .._table import Table
from .._threads import run_engine
from ..errors import InvalidInputError, LanceAsyncError
from .cache import GENERATION_OVERHEAD, LevelCache, LevelCacheStats
from .keyindex import KeyIndex, first_occurrence
from .memtable import MemPart, MemtableMirror
from .pinned import pinned_base, raise_expired
from .snapshots import LsmSnapshot, ShardSnapshot, discover_latest
from .unflushed import MemLevel, resolve_memtable, tail_level
from .wal import TOMBSTONE, read_wal_tail

__all__ = [
    "ROWADDR",
    "Generation",
    "LsmView",
    "MemLevel",
    "ShardLevels",
    "level_cache_stats",
    "load_generation",
    "open_view",
    "read_view",
]

T = TypeVar("T")

ROWADDR = "_rowaddr"
_GENERATIONS = 4096  # generations and resolved shards kept at most (bytes bound them first)
_SHARDS = 256  # WAL tails kept
_SHADOWS = 8  # combined shadow indexes kept


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.lock = threading.Lock()

    def get_item(self, key: Any) -> Any:
        with self.lock:
            hit = self.get(key)
            if hit is not None:
                self.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any) -> Any:
        with self.lock:
            self[key] = value
            while len(self) > self.size:
                self.popitem(last=False)
        return value


# generations' keys and resolved shards: bounded by bytes, emptied of what a
# compaction merged (cache.py; configure_memory(lsm_cache_bytes=...))
_levels = LevelCache(_GENERATIONS)
_shadow_cache = _Lru(_SHADOWS)


@dataclass
class Generation:
    """The keys of one flushed generation (immutable; cached per folder).

    Attributes
    ----------
    uri : str
        The generation's Lance dataset.
    shard_id : str
    generation : int
    keys : list of pa.Array
        Primary-key columns of its rows, in scan order (n rows). The engine
        keeps one row per key in a generation (a deletion vector hides the
        older ones); a key seen twice anyway resolves to its last row.
    rowaddr : np.ndarray of uint64, shape (n,)
    tomb : np.ndarray of bool, shape (n,)
        True where the row is a delete.
    """

    uri: str
    shard_id: str
    generation: int
    keys: list[pa.Array]
    rowaddr: np.ndarray
    tomb: np.ndarray
    storage_options: dict[str, str] | None = None
    _ds: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def dataset(self) -> Any:
        """The generation's ``LanceDataset`` (opened once; blocking the first time)."""
        with self._lock:
            if self._ds is None:
                import lance

                self._ds = lance.dataset(self.uri, storage_options=self.storage_options)
            return self._ds

    def __len__(self) -> int:
        return len(self.rowaddr)

    @cached_property
    def _offsets(self) -> tuple[int, np.ndarray | None, np.ndarray]:
        """(lowest address, dense position table or None, argsort of the addresses)."""
        n = len(self.rowaddr)
        if not n:
            return 0, None, np.zeros(0, np.int64)
        addr = self.rowaddr.astype(np.int64)
        lo, hi = int(addr.min()), int(addr.max())
        if hi - lo < 4 * n + 1024:  # one fragment, few deletions: a dense table
            table = np.full(hi - lo + 1, -1, np.int64)
            table[addr - lo] = np.arange(n)
            return lo, table, np.zeros(0, np.int64)
        return lo, None, np.argsort(addr, kind="stable")

    def positions(self, addresses: np.ndarray) -> np.ndarray:
        """The position in this generation's key order of each row address
        (addresses of its rows; blocking, O(n))."""
        lo, dense, order = self._offsets
        addr = np.asarray(addresses).astype(np.int64)
        if dense is not None:
            return np.asarray(dense[addr - lo])
        ordered = self.rowaddr.astype(np.int64)[order]
        return np.asarray(order[np.searchsorted(ordered, addr)])


def load_generation(
    uri: str,
    shard_id: str,
    generation: int,
    path: str,
    keys: Sequence[str],
    storage_options: dict[str, str] | None = None,
) -> Generation:
    """The keys, row addresses and tombstones of one generation (blocking; cached).

    Raises
    ------
    OSError, ValueError
        The engine's errors (a generation folder removed by a clean-up).
    """
    gen_uri = posixpath.join(uri, "_mem_wal", shard_id, path)
    hit: Generation | None = _levels.get_item((gen_uri, tuple(keys)))
    if hit is not None:
        return hit
    import lance

    ds = lance.dataset(gen_uri, storage_options=storage_options)
    # a generation written without deletes may have no tombstone column (the
    # engine's own readers accept that; so do these)
    has_tomb = TOMBSTONE in ds.schema.names
    t = ds.to_table(columns=[*keys, TOMBSTONE] if has_tomb else list(keys), with_row_address=True)
    cols = [t.column(k).combine_chunks() for k in keys]
    if has_tomb:
        tomb = np.asarray(t.column(TOMBSTONE).to_numpy(zero_copy_only=False), dtype=bool)
    else:
        tomb = np.zeros(t.num_rows, dtype=bool)
    rowaddr = t.column(ROWADDR).to_numpy()
    gen = Generation(gen_uri, shard_id, generation, cols, rowaddr, tomb, storage_options, ds)
    size = sum(c.nbytes for c in cols) + rowaddr.nbytes + tomb.nbytes + GENERATION_OVERHEAD
    result: Generation = _levels.put(
        (gen_uri, tuple(keys)), gen, size, group=(uri, shard_id), low=generation
    )
    return result


@dataclass
class ShardLevels:
    """One shard's flushed generations, resolved (immutable; cached).

    Attributes
    ----------
    shard_id : str
    generations : list of Generation
        Newest first.
    winners : list of np.ndarray of bool
        Per generation, its rows that hold the newest version of their key
        among the shard's generations (tombstones included).
    """

    shard_id: str
    generations: list[Generation]
    winners: list[np.ndarray]

    @cached_property
    def index(self) -> tuple[KeyIndex, np.ndarray, np.ndarray]:
        """(index over every winning key, generation number in ``generations``,
        row position in it), built on first use (blocking)."""
        src, pos, cols = [], [], []
        for i, (gen, win) in enumerate(zip(self.generations, self.winners, strict=True)):
            rows = np.flatnonzero(win)
            src.append(np.full(len(rows), i, dtype=np.int32))
            pos.append(rows)
            cols.append(
                [k.take(pa.array(rows)) for k in gen.keys] if len(rows) < len(gen) else gen.keys
            )
        if not cols:
            return (
                KeyIndex([pa.array([], pa.int64())]),
                np.zeros(0, np.int32),
                np.zeros(0, np.int64),
            )
        merged = [pa.concat_arrays([c[j] for c in cols]) for j in range(len(cols[0]))]
        return KeyIndex(merged), np.concatenate(src), np.concatenate(pos)

    def winner_keys(self) -> list[pa.Array]:
        """Key columns of every winning row (tombstones included)."""
        index = self.index[0]
        return index.columns


def resolve_shard(
    uri: str, snapshot: ShardSnapshot, keys: Sequence[str], generations: list[Generation]
) -> ShardLevels:
    """Which row of which generation is the newest version of each key (blocking; cached)."""
    cache_key = (uri, snapshot.shard_id, tuple(snapshot.sstables), tuple(keys))
    hit: ShardLevels | None = _levels.get_item(cache_key)
    if hit is not None:
        return hit
    gens = sorted(generations, key=lambda g: -g.generation)
    total = sum(len(g) for g in gens)
    if total == 0:
        levels = ShardLevels(snapshot.shard_id, gens, [np.zeros(0, bool) for _ in gens])
    else:
        # newest generation first; inside one, its last row of a key first
        order = [np.arange(len(g) - 1, -1, -1) for g in gens]
        cols = [
            pa.concat_arrays(
                [g.keys[j].take(pa.array(o)) for g, o in zip(gens, order, strict=True)]
            )
            for j in range(len(keys))
        ]
        win = first_occurrence(cols, total)
        winners, offset = [], 0
        for g, o in zip(gens, order, strict=True):
            mask = np.zeros(len(g), dtype=bool)
            mask[o] = win[offset : offset + len(g)]
            winners.append(mask)
            offset += len(g)
        levels = ShardLevels(snapshot.shard_id, gens, winners)
    result: ShardLevels = _levels.put(
        cache_key,
        levels,
        _shard_bytes(levels),
        group=(uri, snapshot.shard_id),
        low=min((g for g, _ in snapshot.sstables), default=None),
    )
    return result


def level_cache_stats() -> LevelCacheStats:
    """What the process's cache of generations and resolved shards holds."""
    return _levels.stats()


def _shard_bytes(levels: ShardLevels) -> int:
    """About what a resolved shard holds: its masks, and its index once built
    (the winning keys and two int64 arrays over them)."""
    rows = sum(len(g) for g in levels.generations)
    key_bytes = sum(sum(k.nbytes for k in g.keys) for g in levels.generations)
    won = sum(int(w.sum()) for w in levels.winners)
    per_key = key_bytes // rows if rows else 0
    return sum(w.nbytes for w in levels.winners) + won * (per_key + 16)


@dataclass
class LsmView:
    """Every level of one read, resolved.

    Attributes
    ----------
    base : lance.LanceDataset
        The base table at the version read.
    schema : pa.Schema
        The table schema.
    keys : list of str
        The primary-key columns.
    shards : list of ShardLevels
        Flushed generations, per shard.
    memtables : list of MemLevel
        Mirrored memtables of live writers, per shard.
    """

    base: Any
    schema: pa.Schema
    keys: list[str]
    shards: list[ShardLevels]
    memtables: list[MemLevel]
    shadow: KeyIndex
    """Every key a generation holds (deletes too): base rows with one are hidden."""
    pinned: bool = False
    """True for a point-in-time view (a file gone is then :class:`ViewExpiredError`)."""

    @cached_property
    def memtable_index(self) -> KeyIndex:
        """Every key an unflushed level holds: older levels' rows with one are
        hidden (cached while the same levels are read: WAL tails are)."""
        live = [m for m in self.memtables if m.table.num_rows]
        if len(live) == 1:
            return live[0].index
        cache_key = ("mem", *(id(m) for m in live))
        hit: tuple[list[MemLevel], KeyIndex] | None = _shadow_cache.get_item(cache_key)
        if hit is not None and all(a is b for a, b in zip(hit[0], live, strict=True)):
            return hit[1]
        if not live:
            return KeyIndex([pa.array([], self.schema.field(k).type) for k in self.keys])
        cols = [m.index.columns for m in live]
        index = KeyIndex([pa.concat_arrays([c[j] for c in cols]) for j in range(len(self.keys))])
        _shadow_cache.put(cache_key, (live, index))
        return index

    def live_generations(self) -> Iterator[tuple[Generation, np.ndarray]]:
        """Each flushed generation with the mask of its rows that are a key's
        newest live version in the whole view (neither a delete nor hidden by
        an unflushed level); generations with none are left out. Newest first
        within a shard."""
        by_unflushed = any(m.table.num_rows for m in self.memtables)
        for shard in self.shards:
            for gen, winner in zip(shard.generations, shard.winners, strict=True):
                keep = winner & ~gen.tomb
                if by_unflushed and keep.any():
                    keep &= ~self.memtable_index.contains(gen.keys)
                if keep.any():
                    yield gen, keep

    def hidden(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
        """Mask of base rows (given their key columns) that a newer level hides."""
        mask = self.shadow.contains(columns)
        if any(m.table.num_rows for m in self.memtables):
            mask |= self.memtable_index.contains(columns)
        return mask


def _shadow(shards: list[ShardLevels], key_types: list[pa.DataType]) -> KeyIndex:
    cache_key = tuple(id(s) for s in shards)
    hit: tuple[list[ShardLevels], KeyIndex] | None = _shadow_cache.get_item(cache_key)
    if (
        hit is not None
        and len(hit[0]) == len(shards)
        and all(a is b for a, b in zip(hit[0], shards, strict=True))
    ):
        return hit[1]
    cols = [s.winner_keys() for s in shards if s.index[0].size]
    if not cols:
        index = KeyIndex([pa.array([], t) for t in key_types])
    elif len(cols) == 1:
        index = shards[[s.index[0].size > 0 for s in shards].index(True)].index[0]
    else:
        index = KeyIndex([pa.concat_arrays([c[j] for c in cols]) for j in range(len(key_types))])
    _shadow_cache.put(cache_key, (list(shards), index))
    return index


def _live_mirrors(
    mirrors: Sequence[MemtableMirror],
) -> list[tuple[MemtableMirror, list[MemPart]]]:
    """Each mirror with the parts it holds now (taken before the manifests are read)."""
    return [(m, m.parts()[1]) for m in mirrors]


def _unflushed_parts(
    taken: list[tuple[MemtableMirror, list[MemPart]]], snaps: Sequence[ShardSnapshot]
) -> dict[str, list[MemPart]]:
    """The mirrored parts no flushed generation of ``snaps`` holds, by shard; a
    mirror fenced by a newer writer is left out (its WAL tail is the truth)."""
    by_shard = {s.shard_id: s for s in snaps}
    out: dict[str, list[MemPart]] = {}
    for mirror, parts in taken:
        snap = by_shard.get(mirror.shard_id)
        if snap is not None and mirror.epoch and snap.writer_epoch > mirror.epoch:
            continue
        flushed = {g for g, _ in snap.sstables} if snap is not None else set()
        done = snap.compacted_generation if snap is not None else 0
        live = [p for p in parts if p.generation not in flushed and p.generation > done]
        mirror.forget({p.generation for p in parts} - {p.generation for p in live})
        out[mirror.shard_id] = live
    return out


async def take_snapshot(table: Table, mirrors: Sequence[MemtableMirror] = ()) -> LsmSnapshot:
    """Pin the table's LSM state now: :class:`~lance_async.lsm.snapshots.LsmSnapshot`.

    The mirrors' rows are taken first, then the table is moved to its latest
    version, the shard manifests read, and each shard's WAL tail read to its
    end (one thread hop; the tails are cached for the reads that follow).

    Raises
    ------
    InvalidInputError
        The table has no primary key.
    """
    keys = table.primary_key
    if not keys:
        raise InvalidInputError(NO_KEY)
    taken = _live_mirrors(mirrors)
    lance_ds, uri, options = table.lance, table.uri, table.storage_options

    def work() -> tuple[Any, LsmSnapshot]:
        newer, snaps = discover_latest(lance_ds, uri, storage_options=options)
        base = newer if newer is not None else lance_ds
        schema = base.schema
        parts = _unflushed_parts(taken, snaps)
        pinned = []
        for snap in snaps:
            if snap.shard_id in parts:  # read from the rows taken, not the WAL
                pinned.append(snap)
                continue
            tail = read_wal_tail(
                uri,
                snap.shard_id,
                snap.replay_after,
                schema,
                options,
                keys=keys,
                manifest_version=snap.manifest_version or None,
            )
            pinned.append(dataclasses.replace(snap, wal_end=tail.end))
        held = tuple(p for ps in parts.values() for p in ps)
        snapshot = LsmSnapshot(
            uri, int(base.version), tuple(pinned), held, frozenset(parts), time.time()
        )
        return newer, snapshot

    newer, snapshot = await run_engine(work)
    if newer is not None:
        table._advance(newer)
    return snapshot


async def open_view(
    table: Table,
    snapshots: Sequence[ShardSnapshot] | None = None,
    mirrors: Sequence[MemtableMirror] = (),
    *,
    pinned: LsmSnapshot | None = None,
) -> LsmView:
    """Resolve the levels of one read: base, generations, WAL tails, memtables.

    The mirrors' rows are taken first, then (with ``snapshots=None``) the
    table is moved to its latest version and the shard manifests are read,
    then each shard's WAL tail after the position the same manifest gives:
    a memtable flushed in between is read from its SSTable, a WAL entry
    flushed in between from the tail, so every row acked before this call
    is visible, and none twice.

    Parameters
    ----------
    table : Table
        An :class:`~lance_async.AsyncDataset`.
    snapshots : sequence of ShardSnapshot, optional
        Read these shards' levels, on the base table at the version ``table``
        reads, instead of discovering them (each tail up to its ``wal_end``,
        or up to now when it has none).
    mirrors : sequence of MemtableMirror
        This process's live writers' memtables; a shard with one is read
        from it instead of its WAL tail (the mirror holds every row the
        writer took, durable or not), unless a newer writer fenced it.
    pinned : LsmSnapshot, optional
        Read exactly this point-in-time view (``snapshots`` and ``mirrors``
        are then not used): its base version, its shards' generations and
        WAL positions, the unflushed rows it holds.

    Returns
    -------
    LsmView

    Raises
    ------
    InvalidInputError
        The table has no primary key, or ``snapshots`` of another kind.
    ManifestFormatError
        MemWAL files in a layout this version does not know.
    ViewExpiredError
        ``pinned`` given, and a file it pins was deleted since.

    Notes
    -----
    Runs on worker threads, one generation at a time (cancellable between
    them); a generation's keys are read once per process.
    """
    return (await _open(table, snapshots, mirrors, None, pinned))[0]


async def _open(
    table: Table,
    snapshots: Sequence[ShardSnapshot] | None,
    mirrors: Sequence[MemtableMirror],
    work: Callable[[LsmView], T] | None,
    pinned: LsmSnapshot | None = None,
) -> tuple[LsmView, tuple[T] | None]:
    """:func:`open_view`; with ``work``, also ``(work(view),)`` when discovery
    resolved the whole view in its own thread hop (else None)."""
    keys = table.primary_key
    if not keys:
        raise InvalidInputError(NO_KEY)
    memory_freed()  # what the reads before this one used is free now (rate-limited)
    read = _Read(table.uri, table.storage_options, keys, _live_mirrors(mirrors), pinned)
    if pinned is not None:
        snaps = list(pinned.shards)
        lance_ds = table.lance
        try:
            base = await run_engine(partial(pinned_base, lance_ds, table.uri, pinned.version))
        except (OSError, ValueError, LanceAsyncError) as exc:
            raise_expired(exc, f"version {pinned.version} of the base table")
            raise
    elif snapshots is None:
        # one hop: the latest version, the manifests, the WAL tails and (when
        # every shard's generations are resolved already, the common case)
        # the whole view
        lance_ds = table.lance

        def discover() -> tuple[Any, list[ShardSnapshot], LsmView | None, tuple[T] | None]:
            newer, snaps, view = read.discover_and_view(lance_ds)
            done = (work(view),) if work is not None and view is not None else None
            return newer, snaps, view, done

        newer, snaps, found, done = await run_engine(discover)
        if newer is not None:
            table._advance(newer)
        if found is not None:
            return found, done
        base = table.lance
    else:
        snaps = list(snapshots)
        for snap in snaps:
            if not isinstance(snap, ShardSnapshot):
                raise InvalidInputError(
                    "LSM reads take lance_async ShardSnapshot objects (dataset.lsm.snapshots())"
                )
        base = table.lance
    shards: list[ShardLevels] = []
    for snap in snaps:
        cached = read.cached_shard(snap)
        if cached is not None:  # no thread hop for a resolved shard
            shards.append(cached)
            continue
        gens = await _load_generations(read, snap, pinned is not None)
        shards.append(await run_engine(partial(resolve_shard, read.uri, snap, keys, gens)))
    return await run_engine(partial(read.finish, base, base.schema, snaps, shards)), None


GENERATION_LOADS = 4
"""Generations whose keys one read loads side by side (each on an engine thread)."""


async def _load_generations(read: _Read, snap: ShardSnapshot, pinned: bool) -> list[Generation]:
    """The keys of a shard's generations, loaded side by side, one generation
    per thread hop (cancellable between them); cached per process."""
    found: list[Generation | None] = [None] * len(snap.sstables)
    gate = anyio.Semaphore(GENERATION_LOADS)

    async def one(i: int, generation: int, path: str) -> None:
        load = partial(
            load_generation, read.uri, snap.shard_id, generation, path, read.keys, read.options
        )
        async with gate:
            try:
                found[i] = await run_engine(load)
            except (OSError, ValueError, LanceAsyncError) as exc:
                if pinned:
                    raise_expired(exc, f"generation {generation} of shard {snap.shard_id}")
                raise

    with unwrap_groups():
        async with anyio.create_task_group() as tg:
            for i, (generation, path) in enumerate(snap.sstables):
                tg.start_soon(one, i, generation, path)
    return [g for g in found if g is not None]


class _Read:
    """What one view needs beside the snapshots: the table's identity, the
    mirrors (or the pinned view's rows)."""

    def __init__(
        self,
        uri: str,
        options: dict[str, str] | None,
        keys: list[str],
        taken: list[tuple[MemtableMirror, list[MemPart]]],
        pinned: LsmSnapshot | None = None,
    ) -> None:
        self.uri, self.options, self.keys, self.taken = uri, options, keys, taken
        self.pinned = pinned

    def cached_shard(self, snap: ShardSnapshot) -> ShardLevels | None:
        hit: ShardLevels | None = _levels.get_item(
            (self.uri, snap.shard_id, tuple(snap.sstables), tuple(self.keys))
        )
        return hit

    def discover_and_view(self, ds: Any) -> tuple[Any, list[ShardSnapshot], LsmView | None]:
        """The latest version and its shards; the view too when every shard's
        generations are cached (blocking)."""
        newer, snaps = discover_latest(ds, self.uri, storage_options=self.options)
        for snap in snaps:  # what a compaction merged is never read again by a new view
            _levels.compacted((self.uri, snap.shard_id), snap.compacted_generation)
        shards = []
        for snap in snaps:
            cached = self.cached_shard(snap)
            if cached is None:
                return newer, snaps, None  # generations to read: one per hop
            shards.append(cached)
        base = newer if newer is not None else ds
        return newer, snaps, self.finish(base, base.schema, snaps, shards)

    def finish(
        self,
        base: Any,
        schema: pa.Schema,
        snaps: Sequence[ShardSnapshot],
        shards: list[ShardLevels],
    ) -> LsmView:
        """The view, once every shard's generations are resolved: the memtables
        of live local writers (or the pinned view's rows), the other shards'
        WAL tails, the shadow index (blocking)."""
        keys = self.keys
        key_types = [schema.field(k).type for k in keys]
        if self.pinned is not None:
            parts: dict[str, list[MemPart]] = {s: [] for s in self.pinned.mirrored}
            for part in self.pinned.unflushed:
                parts.setdefault(part.shard_id, []).append(part)
        else:
            parts = _unflushed_parts(self.taken, snaps)
        mirrors = {m.shard_id: m for m, _ in self.taken} if self.pinned is None else {}
        mems: list[MemLevel] = [
            resolve_memtable(shard, live, keys, mirrors.get(shard))
            for shard, live in parts.items()
            if live
        ]
        for snap in snaps:
            if snap.shard_id not in parts:
                try:
                    tail = tail_level(self.uri, snap, schema, keys, self.options)
                except (OSError, ValueError) as exc:
                    if self.pinned is not None:
                        raise_expired(exc, f"a WAL entry of shard {snap.shard_id}")
                    raise
                if tail is not None:
                    mems.append(tail)
        view = LsmView(base, schema, keys, shards, mems, _shadow(shards, key_types))
        view.pinned = self.pinned is not None
        return view


async def read_view(
    table: Table,
    work: Callable[[LsmView], T],
    mirrors: Sequence[MemtableMirror] = (),
) -> T:
    """``work(view)`` on a worker thread over a view opened now (:func:`open_view`).

    When every shard's generations are cached (the common case) discovery,
    the view and ``work`` share one thread hop: a point lookup then costs
    one hand-off, not two. ``work`` must be quick (it is not cancellable).
    """
    view, done = await _open(table, None, mirrors, work)
    if done is not None:
        return done[0]
    return await run_engine(partial(work, view))  # generations had to be read first
