"""A local stand-in for an OpenAI-compatible endpoint, for the wired commentator's tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OpenAIStandIn:
    """Answers POST /v1/chat/completions in OpenAI's wire format after `delay` seconds and
    records every request body (what the bot sent the model)."""

    def __init__(self, reply: str = "", delay: float = 0.0, raw: bytes | None = None):
        self.reply, self.delay, self.raw = reply, delay, raw
        self.requests: list[dict[str, Any]] = []
        self.bodies: list[str] = []
        self.arrived: list[float] = []  # time.monotonic() of each request
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                text = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
                outer.arrived.append(time.monotonic())
                outer.bodies.append(text)
                body = json.loads(text)
                outer.requests.append(body)
                outer._stop.wait(outer.delay)  # a slow endpoint; released at close()
                data = outer.raw if outer.raw is not None else json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": outer.reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (its timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


def wait_until(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
