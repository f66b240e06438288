"""What the broker feed connectors share: their life-cycle enum and small guards
(also used by ``cluster/``'s broker clients).

The public names (:class:`FeedState`) are re-exported by :mod:`lance_async.feeds`.
"""

from __future__ import annotations

import enum
import inspect
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import sniffio

from ..errors import ClosedError, LanceAsyncError

__all__ = [
    "DEFAULT_RETRY_FOR",
    "BrokerFeed",
    "FeedState",
    "call_maybe_async",
    "check_open",
    "check_retry_for",
    "require_asyncio",
]

DEFAULT_RETRY_FOR = 300.0
"""Seconds a broker feed rides out a broker that went away -- a restart, a
network cut, a failover -- before its error reaches the caller: every feed's
``retry_for`` (JetStream, Redis Streams; a Kafka feed takes the same
setting). Five minutes covers a rolling restart of a broker cluster; a feed
that should fail fast sets it lower, one that should wait for ever sets
``math.inf``."""


def check_retry_for(retry_for: float) -> float:
    """``retry_for`` checked: a number of seconds >= 0 (``math.inf``: for ever).

    Raises
    ------
    ValueError, TypeError
        Negative, NaN, or not a number.
    """
    if isinstance(retry_for, bool) or not isinstance(retry_for, (int, float)):
        raise TypeError(f"retry_for must be a number of seconds, got {retry_for!r}")
    if not retry_for >= 0:
        raise ValueError(f"retry_for must be >= 0 seconds, got {retry_for}")
    return float(retry_for)


class FeedState(enum.Enum):
    """Life cycle of a feed connector.

    ``NEW`` (created, nothing opened) -> ``OPEN`` (connected, or the file is
    open) -> ``CLOSED`` (after ``aclose()``; ``fetch`` then raises
    :class:`~lance_async.ClosedError`).
    """

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


_B = TypeVar("_B", bound="BrokerFeed")


class BrokerFeed:
    """What the broker feeds (JetStream, Redis Streams, Kafka) share.

    A broker's stream has no end, so :attr:`exhausted` is always False; the
    feed is its own ``async with`` context (entering returns it, leaving
    awaits :meth:`aclose`); a feed that owns its client warns with
    :class:`ResourceWarning` when collected while still open. Subclasses set
    ``_state`` and, when they own the client, ``_owns_client``.
    """

    _state: FeedState
    _owns_client: bool = False

    @property
    def state(self) -> FeedState:
        """Where the feed is in its life cycle."""
        return self._state

    @property
    def exhausted(self) -> bool:
        """Always False: a broker's stream has no end."""
        return False

    async def aclose(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    async def __aenter__(self: _B) -> _B:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is FeedState.OPEN and getattr(self, "_owns_client", False):
            warnings.warn(
                f"{self!r} was never closed; use `async with` or await aclose()",
                ResourceWarning,
                stacklevel=1,
            )


def check_open(state: FeedState, what: str) -> None:
    """Raise :class:`ClosedError` when a feed is used after ``aclose()``."""
    if state is FeedState.CLOSED:
        raise ClosedError(f"{what} is closed; create a new feed")


def require_asyncio(what: str) -> None:
    """Raise when not running on asyncio (the broker clients need it).

    Raises
    ------
    LanceAsyncError
        Running on trio (or outside any event loop).
    """
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "none"
    if library != "asyncio":
        raise LanceAsyncError(
            f"{what} runs on asyncio only (its client library does), not on {library}; "
            "run this feed under asyncio"
        )


async def call_maybe_async(fn: Callable[..., Awaitable[Any] | Any], *args: Any) -> Any:
    """Call ``fn(*args)`` and await the result when it is awaitable."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def broker_errors() -> tuple[type[BaseException], ...]:
    """Exception types of a broker that timed out or went away: the
    builtins, and those of the broker clients that are installed (redis-py
    and nats-py raise their own, outside ``OSError``). A caller that gets
    one tries again later rather than failing (does not block)."""
    found: list[type[BaseException]] = [OSError, ConnectionError, TimeoutError]
    try:
        import redis.exceptions

        found += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:  # pragma: no cover - the feeds extra is not installed
        pass
    try:
        import nats.errors

        found += [
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError,
            nats.errors.NoServersError,
            nats.errors.StaleConnectionError,
        ]
    except ImportError:  # pragma: no cover - the feeds extra is not installed
        pass
    return tuple(found)
