"""Poison messages set aside: :class:`DeadLetterSink`, a dead-letter hook that
records bad messages and gives up past a limit, and :class:`DeadLetterFile`,
the sink that writes NDJSON records to a file.

:func:`~lance_async.feeds.ingest` calls its ``dead_letter`` hook for a
message that cannot be decoded and acknowledges the message once the hook
returns, so a bad message never blocks the feed and is never dropped
silently. :class:`DeadLetterFile` is such a hook: it appends one JSON line
per bad message to a file (fsynced before it returns, so a message is
acknowledged only once its record is durable) and, past ``max_bad`` bad
messages, raises instead, which stops the ingest as if there were no hook.
The records are what Kafka Connect's dead-letter queue keeps (the message,
where it came from, why it failed), in a form ``jq`` reads. The broker sinks
(a Redis stream, a NATS JetStream subject, a Kafka topic) live in
:mod:`lance_async.feeds.deadletter_brokers`.

A record::

    {"offset": "1733200000000-0", "feed": "redis://127.0.0.1:6379/orders",
     "error": "line 1: unknown field 'nme'", "error_type": "DecodeError",
     "message": "{\\"id\\": 1, \\"nme\\": \\"x\\"}", "time": "2026-12-03T10:00:00+00:00"}

``message`` holds the payload as text when it is UTF-8, else
``message_base64``; ``headers`` the message's own headers (Redis: its other
fields), when it has any; ``offset`` is the feed's (a Redis entry id, a JetStream
sequence, ``[partition, offset]`` for Kafka).

Records are at least once, like the rows: a message whose ack did not land
after its record was written (the process died, or a worker's lease on the
partition lapsed) is delivered and set aside again, so a record may repeat;
its ``offset`` tells repeats apart.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import pyarrow as pa

from .._threads import run_sync, stream_limiter
from ..errors import DeadLetterError, DecodeError
from .base import Message

_S = TypeVar("_S", bound="DeadLetterSink")

__all__ = ["DeadLetterFile", "DeadLetterSink"]


def _offset(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (tuple, list)):
        return [_offset(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return str(value)


class DeadLetterSink:
    """The base of the dead-letter hooks of :func:`~lance_async.feeds.ingest`
    (and :class:`~lance_async.cluster.Worker`): counts bad messages, stops past
    a limit, and hands each record to :meth:`store` one at a time, in feed
    order.

    Parameters
    ----------
    max_bad : int or None
        Bad messages recorded at most; the next one is not recorded and stops
        the ingest (:class:`~lance_async.DecodeError` naming its offset).
        None: no limit. 0 records nothing and stops at the first.
    feed : str, optional
        Where the messages come from (a stream, a subject, a URL without
        credentials), written in every record.

    Attributes
    ----------
    count : int
        Messages recorded so far.
    where : str
        Where the records go, for messages (a path, a stream, a subject).

    Notes
    -----
    A subclass implements :meth:`store`, which returns once the record is
    durable where it goes: the message is acknowledged after that. An async
    context manager; :meth:`aclose` releases what the sink holds (a
    connection it opened). The idea is Kafka Connect's
    ``errors.deadletterqueue``: a bad record goes aside with its error, the
    feed goes on.
    """

    where: str = ""

    def __init__(self, *, max_bad: int | None = None, feed: str | None = None) -> None:
        if max_bad is not None and max_bad < 0:
            raise ValueError(f"max_bad must be >= 0 or None, got {max_bad}")
        self.max_bad = max_bad
        self.feed = feed
        self.count = 0
        self._lock = anyio.Lock()

    def record(self, message: Message, error: BaseException) -> dict[str, Any]:
        """The JSON record of one bad message (pure; does not block)."""
        out: dict[str, Any] = {"offset": _offset(message.offset)}
        if self.feed is not None:
            out["feed"] = self.feed
        out["error"] = " ".join(str(error).split())
        out["error_type"] = type(error).__name__
        payload = message.payload
        if isinstance(payload, pa.RecordBatch):
            out["message"] = payload.to_pylist()
        else:
            raw = bytes(payload)
            try:
                out["message"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                out["message_base64"] = base64.b64encode(raw).decode("ascii")
        if message.headers:  # a lance-op header, say: the message means it too
            out["headers"] = {
                str(k): v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
                for k, v in message.headers.items()
            }
        out["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return out

    async def store(self, message: Message, record: dict[str, Any]) -> None:
        """Keep ``record`` (of ``message``) durably; the subclass's job.

        Raises
        ------
        NotImplementedError
            On the base class.
        """
        raise NotImplementedError

    async def __call__(self, message: Message, error: BaseException) -> None:
        """Record ``message`` (durably), or raise once ``max_bad`` were recorded.

        Raises
        ------
        DecodeError
            Past ``max_bad``: the message's own error, naming its offset and
            the limit (the ingest stops; this message is not acknowledged).
        DeadLetterError
            :meth:`store` failed (the file or the broker cannot be written,
            or refused this message): the ingest stops, the message is not
            acknowledged; the error names the destination and the offset.
        """
        async with self._lock:
            if self.max_bad is not None and self.count >= self.max_bad:
                limit = (
                    f"more than {self.max_bad} bad message(s) (--max-bad)" if self.max_bad else ""
                )
                text = f"message at offset {message.offset!r}: {error}"
                if limit:
                    text += f"; stopped after {limit}, recorded in {self.where}"
                raise DecodeError(text, offset=message.offset) from error
            try:
                await self.store(message, self.record(message, error))
            except DeadLetterError:
                raise
            except Exception as exc:
                raise DeadLetterError(
                    f"the bad message at offset {message.offset!r} could not be set aside in "
                    f"{self.where} ({type(exc).__name__}: {' '.join(str(exc).split())[:500]}); "
                    "it stays unacknowledged",
                    destination=self.where,
                    offset=message.offset,
                    retryable=self.retryable(exc),
                ) from exc
            self.count += 1

    def retryable(self, exc: BaseException) -> bool:
        """Whether :meth:`store`'s failure ``exc`` may pass by itself (the
        destination unreachable or slow), as opposed to a refusal of this
        message. Pure; does not block."""
        return isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__name__ in (
            "ConnectionError",
            "TimeoutError",
            "NoServersError",
            "ConnectionClosedError",
            "KafkaConnectionError",
            "KafkaTimeoutError",
            "RequestTimedOutError",
        )

    async def aclose(self) -> None:
        """Release what the sink holds (nothing here). Idempotent."""
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self: _S) -> _S:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()


class DeadLetterFile(DeadLetterSink):
    """A dead-letter sink that appends NDJSON records to ``path``.

    Parameters
    ----------
    path : str or PathLike
        The file; created when missing, appended to otherwise.
    max_bad, feed
        See :class:`DeadLetterSink`.

    Notes
    -----
    Called on the event loop; the write and its ``fsync`` run on the
    library's ``stream`` worker threads, one record at a time (a lock keeps
    them in feed order).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_bad: int | None = None, feed: str | None = None
    ) -> None:
        super().__init__(max_bad=max_bad, feed=feed)
        self.path = os.fspath(path)
        self.where = self.path

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    async def store(self, message: Message, record: dict[str, Any]) -> None:
        """Append ``record`` as one JSON line and ``fsync`` the file.

        Raises
        ------
        OSError
            The file cannot be written.
        """
        line = json.dumps(record, default=str) + "\n"
        await run_sync(lambda: self._append(line.encode()), limiter=stream_limiter())
