"""Approvers per namespace (or namespace glob), optionally per channel, and `/vllm why` answered
only where a namespace's incidents are posted or to its approvers: through the service."""

from __future__ import annotations

import pytest
from fakes import FakeCluster, RecordingChat, kv_diagnosis

from bot.app.policy import ApproverScope
from bot.app.records import AlertTarget, MessageRef, Verification
from bot.app.service import OncallService, Policy
from bot.local.store import FolderIncidentStore
from bot.slack.ids import parse_scopes

DEPLOY, POD = "vllm-llama3-8b", "vllm-llama3-8b-7d9f8c6b5-x2k4p"
ALERTS, ELSEWHERE = "C0ALERTS", "C0RANDOM"  # RecordingChat posts alerts to C0ALERTS
ML_APPROVER, PROD_APPROVER, STRANGER, FLAT = "U0ML", "U0PROD", "U0STRANGER", "U0FLAT"


@pytest.fixture
def cluster():
    c = FakeCluster()
    for ns in ("ml-train", "ml-serve", "prod"):
        c.add_pod(ns, POD, DEPLOY)
    return c


@pytest.fixture
def chat():
    return RecordingChat()


def make(cluster, chat, folder, scopes="ml-*=U0ML;prod=U0PROD", **policy) -> OncallService:
    policy = {"approver_scopes": parse_scopes(scopes), "alert_channel": ALERTS, "why_scope": "channel", **policy}
    return OncallService(cluster, FolderIncidentStore(folder), chat, Policy(**policy), diagnose=kv_diagnosis)


def opened(service, namespace):
    incident = service.handle_alert(AlertTarget(namespace=namespace, pod=POD, container="vllm"))
    assert incident.state == "proposed" and incident.chat_channel == ALERTS
    return incident, MessageRef(channel=ALERTS, message_id=incident.message_id)


def test_an_approver_of_one_namespace_cannot_approve_in_another(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path)
    prod, clicked = opened(service, "prod")
    assert service.approve(prod.name, ML_APPROVER, clicked, prod.proposal.digest) == "not_allowed"
    assert service.reject(prod.name, ML_APPROVER, clicked, prod.proposal.digest) == "not_allowed"
    assert cluster.applied == [] and service.store.get(prod.name).state == "proposed"
    assert chat.told[-1][0] == ML_APPROVER and "namespace prod" in chat.told[-1][1]
    assert service.approve(prod.name, PROD_APPROVER, clicked, prod.proposal.digest) == "applied"
    assert [actor for _, actor in cluster.applied] == [f"slack:{PROD_APPROVER}"]


def test_a_glob_matches_every_namespace_it_names(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path)
    for ns in ("ml-train", "ml-serve"):
        incident, clicked = opened(service, ns)
        assert service.approve(incident.name, ML_APPROVER, clicked, incident.proposal.digest) == "applied"
        assert service.store.get(incident.name).approver == ML_APPROVER
    assert cluster.applied  # FakeCluster's proposal id has no namespace: the second finds it landed


def test_a_group_in_a_scope_approves_only_there(cluster, chat, tmp_path):
    chat.groups["S0MLTEAM"] = {"U0GROUPIE"}
    service = make(cluster, chat, tmp_path, scopes="ml-*=S0MLTEAM")
    prod, clicked = opened(service, "prod")
    assert service.approve(prod.name, "U0GROUPIE", clicked) == "not_allowed"
    ml, clicked = opened(service, "ml-serve")
    assert service.approve(ml.name, "U0GROUPIE", clicked) == "applied"


