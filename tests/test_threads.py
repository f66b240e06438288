"""The worker-thread runner: limiter ownership and the cancellation rule."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

import lance_async as la
from lance_async._threads import engine_limiter, run_sync, stream_limiter

pytestmark = pytest.mark.anyio


async def test_calls_run_on_worker_threads_under_the_library_limiter() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []
    limiter = engine_limiter()
    assert limiter is engine_limiter()  # one per event loop
    assert limiter is not stream_limiter()

    def work() -> int:
        seen.append(threading.get_ident())
        return limiter.borrowed_tokens

    borrowed = await run_sync(work)
    assert seen and seen[0] != loop_thread
    assert borrowed == 1


async def test_configure_threads_bounds_concurrency() -> None:
    la.configure_threads(engine=2)
    try:
        running = 0
        peak = 0
        lock = threading.Lock()

        def work() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.05)
            with lock:
                running -= 1

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(run_sync, work)
        assert peak == 2
        with pytest.raises(ValueError):
            la.configure_threads(engine=0)
    finally:
        la.configure_threads(engine=16)


async def test_cancelling_the_caller_lets_the_call_finish_and_hands_over_the_result() -> None:
    finished = threading.Event()
    handed: list[object] = []

    def slow() -> str:
        time.sleep(0.3)
        finished.set()
        return "committed"

    with anyio.move_on_after(0.05) as scope:
        await run_sync(slow, on_cancel_result=lambda r, e: handed.append((r, e)))
    assert scope.cancelled_caught
    # the call was not abandoned: it finished before the caller saw the cancellation
    assert finished.is_set()
    assert handed == [("committed", None)]


async def test_cancelling_the_caller_hands_over_the_error_too() -> None:
    handed: list[object] = []

    def slow_fail() -> None:
        time.sleep(0.2)
        raise OSError("disk full")

    with anyio.move_on_after(0.05):
        await run_sync(slow_fail, on_cancel_result=lambda r, e: handed.append(e))
    assert len(handed) == 1 and isinstance(handed[0], OSError)


async def test_errors_propagate_unchanged() -> None:
    def fail() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await run_sync(fail)
