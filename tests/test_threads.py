"""The worker-thread runner: limiter ownership, the cancellation rule, deadlines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import pytest

import lance_async as la
from lance_async._threads import abandoned_calls, engine_limiter, run_sync, stream_limiter
from lance_async.errors import StorageTimeoutError

from .helpers import eventually

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


async def test_a_call_that_says_abandoning_is_safe_is_abandoned_when_cancelled() -> None:
    entered, go, left = threading.Event(), threading.Event(), threading.Event()
    late: list[object] = []

    def blocked() -> str:
        entered.set()
        go.wait(60)
        left.set()
        return "late"

    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def caller() -> None:
            with scope:
                await run_sync(
                    blocked,
                    abandon_on_cancel=lambda: True,
                    on_late_result=lambda r, e: late.append(r),
                )

        tg.start_soon(caller)
        await anyio.to_thread.run_sync(entered.wait)
        scope.cancel()
    assert scope.cancelled_caught and not left.is_set()
    assert [c.what for c in abandoned_calls()] == ["an engine call"]
    assert engine_limiter().borrowed_tokens == 0
    go.set()
    await eventually(lambda: not abandoned_calls(), 30, "the abandoned call to return")
    assert late == ["late"]


async def test_a_call_that_says_abandoning_is_unsafe_is_waited_for_and_handed_over() -> None:
    entered, go = threading.Event(), threading.Event()
    handed: list[object] = []
    asked: list[bool] = []

    def committing() -> str:
        entered.set()
        go.wait(60)
        return "committed"

    def unsafe() -> bool:
        asked.append(True)
        go.set()  # the call is past its point of no return: let it finish
        return False

    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def caller() -> None:
            with scope:
                await run_sync(
                    committing,
                    abandon_on_cancel=unsafe,
                    on_cancel_result=lambda r, e: handed.append((r, e)),
                )

        tg.start_soon(caller)
        await anyio.to_thread.run_sync(entered.wait)
        scope.cancel()
    assert scope.cancelled_caught and asked == [True]
    assert handed == [("committed", None)]
    assert not abandoned_calls()


async def test_errors_propagate_unchanged() -> None:
    def fail() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await run_sync(fail)


# -- calls with a deadline (storage_timeout) ------------------------------------------


def _stuck_until(release: threading.Event, started: threading.Event) -> Callable[[], str]:
    """A call that blocks like a put on a store that refuses everything, until released."""

    def call() -> str:
        started.set()
        release.wait(60)  # a hang guard only: the test releases it
        return "late"

    return call


async def test_a_call_past_its_deadline_is_abandoned_and_raises_storage_timeout() -> None:
    release, started = threading.Event(), threading.Event()
    late: list[object] = []
    try:
        with pytest.raises(StorageTimeoutError, match="the test's stuck call") as info:
            await run_sync(
                _stuck_until(release, started),
                timeout=0.2,
                what="the test's stuck call",
                on_late_result=lambda r, e: late.append((r, e)),
            )
        assert info.value.retryable and info.value.timeout == 0.2
        assert started.is_set()
        stuck = [c for c in abandoned_calls() if c.what == "the test's stuck call"]
        assert len(stuck) == 1 and stuck[0].thread == "lance_async-engine"
    finally:
        release.set()
    # once the engine returns, the thread reports it and is forgotten
    await eventually(lambda: late == [("late", None)], 30, "the late report", interval=0.01)
    assert not [c for c in abandoned_calls() if c.what == "the test's stuck call"]


async def test_an_abandoned_call_gives_its_limiter_token_back() -> None:
    release, started = threading.Event(), threading.Event()
    limiter = anyio.CapacityLimiter(1)
    try:
        with pytest.raises(StorageTimeoutError):
            await run_sync(_stuck_until(release, started), limiter=limiter, timeout=0.2)
        assert limiter.borrowed_tokens == 0  # trio would keep it for the thread's life
        assert await run_sync(lambda: "next", limiter=limiter, timeout=5) == "next"
    finally:
        release.set()


async def test_a_call_within_its_deadline_returns_and_raises_as_usual() -> None:
    assert await run_sync(lambda: 42, timeout=30) == 42

    def fail() -> None:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        await run_sync(fail, timeout=30)
    with pytest.raises(ValueError, match="timeout"):
        await run_sync(lambda: 1, timeout=float("nan"))


async def test_cancelling_a_caller_of_a_stuck_call_returns_by_its_deadline() -> None:
    release, started = threading.Event(), threading.Event()
    handed: list[tuple[object, BaseException | None]] = []
    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_started() -> None:
                    await eventually(started.is_set, 30, "the call to start", interval=0.01)
                    scope.cancel()

                tg.start_soon(cancel_when_started)
                await run_sync(
                    _stuck_until(release, started),
                    timeout=0.3,
                    on_cancel_result=lambda r, e: handed.append((r, e)),
                )
        assert scope.cancelled_caught  # the cancellation came through, the call did not
        assert len(handed) == 1 and isinstance(handed[0][1], StorageTimeoutError)
    finally:
        release.set()


async def test_a_cancelled_caller_still_gets_a_quick_calls_outcome_handed_over() -> None:
    handed: list[object] = []

    def quick() -> str:
        time.sleep(0.2)
        return "committed"

    with anyio.move_on_after(0.05) as scope:
        await run_sync(quick, timeout=30, on_cancel_result=lambda r, e: handed.append((r, e)))
    assert scope.cancelled_caught
    assert handed == [("committed", None)]
