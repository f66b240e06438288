"""The WAL tail: rows that are durable but not yet flushed, visible to every process.

A shard writer acknowledges a durable put once its WAL entry is written, and
flushes the memtable to a generation (an SSTable) much later, or never when
its process dies. Until then the rows are only in the WAL, which pylance
replays when the next writer opens the shard. lance_async's LSM reads read
that tail themselves, so a row acknowledged as durable is visible in any
process at once, without waiting for a flush or for the shard to reopen.

What is read is exactly what a new writer of the shard replays (Lance's
MemWAL spec, checked against the engine by the tests):

* a shard's WAL is ``_mem_wal/<shard>/wal/<position>.arrow``, positions 1, 2,
  3, ... named in binary, least significant bit first; each entry is one
  Arrow IPC *stream* written atomically (put-if-absent), with the table's
  columns plus ``_tombstone`` and the schema metadata ``writer_epoch``;
* the shard manifest's ``replay_after_wal_entry_position`` is the last
  position a flushed generation covers: the tail is every entry after it,
  in position order (later positions are newer);
* a data-less entry marked ``fence_sentinel`` is written by a writer that
  claims the shard, before it replays: it holds no rows. A fenced writer's
  next append collides with it (put-if-absent) and fails, so no entry of a
  fenced writer exists past its successor's sentinel;
* entries are contiguous ("if entry N is not fully written, entry N + 1 must
  not exist"), so the tail ends at the first missing position.

Reading is incremental and cached per process: entries never change once
written, so each shard keeps what it read and the next read only probes the
positions after the newest one. When the manifest moves ``replay_after``
forward (a flush), the entries it covers are dropped: their rows are in a
generation the same manifest lists. An entry's file can still be replaced
as a whole: the table deleted and made again at the same URI (shard ids are
derived from the sharding spec, so they come back the same). So the cache
keeps the size and modification time of the newest entry it read and looks
at that file again on each read (one metadata request beside the probe of
the next position); a file gone or different starts the shard's cache over.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from .._storage import filesystem
from ..errors import ManifestFormatError
from .manifest import position_name, read_bytes

__all__ = ["TOMBSTONE", "WalEntry", "WalTail", "level_schema", "read_wal_tail"]

TOMBSTONE = "_tombstone"
"""The column flagging a deleted key (WAL entries, flushed generations, mirrored rows)."""

_SHARDS = 1024  # shards whose tail is kept per process
_PROBE_LIMIT = 1 << 20  # entries read in one call at most (a runaway guard)


def level_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of unflushed rows: the table's fields, nullable and without
    metadata, plus ``_tombstone`` (a delete carries its key and nulls)."""
    return pa.schema(
        [f.with_nullable(True).remove_metadata() for f in schema]
        + [pa.field(TOMBSTONE, pa.bool_(), nullable=False)]
    )


@dataclass(frozen=True)
class WalEntry:
    """One WAL entry of a shard.

    Attributes
    ----------
    position : int
        1-based position in the shard's WAL.
    writer_epoch : int
        The epoch of the writer that appended it.
    rows : pa.Table or None
        Its rows in :func:`level_schema` (``None`` for a fence sentinel).
    """

    position: int
    writer_epoch: int
    rows: pa.Table | None


@dataclass(frozen=True)
class WalTail:
    """A shard's durable, unflushed rows as of one read.

    Attributes
    ----------
    shard_id : str
    replay_after : int
        The manifest's last flushed position; the tail starts after it.
    end : int
        One past the last entry read (``replay_after + 1`` when empty).
    rows : pa.Table
        The rows of the entries, in position order (:func:`level_schema`):
        the last row of a key is its newest state.
    epochs : tuple of int
        The distinct writer epochs of the entries, ascending.
    stamp : tuple of int, optional
        (size, modification time in ns) of the newest entry's file: with
        ``end``, what tells this tail from another table's at the same URI
        (a cache of anything made of the rows keys on both).
    """

    shard_id: str
    replay_after: int
    end: int
    rows: pa.Table
    epochs: tuple[int, ...] = ()
    stamp: tuple[int, int] | None = None

    @property
    def entries(self) -> int:
        """Entries in the tail (sentinels included)."""
        return self.end - self.replay_after - 1


class _ShardTail:
    """What this process has read of one shard's WAL (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.schema: pa.Schema | None = None  # the rows' schema
        self.floor = 0  # entries kept are those after this position
        self.entries: list[WalEntry] = []  # contiguous, from floor + 1
        self.stamp: tuple[int, int] | None = None  # (size, mtime ns) of the newest entry's file

    def clear(self, schema: pa.Schema, floor: int) -> None:
        self.schema, self.floor, self.entries, self.stamp = schema, floor, [], None


_tails: OrderedDict[tuple[str, str], _ShardTail] = OrderedDict()
_tails_lock = threading.Lock()


def _tail_of(uri: str, shard_id: str) -> _ShardTail:
    with _tails_lock:
        tail = _tails.get((uri, shard_id))
        if tail is None:
            tail = _tails[(uri, shard_id)] = _ShardTail()
            while len(_tails) > _SHARDS:
                _tails.popitem(last=False)
        else:
            _tails.move_to_end((uri, shard_id))
        return tail


def _stamp(fs: pafs.FileSystem, path: str) -> tuple[int, int] | None:
    """(size, modification time in ns) of ``path``, or None when it is not there."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    return (info.size or 0, info.mtime_ns or 0)


