"""Owner resolution through the real client and the API stand-in: every owner on the way
(Pod -> ReplicaSet -> Deployment, Pod -> StatefulSet) is read and accepted only when its uid is the
one its reference names. Names and labels prove nothing: anyone who may create a pod may write them."""

from __future__ import annotations

import pytest
from kubeapi.objects import container, crashing_deployment, deployment, node

from bot.kube.api import KubeApi
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.remedy.ownership import resolve_owner

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


def owner_of(obj, controller=True):
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": controller}


def put_replicaset(kube_api, name, labels, owner=None):
    meta = {"name": name, "namespace": NS, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return kube_api.put({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta,
                         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                  "template": {"metadata": {"labels": labels},
                                               "spec": {"containers": [container(args=["--model", "m"])]}}}})


def put_pod(kube_api, name, labels, owner):
    kube_api.put(node())
    pod = kube_api.put({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": NS, "labels": labels, "ownerReferences": [owner]},
                        "spec": {"nodeName": "gpu-node-1", "containers": [container(args=["--model", "m"])]},
                        "status": {"phase": "Running"}})
    kube_api.set_log(NS, name, "vllm", "ValueError: boom\n")
    return pod


def rs_ref(name, uid):
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid, "controller": True}


def test_a_deployments_pod_resolves_by_reading_its_replicaset_and_deployment(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert (ref.kind, ref.name, ref.live_patch_blocked) == ("Deployment", "llama", None)
    assert ref.resource_version == kube_api.get("Deployment", "llama", NS)["metadata"]["resourceVersion"]
    rs = pod["metadata"]["ownerReferences"][0]["name"]
    assert reads == [("replicasets", rs, 200), ("deployments", "llama", 200)]


def test_a_pod_naming_a_replicaset_that_does_not_exist_is_not_resolved_by_its_labels(kube_api, cluster):
    # Issue 17 item 5: a healthy Deployment `victim`, and a pod anyone could create next to it.
    victim = kube_api.put(deployment("victim", [container(args=["--model", "m"])], NS))
    labels = {"app": "victim", "pod-template-hash": "fakehash1"}
    pod = put_pod(kube_api, "victim-fakehash1-abcde", labels, rs_ref("victim-fakehash1", "0000-forged"))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and ref.name == "victim-fakehash1"
    assert "gone" in ref.live_patch_blocked
    assert reads == [("replicasets", "victim-fakehash1", 404)]  # the Deployment is never even read
    assert victim["metadata"]["uid"] not in str(ref)


def test_a_pod_naming_a_real_replicaset_with_another_uid_is_not_its_pod(kube_api, cluster):
    dep, real = crashing_deployment(kube_api)
    rs = real["metadata"]["ownerReferences"][0]["name"]
    forged = put_pod(kube_api, f"{rs}-zzzzz", dict(real["metadata"]["labels"]), rs_ref(rs, "0000-forged"))
    ref, reads = owner_reads(kube_api, cluster, forged)
    assert ref.kind == "ReplicaSet" and "not this pod's owner" in ref.live_patch_blocked
    assert reads == [("replicasets", rs, 200)]


def test_a_replicaset_naming_a_deployment_with_another_uid_is_not_its_replicaset(kube_api, cluster):
    # A ReplicaSet created by hand, claiming the Deployment `victim` (whose uid it guessed wrong).
    kube_api.put(deployment("victim", [container(args=["--model", "m"])], NS))
    labels = {"app": "victim", "pod-template-hash": "fakehash1"}
    rs = put_replicaset(kube_api, "victim-fakehash1", labels,
                        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "victim", "uid": "0000-forged",
                         "controller": True})
    pod = put_pod(kube_api, "victim-fakehash1-abcde", labels, owner_of(rs))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "Deployment" and "not this pod's owner" in ref.live_patch_blocked
    assert reads == [("replicasets", "victim-fakehash1", 200), ("deployments", "victim", 200)]


