"""Worker threads: the one place where blocking engine calls leave the loop.

Every blocking pylance or pyarrow call lance_async makes goes through
:func:`run_sync`, on anyio's worker threads, gated by a
:class:`anyio.CapacityLimiter` that the library owns (one per event loop,
kept in an :class:`anyio.lowlevel.RunVar`, as anyio does for its own default
limiter). There are three limiters so that one kind of work can never starve
or deadlock another:

``engine``
    engine calls: merge_insert attempts, writes, MemWAL puts, planners. An
    engine call may drain a bridged async source whose producer needs a
    ``stream`` thread; the pools never wait on each other.
``stream``
    short calls on the way of a stream: parsing a chunk of a file or a
    request body, encoding a batch of a response, opening a reader.
``reader``
    the prefetch threads of :class:`~lance_async.AsyncBatchStream`, each held
    for the whole life of an open stream. Kept apart from ``stream`` so that
    open streams can never take every slot the per-batch work of their own
    consumers needs (a response encoding each batch of a scan).

The one thread that is not an anyio worker thread is that prefetch thread:
a stream is iterated from whatever task holds it and has no task of its own
in which to await a worker thread for its whole life, so it runs a dedicated
thread, started on the first ``__anext__`` and counted against ``reader``.
Such threads are tracked per event loop (:func:`track_thread`) and stopped
and joined when their loop ends (:func:`stop_threads_at_loop_end`), or at
interpreter exit: none is left inside the engine when Python finalizes.

Cancellation rule
-----------------
``run_sync`` does not abandon its thread by default. When the awaiting task is
cancelled, the engine call runs to its end in its thread; the result (or
error) is handed to ``on_cancel_result`` if one is given -- so a clean-up can
close what the call opened, or a commit can be logged -- and then the
cancellation is delivered to the caller. No worker thread is left running on
the caller's behalf, and the caller's outcome is knowable (see
``AsyncMergeInsertBuilder.last_result``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

__all__ = [
    "ThreadLimits",
    "configure_threads",
    "engine_limiter",
    "reader_limiter",
    "run_sync",
    "stop_threads_at_loop_end",
    "stream_limiter",
    "track_thread",
    "untrack_thread",
]

T = TypeVar("T")
log = logging.getLogger("lance_async")


@dataclass
class ThreadLimits:
    """How many worker threads lance_async may use at once, per event loop.

    Attributes
    ----------
    engine : int
        Threads for engine calls (merges, writes, MemWAL puts, lookups).
    stream : int
        Threads for short parse and encode calls (file chunks, request
        bodies, response batches).
    reader : int
        Open :class:`~lance_async.AsyncBatchStream` prefetch threads; one
        more open stream waits for a free one on its first ``__anext__``.
    """

    engine: int = 16
    stream: int = 16
    reader: int = 16


_limits = ThreadLimits()
_engine: RunVar[anyio.CapacityLimiter] = RunVar("lance_async.engine_limiter")
_stream: RunVar[anyio.CapacityLimiter] = RunVar("lance_async.stream_limiter")
_reader: RunVar[anyio.CapacityLimiter] = RunVar("lance_async.reader_limiter")
_lock = threading.Lock()


def configure_threads(
    *, engine: int | None = None, stream: int | None = None, reader: int | None = None
) -> ThreadLimits:
    """Set how many worker threads lance_async may use, per event loop.

    Parameters
    ----------
    engine : int, optional
        Maximum concurrent engine calls (default 16). Must be >= 1.
    stream : int, optional
        Maximum concurrent parse / encode calls (default 16).
    reader : int, optional
        Maximum open :class:`~lance_async.AsyncBatchStream` prefetch threads
        (default 16).

    Returns
    -------
    ThreadLimits
        The limits now in force.

    Raises
    ------
    ValueError
        If a limit is below 1.

    Notes
    -----
    Does not block. Applies to event loops that start afterwards and, when
    called inside a running loop, to that loop's limiters at once (like
    setting ``CapacityLimiter.total_tokens``).
    """
    wanted = {"engine": engine, "stream": stream, "reader": reader}
    for name, value in wanted.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} threads must be >= 1, got {value}")
    with _lock:
        for name, value in wanted.items():
            if value is not None:
                setattr(_limits, name, value)
    for name, value in wanted.items():
        if value is None:
            continue
        try:
            _VARS[name].get().total_tokens = value
        except (LookupError, RuntimeError):
            pass  # no limiter yet in this loop, or no loop running
    return ThreadLimits(_limits.engine, _limits.stream, _limits.reader)


_VARS = {"engine": _engine, "stream": _stream, "reader": _reader}


def _limiter(name: str) -> anyio.CapacityLimiter:
    var = _VARS[name]
    try:
        return var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(getattr(_limits, name))
        var.set(limiter)
        return limiter


def engine_limiter() -> anyio.CapacityLimiter:
    """The running event loop's limiter for engine calls (created on first use)."""
    return _limiter("engine")


