"""Socket Mode's liveness check, counted in pings rather than in seconds.

slack_sdk's built-in client pings every `ping_interval` and drops the connection when no pong
came back for 4 intervals of wall time. Its pinger and its reader are threads of this process:
when the process is busy (a large log being diagnosed, a loaded node), the reader takes the pong
late, the wall clock runs on, and a healthy connection is dropped and replaced; an envelope in
flight on it is re-delivered. Here a connection is taken as dead only when `MISSED` pings in a row
were sent and none was answered, and the wall-time rule still holds too: a busy process sends
fewer pings, so it misses fewer, and a socket that really went silent (half-open, or a FIN that
the reader never sees) is still replaced after about `MISSED` intervals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk.socket_mode.interval_runner import IntervalRunner

log = logging.getLogger(__name__)
MISSED = 4  # slack_sdk's own figure, in intervals


class PingWatch:
    """The client's session monitor (what slack_sdk's IntervalRunner calls every interval)."""

    def __init__(self, client: Any, missed: int = MISSED, clock: Callable[[], float] = time.time):
        self.client = client
        self.missed = missed
        self.clock = clock  # wall time, as in the pong's payload (slack_sdk reads it back as a float)
        self._session: Any = None
        self._answered: float | None = None  # the send time carried by the latest pong seen
        self._unanswered = 0
        self._since = 0.0  # the wall time of the first unanswered ping

    def check(self) -> None:
        session = self.client.current_session
        try:
            if session is not None and session.is_active():
                self._ping(session)
            if self.client.auto_reconnect_enabled and (session is None or not session.is_active()):
                log.info("Socket Mode: the connection is closed; reconnecting")
                self.client.connect_to_new_endpoint()
        except Exception as exc:  # the monitor thread must survive a failed reconnect and try again
            log.error("Socket Mode: checking or reconnecting failed: %s: %s", type(exc).__name__, exc)

    def _ping(self, session: Any) -> None:
        if session is not self._session:  # a new connection starts with a clean count
            self._session, self._answered, self._unanswered = session, session.last_ping_pong_time, 0
        if session.last_ping_pong_time != self._answered:
            self._answered, self._unanswered = session.last_ping_pong_time, 0
        now = self.clock()
        if self._unanswered == 0:
            self._since = now
        if self._unanswered >= self.missed and now - self._since >= self.missed * self.client.ping_interval:
            log.info("Socket Mode: %d pings in a row went unanswered; replacing the connection", self._unanswered)
            session.disconnect()
            return
        try:
            # The pong echoes this payload; slack_sdk's reader records its time as last_ping_pong_time.
            session.ping(f"{session.session_id}:{now}")
        except OSError as exc:  # reset, broken pipe, TLS closed: the socket is gone, not late
            log.info("Socket Mode: the connection is gone (%s); replacing it", type(exc).__name__)
            session.disconnect()
            return
        self._unanswered += 1


def patient(handler: SocketModeHandler) -> SocketModeHandler:
    """`handler` with its client's session monitor replaced by a PingWatch (before it connects)."""
    client = handler.client
    client.current_app_monitor = IntervalRunner(PingWatch(client).check, client.ping_interval)
    return handler