def test_a_channel_limited_approver_clicking_elsewhere_is_refused(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path, scopes="prod=U0PROD,@C0PRODOPS")
    prod, alert_message = opened(service, "prod")
    # the click in the alert channel does not count: the scope names only C0PRODOPS
    assert service.approve(prod.name, PROD_APPROVER, alert_message, prod.proposal.digest) == "not_allowed"
    assert cluster.applied == []
    service.answer_why(f"prod/{DEPLOY}", ALERTS, STRANGER)  # the alert channel: anyone may ask
    # an approver of prod asking in C0PRODOPS gets a copy there; a click on it counts
    shown = service.answer_why(f"prod/{DEPLOY}", "C0PRODOPS", PROD_APPROVER)
    copy = shown.copies[-1]
    assert copy.channel == "C0PRODOPS"
    assert service.approve(prod.name, PROD_APPROVER, copy, shown.proposal.digest) == "applied"


def test_the_flat_lists_still_approve_every_namespace_in_any_channel(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path, approver_users=frozenset({FLAT}))
    for ns in ("prod", "ml-train"):
        incident, clicked = opened(service, ns)
        assert service.approve(incident.name, FLAT, clicked, incident.proposal.digest) == "applied"
    assert service.answer_why(f"prod/{DEPLOY}", ELSEWHERE, FLAT) is not None


def test_roll_back_is_scoped_too(cluster, chat, tmp_path):
    cluster.verification = Verification(outcome="crashed", pod="new-pod", message="CrashLoopBackOff again",
                                        diagnosis=kv_diagnosis())
    service = make(cluster, chat, tmp_path)
    prod, clicked = opened(service, "prod")
    service.approve(prod.name, PROD_APPROVER, clicked)
    assert service.store.get(prod.name).state == "failed"
    assert service.roll_back(prod.name, ML_APPROVER, clicked) == "not_allowed"
    assert cluster.rolled_back == []
    assert service.roll_back(prod.name, PROD_APPROVER, clicked) == "rolled-back"


def test_why_outside_the_alert_channel_is_refused_for_a_non_approver(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path)
    posts, collected = len(chat.posts), cluster.collected
    assert service.answer_why(f"prod/{DEPLOY}", ELSEWHERE, STRANGER) is None
    assert service.answer_why(f"prod/{DEPLOY}", ELSEWHERE, ML_APPROVER) is None  # approver of ml-*, not prod
    assert len(chat.posts) == posts and cluster.collected == collected  # nothing read, nothing posted
    assert service.store.list() == []
    assert len(chat.told) == 2 and all("namespace prod" in text for _, text in chat.told)
    assert [user for user, _ in chat.told] == [STRANGER, ML_APPROVER]


def test_why_outside_the_alert_channel_is_answered_for_an_approver(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path)
    answer = service.answer_why(f"prod/{DEPLOY}", ELSEWHERE, PROD_APPROVER)
    assert answer is not None and (answer.name, ELSEWHERE) in chat.posts


def test_why_in_the_alert_channel_is_answered_for_anyone(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path)
    assert service.answer_why(f"prod/{DEPLOY}", ALERTS, STRANGER) is not None
    assert chat.posts and not chat.told


def test_why_scope_open_answers_anyone_anywhere(cluster, chat, tmp_path):
    service = make(cluster, chat, tmp_path, why_scope="open")
    assert service.answer_why(f"prod/{DEPLOY}", ELSEWHERE, STRANGER) is not None


def test_parse_scopes():
    assert parse_scopes("ml-*=U1,S2,@C3; prod=W4") == (
        ApproverScope("ml-*", frozenset({"U1"}), frozenset({"S2"}), frozenset({"C3"})),
        ApproverScope("prod", frozenset({"W4"})))
    assert parse_scopes({"ml-*": ["U1"], "prod": "U2"}) == (
        ApproverScope("ml-*", frozenset({"U1"})), ApproverScope("prod", frozenset({"U2"})))
    for bad, says in [("ml-*", "expected NAMESPACE-GLOB="), ("ml=X1", "X1 is not"), ("=U1", "namespace"),
                      ("ml=@C1", "names no approver")]:
        with pytest.raises(ValueError, match=says):
            parse_scopes(bad)
