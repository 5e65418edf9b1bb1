"""One HTTP/1.1 request and its answer, on a connection of the kubernetes client's own urllib3 pool.

KubeApi's calls are small JSON requests and answers. Sent through the client's generic layer
(ApiClient.param_serialize, RESTClientObject.request, PoolManager.urlopen, http.client), most of a
call's CPU went on machinery these calls never need: the body walked by sanitize_for_serialization
before json.dumps, every header validated by http.client one call at a time, and the answer's
headers parsed by the email package into a Message, copied into urllib3's HTTPHeaderDict and
checked again (about 60% of a get_pod's CPU in the calling thread).

Here the request is one bytes string written on a connection taken from the client's pool, and
the answer is read with the framing HTTP/1.1 defines (Content-Length, chunked, or to the close).
What makes the connection is untouched: the pool, its connections and their `connect()` are the
ones the client configured from the kubeconfig or the service account (TLS version and
verification, CA, client certificate, server name, socket options, the 80 kept connections).
A connection is taken and given back with the pool's own methods, the ones urlopen calls
(_get_conn, _validate_conn, _put_conn: in urllib3 since 1.x, its connections' is_closed since 2.0).
A client whose pool manager is not the plain PoolManager (an HTTP or SOCKS proxy), or an urllib3
older than 2, is sent through urllib3's own request path instead: proxying is urllib3's alone.

Failures leave as urllib3's urlopen raised them, so bot.kube.api translates the same exceptions
as before: a timeout reading is a ReadTimeoutError, a dropped or garbled connection a
ProtocolError, a connection that could not be made a NewConnectionError or ConnectTimeoutError,
a TLS failure an SSLError. Every answer is returned, whatever its status: what a status means is
decided in bot.kube.api.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import urllib3
from urllib3._collections import HTTPHeaderDict  # where urllib3 1.26 and 2.x both keep it
from urllib3.exceptions import ProtocolError, ReadTimeoutError, SSLError
from urllib3.util.ssl_match_hostname import CertificateError

# http.client's limits on an answer's head: a longer line or more headers is not an API server.
MAX_LINE = 65536
MAX_HEADERS = 100
# Methods whose request carries a body: with none, urllib3 (and so the client) sends Content-Length: 0.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# A header value may not start a new header or a body (request splitting): a token from an exec
# plugin or a forged object never reaches the wire with a line break in it.
LINE_BREAK = re.compile(r"[\r\n]")
HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*")
# The pool's hand-over methods used here (_get_conn, _validate_conn, _put_conn) are urllib3 2's; any
# other major release takes urllib3's own request path (slower, never wrong).
URLLIB3_MAJOR = int(urllib3.__version__.split(".")[0])


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, reason, header lines, body (what the client's ApiException reads of one)."""

    status: int
    reason: str
    header_lines: tuple[tuple[str, str], ...]
    data: bytes

    @property
    def headers(self) -> HTTPHeaderDict:
        """Case-insensitive, as urllib3 gave them (Retry-After is read from here); built only when
        asked, for an error: a 2xx answer's headers are never read."""
        return HTTPHeaderDict(self.header_lines)


