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
Such threads are tracked per event loop and stopped and joined when their
loop ends, or at interpreter exit (``_loopthreads.py``): none is left
inside the engine when Python finalizes.

Cancellation rule
-----------------
``run_sync`` does not abandon its thread by default. When the awaiting task is
cancelled, the engine call runs to its end in its thread; the result (or
error) is handed to ``on_cancel_result`` if one is given -- so a clean-up can
close what the call opened, or a commit can be logged -- and then the
cancellation is delivered to the caller. No worker thread is left running on
the caller's behalf, and the caller's outcome is knowable (see
``AsyncMergeInsertBuilder.last_result``).

A call may also say that abandoning it is safe (``abandon_on_cancel``): a
merge whose engine has not yet seen the end of its source cannot commit
(the source's next batch stops it), so when its task is cancelled while a
user's factory or generator blocks in that thread, the cancellation is
delivered at once and the thread is left to end by itself, unwatched, as
calls past their deadline are (below). Without it, a sync factory that never
returns would make its merge uncancellable for ever.

Calls with a deadline
---------------------
Some engine calls never return when the store refuses every request: pylance
14's ``ShardWriter.put`` retries a refused or vanished bucket for ever. A call
given ``timeout=`` is waited on for that many seconds at most, cancellation
included (a cancelled caller still waits for the call, up to its deadline, so
that a call about to finish hands its outcome over as above). At the deadline
the call is *abandoned*: the caller gets
:class:`~lance_async.errors.StorageTimeoutError` and the thread runs on,
unwatched, until the engine returns (perhaps never). Such calls run on the
library's own daemon threads, not on anyio's: an asyncio worker thread stuck
in the engine would keep the interpreter from exiting, and trio keeps a
thread's limiter token until the thread ends. The library limiter's token is
held by the waiting task, so it is given back at the deadline: an abandoned
call counts in :func:`abandoned_calls` (and is logged when abandoned and
when, if ever, it returns), never against the limiter. An operation made of
many engine calls (a compaction) gives them all a deadline at once with
``with call_timeouts(seconds):`` (a context variable, as anyio's cancel
scopes are): each call made inside without a ``timeout=`` of its own gets
that one.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from ._engine_errors import raise_mapped
from ._loop import LoopHandle
from ._loopthreads import stop_threads_at_loop_end, track_thread, untrack_thread
from .errors import StorageTimeoutError

__all__ = [
    "DEFAULT_STORAGE_TIMEOUT",
    "STORAGE_TIMEOUT_ENV",
    "AbandonedCall",
    "ThreadLimits",
    "abandoned_calls",
    "abandoned_total",
    "call_timeouts",
    "configure_threads",
    "default_storage_timeout",
    "engine_limiter",
    "reader_limiter",
    "run_engine",
    "run_sync",
    "stop_threads_at_loop_end",
    "stream_limiter",
    "track_thread",
    "untrack_thread",
]

T = TypeVar("T")
log = logging.getLogger("lance_async.threads")

DEFAULT_STORAGE_TIMEOUT = 60.0
"""Seconds a call that waits on the store may take before it is abandoned
(``storage_timeout`` of datasets and MemWAL writers), unless the
environment says otherwise (:func:`default_storage_timeout`)."""

#: The environment variable that sets the default ``storage_timeout``.
STORAGE_TIMEOUT_ENV = "LANCE_ASYNC_STORAGE_TIMEOUT"


def default_storage_timeout() -> float:
    """The ``storage_timeout`` a dataset gets when none is given, in seconds:
    ``LANCE_ASYNC_STORAGE_TIMEOUT`` when set (the command line's
    ``--storage-timeout`` sets it), else :data:`DEFAULT_STORAGE_TIMEOUT`.
    Read at each call; does not block.

    Raises
    ------
    ValueError
        The variable is set to something that is not a number of seconds > 0.
    """
    raw = os.environ.get(STORAGE_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_STORAGE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{STORAGE_TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


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
    timeout: float | None = None,
    what: str = "an engine call",
    on_late_result: Callable[[T | None, BaseException | None], None] | None = None,
    abandon_on_cancel: Callable[[], bool] | None = None,
) -> T:
    """Run a blocking call on a worker thread and await its result.

    Parameters
    ----------
    func : callable
        A blocking callable with no arguments (use ``functools.partial`` or a
        closure). It runs on a worker thread, never on the loop.
    limiter : anyio.CapacityLimiter, optional
        Defaults to the library's engine limiter (see :func:`engine_limiter`).
    on_cancel_result : callable, optional
        Called on the loop with ``(result, None)`` or ``(None, error)`` when the
        awaiting task was cancelled while ``func`` ran, before the cancellation
        is re-raised. Use it to close what ``func`` opened or to record a
        commit. With ``timeout``, a call abandoned at its deadline hands over
        ``(None, StorageTimeoutError)``.
    timeout : float, optional
        Seconds to wait for ``func`` at most, cancellation included; then the
        call is abandoned (see the module notes). None (the default): the
        deadline of the enclosing :func:`call_timeouts`, if any, else wait
        however long it takes.
    what : str
        What the call does, for the timeout's message and the log
        (``"the put of shard ..."``).
    on_late_result : callable, optional
        With ``timeout`` or ``abandon_on_cancel``: called *on the worker
        thread* with the outcome of a call that returns after it was
        abandoned (to close what it opened).
    abandon_on_cancel : callable, optional
        Asked, on the loop, when the awaiting task is cancelled while
        ``func`` runs: True means nothing ``func`` can still do needs its
        caller (it will commit nothing), so the call is abandoned -- the
        cancellation is delivered at once and the thread ends by itself,
        unwatched (counted in :func:`abandoned_calls` until it does); False
        waits for ``func`` as without it. The call then runs on the
        library's daemon threads. Without a ``timeout``, a call that ends
        neither way waits however long it takes.

    Returns
    -------
    T
        Whatever ``func`` returned.

    Raises
    ------
    StorageTimeoutError
        ``func`` did not return within ``timeout`` seconds (the caller was
        not cancelled).
    BaseException
        Whatever ``func`` raised; the cancellation exception of the backend
        when the caller was cancelled (after ``func`` finished, or after it
        was abandoned).
    """
    if timeout is None:
        timeout = _call_timeout.get()
    if timeout is not None:
        return await _run_bounded(
            func, limiter or engine_limiter(), on_cancel_result, timeout, what, on_late_result
        )
    if abandon_on_cancel is not None:
        return await _run_abandonable(
            func,
            limiter or engine_limiter(),
            on_cancel_result,
            abandon_on_cancel,
            what,
            on_late_result,
        )
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
            _hand_over(on_cancel_result, result, error)
            raise
    if error is not None:
        # A caller cancelled while the call ran gets its cancellation, not an
        # error the cancellation may have caused (a bridged source cut short).
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise error
    return result  # type: ignore[return-value]


def _hand_over(
    callback: Callable[[T | None, BaseException | None], None],
    result: T | None,
    error: BaseException | None,
) -> None:
    try:
        callback(result, error)
    except Exception:  # pragma: no cover - clean-up must not mask cancel
        log.exception("lance_async: clean-up after a cancelled call failed")


# -- calls with a deadline: abandoned, never waited on for ever ------------------------

_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "lance_async.call_timeout", default=None
)


async def run_engine(func: Callable[[], T], **options: Any) -> T:
    """:func:`run_sync` for a call into the engine: its errors mapped to
    lance_async's (:func:`~lance_async._engine_errors.raise_mapped`; the original is
    the ``__cause__``). The keywords are :func:`run_sync`'s."""
    try:
        return await run_sync(func, **options)
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise


@contextlib.contextmanager
def call_timeouts(seconds: float | None) -> Iterator[None]:
    """Give every :func:`run_sync` call made inside (in this task, and in the
    tasks it starts) a deadline of ``seconds`` each, unless it passes its own
    ``timeout=``. None lifts it. Does not block.
    """
    token = _call_timeout.set(seconds)
    try:
        yield
    finally:
        _call_timeout.reset(token)


@dataclass(frozen=True)
class AbandonedCall:
    """An engine call that did not return within its deadline and was left to run.

    Attributes
    ----------
    what : str
        What the call was doing (``"the put of shard ..."``).
    timeout : float
        Its deadline, in seconds.
    started : float
        When it started (``time.monotonic()``).
    thread : str
        The name of the thread it runs on.
    """

    what: str
    timeout: float
    started: float
    thread: str


class _Call(Generic[T]):
    """One call with a deadline, shared by the waiting task and its thread."""

    __slots__ = (
        "abandoned",
        "context",
        "done",
        "error",
        "finished",
        "func",
        "lock",
        "loop",
        "on_late_result",
        "result",
        "started",
        "thread",
        "timeout",
        "what",
    )

    def __init__(
        self,
        func: Callable[[], T],
        what: str,
        timeout: float,
        on_late_result: Callable[[T | None, BaseException | None], None] | None,
    ) -> None:
        self.func = func
        self.what = what
        self.timeout = timeout
        self.on_late_result = on_late_result
        self.context = contextvars.copy_context()
        self.loop = LoopHandle()
        self.done = anyio.Event()
        self.lock = threading.Lock()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = self.abandoned = False
        self.thread = ""
        self.started = time.monotonic()

    def run(self) -> None:
        """Run the call (on a worker thread) and report its outcome."""
        result: T | None = None
        error: BaseException | None = None
        self.thread = threading.current_thread().name
        try:
            result = self.context.run(self.func)
        except BaseException as exc:  # handed to the waiting task (a panic included)
            error = exc
        with self.lock:
            self.result, self.error, self.finished = result, error, True
            abandoned = self.abandoned
        if not abandoned:
            self.loop.call_soon(self.done.set)
            return
        _forget(self)
        log.warning(
            "lance_async: %s returned %.1f s after it was abandoned (%s)",
            self.what,
            time.monotonic() - self.started,
            f"error: {error}" if error is not None else "no error",
        )
        if self.on_late_result is not None:
            try:
                self.on_late_result(result, error)
            except Exception:
                log.exception("lance_async: clean-up after an abandoned call failed")

    def abandon(self, cancelled: bool = False) -> bool:
        """Abandon the call unless it has finished; True when it was abandoned
        (``cancelled``: its caller was cancelled, rather than past its deadline)."""
        with self.lock:  # the thread's report sees either finished or the record
            if self.finished:
                return False
            self.abandoned = True
            with _abandoned_lock:
                global _abandoned_total
                _abandoned_total += 1
                _abandoned[id(self)] = AbandonedCall(
                    self.what, self.timeout, self.started, self.thread
                )
        if cancelled:
            log.warning(
                "lance_async: %s was cancelled while its thread was blocked (in a source's "
                "factory or iterator); the thread is abandoned and commits nothing",
                self.what,
            )
        else:
            log.warning(
                "lance_async: %s did not return within %g s; its worker thread is abandoned "
                "(it may be stuck in the engine for ever: a store that refuses every request)",
                self.what,
                self.timeout,
            )
        return True


_abandoned_lock = threading.Lock()
_abandoned: dict[int, AbandonedCall] = {}
_abandoned_total = 0


def abandoned_total() -> int:
    """How many calls this process abandoned at their deadline, returned
    since or not. Does not block. A process that abandoned any may hold
    engine objects made on a thread nobody waited for; the command line
    ends such a process without the interpreter's finalization, which
    pylance may abort in."""
    with _abandoned_lock:
        return _abandoned_total


def _forget(call: _Call[Any]) -> None:
    with _abandoned_lock:
        _abandoned.pop(id(call), None)


def abandoned_calls() -> list[AbandonedCall]:
    """The calls abandoned at their deadline that have not returned yet
    (in this process, every event loop). Does not block."""
    with _abandoned_lock:
        return list(_abandoned.values())


#: Seconds an idle daemon worker waits for another call before it ends.
_IDLE_SECONDS = 10.0
_idle_lock = threading.Lock()
_idle: list[queue.SimpleQueue[_Call[Any]]] = []


def _worker(inbox: queue.SimpleQueue[_Call[Any]]) -> None:
    while True:
        try:
            call = inbox.get(timeout=_IDLE_SECONDS)
        except queue.Empty:
            with _idle_lock:
                if inbox in _idle:
                    _idle.remove(inbox)
                    return
            continue  # taken meanwhile: a call is on its way
        call.run()
        with _idle_lock:
            _idle.append(inbox)


def _submit(call: _Call[Any]) -> None:
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(
            target=_worker, args=(inbox,), name="lance_async-engine", daemon=True
        ).start()
    inbox.put(call)


async def _run_bounded(
    func: Callable[[], T],
    limiter: anyio.CapacityLimiter,
    on_cancel_result: Callable[[T | None, BaseException | None], None] | None,
    timeout: float,
    what: str,
    on_late_result: Callable[[T | None, BaseException | None], None] | None,
) -> T:
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
    async with limiter:  # held by this task: given back at the deadline, whatever the thread
        call = _Call(func, what, timeout, on_late_result)
        _submit(call)
        # Shielded: a cancelled caller still waits, up to the deadline.
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + timeout):
            await call.done.wait()
        abandoned = call.abandon()
    error: BaseException | None
    if abandoned:
        result, error = (
            None,
            StorageTimeoutError(
                f"{what} did not return within {timeout:g} s (storage_timeout); the store "
                "refuses or does not answer. Its worker thread is abandoned"
            ),
        )
        error.timeout = timeout
    else:
        result, error = call.result, call.error
    if on_cancel_result is not None:
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            _hand_over(on_cancel_result, result, error)
            raise
    if error is not None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise error
    return result  # type: ignore[return-value]


async def _run_abandonable(
    func: Callable[[], T],
    limiter: anyio.CapacityLimiter,
    on_cancel_result: Callable[[T | None, BaseException | None], None] | None,
    abandon: Callable[[], bool],
    what: str,
    on_late_result: Callable[[T | None, BaseException | None], None] | None,
) -> T:
    async with limiter:  # held by this task: given back when the call is abandoned
        call = _Call(func, what, math.inf, on_late_result)
        _submit(call)
        try:
            await call.done.wait()
        except anyio.get_cancelled_exc_class():
            if abandon() and call.abandon(cancelled=True):
                raise
            with anyio.CancelScope(shield=True):  # it may still commit: wait, then hand over
                await call.done.wait()
            if on_cancel_result is not None:
                _hand_over(on_cancel_result, call.result, call.error)
            raise
    if call.error is not None:
        raise call.error
    return call.result  # type: ignore[return-value]
