"""A routed shard's hand-off: the parts a routing writer cut, handed to the shard's committer.

A :class:`~lance_async.ShardRouter` has one bounded queue, its own
:class:`~lance_async.memwal.accumulator.Accumulator`: a send takes room
there and keeps it until the engine put that carried its rows returned.
The routing task cuts each run into one part per shard
(``routing.py``) and hands each part to its shard writer's
:class:`Handoff` at once: no second queue, no second wait for room. The
shard's :class:`~lance_async.memwal.committer.Committer` takes what was
handed to it while its last put was in flight (one engine put, up to
``max_put_rows`` / ``max_put_bytes``), as a standalone writer's committer
takes runs from its accumulator; the room of what it settles goes back to
the router's queue (:meth:`Handoff.release`). The hand-off holds at most
what that room allows, so it needs no bound of its own.

A standalone :class:`~lance_async.AsyncShardWriter` is the same machinery
with one shard and no cut: its committer takes runs straight from its own
accumulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio

from ..errors import ClosedError
from .accumulator import Accumulator, Entry, Item, Kind, take_run
from .acks import Ack

__all__ = ["Handoff"]


class Handoff:
    """The parts handed to one routed shard writer, until its committer takes them.

    What a committer takes runs from (as from an accumulator): parts are
    handed with :meth:`hand` (never waits: the router's queue bounds them),
    taken with :meth:`next_run`, and their room given back to the router's
    queue with :meth:`release`.

    Parameters
    ----------
    room : Accumulator
        The routing writer's queue, whose room every handed part holds.
    max_put_rows, max_put_bytes : int
        The largest run handed to one engine call.
    check : callable
        Raises when the writer can take no more rows (closed, failed).
    describe : callable
        The writer's repr, for messages.

    Attributes
    ----------
    queue_rows, queue_bytes : int
        Rows / bytes handed to this shard and not yet written (its share of
        the router's queue).
    max_rows_seen, max_bytes_seen, entries : int
        The highest those have been; parts (and flush markers) handed so far.
    last_put_seconds : float
        How long the shard's last engine put took (the router paces by it).
    """

    def __init__(
        self,
        room: Accumulator,
        *,
        max_put_rows: int,
        max_put_bytes: int,
        check: Callable[[], None],
        describe: Callable[[], str],
    ) -> None:
        self._room = room
        self.max_put_rows = max_put_rows
        self.max_put_bytes = max_put_bytes
        self._check = check
        self._describe = describe
        self._pending: deque[Entry] = deque()
        self._wake: anyio.Event | None = None
        self._closed = False
        self._ended = False
        self.queue_rows = 0
        self.queue_bytes = 0
        self.max_rows_seen = 0
        self.max_bytes_seen = 0
        self.entries = 0
        self.last_put_seconds = 0.0

    def _push(self, entry: Entry) -> None:
        self._check()
        if self._ended:
            raise ClosedError(f"{self._describe()}: its writer task has ended; open a new writer")
        self._pending.append(entry)
        self.entries += 1
        q = self.queue_rows = self.queue_rows + entry.rows
        b = self.queue_bytes = self.queue_bytes + entry.nbytes
        self.max_rows_seen = max(self.max_rows_seen, q)
        self.max_bytes_seen = max(self.max_bytes_seen, b)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def hand(self, part: Item) -> None:
        """Hand a part over (rows checked, relabelled and of this shard; its
        room taken in the router's queue). Does not block.

        Raises
        ------
        ClosedError, WriterFailedError, FencedError, StorageError
            The writer can take no more rows (nothing was handed).
        """
        self._push(part)

    def submit_flush(self, ack: Ack) -> None:
        """Hand a marker that resolves ``ack`` once every part before it is written.

        Raises
        ------
        ClosedError, WriterFailedError, FencedError, StorageError
            As :meth:`hand`.
        """
        marker = Item(Kind.FLUSH, None, ack, 0, 0, 0.0)
        self._push(marker)
        ack.add_part()
        ack.seal()

    # -- the committer's side ---------------------------------------------------------
    async def next_run(self) -> list[Entry] | None:
        """What was handed since the last run, as one engine call's run (the
        router paced the runs already); None once closed and drained."""
        pending = self._pending
        while not pending:
            if self._closed:
                return None
            self._wake = anyio.Event()
            await self._wake.wait()
        return take_run(pending, self.max_put_rows, self.max_put_bytes)[0]

    def release(self, rows: int, nbytes: int) -> None:
        """Rows written or failed: their room goes back to the router's queue."""
        self.queue_rows -= rows
        self.queue_bytes -= nbytes
        self._room.release(rows, nbytes)

    def put_took(self, seconds: float) -> None:
        """The shard's engine put took ``seconds``."""
        self.last_put_seconds = seconds

    def wake_senders(self) -> None:
        """Let the router's senders waiting for room look again."""
        self._room.wake_senders()

    def close(self) -> None:
        """No more parts: the committer drains what was handed, then ends."""
        self._closed = True
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def end(self) -> list[Entry]:
        """The committer ended: later hand-overs fail; returns what is left to fail."""
        self._ended = True
        left = list(self._pending)
        self._pending.clear()
        return left
