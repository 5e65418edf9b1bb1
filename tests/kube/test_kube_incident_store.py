"""KubeIncidentStore through the real kubernetes client against the Kubernetes API stand-in."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from fakes import kv_diagnosis
from kubeapi.server import FakeKube

from bot.app.ports import IncidentConflict, IncidentExists
from bot.app.records import Incident, MessageRef
from bot.diagnosis.redact import DEFAULT
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore, from_custom_object, to_custom_object
from bot.kube.retry import RetryPolicy
from bot.remedy.models import Change, Proposal, WorkloadRef

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def make(name: str = "prod-inference-llama-kv-1a2b3c4d", **kw) -> Incident:
    fields = dict(name=name, cluster="prod", namespace="inference", workload="llama",
                  cause="kv-cache-max-model-len", state="proposed", first_seen=NOW, last_seen=NOW)
    fields.update(kw)
    return Incident(**fields)


@pytest.fixture
def kube():
    fake = FakeKube().start()
    yield fake
    fake.stop()


@pytest.fixture
def store(kube):
    return KubeIncidentStore(KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, sleep=lambda s: None)),
                             "vllm-oncall")


def test_create_get_and_duplicate(store, kube):
    created = store.create(make())
    assert created.version and store.get(created.name) == created
    with pytest.raises(IncidentExists):
        store.create(make(state="diagnosed"))
    obj = kube.get("VLLMIncident", created.name, "vllm-oncall")
    assert obj["spec"]["state"] == "proposed" and obj["spec"]["cause"] == "kv-cache-max-model-len"
    assert obj["metadata"]["labels"]["oncall.vllm.ai/workload"] == "llama"
    assert store.get("no-such-incident") is None


def test_update_is_compare_and_swap_on_resource_version(store):
    first = store.create(make())
    stale = store.get(first.name)
    applied = store.update(first.model_copy(update={"state": "applying", "approver": "U1"}))
    assert applied.version != first.version and applied.approver == "U1"
    with pytest.raises(IncidentConflict):
        store.update(stale.model_copy(update={"state": "rejected", "approver": "U2"}))
    assert store.get(first.name).state == "applying"


def test_concurrent_transitions_exactly_one_wins(store):
    incident = store.create(make())
    wins: list[str] = []

    def attempt(user: str) -> None:
        try:
            store.update(incident.model_copy(update={"state": "applying", "approver": user}))
            wins.append(user)
        except IncidentConflict:
            pass

    threads = [threading.Thread(target=attempt, args=(f"U{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and store.get(incident.name).approver == wins[0]


def test_list_by_label(store):
    store.create(make("a-1", state="proposed"))
    store.create(make("b-1", namespace="other", state="diagnosed", message_id="1.2", chat_channel="C1"))
    assert [i.name for i in store.list(namespace="inference")] == ["a-1"]
    assert [i.name for i in store.list(posted="false")] == ["a-1"]
    assert [i.name for i in store.list(state="diagnosed", cluster="prod")] == ["b-1"]


def test_transient_errors_are_retried(store, kube):
    kube.fail("get", "vllmincidents", 503, times=1)
    incident = store.create(make())
    assert store.get(incident.name) == incident


def rich(name: str = "prod-inference-llama-kv-9f8e7d6c") -> Incident:
    """An incident with every part a write stores: diagnosis, proposal, history, message, group."""
    workload = WorkloadRef(kind="Deployment", namespace="inference", name="llama", container="vllm")
    proposal = Proposal(id="p1", cluster="prod", workload=workload, cause="kv-cache-max-model-len",
                        title="The KV cache cannot hold one request", json_patch=[{"op": "test", "path": "/a", "value": 1}],
                        created_at=NOW, command_before=["vllm"], command_after=["vllm"],
                        expires_at=NOW + timedelta(hours=1),
                        changes=[Change(kind="flag", name="--max-model-len", before="32768", after="18432")])
    return make(name, proposal=proposal, diagnosis=kv_diagnosis(), history=["05:00 diagnosed", "05:01 posted ✓"],
                message_id="1.2", chat_channel="C1", group=MessageRef(channel="C1", message_id="0.9"), restarts=4)


def test_a_write_reads_back_what_a_later_read_of_the_object_reads(store):
    created = store.create(rich())
    assert created == store.get(created.name)
    assert created.model_dump(mode="json") == store.get(created.name).model_dump(mode="json")
    updated = store.update(created.revised(state="approved", approver="U1", history=[*created.history, "approved"]))
    assert updated == store.get(created.name) and updated.approver == "U1" and updated.version != created.version
    assert updated.model_dump(mode="json") == store.get(created.name).model_dump(mode="json")


def test_an_answer_whose_record_is_not_the_one_sent_is_read_as_the_server_sent_it():
    """A write's answer is read from the record the server sent back (a mutating admission
    webhook, say, may have changed it), not from what was written."""
    sent = to_custom_object(make(state="proposed"), DEFAULT)
    answer = json.loads(json.dumps(sent))
    answer["metadata"]["resourceVersion"] = "7"
    assert from_custom_object(answer) == make(state="proposed", version="7")
    changed = json.loads(answer["spec"]["record"]) | {"state": "rejected", "approver": "U9"}
    answer["spec"]["record"] = json.dumps(changed)
    assert from_custom_object(answer) == make(state="rejected", approver="U9", version="7")
