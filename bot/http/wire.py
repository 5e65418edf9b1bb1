"""Reading one HTTP/1.1 request off an asyncio stream, with every limit an untrusted client
needs: the head within a deadline and a size, a Content-Length that is a plain number within
the body limit, the body within an idle timeout. Anything else is a `Rejected` with a status, a
counted reason and one line for the client. Also: the bytes of a response, and `printable()`
for logging text that came from a request."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar

T = TypeVar("T")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,12}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_BAD_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class Limits:
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    head_timeout: float = 5.0  # the whole request line and headers: a slow client is cut off
    # No byte of a promised body for this long: 408. Long enough that a sender (or this process)
    # busy for a moment is not cut off mid-body; the whole-body limit below still ends a slow drip.
    body_idle_timeout: float = 2.0
    body_timeout: float = 15.0  # the whole body
    keepalive_timeout: float = 15.0  # an idle kept-alive connection is closed silently
    write_timeout: float = 10.0  # a client that does not read its answer
    max_connections: int = 1000
    max_json_depth: int = 32


@dataclass
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    received_at: float = field(default_factory=time.monotonic)

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


class Rejected(Exception):
    """A request answered with an error. `reason` is the metric label (a fixed word)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class Closed(Exception):
    """The client went away (or idled out between requests) with nothing to answer."""


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """`await awaitable`, or TimeoutError after `seconds`: asyncio.wait_for without the task that
    Python 3.11's wait_for makes at every call (three or four per request; 3.12's is this)."""
    async with asyncio.timeout(seconds):
        return await awaitable


def printable(text: object, limit: int = 300) -> str:
    """Text from a request, safe for one log line: control characters and line breaks escaped
    (`\\n`, `\\x1b`), bounded in length. A label can no longer forge a log line."""
    escaped = _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), str(text))
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


async def read_request(reader: asyncio.StreamReader, limits: Limits, first: bool) -> Request:
    """The next request on a connection. Raises Rejected (answer, then close) or Closed."""
    head = await _read_head(reader, limits, first)
    request = parse_head(head)
    length = body_length(request, limits)
    if length:
        request.body = await _read_body(reader, length, limits)
    return request


async def _read_head(reader: asyncio.StreamReader, limits: Limits, first: bool) -> bytes:
    if not first:  # between requests a client may idle; wait for its first byte quietly
        try:
            start = await within(limits.keepalive_timeout, reader.read(1))
        except (TimeoutError, ConnectionError):
            raise Closed() from None
        if not start:
            raise Closed()
    else:
        start = b""
    try:
        rest = await within(limits.head_timeout, reader.readuntil(b"\r\n\r\n"))
    except TimeoutError:
        raise Rejected(408, "head_timeout", f"request head not received within {limits.head_timeout:g} s") from None
    except asyncio.LimitOverrunError:
        raise Rejected(431, "head_too_large", f"request head larger than {limits.max_head_bytes} bytes") from None
    except asyncio.IncompleteReadError as exc:
        if start or exc.partial:
            raise Rejected(400, "incomplete_head", "connection closed in the middle of the request head") from None
        raise Closed() from None
    except ConnectionError:
        raise Closed() from None
    return start + rest


def parse_head(head: bytes) -> Request:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1") \
            or not parts[1].startswith("/"):
        raise Rejected(400, "bad_request_line", f"not an HTTP/1.x request line: {printable(lines[0], 80)}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or _BAD_HEADER_VALUE.search(value):
            raise Rejected(400, "bad_header", f"malformed header line: {printable(line, 80)}")
        key, value = name.lower(), value.strip(" \t")
        if key in headers and key == "content-length" and headers[key] != value:
            raise Rejected(400, "bad_content_length", "two different Content-Length headers")
        headers[key] = f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
    path, _, query = parts[1].partition("?")
    return Request(method=parts[0], path=path, query=query, version=parts[2], headers=headers)


def body_length(request: Request, limits: Limits) -> int:
    if "transfer-encoding" in request.headers:
        raise Rejected(411, "transfer_encoding", "send the body with a Content-Length, not Transfer-Encoding")
    raw = request.headers.get("content-length")
    if raw is None:
        if request.method in ("POST", "PUT", "PATCH"):
            raise Rejected(411, "missing_content_length", "a request with a body needs a Content-Length header")
        return 0
    if not _CONTENT_LENGTH.fullmatch(raw):
        raise Rejected(400, "bad_content_length", f"Content-Length is not a number of bytes: {printable(raw, 40)}")
    length = int(raw)
    if length > limits.max_body_bytes:
        raise Rejected(413, "body_too_large", f"body larger than {limits.max_body_bytes} bytes")
    return length


async def _read_body(reader: asyncio.StreamReader, length: int, limits: Limits) -> bytes:
    chunks: list[bytes] = []
    remaining = length
    deadline = time.monotonic() + limits.body_timeout
    while remaining:
        wait = min(limits.body_idle_timeout, deadline - time.monotonic())
        try:
            chunk = await within(max(wait, 0.001), reader.read(min(remaining, 256 * 1024)))
        except TimeoutError:
            raise Rejected(408, "body_timeout",
                           f"body shorter than its Content-Length ({length - remaining} of {length} bytes "
                           f"arrived)") from None
        except ConnectionError:
            raise Closed() from None
        if not chunk:
            raise Rejected(400, "body_incomplete", f"connection closed after {length - remaining} of {length} "
                                                   "body bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def response_bytes(status: int, body: bytes, content_type: str = "application/json", keep_alive: bool = True,
                   headers: dict[str, list[str]] | None = None) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
             f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    for name, values in (headers or {}).items():
        lines += [f"{name}: {printable(value, 4000)}" for value in values]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
