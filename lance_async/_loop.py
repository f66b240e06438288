"""Binding objects to the event loop they were first used in.

Loop-bound objects (streams, bridges, writers) are created lazily inside the
running loop. :class:`LoopHandle` remembers that loop and lets worker threads
schedule a callback on it without blocking (``call_soon_threadsafe`` on
asyncio, ``TrioToken.run_sync_soon`` on trio).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel

from .errors import WrongEventLoopError

__all__ = [
    "LoopHandle",
    "aclose_shielded",
    "single_exception",
    "unwrap_groups",
]


def _native_token() -> Any:
    token: Any = anyio.lowlevel.current_token()
    return getattr(token, "native_token", token)


class LoopHandle:
    """The event loop an object is bound to.

    Create it inside a running loop (asyncio or trio). ``call_soon`` may be
    called from any thread; it never blocks and silently drops the call when
    the loop has already finished (there is nobody left to notify).
    """

    __slots__ = ("_asyncio", "_native")

    def __init__(self) -> None:
        self._native = _native_token()
        # known once: an ABC isinstance check on every call costs the hot paths
        # (every send checks its writer's loop)
        self._asyncio = isinstance(self._native, asyncio.AbstractEventLoop)

    @property
    def key(self) -> object:
        """The loop itself (asyncio) or its trio token: a hashable identity."""
        return self._native

    def is_current(self) -> bool:
        """True when called from inside this handle's loop (fast on asyncio)."""
        native = self._native
        if self._asyncio:
            return asyncio._get_running_loop() is native
        try:
            return bool(_native_token() == native)
        except Exception:
            return False

    def check(self, what: str) -> None:
        """Raise :class:`WrongEventLoopError` unless running in this loop.

        Raises
        ------
        WrongEventLoopError
            Called from another event loop, or outside any loop.
        """
        if not self.is_current():
            raise WrongEventLoopError(
                f"{what} is bound to the event loop it was first used in; "
                "create a new one in this event loop"
            )

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Schedule ``fn()`` on the loop from any thread; never blocks."""
        native = self._native
        try:
            if self._asyncio:
                native.call_soon_threadsafe(fn)
            else:
                native.run_sync_soon(fn)
        except RuntimeError:
            pass  # the loop is closed or the trio run has finished


if sys.version_info >= (3, 11):
    _BaseExceptionGroup: Any = BaseExceptionGroup  # noqa: F821 - builtin since 3.11
else:  # pragma: no cover - Python 3.10: anyio depends on the backport
    from exceptiongroup import BaseExceptionGroup as _BaseExceptionGroup


def single_exception(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups.

    Task groups wrap errors in exception groups; when exactly one error
    happened, callers of lance_async should see that error itself.
    """
    while isinstance(exc, _BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextlib.contextmanager
def unwrap_groups() -> Iterator[None]:
    """Re-raise a lone exception out of the task-group wrapping around it."""
    try:
        yield
    except BaseException as exc:
        inner = single_exception(exc)
        if inner is exc:
            raise
        inner.__suppress_context__ = True
        raise inner from inner.__cause__


async def aclose_shielded(obj: object) -> None:
    """Close an async iterator or resource if it can be closed, shielded from
    cancellation (a clean-up must finish even in a cancelled scope)."""
    aclose = getattr(obj, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()