def stream_limiter() -> anyio.CapacityLimiter:
    """The running event loop's limiter for short parse and encode calls."""
    return _limiter("stream")


def reader_limiter() -> anyio.CapacityLimiter:
    """The running event loop's limiter for open streams' prefetch threads."""
    return _limiter("reader")


async def run_sync(
    func: Callable[[], T],
    *,
    limiter: anyio.CapacityLimiter | None = None,
    on_cancel_result: Callable[[T | None, BaseException | None], None] | None = None,
) -> T:
    """Run a blocking call on a worker thread and await its result.

    Parameters
    ----------
    func : callable
        A blocking callable with no arguments (use ``functools.partial`` or a
        closure). It runs on an anyio worker thread, never on the loop.
    limiter : anyio.CapacityLimiter, optional
        Defaults to the library's engine limiter (see :func:`engine_limiter`).
    on_cancel_result : callable, optional
        Called on the loop with ``(result, None)`` or ``(None, error)`` when the
        awaiting task was cancelled while ``func`` ran, before the cancellation
        is re-raised. Use it to close what ``func`` opened or to record a
        commit.

    Returns
    -------
    T
        Whatever ``func`` returned.

    Raises
    ------
    BaseException
        Whatever ``func`` raised; the cancellation exception of the backend
        when the caller was cancelled (after ``func`` finished).
    """
    result: T | None = None
    error: BaseException | None = None
    try:
        result = await anyio.to_thread.run_sync(
            func, abandon_on_cancel=False, limiter=limiter or engine_limiter()
        )
    except BaseException as exc:
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        error = exc
    # The thread has finished. If the awaiting task was cancelled meanwhile,
    # hand the outcome over before the cancellation is delivered.
    if on_cancel_result is not None:
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            try:
                on_cancel_result(result, error)
            except Exception:  # pragma: no cover - clean-up must not mask cancel
                log.exception("lance_async: clean-up after a cancelled call failed")
            raise
    if error is not None:
        # A caller cancelled while the call ran gets its cancellation, not an
        # error the cancellation may have caused (a bridged source cut short).
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise error
    return result  # type: ignore[return-value]


# -- worker threads stopped when their event loop ends -----------------------------
#
# A reader thread left running when its event loop ends (a stream not closed
# when ``asyncio.run`` returns) is still inside the engine when the
# interpreter finalizes, and pylance then aborts the process (SIGABRT, about
# one run in five). So every loop that starts such a thread gets a sentinel
# async generator, suspended at its first ``yield``: asyncio (in
# ``shutdown_asyncgens``) and trio close the async generators still alive when
# their run ends, and the sentinel's ``finally`` stops that loop's threads and
# joins them. An ``atexit`` hook does the same for any thread left, before the
# interpreter finalizes.

#: How long stopping a loop's threads waits for them, in all (seconds).
STOP_TIMEOUT = 10.0

_live_lock = threading.Lock()
_live: dict[object, dict[threading.Thread, Callable[[], None]]] = {}
_sentinels: dict[object, AsyncIterator[None]] = {}


def _stop_and_join(threads: dict[threading.Thread, Callable[[], None]]) -> None:
    for stop in threads.values():
        stop()
    deadline = time.monotonic() + STOP_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("lance_async: a worker thread is still in a blocking call at loop end")


def _stop_loop_threads(key: object) -> None:
    with _live_lock:
        threads = _live.pop(key, {})
        _sentinels.pop(key, None)
    _stop_and_join(threads)


async def _loop_sentinel(key: object) -> AsyncIterator[None]:
    try:
        yield
    finally:
        _stop_loop_threads(key)


async def stop_threads_at_loop_end(key: object) -> None:
    """Make sure the running loop (identified by ``key``, see
    ``LoopHandle.key``) stops the threads tracked under ``key`` when it ends.

    Idempotent per loop; call it from inside that loop before starting a
    thread. Does not block.
    """
    with _live_lock:
        if key in _sentinels:
            return
        sentinel = _sentinels[key] = _loop_sentinel(key)
    await sentinel.__anext__()  # suspended now: the loop closes it at its end


def track_thread(key: object, thread: threading.Thread, stop: Callable[[], None]) -> None:
    """Track ``thread`` of loop ``key``: at the loop's end (or at exit) ``stop()``
    is called and the thread joined (``STOP_TIMEOUT`` seconds for all)."""
    with _live_lock:
        _live.setdefault(key, {})[thread] = stop


def untrack_thread(key: object, thread: threading.Thread) -> None:
    """Forget a thread that has finished (call it from the thread's last act)."""
    with _live_lock:
        threads = _live.get(key)
        if threads is not None:
            threads.pop(thread, None)


@atexit.register
def _stop_all_threads() -> None:
    with _live_lock:
        threads = {t: stop for group in _live.values() for t, stop in group.items()}
        _live.clear()
        _sentinels.clear()
    _stop_and_join(threads)
