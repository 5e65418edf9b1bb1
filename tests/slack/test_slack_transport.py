"""The Web API client's kept-alive connections (bot.slack.transport): calls reuse one connection,
slack_sdk's answers and errors are what they were over urllib (SlackApiError, Retry-After, a
refused connection as URLError), a connection the server closed or that idled too long is replaced
before a call is sent into it, a proxy from the environment keeps urllib's path, and the private
slack_sdk method it replaces is pinned."""

from __future__ import annotations

import inspect
import urllib.error

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slackapi.requests import CHANNEL

from bot.app.ports import ChatUnavailable
from bot.slack.chat import SlackChat, make_client, may_have_happened, retry_after_seconds, retry_reason
from bot.slack.transport import IDLE_SECONDS, KeptAliveClient, replaces_slack_sdk


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_calls_reuse_one_connection(slack):
    client = make_client("xoxb-test-token", slack.url)
    for n in range(3):
        assert client.chat_postMessage(channel=CHANNEL, text=f"message {n}")["ok"]
    assert client.auth_test()["user_id"] == slack.BOT_USER
    assert slack.connections == 1 and client.pool is not None and client.pool.opened == 1
    assert [m["text"] for m in slack.channel_messages(CHANNEL)] == ["message 0", "message 1", "message 2"]


def test_slack_sdk_errors_are_as_over_urllib(slack):
    client = make_client("xoxb-test-token", slack.url)
    slack.fail_next("chat.update", 429, "ratelimited", retry_after=3)
    with pytest.raises(SlackApiError) as limited:
        client.chat_update(channel=CHANNEL, ts="1.0", text="x")
    assert limited.value.response.status_code == 429 and retry_after_seconds(limited.value) == 3
    assert retry_reason("chat.update", limited.value) == "ratelimited"
    slack.fail_next("chat.postMessage", 500, "internal_error")
    with pytest.raises(SlackApiError) as failed:
        client.chat_postMessage(channel=CHANNEL, text="x")
    assert failed.value.response.status_code == 500 and may_have_happened(failed.value)
    slack.not_member.add("C0ELSEWHERE")
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0ELSEWHERE", text="x")
    assert refused.value.response["error"] == "not_in_channel" and not may_have_happened(refused.value)
    assert client.auth_test()["ok"]  # the connection survived the error answers
    assert slack.connections == 1


def test_a_refused_connection_is_a_urlerror_that_certainly_sent_nothing(slack):
    client = make_client("xoxb-test-token", slack.url)
    slack.stop()
    with pytest.raises(urllib.error.URLError) as refused:
        client.chat_postMessage(channel=CHANNEL, text="x")
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    assert retry_reason("chat.postMessage", refused.value) == "connection_refused"
    assert not may_have_happened(refused.value)


def test_a_stopped_slack_is_not_reached_through_a_kept_connection(slack):
    client = make_client("xoxb-test-token", slack.url)
    assert client.auth_test()["ok"]
    slack.stop()
    with pytest.raises(urllib.error.URLError):
        client.chat_postMessage(channel=CHANNEL, text="after the stop")
    assert slack.channel_messages(CHANNEL) == []


def test_a_connection_the_server_closed_while_idle_is_replaced_before_a_post(slack):
    client = make_client("xoxb-test-token", slack.url)
    assert client.chat_postMessage(channel=CHANNEL, text="first")["ok"]
    slack.close_connections()  # as a server ends an idle kept-alive connection
    assert client.chat_postMessage(channel=CHANNEL, text="second")["ok"]
    assert slack.connections == 2
    assert [m["text"] for m in slack.channel_messages(CHANNEL)] == ["first", "second"]


def test_a_connection_idle_too_long_is_not_trusted(slack):
    clock = Clock()
    client = KeptAliveClient(token="xoxb-test-token", base_url=slack.url, retry_handlers=[], clock=clock)
    assert client.auth_test()["ok"]
    clock.now += IDLE_SECONDS - 1
    assert client.auth_test()["ok"]
    assert slack.connections == 1
    clock.now += IDLE_SECONDS + 1
    assert client.auth_test()["ok"]
    assert slack.connections == 2


def test_an_answer_dropped_after_the_post_is_ambiguous_and_the_next_call_reconnects(slack):
    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL, max_attempts=3, sleep=lambda _: None)
    slack.fail_next("chat.postMessage", drop=True)  # posted, then the connection closed without an answer
    with pytest.raises(ChatUnavailable) as unclear:
        chat.call("chat.postMessage", chat.client.chat_postMessage, channel=CHANNEL, text="maybe")
    assert unclear.value.ambiguous  # never re-sent: the poster looks for it before posting again
    assert len(slack.attempts("chat.postMessage")) == 1
    chat.call("chat.postMessage", chat.client.chat_postMessage, channel=CHANNEL, text="next")
    assert [m["text"] for m in slack.channel_messages(CHANNEL)] == ["maybe", "next"]


def test_a_proxy_in_the_environment_keeps_urllibs_path(slack, monkeypatch):
    # The stand-in answers a proxied request too (its target is an absolute URL): urllib's path
    # opens a connection per call, as before this transport.
    monkeypatch.setenv("http_proxy", slack.url.removesuffix("/api/"))
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    client = make_client("xoxb-test-token", slack.url)
    assert client.pool is None
    assert client.auth_test()["ok"] and client.auth_test()["ok"]
    assert slack.connections == 2


def test_closing_the_chat_closes_the_idle_connections(slack):
    chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL)
    chat.check()
    chat.close()
    assert slack.wait_for(lambda: not slack._open)


def test_the_replaced_slack_sdk_method_is_the_one_it_calls():
    """slack_sdk's private method, pinned: its name and parameters, and that the client's calls go
    through it (the tests above: a second call on the same connection)."""
    method = WebClient._perform_urllib_http_request_internal
    assert list(inspect.signature(method).parameters) == ["self", "url", "req"]
    assert "_perform_urllib_http_request_internal(url, req)" in inspect.getsource(
        WebClient._perform_urllib_http_request)


def test_only_the_slack_sdk_releases_whose_method_it_replaces_get_kept_connections(slack):
    """A slack_sdk release outside REPLACES_SLACK_SDK (an upgrade) takes urllib's path: a new
    connection per call, every call still answered; the installed release is one it replaces."""
    assert replaces_slack_sdk()  # the locked release: the tests above run the kept-alive path
    assert [replaces_slack_sdk(v) for v in ("3.27.0", "3.48.0", "3.26.2", "3.49.0", "4.0.0", "dev")] == \
        [True, True, False, False, False, False]
    client = KeptAliveClient(token="xoxb-test-token", base_url=slack.url, retry_handlers=[], slack_sdk_version="3.49.0")
    assert client.pool is None
    before = slack.connections
    for _ in range(2):
        assert client.auth_test()["ok"]
    assert slack.connections == before + 2
