"""A local HTTP server that speaks Slack's Web API wire format, for tests and benchmarks.

Like bolt-python's tests/mock_web_api_server: the bot's real WebClient talks to it over HTTP,
and every call is recorded so a test can assert what was posted, updated or told to whom.
Faults are injected at the wire: `fail_next("chat.postMessage", status=429, retry_after=1)`
answers the next call with a 429 and a Retry-After header, `down = True` answers 503 to all.
Faults after the call took effect, like a real Slack that posted and then failed to say so:
`fail_next(..., status=500, after_commit=True)` posts, then answers 500; `drop=True` posts, then
closes the connection without an answer; `slow_next("chat.postMessage", 2)` posts, then answers
after 2 s (a client with a shorter timeout has given up by then); `chaos = Chaos(0.3, seed=1)`
injects a random mix of these into a share of the calls.

Top-level posts are kept per channel (`messages`) with their metadata, and `conversations.history`
serves them like Slack: newest first, `oldest`/`latest` bounds, `limit` and cursor pages
(`response_metadata.next_cursor`), metadata only with `include_all_metadata`.

With `rate` set (a RateLimit on an injected clock, e.g. a VirtualClock the bot's pacing waits on
too), it enforces Slack's posting rate: about one chat.postMessage per second per channel and
about 50 chat.update a minute, answering 429 with a Retry-After (whole seconds, as Slack sends it)
and recording each (`rate.limited`) and every call that came back before its Retry-After had run
out (`rate.early`).

With `socket_mode` set (a slackapi.socketmode.SocketModeStandIn), `apps.connections.open` answers
an xapp- token with a one-use ws:// URL of it, as Slack does for Socket Mode apps.
"""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlparse

from standin_http import QuietHandler, StandInServer, bound


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    headers: dict[str, str]
    status: int
    ok: bool  # what Slack answered: HTTP 200 and "ok": true
    at: float = field(default_factory=time.monotonic)


    committed: bool = False  # the call took effect (a post exists), whatever the answer said
    delay: float = 0.0  # answered only after this many seconds (a client may have given up)


@dataclass
class Fault:
    status: int
    error: str
    retry_after: float | None
    times: int
    after_commit: bool = False  # take effect first, then answer the fault
    drop: bool = False  # (after commit) close the connection without an answer
    delay: float = 0.0  # (after commit) answer normally, but only after this many seconds


FAULT_KINDS = ("before", "after", "drop", "slow")


class Chaos:
    """A seeded share of calls to `methods` fails: before the call took effect (503), after it
    (500, or the connection dropped), or answered after `slow` seconds. `injected` lists them."""

    def __init__(self, rate: float, seed: int = 0, methods: frozenset[str] = frozenset({"chat.postMessage"}),
                 kinds: tuple[str, ...] = FAULT_KINDS, slow: float = 1.5):
        self.rate, self.methods, self.kinds, self.slow = rate, methods, kinds, slow
        self.random = random.Random(seed)
        self.injected: list[tuple[str, str]] = []  # (method, kind)

    def pick(self, method: str) -> Fault | None:
        if method not in self.methods or self.random.random() >= self.rate:
            return None
        kind = self.random.choice(self.kinds)
        self.injected.append((method, kind))
        if kind == "before":
            return Fault(503, "service_unavailable", None, 1)
        return Fault(500, "internal_error", None, 1, after_commit=True, drop=kind == "drop",
                     delay=self.slow if kind == "slow" else 0.0)


class VirtualClock:
    """Seconds that pass only when someone sleeps on it: each sleep adds its length. Shared by the
    bot's chat pacing and the stand-in's rate limit, so a storm paced at one post a second is
    checked without waiting for it."""

    def __init__(self, start: float = 1000.0):
        self._t, self._lock = start, threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._t += max(0.0, seconds)


@dataclass
class Limited:
    method: str
    channel: str
    at: float
    retry_after: int


