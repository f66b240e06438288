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

Reading is incremental and cached per process. Entries never change once
written, so each shard keeps what it read and the next read only probes the
positions after the newest one. Beside the entries, each shard keeps its
tail *resolved* (:class:`TailRows`): the newest state of every key, with the
WAL position that holds it and a :class:`~lance_async.lsm.keyindex.KeyIndex`
over the keys -- the index from keys to positions that every LSM read
probes. It is kept incrementally: new entries are resolved on their own and
merged in (the rows of keys they hold again are dropped), and a flush that
moves ``replay_after`` forward only drops the rows at positions it covers (a
key's newest state after a position is its newest state overall, or the key
has none there). A read whose tail did not move costs one probe of the next
position and nothing else, whatever the tail's length.

The first read of a shard in a process starts from the shard's *tail
checkpoints* (``walfiles.py``: files of lance_async's own beside the WAL,
each holding the rows of a run of entries, written by any process that read
enough entries no checkpoint covered, and by a lance_async writer as its WAL
grows: :func:`follow_tail`), then reads the entries after them with a fast
path (an entry's IPC schema message parsed once per distinct schema, then
only record batches decoded) and, on an object store, many at once: it lists
the WAL folder and fetches the entries side by side. A run read from a
checkpoint is kept as one span, not one object per entry.

A pinned read (``stop=``, a point-in-time view: ``LsmReader.snapshot()``)
reads exactly the positions ``replay_after + 1 .. stop - 1``, from the cache
where it holds them and from the store otherwise; one missing entry means a
clean-up deleted it: :class:`~lance_async.errors.ViewExpiredError`.

An entry's file can still be replaced as a whole: the table deleted and made
again at the same URI (shard ids are derived from the sharding spec, so they
come back the same). So the cache keeps the size and modification time of
the newest entry it read and looks at that file again on each read (one
metadata request beside the probe of the next position); a file gone or
different starts the shard's cache over.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .._memory import memory_freed
from .._storage import filesystem
from ..errors import ViewExpiredError
from . import walfiles
from .keyindex import KeyIndex, first_occurrence
from .manifest import parse_position, position_name, read_shard_manifest
from .walfiles import (
    TOMBSTONE,
    WalEntry,
    cut,
    entry_path,
    interned,
    level_schema,
    read_checkpoints,
    rows_of,
)
from .walfiles import read_entry as _read_entry
from .walfiles import stamp as file_stamp

log = logging.getLogger("lance_async.lsm")

__all__ = [
    "TOMBSTONE",
    "TailRows",
    "WalEntry",
    "WalTail",
    "follow_tail",
    "level_schema",
    "read_wal_tail",
]


_SHARDS = 1024  # shards whose tail is kept per process
_PINNED = 64  # resolved pinned ranges kept per process
_PROBE_LIMIT = 1 << 20  # entries read in one call at most (a runaway guard)
_REMOTE_THREADS = 16  # entries fetched side by side from an object store
_REMOTE_AFTER = 4  # entries probed one by one before the folder is listed


@dataclass(frozen=True)
class TailRows:
    """The newest state of each key in a run of a shard's WAL entries.

    Attributes
    ----------
    table : pa.Table
        One row per key, in :func:`level_schema`, in WAL position order
        (deletes included: ``_tombstone`` true).
    positions : np.ndarray of int64, shape (rows,)
        The WAL position of the entry that holds each row.
    index : KeyIndex
        Over ``table``'s key columns: a key's row (and so its position).
    """

    table: pa.Table
    positions: np.ndarray
    index: KeyIndex

    @cached_property
    def tomb(self) -> np.ndarray:
        """True where the key's newest state is a delete."""
        return np.asarray(self.table.column(TOMBSTONE).to_numpy(zero_copy_only=False), dtype=bool)


def _empty_rows(schema: pa.Schema, keys: Sequence[str]) -> TailRows:
    empty = schema.empty_table()
    return TailRows(empty, np.zeros(0, np.int64), KeyIndex([empty.column(k) for k in keys]))


