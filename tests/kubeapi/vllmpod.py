"""A scripted vLLM pod: a tiny HTTP server answering vLLM's OpenAI-compatible endpoints.

`GET /v1/models` -> {"object": "list", "data": [{"id": <model>, ...}]};
`POST /v1/completions` -> a completion of `max_tokens` tokens with its `usage`.
`mode`: "ok" | "error" (500 with vLLM's error body) | "slow" (sleeps `delay` seconds first).
Every request is recorded in `requests` as (method, path, JSON body or None).
Register it behind the API stand-in's pod proxy with `kube_api.serve_pod(ns, pod, vllm.url)`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from standin_http import QuietHandler, StandInServer


class ScriptedVllm:
    def __init__(self, model: str = "m", mode: str = "ok", delay: float = 0.0):
        self.model, self.mode, self.delay = model, mode, delay
        self.requests: list[tuple[str, str, Any]] = []
        self.server: StandInServer | None = None

    def start(self) -> ScriptedVllm:
        pod = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                raw = self.body()
                code, doc = pod.answer(self.command, self.path.split("?")[0], json.loads(raw) if raw else None)
                self.reply(code, json.dumps(doc).encode())

            do_GET = do_POST = _answer

        self.server = StandInServer(Handler, name="scripted-vllm").start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.stop()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, path, body))
        if self.mode == "slow":
            time.sleep(self.delay)
        if self.mode == "error":
            return 500, {"object": "error", "message": "CUDA error: an illegal memory access was encountered",
                         "type": "InternalServerError", "code": 500}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm",
                                                     "max_model_len": 8192}]}
        if method == "POST" and path == "/v1/completions":
            if not isinstance(body, dict) or body.get("model") != self.model:
                return 404, {"object": "error", "message": f"The model `{(body or {}).get('model')}` does not "
                             f"exist.", "type": "NotFoundError", "code": 404}
            n = int(body.get("max_tokens") or 16)
            return 200, {"id": "cmpl-1", "object": "text_completion", "model": self.model,
                         "choices": [{"index": 0, "text": " ok" * n, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}}
        return 404, {"detail": "Not Found"}
