"""Bounded retries for Kubernetes API calls: 429 (honouring Retry-After), 5xx, timeouts.

Every retry is logged and counted. The Slack side publishes the count as the metric
`kube_retries_total`: read `retry_count()` or register a callback with `on_retry(callback)`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity
import urllib3
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("bot.kube")
T = TypeVar("T")

RETRIED_STATUS = {429, 500, 502, 503, 504}

_lock = threading.Lock()
_retries_total = 0
_listeners: list[Callable[[str, int | None], None]] = []


def retry_count() -> int:
    """How many Kubernetes API retries this process has made (for kube_retries_total)."""
    return _retries_total


def on_retry(callback: Callable[[str, int | None], None]) -> None:
    """Call `callback(what, http_status_or_None)` on every retry (e.g. to bump a Prometheus counter)."""
    with _lock:
        _listeners.append(callback)


def _count(what: str, status: int | None) -> None:
    global _retries_total
    with _lock:
        _retries_total += 1
        listeners = list(_listeners)
    for callback in listeners:
        try:
            callback(what, status)
        except Exception:  # a broken metrics hook must never break a patch
            log.exception("retry listener failed")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in RETRIED_STATUS
    return isinstance(exc, (urllib3.exceptions.HTTPError, TimeoutError, ConnectionError))


def retry_after_seconds(exc: BaseException) -> float | None:
    if isinstance(exc, ApiException) and exc.status == 429 and exc.headers:
        value = exc.headers.get("Retry-After")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None
    return None


@dataclass
class RetryPolicy:
    """attempts: total tries. Backoff: exponential from `initial`, capped at `maximum`, with jitter.
    A 429's Retry-After is honoured (capped at `max_retry_after`). `sleep` is injectable so tests
    can record waits instead of sleeping."""

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    max_retry_after: float = 60.0
    sleep: Callable[[float], None] = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.sleep is None:
            import time

            self.sleep = time.sleep

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        backoff = tenacity.wait_exponential_jitter(multiplier=self.initial, max=self.maximum, jitter=self.jitter)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            after = retry_after_seconds(exc) if exc else None
            return min(after, self.max_retry_after) if after is not None else backoff(state)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            status = getattr(exc, "status", None)
            _count(what, status)
            log.warning("kubernetes %s failed (%s), retry %d/%d in %.2fs", what,
                        status or type(exc).__name__, state.attempt_number, self.attempts - 1,
                        state.next_action.sleep if state.next_action else 0.0)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=wait,
            retry=tenacity.retry_if_exception(is_transient),
            before_sleep=before_sleep,
            sleep=self.sleep,
            reraise=True,
        )
        return retrying(fn, *args, **kwargs)
