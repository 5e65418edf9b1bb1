"""pytest plugin (registered in tests/conftest.py): the `slack` fixture, a started Slack Web API
stand-in. A test module that needs more (group members, faults) overrides it by taking it:
`def slack(slack): slack.group_members[...] = ...; return slack`."""

from __future__ import annotations

import pytest

from slackapi import SlackStandIn


@pytest.fixture
def slack():
    standin = SlackStandIn().start()
    yield standin
    standin.stop()
