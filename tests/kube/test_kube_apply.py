"""Proposals, conditional patches, audit, rollback, owner resolution and GitOps detection, through the
real kubernetes client against the local API stand-in."""

from __future__ import annotations

import json

import pytest
from kubeapi.objects import container, crashing_deployment, deployment, start_pod

from bot.app.workload_ops import ChangeToUndo
from bot.diagnosis.models import Change, DiagnosisResult
from bot.diagnosis.playbooks import Playbook
from bot.kube.api import KubeApi
from bot.kube.errors import KubeForbidden
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.remedy.plan import AUDIT_ANNOTATION, AUDIT_MAX_BYTES, AUDIT_MAX_RECORDS

NS = "inference"


def diagnosis(*changes: Change, cause: str = "kv-cache-max-model-len") -> DiagnosisResult:
    return DiagnosisResult(cause=cause, title="max-model-len does not fit the KV cache", explanation="test",
                           changes=list(changes))


MAX_LEN = Change(kind="flag", name="--max-model-len", before="32768", after="8192")


# The patch mechanics below mix every kind of change under one cause; this playbook allows them.
# (Real playbooks allow far less: see test_a_change_outside_the_playbook_is_refused.)
MECHANICS_PLAYBOOK = Playbook.model_validate({
    "id": "kv-cache-max-model-len", "title": "t", "summary": "s", "priority": 1, "explanation": "e",
    "when": [{"signal": "oom_any"}],
    "fixes": [{"changes": [{"kind": kind, "name": name, "value": "enforce_eager_on"} for kind, name in [
        ("flag", "--max-model-len"), ("flag", "--gpu-memory-utilization"), ("flag", "--enforce-eager"),
        ("volume", "/dev/shm"), ("env", "VLLM_LOGGING_LEVEL"), ("env", "PYTORCH_CUDA_ALLOC_CONF"),
        ("resources", "limits.memory"), ("resources", "limits.nvidia.com/gpu"), ("probe", "startupProbe")]]}]})


@pytest.fixture
def cluster(kube_api):
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, sleep=lambda s: None))
    return LiveCluster(api, name="test-cluster", poll_seconds=0.001, playbooks=[MECHANICS_PLAYBOOK])


def live_container(kube_api, name: str = "llama", kind: str = "Deployment") -> dict:
    return kube_api.get(kind, name, NS)["spec"]["template"]["spec"]["containers"][0]


def propose(cluster, kube_api, pod, *changes):
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    return cluster.propose(diagnosis(*(changes or (MAX_LEN,))), evidence, cluster.workload_for(evidence))


# ---- every command-line shape, applied for real -----------------------------------------------

SHAPES = [
    ({"command": ["vllm", "serve", "m", "--max-model-len", "32768"]},
     {"command": ["vllm", "serve", "m", "--max-model-len", "8192"]}),
    ({"args": ["--model", "m", "--max-model-len", "32768"]}, {"args": ["--model", "m", "--max-model-len", "8192"]}),
    ({"command": ["/bin/sh", "-c", "vllm serve m --max-model-len=32768 --port 8000 2>&1 | tee /tmp/log"]},
     {"command": ["/bin/sh", "-c", "vllm serve m --max-model-len=8192 --port 8000 2>&1 | tee /tmp/log"]}),
    ({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
      "args": ["--model", "m", "--max-model-len", "32768"]},
     {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
      "args": ["--model", "m", "--max-model-len", "8192"]}),
    ({"args": ["--model=m", "--max-model-len=32768"]}, {"args": ["--model=m", "--max-model-len=8192"]}),
    ({"args": ["--model", "m", "--max_model_len", "32768"]}, {"args": ["--model", "m", "--max_model_len", "8192"]}),
    ({"args": ["--max-model-len", "16384", "--model", "m", "--max_model_len=32768"]},
     {"args": ["--model", "m", "--max_model_len=8192"]}),
]


@pytest.mark.parametrize("shape, expected", SHAPES, ids=["vllm-serve-command", "args-only", "sh-c", "api_server",
                                                         "flag=value", "underscores", "duplicates"])
