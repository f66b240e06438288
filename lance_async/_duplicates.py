"""Duplicate keys inside one source: found, named, or resolved newest-wins.

A merge_insert source that repeats a join key is ambiguous: pylance
inserts a repeated *new* key twice and rejects a repeated key that matches a
row. A MemWAL put that repeats a primary key keeps whichever copy the LSM
reads sort first. lance_async refuses both by default, with a
:class:`~lance_async.errors.DuplicateKeyError` naming the key, before
anything is committed; ``keep_last`` is the explicit opt-in that keeps the
last occurrence of each key (source order), as a feed's newest-wins would.

Everything here is blocking CPU work over the key columns only (Arrow's hash
kernels; a sorted single integer key is recognised in one vectorized pass):
call it on a worker thread for large inputs. Idea: Kafka Streams' and
Paimon's "one row per key per batch" (deduplicate in the writer, newest
wins), made explicit instead of silent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import DuplicateKeyError, SchemaMismatchError

__all__ = [
    "DUPLICATE_POLICIES",
    "KeyTracker",
    "check_unique_keys",
    "find_duplicate_key",
    "keep_last",
]

#: What to do with a key repeated inside one source.
DUPLICATE_POLICIES = ("error", "keep_last")

_INDEX = "__lance_async_row__"


def _key_table(
    data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch], keys: Sequence[str]
) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif not isinstance(data, pa.Table):
        batches = list(data)
        if not batches:
            return pa.table({k: pa.array([], pa.null()) for k in keys})
        data = pa.Table.from_batches(batches)
    missing = [k for k in keys if k not in data.column_names]
    if missing:
        raise SchemaMismatchError(f"the rows lack key column {missing[0]!r}", field=missing[0])
    return data.select(list(keys))


def _strictly_increasing(column: pa.ChunkedArray) -> bool:
    """True for a null-free integer column whose values strictly increase (no repeats)."""
    if not pa.types.is_integer(column.type) or column.null_count:
        return False
    values = column.to_numpy()
    return bool(np.all(values[1:] > values[:-1]))


def find_duplicate_key(
    data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch], keys: Sequence[str]
) -> tuple[dict[str, Any], int, int] | None:
    """The first key (in row order) that appears more than once, if any.

    Parameters
    ----------
    data : pa.Table, pa.RecordBatch or sequence of pa.RecordBatch
    keys : sequence of str
        The key columns (one or several).

    Returns
    -------
    tuple of (dict, int, int) or None
        ``(key, count, repeated)``: the first repeated key as ``{column:
        value}``, how often it appears, and how many distinct keys repeat.
        None when every key is unique.

    Raises
    ------
    SchemaMismatchError
        A key column is missing.

    Notes
    -----
    Blocking CPU work, O(rows) over the key columns (a hash group-by; one
    vectorized comparison when a single integer key is strictly increasing).
    Nulls count as a value: two null keys are a repeat.
    """
    table = _key_table(data, keys)
    if table.num_rows < 2:
        return None
    if len(keys) == 1 and _strictly_increasing(table.column(0)):
        return None
    counts = table.group_by(list(keys), use_threads=False).aggregate([([], "count_all")])
    if counts.num_rows == table.num_rows:
        return None
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    example = {k: repeated.column(k)[0].as_py() for k in keys}
    return example, int(repeated.column("count_all")[0].as_py()), repeated.num_rows


def check_unique_keys(
    data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch],
    keys: Sequence[str],
    *,
    what: str = "the source",
) -> None:
    """Raise :class:`DuplicateKeyError` when a key repeats in ``data``.

    Parameters
    ----------
    data : pa.Table, pa.RecordBatch or sequence of pa.RecordBatch
    keys : sequence of str
    what : str
        How the message names the rows (``"the source"``, ``"the send"``).

    Raises
    ------
    DuplicateKeyError
        Names the first repeated key; nothing should be written.
    SchemaMismatchError
        A key column is missing.

    Notes
    -----
    Blocking CPU work (see :func:`find_duplicate_key`).
    """
    found = find_duplicate_key(data, keys)
    if found is not None:
        key, count, repeated = found
        raise DuplicateKeyError(
            f"{what} repeats key {key} ({count} times; {repeated} key(s) repeat): each key may "
            "appear once, nothing was written. Deduplicate the rows, or opt in to keeping the "
            "last occurrence of each key (duplicate_keys='keep_last')",
            key=key,
            count=count,
        )


def keep_last(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows of ``table`` that hold the last occurrence of their key.

    Parameters
    ----------
    table : pa.Table
    keys : sequence of str

    Returns
    -------
    pa.Table
        Same schema; one row per distinct key, in the order of those last
        occurrences (so a later update of a key wins, as in a feed). The
        input itself when no key repeats.

    Notes
    -----
    Blocking CPU work, O(rows).
    """
    if find_duplicate_key(table, keys) is None:
        return table
    keyed = _key_table(table, keys).append_column(
        _INDEX, pa.array(np.arange(table.num_rows, dtype=np.int64))
    )
    last = keyed.group_by(list(keys), use_threads=False).aggregate([(_INDEX, "max")])
    rows = pc.sort_indices(last[f"{_INDEX}_max"])
    return table.take(pc.take(last[f"{_INDEX}_max"], rows))


