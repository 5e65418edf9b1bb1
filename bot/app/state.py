"""The incident's state and the one table of moves between states (pure).

Every state change in the application goes through `check_move` (bot.app.cas.moved calls it),
so the table below is the whole life cycle; a move it does not list is a bug in the caller and
raises `IllegalTransition`.
"""

from __future__ import annotations

from enum import StrEnum


class IncidentState(StrEnum):
    """The stored values are these strings (the VLLMIncident CRD validates spec.state against
    the same list), so a StrEnum: it compares, hashes and formats as its value."""

    PROPOSED = "proposed"  # a change waits for an approver
    DIAGNOSED = "diagnosed"  # diagnosed, nothing to approve (no known cause, GitOps, dry run failed)
    APPLYING = "applying"  # an approver clicked; the patch is being applied
    APPLIED = "applied"  # patched; the rollout is being followed
    VERIFIED = "verified"  # Ready, vLLM's KV-cache line, a completion, a clean soak, memory not climbing
    # All of verified's checks but one: the GPU memory trend climbed over the soak. Running, not verified.
    MEMORY_CLIMBING = "memory-climbing"
    FAILED = "failed"  # the patch, the new pod or a rollback failed
    REJECTED = "rejected"
    EXPIRED = "expired"  # the proposal's time-to-live ran out unused
    ROLLED_BACK = "rolled-back"
    RESOLVED = "resolved"  # Alertmanager says the pod stopped crash-looping
    # Never written: approval moves straight from "proposed" to "applying". Kept so objects
    # and the CRD's value list stay valid; the table gives it no moves in or out.
    APPROVED = "approved"


class VerificationStep(StrEnum):
    """Where the verification of an applied change is, stored on the incident so a restarted bot
    resumes it (bot/app/rollout.py)."""

    REPORT = "report"  # moved to applied, its "Applied" reply not sent yet
    READY = "ready"  # (1) waiting for the new pod to be Ready, (2) its KV-cache line
    REQUEST = "request"  # (3) a real completion request to the new pod
    SOAK = "soak"  # (4) watching the new pod for the soak window


class VerifyOutcome(StrEnum):
    """What following a rollout (or one of its steps) found."""

    READY = "ready"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"
    MEMORY_CLIMBING = "memory-climbing"  # ready and serving, but GPU memory climbed over the soak


class MemoryTrend(StrEnum):
    """A GPU's memory over the soak (bot.app.verdict.gpu_trend decides which)."""

    STABLE = "stable"
    CLIMBING = "climbing"  # at the soak's slope the card is full within verdict.CLIMB_HORIZON_HOURS
    NEAR_LIMIT = "near-limit"  # not climbing, but the peak came within verdict.WARN_FRACTION of the card
    UNMEASURED = "unmeasured"  # no Prometheus, or no series for the pod's GPUs


class Outcome(StrEnum):
    """What a decision (a click, a sweep's resumed apply) came to: returned to the adapter that
    asked, logged, and (for refusals) the label of the refused-clicks metric."""

    APPLIED = "applied"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled-back"
    FAILED = "failed"  # the patch or the rollback failed
    UNKNOWN = "unknown"  # whether the patch landed is unknown: the sweep finds out
    LATE = "late"  # too late to patch safely within the apply grace: the sweep retries
    CONFLICT = "conflict"  # the workload was edited since the proposal
    REFUSED = "refused"  # re-deriving the proposal did not give the stored one
    # Refusals of a click: nothing was changed.
    NOT_ALLOWED = "not_allowed"
    ALREADY_DECIDED = "already_decided"
    NOTHING_TO_ROLL_BACK = "nothing_to_roll_back"
    REPLACED = "replaced"
    WRONG_MESSAGE = "wrong_message"
    PROPOSALS_ONLY = "proposals_only"
    WRONG_TARGET = "wrong_target"  # the incident names another workload than its own (edited)
    EXPIRED = "expired"
    NO_SUCH_PROPOSAL = "no_such_proposal"  # (the metric label was "unknown" before)
    # Answered by the chat side before any use case ran.
    NOT_SERVED = "not_served"
    NO_DIGEST = "no_digest"


S = IncidentState

# A new incident, or one re-diagnosed, is in one of these: proposed when a change can be approved.
OPEN = frozenset({S.PROPOSED, S.DIAGNOSED})
ROLLBACK_FROM = frozenset({S.APPLIED, S.VERIFIED, S.MEMORY_CLIMBING, S.FAILED})  # states whose change can be rolled back

# from-state -> the states it may move to. Read with the use cases: "resolved" is reachable from
# anything not already resolved and not mid-apply; every state but "applying" (and the legacy
# "approved") can be re-diagnosed by `/vllm why`; "applying" re-opens after an edit conflict.
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    S.PROPOSED: OPEN | {S.APPLYING, S.REJECTED, S.EXPIRED, S.RESOLVED},
    S.DIAGNOSED: OPEN | {S.RESOLVED},
    # applying -> applying: the sweep takes over an apply whose applier died or lost the answer.
    S.APPLYING: OPEN | {S.APPLYING, S.APPLIED, S.FAILED},
    S.APPLIED: OPEN | {S.VERIFIED, S.MEMORY_CLIMBING, S.FAILED, S.ROLLED_BACK, S.RESOLVED},
    S.VERIFIED: OPEN | {S.ROLLED_BACK, S.RESOLVED},
    S.MEMORY_CLIMBING: OPEN | {S.ROLLED_BACK, S.RESOLVED},
    S.FAILED: OPEN | {S.ROLLED_BACK, S.RESOLVED},
    S.REJECTED: OPEN | {S.RESOLVED},
    S.EXPIRED: OPEN | {S.RESOLVED},
    S.ROLLED_BACK: OPEN | {S.FAILED, S.RESOLVED},  # failed: the rollback itself failed
    # The pod may recover (alert resolved) before the rollout check finishes: its result still lands.
    S.RESOLVED: OPEN | {S.VERIFIED, S.MEMORY_CLIMBING, S.FAILED},
    S.APPROVED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the table does not allow: a bug in the caller, never a user error."""


def can_move(current: str, to: IncidentState) -> bool:
    return to in TRANSITIONS[IncidentState(current)]


def check_move(name: str, current: str, to: IncidentState) -> IncidentState:
    """`to`, if the table allows current -> to; raises IllegalTransition otherwise."""
    if not can_move(current, to):
        raise IllegalTransition(f"incident {name}: {current} -> {to} is not an allowed transition")
    return to


def check_opening(name: str, state: IncidentState) -> IncidentState:
    """The state a new incident is created in."""
    if state not in OPEN:
        raise IllegalTransition(f"incident {name}: cannot be created in state {state}")
    return state