def _conform(table: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
    """An entry's rows in ``schema`` (columns added since are null; dropped ones go)."""
    n = table.num_rows
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ManifestFormatError(
                        f"{path}: column {f.name!r} is {col.type}, the table's is {f.type}"
                    ) from exc
            columns.append(col)
        elif f.name == TOMBSTONE:
            columns.append(pa.array([False] * n, pa.bool_()))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _entry_path(folder: str, entry: WalEntry | int) -> str:
    position = entry if isinstance(entry, int) else entry.position
    return f"{folder}/{position_name(position, '.arrow')}"


def _read_entry(
    fs: pafs.FileSystem, folder: str, position: int, schema: pa.Schema
) -> WalEntry | None:
    """The entry at ``position``, or None when there is none (yet)."""
    path = _entry_path(folder, position)
    try:
        data = read_bytes(fs, path)
    except FileNotFoundError:
        return None
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            meta = reader.schema.metadata or {}
            epoch = int(meta.get(b"writer_epoch", b"0"))
            if meta.get(b"fence_sentinel") == b"true":
                return WalEntry(position, epoch, None)
            table = reader.read_all()
    except (pa.ArrowInvalid, ValueError) as exc:
        raise ManifestFormatError(f"{path}: not a WAL entry ({exc})") from exc
    return WalEntry(position, epoch, _conform(table, schema, path))


def _probe(
    fs: pafs.FileSystem, folder: str, start: int, stop: int | None, schema: pa.Schema
) -> list[WalEntry]:
    """Entries from ``start`` on, up to the first missing one (or ``stop``, exclusive)."""
    out: list[WalEntry] = []
    position = start
    while (stop is None or position < stop) and len(out) < _PROBE_LIMIT:
        entry = _read_entry(fs, folder, position, schema)
        if entry is None:
            break
        out.append(entry)
        position += 1
    return out


def read_wal_tail(
    uri: str,
    shard_id: str,
    replay_after: int,
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None = None,
) -> WalTail:
    """The durable, unflushed rows of one shard (blocking; cached per process).

    Parameters
    ----------
    uri : str
        The table.
    shard_id : str
    replay_after : int
        The shard manifest's ``replay_after_wal_entry_position`` from the
        same snapshot as the generations the caller reads (so no row is in
        neither and none is lost to a flush in between).
    schema : pa.Schema
        The table schema; rows come back in :func:`level_schema` of it.
    storage_options : mapping, optional
        The table's object-store options.

    Returns
    -------
    WalTail

    Raises
    ------
    ManifestFormatError
        An entry that is not an Arrow IPC stream of the table's columns.
    OSError
        The store failed (anything but "not found").

    Notes
    -----
    Only new positions are read: one probe of the next position when nothing
    was appended. A read with an older ``replay_after`` than the cache's
    (an explicit, older snapshot) reads the positions it lacks directly.
    """
    fs, root = filesystem(uri, storage_options)
    folder = f"{root}/_mem_wal/{shard_id}/wal"
    target = level_schema(schema)
    tail = _tail_of(uri, shard_id)
    with tail.lock:
        if tail.schema != target:  # first read, or the table's schema changed
            tail.clear(target, replay_after)
        elif tail.entries and _stamp(fs, _entry_path(folder, tail.entries[-1])) != tail.stamp:
            tail.clear(target, replay_after)  # the WAL was made again (the table re-created)
        elif not tail.entries:
            tail.floor = replay_after  # nothing kept: start where the caller's snapshot does
        if replay_after > tail.floor:
            drop = replay_after - tail.floor
            tail.entries = tail.entries[drop:] if drop < len(tail.entries) else []
            tail.floor = replay_after
        older: list[WalEntry] = []
        if replay_after < tail.floor:
            older = _probe(fs, folder, replay_after + 1, tail.floor + 1, target)
        start = tail.floor + len(tail.entries) + 1
        fresh = _probe(fs, folder, start, None, target)
        if fresh:
            tail.entries.extend(fresh)
            tail.stamp = _stamp(fs, _entry_path(folder, fresh[-1]))
        entries = older + list(tail.entries)
        stamp = tail.stamp
    tables = [e.rows for e in entries if e.rows is not None and e.rows.num_rows]
    rows = pa.concat_tables(tables) if tables else target.empty_table()
    end = entries[-1].position + 1 if entries else replay_after + 1
    epochs = tuple(sorted({e.writer_epoch for e in entries}))
    return WalTail(shard_id, replay_after, end, rows, epochs, stamp)
