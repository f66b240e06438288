"""What a feed hands out: :class:`Message`, the :class:`Feed` protocol, the
:data:`DeadLetter` hook's shape, and :func:`decode_json`, the default decoding
of a micro-batch of payloads into rows.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ..errors import DecodeError
from ..sources.jsonarray import to_ndjson
from ..sources.jsonrows import decode_json_rows, is_blank

__all__ = ["AckFn", "DeadLetter", "Feed", "Message", "decode_json"]

AckFn = Callable[[], Awaitable[None]]


_NO_HEADERS: Mapping[str, Any] = MappingProxyType({})
_LEAD = re.compile(rb"[ \t\n\r\x0b\x0c]*")  # blanks before a payload's first value


@dataclass(slots=True)
class Message:
    """One message of a feed.

    Attributes
    ----------
    offset : object
        Its position in the feed (a stream sequence, an entry id,
        ``(partition, offset)``, a byte offset). Shown in errors and handed
        to the dead-letter hook.
    payload : bytes or pa.RecordBatch
        The raw message (decoded by :func:`ingest`'s ``decode``), or rows
        already decoded by the feed (file feeds).
    headers : mapping
        Broker headers or fields, if any (an empty read-only mapping
        otherwise: messages are many, so they stay small -- slots, no dict).
    """

    offset: Any
    payload: bytes | pa.RecordBatch
    headers: Mapping[str, Any] = field(default_factory=lambda: _NO_HEADERS)
    _ack: AckFn | None = field(default=None, repr=False)
    acked: bool = field(default=False, repr=False)
    _owner: Any = field(default=None, repr=False)

    async def ack(self) -> None:
        """Acknowledge (commit) the message. Idempotent."""
        if self.acked:
            return
        if self._ack is not None:
            await self._ack()
        elif self._owner is not None:
            await self._owner.ack_batch([self])
        self.acked = True


@runtime_checkable
class Feed(Protocol):
    """What :func:`ingest` needs from a feed.

    ``fetch`` returns the messages available now (up to ``max_messages``),
    waiting at most ``timeout`` seconds for the first one; an empty list
    means nothing arrived. ``exhausted`` turns True when a finite feed has no
    more messages (a file read to its end and not followed).

    A feed may also offer ``async def ack_batch(messages)``, acknowledging
    several messages (in feed order) at once -- one ``XACK`` with many ids,
    or committing the highest offset. :func:`ingest` uses it when present;
    otherwise it awaits ``message.ack()`` one by one.
    """

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Messages available now (at most ``max_messages``); [] after ``timeout``."""
        ...

    @property
    def exhausted(self) -> bool:
        """True when a finite feed has delivered everything."""
        ...

    async def aclose(self) -> None:
        """Release the feed's connection or file."""
        ...


DeadLetter = Callable[[Message, BaseException], Awaitable[None] | None]


def decode_json(messages: Sequence[Message], schema: pa.Schema) -> pa.Table:
    """Decode JSON / NDJSON message payloads into one table of ``schema``.

    Each payload is a JSON object, several newline-delimited ones, or a JSON
    array of objects; values are coerced to the schema's types by the one
    JSON rule (:mod:`lance_async.sources.jsonrows`).
    Payloads that are already record batches pass through. Rows keep the
    messages' order (a later message's row of a key wins), whatever mix of
    kinds the messages are.

    A message with no rows -- an empty payload, only whitespace, an empty
    JSON array -- is a bad message, not zero rows: a producer that sent it
    meant something else (a Kafka tombstone, a field left empty), and
    acknowledging it as written would hide that. :func:`ingest` sets it
    aside through the dead-letter hook, or stops, as for any bad message.

    Raises
    ------
    DecodeError
        A payload is not valid JSON for the schema, or holds no row.
    """
    tables: list[pa.Table] = []
    raw: list[bytes | bytearray] = []
    decoded: list[pa.RecordBatch] = []

    def close_run() -> None:  # one table per run of one kind, runs in message order
        if decoded:
            tables.append(pa.Table.from_batches(decoded))
            decoded.clear()
        if raw:
            # one payload is decoded as it is (a large message is never copied
            # here); several are joined once, one after the other by lines
            text = raw[0] if len(raw) == 1 else b"\n".join(raw)
            raw.clear()
            tables.append(decode_json_rows(text, schema))

    for m in messages:
        if isinstance(m.payload, pa.RecordBatch):
            if raw:
                close_run()
            decoded.append(m.payload)
            continue
        data: bytes | bytearray = m.payload if type(m.payload) is bytes else bytes(m.payload)
        if is_blank(data):
            raise DecodeError(
                f"message at offset {m.offset!r} is empty: no rows (an empty message is a "
                "bad message, never acknowledged as written)",
                offset=m.offset,
            )
        lead = _LEAD.match(data)
        start = lead.end() if lead is not None else 0
        if data[start : start + 1] == b"[":  # a JSON array of objects (application/json)
            data = to_ndjson(data)
            if is_blank(data):
                raise DecodeError(
                    f"message at offset {m.offset!r} is empty: no rows (an empty message is a "
                    "bad message, never acknowledged as written)",
                    offset=m.offset,
                )
        if decoded:
            close_run()
        raw.append(data)
    close_run()
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
