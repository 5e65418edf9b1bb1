"""Owner resolution through the real client and the API stand-in: Pod -> ReplicaSet -> Deployment
in one read when the names and labels prove it, the ReplicaSet read whenever they do not."""

from __future__ import annotations

import pytest
from kubeapi.objects import container, crashing_deployment, deployment, node

from bot.kube.api import KubeApi
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.remedy.ownership import resolve_owner, selector_matches

NS = "inference"


@pytest.fixture
def cluster(kube_api):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(attempts=2, initial=0.001, sleep=lambda s: None))
    return LiveCluster(api, name="owners")


def owner_reads(kube_api, cluster, pod):
    """(the WorkloadRef, the owner reads it took: [(resource, name, HTTP status)])."""
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    before = len(kube_api.calls)
    ref = cluster.workload_for(evidence)
    return ref, [(c.resource, c.name, c.code) for c in kube_api.calls[before:]]


def put_replicaset(kube_api, name, labels, owner=None):
    meta = {"name": name, "namespace": NS, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "uid": "u-owner", "controller": True}]
    return kube_api.put({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta,
                         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                  "template": {"metadata": {"labels": labels},
                                               "spec": {"containers": [container(args=["--model", "m"])]}}}})


def put_pod(kube_api, name, labels, replicaset):
    kube_api.put(node())
    pod = kube_api.put({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": NS, "labels": labels, "ownerReferences": [
                            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replicaset, "uid": "u-rs",
                             "controller": True}]},
                        "spec": {"nodeName": "gpu-node-1", "containers": [container(args=["--model", "m"])]},
                        "status": {"phase": "Running"}})
    kube_api.set_log(NS, name, "vllm", "ValueError: boom\n")
    return pod


