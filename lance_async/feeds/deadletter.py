"""Poison messages set aside: :class:`DeadLetterFile`, a dead-letter hook that
writes NDJSON records and gives up past a limit.

:func:`~lance_async.feeds.ingest` calls its ``dead_letter`` hook for a
message that cannot be decoded and acknowledges the message once the hook
returns, so a bad message never blocks the feed and is never dropped
silently. :class:`DeadLetterFile` is such a hook: it appends one JSON line
per bad message to a file (fsynced before it returns, so a message is
acknowledged only once its record is durable) and, past ``max_bad`` bad
messages, raises instead, which stops the ingest as if there were no hook.
The records are what Kafka Connect's dead-letter queue keeps (the message,
where it came from, why it failed), in a form ``jq`` reads.

A record::

    {"offset": "1733200000000-0", "feed": "redis://127.0.0.1:6379/orders",
     "error": "line 1: unknown field 'nme'", "error_type": "DecodeError",
     "message": "{\\"id\\": 1, \\"nme\\": \\"x\\"}", "time": "2026-12-03T10:00:00+00:00"}

``message`` holds the payload as text when it is UTF-8, else
``message_base64``; ``offset`` is the feed's (a Redis entry id, a JetStream
sequence, ``[partition, offset]`` for Kafka).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
from typing import Any

import anyio
import pyarrow as pa

from .._threads import run_sync, stream_limiter
from ..errors import DecodeError
from .base import Message

__all__ = ["DeadLetterFile"]


def _offset(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (tuple, list)):
        return [_offset(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return str(value)


class DeadLetterFile:
    """A dead-letter hook for :func:`~lance_async.feeds.ingest` (and
    :class:`~lance_async.cluster.Worker`) that appends NDJSON records to ``path``.

    Parameters
    ----------
    path : str or PathLike
        The file; created when missing, appended to otherwise.
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

    Notes
    -----
    Called on the event loop; the write and its ``fsync`` run on the
    library's ``stream`` worker threads, one record at a time (a lock keeps
    them in feed order).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_bad: int | None = None, feed: str | None = None
    ) -> None:
        if max_bad is not None and max_bad < 0:
            raise ValueError(f"max_bad must be >= 0 or None, got {max_bad}")
        self.path = os.fspath(path)
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
        out["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return out

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    async def __call__(self, message: Message, error: BaseException) -> None:
        """Record ``message`` (durably), or raise once ``max_bad`` were recorded.

        Raises
        ------
        DecodeError
            Past ``max_bad``: the message's own error, naming its offset and
            the limit (the ingest stops; this message is not acknowledged).
        OSError
            The file cannot be written (the ingest stops).
        """
        async with self._lock:
            if self.max_bad is not None and self.count >= self.max_bad:
                limit = (
                    f"more than {self.max_bad} bad message(s) (--max-bad)" if self.max_bad else ""
                )
                text = f"message at offset {message.offset!r}: {error}"
                if limit:
                    text += f"; stopped after {limit}, recorded in {self.path}"
                raise DecodeError(text, offset=message.offset) from error
            line = json.dumps(self.record(message, error), default=str) + "\n"
            await run_sync(lambda: self._append(line.encode()), limiter=stream_limiter())
            self.count += 1
