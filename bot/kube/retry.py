"""Bounded retries for Kubernetes API calls: 429 (honouring Retry-After), 5xx, timeouts.

Every retry is logged and counted. The Slack side publishes the count as the metric
`kube_retries_total`: read `retry_count()` or register a callback with `on_retry(callback)`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from bot.app.retrying import RetryEvent
from bot.app.retrying import RetryPolicy as SharedRetryPolicy

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


class RetryPolicy(SharedRetryPolicy):
    """The shared policy (bot.app.retrying), with what the Kubernetes API may retry: 429
    (honouring Retry-After, capped), 5xx, timeouts and dropped connections. Every retry is
    logged and counted; a capped Retry-After says so."""

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def on_retry(event: RetryEvent) -> None:
            status = getattr(event.error, "status", None)
            _count(what, status)
            capped = f" (Retry-After {event.retry_after:.0f}s capped)" if event.capped else ""
            log.warning("kubernetes %s failed (%s), retry %d/%d in %.2fs%s", what,
                        status or type(event.error).__name__, event.attempt, event.attempts - 1,
                        event.wait_seconds, capped)

        return self.run(fn, *args, reason_of=_reason, retry_after_of=retry_after_seconds, on_retry=on_retry,
                        **kwargs)


def _reason(exc: BaseException) -> str | None:
    if not is_transient(exc):
        return None
    return f"http_{exc.status}" if isinstance(exc, ApiException) else type(exc).__name__
