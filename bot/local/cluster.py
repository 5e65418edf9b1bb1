"""ClusterPort from files, for the terminal when there is no cluster (and for the bundled demo).

- evidence: an evidence bundle folder (bot.evidence.load_bundle).
- the workload: a manifest in the bundle (deployment.yaml, statefulset.yaml, workload.yaml), or
  one built from pod.yaml's owner (a ReplicaSet `<deployment>-<hash>` -> its Deployment).
- propose, apply, was-applied, rollback: decided by bot.app.workload_ops, as on a cluster; this
  class only does their I/O (WorkloadIO): the workload is a copy of that manifest under
  `state_dir` (the bundle is never modified), a patch is the same conditional JSON Patch applied
  to that copy (all of it, its `test` ops included, or nothing; a dry run applies it to a copy in
  memory), and events go to `state_dir/events.yaml`.
- verify: "unknown": nothing runs here; the message says how to roll the change out.
"""

from __future__ import annotations

import copy
import difflib
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from bot.app import workload_ops
from bot.app.ports import PodNotFound
from bot.app.records import ApplyResult, Verification, VerifyOutcome
from bot.app.verdict import Diagnoser
from bot.app.workload_ops import ChangeToUndo, PatchAnswer, PatchStatus
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy import changes as ch
from bot.remedy.models import Proposal, WorkloadRef
from bot.remedy.ownership import PATCHABLE, controller_of, foreign_controller_ref, resolve_owner, with_gitops

MANIFEST_NAMES = ("deployment.yaml", "statefulset.yaml", "workload.yaml", "manifest.yaml")
PROPOSAL_TTL = timedelta(hours=1)


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

    def read_pod(self, namespace: str, pod: str) -> dict[str, Any]:
        return self._pod() or {}

    def collect(self, namespace: str, pod: str, container: str | None = None) -> Evidence:
        evidence = load_bundle(self.bundle_dir)
        if not container:
            return evidence
        return Evidence(log=evidence.log, pod=evidence.pod, node=evidence.node, events=evidence.events,
                        container=container, source=evidence.source)

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

    # -- proposing, applying, rolling back: decided in bot.app.workload_ops
    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence,
                workload: WorkloadRef | None = None) -> Proposal | None:
        """`workload` as `workload_for` resolved it; the object is this bundle's working copy."""
        ref, obj = (workload, self._current()) if workload is not None else self._workload(evidence)
        return workload_ops.propose(self, ref, obj, diagnosis, PROPOSAL_TTL)

    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        return workload_ops.was_applied(self, proposal)

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        return workload_ops.apply(self, proposal, actor, self.playbooks)

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str,
                 change: ChangeToUndo | None = None) -> ApplyResult:
        return workload_ops.roll_back(self, workload_kind, namespace, workload_name, actor, change)

    # -- WorkloadIO over the working copy
    def find_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The working copy, if it is that object (this bundle holds one workload)."""
        current = self._current()
        meta = current.get("metadata") or {}
        return current if (current.get("kind"), meta.get("namespace"), meta.get("name")) == (kind, namespace, name) \
            else None

    def patch_workload(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]],
                       dry_run: bool = False) -> PatchAnswer:
        current = self.find_workload(kind, namespace, name)
        if current is None:
            return PatchAnswer(PatchStatus.CONFLICT, message=f"{kind} {namespace}/{name} is not this bundle's workload")
        try:
            new = jsonpatch.apply_patch(current, ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            if dry_run:
                return PatchAnswer(PatchStatus.REFUSED, message=f"patch does not apply: {exc}")
            failed_test = isinstance(exc, jsonpatch.JsonPatchTestFailed)
            return PatchAnswer(PatchStatus.CONFLICT if failed_test else PatchStatus.REFUSED, message=str(exc))
        if dry_run:
            return PatchAnswer(PatchStatus.PATCHED, workload=new,
                               message="applies to the local copy (no API server to dry-run against)")
        meta = new["metadata"]
        rv = str(meta.get("resourceVersion", "0"))
        meta["resourceVersion"] = str(int(rv) + 1) if rv.isdigit() else f"{rv}-1"
        meta["generation"] = int(meta.get("generation") or 1) + 1
        return PatchAnswer(PatchStatus.PATCHED, workload=new, message=f"wrote {self._write(new)}")

    def create_event(self, event: dict[str, Any]) -> None:
        self._record_event(event)

    def verify(self, workload: WorkloadRef, timeout_seconds: float, diagnose: Diagnoser | None = None
               ) -> Verification:
        path = self._state_path(workload.kind, workload.namespace, workload.name)
        return Verification(outcome=VerifyOutcome.UNKNOWN, message=f"no cluster here: the change was written to "
                            f"{path}. Roll it out with `kubectl apply -f {path}` (or commit it), then watch the new "
                            f"pod for vLLM's 'GPU KV cache size' line.")


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
