"""ChatPort over Slack's Web API, with retries that are safe.

Retried: 429 (after the Retry-After Slack sends), a connection that was never established (the
request cannot have been processed), and for idempotent methods also 5xx/timeouts. Not
retried: chat.postMessage after a timeout or a 5xx, because Slack may already have posted it
and a second post is exactly the duplicate this bot exists to avoid; the incident then stays
unposted in the store and the sweeper posts it once Slack answers again.
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.metrics import Metrics
from bot.app.ports import ChatUnavailable
from bot.app.records import Incident, MessageRef, Note
from bot.app.retrying import RetryEvent, RetryPolicy
from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor
from bot.slack.blocks import incident_message, note_message

log = logging.getLogger(__name__)

# Methods whose repetition does no harm: same result, no duplicate message.
IDEMPOTENT = {"chat.update", "users.info", "usergroups.users.list", "auth.test", "chat.postEphemeral"}
SERVER_ERRORS = {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
CHANNEL_REFUSED = {"channel_not_found", "not_in_channel", "is_archived", "restricted_action"}
SLACK_API_URL = "https://slack.com/api/"


def make_client(token: str, base_url: str | None = None, timeout: int = 10) -> WebClient:
    """A WebClient without slack_sdk's own retry handlers: retries happen (and are counted) here."""
    return WebClient(token=token, base_url=base_url or SLACK_API_URL, timeout=timeout, retry_handlers=[])


def retry_reason(method: str, exc: BaseException) -> str | None:
    """Why this failure may be retried, or None if it must not be."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", None)
        error = (exc.response.data or {}).get("error") if isinstance(exc.response.data, dict) else None
        if status == 429 or error == "ratelimited":
            return "ratelimited"
        if (status is not None and status >= 500) or error in SERVER_ERRORS:
            return "server_error" if method in IDEMPOTENT else None
        return None
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror)):
        return "connection_refused"
    if isinstance(exc, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(exc, (TimeoutError, socket.timeout, urllib.error.URLError, ConnectionError)):
        return "timeout" if method in IDEMPOTENT else None
    return None


def retry_after_seconds(exc: BaseException) -> float | None:
    if isinstance(exc, SlackApiError):
        headers = getattr(exc.response, "headers", None) or {}
        value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if isinstance(value, list):
            value = value[0] if value else None
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None
    return None


class SlackChat:
    def __init__(self, client: WebClient, default_channel: str, metrics: Metrics | None = None,
                 max_attempts: int = 5, max_retry_after_seconds: float = 60,
                 backoff_seconds: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 redactor: Redactor | None = None):
        self.client = client
        self.redactor = redactor or DEFAULT_REDACTOR  # every message: the built-in rules + the operator's
        self.default_channel = default_channel
        self.metrics = metrics or Metrics()
        # The shared policy; `sleep` is injectable so a test can see the waits without waiting.
        self.retries = RetryPolicy(attempts=max_attempts, initial=backoff_seconds, maximum=10, jitter=0.1,
                                   max_retry_after=max_retry_after_seconds, sleep=sleep)

    # ---- the one place every Web API call goes through ----------------------------------

    def call(self, method: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        def on_retry(event: RetryEvent) -> None:
            self.metrics.slack_retries.labels(method, event.reason).inc()
            capped = f" (Retry-After {event.retry_after:.0f}s capped)" if event.capped else ""
            log.warning("Slack %s failed (%s: %s), retry %d of %d%s", method, event.reason, event.error,
                        event.attempt, event.attempts - 1, capped)

        try:
            return self.retries.run(fn, reason_of=lambda exc: retry_reason(method, exc),
                                    retry_after_of=retry_after_seconds, on_retry=on_retry, **kwargs)
        except (SlackApiError, OSError) as exc:
            self.metrics.slack_failures.labels(method).inc()
            detail = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            log.error("Slack %s failed for good: %s", method, detail)
            raise ChatUnavailable(f"{method}: {detail}", channel_refused=detail in CHANNEL_REFUSED) from exc

    # ---- ChatPort ---------------------------------------------------------------------

    def post_incident(self, incident: Incident, channel: str | None = None) -> MessageRef:
        text, blocks = incident_message(incident, self.redactor)
        resp = self.call("chat.postMessage", self.client.chat_postMessage, channel=channel or self.default_channel,
                         text=text, blocks=blocks, unfurl_links=False, unfurl_media=False)
        return MessageRef(channel=resp["channel"], ts=resp["ts"])

    def update_incident(self, incident: Incident, message: MessageRef) -> None:
        text, blocks = incident_message(incident, self.redactor)
        self.call("chat.update", self.client.chat_update, channel=message.channel, ts=message.ts,
                  text=text, blocks=blocks)

    def reply(self, thread: MessageRef, note: Note) -> None:
        text, blocks = note_message(note.text, note.diagnosis, note.rollback_incident, self.redactor)
        self.call("chat.postMessage", self.client.chat_postMessage, channel=thread.channel, thread_ts=thread.ts,
                  text=text, blocks=blocks, unfurl_links=False, unfurl_media=False)

    def tell_user(self, channel: str, user: str, text: str) -> None:
        self.call("chat.postEphemeral", self.client.chat_postEphemeral, channel=channel, user=user, text=text)

    def group_members(self, group_id: str) -> set[str]:
        resp = self.call("usergroups.users.list", self.client.usergroups_users_list, usergroup=group_id)
        return set(resp.get("users") or [])

    def user_name(self, user_id: str) -> str | None:
        resp = self.call("users.info", self.client.users_info, user=user_id)
        user = resp.get("user") or {}
        return user.get("name") or user.get("real_name") or None

    def check(self) -> str:
        """For /readyz: Slack answers and the token is valid. Returns the bot's user id."""
        resp = self.call("auth.test", self.client.auth_test)
        return str(resp.get("user_id", ""))
