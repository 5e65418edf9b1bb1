"""pytest plugin (registered in tests/conftest.py): the `slack` fixture, a started Slack Web API
stand-in. A test module that needs more (group members, faults) overrides it by taking it:
`def slack(slack): slack.group_members[...] = ...; return slack`. The `socket_mode` fixture: a
started Socket Mode endpoint whose URLs the `slack` stand-in hands out (apps.connections.open);
no ack time-out of its own (a test expires an ack with expire_ack) and a short keepalive, so a
test of re-delivery or reconnection takes a second, not a minute, and no wall-time race decides it.
The `clock` fixture: a VirtualClock, for tests that apply Slack's rate (`slack.rate = RateLimit(clock.now)`)
and pace the bot on it."""

from __future__ import annotations

import pytest

from slackapi import SlackStandIn, VirtualClock
from slackapi.socketmode import SocketModeStandIn


@pytest.fixture
def slack():
    standin = SlackStandIn().start()
    yield standin
    standin.stop()


@pytest.fixture
def clock():
    return VirtualClock()


@pytest.fixture
def socket_mode(slack):
    standin = SocketModeStandIn(ack_timeout=None, keepalive_seconds=1.0, close_after_disconnect=2.0).start()
    slack.socket_mode = standin
    yield standin
    standin.stop()