class RateLimit:
    """Slack's posting rate, on `clock`: chat.postMessage per channel every `post_interval`
    seconds, at most `updates_per_minute` chat.update in any 60 s."""

    def __init__(self, clock: Callable[[], float], post_interval: float = 1.0, updates_per_minute: int = 50):
        self.clock, self.post_interval, self.updates_per_minute = clock, post_interval, updates_per_minute
        self.limited: list[Limited] = []  # every 429 answered
        self.early: list[tuple[str, str, float]] = []  # calls made before their Retry-After ran out
        self._last_post: dict[str, float] = {}
        self._updates: deque[float] = deque()
        self._blocked: dict[tuple[str, str], float] = {}  # (method, channel) -> Retry-After's end

    def check(self, method: str, channel: str) -> int | None:
        """None: the call may go ahead (and counts); else the Retry-After to answer with."""
        now = self.clock()
        until = self._blocked.get((method, channel))
        if until is not None and now < until:
            self.early.append((method, channel, now))
        wait = self._wait(method, channel, now)
        if wait is None:
            return None
        retry_after = max(1, math.ceil(wait))
        self.limited.append(Limited(method, channel, now, retry_after))
        self._blocked[(method, channel)] = now + retry_after
        return retry_after

    def _wait(self, method: str, channel: str, now: float) -> float | None:
        if method == "chat.postMessage":
            last = self._last_post.get(channel)
            if last is not None and now - last < self.post_interval:
                return self.post_interval - (now - last)
            self._last_post[channel] = now
            return None
        if method == "chat.update":
            while self._updates and self._updates[0] <= now - 60:
                self._updates.popleft()
            if len(self._updates) >= self.updates_per_minute:
                return self._updates[0] + 60 - now
            self._updates.append(now)
        return None


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    committed: bool = False
    drop: bool = False
    delay: float = 0.0


