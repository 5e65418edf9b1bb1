"""The HTTP side of `vllm-oncall serve`: /alerts, /healthz, /readyz, /metrics, /slack/events.

/alerts answers Alertmanager at once and hands the work to a bounded pool: a webhook that
waited for a diagnosis would time out and be re-sent. When the queue is full the whole batch
gets 503, which Alertmanager retries, instead of silently dropping part of it.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Literal
from urllib.parse import urlparse

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from bot.app.records import AlertTarget
from bot.app.metrics import Metrics
from bot.app.service import OncallService

log = logging.getLogger(__name__)
MAX_BODY = 4 * 1024 * 1024


# ---- Alertmanager webhook payload, version 4 ------------------------------------------------


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str | None = None
    endsAt: str | None = None
    generatorURL: str | None = None
    fingerprint: str | None = None


class WebhookPayload(BaseModel):
    """The envelope. Alerts are validated one by one (see AlertIntake) so one odd alert is
    reported and skipped while the others in the batch are still handled."""

    model_config = ConfigDict(extra="allow")
    version: str
    status: Literal["firing", "resolved"]
    receiver: str = ""
    alerts: list[dict[str, Any]]
    groupKey: str | None = None
    truncatedAlerts: int = 0


def one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "payload"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


# ---- bounded background work ----------------------------------------------------------------


class BoundedExecutor:
    """A thread pool with a bounded queue: submit_all() takes room for a whole batch or none."""

    def __init__(self, workers: int, queue_size: int, name: str = "alert"):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.slots = threading.BoundedSemaphore(workers + queue_size)
        self.idle = threading.Condition()
        self.pending = 0

    def submit_all(self, jobs: list[Callable[[], Any]]) -> bool:
        taken = 0
        for _ in jobs:
            if not self.slots.acquire(blocking=False):
                for _ in range(taken):
                    self.slots.release()
                return False
            taken += 1
        with self.idle:
            self.pending += len(jobs)
        for job in jobs:
            self.pool.submit(self._run, job)
        return True

    def _run(self, job: Callable[[], Any]) -> None:
        try:
            job()
        except Exception:
            log.exception("background job failed")
        finally:
            self.slots.release()
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class InlineExecutor:
    """Runs each job at once in the caller: the demo wants its output in order."""

    def submit_all(self, jobs: list[Callable[[], Any]]) -> bool:
        for job in jobs:
            job()
        return True


# ---- /alerts ------------------------------------------------------------------------------


class AlertIntake:
    """Parse, authenticate and validate a webhook call; queue one job per matching alert."""

    def __init__(self, service: OncallService, executor: BoundedExecutor | InlineExecutor,
                 alertnames: tuple[str, ...] | list[str] = ("KubePodCrashLooping",), token: str | None = None):
        self.service = service
        self.executor = executor
        self.alertnames = set(alertnames)
        self.token = token
        self.metrics: Metrics = service.metrics

    def receive(self, body: bytes, authorization: str | None) -> tuple[int, dict[str, Any]]:
        received_at = time.monotonic()
        if self.token is not None:
            expected = f"Bearer {self.token}".encode()
            if not hmac.compare_digest((authorization or "").encode(), expected):
                return 401, {"error": "missing or wrong bearer token"}
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return 400, {"error": f"malformed JSON: {exc}"}
        try:
            payload = WebhookPayload.model_validate(doc)
        except ValidationError as exc:
            return 400, {"error": f"not an Alertmanager webhook payload: {one_line(exc)}"}
        if payload.version != "4":
            log.warning("Alertmanager webhook version %s (expected 4); reading it as 4", payload.version)
        if payload.truncatedAlerts:
            log.warning("Alertmanager left out %d alert(s) of group %s (its max_alerts); they arrive with "
                        "the next notification", payload.truncatedAlerts, payload.groupKey)
        jobs, skipped = [], []
        for index, raw in enumerate(payload.alerts):
            target, reason = self._target(raw, received_at)
            if target is None:
                skipped.append({"index": index, "reason": reason})
                self.metrics.alerts_skipped.labels(reason.split(":")[0]).inc()
                continue
            jobs.append(lambda t=target: self.service.handle_alert(t))
        if jobs and not self.executor.submit_all(jobs):
            return 503, {"error": f"busy: no room for {len(jobs)} alert(s); retry later"}
        return 200, {"accepted": len(jobs), "skipped": skipped}

    def _target(self, raw: dict[str, Any], received_at: float) -> tuple[AlertTarget | None, str]:
        try:
            alert = WebhookAlert.model_validate(raw)
        except ValidationError as exc:
            return None, f"invalid alert: {one_line(exc)}"
        name = alert.labels.get("alertname", "")
        if name not in self.alertnames:
            return None, f"ignored alertname: {name or '(none)'}"
        missing = [k for k in ("namespace", "pod") if not alert.labels.get(k)]
        if missing:
            return None, f"missing label: {', '.join(missing)}"
        return AlertTarget(namespace=alert.labels["namespace"], pod=alert.labels["pod"],
                           container=alert.labels.get("container") or None,
                           firing=alert.status == "firing", received_at=received_at), ""


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
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def start(self) -> "BotServer":
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
        server = self

        class Handler(BaseHTTPRequestHandler):
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

            def do_GET(self) -> None:  # noqa: N802
                path = urlparse(self.path).path
                if path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    r = server.readiness
                    if r.ready:
                        self._send(200, b"ready\n", "text/plain")
                    else:
                        waiting = ", ".join(f"{n} ({r.errors.get(n, 'not checked yet')})"
                                            for n in r.checks if n not in r.passed)
                        self._send(503, f"not ready: waiting for {waiting}\n".encode(), "text/plain")
                elif path == "/metrics":
                    self._send(200, generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST)
                else:
                    self._json(404, {"error": f"no such path: {path}"})

            def do_POST(self) -> None:  # noqa: N802
                parsed = urlparse(self.path)
                body = self._body()
                if body is None:
                    return
                if parsed.path == "/alerts":
                    status, doc = server.intake.receive(body, self.headers.get("Authorization"))
                    if status != 200:
                        log.warning("/alerts answered %d: %s", status, doc.get("error"))
                    self._json(status, doc)
                elif parsed.path == "/slack/events" and server.bolt_app is not None:
                    from slack_bolt.request import BoltRequest

                    headers = {k.lower(): [v] for k, v in self.headers.items()}
                    response = server.bolt_app.dispatch(BoltRequest(body=body.decode("utf-8"), query=parsed.query,
                                                                    headers=headers))
                    content_type = (response.headers.get("content-type") or ["application/json"])[0]
                    extra = {k: v for k, v in response.headers.items() if k.lower() not in ("content-type",
                                                                                              "content-length")}
                    self._send(response.status, (response.body or "").encode(), content_type, extra)
                else:
                    self._json(404, {"error": f"no such path: {parsed.path}"})

        return Handler
