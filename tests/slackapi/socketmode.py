"""A local Socket Mode endpoint: Slack's side of an app's WebSocket connections, for tests.

The bot's real SocketModeClient (slack_sdk's built-in one, which Bolt's SocketModeHandler uses)
asks the Web API stand-in for `apps.connections.open` with its xapp- token, gets a one-use
ws:// URL minted here, and connects. From then on this server speaks Slack's protocol as
https://api.slack.com/apis/socket-mode documents it:

- on connect: `{"type": "hello", "num_connections": N, "connection_info": {"app_id"}, "debug_info"}`;
- events as envelopes `{"envelope_id", "type": "interactive"|"slash_commands"|"events_api",
  "payload", "accepts_response_payload", "retry_attempt", "retry_reason"}`; the app acks one with
  `{"envelope_id", "payload"?}` on the same socket;
- WebSocket pings are answered with pongs (and counted), and the server pings too (keepalive; a
  late pong closes the connection only when `keepalive_timeout` is set);
- `{"type": "disconnect", "reason": "refresh_requested"|"warning"|...}` when a test asks;
- a test can also drop a connection abruptly: "reset" (TCP RST), "eof" (FIN without a close
  frame) or "silent" (a half-open connection: nothing is read or answered any more).

Like Slack, each envelope goes to ONE of the app's open connections (`to=` a chosen one, else
`route`, by default a seeded random choice). An envelope not acked within `ack_timeout` (None: only
when the test says its ack timed out, `expire_ack`, so no wall-time race decides it), or whose
connection closed before its ack, goes again to another open connection (or the next new one)
with retry_attempt + 1, at most `max_retries` times. An envelope sent while no connection is
open waits and goes out on the next connection, after its hello.

Everything runs on one asyncio loop in a daemon thread; the test-facing methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from standin_http import bound
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

ENVELOPE_TYPES = ("interactive", "slash_commands", "events_api")


@dataclass
class Connection:
    """One WebSocket connection of the app, as the server sees it."""

    id: int
    token: str  # the app-level token that opened it (apps.connections.open)
    opened_at: float = field(default_factory=time.monotonic)
    closed_at: float | None = None
    closed_how: str | None = None  # "closed" (by either side, normally), "reset", "eof", "silent"
    disconnect_reason: str | None = None  # a disconnect message was sent: no new envelopes go here
    received: list[dict[str, Any]] = field(default_factory=list)  # every JSON message the app sent
    ws: ServerConnection | None = field(default=None, repr=False)

    @property
    def pings(self) -> int:
        """Pings the app sent on this connection (each answered with a pong)."""
        return getattr(self.ws, "pings", 0)

    @property
    def open(self) -> bool:
        return self.closed_at is None

    @property
    def takes_envelopes(self) -> bool:
        return self.open and self.disconnect_reason is None


@dataclass
class Delivery:
    connection: int
    retry_attempt: int
    retry_reason: str | None
    sent_at: float = field(default_factory=time.monotonic)
    acked_at: float | None = None
    ack_lost: bool = False  # the app acked, but the test made the server lose it


@dataclass
class Envelope:
    id: str
    type: str
    payload: dict[str, Any]
    accepts_response_payload: bool
    lose_acks: int = 0  # how many of its acks the server loses (as if they never arrived)
    target: Connection | None = None  # where the first delivery must go, if open
    deliveries: list[Delivery] = field(default_factory=list)
    ack: dict[str, Any] | None = None  # the ack that counted, as the app sent it
    extra_acks: int = 0  # acks after the one that counted (a re-delivery acked again)
    gave_up: bool = False
    acked: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait_acked(self, timeout: float = 10) -> bool:
        """Whether the app acked it; `timeout` only bounds a failure (standin_http.bound)."""
        return self.acked.wait(bound(timeout))

    @property
    def response(self) -> dict[str, Any] | None:
        """The payload the app sent with its ack (a slash command's answer), if any."""
        return (self.ack or {}).get("payload")

    @property
    def ack_seconds(self) -> float | None:
        """From the delivery that was acked to its ack: what Slack holds to 3 seconds."""
        done = [d for d in self.deliveries if d.acked_at is not None]
        return done[0].acked_at - done[0].sent_at if done else None  # type: ignore[operator]

    def wire(self, delivery: Delivery) -> dict[str, Any]:
        return {"envelope_id": self.id, "type": self.type, "payload": self.payload,
                "accepts_response_payload": self.accepts_response_payload,
                "retry_attempt": delivery.retry_attempt, "retry_reason": delivery.retry_reason}


class _Counted(ServerConnection):
    """A server connection that counts the pings it receives (websockets answers each with a pong)."""

    pings = 0

    def process_event(self, event: Any) -> None:
        super().process_event(event)
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pings += 1


class SocketModeStandIn:
    def __init__(self, app_id: str = "A0STANDIN", ack_timeout: float | None = 3.0, max_retries: int = 3,
                 seed: int = 0, keepalive_seconds: float | None = 5.0, keepalive_timeout: float | None = None,
                 close_after_disconnect: float | None = 10.0):
        self.app_id = app_id
        self.ack_timeout, self.max_retries = ack_timeout, max_retries
        self.keepalive_seconds = keepalive_seconds  # the server's own pings
        # None: a late pong never closes the app's connection. The app's threads answer pings; on a
        # busy test machine they answer late, and a stand-in that dropped them then would test the
        # machine's load, not the app (which notices a dead socket by its own pings).
        self.keepalive_timeout = keepalive_timeout
        self.close_after_disconnect = close_after_disconnect  # Slack closes a refreshed connection later
        self.random = random.Random(seed)
        # who gets an envelope: (open connections, envelope) -> one of them; None: a seeded random one
        self.route: Callable[[list[Connection], Envelope], Connection] | None = None
        self.connections: list[Connection] = []
        self.envelopes: list[Envelope] = []
        self.waiting: list[Envelope] = []  # sent while no connection was open
        self.refused_tickets = 0
        self._tickets: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    # ---- control ------------------------------------------------------------------------

    def start(self) -> SocketModeStandIn:
        ready = threading.Event()

        async def listen() -> Server:
            return await serve(self._session, "127.0.0.1", 0, compression=None, create_connection=_Counted,
                               process_request=self._check_ticket, ping_interval=self.keepalive_seconds,
                               ping_timeout=self.keepalive_timeout, close_timeout=1)

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(listen())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="socket-mode-standin", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._server is None:
            return

        async def shut() -> None:
            assert self._server is not None
            for conn in self.connections:  # a "silent" one is closed for Slack but its socket is still there
                if conn.ws is not None:
                    conn.ws.transport.abort()
            self._server.close()
            await asyncio.wait_for(self._server.wait_closed(), 5)

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def open_url(self, token: str) -> str:
        """What apps.connections.open answers: a one-use URL for the app of `token`."""
        ticket = uuid.uuid4().hex
        with self._lock:
            self._tickets[ticket] = token
        return f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={self.app_id}"

    def open_connections(self, token: str | None = None) -> list[Connection]:
        with self._lock:
            return [c for c in self.connections if c.open and (token is None or c.token == token)]

    def opened(self, token: str | None = None) -> list[Connection]:
        """Every connection ever opened (of `token`), closed ones included, oldest first."""
        with self._lock:
            return [c for c in self.connections if token is None or c.token == token]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10) -> bool:
        """Poll until `predicate()` holds; `timeout` only bounds a failure (standin_http.bound)."""
        deadline = time.monotonic() + bound(timeout)
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    # ---- what Slack sends -----------------------------------------------------------------

    def send(self, type: str, payload: dict[str, Any], to: Connection | None = None, lose_acks: int = 0,
             accepts_response_payload: bool | None = None) -> Envelope:
        """Deliver one envelope to one open connection (`to`, if it is open); it waits if none is."""
        assert type in ENVELOPE_TYPES, type
        envelope = Envelope(id=str(uuid.uuid4()), type=type, payload=payload, lose_acks=lose_acks, target=to,
                            accepts_response_payload=(type != "events_api") if accepts_response_payload is None
                            else accepts_response_payload)
        with self._lock:
            self.envelopes.append(envelope)
        self._call(self._deliver(envelope, 0, None))
        return envelope

    def interactive(self, payload: dict[str, Any], **kw: Any) -> Envelope:
        return self.send("interactive", payload, **kw)

    def slash_command(self, payload: dict[str, Any], **kw: Any) -> Envelope:
        return self.send("slash_commands", payload, **kw)

    def disconnect(self, conn: Connection, reason: str = "refresh_requested") -> None:
        """Tell the app to go elsewhere; Slack closes the connection itself a while later."""
        self._call(self._disconnect(conn, reason))

    def drop(self, conn: Connection, how: str = "reset") -> None:
        """End a connection abruptly: "reset" (RST), "eof" (FIN, no close frame), "silent" (half-open)."""
        assert how in ("reset", "eof", "silent"), how
        self._call(self._drop(conn, how))

    def expire_ack(self, envelope: Envelope) -> None:
        """Slack's ack time-out for `envelope`'s latest delivery runs out now: if that delivery is
        still unacked, the envelope goes again (retry_reason "timeout"), as after `ack_timeout`."""
        async def expire() -> None:
            if envelope.deliveries:
                self._ack_timed_out(envelope, envelope.deliveries[-1])

        self._call(expire())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ---- the server side (on the loop) ----------------------------------------------------

    def _check_ticket(self, ws: ServerConnection, request: Any) -> Any:
        ticket = request.path.partition("ticket=")[2].partition("&")[0]
        with self._lock:
            token = self._tickets.pop(ticket, None)  # one use, like Slack's
        if token is None:
            self.refused_tickets += 1
            return ws.respond(401, "invalid or used ticket\n")
        ws.token = token  # type: ignore[attr-defined]
        return None

    async def _session(self, ws: ServerConnection) -> None:
        with self._lock:
            conn = Connection(id=next(self._ids), token=ws.token, ws=ws)  # type: ignore[attr-defined]
            self.connections.append(conn)
            others = len([c for c in self.connections if c.open and c.token == conn.token])
        await ws.send(json.dumps({"type": "hello", "num_connections": others,
                                  "connection_info": {"app_id": self.app_id},
                                  "debug_info": {"host": "standin-1", "started": "2024-01-01 00:00:00",
                                                 "build_number": 1, "approximate_connection_time": 18060}}))
        waiting, self.waiting = self.waiting, []
        for envelope in waiting:
            await self._deliver(envelope, *self._next_attempt(envelope))
        try:
            async for text in ws:
                self._received(conn, text)
        except ConnectionClosed:
            pass
        finally:
            await self._closed(conn, conn.closed_how or "closed")

    def _received(self, conn: Connection, text: str | bytes) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            message = {"unreadable": str(text)[:200]}
        conn.received.append(message)
        envelope = next((e for e in self.envelopes if e.id == message.get("envelope_id")), None)
        if envelope is None:
            return
        delivery = next((d for d in reversed(envelope.deliveries) if d.connection == conn.id), None)
        if delivery is None:
            return
        if envelope.lose_acks > 0:
            envelope.lose_acks -= 1
            delivery.ack_lost = True
            return
        if envelope.ack is not None:
            envelope.extra_acks += 1
            return
        delivery.acked_at = time.monotonic()
        envelope.ack = message
        envelope.acked.set()

    async def _closed(self, conn: Connection, how: str) -> None:
        if conn.closed_at is not None:
            return
        with self._lock:
            conn.closed_at, conn.closed_how = time.monotonic(), how
        for envelope in list(self.envelopes):
            last = envelope.deliveries[-1] if envelope.deliveries else None
            if envelope.ack is None and not envelope.gave_up and last is not None and last.connection == conn.id:
                await self._deliver(envelope, len(envelope.deliveries), "connection_closed")

    def _next_attempt(self, envelope: Envelope) -> tuple[int, str | None]:
        return (len(envelope.deliveries), "connection_closed") if envelope.deliveries else (0, None)

    async def _deliver(self, envelope: Envelope, attempt: int, reason: str | None) -> None:
        if envelope.ack is not None or envelope.gave_up:
            return
        if attempt > self.max_retries:
            envelope.gave_up = True
            return
        conn = self._pick(envelope)
        if conn is None:
            if envelope not in self.waiting:
                self.waiting.append(envelope)
            return
        delivery = Delivery(connection=conn.id, retry_attempt=attempt, retry_reason=reason)
        envelope.deliveries.append(delivery)
        try:
            assert conn.ws is not None
            await conn.ws.send(json.dumps(envelope.wire(delivery)))
        except ConnectionClosed:
            await self._closed(conn, "closed")
            return
        if self.ack_timeout is not None:
            self._loop.call_later(self.ack_timeout, self._ack_timed_out, envelope, delivery)

    def _pick(self, envelope: Envelope) -> Connection | None:
        candidates = [c for c in self.connections if c.takes_envelopes]
        if not envelope.deliveries and envelope.target is not None and envelope.target in candidates:
            return envelope.target
        tried = {d.connection for d in envelope.deliveries}
        fresh = [c for c in candidates if c.id not in tried] or candidates  # another one if there is one
        if not fresh:
            return None
        return self.route(fresh, envelope) if self.route else self.random.choice(fresh)

    def _ack_timed_out(self, envelope: Envelope, delivery: Delivery) -> None:
        if envelope.ack is None and envelope.deliveries and envelope.deliveries[-1] is delivery:
            asyncio.ensure_future(self._deliver(envelope, len(envelope.deliveries), "timeout"))

    async def _disconnect(self, conn: Connection, reason: str) -> None:
        conn.disconnect_reason = reason
        if conn.ws is None or not conn.open:
            return
        await conn.ws.send(json.dumps({"type": "disconnect", "reason": reason,
                                       "debug_info": {"host": "standin-1"}}))
        if self.close_after_disconnect is not None:
            self._loop.call_later(self.close_after_disconnect,
                                  lambda: asyncio.ensure_future(conn.ws.close()) if conn.ws and conn.open else None)

    async def _drop(self, conn: Connection, how: str) -> None:
        ws = conn.ws
        if ws is None or not conn.open:
            return
        conn.closed_how = how
        transport = ws.transport
        if how == "reset":  # SO_LINGER 0: close() sends RST, the peer's recv fails at once
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        elif how == "eof":
            transport.close()
        else:  # half-open: nothing read, nothing answered, nothing sent; the app must notice by itself
            transport.pause_reading()
        await self._closed(conn, how)  # gone for Slack at once: what it had not acked goes elsewhere
