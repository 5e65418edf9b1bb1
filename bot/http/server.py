"""The HTTP side of `vllm-oncall serve`: /alerts (see alerts.py), /healthz, /readyz, /metrics,
/slack/events (the Bolt app), the sweeper loop and readiness checks."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot.app.service import OncallService
from bot.http.alerts import AlertIntake
from bot.http.executor import BoundedExecutor

log = logging.getLogger(__name__)
MAX_BODY = 4 * 1024 * 1024


# ---- readiness ----------------------------------------------------------------------------


class Readiness:
    """Ready once every check (Slack answers, the Kubernetes API answers) has passed once."""

    def __init__(self, checks: dict[str, Callable[[], Any]], interval: float = 2.0):
        self.checks = dict(checks)
        self.passed: set[str] = set()
        self.errors: dict[str, str] = {}
        self.interval = interval
        self._stop = threading.Event()

    @property
    def ready(self) -> bool:
        return self.passed >= set(self.checks)

    def run_once(self) -> None:
        for name, check in self.checks.items():
            if name in self.passed:
                continue
            try:
                check()
            except Exception as exc:
                self.errors[name] = f"{type(exc).__name__}: {exc}"[:200]
            else:
                self.passed.add(name)
                self.errors.pop(name, None)

    def loop(self) -> None:
        while not self._stop.is_set() and not self.ready:
            self.run_once()
            self._stop.wait(self.interval)

    def request_stop(self) -> None:
        """From a signal handler: serve_forever() returns and shuts down cleanly."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()


# ---- the server ---------------------------------------------------------------------------


class BotServer:
    def __init__(self, service: OncallService, *, alert_token: str | None = None,
                 alertnames: tuple[str, ...] | list[str] = ("KubePodCrashLooping",), workers: int = 4,
                 queue_size: int = 100, bolt_app: Any = None, readiness_checks: dict[str, Callable[[], Any]] | None = None,
                 host: str = "127.0.0.1", port: int = 0, sweep_interval: float = 30):
        self.service = service
        self.metrics = service.metrics
        self.executor = BoundedExecutor(workers, queue_size)
        # Rollout verification can take many minutes: keep it off the alert workers.
        self.followups = ThreadPoolExecutor(max_workers=2, thread_name_prefix="followup")
        service.run_later = self.followups.submit
        self.intake = AlertIntake(service, self.executor, alertnames, alert_token)
        self.bolt_app = bolt_app
        self.readiness = Readiness(readiness_checks or {})
        self.sweep_interval = sweep_interval
        self._stop = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def start(self) -> BotServer:
        for target, name in ((self.httpd.serve_forever, "http"), (self.readiness.loop, "readiness"),
                             (self._sweep_loop, "sweeper")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        self.start()
        try:
            while not self._stop.wait(1):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def request_stop(self) -> None:
        """From a signal handler: serve_forever() returns and shuts down cleanly."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self.readiness.stop()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.executor.shutdown()
        self.followups.shutdown(wait=False, cancel_futures=True)

    def _sweep_loop(self) -> None:
        """Post what Slack refused earlier, expire old proposals."""
        while not self._stop.wait(self.sweep_interval):
            try:
                self.service.sweep()
            except Exception:
                log.exception("sweep failed")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (BotRequestHandler,), {"bot_server": self})


class BotRequestHandler(BaseHTTPRequestHandler):
    """One request. `bot_server` is set on a subclass per BotServer (see _handler_class)."""

    bot_server: BotServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the second waits for the
    # client's delayed ACK (~40 ms on Linux) on every response.
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, Any] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, values in (headers or {}).items():
            for value in values if isinstance(values, (list, tuple)) else [values]:
                self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        self._send(status, (json.dumps(doc) + "\n").encode())

    def _body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._json(413, {"error": f"body larger than {MAX_BODY} bytes"})
            return None
        return self.rfile.read(length) if length else b""

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            r = self.bot_server.readiness
            if r.ready:
                self._send(200, b"ready\n", "text/plain")
            else:
                waiting = ", ".join(f"{n} ({r.errors.get(n, 'not checked yet')})"
                                    for n in r.checks if n not in r.passed)
                self._send(503, f"not ready: waiting for {waiting}\n".encode(), "text/plain")
        elif path == "/metrics":
            self._send(200, generate_latest(self.bot_server.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            self._json(404, {"error": f"no such path: {path}"})

    def do_POST(self) -> None:
        parsed = urlparse(self.path)
        body = self._body()
        if body is None:
            return
        if parsed.path == "/alerts":
            status, doc = self.bot_server.intake.receive(body, self.headers.get("Authorization"))
            if status != 200:
                log.warning("/alerts answered %d: %s", status, doc.get("error"))
            self._json(status, doc)
        elif parsed.path == "/slack/events" and self.bot_server.bolt_app is not None:
            self._slack_events(body, parsed.query)
        else:
            self._json(404, {"error": f"no such path: {parsed.path}"})

    def _slack_events(self, body: bytes, query: str) -> None:
        from slack_bolt.request import BoltRequest

        headers: dict[str, str | Sequence[str]] = {k.lower(): [v] for k, v in self.headers.items()}
        response = self.bot_server.bolt_app.dispatch(BoltRequest(body=body.decode("utf-8"), query=query,
                                                                 headers=headers))
        content_type = (response.headers.get("content-type") or ["application/json"])[0]
        extra = {k: v for k, v in response.headers.items() if k.lower() not in ("content-type", "content-length")}
        self._send(response.status, (response.body or "").encode(), content_type, extra)
