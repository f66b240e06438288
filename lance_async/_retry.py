"""The one retry helper: exponential waits between attempts, capped.

Every loop in lance_async that tries again after a failure -- a feed waiting
for its broker, the compactor after a failed pass, the routing writer
reopening a shard, a worker restarting a partition, a lease round, the
ingest claim -- waits by :class:`Backoff`: ``base``, ``base * factor``, ...
up to ``cap``, back to ``base`` after a success, optionally within a
deadline after which the caller gives up. (merge_insert's replays wait a
random slot instead, :func:`lance_async.merge.backoff_delay`: its
contenders are its own attempts, which slots spread apart.) The shape is
redis-py's ``Retry`` with ``ExponentialBackoff`` and tenacity's
``wait_exponential``; it is kept here, a few lines, rather than a
dependency, because each loop decides for itself what counts as a failure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio

__all__ = ["Backoff", "exponential"]


def exponential(failures: int, base: float, cap: float, factor: float = 2.0) -> float:
    """Seconds to wait after ``failures`` failures in a row (1: ``base``), at most ``cap``.

    Does not block. ``failures`` below 1 waits nothing.
    """
    if failures < 1:
        return 0.0
    return float(min(cap, base * factor ** min(failures - 1, 64)))


class Backoff:
    """Waits between attempts of one retry loop (loop side; does not block
    except :meth:`sleep`).

    Parameters
    ----------
    base : float
        Seconds to wait after the first failure.
    cap : float
        Seconds to wait at most.
    factor : float
        Growth per failure (default 2).
    give_up_after : float, optional
        Seconds from the first failure after which :meth:`exhausted` says to
        stop (``math.inf`` or None: never; 0: at the first failure).
    clock : callable
        The time source (``time.monotonic``; a test passes its own).
    """

    def __init__(
        self,
        base: float,
        cap: float,
        factor: float = 2.0,
        *,
        give_up_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = base
        self.cap = cap
        self.factor = factor
        self.give_up_after = math.inf if give_up_after is None else give_up_after
        self._clock = clock
        self.failures = 0
        self._since: float | None = None

    @property
    def wait(self) -> float:
        """The wait the next :meth:`failed` returns (seconds)."""
        return exponential(self.failures + 1, self.base, self.cap, self.factor)

    def failed(self) -> float:
        """Count a failure; return the seconds to wait before the next attempt."""
        if self._since is None:
            self._since = self._clock()
        self.failures += 1
        return exponential(self.failures, self.base, self.cap, self.factor)

    def exhausted(self) -> bool:
        """True when waiting :attr:`wait` more would pass ``give_up_after``
        (counted from the first failure since the last success)."""
        if math.isinf(self.give_up_after):
            return False
        now = self._clock()
        since = now if self._since is None else self._since
        return now + self.wait > since + self.give_up_after

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits ``base`` again."""
        self.failures = 0
        self._since = None

    async def sleep(self) -> None:
        """Count a failure and sleep its wait (a checkpoint; cancellable)."""
        await anyio.sleep(self.failed())
