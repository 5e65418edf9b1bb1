"""The typed records that cross the application's boundaries (stored, posted, returned)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from bot.app.evidence_cache import CachedEvidence
from bot.app.links import IncidentLinks
from bot.app.state import (  # VerifyOutcome, MemoryTrend: re-exported for the adapters
    IncidentState,
    MemoryTrend,
    VerificationStep,
    VerifyOutcome,
)
from bot.diagnosis.models import DiagnosisResult, revised
from bot.remedy.models import Model, Proposal, WorkloadRef


class MessageRef(BaseModel):
    """One message in the chat: the channel it is in and the chat's id for it there."""

    model_config = ConfigDict(frozen=True)
    channel: str
    message_id: str


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


class GpuMemory(Model):
    """One GPU's memory over the soak (GiB), as the cluster side measured it; `trend` is
    bot.app.verdict.gpu_trend's reading of these numbers."""

    gpu: str  # "0 (GPU-uuid…)"
    start_gib: float
    peak_gib: float
    end_gib: float
    capacity_gib: float | None
    slope_gib_per_hour: float
    trend: MemoryTrend = MemoryTrend.STABLE

    @property
    def hours_to_full(self) -> float | None:
        """At the soak's slope, hours until the card is full; None: not climbing, or capacity unknown."""
        if not self.capacity_gib or self.slope_gib_per_hour <= 0:
            return None
        return max(self.capacity_gib - self.end_gib, 0.0) / self.slope_gib_per_hour

    @property
    def warning(self) -> str | None:
        if self.trend is MemoryTrend.NEAR_LIMIT and self.capacity_gib:
            return (f"the peak is {self.peak_gib / self.capacity_gib:.0%} of the card: "
                    "the KV cache is sized too close to the limit")
        if self.trend is MemoryTrend.CLIMBING:
            return "climbing: at this rate the card is full within the hour (fragmentation, or a KV cache too close)"
        return None

    def line(self) -> str:
        cap = f" of {self.capacity_gib:.1f} GiB" if self.capacity_gib else ""
        text = (f"GPU {self.gpu}: {self.start_gib:.1f} -> peak {self.peak_gib:.1f} -> {self.end_gib:.1f} GiB{cap}, "
                f"slope {self.slope_gib_per_hour:+.2f} GiB/h")
        return text + (f" (warning: {self.warning})" if self.warning else "")


class MemoryReading(Model):
    """GPU memory over the soak (verification's last check): the worst GPU's trend, each GPU's
    figures, and the report's text."""

    trend: MemoryTrend
    gpus: list[GpuMemory] = Field(default_factory=list)
    text: str


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

    outcome: VerifyOutcome
    pod: str | None = None
    message: str
    at: datetime


