"""LSM reads over a MemWAL table, and compaction of flushed generations.

A MemWAL table has three levels: the base table, each shard's flushed
generations (SSTables, immutable Lance datasets under ``_mem_wal/``) and
each live writer's memtable. The reads here combine the base table and the
flushed SSTables, newest row per primary key winning; a live
:class:`~lance_async.AsyncShardWriter` offers the same reads over its
memtable too.

* :func:`shard_snapshots` -- what each shard has flushed (and not yet
  compacted). pylance 14 has no public listing, so the shard manifests are
  read from storage (see ``_manifest.py`` for the format relied on).
* :func:`lsm_scan`, :func:`lsm_point_lookup`, :func:`lsm_vector_search` --
  ``LsmScanner`` / ``LsmPointLookupPlanner`` / ``LsmVectorSearchPlanner`` on
  worker threads.
* :func:`compact_mem_wal` -- merges flushed generations into the base table
  with merge_insert and ``mark_sstables_as_compacted`` in the same commit.
  SSTables never change, so each generation is a *replayable* source:
  a conflict re-reads it, nothing is buffered.

Notes
-----
pylance 14's ``LsmScanner`` has no streaming reader: the scan is collected
in the engine on a worker thread (without the GIL), then handed to the loop
batch by batch. Project the columns you need.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import (
    CompactedSsTable,
    LsmPointLookupPlanner,
    LsmScanner,
    LsmVectorSearchPlanner,
)
from lance.mem_wal import ShardSnapshot as LanceShardSnapshot

from . import _manifest
from ._retired import NO_KEY, retired_shards
from ._schema import primary_key
from ._threads import run_sync
from .errors import InvalidInputError, SchemaMismatchError, raise_mapped
from .sources import replayable
from .sources.streams import AsyncBatchStream

if TYPE_CHECKING:
    from .dataset import AsyncDataset

__all__ = [
    "CompactionResult",
    "ShardSnapshot",
    "ShardSnapshots",
    "compact_mem_wal",
    "exact_knn",
    "key_filter",
    "lsm_point_lookup",
    "lsm_scan",
    "lsm_vector_search",
    "shard_snapshots",
]

log = logging.getLogger("lance_async")
TOMBSTONE = "_tombstone"


@dataclass(frozen=True)
class ShardSnapshot:
    """What one MemWAL shard has flushed, as of one read of its manifest.

    Attributes
    ----------
    shard_id : str
    spec_id : int
        The sharding spec the shard was written under.
    current_generation : int
        The generation its writer fills now (not flushed).
    sstables : tuple of (generation, path)
        Flushed generations not yet compacted into the base table, oldest
        first; ``path`` is relative to ``<table>/_mem_wal/<shard_id>/``.
    compacted_generation : int
        Highest generation already merged into the base table (0 if none).
    manifest_version : int
        The shard manifest version read.
    """

    shard_id: str
    spec_id: int
    current_generation: int
    sstables: tuple[tuple[int, str], ...] = field(default_factory=tuple)
    compacted_generation: int = 0
    manifest_version: int = 0

    @property
    def lance(self) -> LanceShardSnapshot:
        """The equivalent ``lance.mem_wal.ShardSnapshot`` (built fresh)."""
        snap = LanceShardSnapshot(self.shard_id)
        snap.with_spec_id(self.spec_id).with_current_generation(self.current_generation)
        for gen, path in self.sstables:
            snap.with_sstable(gen, path)
        return snap


ShardSnapshots = Sequence[ShardSnapshot]


def _discover(
    uri: str,
    version: int,
    shard_ids: Iterable[str] | None = None,
    include_compacted: bool = False,
    retired: frozenset[str] = frozenset(),
) -> list[ShardSnapshot]:
    compacted = {} if include_compacted else _manifest.compacted_generations(uri, version)
    wanted = set(shard_ids) if shard_ids is not None else None
    out: list[ShardSnapshot] = []
    for sid in _manifest.list_shards(uri):
        if sid in retired or (wanted is not None and sid not in wanted):
            continue
        manifest = _manifest.read_shard_manifest(uri, sid)
        if manifest is None:
            continue
        done = compacted.get(sid, 0)
        out.append(
            ShardSnapshot(
                shard_id=sid,
                spec_id=manifest.spec_id,
                current_generation=manifest.current_generation,
                sstables=tuple(
                    (s.generation, s.path) for s in manifest.sstables if s.generation > done
                ),
                compacted_generation=done,
                manifest_version=manifest.version,
            )
        )
    return out


async def shard_snapshots(
    dataset: AsyncDataset,
    shard_ids: Iterable[str] | None = None,
    *,
    include_compacted: bool = False,
) -> list[ShardSnapshot]:
    """Discover each MemWAL shard's current generation and flushed SSTables.

    Reads the shard manifests (the newest version of each) and the dataset's
    record of compacted generations, on a worker thread. Generations already
    compacted into the base table are left out, so reads never let an old
    SSTable shadow newer base rows, and so are shards retired when the
    MemWAL was initialized again (``lance_async._retired``). A version
    without a MemWAL (after an overwrite) has no shards.

    Parameters
    ----------
    dataset : AsyncDataset
        Moved to its latest version first.
    shard_ids : iterable of str, optional
        Only these shards.
    include_compacted : bool
        Keep generations already compacted into the base table too (for
        readers whose base table is an older version, such as a shard
        writer's: its base predates the compaction).

    Returns
    -------
    list of ShardSnapshot
        One per shard with a manifest, sorted by shard id.

    Raises
    ------
    ManifestFormatError
        The on-disk layout is not the one pylance 14.0.2 writes.
    """
    await dataset.refresh()
    uri, version, ds = dataset.uri, dataset.version, dataset.lance
    ids = list(shard_ids) if shard_ids is not None else None

    def work() -> list[ShardSnapshot]:
        if ds.mem_wal_index_details() is None:
            return []  # no MemWAL at this version: folders are an earlier MemWAL's
        return _discover(uri, version, ids, include_compacted, retired_shards(ds))

    return await run_sync(work)


def _lance_snaps(snapshots: Iterable[Any]) -> list[LanceShardSnapshot]:
    return [s.lance if isinstance(s, ShardSnapshot) else s for s in snapshots]


def _is_not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "Not found" in text or "not found" in text or "NotFound" in text


async def _with_snapshots(
    dataset: AsyncDataset,
    snapshots: ShardSnapshots | None,
    work: Callable[[Any, list[Any], list[LanceShardSnapshot]], Any],
) -> Any:
    """Run ``work(lance_dataset, snapshots, engine_snapshots)`` on a worker thread.

    With ``snapshots=None`` they are discovered; if a generation vanished
    meanwhile (compaction and clean-up racing the read), discovery and the
    read are retried a few times.
    """
    if not primary_key(dataset.schema):
        raise InvalidInputError(NO_KEY)
    attempts = 3 if snapshots is None else 1
    for attempt in range(1, attempts + 1):
        snaps = list(snapshots) if snapshots is not None else await shard_snapshots(dataset)
        ds = dataset.lance
        raw = _lance_snaps(snaps)
        try:
            return await run_sync(partial(work, ds, snaps, raw))
        except (OSError, ValueError, RuntimeError) as exc:
            if attempt < attempts and _is_not_found(exc):
                log.debug("lance_async: LSM read raced a flush or compaction; retrying")
                await anyio.sleep(0.01 * attempt)
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def scanner_stream(
    make_scanner: Callable[[], Awaitable[Any]],
    schema: pa.Schema,
    columns: Sequence[str] | None,
    filter: str | None,
    limit: int | None,
) -> AsyncBatchStream:
    """An :class:`AsyncBatchStream` over an engine ``LsmScanner``.

    ``schema`` is the table schema; the stream's schema is its projection.
    """
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise SchemaMismatchError(f"no column {missing[0]!r} in the table", field=missing[0])
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)

    async def prepare() -> Callable[[], Any]:
        scanner = await make_scanner()

        def opener() -> pa.RecordBatchReader:
            sc = scanner
            try:
                if columns is not None:
                    sc = sc.project(list(columns))
                if filter:
                    sc = sc.filter(filter)
                if limit is not None:
                    sc = sc.limit(limit)
                batches = [b for b in sc.to_batches() if b.num_rows]
            except (OSError, ValueError, RuntimeError) as exc:
                raise_mapped(exc)
                raise
            if not batches:
                return pa.RecordBatchReader.from_batches(schema, [])
            return pa.RecordBatchReader.from_batches(batches[0].schema, batches)

        return opener

    return AsyncBatchStream(None, schema=schema, prepare=prepare)


def lsm_scan(
    dataset: AsyncDataset,
    snapshots: ShardSnapshots | None = None,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    limit: int | None = None,
) -> AsyncBatchStream:
    """Scan the base table and flushed SSTables, newest row per primary key.

    Parameters
    ----------
    dataset : AsyncDataset
    snapshots : list of ShardSnapshot, optional
        Default: discovered now (:func:`shard_snapshots`).
    columns : list of str, optional
    filter : str, optional
        Lance SQL, applied to the newest version of each row.
    limit : int, optional

    Returns
    -------
    AsyncBatchStream
        Rows of live memtables are not included; use the writer's
        :meth:`~lance_async.AsyncShardWriter.lsm_scan` for those.
    """

    async def make() -> Any:
        return await _with_snapshots(
            dataset, snapshots, lambda ds, _snaps, raw: LsmScanner.from_snapshots(ds, raw)
        )

    return scanner_stream(make, dataset.schema, columns, filter, limit)


def _sql_literal(value: Any, dtype: pa.DataType) -> str:
    if value is None:
        raise InvalidInputError("a primary-key value cannot be null")
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "'" + str(value).replace("'", "''") + "'"
    if pa.types.is_integer(dtype):
        try:
            if isinstance(value, (bool, str, bytes)) or int(value) != value:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"key {value!r} is not an integer") from None
        return str(int(value))
    if pa.types.is_floating(dtype):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidInputError(f"key {value!r} is not a number") from None
        if not math.isfinite(number):
            raise InvalidInputError(f"key {value!r} is not a finite number")
        return repr(number)
    if pa.types.is_boolean(dtype):
        return "true" if value else "false"
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        scalar = pa.scalar(value, type=dtype)
        return f"CAST('{scalar}' AS {'TIMESTAMP' if pa.types.is_timestamp(dtype) else 'DATE'})"
    raise InvalidInputError(f"lookups by a {dtype} key are not supported")


def _key_values(schema: pa.Schema, keys: Sequence[str], key: Any) -> list[tuple[str, Any]]:
    if not keys:
        raise InvalidInputError("point lookups need a primary key, and the table has none")
    if isinstance(key, Mapping):
        missing = [k for k in keys if k not in key]
        if missing:
            raise SchemaMismatchError(f"the key lacks column {missing[0]!r}", field=missing[0])
        return [(k, key[k]) for k in keys]
    if isinstance(key, (tuple, list)):
        if len(key) != len(keys):
            raise InvalidInputError(f"the primary key has {len(keys)} column(s): {keys}")
        return list(zip(keys, key, strict=True))
    if len(keys) != 1:
        raise InvalidInputError(f"the primary key is composite {keys}: pass a dict or a tuple")
    return [(keys[0], key)]


def key_filter(schema: pa.Schema, keys: Sequence[str], key: Any) -> str:
    """A Lance SQL filter selecting one primary key (values quoted safely)."""
    return " AND ".join(
        f"`{name}` = {_sql_literal(value, schema.field(name).type)}"
        for name, value in _key_values(schema, keys, key)
    )


def _key_array(schema: pa.Schema, keys: Sequence[str], key: Any) -> pa.Array:
    pairs = _key_values(schema, keys, key)
    if any(value is None for _, value in pairs):
        raise InvalidInputError("a primary-key value cannot be null")
    try:
        arrays = [pa.array([value], type=schema.field(name).type) for name, value in pairs]
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise InvalidInputError(f"key {key!r} does not fit the key type: {exc}") from exc
    if len(arrays) == 1:
        return arrays[0]
    return pa.StructArray.from_arrays(arrays, names=[n for n, _ in pairs])


async def lsm_point_lookup(
    dataset: AsyncDataset,
    key: Any,
    columns: Sequence[str] | None = None,
    snapshots: ShardSnapshots | None = None,
) -> pa.Table:
    """The newest row for one primary key across base table and SSTables.

    Parameters
    ----------
    key : scalar, dict or tuple
        The key value; composite keys as ``{"a": 1, "b": "x"}`` or ``(1, "x")``.
    columns : list of str, optional
    snapshots : list of ShardSnapshot, optional
        Default: discovered now.

    Returns
    -------
    pa.Table
        0 rows (absent or deleted) or 1 row.

    Raises
    ------
    InvalidInputError
        A key of the wrong shape or type.
    """
    schema = dataset.schema
    keys = primary_key(schema)
    array = _key_array(schema, keys, key)
    cols = list(columns) if columns is not None else None

    def work(ds: Any, _snaps: list[Any], raw: list[LanceShardSnapshot]) -> pa.Table:
        planner = LsmPointLookupPlanner(ds, raw, keys)
        return planner.plan_lookup(array, cols).to_table()

    result: pa.Table = await _with_snapshots(dataset, snapshots, work)
    return result


def _distances(vectors: pa.Array, query: np.ndarray, metric: str) -> np.ndarray:
    if len(vectors) == 0:
        return np.zeros(0, dtype=np.float32)
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    dim = query.shape[0]
    valid = np.asarray(vectors.is_valid())
    flat = vectors.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    mat = np.full((len(vectors), dim), np.nan, dtype=np.float32)
    mat[valid] = flat.reshape(-1, dim)
    if metric == "l2":
        out = ((mat - query) ** 2).sum(axis=1)
    elif metric == "cosine":
        norms = np.linalg.norm(mat, axis=1) * np.linalg.norm(query)
        out = 1.0 - (mat @ query) / np.where(norms == 0, np.nan, norms)
    elif metric == "dot":
        out = -(mat @ query)
    else:
        raise InvalidInputError(f"unknown metric {metric!r}; use l2, cosine or dot")
    return np.where(np.isnan(out), np.inf, out).astype(np.float32)


def exact_knn(table: pa.Table, column: str, query: Any, k: int, metric: str = "l2") -> pa.Table:
    """Rank ``table``'s rows by exact distance from ``query`` (blocking, numpy).

    Returns the ``k`` nearest rows with a ``_distance`` column (float32, the
    squared L2 distance for ``"l2"`` as Lance reports it).
    """
    if k < 1:
        raise InvalidInputError("k must be >= 1")
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if column not in table.column_names:
        raise SchemaMismatchError(f"no vector column {column!r}", field=column)
    dist = _distances(table.column(column), q, metric)
    order = np.argsort(dist, kind="stable")[:k]
    order = order[np.isfinite(dist[order])]
    picked = table.take(pa.array(order, type=pa.int64()))
    return picked.append_column("_distance", pa.array(dist[order], type=pa.float32()))


def exact_knn_scan(
    scanner: Any,
    column: str,
    query: Any,
    k: int,
    metric: str = "l2",
    *,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Exact k nearest rows of an engine ``LsmScanner`` (blocking).

    Reads only ``columns`` plus the vector column when ``columns`` is given
    (every column otherwise); the result has ``columns`` (or all) and
    ``_distance``.
    """
    sc = scanner.filter(filter) if filter else scanner
    if columns is not None:
        sc = sc.project(list(dict.fromkeys([*columns, column])))
    result = exact_knn(sc.to_table(), column, query, k, metric)
    return result.select([*columns, "_distance"]) if columns is not None else result


def _has_vector_index(ds: Any, column: str, *, complete: bool = False) -> bool:
    """True when ``column`` has a vector index (covering every row if ``complete``)."""
    try:
        names = [
            d.name
            for d in ds.describe_indices()
            if column in (d.field_names or []) and "VectorIndex" in (d.type_url or "")
        ]
        if not names:
            return False
        if not complete:
            return True
        return any(int(ds.stats.index_stats(n).get("num_unindexed_rows", 1)) == 0 for n in names)
    except (OSError, ValueError, RuntimeError, KeyError):
        return False


async def lsm_vector_search(
    dataset: AsyncDataset,
    query: Any,
    *,
    column: str,
    k: int = 10,
    nprobes: int = 20,
    filter: str | None = None,
    snapshots: ShardSnapshots | None = None,
    columns: Sequence[str] | None = None,
    metric: str = "l2",
    overfetch_factor: float = 4.0,
) -> pa.Table:
    """k nearest rows across the base table and SSTables, newest version per key.

    With a vector index on ``column`` that covers every base row, created
    before the MemWAL writes (so the SSTables carry it too), this runs
    ``LsmVectorSearchPlanner`` with ``overfetch_factor`` (default 4: the
    planner otherwise under-fills when newer generations shadow base rows).
    pylance 14's planner ignores unindexed base rows, so without such an
    index -- or when an SSTable lacks it -- the search is exact over the LSM
    view (slower, always right). :func:`compact_mem_wal` brings indexes up to
    date after compacting, keeping the fast path.

    Returns
    -------
    pa.Table
        At most ``k`` rows with ``_distance``, nearest first.

    Raises
    ------
    InvalidInputError
        ``k`` < 1, a bad metric or query.
    """
    if k < 1:
        raise InvalidInputError("k must be >= 1")
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    cols = list(columns) if columns is not None else None
    keys = primary_key(dataset.schema)
    uri = dataset.uri

    def index_covers(ds: Any, snaps: list[Any]) -> bool:
        import lance

        if not _has_vector_index(ds, column, complete=True):
            return False
        for snap in snaps:
            if not isinstance(snap, ShardSnapshot):
                continue  # an engine snapshot given by the caller: trust it
            for _gen, path in snap.sstables:
                gen_ds = lance.dataset(posixpath.join(uri, "_mem_wal", snap.shard_id, path))
                if not _has_vector_index(gen_ds, column):
                    return False
        return True

    def work(ds: Any, snaps: list[Any], raw: list[LanceShardSnapshot]) -> pa.Table:
        if index_covers(ds, snaps):
            planner = LsmVectorSearchPlanner(
                ds, raw, column, pk_columns=keys or None, distance_type=metric, filter=filter
            )
            plan = planner.plan_search(
                pa.array(q, type=pa.float32()),
                k=k,
                nprobes=nprobes,
                columns=[*(cols if cols is not None else ds.schema.names), "_distance"],
                overfetch_factor=overfetch_factor,
            )
            return plan.to_table()
        sc = LsmScanner.from_snapshots(ds, raw)
        return exact_knn_scan(sc, column, q, k, metric, filter=filter, columns=cols)

    table: pa.Table = await _with_snapshots(dataset, snapshots, work)
    return table


# ---------------------------------------------------------------------------
# compaction
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact_mem_wal` did.

    Attributes
    ----------
    generations : dict of str to list of int
        Generations compacted, per shard id.
    rows_upserted, rows_deleted : int
        Rows merged into / removed from the base table.
    commits : int
        Dataset versions committed.
    num_attempts : int
        merge_insert attempts in total (more than commits after conflicts).
    version : int
        The dataset version after compaction.
    """

    generations: dict[str, list[int]]
    rows_upserted: int
    rows_deleted: int
    commits: int
    num_attempts: int
    version: int


def _identity(value: Any) -> Any:
    return value


def _generation_plan(
    gen_uri: str, keys: list[str], key_schema: pa.Schema
) -> tuple[pa.Array, pa.Table | None]:
    """Rows of a generation to upsert (indices) and keys to delete.

    A generation holds the newest state of each key it saw (the engine
    dedups when it flushes); the last occurrence wins if a key repeats.
    """
    import lance

    gen = lance.dataset(gen_uri)
    meta = gen.to_table(columns=[*keys, TOMBSTONE])
    n = meta.num_rows
    idx = pa.array(np.arange(n, dtype=np.int64))
    meta = meta.append_column("__row", idx)
    last = meta.group_by(keys, use_threads=False).aggregate([("__row", "max")])
    keep = pc.sort_indices(last["__row_max"])
    last_rows = pc.take(last["__row_max"], keep)
    tomb = pc.take(meta[TOMBSTONE], last_rows)
    live = pc.filter(last_rows, pc.invert(tomb))
    dead_rows = pc.filter(last_rows, tomb)
    deletes = meta.select(keys).take(dead_rows).cast(key_schema) if len(dead_rows) else None
    return live.combine_chunks() if isinstance(live, pa.ChunkedArray) else live, deletes


async def compact_mem_wal(
    dataset: AsyncDataset,
    shard_ids: Iterable[str] | None = None,
    *,
    chunk_rows: int = 65_536,
    optimize_indices: bool = True,
) -> CompactionResult:
    """Merge every flushed, not yet compacted generation into the base table.

    For each shard, oldest generation first: keys whose newest state in the
    generation is a delete are removed with a merge_insert (``when_matched_delete``);
    then the generation's live rows are upserted with a merge_insert that
    also records ``mark_sstables_as_compacted`` for that generation, in the
    same commit (so a crash between the two passes leaves the generation
    uncompacted, and running again converges). Each pass reads the immutable
    SSTable through a :func:`~lance_async.replayable` source: a conflict
    re-reads it in chunks of ``chunk_rows``, nothing is buffered.

    Parameters
    ----------
    dataset : AsyncDataset
        Moved to the version the compaction commits.
    shard_ids : iterable of str, optional
        Only these shards (default all).
    chunk_rows : int
        Rows per batch read from an SSTable (default 65,536).
    optimize_indices : bool
        After compacting, bring the table's indexes up to date
        (``optimize.optimize_indices``, one more commit) so indexed reads and
        the LSM vector planner cover the compacted rows (default True).

    Returns
    -------
    CompactionResult

    Raises
    ------
    InvalidInputError
        The table has no primary key.
    ContentionError
        Concurrent writers won every attempt of a pass.
    """
    keys = primary_key(dataset.schema)
    if not keys:
        raise InvalidInputError("compacting a MemWAL needs a primary key")
    table_cols = dataset.schema.names
    key_schema = pa.schema([dataset.schema.field(k) for k in keys])
    snaps = await shard_snapshots(dataset, shard_ids)
    done: dict[str, list[int]] = {}
    upserted = deleted = commits = attempts = 0
    for snap in snaps:
        for gen, path in snap.sstables:
            gen_uri = posixpath.join(dataset.uri, "_mem_wal", snap.shard_id, path)
            live, deletes = await run_sync(partial(_generation_plan, gen_uri, keys, key_schema))
            if deletes is not None and deletes.num_rows:
                res = await (
                    dataset.merge_insert(keys)
                    .when_matched_delete()
                    .execute(replayable(partial(_identity, deletes), schema=key_schema))
                )
                deleted += res.num_deleted_rows
                commits += 1
                attempts += res.num_attempts

            def factory(u: str = gen_uri, rows: pa.Array = live) -> Iterable[pa.RecordBatch]:
                import lance

                gen_ds = lance.dataset(u)
                for start in range(0, len(rows), chunk_rows):
                    part = gen_ds.take(rows.slice(start, chunk_rows), columns=table_cols)
                    yield from part.combine_chunks().to_batches()

            schema = dataset.schema
            res = await (
                dataset.merge_insert(keys)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .mark_sstables_as_compacted([CompactedSsTable(snap.shard_id, gen)])
                .execute(replayable(factory, schema=schema))
            )
            upserted += res.num_inserted_rows + res.num_updated_rows
            commits += 1
            attempts += res.num_attempts
            done.setdefault(snap.shard_id, []).append(gen)
    if commits and optimize_indices:

        def optimize(d: Any) -> bool:
            if len(d.describe_indices()) <= 1:  # only the MemWAL's own index
                return False
            d.optimize.optimize_indices()
            return True

        if await dataset._mutate(optimize):
            commits += 1
    if not commits:
        await anyio.lowlevel.checkpoint()
    return CompactionResult(done, upserted, deleted, commits, attempts, dataset.version)