class KeyTracker:
    """Finds a key repeated anywhere in a stream of batches, batch by batch.

    Keeps a copy of the key columns of every batch it is given (8 bytes per
    row for an int64 key, never the batches themselves) and checks them all
    at :meth:`check`; a repeat inside one batch is found at once.

    Parameters
    ----------
    keys : sequence of str
        The key columns.
    what : str
        How messages name the stream.

    Notes
    -----
    Blocking CPU work; meant for the worker thread that drains a source
    (lance_async's merge runs it on every pass of a streamed or replayable
    source and raises before the engine sees the end of the stream, so
    nothing commits).
    """

    def __init__(self, keys: Sequence[str], *, what: str = "the source") -> None:
        self.keys = list(keys)
        self.what = what
        self._columns: list[pa.Table] = []
        self.rows = 0
        # While a single integer key strictly increases across every batch so
        # far (sorted sources), no key can repeat: checked per batch in one
        # vectorized pass, and check() has nothing left to do.
        self._increasing = len(self.keys) == 1
        self._last: int | None = None

    def _still_increasing(self, column: pa.Array) -> bool:
        if not self._increasing:
            return False
        if not pa.types.is_integer(column.type) or column.null_count:
            self._increasing = False
            return False
        values = column.to_numpy(zero_copy_only=False)
        if (self._last is not None and values[0] <= self._last) or not bool(
            np.all(values[1:] > values[:-1])
        ):
            self._increasing = False
            return False
        self._last = int(values[-1])
        return True

    def add(self, batch: pa.RecordBatch) -> None:
        """Keep ``batch``'s key columns.

        Raises
        ------
        DuplicateKeyError
            A key repeats inside ``batch``.
        """
        if not batch.num_rows:
            return
        missing = [k for k in self.keys if k not in batch.schema.names]
        if missing:
            raise SchemaMismatchError(f"the rows lack key column {missing[0]!r}", field=missing[0])
        # Copies: a zero-copy slice of a key column would keep the whole batch's
        # buffers alive (an Arrow IPC message is one buffer for every column).
        keys = pa.Table.from_arrays(
            [pa.concat_arrays([batch.column(k)]) for k in self.keys], names=self.keys
        )
        if not self._still_increasing(keys.column(0).chunk(0)) and keys.num_rows > 1:
            check_unique_keys(keys, self.keys, what=self.what)
        self._columns.append(keys)
        self.rows += keys.num_rows

    def extend(self, batches: Iterable[pa.RecordBatch]) -> None:
        """:meth:`add` each batch."""
        for batch in batches:
            self.add(batch)

    def check(self) -> None:
        """Check every key given so far.

        Raises
        ------
        DuplicateKeyError
            A key repeats (names it).
        """
        if self._increasing:
            return  # every key is greater than the one before it
        if len(self._columns) > 1:
            table = pa.concat_tables(self._columns)
            self._columns = [table]
            check_unique_keys(table, self.keys, what=self.what)
