"""What a feed hands out: :class:`Message`, the :class:`Feed` protocol, the
:data:`DeadLetter` hook's shape, and :func:`decode_json`, the default decoding
of a micro-batch of payloads into rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ..sources.jsonarray import to_ndjson
from ..sources.jsonrows import decode_json_rows

__all__ = ["AckFn", "DeadLetter", "Feed", "Message", "decode_json"]

AckFn = Callable[[], Awaitable[None]]


_NO_HEADERS: Mapping[str, Any] = MappingProxyType({})


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

    Raises
    ------
    DecodeError
        A payload is not valid JSON for the schema.
    """
    tables: list[pa.Table] = []
    raw: list[bytes] = []
    decoded: list[pa.RecordBatch] = []

    def close_run() -> None:  # one table per run of one kind, runs in message order
        if decoded:
            tables.append(pa.Table.from_batches(decoded))
            decoded.clear()
        if raw:
            tables.append(decode_json_rows(b"\n".join(raw) + b"\n", schema))
            raw.clear()

    for m in messages:
        if isinstance(m.payload, pa.RecordBatch):
            if raw:
                close_run()
            decoded.append(m.payload)
            continue
        data = bytes(m.payload).strip()
        if data[:1] == b"[":  # a JSON array of objects (application/json)
            data = to_ndjson(data).strip()
        if data:
            if decoded:
                close_run()
            raw.append(data)
    close_run()
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
