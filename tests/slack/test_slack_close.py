"""A chat closed when the server stops (bot.slack.chat.SlackChat.close): a call not yet started
never starts. A details reply's thread or a retry's back-off may outlive the server, and whatever
listens at Slack's address after it must not receive the bot's calls (a test's later Slack
stand-in on a reused port received one, and its channel held a message no bot of it had posted)."""

from __future__ import annotations

import pytest
from slackapi.requests import CHANNEL

from bot.app.ports import ChatUnavailable
from bot.slack.chat import SlackChat, make_client


def test_a_chat_closed_during_a_retry_wait_makes_no_further_attempt(slack):
    slack.fail_next("chat.postMessage", 429, "ratelimited", retry_after=1)

    def stop_while_waiting(seconds: float) -> None:  # the server stops during the back-off
        chat.close()

    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL, max_attempts=4, sleep=stop_while_waiting)
    with pytest.raises(ChatUnavailable, match="stopping") as refused:
        chat.call("chat.postMessage", chat.client.chat_postMessage, channel=CHANNEL, text="late")
    assert not refused.value.ambiguous  # certainly not sent: nobody looks for it in the channel
    assert len(slack.attempts("chat.postMessage")) == 1
    assert slack.channel_messages(CHANNEL) == []


def test_an_open_chat_retries_as_before(slack):
    slack.fail_next("chat.postMessage", 429, "ratelimited", retry_after=1)
    waits: list[float] = []
    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL, max_attempts=4, sleep=waits.append)
    chat.call("chat.postMessage", chat.client.chat_postMessage, channel=CHANNEL, text="on time")
    assert waits == [1] and len(slack.attempts("chat.postMessage")) == 2
    assert [m["text"] for m in slack.channel_messages(CHANNEL)] == ["on time"]