class AppliedChange(Model):
    """The last change this incident applied to the workload: what a rollback undoes."""

    by: str  # the approver's chat user id
    at: datetime
    message: str  # what the cluster side said it did
    rollout: RolloutOutcome | None = None  # None until the rollout was followed

    def followed(self, outcome: RolloutOutcome) -> AppliedChange:
        return revised(self, rollout=outcome)


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
    chat_channel: str | None = None  # where its message is (to be) posted; None: the alert channel
    message_id: str | None = None  # the chat's id of its message in chat_channel; None: not posted yet
    # In a storm (bot/app/grouping.py) the incident is first a line of a grouped message, this one:
    # that line is its top-level post, and its own message (Approve / Reject, details) is posted
    # in this message's thread, never as a top-level message. None: its message is top-level.
    group: MessageRef | None = None
    # Other messages that show this incident (`/vllm why` in another channel, the message a
    # re-diagnosis replaced): re-rendered with it, and a click counts only on one of these or its own.
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
    # Where to look for oneself (runbook, dashboard, kubectl commands), from the settings when
    # the message is posted (bot.app.posting.with_links); never stored: the settings may change.
    links: IncidentLinks | None = Field(default=None, exclude=True)
    applied: AppliedChange | None = None
    history: list[str] = Field(default_factory=list)  # for people only: never parsed
    # HMAC over the text the bot computed (bot/app/seal.py); an edited copy is never rendered.
    text_seal: str | None = None

    def shown_on(self, message: MessageRef) -> bool:
        """`message` is one of this incident's own messages."""
        return message == self.message_ref() or message in self.copies

    def message_ref(self) -> MessageRef | None:
        return MessageRef(channel=self.chat_channel, message_id=self.message_id) \
            if self.chat_channel and self.message_id else None

    def thread_of(self, message: MessageRef | None) -> MessageRef | None:
        """The thread a reply about `message` goes in: the message itself, unless it is this
        incident's own message posted in its group's thread (a chat thread has one level: the
        reply goes in the group's thread, beside it)."""
        if self.group is not None and (message is None or message == self.message_ref()):
            return self.group
        return message
    version: str | None = None  # store's concurrency token (resourceVersion or file mtime)
    # What the crash's collect read (bounded), for `/vllm why` once the previous log is gone
    # (bot/app/evidence_cache.py); None for records written before it, or without a previous log.
    evidence: CachedEvidence | None = None
    # The crashed container's log was longer than the bounded read (bot/kube/collect.py: its head
    # by limitBytes, its tail by tailLines): diagnosed from both ends, the middle not read. Said in
    # the message (NoteKind.LOG_CUT), so nobody takes a missing line for a line that was not there.
    log_cut: bool = False
    # The verification step an applied change is in, so a restarted bot resumes it
    # (bot/app/rollout.py); None when no verification is under way.
    verification_step: VerificationStep | None = None
    # The verification run following the rollout, renewed while it runs (bot/app/leases.py): a
    # run whose replica died is resumed by another once this runs out; None: no run holds it.
    verify_lease: Lease | None = None

    @field_serializer("state")
    def _plain_state(self, state: str) -> str:
        """Stored as the plain string (the CRD validates spec.state against the values)."""
        return str(state)

    # Every change to an incident is one of these (or bot.app.cas.moved, the state change): each
    # returns a new, validated record.
    def revised(self, **changes: Any) -> Incident:
        """This incident with `changes`, validated: a wrong type or a misspelled field raises."""
        return revised(self, **changes)

    def at_step(self, step: VerificationStep | None, lease: Lease | None) -> Incident:
        """At verification step `step` (None: the verification ended), held by `lease`."""
        return revised(self, verification_step=step, verify_lease=lease)

    def with_verify_lease(self, lease: Lease | None) -> Incident:
        return revised(self, verify_lease=lease)

    def with_history(self, history: list[str]) -> Incident:
        return revised(self, history=history)

    def with_copies(self, copies: list[MessageRef]) -> Incident:
        return revised(self, copies=copies)

    def posted_as(self, message: MessageRef, history: list[str]) -> Incident:
        """Its message is `message` (posted, or found in the channel's history): the post lease ends."""
        return revised(self, chat_channel=message.channel, message_id=message.message_id, post_lease=None,
                       history=history)

    def grouped_in(self, group: MessageRef, history: list[str]) -> Incident:
        """Named by a line of the grouped message `group`: its own message goes in that thread next,
        with a new identity (post_key) made when it is posted; the post lease ends."""
        return revised(self, group=group, post_lease=None, post_key=None, post_since=None, history=history)

    def with_version(self, version: str) -> Incident:
        return revised(self, version=version)


