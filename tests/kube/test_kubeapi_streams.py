"""The API stand-in's watch and pod proxy, held to the real `kubernetes` client: its `watch.Watch`
and its proxy call. If these disagree with the client, the watch tests above them mean nothing."""

from __future__ import annotations

import threading

import pytest
from kubeapi.objects import crashing_deployment, node
from kubeapi.vllmpod import ScriptedVllm
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

NS = "inference"


def pod(name: str, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}}


def test_watch_from_a_list_resource_version_streams_changes_in_order(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    kube_api.put(pod("a"))
    listed = core.list_namespaced_pod(NS)
    kube_api.put(pod("b"))
    kube_api.edit("Pod", "a", NS, lambda o: o["status"].update(phase="Failed"))
    kube_api.delete("Pod", "b", NS)
    seen = [(e["type"], e["object"].metadata.name, e["object"].metadata.resource_version)
            for e in watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=1,
                                          resource_version=listed.metadata.resource_version)]
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    rvs = [int(rv) for _, _, rv in seen]
    assert rvs == sorted(rvs) and rvs[0] > int(listed.metadata.resource_version)
    assert ("watch", "", "pods") in kube_api.called()


def test_watch_without_a_resource_version_starts_with_what_exists_and_honours_selectors(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    kube_api.put(pod("a", {"app": "vllm"}))
    kube_api.put(pod("b", {"app": "other"}))
    names = [e["object"].metadata.name for e in watch.Watch().stream(
        core.list_namespaced_pod, NS, label_selector="app=vllm", timeout_seconds=1)]
    assert names == ["a"]


def test_a_too_old_resource_version_is_410_gone(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    kube_api.put(pod("a"))
    old = core.list_namespaced_pod(NS).metadata.resource_version
    kube_api.put(pod("b"))
    kube_api.compact()
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=old, timeout_seconds=1))
    assert info.value.status == 410


def test_bookmarks_carry_the_current_resource_version(kube_api):
    kube_api.bookmark_seconds = 0.1
    core = client.CoreV1Api(kube_api.api_client())
    listed = core.list_namespaced_pod(NS).metadata.resource_version
    kube_api.put(node())  # not a pod: no event, but the resourceVersion moves on
    w = watch.Watch(return_type=object)
    events = list(w.stream(core.list_namespaced_pod, NS, resource_version=listed, allow_watch_bookmarks=True,
                           timeout_seconds=1))
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert int(events[-1]["raw_object"]["metadata"]["resourceVersion"]) == kube_api.resource_version


def test_dropped_watch_connections_end_the_stream_without_its_final_chunk(kube_api):
    core = client.CoreV1Api(kube_api.api_client())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            list(watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=30, resource_version="1000"))
        except BaseException as exc:  # what the client raises for a cut stream
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert kube_api.wait_for_watchers(1)
    assert kube_api.drop_watches() == 1
    thread.join(5)
    assert not thread.is_alive()
    assert errors, "a cut stream is an error to the client, not a clean end"


def test_pod_proxy_forwards_to_the_scripted_vllm_pod(kube_api):
    _, crashed = crashing_deployment(kube_api)
    name = crashed["metadata"]["name"]
    vllm = ScriptedVllm(model="m").start()
    try:
        kube_api.serve_pod(NS, name, vllm.url)
        api = kube_api.api_client()
        core = client.CoreV1Api(api)
        models = core.connect_get_namespaced_pod_proxy_with_path(f"{name}:8000", NS, "v1/models")
        assert "\"id\": \"m\"" in models or "'id': 'm'" in models
        answer = api.call_api(*api.param_serialize(
            "POST", "/api/v1/namespaces/{namespace}/pods/{name}/proxy/{path}",
            path_params={"namespace": NS, "name": f"{name}:8000", "path": "v1/completions"},
            body={"model": "m", "prompt": "Say ok", "max_tokens": 16}, header_params={"Content-Type": "application/json"}))
        answer.read()
        assert answer.status == 200 and b'"completion_tokens": 16' in answer.data
        assert vllm.requests[-1][2]["max_tokens"] == 16
        assert ("create", "", "pods/proxy") in kube_api.called() and ("get", "", "pods/proxy") in kube_api.called()
        vllm.mode = "error"
        with pytest.raises(ApiException) as info:
            core.connect_get_namespaced_pod_proxy_with_path(f"{name}:8000", NS, "v1/models")
        assert info.value.status == 500
    finally:
        vllm.stop()


def test_pod_proxy_without_a_backend_is_the_apiservers_503(kube_api):
    _, crashed = crashing_deployment(kube_api)
    core = client.CoreV1Api(kube_api.api_client())
    with pytest.raises(ApiException) as info:
        core.connect_get_namespaced_pod_proxy_with_path(crashed["metadata"]["name"], NS, "v1/models")
    assert info.value.status == 503 and "error trying to reach service" in info.value.body
