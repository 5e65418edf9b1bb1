"""The vllmincidents.oncall.vllm.ai/v1 custom resource on the API stand-in: create (409 on a duplicate
name), get, merge patch and JSON Patch with resourceVersion conflicts, replace, list by label."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bot.kube.api import KubeApi
from bot.kube.errors import KubeConflict, KubeNotFound

G, V, NS, PLURAL = "oncall.vllm.ai", "v1", "vllm-oncall", "vllmincidents"


def incident(name: str, state: str = "proposed", cause: str = "kv-cache-max-model-len") -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "VLLMIncident",
            "metadata": {"name": name, "labels": {f"{G}/state": state, f"{G}/cause": cause}},
            "spec": {"cluster": "prod", "namespace": "inference", "workload": "llama", "cause": cause,
                     "state": state, "approver": "", "change": "--max-model-len: 32768 -> 8192", "record": "{}"}}


@pytest.fixture
def api(kube_api):
    return KubeApi(kube_api.api_client())


def test_create_get_and_duplicate_name_is_409_already_exists(api):
    created = api.create_custom(G, V, NS, PLURAL, incident("prod-inference-llama-kv"))
    assert created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    assert created["metadata"]["namespace"] == NS
    with pytest.raises(KubeConflict) as info:
        api.create_custom(G, V, NS, PLURAL, incident("prod-inference-llama-kv"))
    assert info.value.status == 409 and info.value.reason == "AlreadyExists"
    assert "already exists" in str(info.value)
    got = api.get_custom(G, V, NS, PLURAL, "prod-inference-llama-kv")
    assert got["spec"]["change"] == "--max-model-len: 32768 -> 8192"


def test_get_missing_is_404_not_found(api):
    with pytest.raises(KubeNotFound) as info:
        api.get_custom(G, V, NS, PLURAL, "nope")
    assert info.value.status == 404 and info.value.reason == "NotFound"


def test_merge_patch_with_resource_version_is_compare_and_swap(api):
    rv = api.create_custom(G, V, NS, PLURAL, incident("i1"))["metadata"]["resourceVersion"]
    patched = api.patch_custom(G, V, NS, PLURAL, "i1", {"metadata": {"resourceVersion": rv},
                                                        "spec": {"state": "approved", "approver": "U_ALICE"}})
    assert patched["spec"]["state"] == "approved" and patched["spec"]["cause"] == "kv-cache-max-model-len"
    assert int(patched["metadata"]["resourceVersion"]) > int(rv)
    with pytest.raises(KubeConflict) as info:  # a second approver with the old version loses
        api.patch_custom(G, V, NS, PLURAL, "i1", {"metadata": {"resourceVersion": rv}, "spec": {"state": "rejected"}})
    assert info.value.status == 409 and info.value.reason == "Conflict"
    assert api.get_custom(G, V, NS, PLURAL, "i1")["spec"]["state"] == "approved"


def test_json_patch_with_test_op(api):
    api.create_custom(G, V, NS, PLURAL, incident("i2"))
    ok = api.patch_custom(G, V, NS, PLURAL, "i2", [{"op": "test", "path": "/spec/state", "value": "proposed"},
                                                   {"op": "replace", "path": "/spec/state", "value": "applying"}])
    assert ok["spec"]["state"] == "applying"
    with pytest.raises(KubeConflict) as info:  # the failed `test` op: the object changed
        api.patch_custom(G, V, NS, PLURAL, "i2", [{"op": "test", "path": "/spec/state", "value": "proposed"},
                                                  {"op": "replace", "path": "/spec/state", "value": "applying"}])
    assert info.value.status == 422


def test_replace_checks_resource_version(api, kube_api):
    """PUT (the bot does not use it; the stand-in serves it as the API does)."""
    custom = client.CustomObjectsApi(kube_api.api_client())
    created = api.create_custom(G, V, NS, PLURAL, incident("i3"))
    body = {**created, "spec": {**created["spec"], "state": "expired"}}
    replaced = custom.replace_namespaced_custom_object(G, V, NS, PLURAL, "i3", body)
    assert replaced["spec"]["state"] == "expired"
    with pytest.raises(ApiException) as info:
        custom.replace_namespaced_custom_object(G, V, NS, PLURAL, "i3", body)  # the old resourceVersion
    assert info.value.status == 409


def test_list_by_label(api):
    api.create_custom(G, V, NS, PLURAL, incident("a", state="proposed"))
    api.create_custom(G, V, NS, PLURAL, incident("b", state="applied"))
    api.create_custom(G, V, NS, PLURAL, incident("c", state="proposed", cause="shm-too-small"))
    names = lambda sel: sorted(i["metadata"]["name"] for i in api.list_custom(G, V, NS, PLURAL, sel))  # noqa: E731
    assert names(f"{G}/state=proposed") == ["a", "c"]
    assert names(f"{G}/state=proposed,{G}/cause=shm-too-small") == ["c"]
    assert names(f"{G}/state!=proposed") == ["b"]
    assert names(f"{G}/state in (applied,expired)") == ["b"]
    assert names(None) == ["a", "b", "c"]


def test_the_slack_sides_incident_store_works_against_the_stand_in(kube_api):
    """bot.kube.incidents.KubeIncidentStore (the Slack side's store) through the real client."""
    from bot.app.ports import IncidentConflict, IncidentExists
    from bot.app.records import Incident
    from bot.kube.incidents import KubeIncidentStore

    store = KubeIncidentStore(KubeApi(kube_api.api_client()), NS)
    now = datetime.now(UTC)
    first = store.create(Incident(name="prod-inference-llama-kv", cluster="prod", namespace="inference",
                                  workload="llama", cause="kv-cache-max-model-len", state="proposed",
                                  first_seen=now, last_seen=now))
    with pytest.raises(IncidentExists):
        store.create(first)
    approved = store.update(first.model_copy(update={"state": "approved", "approver": "U_ALICE"}))
    with pytest.raises(IncidentConflict):
        store.update(first.model_copy(update={"state": "rejected"}))
    assert store.get(first.name).state == "approved" == approved.state
    assert [i.name for i in store.list(state="approved")] == [first.name]
