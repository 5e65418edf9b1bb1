"""A local stand-in for an OpenAI-compatible endpoint, for the LLM wording and the wired commentator's tests."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from standin_http import QuietHandler, StandInServer, bound


class OpenAIStandIn:
    """Answers POST /v1/chat/completions in OpenAI's wire format (HTTP `status`) after `delay`
    seconds and records every request: its path, its body (what the bot sent the model), when it came."""

    def __init__(self, reply: str = "", delay: float = 0.0, raw: bytes | None = None, status: int = 200):
        self.reply, self.delay, self.raw, self.status = reply, delay, raw, status
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.bodies: list[str] = []
        self.arrived: list[float] = []  # time.monotonic() of each request
        self._stop = threading.Event()
        self._changed = threading.Condition()  # notified on each request
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                text = self.body().decode("utf-8", "replace")
                body = json.loads(text)
                with outer._changed:
                    outer.arrived.append(time.monotonic())
                    outer.paths.append(self.path)
                    outer.bodies.append(text)
                    outer.requests.append(body)
                    outer._changed.notify_all()
                outer._stop.wait(outer.delay)  # a slow endpoint; released at close()
                data = outer.raw if outer.raw is not None else json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": outer.reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.reply(outer.status, data)  # a client that gave up (its timeout) is not an error

        self.server = StandInServer(Handler, name="openai-stand-in").start()
        self.url = f"{self.server.url}/v1"

    def wait_for_requests(self, count: int, timeout: float = 60) -> bool:
        """Whether `count` requests have come within `timeout` (as written: also a short look for one too many)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.requests) >= count, timeout)

    def close(self) -> None:
        self._stop.set()
        self.server.stop()


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    """Poll until `predicate()` holds; `timeout` only bounds a failure (standin_http.bound)."""
    deadline = time.monotonic() + bound(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
