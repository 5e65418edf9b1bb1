"""LocalCluster: the same ClusterPort from files (bundle + manifest copy under a state folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubeapi.objects import container, deployment

from bot.app.ports import PodNotFound
from bot.app.workload_ops import ChangeToUndo, PatchStatus
from bot.diagnosis.models import Change, DiagnosisResult
from bot.local.cluster import LocalCluster
from bot.remedy.plan import AUDIT_ANNOTATION

NS = "inference"
CHANGE = Change(kind="flag", name="--max-model-len", before="32768", after="8192")
DIAGNOSIS = DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e", changes=[CHANGE])


def pod_yaml(owner: dict | None) -> dict:
    meta = {"name": "llama-5f7d9c-abcde", "namespace": NS, "labels": {"app": "llama", "pod-template-hash": "5f7d9c"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "controller": True, "uid": "u", **owner}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "gpu-node-1",
                     "containers": [container(args=["--model", "m", "--max-model-len", "32768"])]}}


def make_bundle(folder: Path, owner: dict | None = None, manifest: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "previous.log").write_text("ValueError: boom\n")
    (folder / "pod.yaml").write_text(yaml.safe_dump(pod_yaml(owner)))
    if manifest is not None:
        (folder / "deployment.yaml").write_text(yaml.safe_dump(manifest))
    return folder


@pytest.fixture
def local(tmp_path):
    manifest = deployment("llama", [container(args=["--model", "m", "--max-model-len", "32768"])], NS)
    bundle = make_bundle(tmp_path / "bundle", {"kind": "ReplicaSet", "name": "llama-5f7d9c"}, manifest)
    return LocalCluster(bundle, tmp_path / "state")


def test_propose_apply_verify_rollback_on_files(local, tmp_path):
    assert local.resolve_pod(NS, "llama") == "llama-5f7d9c-abcde"
    evidence = local.collect(NS, "llama-5f7d9c-abcde")
    proposal = local.propose(DIAGNOSIS, evidence, local.workload_for(evidence))
    assert proposal.workload.kind == "Deployment" and proposal.dry_run_ok is True
    assert proposal.cluster == "local"

    result = local.apply(proposal, "me")

    assert result.ok, result.message
    copy_path = tmp_path / "state" / "deployment-inference-llama.yaml"
    written = yaml.safe_load(copy_path.read_text())
    assert written["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "8192"
    assert json.loads(written["metadata"]["annotations"][AUDIT_ANNOTATION])[0]["who"] == "me"
    assert yaml.safe_load((tmp_path / "bundle" / "deployment.yaml").read_text())["spec"]["template"]["spec"][
        "containers"][0]["args"][-1] == "32768", "the bundle is never modified"
    events = yaml.safe_load((tmp_path / "state" / "events.yaml").read_text())["items"]
    assert events[0]["reason"] == "VllmOncallChange"

    verification = local.verify(result.workload, 60)
    assert verification.outcome == "unknown" and "kubectl apply -f" in verification.message

    assert local.rollback(NS, "Deployment", "llama", "me").ok
    restored = yaml.safe_load(copy_path.read_text())
    assert restored["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "32768"


def test_edit_of_the_copy_between_proposal_and_apply_is_a_conflict(local, tmp_path):
    evidence = local.collect(NS, "llama-5f7d9c-abcde")
    workload = local.workload_for(evidence)
    first = local.propose(DIAGNOSIS, evidence, workload)
    second = local.propose(DiagnosisResult(cause="x", title="t", explanation="e", changes=[
        Change(kind="flag", name="--gpu-memory-utilization", after="0.8")]), evidence, workload)
    assert local.apply(first, "me").ok
    result = local.apply(second, "me")  # computed from the state before the first apply
    assert result.conflict is True and "args" in result.changed_fields


def test_workload_built_from_the_pod_when_the_bundle_has_no_manifest(tmp_path):
    bundle = make_bundle(tmp_path / "b", {"kind": "ReplicaSet", "name": "llama-5f7d9c"})
    local = LocalCluster(bundle, tmp_path / "s")
    ref = local.workload_for(local.collect(NS, "x"))
    assert (ref.kind, ref.name, ref.container) == ("Deployment", "llama", "vllm")
    assert ref.live_patch_blocked is None


def test_bare_pod_bundle_gets_a_manifest_diff(tmp_path):
    local = LocalCluster(make_bundle(tmp_path / "b"), tmp_path / "s")
    evidence = local.collect(NS, "x")
    proposal = local.propose(DIAGNOSIS, evidence, local.workload_for(evidence))
    assert proposal.workload.kind == "Pod" and "bare Pod" in proposal.workload.live_patch_blocked
    assert proposal.manifest_diff and local.apply(proposal, "me").ok is False


def test_gitops_manifest_is_blocked_with_a_repository_hint(tmp_path):
    manifest = deployment("llama", [container(args=["--model", "m", "--max-model-len", "32768"])], NS,
                          annotations={"argocd.argoproj.io/tracking-id": "llm:apps/Deployment:inference/llama"})
    local = LocalCluster(make_bundle(tmp_path / "b", {"kind": "ReplicaSet", "name": "llama-5f7d9c"}, manifest),
                         tmp_path / "s")
    evidence = local.collect(NS, "x")
    proposal = local.propose(DIAGNOSIS, evidence, local.workload_for(evidence))
    assert proposal.workload.managed_by == "argocd"
    assert "--max-model-len 8192 (was 32768)" in proposal.workload.repository_hint


def test_unknown_pod_names_close_matches(local):
    with pytest.raises(PodNotFound) as info:
        local.resolve_pod(NS, "lama")
    assert "llama" in info.value.close_matches


def test_the_bundled_example_incident_runs_end_to_end(tmp_path):
    from bot.diagnosis.diagnose import diagnose

    bundle = Path(__file__).resolve().parents[2] / "examples" / "incident" / "bundle"
    local = LocalCluster(bundle, tmp_path / "state", name="demo")
    evidence = local.collect("inference", local.resolve_pod("inference", "vllm-llama3-8b"))
    proposal = local.propose(diagnose(evidence), evidence, local.workload_for(evidence))
    assert proposal is not None and proposal.command_after != proposal.command_before
    assert local.apply(proposal, "demo-user").ok


def test_the_local_copy_follows_the_same_guards_as_a_cluster(local, tmp_path):
    """One implementation (bot.app.workload_ops): the guard order and the roll back of a named
    change are the live cluster's; the local patch honours every `test` op."""
    evidence = local.collect(NS, "llama-5f7d9c-abcde")
    proposal = local.propose(DIAGNOSIS, evidence, local.workload_for(evidence))
    assert local.was_applied(proposal) is None
    assert local.apply(proposal, "me").ok
    assert local.apply(proposal, "me").ok and local.was_applied(proposal).ok  # applied once, reported again

    other = ChangeToUndo("0123456789ab")
    refused = local.rollback(NS, "Deployment", "llama", "me", other)
    assert refused.ok is False and "carries no record of change 0123456789ab" in refused.message
    assert local.rollback(NS, "Deployment", "elsewhere", "me").ok is False  # not this bundle's workload

    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
             {"op": "replace", "path": "/spec/replicas", "value": 5}]
    assert local.patch_workload("Deployment", NS, "llama", stale).status is PatchStatus.CONFLICT
    copy_path = tmp_path / "state" / "deployment-inference-llama.yaml"
    assert yaml.safe_load(copy_path.read_text())["spec"]["replicas"] == 1  # nothing written

    assert local.rollback(NS, "Deployment", "llama", "me", ChangeToUndo(proposal.id, proposal.digest)).ok
    assert yaml.safe_load(copy_path.read_text())["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "32768"
