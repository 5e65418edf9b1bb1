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
    VERIFIED = "verified"  # the new pod is Ready
    FAILED = "failed"  # the patch, the new pod or a rollback failed
    REJECTED = "rejected"
    EXPIRED = "expired"  # the proposal's time-to-live ran out unused
    ROLLED_BACK = "rolled-back"
    RESOLVED = "resolved"  # Alertmanager says the pod stopped crash-looping
    # Never written: approval moves straight from "proposed" to "applying". Kept so objects
    # and the CRD's value list stay valid; the table gives it no moves in or out.
    APPROVED = "approved"


S = IncidentState

# A new incident, or one re-diagnosed, is in one of these: proposed when a change can be approved.
OPEN = frozenset({S.PROPOSED, S.DIAGNOSED})
ROLLBACK_FROM = frozenset({S.APPLIED, S.VERIFIED, S.FAILED})  # states whose change can be rolled back

# from-state -> the states it may move to. Read with the use cases: "resolved" is reachable from
# anything not already resolved and not mid-apply; every state but "applying" (and the legacy
# "approved") can be re-diagnosed by `/vllm why`; "applying" re-opens after an edit conflict.
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    S.PROPOSED: OPEN | {S.APPLYING, S.REJECTED, S.EXPIRED, S.RESOLVED},
    S.DIAGNOSED: OPEN | {S.RESOLVED},
    # applying -> applying: the sweep takes over an apply whose applier died or lost the answer.
    S.APPLYING: OPEN | {S.APPLYING, S.APPLIED, S.FAILED},
    S.APPLIED: OPEN | {S.VERIFIED, S.FAILED, S.ROLLED_BACK, S.RESOLVED},
    S.VERIFIED: OPEN | {S.ROLLED_BACK, S.RESOLVED},
    S.FAILED: OPEN | {S.ROLLED_BACK, S.RESOLVED},
    S.REJECTED: OPEN | {S.RESOLVED},
    S.EXPIRED: OPEN | {S.RESOLVED},
    S.ROLLED_BACK: OPEN | {S.FAILED, S.RESOLVED},  # failed: the rollback itself failed
    # The pod may recover (alert resolved) before the rollout check finishes: its result still lands.
    S.RESOLVED: OPEN | {S.VERIFIED, S.FAILED},
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
