"""ClusterPort from files, for the terminal when there is no cluster (and for the bundled demo).

- evidence: an evidence bundle folder (bot.evidence.load_bundle).
- the workload: a manifest in the bundle (deployment.yaml, statefulset.yaml, workload.yaml), or
  one built from pod.yaml's owner (a ReplicaSet `<deployment>-<hash>` -> its Deployment).
- apply: the same conditional JSON Patch as on a cluster, applied to a copy of that manifest under
  `state_dir` (the bundle is never modified), with the same audit annotation; events go to
  `state_dir/events.yaml`.
- rollback: from the audit annotation on that copy, under the same conditional rule.
- verify: "unknown": nothing runs here; the message says how to roll the change out.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from bot.app.ports import PodNotFound
from bot.app.records import ApplyResult, Verification
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy import changes as ch
from bot.remedy import plan
from bot.remedy.models import Proposal, WorkloadRef
from bot.remedy.ownership import PATCHABLE, controller_of, foreign_controller_ref, resolve_owner, with_gitops

MANIFEST_NAMES = ("deployment.yaml", "statefulset.yaml", "workload.yaml", "manifest.yaml")


class _NoOwnersOnDisk:
    """resolve_owner's API for a bare Pod/Job/foreign owner: those need no lookup."""

    def find_workload(self, kind: str, namespace: str, name: str) -> None:
        return None