def _resolve(entries: Sequence[WalEntry], schema: pa.Schema, keys: Sequence[str]) -> TailRows:
    """The newest state per key among ``entries`` (position order; blocking)."""
    if not any(e.batches for e in entries):
        return _empty_rows(schema, keys)
    positions = np.concatenate([e.row_positions() for e in entries])
    table = rows_of(entries, schema)
    n = table.num_rows
    rev = pa.array(np.arange(n - 1, -1, -1))
    cols = [table.column(k).combine_chunks().take(rev) for k in keys]
    win = first_occurrence(cols, n)
    rows = np.sort(n - 1 - np.flatnonzero(win))
    newest = table.take(pa.array(rows)).combine_chunks()
    return TailRows(newest, positions[rows], KeyIndex([newest.column(k) for k in keys]))


def _merge(old: TailRows, new: TailRows, keys: Sequence[str]) -> TailRows:
    """``old`` followed by ``new`` (newer entries): the rows of ``old`` whose key
    ``new`` holds again are dropped (blocking, O(rows))."""
    if not old.table.num_rows:
        return new
    if not new.table.num_rows:
        return old
    keep = ~new.index.contains([old.table.column(k) for k in keys])
    kept = old.table.filter(pa.array(keep)) if not keep.all() else old.table
    table = pa.concat_tables([kept, new.table]).combine_chunks()
    positions = np.concatenate([old.positions[keep], new.positions])
    return TailRows(table, positions, KeyIndex([table.column(k) for k in keys]))


def _trim(rows: TailRows, floor: int, keys: Sequence[str]) -> TailRows:
    """The rows at positions after ``floor``: the newest states of the entries
    after it (a key's newest state is either there or the key has none)."""
    keep = rows.positions > floor
    if keep.all():
        return rows
    table = rows.table.filter(pa.array(keep))
    return TailRows(table, rows.positions[keep], KeyIndex([table.column(k) for k in keys]))


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
    log : tuple of WalEntry
        The entries, in position order (sentinels included).
    epochs : tuple of int
        The distinct writer epochs of the entries, ascending.
    stamp : tuple of int, optional
        (size, modification time in ns) of the newest entry's file: with
        ``end``, what tells this tail from another table's at the same URI
        (a cache of anything made of the rows keys on both).
    newest : TailRows, optional
        The newest state of each key (when the read was given ``keys``).
    """

    shard_id: str
    replay_after: int
    end: int
    log: tuple[WalEntry, ...] = ()
    epochs: tuple[int, ...] = ()
    stamp: tuple[int, int] | None = None
    newest: TailRows | None = None
    schema: pa.Schema | None = field(default=None, repr=False)

    @property
    def entries(self) -> int:
        """Entries in the tail (sentinels included)."""
        return self.end - self.replay_after - 1

    @property
    def row_count(self) -> int:
        """Rows (puts and deletes) in the entries (does not block)."""
        return sum(e.num_rows for e in self.log)

    @cached_property
    def rows(self) -> pa.Table:
        """Every row of the entries, in position order (:func:`level_schema`):
        the last row of a key is its newest state (built on first use)."""
        assert self.schema is not None
        return rows_of(self.log, self.schema)


class _ShardTail:
    """What this process has read of one shard's WAL (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.schema: pa.Schema | None = None  # the rows' schema
        self.floor = 0  # entries kept are those after this position
        self.entries: list[WalEntry] = []  # contiguous, from floor + 1
        self.stamp: tuple[int, int] | None = None  # (size, mtime ns) of the newest entry's file
        self.newest: dict[tuple[str, ...], tuple[int, TailRows]] = {}  # keys -> (end, rows)
        self.incarnation = 0  # changes whenever the cache starts over
        self.looked = False  # the checkpoints were looked at (on the first read)
        self.checkpointed = 0  # the last position a checkpoint is known to cover

    def clear(self, schema: pa.Schema, floor: int) -> None:
        self.schema, self.floor, self.entries, self.stamp = schema, floor, [], None
        self.newest = {}
        self.incarnation += 1
        self.looked, self.checkpointed = False, 0

    @property
    def end(self) -> int:
        return (self.entries[-1].last if self.entries else self.floor) + 1

    def resolved(self, keys: tuple[str, ...]) -> TailRows:
        """The newest state per key of the kept entries, brought up to date
        incrementally (blocking; called with ``lock`` held)."""
        assert self.schema is not None
        end = self.end
        hit = self.newest.get(keys)
        if hit is not None and hit[0] == end:
            return hit[1]
        if hit is None:
            rows = _resolve(self.entries, self.schema, keys)
        else:
            new = cut(self.entries, hit[0] - 1)
            rows = _merge(hit[1], _resolve(new, self.schema, keys), keys)
        self.newest[keys] = (end, rows)
        return rows


