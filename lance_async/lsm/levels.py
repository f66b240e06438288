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

import posixpath
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from .._schema import NO_KEY
from .._table import Table
from .._threads import run_engine
from ..errors import InvalidInputError
from .keyindex import KeyIndex, key_codes
from .memtable import MemPart, MemtableMirror
from .snapshots import ShardSnapshot, discover_latest
from .wal import TOMBSTONE, read_wal_tail

__all__ = [
    "ROWADDR",
    "Generation",
    "LsmView",
    "MemLevel",
    "ShardLevels",
    "load_generation",
    "open_view",
    "read_view",
]

T = TypeVar("T")

ROWADDR = "_rowaddr"
_GENERATIONS = 1024  # generations whose keys are kept (about 17 bytes per row)
_SHARDS = 256  # resolved shards kept
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


_gen_cache = _Lru(_GENERATIONS)
_shard_cache = _Lru(_SHARDS)
_shadow_cache = _Lru(_SHADOWS)
_tail_cache = _Lru(_SHARDS)


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
    hit: Generation | None = _gen_cache.get_item((gen_uri, tuple(keys)))
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
    result: Generation = _gen_cache.put((gen_uri, tuple(keys)), gen)
    return result


def _first_occurrence(columns: list[pa.Array], total: int) -> np.ndarray:
    """Mask of the first row of each distinct key (exact, whatever the key type)."""
    codes, exact = key_codes(columns)
    win = np.zeros(total, dtype=bool)
    if exact:
        _, first = np.unique(codes, return_index=True)
        win[first] = True
        return win
    t = pa.table(
        [*columns, pa.array(np.arange(total))], names=[*map(str, range(len(columns))), "__o"]
    )
    first = t.group_by([str(i) for i in range(len(columns))], use_threads=False).aggregate(
        [("__o", "min")]
    )
    win[first.column("__o_min").to_numpy()] = True
    return win


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
    hit: ShardLevels | None = _shard_cache.get_item(cache_key)
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
        win = _first_occurrence(cols, total)
        winners, offset = [], 0
        for g, o in zip(gens, order, strict=True):
            mask = np.zeros(len(g), dtype=bool)
            mask[o] = win[offset : offset + len(g)]
            winners.append(mask)
            offset += len(g)
        levels = ShardLevels(snapshot.shard_id, gens, winners)
    result: ShardLevels = _shard_cache.put(cache_key, levels)
    return result


@dataclass
class MemLevel:
    """The newest mirrored row of each key of one shard's unflushed memtables.

    Attributes
    ----------
    shard_id : str
    table : pa.Table
        One row per key (table columns, nullable, plus ``_tombstone``).
    index : KeyIndex
        Over ``table``'s key columns.
    """

    shard_id: str
    table: pa.Table
    index: KeyIndex

    @property
    def tomb(self) -> np.ndarray:
        """True where the newest state of the key is a delete."""
        return np.asarray(self.table.column(TOMBSTONE).to_numpy(zero_copy_only=False), dtype=bool)

    def live(self) -> pa.Table | None:
        """The rows whose newest state is not a delete, without ``_tombstone``
        (None when there are none)."""
        keep = ~self.tomb
        if not keep.any():
            return None
        return self.table.filter(pa.array(keep)).drop_columns([TOMBSTONE])


def resolve_memtable(shard_id: str, parts: Sequence[MemPart], keys: Sequence[str]) -> MemLevel:
    """The newest row per key among a shard's mirrored memtable parts (blocking)."""
    ordered = sorted(parts, key=lambda p: p.generation)
    table = pa.concat_tables([p.table for p in ordered]) if ordered else None
    if table is None or table.num_rows == 0:
        empty = ordered[0].table.schema.empty_table() if ordered else pa.table({})
        return MemLevel(shard_id, empty, KeyIndex([pa.array([], pa.int64())]))
    n = table.num_rows
    rev = pa.array(np.arange(n - 1, -1, -1))
    cols = [table.column(k).combine_chunks().take(rev) for k in keys]
    win = _first_occurrence(cols, n)
    rows = np.sort(n - 1 - np.flatnonzero(win))
    newest = table.take(pa.array(rows)).combine_chunks()
    return MemLevel(shard_id, newest, KeyIndex([newest.column(k) for k in keys]))


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


def _tail_level(
    uri: str,
    snap: ShardSnapshot,
    schema: pa.Schema,
    keys: list[str],
    storage_options: dict[str, str] | None,
) -> MemLevel | None:
    """The shard's WAL tail, resolved (blocking; cached per position reached)."""
    tail = read_wal_tail(uri, snap.shard_id, snap.replay_after, schema, storage_options)
    if not tail.rows.num_rows:
        return None
    cache_key = (
        uri,
        snap.shard_id,
        tail.replay_after,
        tail.end,
        tail.stamp,
        tail.rows.schema,
        tuple(keys),
    )
    hit: MemLevel | None = _tail_cache.get_item(cache_key)
    if hit is not None:
        return hit
    level = resolve_memtable(snap.shard_id, [MemPart(snap.shard_id, 0, tail.rows)], keys)
    result: MemLevel = _tail_cache.put(cache_key, level)
    return result


