"""One bounded retry policy for every adapter that talks to a remote API (Kubernetes, Slack),
and one counter for every retry.

Each adapter says which API and call it is (`api`, `call`), which failures may be retried and
why (`reason_of`), and where the server asked for a pause (`retry_after_of`: a 429's
Retry-After). The policy owns the rest: how many attempts, exponential backoff with jitter, a
cap on any Retry-After (so a server asking for an hour never stalls the bot for an hour), one
log line per retry, and counting it through `count` (serve wires Metrics.count_retry:
vllm_oncall_retries_total{api, call, reason}).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity

T = TypeVar("T")
log = logging.getLogger("bot.retry")


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen: which call failed, why it may be retried, and the wait."""

    api: str  # "kubernetes", "slack"
    call: str  # "get pods", "chat.postMessage"
    error: BaseException
    reason: str
    attempt: int  # the attempt that just failed, from 1
    attempts: int  # the policy's total
    wait_seconds: float
    retry_after: float | None  # what the server asked for, before the cap

    @property
    def capped(self) -> bool:
        return self.retry_after is not None and self.retry_after > self.wait_seconds


def _not_counted(event: RetryEvent) -> None:
    return None


@dataclass
class RetryPolicy:
    """attempts: total tries. Backoff: exponential from `initial`, capped at `maximum`, plus up to
    `jitter` seconds. A server's Retry-After is honoured up to `max_retry_after`. `budget`: seconds
    from the first attempt after which no new attempt starts (None: attempts alone bound it).
    `count`: called with every retry (the one retry counter). `sleep` and `clock` are injectable
    so tests can record waits instead of sleeping."""

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    max_retry_after: float = 60.0
    budget: float | None = None
    sleep: Callable[[float], None] = field(default=time.sleep)
    clock: Callable[[], float] = field(default=time.monotonic)
    count: Callable[[RetryEvent], None] = field(default=_not_counted)

    def run(self, fn: Callable[..., T], *args: Any, api: str, call: str,
            reason_of: Callable[[BaseException], str | None],
            retry_after_of: Callable[[BaseException], float | None] = lambda exc: None, **kwargs: Any) -> T:
        """fn(*args, **kwargs), retried while `reason_of(error)` names a reason; the last error is
        raised. Each retry is logged and counted."""
        started = self.clock()
        # Nearly every call succeeds the first time: it is made here, and tenacity's machinery (a
        # Retrying, its state and statistics: ~0.15 ms, half the CPU of a call to a local API) is
        # built only once an attempt failed in a way that may be retried. Tenacity then replays
        # that failure as its attempt 1, so the waits, the stop, the log lines and the counts are
        # what they were.
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if reason_of(exc) is None:
                raise
            first_failure: BaseException | None = exc
        backoff = tenacity.wait_exponential_jitter(multiplier=self.initial, max=self.maximum, jitter=self.jitter)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            after = retry_after_of(exc) if exc else None
            return min(after, self.max_retry_after) if after is not None else backoff(state)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            assert exc is not None
            event = RetryEvent(api=api, call=call, error=exc, reason=reason_of(exc) or "unknown",
                               attempt=state.attempt_number, attempts=self.attempts,
                               wait_seconds=state.next_action.sleep if state.next_action else 0.0,
                               retry_after=retry_after_of(exc))
            self._retrying(event)

        def stop(state: tenacity.RetryCallState) -> bool:
            # tenacity computes the wait before asking whether to stop, so upcoming_sleep is known here
            over = self.budget is not None and self.clock() - started + (state.upcoming_sleep or 0) > self.budget
            return state.attempt_number >= self.attempts or over

        def attempt() -> T:
            nonlocal first_failure
            if first_failure is not None:  # attempt 1, made above: its failure, as it was
                failure, first_failure = first_failure, None
                raise failure
            return fn(*args, **kwargs)

        retrying = tenacity.Retrying(stop=stop, wait=wait,
                                     retry=tenacity.retry_if_exception(lambda e: reason_of(e) is not None),
                                     before_sleep=before_sleep, sleep=self.sleep, reraise=True)
        return retrying(attempt)

    def _retrying(self, event: RetryEvent) -> None:
        capped = f" (Retry-After {event.retry_after:.0f}s capped)" if event.capped else ""
        log.warning("%s %s failed (%s: %s), retry %d/%d in %.2fs%s", event.api, event.call, event.reason,
                    " ".join(str(event.error).split())[:300] or type(event.error).__name__, event.attempt,
                    event.attempts - 1, event.wait_seconds, capped)
        try:
            self.count(event)
        except Exception:  # a broken metrics hook must never break a patch
            log.exception("counting a retry failed")
