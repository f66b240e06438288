"""The files of a shard's WAL: its entries, and lance_async's tail checkpoints.

A WAL entry is ``_mem_wal/<shard>/wal/<position>.arrow``: one Arrow IPC
*stream* with the table's columns plus ``_tombstone`` and the schema
metadata ``writer_epoch`` (``fence_sentinel`` on the data-less entry a
claiming writer writes first). :func:`read_entry` decodes one with a fast
path: the schema message is parsed once per distinct message (entries of
one writer share it), then only record batches are decoded, and a local
file is read with the OS calls alone -- the first read of a tail reads
thousands of small files.

A *tail checkpoint* is lance_async's own file beside them,
``_mem_wal/<shard>/lance_async_tail/<first>-<last>.arrows``: every row of
the entries ``first..last`` (in position order, with their positions), so
that the first read of a long tail in a process reads a few files instead
of one per entry. Any process that has read at least
:data:`CHECKPOINT_ENTRIES` entries no checkpoint covers writes one (in the
background; a store that refuses the write only means no checkpoint). A
checkpoint is used only when the entry ``last`` is still the file it was
(size and modification time, as the tail cache checks), and only for
positions after the shard's ``replay_after``; a file that does not decode
is passed over. Entries never change, so a checkpoint is exact while they
exist; one whose ``last`` a flush covers is obsolete (the MemWAL's storage
clean-up deletes it with the entries).
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import ManifestFormatError
from .manifest import position_name, read_bytes

__all__ = [
    "CHECKPOINT_ENTRIES",
    "TOMBSTONE",
    "Layout",
    "WalEntry",
    "checkpoint_files",
    "conform",
    "cut",
    "entry_path",
    "interned",
    "level_schema",
    "read_checkpoints",
    "read_entry",
    "stamp",
    "write_checkpoint",
]

log = logging.getLogger("lance_async.lsm")

TOMBSTONE = "_tombstone"
"""The column flagging a deleted key (WAL entries, flushed generations, mirrored rows)."""
POSITION = "_wal_position"
"""A checkpoint's column: the WAL position of each row."""
CHECKPOINT_ENTRIES = 256
"""Entries read that no checkpoint covers before a process writes one."""
CHECKPOINT_FOLDER = "lance_async_tail"
WHOLE_ROWS = 65_536
"""A tail of at most this many rows is checkpointed whole (one file to read)."""

_SCHEMAS = 256  # distinct entry schema messages kept (parsed once each)
_schemas: dict[tuple[bytes, int], Layout] = {}  # (schema message, id of the target)
_targets: dict[pa.Schema, pa.Schema] = {}  # one object per distinct target schema
_cache_lock = threading.Lock()


