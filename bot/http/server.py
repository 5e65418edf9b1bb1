"""The HTTP side of `vllm-oncall serve`: /alerts (see alerts.py), /healthz, /readyz, /metrics,
/slack/events (the Bolt app), the sweeper loop and readiness checks.

The server is asyncio streams (stdlib) in one thread: a connection costs a socket, not a thread,
so 500 slow clients cannot starve `/healthz`. Each request is read under the limits of
wire.Limits (head deadline, body idle timeout, sizes, connection cap); only a complete request
reaches a handler thread (a small pool). Every error answer is counted by reason."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot.app.router import ClusterRouter
from bot.app.service import OncallService
from bot.app.work import WorkQueue
from bot.http.alerts import AlertIntake
from bot.http.wire import Closed, Limits, Rejected, Request, printable, read_request, response_bytes, within

log = logging.getLogger(__name__)
HANDLER_THREADS = 8


# ---- readiness ----------------------------------------------------------------------------


DISCARD_SECONDS = 10.0  # how long a refused request's remaining body is read and dropped


class Readiness:
    """Ready once every check (Slack answers, the Kubernetes API answers) has passed once."""

    def __init__(self, checks: dict[str, Callable[[], Any]], interval: float = 2.0,
                 vetoes: dict[str, Callable[[], str | None]] | None = None):
        self.checks = dict(checks)
        # Asked at every /readyz after the checks passed: a reason turns it to 503 (Slack refusing the bot).
        self.vetoes = dict(vetoes or {})
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


class Response:
    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: dict[str, list[str]] | None = None):
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers or {}

    @classmethod
    def json(cls, status: int, doc: dict[str, Any]) -> Response:
        return cls(status, (json.dumps(doc) + "\n").encode())

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode(), "text/plain")


class BotServer:
    def __init__(self, service: OncallService | ClusterRouter, *, work: WorkQueue | None = None,
                 alert_token: str | None = None, alertnames: tuple[str, ...] | list[str] = ("KubePodCrashLooping",),
                 bolt_app: Any = None, readiness_checks: dict[str, Callable[[], Any]] | None = None,
                 host: str = "127.0.0.1", port: int = 0, sweep_interval: float = 30, limits: Limits | None = None,
                 cluster_label: str = "cluster"):
        """`work`: the one work queue (bot.app.work), which `serve` shares with the pod watches;
        None: a queue of its own with serve's defaults (4 workers, 100 work items)."""
        self.router = ClusterRouter.of(service)  # one cluster or several (bot.app.router)
        self.service = self.router.default
        self.metrics = self.router.metrics
        self.limits = limits or Limits()
        # The one work queue: the alerts' and, when `serve` shares it with them, the pod watches'.
        self.executor = work if work is not None else WorkQueue(workers=4, queue_size=100)
        # Rollout verification can take many minutes: keep it off the alert workers.
        self.followups = ThreadPoolExecutor(max_workers=2, thread_name_prefix="followup")
        for each in self.router:
            each.run_later = self.followups.submit
        self.intake = AlertIntake(self.router, self.executor, alertnames, alert_token, cluster_label)
        self.bolt_app = bolt_app
        self.readiness = Readiness(readiness_checks or {})
        self.sweep_interval = sweep_interval
        self.handlers = ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="http")
        self.sock = socket.create_server((host, port), backlog=1024)
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._open: set[asyncio.StreamWriter] = set()
        self._threads: list[threading.Thread] = []
        self.on_stop: list[Callable[[], object]] = []  # e.g. the pod watches, stopped with the server

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '', '::') else host}:{port}"

    def start(self) -> BotServer:
        for target, name in ((self._run_loop, "http"), (self.readiness.loop, "readiness"),
                             (self._sweep_loop, "sweeper")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._ready.wait(10)
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
        """Stop serving and release the port; safe on a server that was never started."""
        self._stop.set()
        self.readiness.stop()
        if self._loop is not None and self._loop_stop is not None:
            self._loop.call_soon_threadsafe(self._loop_stop.set)
            for thread in self._threads:
                if thread.name == "http":
                    thread.join(10)
        self.sock.close()
        for stop in self.on_stop:
            stop()
        self.executor.shutdown()
        self.handlers.shutdown(wait=False, cancel_futures=True)
        self.followups.shutdown(wait=False, cancel_futures=True)

    def _sweep_loop(self) -> None:
        """Post what Slack refused earlier, expire old proposals: in every cluster served."""
        while not self._stop.wait(self.sweep_interval):
            try:
                self.router.sweep()
            except Exception:
                log.exception("sweep failed")

    # ---- connections (in the event loop thread) ------------------------------------------

    def _run_loop(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            log.exception("the HTTP server stopped")
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._loop_stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.sock, limit=self.limits.max_head_bytes)
        self._ready.set()
        async with server:
            await self._loop_stop.wait()
            server.close()
            for writer in list(self._open):
                writer.close()

    def _count(self, reason: str) -> None:
        self.metrics.http_rejected.labels(reason).inc()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= self.limits.max_connections:
            self._count("too_many_connections")
            await self._write(writer, response_bytes(503, b'{"error": "too many connections"}\n', keep_alive=False))
            writer.close()
            return
        self._open.add(writer)
        try:
            await self._requests(reader, writer)
        except Exception:
            log.exception("connection failed")
        finally:
            self._open.discard(writer)
            writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                request = await read_request(reader, self.limits, first)
            except Closed:
                return
            except Rejected as bad:
                self._count(bad.reason)
                log.info("HTTP %d (%s): %s", bad.status, bad.reason, printable(bad.message))
                body = (json.dumps({"error": bad.message}) + "\n").encode()
                sent = await self._write(writer, response_bytes(bad.status, body, keep_alive=False))
                if sent and bad.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:  # still sending its body: let it finish
                    await self._discard_rest(reader, writer)
                return
            first = False
            response = await self._respond(request)
            keep = request.keep_alive
            data = response_bytes(response.status, response.body, response.content_type, keep, response.headers)
            if not await self._write(writer, data) or not keep:
                return

    async def _discard_rest(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After refusing a request (a body over the limit): close our side, then read and drop
        what the client still sends, for a bounded time. Closing with unread bytes would make the
        kernel reset the connection, and the client would see a reset instead of our 413."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DISCARD_SECONDS
        try:
            if writer.can_write_eof():
                writer.write_eof()
            while (left := deadline - loop.time()) > 0:
                if not await within(left, reader.read(1 << 16)):
                    return
        except (TimeoutError, ConnectionError, OSError):
            return

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        try:
            writer.write(data)
            await within(self.limits.write_timeout, writer.drain())
            return True
        except (TimeoutError, ConnectionError, RuntimeError):
            return False

    # ---- requests ------------------------------------------------------------------------

    async def _respond(self, request: Request) -> Response:
        route = (request.method, request.path)
        if route == ("GET", "/healthz"):
            return Response.text(200, "ok\n")
        if route == ("GET", "/readyz"):
            return self._readyz()
        if route == ("GET", "/metrics"):
            return await self._in_thread(self._metrics)
        if route == ("POST", "/alerts"):
            return await self._in_thread(self._alerts, request)
        if route == ("POST", "/slack/events") and self.bolt_app is not None:
            return await self._in_thread(self._slack_events, request)
        if request.path in ("/healthz", "/readyz", "/metrics", "/alerts", "/slack/events"):
            self._count("method_not_allowed")
            return Response.json(405, {"error": f"{printable(request.method, 20)} not allowed here"})
        self._count("not_found")
        return Response.json(404, {"error": f"no such path: {printable(request.path, 100)}"})

    async def _in_thread(self, handler: Callable[..., Response], *args: Any) -> Response:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.handlers, handler, *args)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._count("stopping")
            return Response.json(503, {"error": "the server is stopping"})
        except Exception as exc:
            log.exception("request handler failed")
            self._count("internal_error")
            return Response.json(500, {"error": f"internal error: {type(exc).__name__}"})

    def _readyz(self) -> Response:
        r = self.readiness
        vetoed = [f"{name} ({reason})" for name, veto in r.vetoes.items() if (reason := veto())]
        if vetoed:  # the fix first: it says more than "waiting for slack (invalid_auth)"
            return Response.text(503, f"not ready: {', '.join(vetoed)}\n")
        if r.ready:
            return Response.text(200, "ready\n")
        waiting = ", ".join(f"{n} ({r.errors.get(n, 'not checked yet')})" for n in r.checks if n not in r.passed)
        return Response.text(503, f"not ready: waiting for {waiting}\n")

    def _metrics(self) -> Response:
        return Response(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)

    def _alerts(self, request: Request) -> Response:
        status, doc = self.intake.receive(request.body, request.headers.get("authorization"))
        if status != 200:
            log.warning("/alerts answered %d: %s", status, printable(doc.get("error")))
        return Response.json(status, doc)

    def _slack_events(self, request: Request) -> Response:
        from slack_bolt.request import BoltRequest

        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            self._count("invalid_utf8")
            return Response.json(400, {"error": "the body is not valid UTF-8"})
        headers: dict[str, str | Sequence[str]] = {k: [v] for k, v in request.headers.items()}
        try:
            bolt_request = BoltRequest(body=text, query=request.query, headers=headers)
        except (ValueError, RecursionError) as exc:
            self._count("bad_slack_body")
            return Response.json(400, {"error": f"unreadable Slack request body: {type(exc).__name__}"})
        answer = self.bolt_app.dispatch(bolt_request)
        content_type = (answer.headers.get("content-type") or ["application/json"])[0]
        extra = {k: list(v) for k, v in answer.headers.items() if k.lower() not in ("content-type", "content-length")}
        return Response(answer.status, (answer.body or "").encode(), content_type, extra)
