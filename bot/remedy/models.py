"""The records a remedy is made of: the workload a fix is for, and the proposal itself."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bot.diagnosis.models import Change, revised
from bot.remedy.impact import Impact


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
    uid: str | None = None  # the object's metadata.uid: a workload deleted and re-created is another one
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
    # sha256 of `content()`; set by `sealed()`. The Approve button carries it, so a click applies
    # only the record that message showed; "" on records written before digests existed.
    digest: str = ""
    # What the new limit would have refused of the workload's recent traffic (bot.remedy.impact);
    # information for the approver, not part of the change, so not in content() or the digest.
    impact: Impact | None = None

    def target(self) -> dict[str, Any]:
        """The object the patch goes to."""
        w = self.workload
        return {"cluster": self.cluster, "kind": w.kind, "namespace": w.namespace, "name": w.name,
                "uid": w.uid, "container": w.container}

    def content(self) -> dict[str, Any]:
        """Everything an approver is shown and the cluster is sent: the target, the exact
        changes, the command lines and the JSON Patch."""
        return {"id": self.id, "target": self.target(), "cause": self.cause,
                "changes": [c.model_dump(mode="json") for c in self.changes],
                "command_before": self.command_before, "command_after": self.command_after,
                "json_patch": self.json_patch}

    def content_digest(self) -> str:
        canonical = json.dumps(self.content(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def sealed(self) -> Proposal:
        """This proposal with its digest set (call after the last change to its content)."""
        return revised(self, digest=self.content_digest())

    def intact(self) -> bool:
        """The stored digest is the digest of the stored content (a naive edit breaks it; an edit
        that recomputes it is caught by re-deriving the proposal, see bot.app.proposals)."""
        return bool(self.digest) and self.digest == self.content_digest()


