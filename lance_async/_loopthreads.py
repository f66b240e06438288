"""Prefetch threads stopped and joined when their event loop ends (ground floor).

A reader thread left running when its event loop ends (a stream not closed
when ``asyncio.run`` returns) is still inside the engine when the
interpreter finalizes, and pylance then aborts the process (SIGABRT, about
one run in five). So every loop that starts such a thread gets a sentinel
async generator, suspended at its first ``yield``: asyncio (in
``shutdown_asyncgens``) and trio close the async generators still alive when
their run ends, and the sentinel's ``finally`` stops that loop's threads and
joins them. An ``atexit`` hook does the same for any thread left, before the
interpreter finalizes. (The threads themselves are described in
``_threads.py``.)
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["STOP_TIMEOUT", "stop_threads_at_loop_end", "track_thread", "untrack_thread"]

log = logging.getLogger("lance_async.threads")

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
