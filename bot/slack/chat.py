"""ChatPort over Slack's Web API, with retries that are safe.

Retried: 429 (after the Retry-After Slack sends), a connection that was never established (the
request cannot have been processed), and for idempotent methods also 5xx/timeouts. Not
retried: chat.postMessage after a timeout or a 5xx, because Slack may already have posted it
and a second post is exactly the duplicate this bot exists to avoid. Such a failure is
`ambiguous` (ChatUnavailable.ambiguous): the poster keeps the post lease and, once it runs out,
looks for the message's post_key (sent in its metadata) in the channel's history before posting
again (`find_posted`, bot/app/posting.py). A failure that certainly posted nothing (connection
refused, a 4xx or `ok: false` answer, 429 after the retries) is not ambiguous.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import socket
import ssl
import threading
import time
import urllib.error
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.metrics import Metrics
from bot.app.pacing import ChatWrite, Pacer, TurnTooFar
from bot.app.policy import DEFAULT_POST_LEASE
from bot.app.ports import ChatUnavailable
from bot.app.records import Incident, MessageRef, Note
from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor
from bot.slack.blocks import group_message, incident_message, incident_thread, note_message
from bot.slack.notes import note_text
from bot.slack.preflight import fix_for
from bot.slack.transport import KeptAliveClient
from bot.support.retrying import RetryPolicy

log = logging.getLogger(__name__)

# Methods whose repetition does no harm: same result, no duplicate message.
IDEMPOTENT = {"chat.update", "users.info", "usergroups.users.list", "auth.test", "chat.postEphemeral",
              "conversations.history", "conversations.replies"}
SERVER_ERRORS = {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
CHANNEL_REFUSED = {"channel_not_found", "not_in_channel", "is_archived", "restricted_action"}
SLACK_API_URL = "https://slack.com/api/"
PACED = {"chat.postMessage": ChatWrite.POST, "chat.update": ChatWrite.UPDATE}  # Slack's rate-limited writes
EVENT_TYPE = "vllm_oncall_incident"  # the metadata event type of every incident message
GROUP_EVENT_TYPE = "vllm_oncall_group"  # a storm's grouped message (its incidents' names)
DETAILS_EVENT_TYPE = "vllm_oncall_details"  # the thread reply that carries an incident's details
NOTE_EVENT_TYPE = "vllm_oncall_note"  # ... and of a thread reply that must appear once (Note.key)
# find_posted: how far before an attempt's start to look (Slack's clock against ours), and how much
# history to read at most; a channel busier than that is "cannot tell", never "not posted".
HISTORY_MARGIN = timedelta(minutes=10)
# Retries of one incident post stop starting after post_budget(lease) seconds: half the post
# lease. The last attempt then ends within that plus the client's timeout, inside the lease as
# long as the timeout is under half the lease (Settings checks it; tests/slack/test_slack.py).
# Defaults: a 60 s lease, a 30 s budget, a 10 s timeout: a post ends within 40 s.
CLIENT_TIMEOUT_SECONDS = 10


def post_budget(lease_seconds: float) -> float:
    """Seconds after a post's first attempt past which no retry of it starts."""
    return lease_seconds / 2


def post_fits_lease(lease_seconds: float, client_timeout_seconds: float) -> bool:
    """Whether a post's retries plus its last attempt's timeout end inside the post lease."""
    return post_budget(lease_seconds) + client_timeout_seconds < lease_seconds


POST_BUDGET_SECONDS = post_budget(DEFAULT_POST_LEASE.total_seconds())
HISTORY_PAGE, HISTORY_PAGES = 200, 10
# Details replies posted at once. Each waits for its channel's turn (about a second per post in a
# storm), so a few threads keep one busy channel from holding back another channel's replies.
DETAILS_THREADS = 4


def audit_actor(user_id: str, user_name: Callable[[str], str | None]) -> str:
    """`name (slack:U123)` for the audit record, or `slack:U123` when the name cannot be had."""
    try:
        name = user_name(user_id)
    except ChatUnavailable:
        name = None
    return f"{name} (slack:{user_id})" if name else f"slack:{user_id}"