def test_every_command_line_shape_is_patched_in_its_own_spelling(kube_api, cluster, shape, expected):
    _, pod = crashing_deployment(kube_api, containers=[container(**shape)])
    proposal = propose(cluster, kube_api, pod)

    assert proposal.dry_run_ok is True, proposal.dry_run_message
    assert any(c.dry_run and c.verb == "patch" for c in kube_api.calls), "a server-side dry run was made"
    assert live_container(kube_api).get("args") == shape.get("args"), "the dry run persisted nothing"

    result = cluster.apply(proposal, "U_ALICE")

    assert result.ok, result.message
    now = live_container(kube_api)
    assert {k: now[k] for k in ("command", "args") if k in now} == expected
    assert result.workload.resource_version == kube_api.get("Deployment", "llama", NS)["metadata"]["resourceVersion"]


def test_patch_has_test_ops_on_every_changed_field_and_the_resource_version(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m"])])
    proposal = propose(cluster, kube_api, pod, MAX_LEN, Change(kind="volume", name="/dev/shm", after="8Gi"),
                       Change(kind="env", name="VLLM_LOGGING_LEVEL", after="DEBUG"))
    tests = {op["path"]: op["value"] for op in proposal.json_patch if op["op"] == "test"}
    base = "/spec/template/spec/containers/0"
    assert tests["/metadata/resourceVersion"] == dep["metadata"]["resourceVersion"]
    assert tests[f"{base}/name"] == "vllm"
    assert tests[f"{base}/args"] == ["--model", "m"]
    writes = {op["path"] for op in proposal.json_patch if op["op"] != "test"}
    assert writes == {f"{base}/args", f"{base}/env", f"{base}/volumeMounts", "/spec/template/spec/volumes"}
    assert proposal.container_before["args"] == ["--model", "m"]
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok and result.changed_fields == ["args", "env", "volumeMounts", "volumes"]


def test_shm_resources_env_and_startup_probe_pass_server_validation(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(
        args=["--model", "m"], livenessProbe={"httpGet": {"path": "/health", "port": 8000}})])
    probe = json.dumps({"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 60})
    proposal = propose(cluster, kube_api, pod,
                       Change(kind="volume", name="/dev/shm", after="16Gi"),
                       Change(kind="resources", name="limits.memory", before="32Gi", after="48Gi"),
                       Change(kind="resources", name="limits.nvidia.com/gpu", before="1", after="2"),
                       Change(kind="env", name="PYTORCH_CUDA_ALLOC_CONF", after="expandable_segments:True"),
                       Change(kind="probe", name="startupProbe", after=probe))
    assert proposal.dry_run_ok, proposal.dry_run_message
    assert cluster.apply(proposal, "U_ALICE").ok
    c = live_container(kube_api)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2", "memory": "48Gi"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["startupProbe"]["failureThreshold"] == 60
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_dry_run_refusal_is_reported_on_the_proposal(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("patch", "deployments", 422, times=1, message='Deployment.apps "llama" is invalid: denied by policy')
    proposal = propose(cluster, kube_api, pod)
    assert proposal.dry_run_ok is False
    assert "denied by policy" in proposal.dry_run_message


# ---- the workload changed between proposal and approval ------------------------------------------

def test_concurrent_edit_between_proposal_and_approval_is_refused_with_the_diff(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod)

    def someone_edits(obj):
        obj["spec"]["template"]["spec"]["containers"][0]["args"] = ["--model", "m", "--max-model-len", "16384"]

    kube_api.edit("Deployment", "llama", NS, someone_edits)
    patches_before = len([c for c in kube_api.calls if c.verb == "patch" and not c.dry_run])

    result = cluster.apply(proposal, "U_ALICE")

    assert result.ok is False and result.conflict is True
    assert result.changed_fields == ["args"]
    assert "16384" in result.message and "32768" in result.message and "re-diagnose" in result.message
    assert live_container(kube_api)["args"][-1] == "16384", "their edit stands"
    assert len([c for c in kube_api.calls if c.verb == "patch" and not c.dry_run]) == patches_before


def test_spec_edit_elsewhere_is_a_conflict_but_a_status_update_is_not(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    proposal = propose(cluster, kube_api, pod)
    # The Deployment controller writes status: resourceVersion moves, generation does not.
    kube_api.edit("Deployment", "llama", NS, lambda o: o.setdefault("status", {}).update({"replicas": 1}))
    assert cluster.apply(proposal, "U_ALICE").ok

    proposal = propose(cluster, kube_api, pod, Change(kind="flag", name="--max-model-len", after="4096"))
    kube_api.edit("Deployment", "llama", NS, lambda o: o["spec"].update({"replicas": 3}))
    result = cluster.apply(proposal, "U_ALICE")
    assert result.conflict is True and "generation" in result.message


def test_lost_race_between_read_and_patch_is_a_conflict(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    proposal = propose(cluster, kube_api, pod)
    kube_api.fail("patch", "deployments", 409, times=1)
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok is False and result.conflict is True and "changed while patching" in result.message


def test_the_server_rejects_a_stale_test_op_with_422(kube_api):
    """The stand-in itself, through KubeApi: a failed `test` is 422 and a stale resourceVersion in
    the body is 409, both a KubeConflict; a schema violation is 422 KubeInvalid."""
    from bot.kube.errors import KubeConflict, KubeInvalid

    crashing_deployment(kube_api)
    api = KubeApi(kube_api.api_client())
    with pytest.raises(KubeConflict) as info:
        api.patch_workload("Deployment", NS, "llama", [
            {"op": "test", "path": "/spec/replicas", "value": 7}, {"op": "replace", "path": "/spec/replicas",
                                                                   "value": 2}])
    assert info.value.status == 422 and info.value.reason == "Invalid"
    with pytest.raises(KubeConflict) as info:
        api.patch_workload("Deployment", NS, "llama", [{"op": "replace", "path": "/metadata/resourceVersion",
                                                        "value": "1"}])
    assert info.value.status == 409 and info.value.reason == "Conflict"
    with pytest.raises(KubeInvalid) as invalid:
        api.patch_workload("Deployment", NS, "llama", [{"op": "replace", "path": "/spec/replicas",
                                                        "value": "two"}])
    assert invalid.value.status == 422 and not isinstance(invalid.value, KubeConflict)


# ---- audit and rollback ----------------------------------------------------------------------------

def test_apply_writes_a_bounded_audit_annotation_and_an_event(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    for value in range(1000, 1008):
        proposal = propose(cluster, kube_api, pod, Change(kind="flag", name="--max-model-len", after=str(value)))
        assert cluster.apply(proposal, f"U{value}").ok

    text = kube_api.get("Deployment", "llama", NS)["metadata"]["annotations"][AUDIT_ANNOTATION]
    records = json.loads(text)
    assert len(records) == AUDIT_MAX_RECORDS and len(text.encode()) <= AUDIT_MAX_BYTES
    last = records[-1]
    assert last["who"] == "U1007" and last["cause"] == "kv-cache-max-model-len" and last["action"] == "change"
    assert last["before"]["args"][-1] == "1006" and last["after"]["args"][-1] == "1007"
    assert last["id"] == proposal.id and last["when"].endswith("Z")
    events = [e for e in kube_api.list("Event", NS) if e["involvedObject"]["kind"] == "Deployment"]
    assert len(events) == 8
    assert events[0]["reason"] == "VllmOncallChange" and "U1000" in events[0]["message"]
    assert events[0]["involvedObject"]["name"] == "llama" and events[0]["source"]["component"] == "vllm-oncall"


def test_rollback_restores_exactly_the_previous_fields(kube_api, cluster):
    original = ["--model", "m", "--max_model_len=32768", "--max_model_len=32768"]
    _, pod = crashing_deployment(kube_api, containers=[container(args=original)])
    before = live_container(kube_api)
    proposal = propose(cluster, kube_api, pod, MAX_LEN, Change(kind="volume", name="/dev/shm", after="8Gi"))
    assert cluster.apply(proposal, "U_ALICE").ok
    assert live_container(kube_api)["args"] == ["--model", "m", "--max_model_len=8192"]

    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB")

    assert result.ok, result.message
    after = live_container(kube_api)
    assert after == before, "args (duplicates included), mounts: exactly as they were"
    assert "volumes" not in kube_api.get("Deployment", "llama", NS)["spec"]["template"]["spec"]
    records = json.loads(kube_api.get("Deployment", "llama", NS)["metadata"]["annotations"][AUDIT_ANNOTATION])
    assert records[-1]["action"] == "rollback" and records[-1]["who"] == "U_BOB"
    assert records[0]["rolled_back_by"] == records[-1]["id"]
    assert any(e["reason"] == "VllmOncallRollback" for e in kube_api.list("Event", NS))
    again = cluster.rollback(NS, "Deployment", "llama", "U_BOB")
    assert again.ok is False and "left to roll back" in again.message


def test_rollback_refuses_when_someone_edited_after_the_change(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    assert cluster.apply(propose(cluster, kube_api, pod), "U_ALICE").ok
    kube_api.edit("Deployment", "llama", NS, lambda o: o["spec"]["template"]["spec"]["containers"][0]["args"]
                  .append("--enforce-eager"))
    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB")
    assert result.ok is False and result.conflict is True and "--enforce-eager" in result.message
    assert live_container(kube_api)["args"][-1] == "--enforce-eager"


def test_workload_deleted_before_approval_is_reported(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    proposal = propose(cluster, kube_api, pod)
    kube_api.delete("Deployment", "llama", NS)
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok is False and "no longer exists" in result.message
    assert cluster.rollback(NS, "Deployment", "llama", "U_BOB").ok is False


def test_403_on_patch_names_patch_on_deployments(kube_api, cluster):
    _, pod = crashing_deployment(kube_api)
    proposal = propose(cluster, kube_api, pod)
    kube_api.fail("patch", "deployments", 403)
    with pytest.raises(KubeForbidden) as info:
        cluster.apply(proposal, "U_ALICE")
    assert "may not patch deployments.apps in namespace inference" in str(info.value)


# ---- owners: StatefulSet, bare Pod, Job, foreign controllers, GitOps -------------------------------

def test_statefulset_is_resolved_and_patched(kube_api, cluster):
    sts = deployment("qwen", [container(args=["--model", "q", "--max-model-len", "32768"])], NS)
    sts["kind"] = "StatefulSet"
    sts["spec"]["serviceName"] = "qwen"
    sts = kube_api.put(sts)
    pod = start_pod(kube_api, sts, "crashloop", previous_log="boom\n", suffix="0")
    proposal = propose(cluster, kube_api, pod)
    assert proposal.workload.kind == "StatefulSet" and proposal.workload.name == "qwen"
    assert cluster.apply(proposal, "U_ALICE").ok
    assert live_container(kube_api, "qwen", "StatefulSet")["args"][-1] == "8192"


def test_bare_pod_gets_a_manifest_change_not_a_patch(kube_api, cluster):
    kube_api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "solo", "namespace": NS},
                  "spec": {"nodeName": "gpu-node-1", "containers": [container(args=["--max-model-len", "32768"])]},
                  "status": {"phase": "Running"}})
    kube_api.set_log(NS, "solo", "vllm", "boom\n")
    proposal = propose(cluster, kube_api, {"metadata": {"name": "solo"}})
    assert proposal.workload.kind == "Pod" and "bare Pod" in proposal.workload.live_patch_blocked
    assert proposal.json_patch == [] and proposal.dry_run_ok is None
    assert "+- '8192'" in proposal.manifest_diff
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok is False and not [c for c in kube_api.calls if c.verb == "patch"]


@pytest.mark.parametrize("owner, expected", [
    ({"apiVersion": "batch/v1", "kind": "Job", "name": "bench"}, "Job"),
    ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "lws"}, "LeaderWorkerSet lws"),
])
def test_job_and_foreign_pod_owners_are_not_patched(kube_api, cluster, owner, expected):
    kube_api.put({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "p", "namespace": NS, "ownerReferences": [{**owner, "uid": "u",
                                                                                   "controller": True}]},
                  "spec": {"containers": [container(args=["--max-model-len", "32768"])]}})
    kube_api.set_log(NS, "p", "vllm", "boom\n")
    proposal = propose(cluster, kube_api, {"metadata": {"name": "p"}})
    assert expected in proposal.workload.live_patch_blocked
    assert proposal.manifest_diff and not proposal.json_patch


def test_deployment_owned_by_kserve_is_not_patched(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api)
    kube_api.edit("Deployment", "llama", NS, lambda o: o["metadata"].update(ownerReferences=[
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "llama", "uid": "u",
         "controller": True}]))
    proposal = propose(cluster, kube_api, pod)
    assert proposal.workload.kind == "Deployment"
    assert "owned by InferenceService llama" in proposal.workload.live_patch_blocked
    assert cluster.apply(proposal, "U_ALICE").ok is False


@pytest.mark.parametrize("labels, annotations, managed_by, who", [
    ({}, {"argocd.argoproj.io/tracking-id": "llm-prod:apps/Deployment:inference/llama"}, "argocd",
     "Argo CD application llm-prod"),
    ({"app.kubernetes.io/instance": "llm-prod"}, {"argocd.argoproj.io/sync-options": "ServerSideApply=true"},
     "argocd", "Argo CD application llm-prod"),
    ({"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}, {},
     "flux", "Flux Kustomization flux-system/apps"),
    ({"helm.toolkit.fluxcd.io/name": "llama"}, {"meta.helm.sh/release-name": "llama"}, "flux", "Flux HelmRelease"),
    ({"app.kubernetes.io/managed-by": "Helm"}, {"meta.helm.sh/release-name": "llama"}, "helm", "Helm release llama"),
])
def test_gitops_managed_workload_gets_a_repository_change(kube_api, cluster, labels, annotations, managed_by,
                                                          who):
    _, pod = crashing_deployment(kube_api, labels=labels, annotations=annotations,
                                 containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod)
    ref = proposal.workload
    assert ref.managed_by == managed_by and who in ref.live_patch_blocked
    assert ("revert" in ref.live_patch_blocked) or ("helm upgrade" in ref.live_patch_blocked)
    assert "--max-model-len 8192 (was 32768)" in ref.repository_hint
    assert proposal.manifest_diff and proposal.json_patch == []
    result = cluster.apply(proposal, "U_ALICE")
    assert result.ok is False
    assert live_container(kube_api)["args"][-1] == "32768"


def test_production_stack_hint_names_the_vllm_config_value(kube_api, cluster):
    labels = {"helm.sh/chart": "vllm-stack-0.1.7", "model": "llama3", "helm-release-name": "vllm"}
    _, pod = crashing_deployment(kube_api, labels=labels, annotations={"meta.helm.sh/release-name": "vllm"},
                                 containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod, MAX_LEN, Change(kind="flag", name="--enforce-eager", after="true"))
    hint = proposal.workload.repository_hint
    assert "servingEngineSpec.modelSpec[name=llama3].vllmConfig.maxModelLen: 8192  (was 32768)" in hint
    assert 'servingEngineSpec.modelSpec[name=llama3].vllmConfig.extraArgs: add "--enforce-eager"' in hint


def test_no_change_means_no_proposal(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "8192"])])
    evidence = cluster.collect(NS, pod["metadata"]["name"])
    workload = cluster.workload_for(evidence)
    assert cluster.propose(diagnosis(MAX_LEN), evidence, workload) is None  # already so
    assert cluster.propose(DiagnosisResult(cause=None, title="unknown", explanation=""), evidence, workload) is None


