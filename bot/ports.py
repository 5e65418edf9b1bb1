"""The seams between the pure core and the outside world.

The core (evidence, logfacts, playbooks, diagnose, cmdline, render) never does network I/O.
A cluster side (live Kubernetes, or manifest files and bundles on disk) implements
`ClusterPort`; a store of incidents implements `IncidentStore`. Orchestration code
(`bot/service.py`) only talks to these protocols, so either side can be swapped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from bot.models import Change, DiagnosisResult, Evidence


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadRef(Model):
    """The object a fix is applied to (the pod's controller, resolved through ReplicaSets)."""

    kind: str  # Deployment | StatefulSet | Pod | Job | <other controller kind>
    namespace: str
    name: str
    container: str
    api_version: str = "apps/v1"
    resource_version: str | None = None
    # Why a live patch is not offered (bare Pod, foreign controller, GitOps/Helm owner), or None.
    live_patch_blocked: str | None = None
    managed_by: str | None = None  # "argocd" | "flux" | "helm" | None
    repository_hint: str | None = None  # what to change in Git instead (e.g. a Helm value)


class Proposal(Model):
    """A diagnosed change, bound to the exact workload state it was computed from."""

    id: str
    cluster: str
    workload: WorkloadRef
    cause: str
    title: str
    changes: list[Change]
    command_before: list[str]
    command_after: list[str]
    container_before: dict[str, Any] = Field(default_factory=dict)  # the container spec as diagnosed
    json_patch: list[dict[str, Any]] = Field(default_factory=list)  # RFC 6902 ops incl. `test` ops
    dry_run_ok: bool | None = None
    dry_run_message: str | None = None
    manifest_diff: str | None = None  # shown when a live patch is blocked
    created_at: datetime
    expires_at: datetime


class ApplyResult(Model):
    ok: bool
    message: str
    workload: WorkloadRef | None = None
    conflict: bool = False  # the workload changed since the proposal; re-diagnose
    changed_fields: list[str] = Field(default_factory=list)


class Verification(Model):
    outcome: Literal["ready", "crashed", "timeout", "unknown"]
    pod: str | None = None
    message: str
    kv_cache_line: str | None = None  # vLLM's own "GPU KV cache size: N tokens" / "# GPU blocks"
    concurrency_line: str | None = None
    diagnosis: DiagnosisResult | None = None  # when the new pod crashed again


class PodNotFound(LookupError):
    def __init__(self, namespace: str, name: str, close_matches: list[str] | None = None):
        self.namespace, self.name, self.close_matches = namespace, name, close_matches or []
        hint = f" Close matches: {', '.join(self.close_matches)}." if self.close_matches else ""
        super().__init__(f"pod {namespace}/{name} not found.{hint}")


class ClusterPort(Protocol):
    """What the bot needs from a cluster. Implemented by bot.kube (live) and a local one (files)."""

    name: str  # the cluster's configured name, shown in every message

    def resolve_pod(self, namespace: str, name: str) -> str:
        """A pod name for `name`: the pod itself, or the newest crashing pod of a Deployment
        or StatefulSet of that name. Raises PodNotFound with close matches."""

    def collect(self, namespace: str, pod: str, container: str | None = None) -> Evidence:
        """Previous container log (head and tail), pod, node, events."""

    def workload_for(self, evidence: Evidence) -> WorkloadRef:
        """The owning workload of the evidence's pod, with GitOps/Helm detection."""

    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence) -> Proposal | None:
        """A proposal bound to the workload's current state, dry-run checked; None if the
        diagnosis has no change."""

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        """Conditional patch (test ops + resourceVersion), audit annotation and Event."""

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str) -> ApplyResult:
        """Restore the command line recorded by the last applied change."""

    def verify(self, workload: WorkloadRef, timeout_seconds: float) -> Verification:
        """Follow the rollout until a new pod is Ready or crashes again."""


class Incident(Model):
    """One incident per (cluster, namespace, workload, cause): the dedup key and the state."""

    name: str  # deterministic object name from the key
    cluster: str
    namespace: str
    workload: str
    cause: str | None
    state: Literal["proposed", "diagnosed", "approved", "applying", "applied", "verified", "failed",
                   "rejected", "expired", "rolled-back", "resolved"]
    pods: list[str] = Field(default_factory=list)
    restarts: int | None = None
    first_seen: datetime
    last_seen: datetime
    alert_count: int = 1
    slack_channel: str | None = None
    slack_ts: str | None = None
    proposal: Proposal | None = None
    diagnosis: DiagnosisResult | None = None
    approver: str | None = None
    decided_at: datetime | None = None
    history: list[str] = Field(default_factory=list)
    version: str | None = None  # store's concurrency token (resourceVersion or file mtime)


class IncidentExists(Exception):
    """Creating an incident whose name is taken: another replica or alert got there first."""


class IncidentConflict(Exception):
    """An update lost a race: reload and decide again."""


class IncidentStore(Protocol):
    def create(self, incident: Incident) -> Incident:
        """Raises IncidentExists if the name is taken."""

    def get(self, name: str) -> Incident | None: ...

    def update(self, incident: Incident) -> Incident:
        """Compare-and-swap on incident.version; raises IncidentConflict on a lost race."""

    def list(self, **labels: str) -> list[Incident]: ...
