"""Schema and batch checks that do no I/O (shared by sources, merges, writers).

Everything here is pure and fast (O(fields), or O(rows) only for null counts
that Arrow keeps precomputed), so it may run on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from .errors import SchemaMismatchError

__all__ = [
    "NO_KEY",
    "PRIMARY_KEY_META",
    "conform_batch",
    "describe_difference",
    "primary_key",
]

PRIMARY_KEY_META = b"lance-schema:unenforced-primary-key"
_PK_POSITION_META = b"lance-schema:unenforced-primary-key-position"
NO_KEY = (
    "a MemWAL needs a primary key: LSM reads and compaction keep the newest row per key. "
    "Mark the key field(s) non-nullable with metadata "
    "{'lance-schema:unenforced-primary-key': 'true'}"
)
"""The message every MemWAL path gives for a table without a primary key."""


def primary_key(schema: pa.Schema) -> list[str]:
    """Names of the schema's primary-key columns, in key order.

    Lance marks a primary-key field with the field metadata
    ``lance-schema:unenforced-primary-key = "true"`` (and, for composite keys,
    an optional ``...-position``). Returns an empty list when none is marked.
    """
    keyed: list[tuple[int, int, str]] = []
    for i, f in enumerate(schema):
        meta = f.metadata or {}
        if meta.get(PRIMARY_KEY_META, b"").lower() in (b"true", b"1"):
            pos = meta.get(_PK_POSITION_META)
            keyed.append((int(pos) if pos else i, i, f.name))
    return [name for _, _, name in sorted(keyed)]


def describe_difference(
    expected: pa.Schema, actual: pa.Schema, *, check_metadata: bool = False
) -> tuple[str, str | None] | None:
    """Say how ``actual`` differs from ``expected``.

    Returns
    -------
    tuple of (message, field name or None), or None when they match
        Field names and types must match in order; nullability is compared
        only when ``check_metadata`` (the strict replay check) is set, as is
        schema and field metadata.
    """
    if expected.names != actual.names:
        missing = [n for n in expected.names if n not in actual.names]
        extra = [n for n in actual.names if n not in expected.names]
        if missing:
            return f"column {missing[0]!r} is missing (got columns {actual.names})", missing[0]
        if extra:
            return f"unexpected column {extra[0]!r} (expected {expected.names})", extra[0]
        return f"columns are in another order: {actual.names}, expected {expected.names}", None
    for e, a in zip(expected, actual, strict=True):
        if not e.type.equals(a.type):
            return f"field {e.name!r} has type {a.type}, expected {e.type}", e.name
        if check_metadata:
            if e.nullable != a.nullable:
                return f"field {e.name!r} nullability changed to {a.nullable}", e.name
            if (e.metadata or {}) != (a.metadata or {}):
                return f"field {e.name!r} metadata changed", e.name
    if check_metadata and (expected.metadata or {}) != (actual.metadata or {}):
        return "schema metadata changed", None
    return None


_REQUIRED: dict[int, tuple[pa.Schema, tuple[tuple[int, str], ...]]] = {}


def _required(schema: pa.Schema) -> tuple[tuple[int, str], ...]:
    """(position, name) of the schema's non-nullable fields, remembered per
    schema object (a stream checks every batch against the same one)."""
    hit = _REQUIRED.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    required = tuple((i, f.name) for i, f in enumerate(schema) if not f.nullable)
    if len(_REQUIRED) >= 64:
        _REQUIRED.clear()
    _REQUIRED[id(schema)] = (schema, required)
    return required


def _check_nulls(batch: pa.RecordBatch, schema: pa.Schema, index: int | None) -> None:
    for i, name in _required(schema):
        nulls = batch.column(i).null_count
        if nulls:
            where = f" in batch {index}" if index is not None else ""
            raise SchemaMismatchError(
                f"field {name!r} is not nullable but holds {nulls} null(s){where}",
                field=name,
                batch_index=index,
            )


def conform_batch(
    batch: pa.RecordBatch, schema: pa.Schema, index: int | None = None
) -> pa.RecordBatch:
    """Check a batch against a declared schema and relabel it with that schema.

    Parameters
    ----------
    batch : pa.RecordBatch
        Any number of rows.
    schema : pa.Schema
        The declared schema (names, types, nullability, metadata).
    index : int, optional
        The batch's 0-based position in its stream, for the error message.

    Returns
    -------
    pa.RecordBatch
        The same arrays (no copy) under ``schema``.

    Raises
    ------
    SchemaMismatchError
        A column is missing, extra, out of order or of another type, or a
        non-nullable column holds nulls. Never casts: a silent cast could lose
        data.
    """
    if not isinstance(batch, pa.RecordBatch):
        raise SchemaMismatchError(
            f"expected a pyarrow.RecordBatch, got {type(batch).__name__}"
            + (f" as batch {index}" if index is not None else ""),
            batch_index=index,
        )
    if batch.schema is schema or batch.schema.equals(schema, check_metadata=True):
        _check_nulls(batch, schema, index)
        return batch
    diff = describe_difference(schema, batch.schema)
    if diff is not None:
        msg, field = diff
        where = f"batch {index}: " if index is not None else ""
        raise SchemaMismatchError(f"{where}{msg}", field=field, batch_index=index)
    _check_nulls(batch, schema, index)
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


class TableFit:
    """Fast, repeated checks of batches against one table schema.

    Batch schemas already found compatible are remembered (a writer sees the
    same few schemas over and over), so the per-batch cost is a schema
    comparison in C++ plus one null count per key or non-nullable column.
    Batches keep their own schema object; :meth:`relabel` gives them the
    table's (nullability, metadata) on a worker thread.

    Parameters
    ----------
    schema : pa.Schema
        The table schema.
    key_columns : sequence of str
        Primary-key columns (never null, whatever the schema says).
    """

    def __init__(self, schema: pa.Schema, key_columns: Sequence[str] = ()) -> None:
        self.schema = schema
        self._required = [
            (i, f.name, f.name in key_columns)
            for i, f in enumerate(schema)
            if not f.nullable or f.name in key_columns
        ]
        self._known: list[tuple[pa.Schema, bool]] = []

    def check(self, batch: pa.RecordBatch, index: int | None = None) -> pa.RecordBatch:
        """Check one batch; return it with the table's column order.

        Raises
        ------
        SchemaMismatchError
            Missing, unknown or retyped columns; nulls in key or non-nullable
            columns. Nothing is queued or written for the batch.
        """
        if not isinstance(batch, pa.RecordBatch):
            raise SchemaMismatchError(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
        bs = batch.schema
        for known, reorder in self._known:
            if bs.equals(known):
                if reorder:
                    batch = batch.select(self.schema.names)
                break
        else:
            reorder = bs.names != self.schema.names and sorted(bs.names) == sorted(
                self.schema.names
            )
            candidate = batch.select(self.schema.names) if reorder else batch
            diff = describe_difference(self.schema, candidate.schema)
            if diff is not None:
                msg, field = diff
                where = f"batch {index}: " if index is not None else ""
                raise SchemaMismatchError(f"{where}{msg}", field=field, batch_index=index)
            if len(self._known) < 16:
                self._known.append((bs, reorder))
            batch = candidate
        for i, name, is_key in self._required:
            nulls = batch.column(i).null_count
            if nulls:
                what = "primary-key column" if is_key else "non-nullable field"
                where = f"batch {index}: " if index is not None else ""
                raise SchemaMismatchError(
                    f"{where}{what} {name!r} holds {nulls} null(s)", field=name, batch_index=index
                )
        return batch

    def relabel(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """Concatenate checked batches under the table schema (blocking; copies).

        Batches that share one schema (the usual case: one producer) are
        concatenated first and relabelled once, so the cost per batch is a
        schema comparison, not a Python-level rebuild.
        """
        schema = self.schema
        first = batches[0].schema
        if all(b.schema.equals(first, check_metadata=True) for b in batches[1:]):
            table = _concat(batches, first)
            if first.equals(schema, check_metadata=True):
                return table
            return pa.Table.from_arrays(table.columns, schema=schema)
        fixed = [
            b
            if b.schema.equals(schema, check_metadata=True)
            else pa.RecordBatch.from_arrays(b.columns, schema=schema)
            for b in batches
        ]
        return _concat(fixed, schema)


def _concat(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """Batches of one schema as a one-chunk table (one batch: no copy).

    ``pa.concat_batches`` (pyarrow 19+) concatenates once, without the
    intermediate chunked table that ``combine_chunks`` walks column by column.
    """
    if len(batches) == 1:
        return pa.Table.from_batches(batches, schema=schema)
    concat = getattr(pa, "concat_batches", None)
    if concat is None:  # pragma: no cover - pyarrow < 19
        return pa.Table.from_batches(batches, schema=schema).combine_chunks()
    return pa.Table.from_batches([concat(batches)], schema=schema)