class NoteKind(StrEnum):
    """What a note says. The chat side words and marks it up (bot/slack/notes.py); the fields a
    kind uses are listed beside it."""

    # Thread replies after a decision.
    APPLIED = "applied"  # actor, message (what the cluster side did)
    TOO_LATE = "too_late"  # too late to patch safely: the sweep tries again
    PATCH_FAILED = "patch_failed"  # message
    ANSWER_LOST = "answer_lost"  # message (why the answer was lost)
    NOT_APPLIED = "not_applied"  # message (why), workload ("namespace/name")
    # The workload was edited since the proposal: workload ("Kind namespace/name"), changed, message;
    # then: not re-diagnosed (detail: the error), a new cause (detail: its title), or re-proposed.
    EDITED_NOT_REDIAGNOSED = "edited_not_rediagnosed"
    EDITED_NEW_CAUSE = "edited_new_cause"
    EDITED_REPROPOSED = "edited_reproposed"  # diagnosis
    ROLLED_BACK = "rolled_back"  # actor, message
    ROLLBACK_FAILED = "rollback_failed"  # message
    # Following the rollout.
    NOT_FOLLOWED = "not_followed"  # message (the error)
    CRASHED_AGAIN = "crashed_again"  # pod, message, diagnosis
    NOT_CONFIRMED = "not_confirmed"  # outcome, message
    NO_KV_FIGURES = "no_kv_figures"  # pod, state
    POD_READY = "pod_ready"  # pod, message, lines (vLLM's KV-cache and concurrency lines)
    REQUEST_OK = "request_ok"  # message
    REQUEST_FAILED = "request_failed"  # pod, message, diagnosis
    SOAK_STARTED = "soak_started"  # pod, seconds
    SOAK_OK = "soak_ok"  # message
    SOAK_FAILED = "soak_failed"  # message, diagnosis
    GPU_MEMORY = "gpu_memory"  # message
    MEMORY_CLIMBING = "memory_climbing"  # pod, message (the numbers and a suggestion): running, not verified
    # `/vllm why` on a workload whose fix was applied: actor, at, lines (the changes), state, outcome,
    # message (what the verification found), detail (a link to the incident's thread, or None)
    FIX_APPLIED = "fix_applied"
    RESUMED = "resumed"  # step
    # Other thread replies.
    CRASHING_AGAIN = "crashing_again"  # pod: a resolved incident fires again
    EVIDENCE_KEPT = "evidence_kept"  # at (when it was collected), detail (how long ago)
    COMMENTARY = "commentary"  # message (the commentator's labelled text)
    LOG_CUT = "log_cut"  # (no fields): in the incident's message, when its log was cut (Incident.log_cut)
    # Told to one user only: why a click or a command did nothing.
    REFUSAL = "refusal"  # message
    SOMEONE_ELSE_FIRST = "someone_else_first"  # state (None: the incident is gone), actor
    ALREADY_DECIDED = "already_decided"  # state, actor


class Note(BaseModel):
    """Something the bot says in chat (a thread reply, or to one user): what it is and its facts,
    optionally a re-diagnosis and a Roll back button for an incident. Every text field is plain
    (it may quote the cluster); the chat side escapes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: NoteKind
    actor: str | None = None  # the chat user who did it
    pod: str | None = None
    message: str = ""
    workload: str | None = None
    changed: list[str] = Field(default_factory=list)  # the workload's fields edited since the proposal
    lines: list[str] = Field(default_factory=list)
    detail: str | None = None
    state: IncidentState | None = None
    outcome: VerifyOutcome | None = None
    step: VerificationStep | None = None
    seconds: float | None = None
    at: datetime | None = None
    diagnosis: DiagnosisResult | None = None
    rollback_incident: str | None = None
    # A reply that must appear once (the "Applied" report): sent with it, so a bot that cannot
    # tell whether it was sent (killed right after) looks for it in the thread first (find_reply).
    key: str | None = None

    @property
    def summary(self) -> str:
        """For a log line: the kind and the message."""
        return f"{self.kind}: {self.message}" if self.message else str(self.kind)


class AlertTarget(BaseModel):
    """What one Alertmanager alert (or a slash command) points at."""

    model_config = ConfigDict(frozen=True)
    namespace: str
    pod: str
    container: str | None = None
    firing: bool = True
    received_at: float | None = None  # time.monotonic() when the bot received it
    cluster: str | None = None  # the served cluster it was routed to (bot.app.router); None: the default
