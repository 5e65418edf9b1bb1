"""ClusterPort on a live cluster through the official kubernetes client."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bot.app.records import ApplyResult, Verification
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.collect import HEAD_BYTES, TAIL_LINES, age_key, collect, get_pod_or_suggest
from bot.kube.errors import KubeConflict, KubeError, KubeForbidden, KubeInvalid, PodGone
from bot.kube.retry import RetryPolicy
from bot.kube.verify import follow_rollout, pod_state, selector_string
from bot.remedy import changes as ch
from bot.remedy import plan
from bot.remedy.models import Proposal, WorkloadRef
from bot.remedy.ownership import resolve_owner

log = logging.getLogger("bot.kube")


class ResolvedWorkloads:
    """The workload objects `workload_for` read, so `propose` can build on the same object without
    reading the ReplicaSet and Deployment again.

    Keyed by the whole WorkloadRef, which carries the object's resourceVersion, and kept only when
    that resourceVersion is the object's own: an object's content at one resourceVersion never
    changes, so an entry can be old but never stale. (The proposal is bound to that
    resourceVersion by its `test` ops anyway.) Bounded, thread-safe."""

    def __init__(self, size: int = 64):
        self.size = size
        self._objects: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, ref: WorkloadRef, obj: dict[str, Any]) -> None:
        if not ref.resource_version or ref.resource_version != (obj.get("metadata") or {}).get("resourceVersion"):
            return  # e.g. "its Deployment is gone": the pod stands in for the workload; not versioned by ref
        with self._lock:
            self._objects[ref.model_dump_json()] = copy.deepcopy(obj)
            self._objects.move_to_end(ref.model_dump_json())
            while len(self._objects) > self.size:
                self._objects.popitem(last=False)

    def get(self, ref: WorkloadRef) -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects.get(ref.model_dump_json())
        return copy.deepcopy(obj) if obj is not None else None


class LiveCluster:
    """The bot's view of one Kubernetes cluster. Every API call goes through KubeApi (retries, 403s)."""

    def __init__(self, api: KubeApi, name: str = "default", proposal_ttl: timedelta = timedelta(hours=1),
                 poll_seconds: float = 5.0, head_bytes: int = HEAD_BYTES, tail_lines: int = TAIL_LINES,
                 diagnose: Callable[[Evidence], DiagnosisResult] | None = None, playbooks: Any = None):
        self.api = api
        self.playbooks = playbooks  # what a proposal may change; None: the bundled playbooks/
        self.name = name
        self.proposal_ttl = proposal_ttl
        self.poll_seconds = poll_seconds
        self.head_bytes = head_bytes
        self.tail_lines = tail_lines
        self._diagnose = diagnose
        self.resolved = ResolvedWorkloads()

    @classmethod
    def from_environment(cls, name: str = "default", context: str | None = None, kubeconfig: str | None = None,
                         retry: RetryPolicy | None = None, **kwargs: Any) -> LiveCluster:
        """In-cluster service account, else kubeconfig (KUBECONFIG or ~/.kube/config, or `kubeconfig`)."""
        return cls(KubeApi(api_client_from_environment(context, kubeconfig), retry=retry), name=name, **kwargs)

    # -- finding the pod
    def resolve_pod(self, namespace: str, name: str) -> str:
        """The pod itself, or the newest crashing (else newest) pod of a Deployment/StatefulSet `name`."""
        try:
            return get_pod_or_suggest(self.api, namespace, name)["metadata"]["name"]
        except PodGone as gone:
            for kind in ("Deployment", "StatefulSet"):
                workload = self.api.find_workload(kind, namespace, name)
                if workload is None:
                    continue
                pods = self.api.list_pods(namespace, label_selector=selector_string(workload))
                if pods:
                    container = ch.pod_spec_of(workload)["containers"][
                        ch.container_index(ch.pod_spec_of(workload), None)]["name"]
                    crashing = [p for p in pods if pod_state(p, container) == "crashed"]
                    newest = max(crashing or pods, key=age_key)
                    return newest["metadata"]["name"]
            raise gone

    def collect(self, namespace: str, pod: str, container: str | None = None, gpu_pods: bool = False) -> Evidence:
        """bot.kube.collect.collect; `gpu_pods=True` only for a ticket bundle (`vllm-oncall collect`)."""
        return collect(self.api, namespace, pod, container, self.head_bytes, self.tail_lines, gpu_pods=gpu_pods)

    def _workload(self, evidence: Evidence) -> tuple[WorkloadRef, dict[str, Any]]:
        if not evidence.pod:
            raise ValueError("the evidence has no pod; cannot find its workload")
        container = evidence.container or ch.pod_spec_of(evidence.pod)["containers"][
            ch.container_index(ch.pod_spec_of(evidence.pod), None)]["name"]
        ref, obj = resolve_owner(self.api, evidence.pod, container)
        self.resolved.remember(ref, obj)
        return ref, obj

    def workload_for(self, evidence: Evidence) -> WorkloadRef:
        return self._workload(evidence)[0]

    # -- proposing
    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence,
                workload: WorkloadRef | None = None) -> Proposal | None:
        """The proposal for `workload` as `workload_for` read it (no second read of the owners).
        Without `workload`, or for one this cluster did not resolve, the owners are read again."""
        obj = self.resolved.get(workload) if workload is not None else None
        if workload is None or obj is None:
            workload, obj = self._workload(evidence)
        proposal = plan.make_proposal(self.name, workload, obj, diagnosis, self.proposal_ttl)
        if proposal is None or workload.live_patch_blocked:
            return proposal
        try:
            self.api.patch_workload(workload.kind, workload.namespace, workload.name, proposal.json_patch,
                                    dry_run=True)
            return proposal.model_copy(update={"dry_run_ok": True, "dry_run_message": "server-side dry run passed"})
        except (KubeInvalid, KubeConflict) as exc:
            return proposal.model_copy(update={"dry_run_ok": False,
                                               "dry_run_message": f"server-side dry run refused the patch: "
                                                                  f"{exc.server_message}"})
        except KubeForbidden as exc:
            # A read-only role (the proposals-only install) may not even dry-run a patch: the
            # proposal is still posted, with no button, saying which permission approve mode adds.
            return proposal.model_copy(update={"dry_run_ok": False, "dry_run_message": (
                f"not run: the bot's role may not {exc.verb} {exc.resource} in namespace {workload.namespace} "
                "(a read-only, proposals-only install; approve mode grants it)")})

    # -- applying
    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        ref = proposal.workload
        current = self.api.find_workload(ref.kind, ref.namespace, ref.name)
        return self._already(proposal, current) if current is not None else None

    def _already(self, proposal: Proposal, current: dict[str, Any]) -> ApplyResult | None:
        """An ok result if `current` carries this proposal's audit record: it was applied."""
        record = plan.applied_record(proposal, current)
        if record is None:
            return None
        ref = proposal.workload
        return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record),
                           workload=ref.model_copy(update={"resource_version": current["metadata"]["resourceVersion"]}),
                           message=f"patched {ref.kind} {ref.namespace}/{ref.name}: {plan.describe_record(record)}")

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        ref = proposal.workload
        if ref.live_patch_blocked:
            return ApplyResult(ok=False, workload=ref, message=f"not patched live: {ref.live_patch_blocked}")
        current = self.api.find_workload(ref.kind, ref.namespace, ref.name)
        if current is None:
            return ApplyResult(ok=False, workload=ref, message=f"{ref.kind} {ref.namespace}/{ref.name} no longer exists")
        if ref.uid and current["metadata"].get("uid") != ref.uid:
            return ApplyResult(ok=False, workload=ref, message=f"refused: {ref.kind} {ref.namespace}/{ref.name} was "
                                                               "deleted and re-created since the proposal")
        done = self._already(proposal, current)  # an earlier attempt committed (its answer was lost)
        if done is not None:
            return done
        refused = self._refuse_if_edited(proposal, current)
        if refused:
            return refused
        forbidden = plan.not_allowed(proposal, current, self.playbooks)
        if forbidden:
            return ApplyResult(ok=False, workload=ref, message=f"refused: {forbidden}")
        audit, record = plan.change_ops(proposal, current, actor)
        try:
            patched = self.api.patch_workload(ref.kind, ref.namespace, ref.name, self._rebased(proposal, current)
                                              + audit)
        except (KubeForbidden, KubeInvalid):
            raise  # refused outright: nothing was written
        except KubeError as exc:  # a conflict, a 5xx, a timeout: it may have committed
            return self._after_patch_error(proposal, exc)
        message = plan.describe_record(record)
        self._event(patched, "VllmOncallChange", f"{message} [cluster {self.name}]")
        new_ref = ref.model_copy(update={"resource_version": patched["metadata"]["resourceVersion"]})
        return ApplyResult(ok=True, workload=new_ref, changed_fields=plan.fields_changed_by(record),
                           message=f"patched {ref.kind} {ref.namespace}/{ref.name}: {message}")

    def _after_patch_error(self, proposal: Proposal, exc: KubeError) -> ApplyResult:
        """The patch answered an error. It may have committed all the same (a 5xx or a timeout
        after the write; a retry of a committed patch then fails its own `test` ops): read the
        workload back, and its audit record says whether it did."""
        ref = proposal.workload
        try:
            latest = self.api.get_workload(ref.kind, ref.namespace, ref.name)
        except KubeError as read_exc:
            return ApplyResult(ok=False, unknown=True, workload=ref,
                               message=f"the patch answered {exc.server_message!r} and reading it back failed "
                                       f"({read_exc.server_message}); whether it applied is checked again later")
        done = self._already(proposal, latest)
        if done is not None:
            log.warning("patch of %s/%s answered %s but had committed", ref.namespace, ref.name, exc.server_message)
            return done
        if isinstance(exc, KubeConflict):  # lost a race between our read and our write: report what changed
            return self._refuse_if_edited(proposal, latest) or ApplyResult(
                ok=False, conflict=True, workload=ref,
                message=f"{ref.kind} {ref.name} changed while patching ({exc.server_message}); re-diagnose")
        return ApplyResult(ok=False, workload=ref, message=f"not applied (read back: unchanged): {exc.server_message}")

    def _refuse_if_edited(self, proposal: Proposal, current: dict[str, Any]) -> ApplyResult | None:
        ref = proposal.workload
        diff = plan.conflict_with(proposal, current)
        if diff is None and plan.rebase(proposal.json_patch, current) is not None:
            return None
        what = diff or "its spec was edited (generation changed) outside the container"
        fields = ch.changed_fields(proposal.container_before, ch.fields_of(ch.pod_spec_of(current), ref.container))
        return ApplyResult(ok=False, conflict=True, workload=ref, changed_fields=fields,
                           message=f"refused: {ref.kind} {ref.namespace}/{ref.name} was edited since the "
                                   f"proposal (resourceVersion {ref.resource_version} -> "
                                   f"{current['metadata'].get('resourceVersion')}); re-diagnose.\n{what}")

    def _rebased(self, proposal: Proposal, current: dict[str, Any]) -> list[dict[str, Any]]:
        ops = plan.rebase(proposal.json_patch, current)
        assert ops is not None  # _refuse_if_edited checked it
        return ops

    def _event(self, workload: dict[str, Any], reason: str, message: str) -> None:
        try:
            self.api.create_event(workload["metadata"]["namespace"], plan.event_for(workload, reason, message))
        except KubeError as exc:  # the annotation already holds the record; an Event is a courtesy
            log.warning("could not create the audit Event: %s", exc.server_message)

    # -- rolling back
    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str) -> ApplyResult:
        current = self.api.find_workload(workload_kind, namespace, workload_name)
        if current is None:
            return ApplyResult(ok=False, message=f"{workload_kind} {namespace}/{workload_name} does not exist")
        container_name = next((r["container"] for r in reversed(plan.read_audit(current))), "")
        ref = WorkloadRef(kind=workload_kind, namespace=namespace, name=workload_name, container=container_name,
                          resource_version=current["metadata"].get("resourceVersion"))
        try:
            ops, record = plan.rollback_ops(current, actor)
        except plan.RollbackRefused as refused:
            return ApplyResult(ok=False, conflict=refused.conflict, workload=ref, message=f"refused: {refused}")
        try:
            patched = self.api.patch_workload(workload_kind, namespace, workload_name, ops)
        except KubeConflict as exc:
            return ApplyResult(ok=False, conflict=True, workload=ref,
                               message=f"refused: {workload_kind} {workload_name} changed while rolling back "
                                       f"({exc.server_message}); try again")
        message = plan.describe_record(record)
        self._event(patched, "VllmOncallRollback", f"{message} [cluster {self.name}]")
        return ApplyResult(ok=True, changed_fields=plan.fields_changed_by(record),
                           workload=ref.model_copy(update={"resource_version": patched["metadata"]["resourceVersion"]}),
                           message=f"rolled back {workload_kind} {namespace}/{workload_name}: {message}")

    # -- verifying
    def verify(self, workload: WorkloadRef, timeout_seconds: float) -> Verification:
        return follow_rollout(self.api, workload, timeout_seconds, self.poll_seconds, diagnose=self._diagnose,
                              clock=time.monotonic, sleep=time.sleep)
