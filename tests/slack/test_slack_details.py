"""The details reply that follows a paced incident post (SlackChat.post_incident): posted later, on
one of a few threads (DETAILS_THREADS, not a thread per reply), in its message's thread, once per
message; after the chat is closed a reply still waiting never starts."""

from __future__ import annotations

import threading

from slackapi.requests import CHANNEL
from test_slack_blocks import incident

from bot.app.pacing import Pacer, PaceRules
from bot.slack.chat import DETAILS_THREADS, SlackChat, make_client


def details_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("slack-details")]


def test_details_replies_follow_their_messages_on_a_few_threads(slack):
    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL,
                     pacer=Pacer(PaceRules(post_interval=0, update_interval=0)))
    before = set(details_threads())
    refs = [chat.post_incident(incident().revised(name=f"incident-{n}")) for n in range(12)]
    assert slack.wait_for(lambda: len(slack.details()) == 12)
    assert sorted(d.params["thread_ts"] for d in slack.details()) == sorted(r.message_id for r in refs)
    assert len(set(details_threads()) - before) <= DETAILS_THREADS
    chat.close()


def test_a_reply_still_waiting_when_the_chat_closes_never_starts(slack):
    release = threading.Event()
    paused: list[float] = []

    def sleep(seconds: float) -> None:  # a details reply waits here for its channel's turn
        paused.append(seconds)
        release.wait(60)

    # One post a second per channel, on a clock that stands still: each incident in a channel of
    # its own, so its message goes out at once and its details reply waits for the next turn.
    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL,
                     pacer=Pacer(PaceRules(post_interval=1, update_interval=0), clock=lambda: 0.0, sleep=sleep))
    for n in range(DETAILS_THREADS + 3):
        chat.post_incident(incident().revised(name=f"incident-{n}"), channel=f"C0CHANNEL{n}")
    assert slack.wait_for(lambda: len(paused) == DETAILS_THREADS)  # the others are queued behind them
    chat.close()
    release.set()
    assert slack.wait_for(lambda: not any(t.is_alive() for t in chat._details._threads))
    assert len(paused) == DETAILS_THREADS  # the queued replies never started
    assert len(slack.posts()) == DETAILS_THREADS + 3 and slack.details() == []  # those under way were refused