def request_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]],
                 body_length: int | None) -> bytes:
    """The request line and headers, in the order and spelling urllib3 over http.client wrote them:
    Host, Accept-Encoding: identity, Content-Length, then `headers` as given."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    for name, value in headers:
        if not HEADER_NAME.fullmatch(name) or LINE_BREAK.search(value):
            raise ValueError(f"Invalid header {name!r}: a header name or value with a line break is never sent")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")  # as http.client encodes header values


def host_header(conn: Any) -> str:
    """The Host header http.client writes for this connection: the port only when not the scheme's
    default, an IPv6 address in brackets."""
    host = conn.host
    if ":" in host:
        host = f"[{host}]"
    return host if conn.port == conn.default_port else f"{host}:{conn.port}"


class Transport:
    """Requests on the connections of one ApiClient's pool (see the module's docstring)."""

    def __init__(self, api_client: Any):
        self.api_client = api_client
        self.pool_manager = api_client.rest_client.pool_manager
        self.own_framing = type(self.pool_manager) is urllib3.PoolManager and URLLIB3_MAJOR == 2  # no proxy
        self._server: tuple[str, Any, str] | None = None  # (the configured host, its pool, its path)

    def send(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes | None,
             timeout: float) -> Answer:
        """The answer to one request (`path` with its query), whatever its status."""
        if self.own_framing:
            return self._exchange(method, path, headers, body, timeout)
        return self._through_urllib3(method, self.api_client.configuration.host + path, headers, body, timeout)

    def _pool(self) -> tuple[Any, str]:
        """The pool for the configured host, as urlopen would choose it, and the host's own path
        (a server URL such as https://rancher.example/k8s/clusters/c-1 puts its path before every
        request's). Looked up again when the host changes or the client closed its pools."""
        host = self.api_client.configuration.host
        server = self._server
        if server is None or server[0] != host or server[1].pool is None:
            url = urllib3.util.parse_url(host)
            server = (host, self.pool_manager.connection_from_url(host), url.path or "")
            self._server = server
        return server[1], server[2]

    def _through_urllib3(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes | None,
                         timeout: float) -> Answer:
        """urllib3's request path, as the client's rest.py takes it (a proxy's pool manager)."""
        response = self.pool_manager.request(method, url, body=body, headers=dict(headers),
                                             timeout=urllib3.Timeout(total=timeout))
        return Answer(response.status, response.reason or "", tuple(response.headers.items()), response.data)

    def _exchange(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes | None,
                  timeout: float) -> Answer:
        pool, prefix = self._pool()
        target = prefix + path
        # urllib3's own hand-over of pooled connections (what urlopen calls): a dropped keep-alive
        # connection is replaced, a full pool discards, and every slot taken is given back.
        conn = pool._get_conn()
        reusable: bool | None = None  # None until an answer was read whole
        read_timeout = timeout
        try:
            started = time.monotonic() if conn.is_closed else None
            conn.timeout = timeout  # to connect
            pool._validate_conn(conn)  # as urlopen at every request: HTTPS connects here, warns when unverified
            if conn.is_closed:
                conn.connect()
            if started is not None:  # urllib3's Timeout(total=...): the time connecting is not read for
                read_timeout = timeout - (time.monotonic() - started)
                if read_timeout <= 0:
                    raise ReadTimeoutError(pool, target, f"Read timed out. (read timeout={read_timeout})")
            sock = conn.sock
            sock.settimeout(read_timeout)
            head = request_head(method, target, host_header(conn), headers,
                                len(body) if body is not None else (0 if method in BODY_METHODS else None))
            _write(sock, head + body if body else head)
            answer, reusable = _read_answer(sock, method)
            return answer
        except (TimeoutError, OSError, http.client.HTTPException, ssl.SSLError, CertificateError, SSLError) as exc:
            raise _as_client_error(exc, pool, target, read_timeout) from exc
        finally:
            if reusable is None:  # failed: urlopen gives the slot back for a new connection
                conn.close()
                pool._put_conn(None)
            else:  # answered: kept open, or closed as the answer said (connected again when next taken)
                if not reusable:
                    conn.close()
                pool._put_conn(conn)


def _write(sock: socket.socket, data: bytes) -> None:
    """The request. A server that closed its side after answering still has its answer read,
    as urllib3 does (BrokenPipeError, ECONNRESET while sending)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _as_client_error(exc: BaseException, pool: Any, target: str, read_timeout: float) -> BaseException:
    """The exception urllib3's urlopen and the client's rest.py raise for the same failure."""
    if isinstance(exc, (ssl.SSLError, CertificateError)):
        return SSLError(exc)
    if isinstance(exc, urllib3.exceptions.HTTPError):  # made by urllib3 already (connecting)
        return exc
    if isinstance(exc, socket.timeout):
        return ReadTimeoutError(pool, target, f"Read timed out. (read timeout={read_timeout})")
    return ProtocolError("Connection aborted.", exc)


def _read_answer(sock: socket.socket, method: str) -> tuple[Answer, bool]:
    """The answer on `sock` and whether the connection may carry another request."""
    with sock.makefile("rb") as stream:
        version, status, reason = _status_line(stream)
        while status == 100:  # 100 Continue: the real answer follows
            _header_lines(stream)
            version, status, reason = _status_line(stream)
        lines = _header_lines(stream)
        framing: dict[str, str] = {}  # lower-case name -> its first value, as http.client's Message.get reads it
        for name, value in lines:
            framing.setdefault(name.lower(), value)
        closes = _will_close(version, framing)
        if status in (204, 304) or 100 <= status < 200 or method == "HEAD":
            data = b""
        elif "chunked" in framing.get("transfer-encoding", "").lower():
            data = _chunked_body(stream)
        else:
            length = _content_length(framing.get("content-length"))
            if length is None:
                data, closes = stream.read(), True  # to the close: nothing else can follow
            else:
                data = stream.read(length)
                if len(data) < length:
                    raise http.client.IncompleteRead(data, length - len(data))
    return Answer(status, reason, lines, _decoded(data, framing.get("content-encoding"))), not closes


def _status_line(stream: Any) -> tuple[str, int, str]:
    line = stream.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong("status line")
    if not line:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    parts = line.decode("iso-8859-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise http.client.BadStatusLine(line.decode("iso-8859-1").rstrip("\r\n"))
    if parts[0] not in ("HTTP/1.0", "HTTP/0.9") and not parts[0].startswith("HTTP/1."):
        raise http.client.UnknownProtocol(parts[0])
    return parts[0], int(parts[1]), parts[2].strip() if len(parts) == 3 else ""


def _header_lines(stream: Any) -> tuple[tuple[str, str], ...]:
    """The answer's headers up to the blank line, in order (a folded line continues the one before)."""
    lines: list[tuple[str, str]] = []
    for _ in range(MAX_HEADERS + 1):
        line = stream.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return tuple(lines)
        text = line.decode("iso-8859-1")
        if text[0] in " \t" and lines:
            lines[-1] = (lines[-1][0], f"{lines[-1][1]} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon:
            raise http.client.HTTPException(f"not a header line: {text.rstrip()!r}")
        lines.append((name.strip(), value.strip()))
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def _will_close(version: str, framing: dict[str, str]) -> bool:
    """http.client's rule: HTTP/1.1 keeps the connection unless told to close; 1.0 closes unless
    told to keep it."""
    connection = framing.get("connection", "").lower()
    if version not in ("HTTP/1.0", "HTTP/0.9"):
        return "close" in connection
    return not ("keep-alive" in connection or "keep-alive" in framing
                or "keep-alive" in framing.get("proxy-connection", "").lower())


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


def _chunked_body(stream: Any) -> bytes:
    parts: list[bytes] = []
    while True:
        line = stream.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("chunk size")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise http.client.IncompleteRead(b"".join(parts)) from None
        if size == 0:
            break
        chunk = stream.read(size)
        if len(chunk) < size or len(stream.read(2)) < 2:  # the chunk and its CRLF
            raise http.client.IncompleteRead(b"".join(parts) + chunk)
        parts.append(chunk)
    while stream.readline(MAX_LINE + 1) not in (b"\r\n", b"\n", b""):  # trailers, ignored as urllib3 does
        pass
    return b"".join(parts)


def _decoded(data: bytes, content_encoding: str | None) -> bytes:
    """The body as urllib3 decodes it: every request asks for identity, so a coded body is only
    a server that ignored that; gzip and deflate are undone, as urllib3 would."""
    coding = (content_encoding or "identity").lower().strip()
    if coding in ("", "identity") or not data:
        return data
    try:
        if coding in ("gzip", "x-gzip"):
            return zlib.decompress(data, 16 + zlib.MAX_WBITS)
        if coding == "deflate":
            try:
                return zlib.decompress(data)
            except zlib.error:
                return zlib.decompress(data, -zlib.MAX_WBITS)  # raw deflate, as some servers send it
    except zlib.error as exc:
        raise urllib3.exceptions.DecodeError(f"the answer's {coding} body does not decode: {exc}") from None
    raise urllib3.exceptions.DecodeError(f"the answer is coded as {coding!r}, which this client does not decode")
