"""What a Kafka partition may commit: :class:`PartitionOffsets` (pure bookkeeping, no I/O).

One object per assigned partition and assignment epoch of a
:class:`~lance_async.feeds.KafkaFeed`: the records handed out, which of them
are acknowledged (durable), the *watermark* -- the offset after the longest
contiguous run of acknowledged records, the only offset that may be
committed -- and what was sent to and confirmed by the broker. A message's
``_owner`` is its partition's object, so an acknowledgement of a record
fetched in an earlier epoch is told apart (it is not the partition's object
any more). As a producer's accumulator resolves one future per record, in
order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["CONFIRM", "TP", "KafkaOffset", "PartitionOffsets"]


class KafkaOffset(NamedTuple):
    """Where a record sits: the ``offset`` of a :class:`~lance_async.feeds.Message` from Kafka.

    Attributes
    ----------
    topic : str
    partition : int
    offset : int
        The record's offset in its partition (the commit is ``offset + 1``).
    """

    topic: str
    partition: int
    offset: int


TP = tuple[str, int]
"""A partition: ``(topic, partition)``."""


#: Seconds a commit sent without waiting may go unconfirmed before it is sent
#: again (librdkafka does not retry an asynchronous commit the group refused).
CONFIRM = 2.0


@dataclass(eq=False)
class PartitionOffsets:
    """One partition's offsets within one assignment epoch.

    Attributes
    ----------
    tp : (str, int)
        ``(topic, partition)``.
    epoch : int
        The assignment epoch.
    feed : object
        The feed whose ``ack_batch`` acknowledges this partition's messages.
    pending : dict of int to bool
        Offsets handed out, in fetch order -> acknowledged?
    watermark : int or None
        The next offset to commit (one past the contiguous acknowledged run).
    sent, sent_at : int or None, float
        The highest offset sent in a commit, and when (``time.monotonic()``).
    committed : int or None
        The highest offset the broker confirmed.
    """

    tp: tuple[str, int]
    epoch: int
    feed: Any
    pending: dict[int, bool] = field(default_factory=dict)
    watermark: int | None = None
    sent: int | None = None
    sent_at: float = 0.0
    committed: int | None = None

    async def ack_batch(self, messages: Sequence[Any]) -> None:
        """What a message's ``ack()`` calls: its feed's ``ack_batch``."""
        await self.feed.ack_batch(messages)

    def in_flight(self) -> int:
        """Records handed out and not acknowledged (does not block)."""
        return sum(1 for done in self.pending.values() if not done)

    def hand_out(self, offset: int) -> None:
        """A record of this epoch goes to the caller."""
        self.pending[offset] = False

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` acknowledged; False if it was not handed out here."""
        if offset not in self.pending:
            return False
        self.pending[offset] = True
        return True

    def advance(self) -> None:
        """Move the watermark past the acknowledged records at the front."""
        pending = self.pending
        while pending:
            first = next(iter(pending))
            if not pending[first]:
                break
            del pending[first]
            self.watermark = first + 1

    def due(self, above: str, now: float) -> bool:
        """Whether the watermark is to be committed: past the offset ``above``
        names (``"sent"`` or ``"committed"``); a send unconfirmed for
        :data:`CONFIRM` seconds counts as not sent."""
        if self.sent is not None and self.sent != self.committed and now - self.sent_at > CONFIRM:
            self.sent = self.committed
        if self.watermark is None:
            return False
        last = self.sent if above == "sent" else self.committed
        return last is None or self.watermark > last

    def was_sent(self, offset: int, now: float) -> None:
        self.sent, self.sent_at = offset, now

    def confirmed(self, offset: int) -> None:
        """The broker has ``offset`` (a commit answered)."""
        self.committed = max(self.committed or 0, offset)
        self.sent = max(self.sent or 0, offset)

    def refused(self) -> None:
        """An asynchronous commit was refused: the next fetch sends it again."""
        if self.sent is not None and self.sent != self.committed:
            self.sent = self.committed
