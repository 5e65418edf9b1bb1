"""The Socket Mode liveness check (bot/slack/socket_mode.py) on a driven clock: a pong that comes
late because the process was busy keeps the connection; a socket that stopped answering is
replaced after 4 unanswered pings; a ping that cannot be sent replaces it at once.

The session and client below stand in for slack_sdk's built-in Connection and SocketModeClient
(only the attributes the check reads); tests/slack/test_socket_mode.py runs the real ones."""

from __future__ import annotations

import pytest

from bot.slack.socket_mode import PingWatch

INTERVAL = 10.0


class Session:
    def __init__(self, name: str = "s1", broken: bool = False):
        self.session_id, self.broken = name, broken
        self.last_ping_pong_time: float | None = None
        self.sent: list[str] = []
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def ping(self, payload: str) -> None:
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        self.sent.append(payload)

    def pong(self) -> None:
        """The reader takes the pong of the latest ping: its send time becomes last_ping_pong_time."""
        self.last_ping_pong_time = float(self.sent[-1].split(":")[1])

    def disconnect(self) -> None:
        self.active = False


class Client:
    ping_interval = INTERVAL
    auto_reconnect_enabled = True

    def __init__(self, session: Session):
        self.current_session = session
        self.reconnects = 0

    def connect_to_new_endpoint(self) -> None:
        self.reconnects += 1
        self.current_session = Session(f"s{self.reconnects + 1}")


@pytest.fixture
def watched():
    now = [1_000.0]
    client = Client(Session())
    watch = PingWatch(client, clock=lambda: now[0])
    return client, watch, now


def test_a_pong_late_because_the_process_was_busy_keeps_the_connection(watched):
    client, watch, now = watched
    session = client.current_session
    watch.check()
    session.pong()
    for _ in range(3):  # the process stalls for 10 intervals between checks; the pings still go out
        now[0] += 10 * INTERVAL
        watch.check()
    session.pong()  # the reader caught up: far more than 4 intervals of wall time since the last pong
    now[0] += 10 * INTERVAL
    watch.check()
    assert session.active and client.reconnects == 0 and len(session.sent) == 5


def test_a_socket_that_stopped_answering_is_replaced_after_4_unanswered_pings(watched):
    client, watch, now = watched
    session = client.current_session
    for _ in range(4):
        watch.check()
        now[0] += INTERVAL
    assert session.active and len(session.sent) == 4  # 4 unanswered, each given an interval
    watch.check()
    assert not session.active and client.reconnects == 1 and client.current_session is not session
    assert len(session.sent) == 4, "no 5th ping on a connection taken as dead"
    watch.check()  # the new connection starts with a clean count
    assert client.current_session.active and client.current_session.sent


def test_four_quick_checks_are_not_four_intervals(watched):
    client, watch, now = watched
    for _ in range(6):  # checks come close together (a slow tick caught up): not yet 4 intervals
        watch.check()
        now[0] += INTERVAL / 10
    assert client.current_session.active and client.reconnects == 0


def test_a_ping_that_cannot_be_sent_replaces_the_connection_at_once(watched):
    client, watch, _ = watched
    client.current_session.broken = True
    broken = client.current_session
    watch.check()
    assert not broken.active and client.reconnects == 1 and client.current_session.active
