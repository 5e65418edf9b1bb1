"""KubeIncidentStore through the real kubernetes client against the Kubernetes API stand-in."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from kubeapi.server import FakeKube

from bot.app.ports import IncidentConflict, IncidentExists
from bot.app.records import Incident
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.retry import RetryPolicy

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
