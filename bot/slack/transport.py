"""Slack's Web API over kept-alive connections.

slack_sdk's WebClient sends every call through `urllib.request.urlopen`, which opens a new
connection per call and closes it after the answer ("Connection: close"): a DNS look-up, a TCP
handshake and, against slack.com, a TLS handshake for every post and update. `KeptAliveClient`
is that WebClient with one method replaced, the one that sends a built request and reads its
answer (`_perform_urllib_http_request_internal`, slack_sdk 3.27-3.48: private, so pinned by
tests/slack/test_slack_transport.py, and replaced only in those releases: any other takes urllib's
path, REPLACES_SLACK_SDK). Everything around it is slack_sdk's own: the request's
headers and body, the answer's parsing, SlackResponse, SlackApiError, the 429's Retry-After.

What the replacement keeps from urllib, so the callers' error handling stays as it is
(bot.slack.chat retry_reason / may_have_happened):
- a failure to connect or to send the request is `urllib.error.URLError(the OSError)`;
- a failure while waiting for or reading the answer is raised as it is (a timeout, a connection
  closed without an answer, an answer cut short);
- an answer other than 2xx is `urllib.error.HTTPError`, its headers and body readable.

When it steps aside: a proxy in the environment for Slack's host (HTTPS_PROXY and NO_PROXY, read
once) or given to the client, and a URL that is not http(s): urllib's path then, as before.

A connection taken from the pool is checked first: one the server closed while it was idle (it is
readable: the server's FIN) or idle longer than IDLE_SECONDS is closed and a new one opened, so a
post is not sent into a connection the server is closing. A post that fails after its request
went out is ambiguous all the same (bot.slack.chat may_have_happened): never resent blindly.
"""

from __future__ import annotations

import http.client
import io
import logging
import re
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from slack_sdk import WebClient
from slack_sdk.version import __version__ as SLACK_SDK_VERSION

log = logging.getLogger(__name__)

# Slack's and its load balancers' idle timeouts are not published; below a minute is what HTTP
# servers commonly keep an idle connection for, so one idle longer is not trusted to be open.
IDLE_SECONDS = 30.0
KEPT_IDLE = 4  # idle connections kept; more at once (a burst of workers) are closed after use


class ConnectionPool:
    """Idle kept-alive connections to one host, most recently used first; thread-safe."""

    def __init__(self, url: str, timeout: float, context: ssl.SSLContext | None,
                 clock: Callable[[], float] = time.monotonic, kept: int = KEPT_IDLE):
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "", parts.port
        self.timeout, self.context, self.clock, self.kept = timeout, context, clock, kept
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0  # connections opened so far (tests, benchmarks)

    def take(self) -> http.client.HTTPConnection:
        """An open idle connection that is still good, else a new one (connected when first used)."""
        while True:
            with self._lock:
                conn, since = self._idle.pop() if self._idle else (None, 0.0)
            if conn is None:
                break
            if self.clock() - since <= IDLE_SECONDS and not closed_by_server(conn):
                return conn
            conn.close()
        self.opened += 1
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.kept:
                self._idle.append((conn, self.clock()))
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections; one in use is closed when it is given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def closed_by_server(conn: http.client.HTTPConnection) -> bool:
    """An idle connection with something to read has been closed by the server (or is out of step)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def connect(conn: http.client.HTTPConnection) -> None:
    """Open the connection. http.client sends a request's head and body in two writes: without
    TCP_NODELAY (urllib3 sets it too), on a kept-alive connection the body waits for the server's
    delayed ACK (40 ms)."""
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def proxied(url: str) -> bool:
    """Whether urllib would send a request for `url` through a proxy from the environment."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    return parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or "")


# The slack_sdk releases whose private send-and-read method has the name, the parameters and the
# answer KeptAliveClient's replacement has. Outside them the client takes urllib's path (a new
# connection per call, as before): an upgrade of slack_sdk costs the kept connections, never a call.
REPLACES_SLACK_SDK = ((3, 27), (3, 48))


def replaces_slack_sdk(version: str = SLACK_SDK_VERSION) -> bool:
    """Whether this slack_sdk release is one whose send-and-read method KeptAliveClient replaces."""
    numbers = re.findall(r"\d+", version)
    if len(numbers) < 2:
        return False
    return REPLACES_SLACK_SDK[0] <= (int(numbers[0]), int(numbers[1])) <= REPLACES_SLACK_SDK[1]


class KeptAliveClient(WebClient):
    """A WebClient whose calls reuse connections (see the module docstring)."""

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic,
                 slack_sdk_version: str = SLACK_SDK_VERSION, **kwargs: Any):
        super().__init__(*args, **kwargs)
        url = str(self.base_url)
        self.pool: ConnectionPool | None = None
        if not replaces_slack_sdk(slack_sdk_version):
            log.info("Slack calls open a connection each: slack_sdk %s is not a release whose transport this "
                     "bot replaces (%d.%d-%d.%d)", slack_sdk_version, *REPLACES_SLACK_SDK[0], *REPLACES_SLACK_SDK[1])
        elif url.lower().startswith(("http://", "https://")) and not self.proxy and not proxied(url):
            self.pool = ConnectionPool(url, self.timeout, self.ssl, clock)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _perform_urllib_http_request_internal(self, *args: Any, **kwargs: Any) -> Any:
        pool = self.pool
        if pool is None:  # whatever this slack_sdk passes it: a release outside REPLACES_SLACK_SDK, a proxy
            return super()._perform_urllib_http_request_internal(*args, **kwargs)
        url, req = args  # (url, req) in every release REPLACES_SLACK_SDK names
        return self._kept_alive(url, req)

    def _kept_alive(self, url: str, req: urllib.request.Request) -> dict[str, Any]:
        pool = self.pool
        assert pool is not None  # _perform_urllib_http_request_internal's check
        parts = urlsplit(url)
        if (parts.hostname, parts.port) != (pool.host, pool.port):
            return super()._perform_urllib_http_request_internal(url, req)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        # The header names as urllib sends them (Title-case); no "Connection: close".
        headers = {name.title(): value for name, value in req.header_items()}
        conn = pool.take()
        try:
            try:
                if conn.sock is None:
                    connect(conn)
                conn.request(req.get_method(), path, req.data, headers)
            except OSError as err:  # not connected, or the request not sent whole: as urllib says it
                raise urllib.error.URLError(err) from err
            resp = conn.getresponse()
            raw = resp.read()
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            pool.give_back(conn)
        if not 200 <= resp.status < 300:
            raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.msg, io.BytesIO(raw))
        body: str | bytes = raw  # admin.analytics.getFile's gzip answer stays bytes
        if resp.msg.get_content_type() != "application/gzip":
            body = raw.decode(resp.msg.get_content_charset() or "utf-8")
        if self._logger.level <= logging.DEBUG:  # as slack_sdk logs it
            self._logger.debug(f"Received the following response - status: {resp.status}, "
                               f"headers: {dict(resp.msg)}, body: {body if isinstance(body, str) else '(binary)'}")
        return {"status": resp.status, "headers": resp.msg, "body": body}