_tails: OrderedDict[tuple[str, str], _ShardTail] = OrderedDict()
_tails_lock = threading.Lock()
_pinned: OrderedDict[tuple[object, ...], TailRows] = OrderedDict()
_cache_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


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


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _cache_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_REMOTE_THREADS, thread_name_prefix="lance_async wal")
        return _pool


def _listed(fs: pafs.FileSystem, folder: str, start: int) -> list[int]:
    """The positions from ``start`` on that the WAL folder lists, contiguous."""
    found = set()
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        p = parse_position(info.base_name, ".arrow")
        if p is not None and p >= start:
            found.add(p)
    out = []
    while start in found:
        out.append(start)
        start += 1
    return out


def _probe(
    fs: pafs.FileSystem, folder: str, start: int, stop: int | None, schema: pa.Schema
) -> list[WalEntry]:
    """Entries from ``start`` on, up to the first missing one (or ``stop``, exclusive).

    On a local disk one by one (the decoding is the cost, and it holds the
    GIL); on an object store the first few one by one, then, when there are
    more, the folder is listed and the rest fetched side by side.
    """
    out: list[WalEntry] = []
    position = start
    remote = not isinstance(fs, pafs.LocalFileSystem)
    while (stop is None or position < stop) and len(out) < _PROBE_LIMIT:
        if remote and len(out) == _REMOTE_AFTER:
            listed = [p for p in _listed(fs, folder, position) if stop is None or p < stop]
            for entry in _executor().map(lambda p: _read_entry(fs, folder, p, schema), listed):
                if entry is None:  # listed, then gone: the tail ends before it
                    return out
                out.append(entry)
            position = out[-1].position + 1 if out else position
            if not listed:
                return out
            continue  # probe past what was listed (appended meanwhile)
        entry = _read_entry(fs, folder, position, schema)
        if entry is None:
            break
        out.append(entry)
        position += 1
    return out


def _removed(folder: str, position: int) -> ViewExpiredError:
    return ViewExpiredError(
        f"WAL entry {position} of {folder} was removed by a clean-up while this read's "
        "view still needed it (the view is older than the retention): read again from a "
        "fresh view"
    )


def _check_current(
    fs: pafs.FileSystem,
    uri: str,
    shard_id: str,
    folder: str,
    manifest_version: int,
    end: int,
    storage_options: Mapping[str, str] | None,
) -> None:
    """After a probe: raise if a clean-up may have removed entries it missed.

    A clean-up removes an entry only once a manifest newer than the view's
    flushed it. So while no manifest newer than ``manifest_version`` exists,
    the probe saw every entry; otherwise the first position it did not find
    (``end``) must not be flushed-and-gone.
    """
    manifests = f"{folder.rsplit('/', 1)[0]}/manifest"
    following = f"{manifests}/{position_name(manifest_version + 1, '.binpb')}"
    own = f"{manifests}/{position_name(manifest_version, '.binpb')}"
    if (
        fs.get_file_info(following).type == pafs.FileType.NotFound
        and fs.get_file_info(own).type != pafs.FileType.NotFound
    ):
        # no newer manifest (a clean-up removes manifests oldest first, so
        # the next one is never gone while this one is there): nothing the
        # view's manifest covers can be gone
        return
    newest = read_shard_manifest(uri, shard_id, storage_options)
    if newest is None or newest.replay_after < end:
        return  # the first missing position is not flushed: it does not exist yet
    if fs.get_file_info(entry_path(folder, end)).type == pafs.FileType.NotFound:
        raise _removed(folder, end)