class SlackStandIn:
    BOT_USER, BOT_ID = "U0BOT", "B0BOT"  # who auth.test says the token is, and who posts

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.group_members: dict[str, list[str]] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}  # channel -> top-level posts, oldest first
        self.threads: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (channel, parent ts) -> replies
        self.down = False
        # What Slack sends in every answer's x-oauth-scopes header; channels the bot was not invited
        # to (conversations.info is_member false, chat.postMessage not_in_channel); revoked tokens.
        self.scopes = ["chat:write", "commands", "channels:history", "groups:history", "users:read",
                       "usergroups:read", "channels:read", "groups:read"]
        self.not_member: set[str] = set()
        self.revoked: set[str] = set()
        self.socket_mode: Any = None  # a SocketModeStandIn: apps.connections.open hands out its URLs
        self.chaos: Chaos | None = None
        self.rate: RateLimit | None = None
        self._faults: dict[str, list[Fault]] = {}
        self._last_ts = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition()  # notified on every call received
        self._stopped = threading.Event()
        self._server: StandInServer | None = None
        # Connections, as Slack keeps them: HTTP/1.1, kept alive until the client closes one (or
        # the stand-in stops: then every open one is closed, so a stopped Slack answers nothing).
        self.connections = 0  # opened so far
        self._open: set[Any] = set()

    # ---- control ------------------------------------------------------------------------

    def start(self) -> SlackStandIn:
        standin = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with standin._lock:
                    standin.connections += 1
                    standin._open.add(self.connection)

            def finish(self) -> None:
                with standin._lock:
                    standin._open.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                standin._handle(self)

            do_GET = do_POST

        self._server = StandInServer(Handler, name="slack-web-api").start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server:
            self._server.stop()
        self.close_connections()  # a kept-alive client must not reach a stopped Slack

    def close_connections(self) -> None:
        """Close every open connection from this side, as a server ends idle kept-alive ones."""
        with self._lock:
            open_connections, self._open = list(self._open), set()
        for conn in open_connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"{self._server.url}/api/"

    def fail_next(self, method: str, status: int = 429, error: str = "ratelimited",
                  retry_after: float | None = 0, times: int = 1, after_commit: bool = False,
                  drop: bool = False) -> None:
        with self._lock:
            self._faults.setdefault(method, []).append(Fault(status, error, retry_after, times,
                                                             after_commit=after_commit or drop, drop=drop))

    def slow_next(self, method: str, seconds: float, times: int = 1) -> None:
        """The next call takes effect at once but is answered only after `seconds`."""
        with self._lock:
            self._faults.setdefault(method, []).append(Fault(200, "", None, times, after_commit=True,
                                                             delay=seconds))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def channel_messages(self, channel: str) -> list[dict[str, Any]]:
        """The top-level messages that exist in `channel` (whatever the bot was answered)."""
        with self._lock:
            return list(self.messages.get(channel, []))

    def delivered(self, method: str) -> list[Call]:
        """Calls of `method` that Slack accepted (HTTP 200 and ok: true)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and c.ok]

    def attempts(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60) -> bool:
        """Wait until `predicate()` holds (the bot works in background threads): looked at again on
        every call Slack receives, and every 50 ms for state elsewhere. `timeout` only bounds a failure
        (stretched to standin_http.FAILURE_BOUND)."""
        deadline = time.monotonic() + bound(timeout)
        while not predicate():  # outside the lock: a predicate may itself call this stand-in
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._changed:
                self._changed.wait(min(left, 0.05))
        return True

    def posts(self) -> list[Call]:
        """Top-level messages (not thread replies) that were posted."""
        return [c for c in self.delivered("chat.postMessage") if not c.params.get("thread_ts")]

    def replies(self) -> list[Call]:
        """Thread replies that say what happened (notes), not the details posted with a message."""
        return [c for c in self.delivered("chat.postMessage") if c.params.get("thread_ts") and not is_details(c)]

    def details(self) -> list[Call]:
        """The details (memory picture, budget, command lines, evidence) posted in a message's thread."""
        return [c for c in self.delivered("chat.postMessage") if is_details(c)]

    # ---- the wire -----------------------------------------------------------------------

    def _handle(self, req: QuietHandler) -> None:
        parsed = urlparse(req.path)
        method = parsed.path.rsplit("/", 1)[-1]
        raw = req.body()
        params: dict[str, Any] = dict(parse_qsl(parsed.query))
        ctype = req.headers.get("Content-Type", "")
        if raw and "json" in ctype:
            params.update(json.loads(raw))
        elif raw:
            params.update(dict(parse_qsl(raw.decode())))
        for key in ("blocks", "attachments", "metadata"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        answer = self._answer(method, params, req.headers.get("Authorization", ""))
        with self._lock:
            self.calls.append(Call(method, params, dict(req.headers.items()), answer.status,
                                   ok=answer.status == 200 and bool(answer.body.get("ok")) and not answer.drop,
                                   committed=answer.committed, delay=answer.delay))
        with self._changed:
            self._changed.notify_all()
        if answer.drop:
            req.close_connection = True  # the client sees the connection closed without an answer
            return
        if answer.delay:
            self._stopped.wait(answer.delay)  # a slow answer; given at once when the stand-in stops
        # a client that gave up waiting (a slow answer) is not an error: as with Slack, the call stands
        req.reply(answer.status, json.dumps(answer.body).encode(), "application/json; charset=utf-8", answer.headers)

    def _answer(self, method: str, params: dict[str, Any], auth: str) -> Answer:
        with self._lock:
            if self.down:
                return Answer(503, {"ok": False, "error": "service_unavailable"})
            fault = self._take_fault(method)
        if fault is not None and not fault.after_commit:
            headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
            return Answer(fault.status, {"ok": False, "error": fault.error}, headers)
        if method == "apps.connections.open":
            return self._connections_open(auth)
        if not auth.startswith("Bearer xox"):
            return Answer(200, {"ok": False, "error": "not_authed"})
        if auth.removeprefix("Bearer ") in self.revoked:
            return Answer(200, {"ok": False, "error": "invalid_auth"})
        if self.rate is not None and method in ("chat.postMessage", "chat.update"):
            with self._lock:
                retry_after = self.rate.check(method, str(params.get("channel") or ""))
            if retry_after is not None:
                return Answer(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after)})
        status, body = self._effect(method, params)
        answer = Answer(status, body, {"x-oauth-scopes": ",".join(self.scopes)},
                        committed=status == 200 and bool(body.get("ok")))
        if fault is not None:  # after commit
            answer.drop, answer.delay = fault.drop, fault.delay
            if not fault.delay:
                answer.status, answer.body = fault.status, {"ok": False, "error": fault.error}
        return answer

    def _take_fault(self, method: str) -> Fault | None:
        faults = self._faults.get(method) or []
        if faults:
            fault = faults[0]
            fault.times -= 1
            if fault.times <= 0:
                faults.pop(0)
            return fault
        return self.chaos.pick(method) if self.chaos is not None else None

    def _next_ts(self) -> str:
        """Like Slack's: the post's time (seconds.microseconds), unique and increasing per workspace."""
        with self._lock:
            self._last_ts = max(time.time(), self._last_ts + 0.000001)
            return f"{self._last_ts:.6f}"

    def _post(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        channel = str(params.get("channel") or "")
        ts = self._next_ts()
        message = {"type": "message", "ts": ts, "user": self.BOT_USER, "bot_id": self.BOT_ID,
                   "text": params.get("text"), "blocks": params.get("blocks")}
        if params.get("metadata"):
            message["metadata"] = params["metadata"]
        with self._lock:
            if params.get("thread_ts"):  # a thread reply: kept under its parent, as conversations.replies reads it
                self.threads.setdefault((channel, str(params["thread_ts"])), []).append(
                    {**message, "thread_ts": str(params["thread_ts"])})
            else:
                self.messages.setdefault(channel, []).append(message)
        return 200, {"ok": True, "channel": channel, "ts": ts,
                     "message": {k: v for k, v in message.items() if k != "metadata"}}

    def _history(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        channel = str(params.get("channel") or "")
        if channel[:1] not in ("C", "G", "D"):
            return 200, {"ok": False, "error": "channel_not_found"}  # a #name is not an ID
        oldest, latest = float(params.get("oldest") or 0), float(params.get("latest") or "inf")
        limit = max(1, min(int(params.get("limit") or 100), 999))
        offset = int(str(params.get("cursor") or "offset_0").removeprefix("offset_"))
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        with self._lock:
            window = [m for m in reversed(self.messages.get(channel, [])) if oldest < float(m["ts"]) < latest]
        page = window[offset:offset + limit]
        more = offset + limit < len(window)
        messages = [m if with_metadata else {k: v for k, v in m.items() if k != "metadata"} for m in page]
        return 200, {"ok": True, "messages": messages, "has_more": more,
                     "response_metadata": {"next_cursor": f"offset_{offset + limit}" if more else ""}}

    def _replies(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """conversations.replies: the parent first, then its replies oldest first, paged by cursor."""
        channel, ts = str(params.get("channel") or ""), str(params.get("ts") or "")
        with self._lock:
            parent = next((m for m in self.messages.get(channel, []) if m["ts"] == ts), None)
            replies = list(self.threads.get((channel, ts), []))
        if parent is None:
            return 200, {"ok": False, "error": "thread_not_found"}
        limit = max(1, min(int(params.get("limit") or 100), 999))
        offset = int(str(params.get("cursor") or "offset_0").removeprefix("offset_"))
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        window = [parent, *replies]
        page, more = window[offset:offset + limit], offset + limit < len(window)
        messages = [m if with_metadata else {k: v for k, v in m.items() if k != "metadata"} for m in page]
        return 200, {"ok": True, "messages": messages, "has_more": more,
                     "response_metadata": {"next_cursor": f"offset_{offset + limit}" if more else ""}}

    def _effect(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "conversations.info":
            channel = str(params.get("channel") or "")
            return 200, {"ok": True, "channel": {"id": channel, "name": f"name-of-{channel.lower()}",
                                                 "is_member": channel not in self.not_member}}
        if method in ("chat.postMessage", "chat.update") and str(params.get("channel")) in self.not_member:
            return 200, {"ok": False, "error": "not_in_channel"}
        if method == "chat.postMessage":
            return self._post(params)
        if method == "conversations.history":
            return self._history(params)
        if method == "conversations.replies":
            return self._replies(params)
        if method == "chat.update":
            return 200, {"ok": True, "channel": params.get("channel"), "ts": params.get("ts"),
                         "text": params.get("text")}
        if method == "chat.getPermalink":  # Slack: https://<team>.slack.com/archives/<channel>/p<ts without the dot>
            channel, ts = str(params.get("channel") or ""), str(params.get("message_ts") or "")
            with self._lock:
                known = any(m["ts"] == ts for m in self.messages.get(channel, []))
            if not known:
                return 200, {"ok": False, "error": "message_not_found"}
            return 200, {"ok": True, "channel": channel,
                         "permalink": f"https://standin.slack.local/archives/{channel}/p{ts.replace('.', '')}"}
        if method == "chat.postEphemeral":
            return 200, {"ok": True, "message_ts": self._next_ts()}
        if method == "users.info":
            user = params.get("user", "U0")
            return 200, {"ok": True, "user": {"id": user, "name": f"user-{user.lower()}"}}
        if method == "usergroups.users.list":
            group = params.get("usergroup", "")
            if group not in self.group_members:
                return 200, {"ok": False, "error": "no_such_subteam"}
            return 200, {"ok": True, "users": self.group_members[group]}
        if method == "auth.test":
            return 200, {"ok": True, "url": "https://standin.slack.local/", "team": "Stand-in", "user": "vllm-oncall",
                         "team_id": "T0STANDIN", "user_id": self.BOT_USER, "bot_id": self.BOT_ID}
        if method == "views.open":
            return 200, {"ok": True, "view": {"id": "V0VIEW", "type": "modal"}}
        return 200, {"ok": False, "error": "unknown_method"}

    def _connections_open(self, auth: str) -> Answer:
        """Socket Mode: only an app-level token may open a connection (Slack: not_allowed_token_type)."""
        token = auth.removeprefix("Bearer ")
        if not auth.startswith("Bearer ") or not token:
            return Answer(200, {"ok": False, "error": "not_authed"})
        if not token.startswith("xapp-"):
            return Answer(200, {"ok": False, "error": "not_allowed_token_type"})
        if self.socket_mode is None:
            return Answer(200, {"ok": False, "error": "socket_mode_not_enabled"})
        return Answer(200, {"ok": True, "url": self.socket_mode.open_url(token)})


def is_details(call: Call) -> bool:
    """The bot's details reply: a thread reply whose metadata says so (bot.slack.chat.DETAILS_EVENT_TYPE)."""
    meta = call.params.get("metadata") or {}
    return bool(call.params.get("thread_ts")) and isinstance(meta, dict) \
        and meta.get("event_type") == "vllm_oncall_details"