SDK_LOGGER = "slack_sdk.web.base_client"  # the logger WebClient writes to


def make_client(token: str, base_url: str | None = None, timeout: int = CLIENT_TIMEOUT_SECONDS) -> KeptAliveClient:
    """A WebClient without slack_sdk's own retry handlers: retries happen (and are counted) here;
    its calls reuse kept-alive connections (bot.slack.transport).

    WebClient formats a debug line of every request and answer, bodies included (~70 us a call),
    whenever its logger's own level is DEBUG or unset, before logging drops the line. So an unset
    level is set to the one the logger has in effect (the bot's --log-level, configured before
    this): the lines logged stay the same, and are formatted only when they are logged."""
    sdk_log = logging.getLogger(SDK_LOGGER)
    if sdk_log.level == logging.NOTSET:
        sdk_log.setLevel(sdk_log.getEffectiveLevel())
    url = base_url or SLACK_API_URL
    return KeptAliveClient(token=token, base_url=url, timeout=timeout, retry_handlers=[],
                           ssl=tls_context() if url.startswith("https:") else None)


def tls_context() -> ssl.SSLContext:
    """The TLS settings http.client uses for a connection it is given no context for (Python 3.11:
    the system's CA bundle, hostname checked, ALPN http/1.1), made once for a client. Without a
    context of its own each new connection loaded the whole CA bundle again: 5-20 ms of CPU per
    connection (one per call before connections were kept alive, bot.slack.transport; still one
    per call behind a proxy). (A plain http:// URL, the stand-ins', gets none: with one, urllib's
    path would build an opener per call for nothing.)"""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    if context.post_handshake_auth is not None:
        context.post_handshake_auth = True
    return context


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
    if isinstance(exc, http.client.HTTPException):  # an answer cut short (IncompleteRead, BadStatusLine)
        return "dropped" if method in IDEMPOTENT else None
    return None


