"""The one retry policy both adapters use: bounded, Retry-After honoured up to a cap, every retry reported."""

from __future__ import annotations

import pytest

from bot.support.retrying import RetryEvent, RetryPolicy


class Busy(Exception):
    def __init__(self, retry_after: float | None = None):
        super().__init__("busy")
        self.retry_after = retry_after


class Refused(Exception):
    pass


def flaky(failures: list[BaseException]):
    calls = []

    def fn():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "ok"
    return fn, calls


def policy(waits: list[float], **kw) -> RetryPolicy:
    return RetryPolicy(sleep=waits.append, jitter=0, **kw)


def reason_of(exc: BaseException) -> str | None:
    return "busy" if isinstance(exc, Busy) else None


def test_a_retry_after_longer_than_the_cap_waits_the_cap_and_says_so():
    waits: list[float] = []
    events: list[RetryEvent] = []
    fn, calls = flaky([Busy(retry_after=3600), Busy(retry_after=2)])
    result = policy(waits, max_retry_after=60, count=events.append).run(
        fn, api="test", call="busy call", reason_of=reason_of, retry_after_of=lambda e: getattr(e, "retry_after", None))
    assert result == "ok" and len(calls) == 3
    assert waits == [60, 2]
    assert [(e.reason, e.attempt, e.capped) for e in events] == [("busy", 1, True), ("busy", 2, False)]


def test_backoff_grows_and_the_attempts_are_bounded():
    waits: list[float] = []
    fn, calls = flaky([Busy() for _ in range(10)])
    with pytest.raises(Busy):
        policy(waits, attempts=4, initial=0.5, maximum=1.5).run(fn, api="test", call="busy call", reason_of=reason_of)
    assert len(calls) == 4 and waits == [0.5, 1.0, 1.5]


def test_a_failure_that_may_not_be_retried_is_raised_at_once():
    waits: list[float] = []
    fn, calls = flaky([Refused()])
    with pytest.raises(Refused):
        policy(waits).run(fn, api="test", call="busy call", reason_of=reason_of)
    assert len(calls) == 1 and waits == []


def test_a_first_failure_is_the_first_attempt_and_the_budget_runs_from_before_it():
    """The first attempt is made before the retry machinery exists; its failure still counts as
    attempt 1 and its time against the budget."""
    now = [0.0]
    waits: list[float] = []
    events: list[RetryEvent] = []

    def slow_then_busy():
        now[0] += 3.0
        raise Busy()

    with pytest.raises(Busy):
        policy(waits, initial=0.5, budget=3.2, clock=lambda: now[0], count=events.append).run(
            slow_then_busy, api="test", call="slow call", reason_of=reason_of)
    assert waits == [] and events == []  # 3 s spent + a 0.5 s wait would pass the 3.2 s budget

    fn, calls = flaky([Busy()])
    assert policy(waits, count=events.append).run(fn, api="test", call="busy call", reason_of=reason_of) == "ok"
    assert len(calls) == 2 and waits == [0.5] and [(e.attempt, e.attempts) for e in events] == [(1, 5)]


def test_a_single_attempt_policy_raises_the_first_failure_unretried():
    waits: list[float] = []
    fn, calls = flaky([Busy(), Busy()])
    with pytest.raises(Busy):
        policy(waits, attempts=1).run(fn, api="test", call="busy call", reason_of=reason_of)
    assert len(calls) == 1 and waits == []
