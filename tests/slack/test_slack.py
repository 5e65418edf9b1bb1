"""Signed Slack requests through the real Bolt app; the Web API is the local stand-in.

Like bolt-python's scenario tests: requests are signed with the v0 HMAC scheme and dispatched
through the App, and every Web API call the bot makes lands in the stand-in's record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from fakes import FakeCluster, kv_diagnosis
from slack_bolt.request import BoltRequest
from slackapi import SlackStandIn
from slackapi.requests import CHANNEL, SECRET, click_body, click_payload, decision_value, signed_headers

from bot.app.policy import DEFAULT_POST_LEASE as POST_LEASE
from bot.app.records import AlertTarget, MessageRef
from bot.app.service import OncallService, Policy
from bot.http.server import BotServer
from bot.local.store import FolderIncidentStore
from bot.slack.app import build_app
from bot.slack.chat import CLIENT_TIMEOUT_SECONDS, POST_BUDGET_SECONDS, SDK_LOGGER, SlackChat, make_client
from bot.slack.payloads import ButtonClick, PayloadError, SlashCommand, click_origin, read

NS, DEPLOY, POD = "inference", "vllm-llama3-8b", "vllm-llama3-8b-7d9f8c6b5-x2k4p"
APPROVER, STRANGER = "U0APPROVER", "U0STRANGER"


def command_body(text: str, user: str = "U0ASKER", channel: str = "C0HERE") -> str:
    return urlencode({"token": "legacy", "team_id": "T0STANDIN", "team_domain": "standin", "channel_id": channel,
                      "channel_name": "inference-oncall", "user_id": user, "user_name": "asker", "command": "/vllm",
                      "text": text, "api_app_id": "A0APP", "response_url": "https://hooks.slack.invalid/commands/1",
                      "trigger_id": "1.2.3"})


class Bot:
    def __init__(self, slack: SlackStandIn, folder, ttl: timedelta = timedelta(hours=1), sleep=time.sleep,
                 diagnose=kv_diagnosis, clock=None):
        self.slack = slack
        self.cluster = FakeCluster()
        self.cluster.add_pod(NS, POD, DEPLOY)
        self.cluster.add_pod(NS, "vllm-llama3-8b-7d9f8c6b5-q9z7w", DEPLOY)
        client = make_client("xoxb-test-token", slack.url)
        self.chat = SlackChat(client, CHANNEL, max_attempts=4, backoff_seconds=0.01, sleep=sleep)
        self.service = OncallService(self.cluster, FolderIncidentStore(folder), self.chat,
                                     Policy(approver_users=frozenset({APPROVER}),
                                            approver_groups=frozenset({"S0ONCALL"}), proposal_ttl=ttl),
                                     metrics=self.chat.metrics, diagnose=diagnose,
                                     **({"clock": clock} if clock else {}))
        # token verification on: Bolt calls auth.test, which the stand-in answers
        self.app = build_app(self.service, client, signing_secret=SECRET, default_namespace=NS)

    def dispatch(self, body: str, headers=None):
        return self.app.dispatch(BoltRequest(body=body, headers=headers or signed_headers(body)))

    def alert(self):
        incident = self.service.handle_alert(AlertTarget(namespace=NS, pod=POD, container="vllm"))
        assert incident.message_id
        return incident

    def click(self, action: str, incident, user: str):
        value = decision_value(incident) if action != "vllm_rollback" else incident.name
        return self.dispatch(click_body(action, value, user, incident.message_id))


@pytest.fixture
def slack(slack):
    slack.group_members["S0ONCALL"] = ["U0GROUPIE"]
    return slack


@pytest.fixture
def bot(slack, tmp_path):
    return Bot(slack, tmp_path)


def blocks_text(call) -> str:
    return json.dumps(call.params.get("blocks"))


def has_buttons(call) -> bool:
    return any(b["type"] == "actions" for b in call.params.get("blocks") or [])


def test_bad_signature_is_rejected(bot, slack):
    body = command_body("why " + POD)
    assert bot.dispatch(body, signed_headers(body, secret="not-the-secret")).status == 401
    old = signed_headers(body, timestamp=int(time.time()) - 3600)  # a replayed request
    assert bot.dispatch(body, old).status == 401
    assert slack.posts() == [] and bot.cluster.collected == 0


def test_help_and_playbooks(bot):
    help_text = bot.dispatch(command_body("help")).body
    assert bot.dispatch(command_body("")).status == 200 and "/vllm why POD" in help_text
    playbooks = bot.dispatch(command_body("playbooks")).body
    assert "kv-cache-max-model-len" in playbooks and "--max-model-len" in playbooks


def test_why_acks_then_posts_the_diagnosis_with_buttons(bot, slack):
    response = bot.dispatch(command_body(f"why {NS}/{DEPLOY}"))
    assert response.status == 200 and "Looking at" in response.body
    assert slack.wait_for(lambda: len(slack.posts()) == 1)
    post = slack.posts()[0]
    assert post.params["channel"] == "C0HERE" and has_buttons(post)
    assert "--max-model-len" in blocks_text(post)
    # the facts, memory picture and command lines are in the thread posted with the message
    assert slack.wait_for(lambda: len(slack.details()) == 1)
    details = slack.details()[0]
    assert details.params["thread_ts"] and not has_buttons(details)
    assert "NVIDIA-L4" in blocks_text(details) and "--max-model-len" in blocks_text(details)


def test_why_unknown_pod_answers_with_close_matches(bot, slack):
    bot.dispatch(command_body("why vllm-llama3-8"))
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    told = slack.delivered("chat.postEphemeral")[0].params
    assert told["user"] == "U0ASKER" and DEPLOY in told["text"] and slack.posts() == []


def test_allowed_approve_applies_and_updates_in_place(bot, slack):
    incident = bot.alert()
    assert bot.click("vllm_approve", incident, APPROVER).status == 200
    assert slack.wait_for(lambda: len(slack.replies()) >= 2)  # applied + rollout report
    # the audit record names the approver by Slack name and id (users.info)
    assert bot.cluster.applied == [(f"p-{DEPLOY}-kv-cache-max-model-len", "user-u0approver (slack:U0APPROVER)")]
    final = slack.delivered("chat.update")[-1]
    assert final.params["ts"] == incident.message_id and not has_buttons(final)
    assert "Applied by <@U0APPROVER>" in blocks_text(final)
    assert any("GPU KV cache size" in r.params["text"] for r in slack.replies())
    assert all(r.params["thread_ts"] == incident.message_id for r in slack.replies())
    assert len(slack.posts()) == 1


def test_group_member_may_approve(bot, slack):
    incident = bot.alert()
    bot.click("vllm_approve", incident, "U0GROUPIE")
    assert slack.wait_for(lambda: bot.cluster.applied)
    assert slack.delivered("usergroups.users.list")[0].params["usergroup"] == "S0ONCALL"


def test_not_allowed_click_changes_nothing(bot, slack):
    incident = bot.alert()
    bot.click("vllm_approve", incident, STRANGER)
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    told = slack.delivered("chat.postEphemeral")[0].params
    assert told["user"] == STRANGER and "not allowed" in told["text"]
    assert bot.cluster.applied == [] and slack.delivered("chat.update") == []
    assert bot.service.store.get(incident.name).state == "proposed"


def test_expired_click_changes_nothing(slack, tmp_path):
    bot = Bot(slack, tmp_path, ttl=timedelta(seconds=-1))
    incident = bot.alert()
    bot.click("vllm_approve", incident, APPROVER)
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    assert "expired" in slack.delivered("chat.postEphemeral")[0].params["text"]
    assert bot.cluster.applied == []
    update = slack.delivered("chat.update")[-1]
    assert not has_buttons(update) and "expired" in blocks_text(update)


def test_double_click_applies_once(bot, slack):
    incident = bot.alert()
    body = click_body("vllm_approve", decision_value(incident), APPROVER, incident.message_id)
    threads = [threading.Thread(target=bot.dispatch, args=(body,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral") and len(slack.replies()) >= 2)
    assert len(bot.cluster.applied) == 1
    assert "already" in slack.delivered("chat.postEphemeral")[0].params["text"] or \
        "first" in slack.delivered("chat.postEphemeral")[0].params["text"]


def test_reject(bot, slack):
    incident = bot.alert()
    bot.click("vllm_reject", incident, APPROVER)
    assert slack.wait_for(lambda: slack.delivered("chat.update"))
    update = slack.delivered("chat.update")[-1]
    assert "Rejected by <@U0APPROVER>" in blocks_text(update) and not has_buttons(update)
    assert bot.service.store.get(incident.name).state == "rejected" and bot.cluster.applied == []


def test_rollback_button_after_a_new_crash(bot, slack):
    from bot.app.records import Verification

    bot.cluster.verification = Verification(outcome="crashed", pod="new-pod", message="exit code 1",
                                            diagnosis=kv_diagnosis())
    incident = bot.alert()
    bot.click("vllm_approve", incident, APPROVER)
    assert slack.wait_for(lambda: any(has_buttons(r) for r in slack.replies()))
    bot.click("vllm_rollback", incident, APPROVER)
    assert slack.wait_for(lambda: bot.cluster.rolled_back)
    assert slack.wait_for(lambda: any("Rolled back" in r.params["text"] for r in slack.replies()))


def test_429_is_retried_after_retry_after(slack, tmp_path):
    waits: list[float] = []
    bot = Bot(slack, tmp_path, sleep=waits.append)  # record the retry waits instead of sleeping them
    slack.fail_next("chat.postMessage", status=429, retry_after=7)
    incident = bot.alert()
    top_level = [c for c in slack.attempts("chat.postMessage") if not c.params.get("thread_ts")]
    assert len(top_level) == 2 and len(slack.posts()) == 1 and len(slack.details()) == 1
    assert waits == [7.0]  # exactly what Slack's Retry-After header asked for
    assert bot.chat.metrics.retries.labels("slack", "chat.postMessage", "ratelimited")._value.get() == 1
    assert incident.message_id


def test_a_rate_limited_post_gives_up_inside_its_post_lease_and_is_posted_once_later(slack, tmp_path):
    """Retrying a post past its lease would let another replica take the lease and post too."""
    now = [0.0]

    def sleep(seconds: float) -> None:  # time passes only when the retry waits
        now[0] += seconds

    wall = [datetime.now(UTC)]
    bot = Bot(slack, tmp_path, clock=lambda: wall[0])
    bot.chat = SlackChat(make_client("xoxb-test-token", slack.url), CHANNEL, max_attempts=5, sleep=sleep,
                         clock=lambda: now[0], metrics=bot.chat.metrics)
    bot.service = OncallService(bot.cluster, bot.service.store, bot.chat, bot.service.policy,
                                metrics=bot.chat.metrics, diagnose=kv_diagnosis, clock=lambda: wall[0])
    slack.fail_next("chat.postMessage", status=429, retry_after=12, times=10)
    incident = bot.service.handle_alert(AlertTarget(namespace=NS, pod=POD))
    # 0 s, 12 s, 24 s; a fourth attempt would start at 36 s, past the 30 s budget
    assert len(slack.attempts("chat.postMessage")) == 3 and now[0] == 24
    assert incident.message_id is None and slack.channel_messages(CHANNEL) == []
    assert now[0] + CLIENT_TIMEOUT_SECONDS < POST_LEASE.total_seconds(), "the whole post ends inside its lease"
    assert bot.service.store.get(incident.name).post_lease is None  # a 429 certainly posted nothing
    slack.clear_faults()
    bot.service.sweep()
    assert len(slack.channel_messages(CHANNEL)) == 1 and bot.service.store.get(incident.name).message_id


def test_the_post_budget_and_client_timeout_fit_the_post_lease():
    assert POST_BUDGET_SECONDS + CLIENT_TIMEOUT_SECONDS < POST_LEASE.total_seconds()


def test_update_retries_server_errors_but_post_does_not(bot, slack):
    incident = bot.alert()
    slack.fail_next("chat.update", status=500, error="internal_error")
    bot.service.handle_alert(AlertTarget(namespace=NS, pod=POD))
    assert len(slack.attempts("chat.update")) == 2 and len(slack.delivered("chat.update")) == 1
    slack.fail_next("chat.postMessage", status=500, error="internal_error")
    bot.click("vllm_reject", incident, APPROVER)  # nothing posted; just checks the app still works
    assert slack.wait_for(lambda: len(slack.delivered("chat.update")) == 2)


def test_slack_outage_keeps_the_incident_and_posts_it_later(slack, tmp_path):
    now = [datetime.now(UTC)]
    bot = Bot(slack, tmp_path, clock=lambda: now[0])
    slack.down = True  # 503: Slack may have posted it anyway, so the post lease is kept
    incident = bot.service.handle_alert(AlertTarget(namespace=NS, pod=POD))
    assert incident.message_id is None and slack.posts() == []
    assert bot.service.store.list(posted="false")[0].name == incident.name
    slack.down = False
    bot.service.sweep()
    assert slack.posts() == [], "nobody posts again while the lease of the unclear attempt runs"
    now[0] += timedelta(seconds=61)
    bot.service.sweep()  # looks in the channel's history first, finds nothing, posts
    assert len(slack.attempts("conversations.history")) == 1
    assert len(slack.posts()) == 1 and bot.service.store.get(incident.name).message_id


def test_a_post_slack_certainly_refused_is_retried_at_the_next_sweep(bot, slack):
    slack.fail_next("chat.postMessage", status=429, retry_after=0, times=4)  # rate-limited through all retries
    incident = bot.service.handle_alert(AlertTarget(namespace=NS, pod=POD))
    assert incident.message_id is None and slack.channel_messages(CHANNEL) == []
    assert bot.service.store.get(incident.name).post_lease is None  # certainly not posted: released
    bot.service.sweep()
    assert len(slack.posts()) == 1 and bot.service.store.get(incident.name).message_id


def test_signed_requests_over_http(bot, slack):
    server = BotServer(bot.service, bolt_app=bot.app).start()
    try:
        incident = bot.alert()
        body = click_body("vllm_approve", decision_value(incident), APPROVER, incident.message_id)
        headers = {k: v[0] for k, v in signed_headers(body).items()}
        req = urllib.request.Request(server.url + "/slack/events", data=body.encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        assert slack.wait_for(lambda: bot.cluster.applied)
        bad = {**headers, "x-slack-signature": "v0=" + "0" * 64}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(server.url + "/slack/events", data=body.encode(),
                                                          headers=bad), timeout=10)
        assert err.value.code == 401
    finally:
        server.stop()


def test_why_in_a_channel_the_bot_is_not_in_falls_back_to_the_alert_channel(bot, slack):
    slack.fail_next("chat.postMessage", status=200, error="not_in_channel", retry_after=None)
    bot.dispatch(command_body(f"why {NS}/{DEPLOY}", channel="C0NOTMEMBER"))
    assert slack.wait_for(lambda: len(slack.posts()) == 1)
    assert slack.posts()[0].params["channel"] == CHANNEL
    # the stand-in records the post before it answers; the bot stores the channel after the answer
    assert slack.wait_for(lambda: bot.service.store.list()[0].chat_channel == CHANNEL)


def tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info]


def test_click_without_a_value_is_answered_and_changes_nothing(bot, slack, caplog):
    incident = bot.alert()
    payload = click_payload("vllm_approve", decision_value(incident), APPROVER, incident.message_id)
    del payload["actions"][0]["value"]
    assert bot.dispatch(urlencode({"payload": json.dumps(payload)})).status == 200
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    told = slack.delivered("chat.postEphemeral")[0].params
    assert told["user"] == APPROVER and told["channel"] == CHANNEL and "could not be read" in told["text"]
    unreadable = [r.getMessage() for r in caplog.records if "could not read" in r.getMessage()]
    assert unreadable == ["could not read a button click (approve): ButtonClick: actions.0.value: Field required"]
    assert tracebacks(caplog) == [] and bot.cluster.applied == []
    assert bot.service.store.get(incident.name).state == "proposed"


@pytest.mark.parametrize("spoil", [lambda p: p.pop("user"), lambda p: p.update(user="U0APPROVER")],
                         ids=["no user", "user not an object"])
def test_click_from_nobody_is_logged_once_and_ignored(bot, slack, caplog, spoil):
    incident = bot.alert()
    payload = click_payload("vllm_approve", decision_value(incident), APPROVER, incident.message_id)
    spoil(payload)
    assert bot.dispatch(urlencode({"payload": json.dumps(payload)})).status == 200
    assert slack.wait_for(lambda: any("could not read" in r.getMessage() for r in caplog.records))
    assert tracebacks(caplog) == [] and bot.cluster.applied == []
    assert slack.delivered("chat.postEphemeral") == []  # nobody to tell
    assert bot.service.store.get(incident.name).state == "proposed"


def test_command_without_user_or_channel_is_answered_without_a_traceback(bot, slack, caplog):
    body = urlencode({"team_id": "T0STANDIN", "api_app_id": "A0APP", "command": "/vllm", "text": f"why {POD}"})
    response = bot.dispatch(body)
    assert response.status == 200 and "could not be read" in response.body
    assert [r.getMessage() for r in caplog.records if "could not read" in r.getMessage()] == [
        "could not read a /vllm command: SlashCommand: user_id: Field required; channel_id: Field required"]
    assert tracebacks(caplog) == [] and bot.cluster.collected == 0 and slack.posts() == []


def test_a_long_log_excerpt_still_posts_truncated(slack, tmp_path):
    lines = [f"line {n}: " + "RuntimeError: CUDA error: out of memory <!here> " * 8 for n in range(200)]

    def long_diagnosis(evidence=None):
        return kv_diagnosis().model_copy(update={"evidence": lines, "explanation": "x" * 5000})

    bot = Bot(slack, tmp_path, diagnose=long_diagnosis)
    incident = bot.alert()
    post = slack.posts()[0]
    assert post.ok and incident.message_id
    sections = [b["text"]["text"] for b in post.params["blocks"] if b["type"] == "section" and "text" in b]
    assert all(len(text) <= 3000 for text in sections)
    evidence = next(text for text in sections if text.startswith("*Evidence*"))
    assert "line 0: RuntimeError" in evidence and "<!here>" not in evidence  # the decisive line, on top
    details = slack.details()[0]
    thread = [b["text"]["text"] for b in details.params["blocks"] if b["type"] == "section" and "text" in b]
    assert details.ok and all(len(text) <= 3000 for text in thread)
    full = next(text for text in thread if text.startswith("*Evidence*"))
    assert full.endswith("… (truncated)") and "<!here>" not in full
    bot.click("vllm_approve", incident, APPROVER)  # the update of the same long message posts too
    assert slack.wait_for(lambda: any("Applied by <@U0APPROVER>" in blocks_text(update)
                                      for update in slack.delivered("chat.update")))


def test_click_payload_reads_into_the_fields_the_bot_uses():
    click = read(ButtonClick, click_payload("vllm_reject", "inc-1", APPROVER, "17.000100"))
    assert (click.incident, click.user_id, click.actions[0].action_id) == ("inc-1", APPROVER, "vllm_reject")
    assert click.message_ref == MessageRef(channel=CHANNEL, message_id="17.000100")
    only_container = click_payload("vllm_reject", "inc-1", APPROVER, "17.000100")
    del only_container["channel"], only_container["message"]  # Slack names the message twice; one is enough
    assert read(ButtonClick, only_container).message_ref == MessageRef(channel=CHANNEL, message_id="17.000100")
    del only_container["container"]
    assert read(ButtonClick, only_container).message_ref is None


def test_unreadable_payloads_name_what_is_missing_in_one_line():
    empty_value = click_payload("vllm_approve", "", APPROVER, "1.0")
    with pytest.raises(PayloadError) as err:
        read(ButtonClick, empty_value)
    assert str(err.value).startswith("ButtonClick: actions.0.value: ") and "\n" not in str(err.value)
    with pytest.raises(PayloadError, match="^ButtonClick: actions: "):
        read(ButtonClick, {**empty_value, "actions": []})
    assert click_origin("not a payload").user is None and click_origin({"user": 7}).channel_id is None
    asked = read(SlashCommand, {"user_id": "U1", "channel_id": "C1", "text": None})
    assert (asked.verb, asked.argument) == ("", "")
    asked = read(SlashCommand, {"user_id": "U1", "channel_id": "C1", "text": "  WHY   inference/pod-1 "})
    assert (asked.verb, asked.argument) == ("why", "inference/pod-1")


class CountedText(str):
    """A message text that counts how often it is formatted for a log line (repr), not sent (JSON)."""
    formatted = 0

    def __repr__(self) -> str:
        CountedText.formatted += 1
        return super().__repr__()


@pytest.fixture
def sdk_log_unset():
    """slack_sdk's logger as a fresh process has it (no level of its own), restored after."""
    sdk_log = logging.getLogger(SDK_LOGGER)
    level = sdk_log.level
    sdk_log.setLevel(logging.NOTSET)
    CountedText.formatted = 0
    yield sdk_log
    sdk_log.setLevel(level)


def test_a_request_is_formatted_for_the_debug_log_only_when_debug_lines_are_logged(slack, caplog, sdk_log_unset):
    caplog.set_level(logging.INFO)  # serve's default --log-level
    make_client("xoxb-test-token", slack.url).chat_postMessage(channel=CHANNEL, text=CountedText("quiet"))
    assert CountedText.formatted == 0 and slack.posts()[-1].params["text"] == "quiet"
    assert not [r for r in caplog.records if "quiet" in r.getMessage()]


def test_with_debug_logging_slack_sdk_still_logs_each_request(slack, caplog, sdk_log_unset):
    caplog.set_level(logging.DEBUG)  # --log-level DEBUG, configured before the client is made
    make_client("xoxb-test-token", slack.url).chat_postMessage(channel=CHANNEL, text=CountedText("loud"))
    assert CountedText.formatted >= 1
    assert any(r.name == SDK_LOGGER and "Sending a request" in r.getMessage() and "'loud'" in r.getMessage()
               for r in caplog.records)