def level_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of unflushed rows: the table's fields, nullable and without
    metadata, plus ``_tombstone`` (a delete carries its key and nulls)."""
    return pa.schema(
        [f.with_nullable(True).remove_metadata() for f in schema]
        + [pa.field(TOMBSTONE, pa.bool_(), nullable=False)]
    )


@dataclass(frozen=True)
class Layout:
    """What one distinct schema message of WAL entries says (parsed once)."""

    schema: pa.Schema  # the entry's own
    target: pa.Schema  # the rows' (:func:`level_schema` of the table's)
    epoch: int
    sentinel: bool
    direct: bool  # the columns are the target's, in order (relabel only)
    path: str  # an entry of this layout (for error messages)

    def conform(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """Batches of this layout as one table in ``target`` (blocking)."""
        table = pa.Table.from_batches(batches, schema=self.schema)
        if self.direct:
            return pa.Table.from_arrays(table.columns, schema=self.target)
        return conform(table, self.target, self.path)


@dataclass(frozen=True)
class WalEntry:
    """One WAL entry of a shard, or a run of them read from a checkpoint (a span).

    Attributes
    ----------
    position : int
        1-based position in the shard's WAL (a span's first).
    writer_epoch : int
        The epoch of the writer that appended it (a span's last).
    batches : tuple of pa.RecordBatch
        Its record batches as written (empty for a fence sentinel).
    layout : Layout, optional
        Their schema and how it maps to :func:`level_schema`.
    end_position : int
        A span's last position (0 for a single entry).
    positions : np.ndarray of int64, optional
        A span's WAL position of each row, ascending (None for a single entry).
    epochs : tuple of int
        A span's writer epochs.
    """

    position: int
    writer_epoch: int
    batches: tuple[pa.RecordBatch, ...] = ()
    layout: Layout | None = field(default=None, repr=False)
    end_position: int = 0
    positions: np.ndarray | None = field(default=None, repr=False)
    epochs: tuple[int, ...] = ()

    @property
    def last(self) -> int:
        """The last position it holds (its own for a single entry)."""
        return self.end_position or self.position

    @property
    def num_rows(self) -> int:
        """Rows (puts and deletes) in the entry."""
        return sum(b.num_rows for b in self.batches)

    @property
    def rows(self) -> pa.Table | None:
        """Its rows in :func:`level_schema` (None for a fence sentinel)."""
        if self.layout is None or self.layout.sentinel:
            return None
        return self.layout.conform(self.batches)

    def row_positions(self) -> np.ndarray:
        """The WAL position of each of its rows (int64)."""
        if self.positions is not None:
            return self.positions
        return np.full(self.num_rows, self.position, np.int64)

    def part(self, after: int, before: int) -> WalEntry | None:
        """The part holding positions in ``(after, before)``, or None (a
        single entry is all or nothing; a span is cut)."""
        first, last = max(self.position, after + 1), min(self.last, before - 1)
        if first > last:
            return None
        if first == self.position and last == self.last:
            return self
        assert self.positions is not None  # only a span can be cut
        a, b = np.searchsorted(self.positions, [first, last + 1]).tolist()
        batches = tuple(x.slice(a, b - a) for x in self.batches) if b > a else ()
        return WalEntry(
            first, self.writer_epoch, batches, self.layout, last, self.positions[a:b], self.epochs
        )


def cut(entries: Sequence[WalEntry], after: int, before: int | None = None) -> list[WalEntry]:
    """The parts of ``entries`` (contiguous, ascending) holding positions in
    ``(after, before)`` (no bound when ``before`` is None; does not block)."""
    start = bisect.bisect_right(entries, after, key=lambda e: e.last)
    stop = (
        len(entries)
        if before is None
        else bisect.bisect_left(entries, before, key=lambda e: e.position)
    )
    out = []
    for e in entries[start:stop]:
        piece = e.part(after, before if before is not None else e.last + 1)
        if piece is not None:
            out.append(piece)
    return out


def stamp(fs: pafs.FileSystem, path: str) -> tuple[int, int] | None:
    """(size, modification time in ns) of ``path``, or None when it is not there."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    return (info.size or 0, info.mtime_ns or 0)


def conform(table: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
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


def entry_path(folder: str, entry: WalEntry | int) -> str:
    position = entry if isinstance(entry, int) else entry.last
    return f"{folder}/{position_name(position, '.arrow')}"


def interned(target: pa.Schema) -> pa.Schema:
    """One object per distinct target schema (so entry layouts key on its id;
    does not block)."""
    with _cache_lock:
        hit = _targets.get(target)
        if hit is None:
            if len(_targets) > _SCHEMAS:
                _targets.clear()
                _schemas.clear()
            hit = _targets[target] = target
        return hit


def _entry_schema(message: pa.ipc.Message, target: pa.Schema, path: str) -> Layout:
    """The parsed schema message, once per distinct message and target
    (thread-safe; ``target`` is :func:`_interned`)."""
    key = (message.metadata.to_pybytes(), id(target))
    hit = _schemas.get(key)
    if hit is not None and hit.target is target:
        return hit
    schema = pa.ipc.read_schema(message)
    meta = schema.metadata or {}
    direct = [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in target]
    parsed = Layout(
        schema,
        target,
        int(meta.get(b"writer_epoch", b"0")),
        meta.get(b"fence_sentinel") == b"true",
        direct,
        path,
    )
    with _cache_lock:
        if len(_schemas) > _SCHEMAS:
            _schemas.clear()
        _schemas[key] = parsed
    return parsed


def _decode(data: bytes, position: int, target: pa.Schema, path: str) -> WalEntry:
    """One entry's bytes (an IPC stream) as a :class:`WalEntry` in ``target``."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    head = reader.read_next_message()
    if head.type != "schema":
        raise ValueError(f"a {head.type} message first")
    parsed = _entry_schema(head, target, path)
    if parsed.sentinel:
        return WalEntry(position, parsed.epoch, (), parsed)
    batches = []
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        if message.type != "record batch":  # dictionaries: the general reader
            with pa.ipc.open_stream(pa.py_buffer(data)) as full:
                batches = list(full.read_all().combine_chunks().to_batches())
            break
        batches.append(pa.ipc.read_record_batch(message, parsed.schema))
    return WalEntry(position, parsed.epoch, tuple(b for b in batches if b.num_rows), parsed)


def _read_local(path: str) -> bytes:
    """A local file's bytes (the OS calls alone: the first read of a tail
    reads thousands of small files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_entry(
    fs: pafs.FileSystem, folder: str, position: int, schema: pa.Schema
) -> WalEntry | None:
    """The entry at ``position``, or None when there is none (yet)."""
    path = entry_path(folder, position)
    try:
        data = _read_local(path) if isinstance(fs, pafs.LocalFileSystem) else read_bytes(fs, path)
    except FileNotFoundError:
        return None
    try:
        return _decode(data, position, schema, path)
    except (pa.ArrowInvalid, ValueError, OSError, StopIteration) as exc:
        raise ManifestFormatError(f"{path}: not a WAL entry ({exc!r})") from exc


def rows_of(entries: Sequence[WalEntry], schema: pa.Schema) -> pa.Table:
    """Every row of ``entries`` in position order, in ``schema`` (blocking):
    the batches of consecutive entries of one layout become one table."""
    tables: list[pa.Table] = []
    run: list[pa.RecordBatch] = []
    layout: Layout | None = None
    for e in entries:
        if not e.batches or e.layout is None:
            continue
        if e.layout is not layout and run:
            assert layout is not None
            tables.append(layout.conform(run))
            run = []
        layout = e.layout
        run.extend(e.batches)
    if run:
        assert layout is not None
        tables.append(layout.conform(run))
    if not tables:
        return schema.empty_table()
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


# -- tail checkpoints ------------------------------------------------------------


@dataclass(frozen=True)
class _Checkpoint:
    first: int
    last: int
    path: str


def _checkpoints(fs: pafs.FileSystem, shard_folder: str) -> list[_Checkpoint]:
    """The checkpoint files of a shard (one listing; blocking)."""
    folder = f"{shard_folder}/{CHECKPOINT_FOLDER}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    out = []
    for info in infos:
        stem, dot, ext = info.base_name.partition(".")
        first, dash, last = stem.partition("-")
        named = dot and ext == "arrows" and dash and first.isdigit() and last.isdigit()
        if named and int(first) <= int(last):
            out.append(_Checkpoint(int(first), int(last), info.path))
    return out


def checkpoint_files(fs: pafs.FileSystem, shard_folder: str) -> list[tuple[int, int, str]]:
    """(first position, last position, path) of each tail checkpoint of a
    shard, for the clean-up (one listing; blocking)."""
    return [(p.first, p.last, p.path) for p in _checkpoints(fs, shard_folder)]


def _epochs_text(entries: Sequence[WalEntry]) -> str:
    """The writer epochs of ``entries``, comma-separated, ascending."""
    found = {x for e in entries for x in (e.epochs or (e.writer_epoch,))}
    return ",".join(str(x) for x in sorted(found))


def write_checkpoint(
    fs: pafs.FileSystem,
    shard_folder: str,
    entries: Sequence[WalEntry],
    last_stamp: tuple[int, int],
    target: pa.Schema,
) -> str:
    """Write the checkpoint of ``entries`` (contiguous; blocking). Returns its path.

    The file appears whole: a local one is written beside and renamed, an
    object store's PUT is atomic.
    """
    first, last = entries[0].position, entries[-1].last
    table = rows_of(entries, target)
    positions = np.concatenate([e.row_positions() for e in entries] or [np.zeros(0, np.int64)])
    table = table.append_column(pa.field(POSITION, pa.int64(), nullable=False), pa.array(positions))
    meta = {
        "lance_async.checkpoint": "1",
        "first": str(first),
        "last": str(last),
        "stamp": f"{last_stamp[0]}:{last_stamp[1]}",
        "epochs": _epochs_text(entries),
    }
    # one record batch, not one per entry: a stream of 1,281 small batches
    # took 12-24 ms to read back (a process's first WAL-tail read), one 0.1 ms
    table = table.replace_schema_metadata(meta).combine_chunks()
    folder = f"{shard_folder}/{CHECKPOINT_FOLDER}"
    path = f"{folder}/{first:020d}-{last:020d}.arrows"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(folder, exist_ok=True)
        scratch = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(scratch, "wb") as out:
            out.write(data)
        os.replace(scratch, path)
    else:
        with fs.open_output_stream(path) as out:
            out.write(data)
    return path


def _read_checkpoint(
    fs: pafs.FileSystem, point: _Checkpoint, wal_folder: str, target: pa.Schema
) -> WalEntry | None:
    """A checkpoint as one span, or None when it is not to be used (blocking)."""
    try:
        data = read_bytes(fs, point.path)
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            table = reader.read_all()
    except (OSError, pa.ArrowInvalid, ValueError) as exc:
        log.debug("lance_async: tail checkpoint %s passed over: %s", point.path, exc)
        return None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if (
        meta.get("lance_async.checkpoint") != "1"
        or meta.get("first") != str(point.first)
        or meta.get("last") != str(point.last)
        or POSITION not in table.column_names
    ):
        return None
    size, _, mtime = meta.get("stamp", "").partition(":")
    if stamp(fs, entry_path(wal_folder, point.last)) != (int(size or -1), int(mtime or -1)):
        return None  # its entries are not this WAL's (the table was made again)
    epochs = tuple(int(x) for x in meta.get("epochs", "").split(",") if x.isdigit())
    positions = table.column(POSITION).to_numpy().astype(np.int64)
    rows = table.drop_columns([POSITION]).replace_schema_metadata(None).combine_chunks()
    schema = rows.schema
    direct = [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in target]
    layout = Layout(schema, target, 0, False, direct, point.path)
    batches = tuple(rows.to_batches()) if rows.num_rows else ()
    return WalEntry(
        point.first,
        epochs[-1] if epochs else 0,
        batches,
        layout,
        point.last,
        positions,
        epochs,
    )


def read_checkpoints(
    fs: pafs.FileSystem, shard_folder: str, start: int, target: pa.Schema
) -> list[WalEntry]:
    """The entries from ``start`` on that checkpoints hold, contiguous, as
    spans (one listing, one read per checkpoint used, one metadata request
    each; blocking)."""
    points = _checkpoints(fs, shard_folder)
    wal_folder = f"{shard_folder}/wal"
    out: list[WalEntry] = []
    position = start
    while points:
        usable = [p for p in points if p.first <= position <= p.last]
        if not usable:
            break
        best = max(usable, key=lambda p: p.last)
        span = _read_checkpoint(fs, best, wal_folder, target)
        points.remove(best)
        if span is None:
            continue
        piece = span.part(position - 1, best.last + 1)
        if piece is not None:
            out.append(piece)
        position = best.last + 1
    return out
