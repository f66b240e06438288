"""Acknowledgements for rows handed to a MemWAL shard writer.

An :class:`Ack` is to a :class:`~lance_async.AsyncShardWriter` what a
``RecordMetadata`` future is to aiokafka's producer: one object per
:meth:`~lance_async.AsyncShardWriter.send`, resolved when every row of that
send is durable (or accepted by the engine when ``durable_write=False``), or
failed with the error of the engine put that carried them. It is built on an
:class:`anyio.Event` (made only when someone waits) and a result slot, so it
works on asyncio and trio. A send of one batch gets a subclass that is also
its queue entry (``accumulator.BatchAck``): one object per message besides
the batch; ``send_many`` gets one ack for a group of batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from .._loop import LoopHandle
from ..errors import LanceAsyncError

__all__ = ["Ack", "PutSummary"]


@dataclass(frozen=True)
class PutSummary:
    """What happened to the rows of one put / send.

    Attributes
    ----------
    rows : int
        Rows written.
    batches : int
        Record batches they arrived in, as the shard writers saw them: the
        routing writer counts a batch split across shards once per shard.
    engine_puts : int
        Engine ``ShardWriter.put`` calls that carried them (coalesced puts
        carry many sends; a large send may span several puts; through the
        routing writer, one per shard part, so a send cut into two pieces
        that one put happened to carry counts it twice).
    deletes : int
        Keys deleted (for :meth:`~lance_async.AsyncShardWriter.delete`).
    """

    rows: int
    batches: int
    engine_puts: int
    deletes: int = 0


class Ack:
    """Awaitable acknowledgement of one send's rows.

    ``await ack`` returns a :class:`PutSummary` once every part is written,
    or raises the first error among its parts. Awaiting never affects the
    rows: cancelling a task that awaits an ack leaves the rows queued; they
    are written (or failed) all the same, and the ack still resolves.

    Notes
    -----
    Not thread-safe: await it on the writer's event loop; another loop gets
    :class:`~lance_async.WrongEventLoopError`.
    """

    __slots__ = (
        "_batches",
        "_callbacks",
        "_deletes",
        "_done",
        "_error",
        "_event",
        "_loop",
        "_parts",
        "_put_count",
        "_puts",
        "_rows",
        "_sealed",
        "created",
        "resolved_at",
    )

    def __init__(self, loop: LoopHandle | None = None) -> None:
        self._loop = loop
        self._event: anyio.Event | None = None
        self._parts = 0
        self._sealed = False
        self._done = False
        self._error: BaseException | None = None
        self._rows = 0
        self._batches = 0
        # the engine puts that carried the rows: None, one put id, or a set
        # of them (made lazily: most acks are carried by one put)
        self._puts: Any = None
        self._put_count = 0  # puts counted without ids (a routed send's shard parts)
        self._deletes = 0
        self._callbacks: list[Callable[[Ack], None]] | None = None
        self.created = time.monotonic()
        self.resolved_at: float | None = None

    # -- writer side ----------------------------------------------------
    # (the producer's half of the ack, as ``set_result`` is an asyncio
    # future's: the writer, the router and the repartitioner settle acks
    # with these; a user only awaits)
    def add_part(self) -> None:
        """One more part (a piece of the send's rows) must settle before the ack resolves."""
        self._parts += 1

    def add_parts(self, count: int) -> None:
        """``count`` more parts (negative: fewer; a routed send cut per shard)."""
        self._parts += count

    def counted_part_done(self, rows: int, batches: int, deleting: bool) -> None:
        """A part settled by a put counted, not named (a routed shard part)."""
        self._parts -= 1
        self._put_count += 1
        if deleting:
            self._deletes += rows
        else:
            self._rows += rows
            self._batches += batches
        if self._parts <= 0:
            self.maybe_resolve()

    def part_done(
        self,
        *,
        rows: int = 0,
        batches: int = 0,
        put_id: Any = None,
        deletes: int = 0,
        put_ids: Iterable[Any] = (),
    ) -> None:
        """One part settled: its rows (or deleted keys) were written by the put(s) named."""
        self._parts -= 1
        self._rows += rows
        self._batches += batches
        self._deletes += deletes
        if put_id is not None:
            self._add_put(put_id)
        for other in put_ids:
            self._add_put(other)
        self.maybe_resolve()

    def _add_put(self, put_id: Any) -> None:
        puts = self._puts
        if puts is None:
            self._puts = put_id
        elif isinstance(puts, set):
            puts.add(put_id)
        elif puts != put_id:
            self._puts = {puts, put_id}

    def carried_puts(self) -> set[Any]:
        """The ids of the engine puts that carried this send's rows."""
        puts = self._puts
        if puts is None:
            return set()
        return puts if isinstance(puts, set) else {puts}

    def part_failed(self, error: BaseException) -> None:
        """One part failed with ``error`` (the ack fails with the first, unless a
        later one's rows may still land)."""
        self._parts -= 1
        if self._error is None or (
            getattr(error, "may_have_landed", False)
            and not getattr(self._error, "may_have_landed", False)
        ):
            # the first error, unless a later part's says its rows may still
            # be written: that is what the sender must know
            self._error = error
        self.maybe_resolve()

    def seal(self) -> None:
        """No more parts will be added."""
        self._sealed = True
        self.maybe_resolve()

    def fail_unsealed(self, error: BaseException) -> None:
        """The send stopped before its end (bad batch, cancellation)."""
        if self._error is None:
            self._error = error
        self.seal()

    def maybe_resolve(self) -> None:
        """Resolve (wake the waiter, run the callbacks) once sealed with no part left."""
        if self._sealed and self._parts <= 0 and not self._done:
            self._done = True
            self.resolved_at = time.monotonic()
            self._notify()

    def _notify(self) -> None:
        """Wake the waiter and run the callbacks of a just-resolved ack."""
        if self._event is not None:
            self._event.set()
        if self._callbacks:
            callbacks, self._callbacks = self._callbacks, None
            for callback in callbacks:
                callback(self)

    @classmethod
    def combine(cls, acks: Iterable[Ack]) -> Ack:
        """One ack that resolves when all ``acks`` have, failing with the first error.

        Its summary adds the parts' rows, batches and deletes; ``engine_puts``
        counts the distinct engine puts that carried them (one coalesced put
        shared by many parts counts once).
        """
        children = list(acks)
        parent = cls(children[0]._loop if children else None)

        def child_done(child: Ack) -> None:
            if child._error is not None:
                parent.part_failed(child._error)
            else:
                parent._put_count += child._put_count
                parent.part_done(
                    rows=child._rows,
                    batches=child._batches,
                    deletes=child._deletes,
                    put_ids=child.carried_puts(),
                )

        for child in children:
            parent.add_part()
            if child._done:
                child_done(child)
            elif child._callbacks is None:
                child._callbacks = [child_done]
            else:
                child._callbacks.append(child_done)
        parent.seal()
        return parent

    # -- user side -------------------------------------------------------
    def done(self) -> bool:
        """True once the ack is resolved (success or failure)."""
        return self._done

    def result(self) -> PutSummary:
        """The summary of a resolved ack.

        Raises
        ------
        LanceAsyncError
            Not resolved yet.
        BaseException
            The error the rows failed with.
        """
        if not self._done:
            raise LanceAsyncError("the ack is not resolved yet; await it")
        if self._error is not None:
            raise self._error
        engine_puts = len(self.carried_puts()) + self._put_count
        return PutSummary(self._rows, self._batches, engine_puts, self._deletes)

    def exception(self) -> BaseException | None:
        """The error of a resolved ack, or None."""
        if not self._done:
            raise LanceAsyncError("the ack is not resolved yet; await it")
        return self._error

    async def wait(self) -> PutSummary:
        """Wait until resolved; return the summary or raise the error.

        Raises
        ------
        WrongEventLoopError
            Awaited from another event loop than the writer's.
        """
        if self._loop is not None and not self._loop.is_current():
            self._loop.check("this Ack")
        if not self._done:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        else:
            await anyio.lowlevel.checkpoint()
        return self.result()

    def __await__(self) -> Generator[Any, None, PutSummary]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        if not self._done:
            return "<Ack pending>"  # a combined ack's rows add up only as its parts resolve
        return f"<Ack {'failed' if self._error else 'done'} rows={self._rows}>"
