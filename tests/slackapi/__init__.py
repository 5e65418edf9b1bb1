"""A local HTTP server that speaks Slack's Web API wire format, for tests and benchmarks.

Like bolt-python's tests/mock_web_api_server: the bot's real WebClient talks to it over HTTP,
and every call is recorded so a test can assert what was posted, updated or told to whom.
Faults are injected at the wire: `fail_next("chat.postMessage", status=429, retry_after=1)`
answers the next call with a 429 and a Retry-After header, `down = True` answers 503 to all.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlparse


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    headers: dict[str, str]
    status: int
    ok: bool  # what Slack answered: HTTP 200 and "ok": true
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    status: int
    error: str
    retry_after: float | None
    times: int


class SlackStandIn:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.group_members: dict[str, list[str]] = {}
        self.down = False
        self._faults: dict[str, list[Fault]] = {}
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ---- control ------------------------------------------------------------------------

    def start(self) -> SlackStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between headers and body

            def do_POST(self) -> None:
                standin._handle(self)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/"

    def fail_next(self, method: str, status: int = 429, error: str = "ratelimited",
                  retry_after: float | None = 0, times: int = 1) -> None:
        with self._lock:
            self._faults.setdefault(method, []).append(Fault(status, error, retry_after, times))

    def delivered(self, method: str) -> list[Call]:
        """Calls of `method` that Slack accepted (HTTP 200 and ok: true)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and c.ok]

    def attempts(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10) -> bool:
        """Poll until `predicate()` holds (the bot works in background threads)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def posts(self) -> list[Call]:
        """Top-level messages (not thread replies) that were posted."""
        return [c for c in self.delivered("chat.postMessage") if not c.params.get("thread_ts")]

    def replies(self) -> list[Call]:
        return [c for c in self.delivered("chat.postMessage") if c.params.get("thread_ts")]

    # ---- the wire -----------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        parsed = urlparse(req.path)
        method = parsed.path.rsplit("/", 1)[-1]
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        params: dict[str, Any] = dict(parse_qsl(parsed.query))
        ctype = req.headers.get("Content-Type", "")
        if raw and "json" in ctype:
            params.update(json.loads(raw))
        elif raw:
            params.update(dict(parse_qsl(raw.decode())))
        for key in ("blocks", "attachments"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        status, body, headers = self._answer(method, params, req.headers.get("Authorization", ""))
        with self._lock:
            self.calls.append(Call(method, params, dict(req.headers.items()), status,
                                   ok=status == 200 and bool(body.get("ok"))))
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json; charset=utf-8")
        req.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(data)

    def _answer(self, method: str, params: dict[str, Any], auth: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            if self.down:
                return 503, {"ok": False, "error": "service_unavailable"}, {}
            faults = self._faults.get(method) or []
            if faults:
                fault = faults[0]
                fault.times -= 1
                if fault.times <= 0:
                    faults.pop(0)
                headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
                return fault.status, {"ok": False, "error": fault.error}, headers
            ts = f"{1700000000 + next(self._ts)}.000100"
        if not auth.startswith("Bearer xox"):
            return 200, {"ok": False, "error": "not_authed"}, {}
        if method == "chat.postMessage":
            return 200, {"ok": True, "channel": params.get("channel"), "ts": ts,
                         "message": {"text": params.get("text"), "ts": ts}}, {}
        if method == "chat.update":
            return 200, {"ok": True, "channel": params.get("channel"), "ts": params.get("ts"),
                         "text": params.get("text")}, {}
        if method == "chat.postEphemeral":
            return 200, {"ok": True, "message_ts": ts}, {}
        if method == "users.info":
            user = params.get("user", "U0")
            return 200, {"ok": True, "user": {"id": user, "name": f"user-{user.lower()}"}}, {}
        if method == "usergroups.users.list":
            group = params.get("usergroup", "")
            if group not in self.group_members:
                return 200, {"ok": False, "error": "no_such_subteam"}, {}
            return 200, {"ok": True, "users": self.group_members[group]}, {}
        if method == "auth.test":
            return 200, {"ok": True, "url": "https://standin.slack.local/", "team": "Stand-in", "user": "vllm-oncall",
                         "team_id": "T0STANDIN", "user_id": "U0BOT", "bot_id": "B0BOT"}, {}
        if method == "views.open":
            return 200, {"ok": True, "view": {"id": "V0VIEW", "type": "modal"}}, {}
        return 200, {"ok": False, "error": "unknown_method"}, {}
