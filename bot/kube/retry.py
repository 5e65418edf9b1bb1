"""What the Kubernetes API may retry: 429 (honouring Retry-After, capped by the policy), 5xx,
timeouts and dropped connections. The policy, its log line and its counter are the one shared
policy's (bot.app.retrying); this module only tells a transient Kubernetes error from the rest."""

from __future__ import annotations

import urllib3
from kubernetes.client.exceptions import ApiException

from bot.app.retrying import RetryPolicy

__all__ = ["RETRIED_STATUS", "RetryPolicy", "is_transient", "retry_after_seconds", "transient_reason"]

RETRIED_STATUS = {429, 500, 502, 503, 504}


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


def transient_reason(exc: BaseException) -> str | None:
    """Why `exc` may be retried (`http_503`, `ReadTimeoutError`), or None when it may not."""
    if not is_transient(exc):
        return None
    return f"http_{exc.status}" if isinstance(exc, ApiException) else type(exc).__name__
