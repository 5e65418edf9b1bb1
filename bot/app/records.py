"""The typed records that cross the application's boundaries (stored, posted, returned)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from bot.app.evidence_cache import CachedEvidence
from bot.app.state import IncidentState
from bot.diagnosis.models import DiagnosisResult
from bot.remedy.models import Model, Proposal, WorkloadRef


class MessageRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    channel: str
    ts: str


class ApplyResult(Model):
    ok: bool
    message: str
    workload: WorkloadRef | None = None
    conflict: bool = False  # the workload changed since the proposal; re-diagnose
    # The cluster's answer was ambiguous (5xx or timeout after the write may have committed) and
    # reading back failed too: whether it applied is unknown; the sweeper finds out later.
    unknown: bool = False
    changed_fields: list[str] = Field(default_factory=list)


class PodState(StrEnum):
    """What one new pod of a rollout is doing (bot.app.verdict.pod_state)."""

    READY = "ready"
    CRASHED = "crashed"
    PENDING = "pending"  # scheduled or not, loading, pulling: neither Ready nor crashed yet


class VerifyOutcome(StrEnum):
    """The verdict on a rollout or a soak window."""

    READY = "ready"
    CRASHED = "crashed"
    TIMEOUT = "timeout"  # neither Ready nor crashed within the time given
    UNKNOWN = "unknown"  # nothing to follow (a local cluster, a bare Pod)


class Verification(Model):
    outcome: VerifyOutcome
    pod: str | None = None
    message: str
    kv_cache_line: str | None = None  # vLLM's own "GPU KV cache size: N tokens" / "# GPU blocks"
    concurrency_line: str | None = None
    diagnosis: DiagnosisResult | None = None  # when the new pod crashed again

    @property
    def ready(self) -> bool:
        return self.outcome is VerifyOutcome.READY

    @property
    def crashed(self) -> bool:
        return self.outcome is VerifyOutcome.CRASHED


class CompletionCheck(Model):
    """A real completion request to the new pod (verification step 3)."""

    ok: bool
    message: str
    model: str | None = None
    latency_seconds: float | None = None
    tokens: int | None = None
    diagnosis: DiagnosisResult | None = None  # a failed request, re-diagnosed from the pod's log


class Lease(Model):
    """Who alone may do one job on the incident until `until` (then anyone may take it over): post
    it (`post_lease`, one holder per attempt) or follow its rollout (`verify_lease`, per process)."""

    holder: str  # "<replica>/<token>"
    until: datetime


class RolloutOutcome(Model):
    """What following the rollout of an applied change found."""

    outcome: Literal["ready", "crashed", "timeout", "unknown"]
    pod: str | None = None
    message: str
    at: datetime


class AppliedChange(Model):
    """The last change this incident applied to the workload: what a rollback undoes."""

    by: str  # the approver's chat user id
    at: datetime
    message: str  # what the cluster side said it did
    rollout: RolloutOutcome | None = None  # None until the rollout was followed


class Incident(Model):
    """One incident per (cluster, namespace, workload, cause): the dedup key and the state."""

    name: str  # deterministic object name from the key
    cluster: str
    namespace: str
    workload: str
    cause: str | None
    state: IncidentState
    pods: list[str] = Field(default_factory=list)
    restarts: int | None = None
    first_seen: datetime
    last_seen: datetime
    alert_count: int = 1
    slack_channel: str | None = None
    slack_ts: str | None = None
    # Other messages that show this incident (`/vllm why` in another channel, the message a
    # re-diagnosis replaced): re-rendered with it, and a click counts only on one of these or slack_ts.
    copies: list[MessageRef] = Field(default_factory=list)
    proposal: Proposal | None = None
    diagnosis: DiagnosisResult | None = None
    approver: str | None = None
    decided_at: datetime | None = None
    # Set by the application, read by it; records written before these fields load with None.
    post_lease: Lease | None = None  # None: nobody is posting it (or it is posted)
    # The identity of the incident's (next) message, "<name>/<random>", stored with the post lease
    # before the first attempt and sent in the message's metadata; after an ambiguous answer or a
    # kill, the channel's history is searched for it before posting again (bot/app/posting.py).
    post_key: str | None = None
    post_since: datetime | None = None  # when the first attempt with post_key began
    applied: AppliedChange | None = None
    history: list[str] = Field(default_factory=list)  # for people only: never parsed

    def shown_on(self, message: MessageRef) -> bool:
        """`message` is one of this incident's own messages."""
        return message == self.message_ref() or message in self.copies

    def message_ref(self) -> MessageRef | None:
        return MessageRef(channel=self.slack_channel, ts=self.slack_ts) if self.slack_channel and self.slack_ts \
            else None
    version: str | None = None  # store's concurrency token (resourceVersion or file mtime)
    # What the crash's collect read (bounded), for `/vllm why` once the previous log is gone
    # (bot/app/evidence_cache.py); None for records written before it, or without a previous log.
    evidence: CachedEvidence | None = None
    # The verification step an applied change is in ("ready", "request", "soak"), so a restarted
    # bot resumes it (bot/app/rollout.py); None when no verification is under way.
    verification_step: str | None = None
    # The verification run following the rollout, renewed while it runs (bot/app/leases.py): a
    # run whose replica died is resumed by another once this runs out; None: no run holds it.
    verify_lease: Lease | None = None

    @field_serializer("state")
    def _plain_state(self, state: str) -> str:
        """Stored as the plain string, also when a model_copy(update=...) put one in unchecked."""
        return str(state)


class Note(BaseModel):
    """A thread reply: text, optionally a re-diagnosis and a Roll back button for an incident."""

    model_config = ConfigDict(frozen=True)
    text: str
    diagnosis: DiagnosisResult | None = None
    rollback_incident: str | None = None
    # A reply that must appear once (the "Applied" report): sent with it, so a bot that cannot
    # tell whether it was sent (killed right after) looks for it in the thread first (find_reply).
    key: str | None = None


class AlertTarget(BaseModel):
    """What one Alertmanager alert (or a slash command) points at."""

    model_config = ConfigDict(frozen=True)
    namespace: str
    pod: str
    container: str | None = None
    firing: bool = True
    received_at: float | None = None  # time.monotonic() when the bot received it
    cluster: str | None = None  # the served cluster it was routed to (bot.app.router); None: the default
