"""The one HTTP server base of the stand-ins (Kubernetes API, Slack Web API, OpenAI endpoint,
DCGM exporter, a vLLM pod): a threaded server on 127.0.0.1 and a free port, in a daemon thread,
with a quiet request handler. Each stand-in writes only its handler's answers.

    class Handler(QuietHandler):
        def do_GET(self): self.reply(200, b"ok", "text/plain")

    server = StandInServer(Handler, name="my-stand-in").start()
    server.url  # http://127.0.0.1:PORT
    server.stop()
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps test output quiet and sends headers and body without the
    40 ms delayed-ACK stall between them."""

    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def body(self) -> bytes:
        """The request body (Content-Length bytes), b"" when there is none."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def reply(self, code: int, data: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        """Answer with `data`; a client that already gave up (its timeout) is not an error here."""
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 50 clients connecting at once (a benchmark's
    # senders) overflow it and some are reset. A real API server accepts them all.
    request_queue_size = 1024


class StandInServer:
    """A ThreadingHTTPServer on 127.0.0.1 (port 0: a free one) served from a daemon thread.
    `poll_interval` is how often serve_forever looks for shutdown(): short, so stop() is quick."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str = "stand-in", poll_interval: float = 0.02):
        self.handler, self.name, self.poll_interval = handler, name, poll_interval
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> StandInServer:
        self.server = _Server(("127.0.0.1", 0), self.handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": self.poll_interval},
                                       name=self.name, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def host(self) -> str:
        assert self.server is not None, "start() the server first"
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        assert self.server is not None, "start() the server first"
        return int(self.server.server_address[1])

    @property
    def address(self) -> str:
        """host:port, as a scrape target is written."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """http://host:port, without a trailing slash."""
        return f"http://{self.address}"


# A wait in a test only bounds a failure: how long a condition the test waits for may take on a
# loaded machine (a CPU burner beside the suite, other suites). Every wait helper stretches the
# timeout its caller wrote to at least this; none is used to show that something did NOT happen.
FAILURE_BOUND = 60.0


def bound(timeout: float) -> float:
    return max(timeout, FAILURE_BOUND)


class MetricsExporter:
    """A Prometheus exporter stand-in: subclasses say what `text()` serves at /metrics."""

    name = "metrics"
    server: StandInServer | None = None

    def text(self) -> str:
        raise NotImplementedError

    def start(self) -> Self:
        exporter = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.reply(200 if self.path.startswith("/metrics") else 404, exporter.text().encode(),
                           "text/plain; version=0.0.4")

        self.server = StandInServer(Handler, name=self.name).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.stop()

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address