def test_rollback_tolerates_server_defaults_but_not_an_added_env_var(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(
        args=["--model", "m"], livenessProbe={"httpGet": {"path": "/health", "port": 8000}})])
    probe = json.dumps({"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 60})
    assert cluster.apply(propose(cluster, kube_api, pod, Change(kind="probe", name="startupProbe", after=probe),
                                 Change(kind="env", name="VLLM_LOGGING_LEVEL", after="DEBUG")), "U_ALICE").ok

    def api_server_defaults(obj):  # what a real apiserver adds to a probe it stores
        c = obj["spec"]["template"]["spec"]["containers"][0]
        c["startupProbe"].update(timeoutSeconds=1, successThreshold=1)
        c["startupProbe"]["httpGet"]["scheme"] = "HTTP"

    kube_api.edit("Deployment", "llama", NS, api_server_defaults)
    kube_api.edit("Deployment", "llama", NS, lambda o: o["spec"]["template"]["spec"]["containers"][0]["env"]
                  .append({"name": "HF_TOKEN_PATH", "value": "/secrets/hf"}))
    refused = cluster.rollback(NS, "Deployment", "llama", "U_BOB")
    assert refused.conflict is True and "HF_TOKEN_PATH" in refused.message

    kube_api.edit("Deployment", "llama", NS, lambda o: o["spec"]["template"]["spec"]["containers"][0]["env"].pop())
    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB")
    assert result.ok, result.message
    c = live_container(kube_api)
    assert "startupProbe" not in c and "env" not in c


def test_a_change_outside_the_playbook_is_refused(kube_api):
    """Proposals are stored in the cluster; an edited one must not widen what the bot changes."""
    api = KubeApi(kube_api.api_client(), retry=RetryPolicy(initial=0.001, maximum=0.002, sleep=lambda s: None))
    strict = LiveCluster(api, name="test-cluster", poll_seconds=0.001)  # the bundled playbooks
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(strict, kube_api, pod, MAX_LEN)
    widened = proposal.model_copy(update={"changes": proposal.changes + [
        Change(kind="env", name="LD_PRELOAD", after="/tmp/x.so")]})
    result = strict.apply(widened, "U_ALICE")
    assert not result.ok and "does not allow changing env LD_PRELOAD" in result.message
    tampered_ops = [op for op in proposal.json_patch] + [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:latest"}]
    result = strict.apply(proposal.model_copy(update={"json_patch": tampered_ops}), "U_ALICE")
    assert not result.ok and "stored patch does not match" in result.message
    assert strict.apply(proposal, "U_ALICE").ok  # the untouched proposal still applies


# ---- roll back of one incident's change (bot.app.workload_ops) --------------------------------------

def test_rollback_of_a_named_change_undoes_it_and_only_it(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    first = propose(cluster, kube_api, pod)
    assert cluster.apply(first, "U_ALICE").ok
    second = propose(cluster, kube_api, pod, Change(kind="env", name="VLLM_LOGGING_LEVEL", after="DEBUG"))
    assert cluster.apply(second, "U_ALICE").ok

    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB", ChangeToUndo(first.id, first.digest))

    assert result.ok, result.message
    live = live_container(kube_api)
    assert live["args"] == ["--model", "m", "--max-model-len", "32768"]  # the first change undone
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in live["env"]  # the second one kept
    records = json.loads(kube_api.get("Deployment", "llama", NS)["metadata"]["annotations"][AUDIT_ANNOTATION])
    assert [r["id"] for r in records if r.get("rolled_back_by")] == [first.id]
    again = cluster.rollback(NS, "Deployment", "llama", "U_BOB", ChangeToUndo(first.id, first.digest))
    assert again.ok is False and "rolled back already" in again.message


def test_rollback_of_a_change_this_workload_does_not_carry_is_refused(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod)
    assert cluster.apply(proposal, "U_ALICE").ok
    patches = len([c for c in kube_api.calls if c.verb == "patch"])
    for change in (ChangeToUndo("0123456789ab"), ChangeToUndo(proposal.id, "f" * 64)):
        result = cluster.rollback(NS, "Deployment", "llama", "U_BOB", change)
        assert result.ok is False and "carries no record of change" in result.message
    assert len([c for c in kube_api.calls if c.verb == "patch"]) == patches


def test_a_rollback_whose_answer_was_lost_after_it_committed_is_reported_done(kube_api, cluster):
    _, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod)
    assert cluster.apply(proposal, "U_ALICE").ok
    kube_api.fail_commit("patch", "deployments", "after", 500, times=3)  # every attempt commits, no answer
    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB", ChangeToUndo(proposal.id, proposal.digest))
    assert result.ok, result.message
    assert live_container(kube_api)["args"] == ["--model", "m", "--max-model-len", "32768"]


def test_rollback_of_a_change_to_a_workload_since_re_created_is_refused(kube_api, cluster):
    dep, pod = crashing_deployment(kube_api, containers=[container(args=["--model", "m", "--max-model-len", "32768"])])
    proposal = propose(cluster, kube_api, pod)
    assert cluster.apply(proposal, "U_ALICE").ok
    copied = kube_api.get("Deployment", "llama", NS)  # `kubectl get -o yaml`, delete, apply: annotation and all
    kube_api.delete("Deployment", "llama", NS)
    kube_api.put({**copied, "metadata": {k: v for k, v in copied["metadata"].items()
                                         if k not in ("uid", "resourceVersion")}})
    change = ChangeToUndo(proposal.id, proposal.digest, uid=proposal.workload.uid)
    result = cluster.rollback(NS, "Deployment", "llama", "U_BOB", change)
    assert result.ok is False and "deleted and re-created" in result.message
    assert live_container(kube_api)["args"][-1] == "8192"
