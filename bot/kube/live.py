"""ClusterPort on a live cluster through the official kubernetes client."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Any

from bot.app import workload_ops
from bot.app.records import ApplyResult, PodState, Verification
from bot.app.verdict import Diagnoser, pod_state
from bot.app.workload_ops import ChangeToUndo, PatchAnswer, PatchStatus
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.collect import HEAD_BYTES, TAIL_LINES, age_key, collect, get_pod_or_suggest
from bot.kube.errors import KubeConflict, KubeError, KubeForbidden, KubeInvalid, KubeNotFound, PodGone
from bot.kube.retry import RetryPolicy
from bot.kube.verify import follow_rollout, selector_string
from bot.remedy import changes as ch
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
        # Each object kept as a pickled snapshot: neither the caller that gave it nor one that got
        # it can change the entry, and taking or restoring a snapshot is one C call (a deep copy of
        # a Deployment each way cost 4-5 times as much).
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, ref: WorkloadRef, obj: dict[str, Any]) -> None:
        if not ref.resource_version or ref.resource_version != (obj.get("metadata") or {}).get("resourceVersion"):
            return  # e.g. "its Deployment is gone": the pod stands in for the workload; not versioned by ref
        key, snapshot = ref.model_dump_json(), pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._objects[key] = snapshot
            self._objects.move_to_end(key)
            while len(self._objects) > self.size:
                self._objects.popitem(last=False)

    def get(self, ref: WorkloadRef) -> dict[str, Any] | None:
        """A copy of the object kept for `ref` (the caller may change it), or None."""
        with self._lock:
            snapshot = self._objects.get(ref.model_dump_json())
        # only ever this process's own pickle of an API answer (remember above)
        return pickle.loads(snapshot) if snapshot is not None else None


class LiveCluster:
    """The bot's view of one Kubernetes cluster: the ClusterPort, and the WorkloadIO that
    bot.app.workload_ops decides apply and roll back over (this class only does their I/O).
    Every API call goes through KubeApi (retries, 403s)."""

    def __init__(self, api: KubeApi, name: str = "default", proposal_ttl: timedelta = timedelta(hours=1),
                 poll_seconds: float = 5.0, head_bytes: int = HEAD_BYTES, tail_lines: int = TAIL_LINES,
                 diagnose: Diagnoser | None = None, playbooks: Any = None):
        self.api = api
        self.playbooks = playbooks  # what a proposal may change; None: the bundled playbooks/
        self.name = name
        self.proposal_ttl = proposal_ttl
        self.poll_seconds = poll_seconds
        self.head_bytes = head_bytes
        self.tail_lines = tail_lines
        self._diagnose = diagnose  # for callers of verify() that pass none (bot.app.rollout passes its own)
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
                    crashing = [p for p in pods if pod_state(p, container) is PodState.CRASHED]
                    newest = max(crashing or pods, key=age_key)
                    return newest["metadata"]["name"]
            raise gone

    def collect(self, namespace: str, pod: str, container: str | None = None, gpu_pods: bool = False) -> Evidence:
        """bot.kube.collect.collect; `gpu_pods=True` only for a ticket bundle (`vllm-oncall collect`)."""
        return collect(self.api, namespace, pod, container, self.head_bytes, self.tail_lines, gpu_pods=gpu_pods)

    def read_pod(self, namespace: str, pod: str) -> dict[str, Any]:
        try:
            return self.api.get_pod(namespace, pod)
        except KubeNotFound:
            raise PodGone(namespace, pod) from None

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

    # -- proposing, applying, rolling back: decided in bot.app.workload_ops
    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence,
                workload: WorkloadRef | None = None) -> Proposal | None:
        """The proposal for `workload` as `workload_for` read it (no second read of the owners).
        Without `workload`, or for one this cluster did not resolve, the owners are read again."""
        obj = self.resolved.get(workload) if workload is not None else None
        if workload is None or obj is None:
            workload, obj = self._workload(evidence)
        return workload_ops.propose(self, workload, obj, diagnosis, self.proposal_ttl)

    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        return workload_ops.was_applied(self, proposal)

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        return workload_ops.apply(self, proposal, actor, self.playbooks)

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str,
                 change: ChangeToUndo | None = None) -> ApplyResult:
        return workload_ops.roll_back(self, workload_kind, namespace, workload_name, actor, change)

    # -- WorkloadIO
    def find_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.find_workload(kind, namespace, name)

    def patch_workload(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]],
                       dry_run: bool = False) -> PatchAnswer:
        """Forbidden and invalid patches raise (nothing was written); a 409 or a failed `test` op
        is a conflict; any other error may have committed (uncertain). A dry run's refusal is an answer."""
        try:
            patched = self.api.patch_workload(kind, namespace, name, ops, dry_run=dry_run)
        except (KubeInvalid, KubeConflict) as exc:
            if dry_run:
                return PatchAnswer(PatchStatus.REFUSED, message=f"server-side dry run refused the patch: "
                                                                f"{exc.server_message}")
            if isinstance(exc, KubeInvalid):
                raise
            return PatchAnswer(PatchStatus.CONFLICT, message=exc.server_message)
        except KubeForbidden as exc:
            if dry_run:
                # A read-only role (the proposals-only install) may not even dry-run a patch: the
                # proposal is still posted, with no button, saying which permission approve mode adds.
                return PatchAnswer(PatchStatus.REFUSED, message=(
                    f"not run: the bot's role may not {exc.verb} {exc.resource} in namespace {namespace} "
                    "(a read-only, proposals-only install; approve mode grants it)"))
            raise
        except KubeError as exc:  # a 5xx, a timeout: it may have committed
            if dry_run:
                raise
            return PatchAnswer(PatchStatus.UNCERTAIN, message=exc.server_message)
        where = "server-side dry run passed" if dry_run else f"patched {kind} {namespace}/{name}"
        return PatchAnswer(PatchStatus.PATCHED, workload=patched, message=where)

    def create_event(self, event: dict[str, Any]) -> None:
        self.api.create_event(event["metadata"]["namespace"], event)

    # -- verifying
    def verify(self, workload: WorkloadRef, timeout_seconds: float, diagnose: Diagnoser | None = None
               ) -> Verification:
        """Follow the rollout (bot.kube.verify polls, bot.app.verdict decides); a new crash is
        diagnosed by `diagnose` (the caller's), else by the one given to this cluster."""
        return follow_rollout(self.api, workload, timeout_seconds, diagnose or self._diagnose, self.poll_seconds,
                              clock=time.monotonic, sleep=time.sleep)