def read_wal_tail(
    uri: str,
    shard_id: str,
    replay_after: int,
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None = None,
    *,
    keys: Sequence[str] | None = None,
    stop: int | None = None,
    manifest_version: int | None = None,
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
    keys : sequence of str, optional
        The primary-key columns: the result's ``newest`` then holds the
        newest state of each key (kept incrementally between reads).
    stop : int, optional
        Read exactly the positions before ``stop`` (a pinned view): every
        one must exist. Default: up to the first missing position (now).
    manifest_version : int, optional
        The shard manifest version ``replay_after`` comes from: given, the
        read checks after its probe that no clean-up removed an entry it
        needed (one metadata request; more only when a newer manifest exists).

    Returns
    -------
    WalTail

    Raises
    ------
    ManifestFormatError
        An entry that is not an Arrow IPC stream of the table's columns.
    ViewExpiredError
        ``stop`` given and an entry before it is gone, or (``manifest_version``
        given, or an older ``replay_after`` than the cache's) an entry this
        view still needs was deleted by a clean-up.
    OSError
        The store failed (anything but "not found").

    Notes
    -----
    Only new positions are read: one probe of the next position when nothing
    was appended. A read with an older ``replay_after`` than the cache's
    (an explicit, older snapshot) reads the positions it lacks directly.
    """
    fs, root = filesystem(uri, storage_options)
    shard_folder = f"{root}/_mem_wal/{shard_id}"
    folder = f"{shard_folder}/wal"
    target = interned(level_schema(schema))
    key_names = tuple(keys) if keys is not None else None
    tail = _tail_of(uri, shard_id)
    with tail.lock:
        if tail.schema != target:  # first read, or the table's schema changed
            tail.clear(target, replay_after)
        elif tail.entries and file_stamp(fs, entry_path(folder, tail.entries[-1])) != tail.stamp:
            tail.clear(target, replay_after)  # the WAL was made again (the table re-created)
        elif not tail.entries:
            tail.floor = replay_after  # nothing kept: start where the caller's snapshot does
            tail.newest = {}
        if replay_after > tail.floor:
            if tail.entries and tail.entries[0].position <= replay_after:
                memory_freed()  # a flush covered entries: their rows go now
            tail.entries = cut(tail.entries, replay_after)
            tail.floor = replay_after
            tail.newest = {
                k: (end, _trim(rows, replay_after, k))
                for k, (end, rows) in tail.newest.items()
                if end > replay_after + 1 and tail.entries
            }
        if stop is None or stop > tail.end:
            fresh = []
            merge = False
            if not tail.looked and not tail.entries:  # a process's first read: checkpoints
                tail.looked = True
                fresh = read_checkpoints(fs, shard_folder, tail.end, target)
                if stop is not None:
                    fresh = cut(fresh, 0, stop)
                if fresh:
                    tail.checkpointed = fresh[-1].last
                merge = len(fresh) > 1  # several files: one for the next process
            fresh += _probe(fs, folder, fresh[-1].last + 1 if fresh else tail.end, stop, target)
            if fresh:
                tail.entries.extend(fresh)
                tail.stamp = file_stamp(fs, entry_path(folder, fresh[-1]))
            _checkpoint_later(fs, shard_folder, tail, merge)
        older: list[WalEntry] = []
        if replay_after < tail.floor:
            upto = tail.floor + 1 if stop is None else min(tail.floor + 1, stop)
            older = _probe(fs, folder, replay_after + 1, upto, target)
            got = older[-1].last + 1 if older else replay_after + 1
            if got < upto:  # each of these was written: a later manifest covers it
                raise _removed(folder, got)
        cached = tail.entries if stop is None else cut(tail.entries, tail.floor, stop)
        entries = older + list(cached)
        stamp, incarnation = tail.stamp, tail.incarnation
        end = entries[-1].last + 1 if entries else replay_after + 1
        if stop is not None and end != stop:
            raise ViewExpiredError(
                f"WAL entry {end} of shard {shard_id} (pinned up to {stop - 1}) is gone: "
                "a clean-up deleted it after the view was taken; take a new snapshot"
            )
        if stop is None and manifest_version is not None:
            _check_current(fs, uri, shard_id, folder, manifest_version, end, storage_options)
        newest: TailRows | None = None
        if key_names is not None:
            if not older and (stop is None or stop == tail.end):
                newest = tail.resolved(key_names)
            else:
                newest = _pinned_rows(
                    (uri, shard_id, incarnation, replay_after, end, key_names, target),
                    entries,
                    target,
                    key_names,
                )
    epochs = tuple(sorted({x for e in entries for x in (e.epochs or (e.writer_epoch,))}))
    return WalTail(shard_id, replay_after, end, tuple(entries), epochs, stamp, newest, target)


def _checkpoint_later(
    fs: pafs.FileSystem, shard_folder: str, tail: _ShardTail, merge: bool = False
) -> None:
    """Write a checkpoint of the kept entries no checkpoint covers, when there
    are enough of them, in the background (called with ``tail.lock`` held).

    While the tail holds at most :data:`~.walfiles.WHOLE_ROWS` rows the
    checkpoint covers all of it (from the first position after the flushed
    ones), so a new process reads one file; past that, only what no
    checkpoint covers. With ``merge`` (the first read of this process found
    the tail in several checkpoints) it covers all of it whatever its size.
    """
    tail.checkpointed = max(tail.checkpointed, tail.floor)
    todo = cut(tail.entries, tail.checkpointed)
    if not todo or tail.stamp is None or tail.schema is None:
        return
    if not merge and todo[-1].last - todo[0].position + 1 < walfiles.CHECKPOINT_ENTRIES:
        return
    if merge or sum(e.num_rows for e in tail.entries) <= walfiles.WHOLE_ROWS:
        todo = list(tail.entries)  # one file for the whole tail while it is small
    tail.checkpointed = todo[-1].last
    last_stamp, target = tail.stamp, tail.schema

    def write() -> None:
        try:
            walfiles.write_checkpoint(fs, shard_folder, todo, last_stamp, target)
        except Exception as exc:  # a store that refuses it: no checkpoint, that is all
            log.debug("lance_async: no tail checkpoint under %s: %s", shard_folder, exc)

    _executor().submit(write)


_following: set[tuple[str, str]] = set()


def follow_tail(
    uri: str, shard_id: str, schema: pa.Schema, storage_options: Mapping[str, str] | None = None
) -> None:
    """Read a shard's new WAL entries in the background, so that its tail
    checkpoints get written as it grows (a writer calls it every few hundred
    appends: then even a process's first read after the writer died reads a
    few checkpoints, not every entry). Does not block; at most one read per
    shard at a time; a failure is logged, never raised.
    """
    key = (uri, shard_id)
    with _cache_lock:
        if key in _following:
            return
        _following.add(key)

    def job() -> None:
        try:
            manifest = read_shard_manifest(uri, shard_id, storage_options)
            after = manifest.replay_after if manifest is not None else 0
            read_wal_tail(uri, shard_id, after, schema, storage_options)
        except Exception as exc:  # only a checkpoint is missed
            log.debug("lance_async: the WAL tail of %s was not followed: %s", shard_id, exc)
        finally:
            with _cache_lock:
                _following.discard(key)

    _executor().submit(job)


def _pinned_rows(
    cache_key: tuple[object, ...],
    entries: Sequence[WalEntry],
    schema: pa.Schema,
    keys: Sequence[str],
) -> TailRows:
    """The newest states of a fixed run of entries (resolved once per process)."""
    with _cache_lock:
        hit = _pinned.get(cache_key)
        if hit is not None:
            _pinned.move_to_end(cache_key)
            return hit
    rows = _resolve(entries, schema, keys)
    with _cache_lock:
        _pinned[cache_key] = rows
        while len(_pinned) > _PINNED:
            _pinned.popitem(last=False)
    return rows