def may_have_happened(exc: BaseException) -> bool:
    """Whether Slack may have carried out a call that failed this way (ChatUnavailable.ambiguous).

    No: Slack answered that it did not (4xx, `ok: false`, 429), or the connection was never made.
    Yes: a 5xx, a timeout, a connection dropped or an answer cut short after the request was sent;
    and anything not recognised (being wrong that way costs a wait and a look-up, not a duplicate)."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", None)
        error = (exc.response.data or {}).get("error") if isinstance(exc.response.data, dict) else None
        return (status is not None and status >= 500) or error in SERVER_ERRORS
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror)):
        return False
    return not isinstance(exc, (ConnectionRefusedError, socket.gaierror))


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
                 redactor: Redactor | None = None, post_budget_seconds: float = POST_BUDGET_SECONDS,
                 clock: Callable[[], float] = time.monotonic, pacer: Pacer | None = None):
        self.client = client
        # Set when the server stops (close): a call not yet started then never starts. A details
        # reply's thread or a retry's back-off may outlive the server, and must not reach whatever
        # listens at Slack's address after it.
        self._closed = threading.Event()
        # The details replies that follow paced posts (post_incident): a few threads, made when
        # first needed, each taking the next reply in turn; a reply waits for its channel's turn.
        self._details = ThreadPoolExecutor(max_workers=DETAILS_THREADS, thread_name_prefix="slack-details")
        # Slack's posting rate (bot.app.pacing): every post and update takes its turn; None: no
        # pacing (tests of other things; serve always paces, bot.cli.wiring).
        self.pacer = pacer
        self.redactor = redactor or DEFAULT_REDACTOR  # every message: the built-in rules + the operator's
        self.default_channel = default_channel
        self._bot: str | None = None  # this bot's bot_id, once asked
        # Why the bot cannot work until someone fixes Slack (a revoked token, not in the alert
        # channel): /readyz answers 503 with it; cleared by the next call that succeeds.
        self.refusal: str | None = None
        self.metrics = metrics or Metrics()
        # The shared policy; `sleep` is injectable so a test can see the waits without waiting.
        self.retries = RetryPolicy(attempts=max_attempts, initial=backoff_seconds, maximum=10, jitter=0.1,
                                   max_retry_after=max_retry_after_seconds, sleep=sleep, clock=clock,
                                   count=self.metrics.count_retry)
        # An incident's post must end inside its post lease (Policy.post_lease): after that another
        # replica may take the lease and post, so retrying past it risks a duplicate. build_server
        # passes post_budget(lease).
        self.post_retries = dataclasses.replace(self.retries, budget=post_budget_seconds)
        # Paced, the budget is shared: half to wait for the channel's turn, half for the retries.
        self.post_wait: float | None = None
        if pacer is not None:
            self.post_wait = post_budget_seconds / 2
            self.post_retries = dataclasses.replace(self.retries, budget=post_budget_seconds / 2)

    # ---- the one place every Web API call goes through ----------------------------------

    def call(self, method: str, fn: Callable[..., Any], policy: RetryPolicy | None = None,
             max_wait: float | None = None, **kwargs: Any) -> Any:
        kind = PACED.get(method)
        if self.pacer is None or kind is None:
            return self._call(method, fn, policy, **kwargs)
        try:
            with self.pacer.turn(kind, str(kwargs.get("channel") or self.default_channel), max_wait):
                return self._call(method, fn, policy, **kwargs)
        except TurnTooFar as exc:  # certainly not sent: the incident stays pending, the sweep posts it
            self.metrics.slack_failures.labels(method).inc()
            raise ChatUnavailable(f"{method}: {exc}", ambiguous=False) from None

    def close(self) -> None:
        """No call starts after this one (the server is stopping); one under way ends as it ends.
        The client's idle kept-alive connections are closed (one in use, when its call ends)."""
        self._closed.set()
        # A reply still queued never starts (it would first wait for its channel's turn, only to be
        # refused); one under way ends as a call does.
        self._details.shutdown(wait=False, cancel_futures=True)
        if isinstance(self.client, KeptAliveClient):
            self.client.close()

    def _call(self, method: str, fn: Callable[..., Any], policy: RetryPolicy | None, **kwargs: Any) -> Any:
        def attempt(**call_kwargs: Any) -> Any:  # each attempt, the retries' included
            if self._closed.is_set():
                raise ChatUnavailable(f"{method}: the bot is stopping", ambiguous=False)
            return fn(**call_kwargs)

        try:
            answer = (policy or self.retries).run(attempt, api="slack", call=method,
                                                  reason_of=lambda exc: retry_reason(method, exc),
                                                  retry_after_of=retry_after_seconds, **kwargs)
        except (SlackApiError, OSError, http.client.HTTPException) as exc:
            self.metrics.slack_failures.labels(method).inc()
            detail = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            known, fix = self.refusal, self._refused(str(detail), kwargs.get("channel"))
            if fix is not None:
                self.metrics.slack_refusals.labels(str(detail)).inc()
                if fix != known:  # once, not at every readiness probe
                    log.error("Slack %s refused: %s", method, fix)
            else:
                log.error("Slack %s failed for good: %s", method, detail)
            raise ChatUnavailable(f"{method}: {detail}", channel_refused=detail in CHANNEL_REFUSED,
                                  ambiguous=may_have_happened(exc)) from exc
        self.refusal = None
        return answer

    def _refused(self, error: str, channel: Any) -> str | None:
        """The fix for an answer that stops the bot (bot.slack.preflight), kept as the refusal;
        not_in_channel only for the alert channel (a `/vllm why` elsewhere is answered there)."""
        if error in ("not_in_channel", "channel_not_found") and channel not in (None, self.default_channel):
            return None
        fix = fix_for(error, self.default_channel)
        if fix is not None:
            self.refusal = fix
        return fix

    def refused(self) -> str | None:
        """For /readyz: why Slack refuses the bot until someone fixes it, or None."""
        return self.refusal

    # ---- ChatPort ---------------------------------------------------------------------

    def post_incident(self, incident: Incident, channel: str | None = None,
                      thread: MessageRef | None = None) -> MessageRef:
        text, blocks = incident_message(incident, self.redactor)
        # The message's identity travels with it, so a later attempt can find it (find_posted).
        metadata = {"event_type": EVENT_TYPE, "event_payload": {"incident": incident.name,
                                                                "post_key": incident.post_key}} \
            if incident.post_key else None
        ref = self._post_top(channel, text, blocks, metadata, thread)
        details = thread or ref  # a thread has one level: the details of a message in its group's thread go beside it
        if self.pacer is None:
            self.post_details(incident, details)
        else:  # its turn comes a second later: the message's id is recorded meanwhile, not after it
            self._post_details_later(incident, details)
        return ref

    def _post_details_later(self, incident: Incident, message: MessageRef) -> None:
        """The details reply on one of DETAILS_THREADS threads, taken in the order the messages were
        posted (a thread per reply cost its creation at every incident)."""
        try:
            self._details.submit(self.post_details, incident, message)
        except RuntimeError:  # closed: the server is stopping, and no call starts any more
            log.warning("could not post the details of %s in its thread: the bot is stopping", incident.name)

    def post_group(self, incidents: list[Incident], channel: str | None = None) -> MessageRef:
        text, blocks = group_message(incidents, self.redactor)
        metadata = {"event_type": GROUP_EVENT_TYPE, "event_payload": {"incidents": [i.name for i in incidents]}}
        return self._post_top(channel, text, blocks, metadata)

    def _post_top(self, channel: str | None, text: str, blocks: Any, metadata: dict[str, Any] | None,
                  thread: MessageRef | None = None) -> MessageRef:
        """An incident's or a group's message, under the post's retries. Its turn must come inside
        the post's budget, or the post lease could run out while it waits."""
        in_thread = {"thread_ts": thread.message_id} if thread is not None else {}
        resp = self.call("chat.postMessage", self.client.chat_postMessage, policy=self.post_retries,
                         max_wait=self.post_wait, channel=channel or self.default_channel, **in_thread,
                         text=text, blocks=blocks, unfurl_links=False, unfurl_media=False, metadata=metadata)
        return MessageRef(channel=resp["channel"], message_id=resp["ts"])

    def post_details(self, incident: Incident, message: MessageRef) -> None:
        """The thread under the message: the memory picture, the budget, the command lines and the
        full evidence. The message is posted and stands without it, so a failure here is logged,
        not raised (raising would make the caller post the message again)."""
        text, blocks = incident_thread(incident, self.redactor)
        try:
            self.call("chat.postMessage", self.client.chat_postMessage, channel=message.channel,
                      thread_ts=message.message_id,
                      text=text, blocks=blocks, unfurl_links=False, unfurl_media=False,
                      metadata={"event_type": DETAILS_EVENT_TYPE, "event_payload": {"incident": incident.name}})
        except ChatUnavailable as exc:
            log.warning("could not post the details of %s in its thread: %s", incident.name, exc)

    def find_posted(self, channel: str | None, post_key: str, since: datetime,
                    thread: MessageRef | None = None) -> MessageRef | None:
        """The bot's own top-level message in `channel` whose metadata carries `post_key`, from
        conversations.history (needs channels:history / groups:history, and a channel ID, not a
        #name: Settings requires one). At most HISTORY_PAGES pages back to `since` less
        HISTORY_MARGIN; a longer history raises ChatUnavailable (cannot tell), never None."""
        channel = channel or self.default_channel
        oldest = f"{(since - HISTORY_MARGIN).timestamp():.6f}"
        if thread is not None:  # posted in its group's thread (a storm)
            found = self._own_message("conversations.replies", self.client.conversations_replies, EVENT_TYPE,
                                      "post_key", post_key, channel=channel, ts=thread.message_id, oldest=oldest)
        else:
            found = self._own_message("conversations.history", self.client.conversations_history, EVENT_TYPE,
                                      "post_key", post_key, channel=channel, oldest=oldest)
        return MessageRef(channel=channel, message_id=str(found["ts"])) if found is not None else None

    def _own_message(self, method: str, fn: Callable[..., Any], event_type: str, field: str, value: str,
                     **kwargs: Any) -> dict[str, Any] | None:
        """The bot's own message whose metadata (`event_type`) has `field` == `value`, read page by
        page (at most HISTORY_PAGES of HISTORY_PAGE); None when the last page is read without it.
        Only the bot's own messages count, so another app cannot pose as it. More pages than the
        bound: ChatUnavailable (cannot tell), never None."""
        bot_id = self._bot_id()
        cursor: str | None = None
        for _ in range(HISTORY_PAGES):
            resp = self.call(method, fn, limit=HISTORY_PAGE, include_all_metadata=True, cursor=cursor, **kwargs)
            for message in resp.get("messages") or []:
                meta = message.get("metadata") or {}
                if meta.get("event_type") == event_type and (meta.get("event_payload") or {}).get(field) == value \
                        and (not bot_id or message.get("bot_id") == bot_id):
                    return dict(message)
            cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                return None
        raise ChatUnavailable(f"{method}: more than {HISTORY_PAGE * HISTORY_PAGES} messages to read; "
                              "cannot tell whether it was sent")

    def _bot_id(self) -> str:
        """This bot's bot_id (auth.test, asked once): only its own messages count as posted."""
        if self._bot is None:
            self._bot = str(self.call("auth.test", self.client.auth_test).get("bot_id") or "")
        return self._bot

    def find_details(self, message: MessageRef, incident_name: str) -> bool:
        """The bot's own details reply for `incident_name` in the thread of `message` (as find_reply)."""
        return self._own_message("conversations.replies", self.client.conversations_replies, DETAILS_EVENT_TYPE,
                                 "incident", incident_name, channel=message.channel, ts=message.message_id) is not None

    def update_incident(self, incident: Incident, message: MessageRef) -> None:
        text, blocks = incident_message(incident, self.redactor)
        self.call("chat.update", self.client.chat_update, channel=message.channel, ts=message.message_id,
                  text=text, blocks=blocks)

    def reply(self, thread: MessageRef, note: Note) -> None:
        text, blocks = note_message(note, self.redactor)
        metadata = {"event_type": NOTE_EVENT_TYPE, "event_payload": {"key": note.key}} if note.key else None
        self.call("chat.postMessage", self.client.chat_postMessage, channel=thread.channel, thread_ts=thread.message_id,
                  text=text, blocks=blocks, unfurl_links=False, unfurl_media=False, metadata=metadata)

    def find_reply(self, thread: MessageRef, key: str) -> bool:
        """The bot's own reply with `key` in the thread of `thread` (conversations.replies: the same
        history scopes as find_posted, the same bound)."""
        return self._own_message("conversations.replies", self.client.conversations_replies, NOTE_EVENT_TYPE,
                                 "key", key, channel=thread.channel, ts=thread.message_id) is not None

    def tell_user(self, channel: str, user: str, note: Note) -> None:
        self.call("chat.postEphemeral", self.client.chat_postEphemeral, channel=channel, user=user,
                  text=note_text(note, self.redactor))

    def permalink(self, message: MessageRef) -> str | None:
        resp = self.call("chat.getPermalink", self.client.chat_getPermalink, channel=message.channel,
                         message_ts=message.message_id)
        return str(resp.get("permalink") or "") or None

    def group_members(self, group_id: str) -> set[str]:
        resp = self.call("usergroups.users.list", self.client.usergroups_users_list, usergroup=group_id)
        return set(resp.get("users") or [])

    def user_name(self, user_id: str) -> str | None:
        resp = self.call("users.info", self.client.users_info, user=user_id)
        user = resp.get("user") or {}
        return user.get("name") or user.get("real_name") or None

    def actor(self, user_id: str) -> str:
        return audit_actor(user_id, self.user_name)

    def check(self) -> str:
        """For /readyz: Slack answers and the token is valid. Returns the bot's user id."""
        resp = self.call("auth.test", self.client.auth_test)
        return str(resp.get("user_id", ""))
