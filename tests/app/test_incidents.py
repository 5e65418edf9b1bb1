"""Incident names and the folder store: exclusive create and compare-and-swap."""

from __future__ import annotations

import multiprocessing
import re
from datetime import UTC, datetime

import pytest

from bot.app.incidents import incident_labels, incident_name
from bot.app.ports import IncidentConflict, IncidentExists
from bot.app.records import Incident
from bot.kube.incidents import from_custom_object, to_custom_object
from bot.local.store import FolderIncidentStore

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def make(name: str = "inc-1", **kw) -> Incident:
    fields = dict(name=name, cluster="prod", namespace="inference", workload="vllm-llama3-8b",
                  cause="kv-cache-max-model-len", state="proposed", first_seen=NOW, last_seen=NOW)
    fields.update(kw)
    return Incident(**fields)


def test_name_is_deterministic_and_dns_safe():
    a = incident_name("prod", "inference", "vllm-llama3-8b", "kv-cache-max-model-len")
    assert a == incident_name("prod", "inference", "vllm-llama3-8b", "kv-cache-max-model-len")
    assert DNS_1123_LABEL.match(a)
    assert a.startswith("prod-inference-vllm-llama3-8b-kv-cache")


def test_names_differ_by_every_part_of_the_key():
    base = ("prod", "inference", "vllm", "kv-cache-max-model-len")
    names = {incident_name(*base)}
    for i, other in enumerate(["staging", "other-ns", "vllm-2", "shm-too-small"]):
        key = list(base)
        key[i] = other
        names.add(incident_name(*key))
    assert len(names) == 5
    assert incident_name("prod", "ns", "a_b", None) != incident_name("prod", "ns", "a-b", None)


def test_long_and_odd_keys_are_hashed_into_a_valid_name():
    name = incident_name("Prod.Cluster_EU", "inference", "x" * 200, "Some Cause/With Slashes")
    assert DNS_1123_LABEL.match(name) and len(name) <= 63
    assert name != incident_name("Prod.Cluster_EU", "inference", "x" * 199, "Some Cause/With Slashes")


def test_labels_are_valid_label_values():
    labels = incident_labels(make(workload="w" * 100, cause=None))
    assert all(len(v) <= 63 and re.match(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$", v) for v in labels.values())
    assert labels["cause"] == "none" and labels["posted"] == "false"


def test_folder_create_twice_fails(tmp_path):
    store = FolderIncidentStore(tmp_path)
    created = store.create(make())
    assert created.version == "1"
    with pytest.raises(IncidentExists):
        store.create(make(state="diagnosed"))
    assert store.get("inc-1").state == "proposed"


def test_folder_update_is_compare_and_swap(tmp_path):
    store = FolderIncidentStore(tmp_path)
    first = store.create(make())
    second_reader = store.get("inc-1")
    applied = store.update(first.model_copy(update={"state": "applying", "approver": "U1"}))
    assert applied.version == "2"
    with pytest.raises(IncidentConflict):
        store.update(second_reader.model_copy(update={"state": "rejected", "approver": "U2"}))
    assert store.get("inc-1").approver == "U1"


def test_folder_get_missing_and_list_by_label(tmp_path):
    store = FolderIncidentStore(tmp_path)
    assert store.get("nope") is None
    store.create(make("a"))
    store.create(make("b", namespace="other", state="diagnosed", message_id="1.2", chat_channel="C1"))
    assert [i.name for i in store.list(namespace="inference")] == ["a"]
    assert [i.name for i in store.list(state="diagnosed")] == ["b"]
    assert [i.name for i in store.list(posted="false")] == ["a"]
    assert len(store.list()) == 2


def _race(folder: str, version: str, who: str, results) -> None:
    store = FolderIncidentStore(folder)
    incident = store.get("inc-1")
    try:
        store.update(incident.model_copy(update={"approver": who, "version": version}))
        results.put(who)
    except IncidentConflict:
        results.put("lost")


def test_folder_cas_across_processes(tmp_path):
    """Eight processes try the same transition from the same version: exactly one wins."""
    store = FolderIncidentStore(tmp_path)
    store.create(make())
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_race, args=(str(tmp_path), "1", f"U{i}", results)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    outcomes = [results.get(timeout=5) for _ in procs]
    winners = [o for o in outcomes if o != "lost"]
    assert len(winners) == 1
    assert store.get("inc-1").approver == winners[0]


def test_custom_object_round_trip():
    incident = make(history=["a", "b"], restarts=7, message_id="1.2", chat_channel="C1")
    obj = to_custom_object(incident)
    assert obj["apiVersion"] == "oncall.vllm.ai/v1"
    assert obj["spec"]["state"] == "proposed" and obj["spec"]["cause"] == "kv-cache-max-model-len"
    assert obj["metadata"]["labels"]["oncall.vllm.ai/posted"] == "true"
    obj["metadata"]["resourceVersion"] = "42"
    back = from_custom_object(obj)
    assert back == incident.model_copy(update={"version": "42"})


def test_the_stored_record_keeps_the_keys_every_earlier_version_reads(tmp_path):
    """The message fields are named for any chat in the code; the records already in a cluster
    (and an older replica during a rolling upgrade) keep theirs, so nobody posts a message twice."""
    import json

    record = json.loads(to_custom_object(make(message_id="1.2", chat_channel="C1"))["spec"]["record"])
    assert (record["slack_ts"], record["slack_channel"]) == ("1.2", "C1") and "message_id" not in record
    # So does the folder store's file, and one it wrote before loads with its message.
    store = FolderIncidentStore(tmp_path)
    store.create(make("inc-2", message_id="5.6", chat_channel="C3"))
    assert json.loads((tmp_path / "inc-2.json").read_text())["slack_ts"] == "5.6"
    assert store.get("inc-2").message_ref().message_id == "5.6"
    old = make().model_dump(mode="json", exclude={"message_id", "chat_channel"})
    (tmp_path / "inc-1.json").write_text(json.dumps({**old, "slack_ts": "3.4", "slack_channel": "C2", "version": "1"}))
    loaded = store.get("inc-1")
    assert loaded is not None and loaded.message_ref() is not None and loaded.message_ref().message_id == "3.4"