def test_a_deployments_pod_resolves_with_one_read_and_no_replicaset_read(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert (ref.kind, ref.name, ref.live_patch_blocked) == ("Deployment", "llama", None)
    assert ref.resource_version == kube_api.get("Deployment", "llama", NS)["metadata"]["resourceVersion"]
    assert reads == [("deployments", "llama", 200)]


def test_the_shortcut_checks_match_expressions_too(kube_api, cluster):
    dep = deployment("llama", [container(args=["--model", "m"])], NS)
    dep["spec"]["selector"] = {"matchLabels": {"app": "llama"},
                               "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}
    dep = kube_api.put(dep)
    put_replicaset(kube_api, "llama-5f7d9c", {"app": "llama", "tier": "gpu", "pod-template-hash": "5f7d9c"},
                   {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"})
    pod = put_pod(kube_api, "llama-5f7d9c-abcde", {"app": "llama", "tier": "gpu", "pod-template-hash": "5f7d9c"},
                  "llama-5f7d9c")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert (ref.kind, ref.name) == ("Deployment", "llama") and reads == [("deployments", "llama", 200)]


def test_an_orphaned_replicaset_is_read_when_its_deployment_is_gone(kube_api, cluster):
    # `kubectl delete deployment --cascade=orphan`: the ReplicaSet and its hash label stay, bare.
    labels = {"app": "llama", "pod-template-hash": "5f7d9c"}
    put_replicaset(kube_api, "llama-5f7d9c", labels)
    pod = put_pod(kube_api, "llama-5f7d9c-abcde", labels, "llama-5f7d9c")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "bare ReplicaSet" in ref.live_patch_blocked
    assert reads == [("deployments", "llama", 404), ("replicasets", "llama-5f7d9c", 200)]


def test_a_bare_replicaset_without_the_hash_label_is_read_directly(kube_api, cluster):
    put_replicaset(kube_api, "solo", {"app": "solo"})
    pod = put_pod(kube_api, "solo-abcde", {"app": "solo"}, "solo")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "bare ReplicaSet" in ref.live_patch_blocked
    assert reads == [("replicasets", "solo", 200)]


def test_a_hash_that_is_not_the_replicasets_suffix_is_not_trusted(kube_api, cluster):
    dep, _ = crashing_deployment(kube_api)
    labels = {"app": "llama", "pod-template-hash": "other"}
    put_replicaset(kube_api, "llama-5f7d9c", labels, {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"})
    pod = put_pod(kube_api, "llama-5f7d9c-zzzzz", labels, "llama-5f7d9c")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert (ref.kind, ref.name) == ("Deployment", "llama")  # found the long way
    assert reads == [("replicasets", "llama-5f7d9c", 200), ("deployments", "llama", 200)]


def test_an_argo_rollouts_replicaset_is_not_taken_for_the_deployment_of_the_same_name(kube_api, cluster):
    # Migrating to Argo Rollouts: the old Deployment `llama` (scaled to 0) still selects app=llama,
    # and the Rollout `llama` names its ReplicaSets llama-<hash>. Its pods carry
    # rollouts-pod-template-hash, not pod-template-hash: the label check sends it the long way.
    kube_api.put(deployment("llama", [container(args=["--model", "m"])], NS))
    labels = {"app": "llama", "rollouts-pod-template-hash": "6d8f9b"}
    put_replicaset(kube_api, "llama-6d8f9b", labels, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                                      "name": "llama"})
    pod = put_pod(kube_api, "llama-6d8f9b-abcde", labels, "llama-6d8f9b")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "owned by Rollout llama" in ref.live_patch_blocked
    assert reads == [("replicasets", "llama-6d8f9b", 200)]


def test_a_foreign_replicaset_with_the_hash_label_is_caught_by_the_selector(kube_api, cluster):
    # An operator's ReplicaSet named like a Deployment's, with a pod-template-hash label that
    # matches its suffix, next to a Deployment of the prefix name: that Deployment does not select
    # the pod, so it is not its owner; the ReplicaSet's ownerReference says who is.
    kube_api.put(deployment("llama", [container(args=["--model", "m"])], NS))
    labels = {"app": "llama-operator", "pod-template-hash": "5f7d9c"}
    put_replicaset(kube_api, "llama-5f7d9c", labels, {"apiVersion": "example.com/v1", "kind": "ModelServer",
                                                      "name": "llama"})
    pod = put_pod(kube_api, "llama-5f7d9c-abcde", labels, "llama-5f7d9c")
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "owned by ModelServer llama" in ref.live_patch_blocked
    assert reads == [("deployments", "llama", 200), ("replicasets", "llama-5f7d9c", 200)]


def test_a_deployment_owned_by_another_controller_goes_the_long_way(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    kube_api.edit("Deployment", "llama", NS, lambda o: o["metadata"].update(ownerReferences=[
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "llama", "uid": "u",
         "controller": True}]))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "Deployment" and "owned by InferenceService llama" in ref.live_patch_blocked
    rs = pod["metadata"]["ownerReferences"][0]["name"]
    assert reads == [("deployments", "llama", 200), ("replicasets", rs, 200), ("deployments", "llama", 200)]


class Reader:
    """A WorkloadReader over a dict: resolve_owner stays pure, whatever reads for it."""

    def __init__(self, objects):
        self.objects, self.reads = objects, []

    def find_workload(self, kind, namespace, name):
        self.reads.append((kind, name))
        return self.objects.get((kind, name))


def test_resolve_owner_reads_only_through_the_reader_it_is_given():
    dep = deployment("llama", [container(args=["--model", "m"])], NS)
    dep["metadata"]["resourceVersion"] = "7"
    pod = {"metadata": {"name": "llama-5f7d9c-abcde", "namespace": NS,
                        "labels": {"app": "llama", "pod-template-hash": "5f7d9c"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-5f7d9c",
                                             "controller": True}]}}
    reader = Reader({("Deployment", "llama"): dep})
    ref, obj = resolve_owner(reader, pod, "vllm")
    assert (ref.kind, ref.name, ref.resource_version) == ("Deployment", "llama", "7") and obj is dep
    assert reader.reads == [("Deployment", "llama")]


LABELS = {"app": "llama", "tier": "gpu"}


@pytest.mark.parametrize("selector, matches", [
    ({"matchLabels": {"app": "llama"}}, True),
    ({"matchLabels": {"app": "other"}}, False),
    ({"matchLabels": {"app": "llama", "zone": "a"}}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, False),
    ({"matchLabels": {"app": "llama"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]},
     False),
    ({"matchExpressions": [{"key": "app", "operator": "Like", "values": ["llama"]}]}, False),  # unknown: no
    ({}, False),  # an empty selector proves nothing
    (None, False),
])
def test_selector_matches(selector, matches):
    assert selector_matches(selector, LABELS) is matches