class LocalCluster:
    def __init__(self, bundle_dir: Path, state_dir: Path, name: str = "local", playbooks: Any = None):
        self.playbooks = playbooks  # what a proposal may change; None: the bundled playbooks/
        self.bundle_dir = Path(bundle_dir)
        self.state_dir = Path(state_dir)
        self.name = name

    # -- files
    def _bundle_manifest(self) -> dict[str, Any] | None:
        for file_name in MANIFEST_NAMES:
            path = self.bundle_dir / file_name
            if path.is_file():
                for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                    if isinstance(doc, dict) and doc.get("kind") in PATCHABLE:
                        return doc
        return None

    def _pod(self) -> dict[str, Any] | None:
        return load_bundle(self.bundle_dir).pod

    def _original(self) -> dict[str, Any]:
        """The workload as the bundle describes it: its manifest, or built from the pod."""
        manifest = self._bundle_manifest()
        if manifest is not None:
            obj = copy.deepcopy(manifest)
        else:
            pod = self._pod()
            if pod is None:
                raise FileNotFoundError(f"{self.bundle_dir}: no workload manifest and no pod.yaml")
            obj = workload_from_pod(pod)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", ((self._pod() or {}).get("metadata") or {}).get("namespace", "default"))
        meta.setdefault("resourceVersion", "1")
        meta.setdefault("generation", 1)
        return obj

    def _state_path(self, kind: str, namespace: str, name: str) -> Path:
        return self.state_dir / f"{kind.lower()}-{namespace}-{name}.yaml"

    def _current(self) -> dict[str, Any]:
        """The working copy (after earlier applies), else the original."""
        original = self._original()
        meta = original["metadata"]
        path = self._state_path(original["kind"], meta["namespace"], meta["name"])
        if path.is_file():
            return yaml.safe_load(path.read_text(encoding="utf-8"))
        return original

    def _write(self, obj: dict[str, Any]) -> Path:
        meta = obj["metadata"]
        path = self._state_path(obj["kind"], meta["namespace"], meta["name"])
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(obj, sort_keys=False, width=1000), encoding="utf-8")
        return path

    def _record_event(self, event: dict[str, Any]) -> None:
        path = self.state_dir / "events.yaml"
        events = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        events = (events or {"apiVersion": "v1", "kind": "List", "items": []})
        events["items"].append(event)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(events, sort_keys=False, width=1000), encoding="utf-8")

    # -- ClusterPort
    def resolve_pod(self, namespace: str, name: str) -> str:
        pod = self._pod() or {}
        pod_name = (pod.get("metadata") or {}).get("name") or name
        known = [pod_name]
        try:
            known.append(self._original()["metadata"]["name"])
        except FileNotFoundError:
            pass
        if name in known:
            return pod_name
        raise PodNotFound(namespace, name, difflib.get_close_matches(name, known, n=3, cutoff=0.3) or known)

    def collect(self, namespace: str, pod: str, container: str | None = None) -> Evidence:
        evidence = load_bundle(self.bundle_dir)
        return evidence.model_copy(update={"container": container}) if container else evidence

    def _workload(self, evidence: Evidence) -> tuple[WorkloadRef, dict[str, Any]]:
        obj = self._current()
        meta = obj["metadata"]
        spec = ch.pod_spec_of(obj)
        container = evidence.container or spec["containers"][ch.container_index(spec, None)]["name"]
        if obj["kind"] not in PATCHABLE:
            ref, _ = resolve_owner(_NoOwnersOnDisk(), obj, container)
            return ref, obj
        owner = controller_of(obj)
        if owner is not None:
            return foreign_controller_ref(meta["namespace"], obj["kind"], meta["name"], container, owner, obj), obj
        ref = WorkloadRef(kind=obj["kind"], namespace=meta["namespace"], name=meta["name"], container=container,
                          resource_version=str(meta.get("resourceVersion")))
        return with_gitops(ref, obj), obj

    def workload_for(self, evidence: Evidence) -> WorkloadRef:
        return self._workload(evidence)[0]

    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence,
                workload: WorkloadRef | None = None) -> Proposal | None:
        """`workload` as `workload_for` resolved it; the object is this bundle's working copy."""
        ref, obj = (workload, self._current()) if workload is not None else self._workload(evidence)
        proposal = plan.make_proposal(self.name, ref, obj, diagnosis)
        if proposal is None or ref.live_patch_blocked:
            return proposal
        try:
            jsonpatch.apply_patch(obj, proposal.json_patch)
        except jsonpatch.JsonPatchException as exc:
            return proposal.model_copy(update={"dry_run_ok": False, "dry_run_message": f"patch does not apply: {exc}"})
        return proposal.model_copy(update={"dry_run_ok": True, "dry_run_message":
                                           "applies to the local copy (no API server to dry-run against)"})

    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        record = plan.applied_record(proposal, self._current())
        return None if record is None else ApplyResult(
            ok=True, workload=proposal.workload, changed_fields=plan.fields_changed_by(record),
            message=f"already applied: {plan.describe_record(record)}")

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        ref = proposal.workload
        if ref.live_patch_blocked:
            return ApplyResult(ok=False, workload=ref, message=f"not patched: {ref.live_patch_blocked}")
        done = self.was_applied(proposal)
        if done is not None:
            return done
        current = self._current()
        diff = plan.conflict_with(proposal, current)
        ops = plan.rebase(proposal.json_patch, current)
        if diff is not None or ops is None:
            fields = ch.changed_fields(proposal.container_before,
                                       ch.fields_of(ch.pod_spec_of(current), ref.container))
            return ApplyResult(ok=False, conflict=True, workload=ref, changed_fields=fields,
                               message=f"refused: {ref.kind} {ref.name} was edited since the proposal; "
                                       f"re-diagnose.\n{diff or 'its spec changed outside the container'}")
        forbidden = plan.not_allowed(proposal, current, self.playbooks)
        if forbidden:
            return ApplyResult(ok=False, workload=ref, message=f"refused: {forbidden}")
        audit, record = plan.change_ops(proposal, current, actor)
        return self._write_patched(current, ops + audit, record, ref, "VllmOncallChange")

    def _write_patched(self, current: dict[str, Any], ops: list[dict[str, Any]], record: dict[str, Any],
                       ref: WorkloadRef, reason: str) -> ApplyResult:
        new = jsonpatch.apply_patch(current, ops)
        meta = new["metadata"]
        rv = str(meta.get("resourceVersion", "0"))
        meta["resourceVersion"] = str(int(rv) + 1) if rv.isdigit() else f"{rv}-1"
        meta["generation"] = int(meta.get("generation") or 1) + 1
        path = self._write(new)
        message = plan.describe_record(record)
        self._record_event(plan.event_for(new, reason, message))
        return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record),
                           workload=ref.model_copy(update={"resource_version": meta["resourceVersion"]}),
                           message=f"wrote {path}: {message}")

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str) -> ApplyResult:
        current = self._current()
        meta = current["metadata"]
        ref = WorkloadRef(kind=workload_kind, namespace=namespace, name=workload_name,
                          container=next((r["container"] for r in reversed(plan.read_audit(current))), ""),
                          resource_version=str(meta.get("resourceVersion")))
        if (current["kind"], meta["name"]) != (workload_kind, workload_name):
            return ApplyResult(ok=False, workload=ref, message=f"refused: this bundle's workload is "
                               f"{current['kind']}/{meta['name']}, not {workload_kind}/{workload_name}")
        try:
            ops, record = plan.rollback_ops(current, actor)
        except plan.RollbackRefused as refused:
            return ApplyResult(ok=False, conflict=refused.conflict, workload=ref, message=f"refused: {refused}")
        return self._write_patched(current, ops, record, ref, "VllmOncallRollback")

    def verify(self, workload: WorkloadRef, timeout_seconds: float) -> Verification:
        path = self._state_path(workload.kind, workload.namespace, workload.name)
        return Verification(outcome="unknown", message=f"no cluster here: the change was written to {path}. "
                            f"Roll it out with `kubectl apply -f {path}` (or commit it), then watch the new pod "
                            f"for vLLM's 'GPU KV cache size' line.")


def workload_from_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The Deployment/StatefulSet a pod came from, rebuilt from the pod; the pod itself otherwise."""
    meta = pod.get("metadata") or {}
    owner = controller_of(pod)
    labels = {k: v for k, v in (meta.get("labels") or {}).items()
              if k not in ("pod-template-hash", "controller-revision-hash", "statefulset.kubernetes.io/pod-name")}
    spec = copy.deepcopy(pod.get("spec") or {})
    for runtime_only in ("nodeName",):
        spec.pop(runtime_only, None)
    kind = name = None
    if owner and owner.get("kind") == "ReplicaSet" and "-" in owner.get("name", ""):
        kind, name = "Deployment", owner["name"].rsplit("-", 1)[0]
    elif owner and owner.get("kind") == "StatefulSet":
        kind, name = "StatefulSet", owner["name"]
    if kind is None:
        out = copy.deepcopy(pod)
        out.pop("status", None)
        out.setdefault("kind", "Pod")
        out.setdefault("apiVersion", "v1")
        return out
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": meta.get("namespace", "default"), "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}
