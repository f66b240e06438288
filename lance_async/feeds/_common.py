"""What the feed connectors share: their life-cycle enum and small guards.

Private: the public names (:class:`FeedState`) are re-exported by
:mod:`lance_async.feeds`.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import sniffio

from ..errors import ClosedError, LanceAsyncError

__all__ = ["FeedState", "call_maybe_async", "check_open", "require_asyncio"]


class FeedState(enum.Enum):
    """Life cycle of a feed connector.

    ``NEW`` (created, nothing opened) -> ``OPEN`` (connected, or the file is
    open) -> ``CLOSED`` (after ``aclose()``; ``fetch`` then raises
    :class:`~lance_async.ClosedError`).
    """

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


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