async def open_view(
    table: Table,
    snapshots: Sequence[ShardSnapshot] | None = None,
    mirrors: Sequence[MemtableMirror] = (),
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
        Default: discovered now (:func:`~lance_async.lsm.snapshots.shard_snapshots`).
    mirrors : sequence of MemtableMirror
        This process's live writers' memtables; a shard with one is read
        from it instead of its WAL tail (the mirror holds every row the
        writer took, durable or not), unless a newer writer fenced it.

    Returns
    -------
    LsmView

    Raises
    ------
    InvalidInputError
        The table has no primary key, or ``snapshots`` of another kind.
    ManifestFormatError
        MemWAL files in a layout this version does not know.

    Notes
    -----
    Runs on worker threads, one generation at a time (cancellable between
    them); a generation's keys are read once per process.
    """
    return (await _open(table, snapshots, mirrors, None))[0]


async def _open(
    table: Table,
    snapshots: Sequence[ShardSnapshot] | None,
    mirrors: Sequence[MemtableMirror],
    work: Callable[[LsmView], T] | None,
) -> tuple[LsmView, tuple[T] | None]:
    """:func:`open_view`; with ``work``, also ``(work(view),)`` when discovery
    resolved the whole view in its own thread hop (else None)."""
    keys = table.primary_key
    if not keys:
        raise InvalidInputError(NO_KEY)
    taken = _live_mirrors(mirrors)
    read = _Read(table.uri, table.storage_options, keys, taken)
    if snapshots is None:
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
            table.advance(newer)
        if found is not None:
            return found, done
    else:
        snaps = list(snapshots)
        for snap in snaps:
            if not isinstance(snap, ShardSnapshot):
                raise InvalidInputError(
                    "LSM reads take lance_async ShardSnapshot objects (dataset.shard_snapshots())"
                )
    base = table.lance
    shards: list[ShardLevels] = []
    for snap in snaps:
        cached = read.cached_shard(snap)
        if cached is not None:  # no thread hop for a resolved shard
            shards.append(cached)
            continue
        gens = []
        for generation, path in snap.sstables:  # one generation per hop: cancellable
            gens.append(
                await run_engine(
                    partial(
                        load_generation,
                        read.uri,
                        snap.shard_id,
                        generation,
                        path,
                        keys,
                        read.options,
                    )
                )
            )
        shards.append(await run_engine(partial(resolve_shard, read.uri, snap, keys, gens)))
    return await run_engine(partial(read.finish, base, base.schema, snaps, shards)), None


class _Read:
    """What one view needs beside the snapshots: the table's identity and the mirrors."""

    def __init__(
        self,
        uri: str,
        options: dict[str, str] | None,
        keys: list[str],
        taken: list[tuple[MemtableMirror, list[MemPart]]],
    ) -> None:
        self.uri, self.options, self.keys, self.taken = uri, options, keys, taken

    def cached_shard(self, snap: ShardSnapshot) -> ShardLevels | None:
        hit: ShardLevels | None = _shard_cache.get_item(
            (self.uri, snap.shard_id, tuple(snap.sstables), tuple(self.keys))
        )
        return hit

    def discover_and_view(self, ds: Any) -> tuple[Any, list[ShardSnapshot], LsmView | None]:
        """The latest version and its shards; the view too when every shard's
        generations are cached (blocking)."""
        newer, snaps = discover_latest(ds, self.uri, storage_options=self.options)
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
        of live local writers, the other shards' WAL tails, the shadow index
        (blocking)."""
        keys = self.keys
        key_types = [schema.field(k).type for k in keys]
        by_shard = {s.shard_id: s for s in snaps}
        mems: list[MemLevel] = []
        mirrored: set[str] = set()
        for mirror, parts in self.taken:
            snap = by_shard.get(mirror.shard_id)
            if snap is not None and mirror.epoch and snap.writer_epoch > mirror.epoch:
                continue  # fenced by a newer writer: its WAL tail is the truth
            mirrored.add(mirror.shard_id)
            flushed = {g for g, _ in snap.sstables} if snap is not None else set()
            done = snap.compacted_generation if snap is not None else 0
            live = [p for p in parts if p.generation not in flushed and p.generation > done]
            mirror.forget({p.generation for p in parts} - {p.generation for p in live})
            if live:
                mems.append(resolve_memtable(mirror.shard_id, live, keys))
        for snap in snaps:
            if snap.shard_id not in mirrored:
                tail = _tail_level(self.uri, snap, schema, keys, self.options)
                if tail is not None:
                    mems.append(tail)
        return LsmView(base, schema, keys, shards, mems, _shadow(shards, key_types))


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
