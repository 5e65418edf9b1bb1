"""The records a remedy is made of: the workload a fix is for, and the proposal itself."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bot.diagnosis.models import Change


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
    # Why this proposal may not be approved although it could be applied (proposals-only mode).
    approvals_off: str | None = None
    created_at: datetime
    expires_at: datetime