def test_a_deployment_deleted_and_created_again_is_not_the_owner_its_replicaset_names(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    kube_api.edit("Deployment", "llama", NS, lambda o: o["metadata"].update(uid="a-new-uid"))
    ref, _ = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "Deployment" and "not this pod's owner" in ref.live_patch_blocked


def test_an_orphaned_replicaset_is_a_bare_replicaset(kube_api, cluster):
    # `kubectl delete deployment --cascade=orphan`: the ReplicaSet and its hash label stay, bare.
    labels = {"app": "llama", "pod-template-hash": "5f7d9c"}
    rs = put_replicaset(kube_api, "llama-5f7d9c", labels)
    pod = put_pod(kube_api, "llama-5f7d9c-abcde", labels, owner_of(rs))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "bare ReplicaSet" in ref.live_patch_blocked
    assert reads == [("replicasets", "llama-5f7d9c", 200)]


def test_an_argo_rollouts_replicaset_is_not_taken_for_the_deployment_of_the_same_name(kube_api, cluster):
    # Migrating to Argo Rollouts: the old Deployment `llama` (scaled to 0) still selects app=llama,
    # and the Rollout `llama` names its ReplicaSets llama-<hash>: the ReplicaSet's owner decides.
    kube_api.put(deployment("llama", [container(args=["--model", "m"])], NS))
    labels = {"app": "llama", "rollouts-pod-template-hash": "6d8f9b"}
    rs = put_replicaset(kube_api, "llama-6d8f9b", labels, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                                           "name": "llama", "uid": "u-rollout", "controller": True})
    pod = put_pod(kube_api, "llama-6d8f9b-abcde", labels, owner_of(rs))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "owned by Rollout llama" in ref.live_patch_blocked
    assert reads == [("replicasets", "llama-6d8f9b", 200)]


def test_a_foreign_replicaset_with_the_hash_label_is_owned_by_its_controller(kube_api, cluster):
    kube_api.put(deployment("llama", [container(args=["--model", "m"])], NS))
    labels = {"app": "llama-operator", "pod-template-hash": "5f7d9c"}
    rs = put_replicaset(kube_api, "llama-5f7d9c", labels, {"apiVersion": "example.com/v1", "kind": "ModelServer",
                                                           "name": "llama", "uid": "u-ms", "controller": True})
    pod = put_pod(kube_api, "llama-5f7d9c-abcde", labels, owner_of(rs))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "ReplicaSet" and "owned by ModelServer llama" in ref.live_patch_blocked
    assert reads == [("replicasets", "llama-5f7d9c", 200)]


def test_a_deployment_owned_by_another_controller_is_not_patched_live(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    kube_api.edit("Deployment", "llama", NS, lambda o: o["metadata"].update(ownerReferences=[
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "llama", "uid": "u",
         "controller": True}]))
    ref, reads = owner_reads(kube_api, cluster, pod)
    assert ref.kind == "Deployment" and "owned by InferenceService llama" in ref.live_patch_blocked
    rs = pod["metadata"]["ownerReferences"][0]["name"]
    assert reads == [("replicasets", rs, 200), ("deployments", "llama", 200)]


class Reader:
    """A WorkloadReader over a dict: resolve_owner stays pure, whatever reads for it."""

    def __init__(self, objects):
        self.objects, self.reads = objects, []

    def find_workload(self, kind, namespace, name):
        self.reads.append((kind, name))
        return self.objects.get((kind, name))


def test_resolve_owner_reads_only_through_the_reader_it_is_given():
    dep = deployment("llama", [container(args=["--model", "m"])], NS)
    dep["metadata"].update(resourceVersion="7", uid="u-dep")
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "llama-5f7d9c", "namespace": NS, "uid": "u-rs",
                       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama",
                                            "uid": "u-dep", "controller": True}]}}
    pod = {"metadata": {"name": "llama-5f7d9c-abcde", "namespace": NS,
                        "labels": {"app": "llama", "pod-template-hash": "5f7d9c"},
                        "ownerReferences": [rs_ref("llama-5f7d9c", "u-rs")]}}
    reader = Reader({("ReplicaSet", "llama-5f7d9c"): rs, ("Deployment", "llama"): dep})
    ref, obj = resolve_owner(reader, pod, "vllm")
    assert (ref.kind, ref.name, ref.resource_version) == ("Deployment", "llama", "7") and obj is dep
    assert reader.reads == [("ReplicaSet", "llama-5f7d9c"), ("Deployment", "llama")]


@pytest.mark.parametrize("kind", ["StatefulSet", "ReplicaSet"])
def test_an_owner_reference_without_a_uid_proves_nothing(kind):
    owner = {"apiVersion": "apps/v1", "kind": kind, "name": "llama", "controller": True}
    target = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "llama", "namespace": NS, "uid": "u"}}
    pod = {"metadata": {"name": "llama-0", "namespace": NS, "ownerReferences": [owner]}}
    ref, _ = resolve_owner(Reader({(kind, "llama"): target}), pod, "vllm")
    assert "not this pod's owner" in ref.live_patch_blocked
