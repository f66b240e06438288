"""The one retry helper: waits that grow, a cap, a reset, a deadline (a mock clock)."""

from __future__ import annotations

import math

import pytest

from lance_async._retry import Backoff, exponential


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_up_to_the_cap_and_start_over_after_a_success() -> None:
    backoff = Backoff(0.05, 0.3)
    assert [backoff.failed() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    backoff.reset()
    assert backoff.wait == 0.05
    assert exponential(0, 1.0, 10.0) == 0.0
    assert exponential(3, 1.0, 10.0, factor=3.0) == 9.0
    assert exponential(10**6, 1.0, 10.0) == 10.0  # no overflow


def test_give_up_after_counts_from_the_first_failure() -> None:
    clock = Clock()
    backoff = Backoff(1.0, 8.0, give_up_after=10.0, clock=clock)
    assert not backoff.exhausted()
    waited = []
    while not backoff.exhausted():
        waited.append(backoff.failed())
        clock.now += waited[-1]
    assert waited == [1.0, 2.0, 4.0]  # 7 s; 8 more would pass 10
    backoff.reset()
    assert not backoff.exhausted()


@pytest.mark.parametrize("give_up_after", [0.0, math.inf, None])
def test_no_time_means_stop_at_once_and_inf_never(give_up_after: float | None) -> None:
    backoff = Backoff(0.5, 1.0, give_up_after=give_up_after, clock=Clock())
    assert backoff.exhausted() is (give_up_after == 0.0)
