"""What a message's ``lance-op`` header makes of its rows: puts, or deletes by key.

A message with the header ``lance-op: delete`` (:data:`DELETE`; on Redis a
field of the entry beside ``data``) deletes its rows by key: each JSON
object needs the key column(s) only. Any other message's rows are upserts.
Puts and deletes reach the writer in feed order. The idea is Debezium's
``__op`` field and Kafka's tombstones: the operation travels with the
message.

:func:`~lance_async.feeds.ingest` applies this rule by default (a table
with a primary key and a writer that deletes), and so does a
:class:`~lance_async.cluster.Worker`: one rule on every path, so a feed
means the same whichever command reads it.

* :func:`decode_ops` turns a micro-batch into one table: the plain rows when
  no message deletes, else the rows with an op column (:data:`OP_COLUMN`)
  saying which are deletes;
* :class:`OpWriter` reads that column: puts and deletes in feed order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from ..errors import DecodeError
from ..memwal.acks import Ack
from .messages import Message, decode_json

__all__ = ["DELETE", "OP_COLUMN", "OpWriter", "decode_ops", "is_delete"]

#: The message header that makes a message's rows deletes by key: ``{"lance-op": "delete"}``.
DELETE: tuple[str, str] = ("lance-op", "delete")
#: The bool column :func:`decode_ops` adds when a micro-batch holds deletes.
OP_COLUMN = "__lance_async_delete"


def is_delete(message: Message) -> bool:
    """Whether ``message`` carries ``lance-op: delete`` (pure; does not block)."""
    value = message.headers.get(DELETE[0]) if message.headers else None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value == DELETE[1]


def _runs(messages: Sequence[Message]) -> list[tuple[bool, list[Message]]]:
    """Consecutive messages of one kind (delete or not), in order."""
    out: list[tuple[bool, list[Message]]] = []
    for m in messages:
        delete = is_delete(m)
        if out and out[-1][0] == delete:
            out[-1][1].append(m)
        else:
            out.append((delete, [m]))
    return out


def decode_ops(
    messages: Sequence[Message],
    schema: pa.Schema,
    keys: Sequence[str],
    check: Callable[[pa.Table], None] | None = None,
    key_schema: pa.Schema | None = None,
) -> pa.Table:
    """Decode a micro-batch of JSON messages, deletes included (blocking; a
    worker thread's job).

    Parameters
    ----------
    messages : sequence of Message
    schema : pa.Schema
        The table's schema (the rows of a put).
    keys : sequence of str
        The key columns a delete's objects hold.
    check : callable, optional
        Called with each decoded part (puts and deletes); raises
        :class:`~lance_async.DecodeError` to refuse the micro-batch.
    key_schema : pa.Schema, optional
        What a delete's objects are decoded to (default: the key columns).

    Returns
    -------
    pa.Table
        The rows of ``schema`` when no message deletes; else every field of
        ``schema`` made nullable plus :data:`OP_COLUMN` (True: delete by the
        row's key), in feed order.

    Raises
    ------
    DecodeError
        A message that does not decode, a delete on a table without a key,
        or what ``check`` raised.
    """
    if not any(is_delete(m) for m in messages):
        table = decode_json(messages, schema)
        if check is not None and table.num_rows:
            check(table)
        return table
    if not keys:
        raise DecodeError("a lance-op: delete message on a table without a primary key")
    if key_schema is None:
        key_schema = pa.schema([schema.field(k) for k in keys])
    wide = pa.schema([f.with_nullable(True) for f in schema])
    parts: list[pa.Table] = []
    for delete, run in _runs(messages):
        part = decode_json(run, key_schema if delete else schema)
        if not part.num_rows:
            continue
        if check is not None:
            check(part)
        columns = [
            part.column(f.name) if f.name in part.column_names else pa.nulls(part.num_rows, f.type)
            for f in wide
        ]
        flags = pa.array([delete] * part.num_rows, pa.bool_())
        parts.append(
            pa.Table.from_arrays(
                [*columns, flags], schema=wide.append(pa.field(OP_COLUMN, pa.bool_()))
            )
        )
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


class OpWriter:
    """A MemWAL writer as :func:`~lance_async.feeds.ingest` sees it, applying
    the op column of :func:`decode_ops`.

    A micro-batch with deletes becomes puts and deletes in feed order: the
    puts before a delete are durable before it is queued, and the delete is
    durable before what follows is queued; one without deletes is sent as it
    is (one send, one ack). :meth:`send` returns the last put's ack, or None
    when everything in the micro-batch is durable already.

    Parameters
    ----------
    writer : AsyncShardWriter or ShardRouter
        Anything with ``send(rows) -> Ack``, ``delete(keys)`` and ``schema``.
    keys : sequence of str
        The table's key columns.
    """

    def __init__(self, writer: Any, keys: Sequence[str]) -> None:
        self._writer = writer
        self._keys = list(keys)
        self.schema = writer.schema

    async def send(self, table: pa.Table, *, timeout: float | None = None) -> Ack | None:
        """Send ``table``'s puts and deletes in order; see the class.

        Raises
        ------
        LanceAsyncError
            What the writer's ``send`` or ``delete`` raised (the rest of the
            micro-batch is not sent).
        """
        if OP_COLUMN not in table.column_names:
            return await self._writer.send(table, timeout=timeout)  # type: ignore[no-any-return]
        flags = table.column(OP_COLUMN).to_pylist()
        pending: Ack | None = None
        start = 0
        for end in range(1, len(flags) + 1):
            if end < len(flags) and flags[end] == flags[start]:
                continue
            rows = table.slice(start, end - start)
            if flags[start]:
                if pending is not None:
                    await pending  # the puts before it, durable (or failed) first
                    pending = None
                await self._writer.delete(rows.select(self._keys))  # durable when it returns
            else:
                rows = rows.drop_columns([OP_COLUMN]).cast(self.schema)
                if pending is not None:
                    await pending
                pending = await self._writer.send(rows, timeout=timeout)
            start = end
        return pending  # None: everything in it is durable already
